//! The destination tree, reached only through directory handles.
//!
//! Every path the receiver touches comes from the peer's file list, so it
//! is never joined onto the destination as a string. The destination root
//! is opened once (the user's own path, symlinks and all); everything below
//! it is reached from that handle: a parent directory with `openat2`
//! (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, or a walk of `O_NOFOLLOW`
//! opens where the kernel has no `openat2`), and the entry itself by name
//! with the `*at` calls, never following a symlink. A symlink placed in
//! the tree (by an earlier entry, or by anyone racing the run) is an
//! error, not a way out.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::{File, Metadata};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags, CWD};

/// Parent directory handles kept open for the next entries of the same
/// directory (a list is sent directory by directory).
const CACHED_DIRS: usize = 64;

/// The destination root and a small cache of directory handles under it.
pub struct DestDir {
    /// `None` in a dry run whose destination does not exist yet.
    root: Option<Arc<OwnedFd>>,
    shown: PathBuf,
    cache: Mutex<HashMap<Vec<u8>, Arc<OwnedFd>>>,
}

/// One entry of the destination: a name in a directory held open.
#[derive(Clone)]
pub struct Loc {
    /// The parent directory; `None` when it does not exist (dry runs).
    dir: Option<Arc<OwnedFd>>,
    name: OsString,
    /// The path relative to the root, as the list gives it.
    pub rel: Vec<u8>,
    /// The path for messages (root joined with `rel`): never opened.
    pub shown: PathBuf,
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

fn not_found() -> io::Error {
    io::Error::from(io::ErrorKind::NotFound)
}

impl DestDir {
    /// Open the destination root `path` (a directory; followed if it is a
    /// symlink: it is the user's own choice).
    pub fn open(path: &Path) -> io::Result<DestDir> {
        let fd = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(DestDir {
            root: Some(Arc::new(fd)),
            shown: path.to_path_buf(),
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// The root's device and inode (`None`: absent, or `fstat` failed).
    pub fn id(&self) -> Option<(u64, u64)> {
        let st = rustix::fs::fstat(self.root.as_ref()?).ok()?;
        Some((st.st_dev, st.st_ino))
    }

    /// A destination that does not exist (a dry run): every entry is absent.
    pub fn absent(path: &Path) -> DestDir {
        DestDir {
            root: None,
            shown: path.to_path_buf(),
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The root as the user named it, for messages.
    pub fn shown(&self) -> &Path {
        &self.shown
    }

    /// The path `rel` would have, for messages.
    pub fn show(&self, rel: &[u8]) -> PathBuf {
        if rel.is_empty() {
            self.shown.clone()
        } else {
            self.shown.join(OsStr::from_bytes(rel))
        }
    }

    /// The directory `rel` ("" is the root), opened beneath the root
    /// without following any symlink.
    pub fn dir(&self, rel: &[u8]) -> io::Result<Arc<OwnedFd>> {
        let root = self.root.as_ref().ok_or_else(not_found)?;
        if rel.is_empty() {
            return Ok(root.clone());
        }
        if let Some(fd) = self.cache.lock().ok().and_then(|c| c.get(rel).cloned()) {
            return Ok(fd);
        }
        let fd = Arc::new(open_beneath(root, rel)?);
        if let Ok(mut c) = self.cache.lock() {
            if c.len() >= CACHED_DIRS {
                c.clear();
            }
            c.insert(rel.to_vec(), fd.clone());
        }
        Ok(fd)
    }

    /// Forget cached handles of `rel` and everything below it (it was
    /// removed or replaced).
    pub fn forget(&self, rel: &[u8]) {
        if let Ok(mut c) = self.cache.lock() {
            c.retain(|k, _| !(k == rel || (k.starts_with(rel) && k.get(rel.len()) == Some(&b'/'))));
        }
    }

    /// The entry `rel` ("" is the root itself, as `.` of the root). Its
    /// parent must exist unless `dry` (then a missing parent makes the
    /// entry absent).
    pub fn loc(&self, rel: &[u8], dry: bool) -> io::Result<Loc> {
        let (parent, name) = match rel.iter().rposition(|&b| b == b'/') {
            Some(i) => (&rel[..i], &rel[i + 1..]),
            None => (&rel[..0], rel),
        };
        let name: &[u8] = if rel.is_empty() { b"." } else { name };
        if !rel.is_empty() && !plain_name(name) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a plain file name",
            ));
        }
        let dir = match self.dir(parent) {
            Ok(d) => Some(d),
            // A dry run has not made the parent: missing, or still a file
            // or symlink that the real run would replace.
            Err(e)
                if dry
                    && (e.kind() == io::ErrorKind::NotFound
                        || matches!(e.raw_os_error(), Some(libc::ENOTDIR | libc::ELOOP))) =>
            {
                None
            }
            Err(e) => return Err(e),
        };
        Ok(Loc {
            dir,
            name: OsStr::from_bytes(name).to_os_string(),
            rel: rel.to_vec(),
            shown: self.show(rel),
        })
    }
}

/// A single path component that names an entry (not `.`, `..`, empty, or
/// holding `/` or NUL).
fn plain_name(n: &[u8]) -> bool {
    !n.is_empty() && n != b"." && n != b".." && !n.contains(&b'/') && !n.contains(&0)
}

/// Open directory `rel` beneath `root`, refusing symlinks and `..` on the
/// way: `openat2` where the kernel has it, else one `O_NOFOLLOW` open per
/// component.
pub(crate) fn open_beneath(root: &OwnedFd, rel: &[u8]) -> io::Result<OwnedFd> {
    let how = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    match rustix::fs::openat2(
        root,
        OsStr::from_bytes(rel),
        dir_flags(),
        Mode::empty(),
        how,
    ) {
        Err(rustix::io::Errno::NOSYS) | Err(rustix::io::Errno::PERM) => {}
        Err(rustix::io::Errno::AGAIN) => {
            // A rename raced the lookup: once more, then give up.
            return Ok(rustix::fs::openat2(
                root,
                OsStr::from_bytes(rel),
                dir_flags(),
                Mode::empty(),
                how,
            )?);
        }
        r => return Ok(r?),
    }
    walk_beneath(root, rel)
}

/// [`open_beneath`] without `openat2`: each component a plain name,
/// opened from the one before with `O_NOFOLLOW | O_DIRECTORY`.
fn walk_beneath(root: &OwnedFd, rel: &[u8]) -> io::Result<OwnedFd> {
    let mut cur: Option<OwnedFd> = None;
    for comp in rel.split(|&b| b == b'/') {
        if !plain_name(comp) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a plain path beneath the destination",
            ));
        }
        let at = cur.as_ref().map_or(root.as_fd(), |f| f.as_fd());
        let next = rustix::fs::openat(at, OsStr::from_bytes(comp), dir_flags(), Mode::empty())?;
        cur = Some(next);
    }
    cur.ok_or_else(not_found)
}

