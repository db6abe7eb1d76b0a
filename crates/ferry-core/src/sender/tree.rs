//! A source tree as the walk sees it: through directory handles. Each
//! directory is opened from its parent's handle without following a
//! symlink, and only if it is still the directory the walk `lstat`ed; its
//! entries are `lstat`ed and their symlinks read through that handle. So a
//! directory swapped for a symlink while the walk runs (by someone who can
//! write in the tree, when the sender runs as root or as a daemon) cannot
//! make the walk list, and then send, what lies elsewhere.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};

use super::open::changed;

/// What `lstat` (or `stat`, for a source named through a symlink) said of
/// an entry.
pub(super) struct Meta(Stat);

#[allow(clippy::unnecessary_cast)]
impl Meta {
    pub(super) fn kind(&self) -> FileType {
        FileType::from_raw_mode(self.0.st_mode)
    }
    pub(super) fn is_dir(&self) -> bool {
        self.kind() == FileType::Directory
    }
    pub(super) fn is_symlink(&self) -> bool {
        self.kind() == FileType::Symlink
    }
    pub(super) fn is_file(&self) -> bool {
        self.kind() == FileType::RegularFile
    }
    pub(super) fn is_block_device(&self) -> bool {
        self.kind() == FileType::BlockDevice
    }
    /// A FIFO, a socket or a device.
    pub(super) fn is_node(&self) -> bool {
        matches!(
            self.kind(),
            FileType::CharacterDevice | FileType::Fifo | FileType::Socket | FileType::BlockDevice
        )
    }
    pub(super) fn mode(&self) -> u32 {
        self.0.st_mode as u32
    }
    pub(super) fn uid(&self) -> u32 {
        self.0.st_uid as u32
    }
    pub(super) fn gid(&self) -> u32 {
        self.0.st_gid as u32
    }
    pub(super) fn mtime(&self) -> (i64, u32) {
        (self.0.st_mtime as i64, self.0.st_mtime_nsec as u32)
    }
    pub(super) fn dev(&self) -> u64 {
        self.0.st_dev as u64
    }
    /// Device and inode: which file this is.
    pub(super) fn ident(&self) -> (u64, u64) {
        (self.0.st_dev as u64, self.0.st_ino as u64)
    }
    pub(super) fn nlink(&self) -> u64 {
        self.0.st_nlink as u64
    }
    pub(super) fn len(&self) -> u64 {
        self.0.st_size.max(0) as u64
    }
    pub(super) fn blocks(&self) -> u64 {
        self.0.st_blocks.max(0) as u64
    }
    pub(super) fn rdev(&self) -> u64 {
        self.0.st_rdev as u64
    }
}

/// A source the user named, by its path: its symlink followed if `follow`.
pub(super) fn stat_named(path: &Path, follow: bool) -> io::Result<Meta> {
    Ok(Meta(if follow {
        rustix::fs::stat(path)?
    } else {
        rustix::fs::lstat(path)?
    }))
}

/// The entry `name` of the directory `dir`, not following a symlink.
pub(super) fn stat_at(dir: &OwnedFd, name: &OsStr) -> io::Result<Meta> {
    Ok(Meta(rustix::fs::statat(
        dir,
        name,
        AtFlags::SYMLINK_NOFOLLOW,
    )?))
}

/// Where a directory of the walk is: a source the user named (by its path,
/// its symlink followed if `follow`), or an entry of a directory already
/// open.
#[derive(Clone, Copy)]
pub(super) enum DirAt<'a> {
    Named { path: &'a Path, follow: bool },
    In { dir: &'a OwnedFd, name: &'a OsStr },
}

