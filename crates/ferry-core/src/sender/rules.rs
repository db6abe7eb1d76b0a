//! The walk's decisions as plain functions: which names are sent, which
//! extended attributes, which directories its warmers skip, where an entry
//! of the list is in the tree it names.

use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::error::{Error, Result};

/// The directories of the tree listed as `base` that the walk skips
/// (excluded, or named as ferry's partial state), for its warmers.
pub(super) fn warm_skip(excludes: crate::exclude::Excludes, base: Vec<u8>) -> crate::warm::Skip {
    Box::new(move |rel: &[u8]| {
        let name = rel.rsplit(|&b| b == b'/').next().unwrap_or(rel);
        let full = if base.is_empty() {
            rel.to_vec()
        } else {
            [base.as_slice(), b"/", rel].concat()
        };
        crate::journal::is_reserved(name)
            || excludes.excluded(Path::new(std::ffi::OsStr::from_bytes(&full)), true)
    })
}

/// Where `rel` (a path of the list) is in the tree listed as `base`.
pub(super) fn within<'a>(base: &[u8], rel: &'a [u8]) -> Option<&'a [u8]> {
    if base.is_empty() {
        return Some(rel);
    }
    match rel.strip_prefix(base)? {
        [] => Some(&[]),
        [b'/', r @ ..] => Some(r),
        _ => None,
    }
}

/// With several sources, whether the entry `rel` is sent, given `names`
/// (every name sent so far and whether it is a directory), which it joins
/// if so: the first of a name is kept, and a directory merges into a
/// directory of the same name.
pub(super) fn claim_name(names: &mut HashMap<Vec<u8>, bool>, rel: &[u8], is_dir: bool) -> bool {
    match names.get(rel) {
        Some(true) if is_dir => true,
        Some(_) => false,
        None => {
            names.insert(rel.to_vec(), is_dir);
            true
        }
    }
}

/// Whether a non-directory, non-symlink entry is sent as a file: a regular
/// file, or a block device named as a source itself (never one found in a
/// directory). Anything else (fifos, sockets, character devices) is not.
pub(super) fn sendable_as_file(is_file: bool, is_block_device: bool, top: bool) -> bool {
    is_file || (top && is_block_device)
}

/// Whether the extended attribute `name` is sent, as rsync splits them:
/// `-X` (`xattrs`) the attributes outside the `system.` namespace, `-A`
/// (`acls`) the POSIX ACLs (`system.posix_acl_*`); other `system.`
/// attributes never (the kernel derives them).
pub(super) fn xattr_wanted(name: &[u8], xattrs: bool, acls: bool) -> bool {
    match name.strip_prefix(b"system.") {
        Some(rest) => acls && rest.starts_with(b"posix_acl_"),
        None => xattrs,
    }
}

/// Take the next entry id; the list holds at most `u32::MAX` entries.
pub(super) fn take_id(next: &mut u32) -> Result<u32> {
    let id = *next;
    *next = next
        .checked_add(1)
        .ok_or_else(|| Error::Usage("more than 4 billion entries".into()))?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_warmers_skip_what_the_walk_skips() {
        let ex = crate::exclude::Excludes::new(&["node_modules/".to_string()]).unwrap();
        let skip = warm_skip(ex.clone(), b"src".to_vec());
        assert!(skip(b"a/node_modules"));
        assert!(!skip(b"a/b"));
        let skip = warm_skip(ex, Vec::new());
        assert!(skip(b"node_modules"));
        assert!(!skip(b"lib"));
    }

    #[test]
    fn a_path_of_the_list_is_found_in_the_tree_it_names() {
        assert_eq!(within(b"", b"a/b"), Some(&b"a/b"[..]));
        assert_eq!(within(b"src", b"src"), Some(&b""[..]));
        assert_eq!(within(b"src", b"src/a/b"), Some(&b"a/b"[..]));
        assert_eq!(within(b"src", b"srcx/a"), None);
        assert_eq!(within(b"src", b"other"), None);
    }

    #[test]
    fn dash_x_sends_no_acls_and_dash_a_only_acls() {
        let acl = b"system.posix_acl_access";
        let user = b"user.note";
        assert!(xattr_wanted(user, true, false) && !xattr_wanted(acl, true, false));
        assert!(xattr_wanted(acl, false, true) && !xattr_wanted(user, false, true));
        assert!(xattr_wanted(acl, true, true) && xattr_wanted(b"security.selinux", true, true));
        assert!(!xattr_wanted(b"system.nfs4_acl", true, true));
    }

    #[test]
    fn the_first_of_a_name_is_kept_and_directories_merge() {
        let mut names = HashMap::new();
        assert!(claim_name(&mut names, b"a", true));
        assert!(claim_name(&mut names, b"f", false));
        // Same name again: a directory merges into a directory...
        assert!(claim_name(&mut names, b"a", true));
        // ...but nothing else replaces or joins what came first.
        assert!(!claim_name(&mut names, b"a", false));
        assert!(!claim_name(&mut names, b"f", false));
        assert!(!claim_name(&mut names, b"f", true));
        // What was refused did not change what the name is.
        assert_eq!(names.get(&b"a"[..]), Some(&true));
        assert_eq!(names.get(&b"f"[..]), Some(&false));
        assert_eq!(names.len(), 2);
    }

    #[test]
    fn only_a_named_block_device_is_read_as_a_file() {
        assert!(sendable_as_file(true, false, false));
        assert!(sendable_as_file(true, false, true));
        assert!(sendable_as_file(false, true, true));
        assert!(!sendable_as_file(false, true, false));
        // Fifos, sockets, character devices.
        assert!(!sendable_as_file(false, false, true));
        assert!(!sendable_as_file(false, false, false));
    }

    #[test]
    fn entry_ids_run_out_at_u32_max() {
        let mut next = 0;
        assert_eq!(take_id(&mut next).unwrap(), 0);
        assert_eq!(take_id(&mut next).unwrap(), 1);
        assert_eq!(next, 2);
        let mut next = u32::MAX - 1;
        assert_eq!(take_id(&mut next).unwrap(), u32::MAX - 1);
        assert!(matches!(take_id(&mut next), Err(Error::Usage(_))));
    }
}