/// Path of an open descriptor in `/proc`, for the few calls that have no
/// descriptor form that refuses symlinks (`chmod`, `setxattr`): it names
/// the very inode the descriptor holds, never anything a path resolves to.
fn proc_path(fd: &impl AsRawFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

impl Loc {
    /// A place that is only shown, never opened (an NBD export's URI).
    pub fn shown_only(shown: PathBuf) -> Loc {
        Loc {
            dir: None,
            name: OsString::new(),
            rel: Vec::new(),
            shown,
        }
    }

    /// Remember this (temporary) entry for removal if the run is
    /// interrupted (see [`crate::fsutil::remove_temp_files`]).
    pub fn register_temp(&self) {
        if let Some(d) = &self.dir {
            crate::fsutil::register_temp(d, &self.name);
        }
    }

    /// Forget it again (renamed into place, or removed).
    pub fn unregister_temp(&self) {
        if let Some(d) = &self.dir {
            crate::fsutil::unregister_temp(d, &self.name);
        }
    }

    fn parent(&self) -> io::Result<&OwnedFd> {
        self.dir.as_deref().ok_or_else(not_found)
    }

    /// The entry's name in its directory.
    pub fn name(&self) -> &OsStr {
        &self.name
    }

    /// A sibling of this entry named `name` (a temporary file).
    pub fn sibling(&self, name: &OsStr) -> Loc {
        Loc {
            dir: self.dir.clone(),
            name: name.to_os_string(),
            rel: self.rel.clone(),
            shown: self.shown.with_file_name(name),
        }
    }

    /// The parent directory's handle (to fsync it, or list it).
    pub fn parent_fd(&self) -> io::Result<&OwnedFd> {
        self.parent()
    }

    /// Metadata of the entry itself (a symlink is a symlink); `None` if
    /// there is nothing by that name.
    pub fn stat(&self) -> io::Result<Option<Metadata>> {
        let Some(dir) = &self.dir else {
            return Ok(None);
        };
        let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        match rustix::fs::openat(dir, &self.name, flags, Mode::empty()) {
            Ok(fd) => Ok(Some(File::from(fd).metadata()?)),
            Err(rustix::io::Errno::NOENT) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The entry's own `stat` (a symlink is a symlink) in one
    /// `fstatat(AT_SYMLINK_NOFOLLOW)` through the parent's handle: the
    /// comparison of an unchanged entry costs one system call, not an
    /// open, a stat and a close. `None` if there is nothing by that name.
    pub fn lstat(&self) -> io::Result<Option<rustix::fs::Stat>> {
        let Some(dir) = &self.dir else {
            return Ok(None);
        };
        match rustix::fs::statat(dir, &self.name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(st)),
            Err(rustix::io::Errno::NOENT) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The target of the symlink.
    pub fn read_link(&self) -> io::Result<OsString> {
        let t = rustix::fs::readlinkat(self.parent()?, &self.name, Vec::new())?;
        Ok(OsStr::from_bytes(t.as_bytes()).to_os_string())
    }

    pub fn mkdir(&self, mode: u32) -> io::Result<()> {
        Ok(rustix::fs::mkdirat(
            self.parent()?,
            &self.name,
            Mode::from_raw_mode(mode & 0o7777),
        )?)
    }

    /// Make a device node, FIFO or socket (`mode`'s type) named as the
    /// entry, with device number `rdev`.
    pub fn mknod(&self, mode: u32, rdev: u64) -> io::Result<()> {
        Ok(rustix::fs::mknodat(
            self.parent()?,
            &self.name,
            rustix::fs::FileType::from_raw_mode(mode),
            Mode::from_raw_mode(mode & 0o777),
            rdev,
        )?)
    }

    /// Remove a non-directory.
    pub fn remove_file(&self) -> io::Result<()> {
        Ok(rustix::fs::unlinkat(
            self.parent()?,
            &self.name,
            AtFlags::empty(),
        )?)
    }

    /// Remove an empty directory.
    pub fn remove_dir(&self) -> io::Result<()> {
        Ok(rustix::fs::unlinkat(
            self.parent()?,
            &self.name,
            AtFlags::REMOVEDIR,
        )?)
    }

    /// Remove a directory and everything in it, through handles (a symlink
    /// inside is removed, never followed).
    pub fn remove_all(&self) -> io::Result<()> {
        remove_tree(self.parent()?, &self.name)
    }

    /// Open the directory itself (for listing, fsync).
    pub fn open_dir(&self) -> io::Result<OwnedFd> {
        Ok(rustix::fs::openat(
            self.parent()?,
            &self.name,
            dir_flags(),
            Mode::empty(),
        )?)
    }

    /// Open an existing regular file: read-only, or read-write (`write`).
    /// A symlink is refused (`ELOOP`), nothing is created, and anything but
    /// a regular file (a FIFO swapped in since it was looked at, whose open
    /// would wait for a writer) is refused without waiting.
    pub fn open(&self, write: bool) -> io::Result<File> {
        let mode = if write { OFlags::RDWR } else { OFlags::RDONLY };
        let f = self.open_with(mode | OFlags::NONBLOCK)?;
        if !f.metadata()?.is_file() {
            return Err(io::Error::other("not a regular file"));
        }
        rustix::fs::fcntl_setfl(&f, rustix::fs::fcntl_getfl(&f)? - OFlags::NONBLOCK)?;
        Ok(f)
    }

    /// Open for writing only (devices and FIFOs, which may refuse reads).
    pub fn open_write_only(&self) -> io::Result<File> {
        self.open_with(OFlags::WRONLY)
    }

    fn open_with(&self, mode: OFlags) -> io::Result<File> {
        let flags = mode | OFlags::NOFOLLOW | OFlags::NOCTTY | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(self.parent()?, &self.name, flags, Mode::empty())?;
        Ok(File::from(fd))
    }

    /// Create a new file (never an existing one, never through a symlink).
    pub fn create_new(&self, mode: u32) -> io::Result<File> {
        // Read-write: `--verify` reads it back through this descriptor
        // (whatever mode the file is given meanwhile).
        let flags =
            OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(
            self.parent()?,
            &self.name,
            flags,
            Mode::from_raw_mode(mode & 0o7777),
        )?;
        Ok(File::from(fd))
    }

    /// Create a symlink here pointing at `target` (never resolved).
    pub fn symlink(&self, target: &OsStr) -> io::Result<()> {
        Ok(rustix::fs::symlinkat(target, self.parent()?, &self.name)?)
    }

    /// Rename this entry over `to`.
    pub fn rename_to(&self, to: &Loc) -> io::Result<()> {
        Ok(rustix::fs::renameat(
            self.parent()?,
            &self.name,
            to.parent()?,
            &to.name,
        )?)
    }

    /// Make `self` a new hard link to the entry `to` (not followed if it is
    /// a symlink).
    pub fn hard_link_to(&self, to: &Loc) -> io::Result<()> {
        Ok(rustix::fs::linkat(
            to.parent()?,
            &to.name,
            self.parent()?,
            &self.name,
            AtFlags::empty(),
        )?)
    }

    /// Set the modification time of the entry itself.
    pub fn set_mtime(&self, sec: i64, nsec: u32) -> io::Result<()> {
        Ok(rustix::fs::utimensat(
            self.parent()?,
            &self.name,
            &crate::fsutil::mtime_only(sec, nsec),
            AtFlags::SYMLINK_NOFOLLOW,
        )?)
    }

    /// Set owner and group of the entry itself.
    pub fn chown(&self, uid: Option<u32>, gid: Option<u32>) -> io::Result<()> {
        Ok(rustix::fs::chownat(
            self.parent()?,
            &self.name,
            uid.map(rustix::fs::Uid::from_raw),
            gid.map(rustix::fs::Gid::from_raw),
            AtFlags::SYMLINK_NOFOLLOW,
        )?)
    }

    /// A handle on the entry itself that follows nothing, for metadata
    /// calls made through `/proc/self/fd` (refused on a symlink).
    fn pinned(&self) -> io::Result<OwnedFd> {
        let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(self.parent()?, &self.name, flags, Mode::empty())?;
        if File::from(fd.try_clone()?)
            .metadata()?
            .file_type()
            .is_symlink()
        {
            return Err(io::Error::from_raw_os_error(libc::ELOOP));
        }
        Ok(fd)
    }

    /// The entry opened for its metadata calls (`fchmod`, `fsetxattr`),
    /// never through a symlink; only a regular file or a directory (opening
    /// a device can act on it: a tape rewinds when closed; a FIFO would
    /// wait). `None` otherwise, or when it cannot be opened so (no read
    /// permission): the callers then go through an `O_PATH` handle.
    fn meta_fd(&self) -> Option<OwnedFd> {
        let st =
            rustix::fs::statat(self.parent().ok()?, &self.name, AtFlags::SYMLINK_NOFOLLOW).ok()?;
        let kind = rustix::fs::FileType::from_raw_mode(st.st_mode);
        if !matches!(
            kind,
            rustix::fs::FileType::RegularFile | rustix::fs::FileType::Directory
        ) {
            return None;
        }
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY;
        rustix::fs::openat(
            self.parent().ok()?,
            &self.name,
            flags | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .ok()
    }

    /// Set permission bits of the entry (never of what a symlink points at):
    /// `fchmod` on the entry opened without following, else `chmod` of
    /// the inode an `O_PATH` handle pins, through `/proc/self/fd`.
    pub fn chmod(&self, mode: u32) -> io::Result<()> {
        let mode = Mode::from_raw_mode(mode & 0o7777);
        if let Some(fd) = self.meta_fd() {
            return Ok(rustix::fs::fchmod(&fd, mode)?);
        }
        let fd = self.pinned()?;
        Ok(rustix::fs::chmodat(
            CWD,
            proc_path(&fd),
            mode,
            AtFlags::empty(),
        )?)
    }

    /// Make the extended attributes of the entry the source's (see
    /// [`crate::fsutil::sync_xattrs`]), never through a symlink, as
    /// [`Loc::chmod`] does.
    pub fn write_xattrs(
        &self,
        xattrs: &[(Vec<u8>, Vec<u8>)],
        scope: &dyn Fn(&[u8]) -> bool,
    ) -> io::Result<()> {
        let flags = rustix::fs::XattrFlags::empty();
        if let Some(fd) = self.meta_fd() {
            return crate::fsutil::sync_xattrs(
                xattrs,
                scope,
                |b| rustix::fs::flistxattr(&fd, b),
                |k, v| rustix::fs::fsetxattr(&fd, k, v, flags),
                |k| rustix::fs::fremovexattr(&fd, k),
            );
        }
        let fd = self.pinned()?;
        let p = proc_path(&fd);
        crate::fsutil::sync_xattrs(
            xattrs,
            scope,
            |b| rustix::fs::listxattr(&p, b),
            |k, v| rustix::fs::setxattr(&p, k, v, flags),
            |k| rustix::fs::removexattr(&p, k),
        )
    }
}

/// Remove `name` in `dir` and, if it is a directory, all it holds; each
/// level opened from its parent's handle with `O_NOFOLLOW`.
fn remove_tree(dir: &OwnedFd, name: &OsStr) -> io::Result<()> {
    match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) => return Ok(()),
        Err(rustix::io::Errno::ISDIR) | Err(rustix::io::Errno::PERM) => {}
        Err(e) => return Err(e.into()),
    }
    let sub = rustix::fs::openat(dir, name, dir_flags(), Mode::empty())?;
    for (child, _) in list(&sub)? {
        remove_tree(&sub, &child)?;
    }
    Ok(rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)?)
}

/// The entries of an open directory (without `.` and `..`), each with
/// whether it is a directory (a symlink is not).
pub fn list(dir: &OwnedFd) -> io::Result<Vec<(OsString, bool)>> {
    let mut out = Vec::new();
    let mut d = rustix::fs::Dir::read_from(dir)?;
    while let Some(ent) = d.read() {
        let ent = ent?;
        let name = ent.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        let is_dir = match ent.file_type() {
            rustix::fs::FileType::Directory => true,
            rustix::fs::FileType::Unknown => {
                rustix::fs::statat(dir, ent.file_name(), AtFlags::SYMLINK_NOFOLLOW)
                    .map(|s| {
                        rustix::fs::FileType::from_raw_mode(s.st_mode)
                            == rustix::fs::FileType::Directory
                    })
                    .unwrap_or(false)
            }
            _ => false,
        };
        out.push((OsStr::from_bytes(name).to_os_string(), is_dir));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn setup() -> (tempfile::TempDir, DestDir) {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("dst")).unwrap();
        std::fs::create_dir(d.path().join("outside")).unwrap();
        std::fs::write(d.path().join("outside/canary"), b"x").unwrap();
        let t = DestDir::open(&d.path().join("dst")).unwrap();
        (d, t)
    }

    #[test]
    fn a_symlinked_directory_is_never_entered() {
        let (d, t) = setup();
        symlink(d.path().join("outside"), d.path().join("dst/a")).unwrap();
        let e = t.loc(b"a/canary", false).err().expect("refused");
        // ELOOP from a walk, ENOTDIR where O_NOFOLLOW meets O_DIRECTORY.
        assert!(
            matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENOTDIR)),
            "{e}"
        );
        // The symlink itself is an entry: it can be seen and removed.
        let a = t.loc(b"a", false).unwrap();
        assert!(a.stat().unwrap().unwrap().file_type().is_symlink());
        a.remove_file().unwrap();
        assert_eq!(
            std::fs::read(d.path().join("outside/canary")).unwrap(),
            b"x"
        );
    }

    #[test]
    fn the_walk_without_openat2_refuses_symlinks_and_dots() {
        let (d, t) = setup();
        std::fs::create_dir(d.path().join("dst/real")).unwrap();
        symlink(d.path().join("outside"), d.path().join("dst/real/link")).unwrap();
        let root = t.root.clone().unwrap();
        assert!(walk_beneath(&root, b"real").is_ok());
        assert!(open_beneath(&root, b"real").is_ok());
        for bad in [
            &b"real/link"[..],
            b"..",
            b"real/../..",
            b"real//x",
            b"/etc",
            b"",
        ] {
            let shown = String::from_utf8_lossy(bad);
            assert!(walk_beneath(&root, bad).is_err(), "{shown}");
            assert!(
                bad.is_empty() || open_beneath(&root, bad).is_err(),
                "{shown}"
            );
        }
    }

    #[test]
    fn metadata_calls_never_follow_a_symlink() {
        let (d, t) = setup();
        symlink(d.path().join("outside/canary"), d.path().join("dst/l")).unwrap();
        let l = t.loc(b"l", false).unwrap();
        assert!(l.chmod(0o777).is_err());
        assert!(l.open(true).is_err());
        assert!(l.create_new(0o600).is_err());
        let m = std::fs::metadata(d.path().join("outside/canary")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_ne!(m.permissions().mode() & 0o777, 0o777);
        l.set_mtime(1, 0).unwrap();
        let m2 = std::fs::metadata(d.path().join("outside/canary")).unwrap();
        assert_eq!(m.modified().unwrap(), m2.modified().unwrap());
    }

    #[test]
    fn remove_all_removes_a_tree_but_not_what_its_symlinks_point_at() {
        let (d, t) = setup();
        std::fs::create_dir_all(d.path().join("dst/x/y")).unwrap();
        std::fs::write(d.path().join("dst/x/y/f"), b"f").unwrap();
        symlink(d.path().join("outside"), d.path().join("dst/x/out")).unwrap();
        t.loc(b"x", false).unwrap().remove_all().unwrap();
        assert!(!d.path().join("dst/x").exists());
        assert_eq!(
            std::fs::read(d.path().join("outside/canary")).unwrap(),
            b"x"
        );
    }

    #[test]
    fn names_must_be_plain() {
        let (_d, t) = setup();
        assert!(t.loc(b"a/..", false).is_err());
        assert!(t.loc(b"a/.", false).is_err());
        assert!(t.loc(b"a/", false).is_err());
        assert_eq!(t.loc(b"", false).unwrap().name(), ".");
        // A missing parent: an error, or an absent entry in a dry run.
        assert!(t.loc(b"no/such", false).is_err());
        assert!(t.loc(b"no/such", true).unwrap().stat().unwrap().is_none());
    }
}