/// Open the directory the walk `lstat`ed as `meta` for reading, if it is
/// still that directory: a symlink or another directory put in its place
/// since is refused ("vanished or replaced"). An automount point, which
/// `lstat` does not mount but an open does, is taken as what its name
/// shows once mounted.
pub(super) fn open_dir(at: DirAt<'_>, meta: &Meta) -> io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let r = match at {
        DirAt::Named { path, follow } => {
            let flags = if follow {
                flags
            } else {
                flags | OFlags::NOFOLLOW
            };
            rustix::fs::open(path, flags, Mode::empty())
        }
        DirAt::In { dir, name } => {
            pause_before_open(name.as_bytes());
            rustix::fs::openat(dir, name, flags | OFlags::NOFOLLOW, Mode::empty())
        }
    };
    let fd = match r {
        Ok(fd) => fd,
        Err(rustix::io::Errno::LOOP) | Err(rustix::io::Errno::NOTDIR) => return Err(changed()),
        Err(e) => return Err(e.into()),
    };
    let opened = Meta(rustix::fs::fstat(&fd)?).ident();
    if opened == meta.ident() {
        return Ok(fd);
    }
    let now = match at {
        DirAt::Named { path, follow } => stat_named(path, follow),
        DirAt::In { dir, name } => stat_at(dir, name),
    };
    match now {
        Ok(now) if now.ident() == opened => Ok(fd),
        _ => Err(changed()),
    }
}

/// The names in an open directory (without `.` and `..`), in byte order.
pub(super) fn names(dir: &OwnedFd) -> io::Result<Vec<OsString>> {
    let mut out = Vec::new();
    let mut d = rustix::fs::Dir::read_from(dir)?;
    while let Some(ent) = d.read() {
        let ent = ent?;
        let name = ent.file_name().to_bytes();
        if name != b"." && name != b".." {
            out.push(OsStr::from_bytes(name).to_os_string());
        }
    }
    // Names in a directory are unique: an unstable sort is exact.
    out.sort_unstable();
    Ok(out)
}

/// The extended attributes of the entry `name` in `dir`, if it is still
/// the one the walk `lstat`ed as `meta`: read through an `O_PATH` handle
/// (which opens nothing), a symlink's own included. Without `/proc`, by
/// `path`.
pub(super) fn xattrs_at(
    dir: &OwnedFd,
    name: &OsStr,
    meta: &Meta,
    path: &Path,
) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let how = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(dir, name, how, Mode::empty())?;
    if Meta(rustix::fs::fstat(&fd)?).ident() != meta.ident() {
        return Err(changed());
    }
    match crate::fsutil::read_xattrs_of(&fd) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => crate::fsutil::read_xattrs(path),
        r => r,
    }
}

/// The target of the symlink `name` in `dir`.
pub(super) fn read_link_at(dir: &OwnedFd, name: &OsStr) -> io::Result<Vec<u8>> {
    Ok(rustix::fs::readlinkat(dir, name, Vec::new())?.into_bytes())
}

