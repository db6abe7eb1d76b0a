//! What a receiver keeps of an entry from a sender it does not trust with
//! the host (a daemon's client, see `SyncOptions::untrusted_sender`).

use ferry_link::Entry;

/// Set-user-ID and set-group-ID bits.
const SET_ID: u32 = 0o6000;

/// Drop what would give the sender more than the files: set-ID bits, and
/// extended attributes outside `user.*` and the POSIX ACLs (file
/// capabilities in `security.capability`, SELinux labels, `trusted.*`).
pub(crate) fn defang(e: &mut Entry) {
    e.mode &= !SET_ID;
    e.xattrs.retain(|(name, _)| {
        name.starts_with(b"user.")
            || name == b"system.posix_acl_access"
            || name == b"system.posix_acl_default"
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_id_bits_and_privileged_attributes_go() {
        let mut e = Entry {
            mode: 0o106755,
            xattrs: vec![
                (b"security.capability".to_vec(), vec![1]),
                (b"trusted.overlay".to_vec(), vec![2]),
                (b"user.note".to_vec(), vec![3]),
                (b"system.posix_acl_access".to_vec(), vec![4]),
                (b"security.selinux".to_vec(), vec![5]),
            ],
            ..Default::default()
        };
        defang(&mut e);
        assert_eq!(e.mode, 0o100755);
        let names: Vec<&[u8]> = e.xattrs.iter().map(|(n, _)| &n[..]).collect();
        assert_eq!(names, [&b"user.note"[..], b"system.posix_acl_access"]);
        let mut sticky = Entry {
            mode: 0o041777,
            ..Default::default()
        };
        defang(&mut sticky);
        assert_eq!(sticky.mode, 0o041777, "the sticky bit is no privilege");
    }
}
