//! `--backup`: what a run replaces or deletes is kept beside it as
//! NAME + suffix (rsync's `~` by default), an older backup of that name
//! replaced. A replaced entry is hard-linked to its backup name first, so
//! the destination name never goes missing: the new version is then
//! renamed over it as usual. A deleted entry is renamed to its backup, and
//! so is an entry of another type in the way of a new one (a directory
//! with all it holds; an empty one is just removed, as rsync does).
//! Names that end in the suffix are not deleted by `--delete` (as rsync
//! protects them). With `--backup-dir` backups go to that directory
//! instead, under the same relative path (suffix empty by default).

use super::*;

use std::ffi::{OsStr, OsString};

/// NAME + `suffix`, unless that is too long a name.
pub(super) fn backup_name(name: &OsStr, suffix: &str) -> Option<OsString> {
    let mut n = name.as_bytes().to_vec();
    n.extend_from_slice(suffix.as_bytes());
    (n.len() <= 255).then(|| OsString::from_vec(n))
}

/// Whether `name` is a backup (ends in the suffix), when backups are kept
/// beside what they back up (with `--backup-dir` they are elsewhere, and
/// nothing at the destination is one).
pub(super) fn is_backup(opts: &crate::SyncOptions, name: &OsStr) -> bool {
    opts.backup_dir.is_none()
        && opts
            .backup
            .as_deref()
            .is_some_and(|s| name.as_bytes().ends_with(s.as_bytes()))
}

fn too_long() -> io::Error {
    io::Error::other("the backup name would be longer than 255 bytes")
}

/// Where the backup of the entry `rel` (relative to the destination)
/// goes: NAME + suffix beside it, or with `--backup-dir` the same
/// relative path under that directory, its parents made as needed
/// (through the backup directory's handles, never a joined path).
fn backup_loc(sh: &Shared, dest: &Loc, suffix: &str) -> io::Result<Loc> {
    let name = backup_name(dest.name(), suffix).ok_or_else(too_long)?;
    let Some(bd) = &sh.backup_dir else {
        return Ok(dest.sibling(&name));
    };
    let parent = parent_of(&dest.rel);
    let mut upto = 0;
    while upto < parent.len() {
        let end = parent[upto..]
            .iter()
            .position(|&b| b == b'/')
            .map_or(parent.len(), |i| upto + i);
        match bd.loc(&parent[..end], false)?.mkdir(0o755) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            r => r?,
        }
        upto = end + 1;
    }
    let mut rel = if parent.is_empty() {
        Vec::new()
    } else {
        [parent, b"/"].concat()
    };
    rel.extend_from_slice(name.as_bytes());
    bd.loc(&rel, false)
}

/// Keep the entry at `dest`, about to be replaced, as its backup (nothing
/// to do without `--backup`, or when nothing or a directory is there).
pub(super) fn keep_replaced(sh: &Shared, dest: &Loc) -> io::Result<()> {
    let Some(suffix) = sh.opts.backup.as_deref() else {
        return Ok(());
    };
    match dest.stat()? {
        Some(m) if !m.is_dir() => {}
        _ => return Ok(()),
    }
    let b = backup_loc(sh, dest, suffix)?;
    match b.hard_link_to(dest) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            b.remove_file()?;
            b.hard_link_to(dest)
        }
        r => r,
    }
    .map_err(cross_device)
}

/// `--delete` with `--backup`: rename the entry at `dest` to its backup
/// instead of removing it (an older backup of that name replaced).
pub(super) fn keep_deleted(sh: &Shared, dest: &Loc, suffix: &str) -> io::Result<()> {
    let b = backup_loc(sh, dest, suffix)?;
    dest.rename_to(&b).map_err(cross_device)
}

/// A backup directory on another filesystem cannot take links or
/// renames: say so rather than "invalid cross-device link".
fn cross_device(e: io::Error) -> io::Error {
    if e.raw_os_error() == Some(libc::EXDEV) {
        io::Error::other("--backup-dir must be on the destination's filesystem")
    } else {
        e
    }
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
        let elsewhere = crate::SyncOptions {
            backup_dir: Some("old".into()),
            ..opts
        };
        assert!(!is_backup(&elsewhere, OsStr::new("x.bak")));
    }
}