/// Test aid (feature `test-hooks`, never in a release build): with
/// `FERRY_TEST_PAUSE_OPEN` set to `NAME:GO`, an open of an entry called
/// NAME below a tree's top (a directory the walk enters, a file a worker
/// reads) first makes the file `GO.paused`, then waits, up to a minute,
/// until the file GO exists, so that a test can swap what is there as a
/// local user racing the walk could.
pub(super) fn pause_before_open(name: &[u8]) {
    #[cfg(feature = "test-hooks")]
    if let Some(v) = std::env::var_os("FERRY_TEST_PAUSE_OPEN") {
        let v = v.as_bytes();
        let Some(i) = v.iter().position(|&b| b == b':') else {
            return;
        };
        if &v[..i] == name {
            let go = Path::new(OsStr::from_bytes(&v[i + 1..]));
            let mut paused = go.as_os_str().to_os_string();
            paused.push(".paused");
            let _ = std::fs::write(paused, b"");
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while !go.exists() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
    }
    #[cfg(not(feature = "test-hooks"))]
    let _ = name;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A tree's top, as the walk opens it.
    fn open_top(path: &Path, follow: bool) -> OwnedFd {
        let at = DirAt::Named { path, follow };
        open_dir(at, &stat_named(path, follow).unwrap()).unwrap()
    }

    #[test]
    fn a_directory_swapped_for_a_symlink_is_not_opened() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("a")).unwrap();
        std::fs::create_dir(d.path().join("elsewhere")).unwrap();
        let root = open_top(d.path(), false);
        let meta = stat_at(&root, OsStr::new("a")).unwrap();
        assert!(meta.is_dir());
        // Swapped for a symlink to another directory after the lstat (the
        // directory kept, so that no other can get its inode number).
        std::fs::rename(d.path().join("a"), d.path().join("kept")).unwrap();
        symlink(d.path().join("elsewhere"), d.path().join("a")).unwrap();
        let at = DirAt::In {
            dir: &root,
            name: OsStr::new("a"),
        };
        let e = open_dir(at, &meta).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        // Swapped for another directory (or an automount point mounted by
        // the open): what the name holds now, reached without a symlink.
        std::fs::remove_file(d.path().join("a")).unwrap();
        std::fs::create_dir(d.path().join("a")).unwrap();
        let at = DirAt::In {
            dir: &root,
            name: OsStr::new("a"),
        };
        let fd = open_dir(at, &meta).unwrap();
        let now = stat_at(&root, OsStr::new("a")).unwrap();
        assert_ne!(now.ident(), meta.ident());
        assert_eq!(Meta(rustix::fs::fstat(&fd).unwrap()).ident(), now.ident());
    }

    #[test]
    fn extended_attributes_are_read_through_a_handle_a_symlinks_own_included() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("f"), b"").unwrap();
        symlink("f", d.path().join("l")).unwrap();
        let root = open_top(d.path(), false);
        let set = |name: &str, key: &str, v: &[u8]| {
            let p = d.path().join(name);
            rustix::fs::lsetxattr(&p, key, v, rustix::fs::XattrFlags::empty())
        };
        set("f", "user.k", b"file").expect("user xattrs where tests run");
        let (f, l) = (OsStr::new("f"), OsStr::new("l"));
        let fm = stat_at(&root, f).unwrap();
        let got = xattrs_at(&root, f, &fm, &d.path().join("f")).unwrap();
        assert_eq!(got, [(b"user.k".to_vec(), b"file".to_vec())]);
        // A symlink's own (only trusted. ones are allowed, as root), not
        // its target's.
        let lm = stat_at(&root, l).unwrap();
        let got = xattrs_at(&root, l, &lm, &d.path().join("l")).unwrap();
        assert!(got.iter().all(|(k, _)| k != b"user.k"), "{got:?}");
        if set("l", "trusted.k", b"link").is_ok() {
            let got = xattrs_at(&root, l, &lm, &d.path().join("l")).unwrap();
            assert_eq!(got, [(b"trusted.k".to_vec(), b"link".to_vec())]);
        }
        // Replaced since the lstat: refused.
        std::fs::rename(d.path().join("f"), d.path().join("kept")).unwrap();
        std::fs::write(d.path().join("f"), b"").unwrap();
        let e = xattrs_at(&root, f, &fm, &d.path().join("f")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn names_come_sorted_without_dots_and_links_are_read_in_place() {
        let d = tempfile::tempdir().unwrap();
        for n in ["b", "a", "c"] {
            std::fs::write(d.path().join(n), b"").unwrap();
        }
        symlink("/etc/passwd", d.path().join("l")).unwrap();
        let root = open_top(d.path(), true);
        assert_eq!(names(&root).unwrap(), ["a", "b", "c", "l"]);
        let l = stat_at(&root, OsStr::new("l")).unwrap();
        assert!(l.is_symlink());
        assert_eq!(
            read_link_at(&root, OsStr::new("l")).unwrap(),
            b"/etc/passwd"
        );
    }
}
