//! `--backup`: what a run replaces or deletes is kept beside it as
//! NAME + suffix (rsync's `~` by default), an older backup of that name
//! replaced. A replaced entry is hard-linked to its backup name first, so
//! the destination name never goes missing: the new version is then
//! renamed over it as usual. A deleted entry is renamed to its backup.
//! Names that end in the suffix are not deleted by `--delete` (as rsync
//! protects them).

use super::*;

use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;

/// NAME + `suffix`, unless that is too long a name.
pub(super) fn backup_name(name: &OsStr, suffix: &str) -> Option<OsString> {
    let mut n = name.as_bytes().to_vec();
    n.extend_from_slice(suffix.as_bytes());
    (n.len() <= 255).then(|| OsString::from_vec(n))
}

/// Whether `name` is a backup (ends in the suffix), when backups are kept.
pub(super) fn is_backup(opts: &crate::SyncOptions, name: &OsStr) -> bool {
    opts.backup
        .as_deref()
        .is_some_and(|s| name.as_bytes().ends_with(s.as_bytes()))
}

fn too_long() -> io::Error {
    io::Error::other("the backup name would be longer than 255 bytes")
}

/// Keep the entry at `dest`, about to be replaced, as its backup (nothing
/// to do without `--backup`, or when nothing or a directory is there).
pub(super) fn keep_replaced(opts: &crate::SyncOptions, dest: &Loc) -> io::Result<()> {
    let Some(suffix) = opts.backup.as_deref() else {
        return Ok(());
    };
    match dest.stat()? {
        Some(m) if !m.is_dir() => {}
        _ => return Ok(()),
    }
    let b = dest.sibling(&backup_name(dest.name(), suffix).ok_or_else(too_long)?);
    match b.hard_link_to(dest) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            b.remove_file()?;
            b.hard_link_to(dest)
        }
        r => r,
    }
}

/// `--delete` with `--backup`: rename `name` in `dir` to its backup
/// instead of removing it.
pub(super) fn keep_deleted(dir: &OwnedFd, name: &OsStr, suffix: &str) -> io::Result<()> {
    let b = backup_name(name, suffix).ok_or_else(too_long)?;
    Ok(rustix::fs::renameat(dir, name, dir, &b)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backup_names() {
        assert_eq!(backup_name(OsStr::new("a"), "~").unwrap(), "a~");
        assert!(backup_name(OsStr::new(&"x".repeat(255)), "~").is_none());
        let opts = crate::SyncOptions {
            backup: Some(".bak".into()),
            ..Default::default()
        };
        assert!(is_backup(&opts, OsStr::new("x.bak")));
        assert!(!is_backup(&opts, OsStr::new("x.ba")));
        assert!(!is_backup(&crate::SyncOptions::default(), OsStr::new("x~")));
    }
}
