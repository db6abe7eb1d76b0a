//! A listed file by its handle: the table entry the walk makes for each
//! file, and how a worker opens it (once, shared by its segments, only if
//! it is still the file the walk saw) and lets it go after its last
//! segment.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_channel::Receiver;
use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::early::PreHash;
use crate::endpoint::Source;
use crate::error::{Error, Result};

use super::SrcFile;

/// How a listed file is reached when it is opened.
#[derive(Clone)]
pub(super) enum Reach {
    /// A source the user named: by its path, its symlink followed if
    /// `follow` (the user chose it).
    Named { follow: bool },
    /// A file the walk found in a source tree: by its path `rel` below the
    /// handle of the tree's top, with no symlink followed and no `..` on
    /// the way. A directory on the way swapped for a symlink since the
    /// walk cannot lead the open anywhere else, not even to a device
    /// whose open alone does something.
    Beneath { root: Arc<OwnedFd>, rel: Vec<u8> },
}

/// Open a listed file for reading: without following a symlink (unless
/// the user named it), and only if it is still the file the walk saw, so a
/// file swapped for a symlink or another file after the walk is never sent
/// in its place. See [`open_as_listed`].
pub(super) fn open_listed(path: &Path, reach: &Reach, ident: (u64, u64)) -> std::io::Result<File> {
    open_as_listed(path, reach, ident, true)
}

/// [`open_listed`], opened non-blocking: a FIFO put in the file's place
/// since the walk opens at once (and is refused, not the listed inode)
/// rather than waiting for a writer. For reading, a regular file then has
/// the flag cleared (`F_SETFL` to nothing: it was opened with no other
/// flag `F_SETFL` sets); a block device, where the flag also means "do
/// not check for a medium", is opened again, blocking, through its
/// descriptor in `/proc` (the same inode whatever is at the name by then).
///
/// A non-blocking open also fails where another process holds a write
/// lease on the file (a file server): if `wait`, the file is then opened
/// as [`open_pinned`] does, which waits for the lease's break as a plain
/// `open` would; otherwise (the prefetcher, which only advises the
/// kernel) the `WouldBlock` is returned.
fn open_as_listed(
    path: &Path,
    reach: &Reach,
    ident: (u64, u64),
    wait: bool,
) -> std::io::Result<File> {
    use rustix::fs::FileType;
    let how = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    let h = match open_reached(path, reach, how) {
        Err(Errno::WOULDBLOCK) if wait => return open_pinned(path, reach, ident),
        r => r.map_err(|e| not_listed(e, reach))?,
    };
    let st = rustix::fs::fstat(&h)?;
    if (st.st_dev, st.st_ino) != ident {
        return Err(changed());
    }
    match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile if wait => rustix::fs::fcntl_setfl(&h, OFlags::empty())?,
        FileType::RegularFile => {}
        FileType::BlockDevice if wait => return reopen(&h),
        FileType::BlockDevice => {}
        _ => return Err(changed()),
    }
    Ok(File::from(h))
}

/// A listed file opened blocking, without a moment when a FIFO, a socket or
/// a device put in its place could be opened: the name is opened with
/// `O_PATH`, which opens nothing, and only that inode, if it is the listed
/// one and a regular file or a block device, is then opened for reading
/// through `/proc`. Costs a second open (about 9 us here), so only where
/// [`open_as_listed`] needs it.
fn open_pinned(path: &Path, reach: &Reach, ident: (u64, u64)) -> std::io::Result<File> {
    use rustix::fs::FileType;
    let pinned = open_reached(path, reach, OFlags::PATH | OFlags::CLOEXEC)
        .map_err(|e| not_listed(e, reach))?;
    let st = rustix::fs::fstat(&pinned)?;
    let kind = FileType::from_raw_mode(st.st_mode);
    if (st.st_dev, st.st_ino) != ident
        || !matches!(kind, FileType::RegularFile | FileType::BlockDevice)
    {
        return Err(changed());
    }
    reopen(&pinned)
}

/// Open the file `path` reached as `reach` says, with `how` (and
/// `O_NOFOLLOW` unless a named source's symlink is followed): below a
/// tree's handle with `openat2`'s `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`
/// where the kernel has it, else each directory on the way opened from the
/// one before with `O_NOFOLLOW`.
fn open_reached(path: &Path, reach: &Reach, how: OFlags) -> std::result::Result<OwnedFd, Errno> {
    let (root, rel) = match reach {
        Reach::Named { follow: true } => return rustix::fs::open(path, how, Mode::empty()),
        Reach::Named { follow: false } => {
            return rustix::fs::open(path, how | OFlags::NOFOLLOW, Mode::empty())
        }
        Reach::Beneath { root, rel } => (root, OsStr::from_bytes(rel)),
    };
    let name = rel
        .as_bytes()
        .rsplit(|&b| b == b'/')
        .next()
        .unwrap_or_default();
    super::tree::pause_before_open(name);
    let how = how | OFlags::NOFOLLOW;
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    if NO_OPENAT2.load(Ordering::Relaxed) {
        return open_walking(root, rel.as_bytes(), how);
    }
    match rustix::fs::openat2(root, rel, how, Mode::empty(), resolve) {
        // No openat2 (an old kernel, or a sandbox that forbids it): not
        // tried again.
        Err(Errno::NOSYS) | Err(Errno::PERM) => {
            NO_OPENAT2.store(true, Ordering::Relaxed);
            open_walking(root, rel.as_bytes(), how)
        }
        // EAGAIN (a rename raced the lookup) is also EWOULDBLOCK, a lease:
        // the caller's to handle.
        r => r,
    }
}

/// `openat2` was found missing or forbidden.
static NO_OPENAT2: AtomicBool = AtomicBool::new(false);

/// [`open_reached`] below a tree's handle without `openat2`: the
/// directories on the way opened one by one with `O_NOFOLLOW` (see
/// [`crate::destdir::open_beneath`]), then the file in the last of them.
fn open_walking(root: &OwnedFd, rel: &[u8], how: OFlags) -> std::result::Result<OwnedFd, Errno> {
    let (dir, name) = match rel.iter().rposition(|&b| b == b'/') {
        None => (None, rel),
        Some(i) => (Some(&rel[..i]), &rel[i + 1..]),
    };
    if name.is_empty() || name == b"." || name == b".." {
        return Err(Errno::INVAL);
    }
    let name = OsStr::from_bytes(name);
    let Some(dir) = dir else {
        return rustix::fs::openat(root, name, how, Mode::empty());
    };
    let dir = crate::destdir::open_beneath(root, dir)
        .map_err(|e| Errno::from_raw_os_error(e.raw_os_error().unwrap_or(libc::EINVAL)))?;
    rustix::fs::openat(&dir, name, how, Mode::empty())
}

/// The inode `fd` refers to, opened for reading, blocking.
fn reopen(fd: &impl std::os::fd::AsRawFd) -> std::io::Result<File> {
    use rustix::fs::{Mode, OFlags};
    let p = format!("/proc/self/fd/{}", fd.as_raw_fd());
    match rustix::fs::open(p, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()) {
        Ok(h) => Ok(File::from(h)),
        // An open descriptor's entry is missing only without /proc: not a
        // file that vanished.
        Err(rustix::io::Errno::NOENT) => Err(std::io::Error::other(
            "cannot open it again through /proc/self/fd (is /proc mounted?)",
        )),
        Err(e) => Err(e.into()),
    }
}

/// The error of a listed file or directory that is no longer what the walk
/// saw.
pub(super) fn changed() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::NotFound,
        "vanished or replaced since it was listed",
    )
}

/// An open's error, as [`changed`] where it means that: a symlink met
/// where none is followed or, on the way, a file where a directory was
/// (`ENOTDIR`). Not `ENXIO`: a socket put in the file's place, but also a
/// listed disk that was removed, which must not pass for a vanished file.
fn not_listed(e: Errno, reach: &Reach) -> std::io::Error {
    match e {
        Errno::NOTDIR => changed(),
        Errno::LOOP if !matches!(reach, Reach::Named { follow: true }) => changed(),
        e => e.into(),
    }
}

impl SrcFile {
    /// A file or block device found by the walk, opened by path when first
    /// read.
    pub(super) fn listed(
        path: PathBuf,
        size: u64,
        mtime: (i64, u32),
        ident: (u64, u64),
        reach: Reach,
    ) -> Self {
        Self {
            path,
            size,
            mtime,
            open: Mutex::new(None),
            kept_open: false,
            remaining: AtomicU64::new(0),
            failed: Default::default(),
            prehash: PreHash::default(),
            ident,
            reach,
            holey: false,
            dense: false,
            device: false,
        }
    }

    /// A source opened at walk time and kept for the session (an NBD
    /// export): never opened by path again.
    pub(super) fn kept(
        path: PathBuf,
        size: u64,
        mtime: (i64, u32),
        reader: Arc<dyn Source>,
    ) -> Self {
        Self {
            path,
            size,
            mtime,
            open: Mutex::new(Some(reader)),
            kept_open: true,
            remaining: AtomicU64::new(0),
            failed: Default::default(),
            prehash: PreHash::default(),
            // Kept open from the start: never opened by path again.
            ident: (0, 0),
            reach: Reach::Named { follow: true },
            holey: true,
            dense: false,
            device: false,
        }
    }

    /// The reader a segment of this file reads with: the one already
    /// open, else a new one (kept for the file's other segments). `None`
    /// once the file has failed; the open's error (returned after the lock
    /// is let go) when it cannot be opened.
    pub(super) fn reader(
        &self,
        direct_io: bool,
    ) -> Result<std::io::Result<Option<Arc<dyn Source>>>> {
        let mut g = self
            .open
            .lock()
            .map_err(|_| Error::Protocol("lock poisoned".into()))?;
        Ok(match &*g {
            Some(h) => Ok(Some(h.clone())),
            None if self.failed.load(Ordering::SeqCst) => Ok(None),
            None => open_listed(&self.path, &self.reach, self.ident).map(|h| {
                let direct = direct_io && !self.device;
                let r = crate::direct::Reader::listed(h, direct, self.size, self.dense);
                let h: Arc<dyn Source> = Arc::new(r);
                *g = Some(h.clone());
                Some(h)
            }),
        })
    }

    /// A handle to ask where the file's data lies while its segments are
    /// queued (see [`super::holes`]): the one kept open, else the file
    /// opened once more, as the workers will open it. `None` when it has
    /// no holes to find, or cannot be opened (the workers meet and report
    /// that).
    pub(super) fn reader_for_plan(&self) -> Option<Arc<dyn Source>> {
        if !self.holey {
            return None;
        }
        if self.kept_open {
            return self.open.lock().ok().and_then(|g| g.clone());
        }
        let f = open_listed(&self.path, &self.reach, self.ident).ok()?;
        Some(Arc::new(f))
    }

    /// Start reading a small file's data into the page cache (see
    /// [`prefetcher`]): open it, check it is still the file the walk
    /// listed, and advise `WILLNEED`, which queues the read. Best effort:
    /// whatever fails is the worker's to meet when it reads. Skipped when
    /// a worker has the file open or is opening it, or has sent it all.
    fn prefetch(&self) {
        if self.remaining.load(Ordering::Relaxed) == 0
            || self.open.try_lock().map_or(true, |g| g.is_some())
        {
            return;
        }
        // Never waits for a lease: the worker will.
        if let Ok(h) = open_as_listed(&self.path, &self.reach, self.ident, false) {
            let _ = rustix::fs::fadvise(
                &h,
                0,
                std::num::NonZeroU64::new(self.size),
                rustix::fs::Advice::WillNeed,
            );
        }
    }

    /// Whether [`prefetcher`] reads this file ahead: see [`prefetch_worthy`].
    pub(super) fn prefetch_worthy(&self) -> bool {
        prefetch_worthy(self.size, self.kept_open, self.device)
    }

    /// After the file's last segment: close it, unless it is kept open.
    pub(super) fn release(&self) {
        if !self.kept_open {
            if let Ok(mut g) = self.open.lock() {
                *g = None;
            }
        }
    }
}

/// Small files waiting for the [`prefetcher`], at most: a request that
/// finds the queue full is not read ahead.
pub(super) const PREFETCH_QUEUE: usize = 1024;
/// Segment jobs waiting for the workers above which files asked for are
/// not read ahead: what is read ahead waits in the page cache until a
/// worker gets to it, so at most about this many files' worth.
pub(super) const PREFETCH_AHEAD: usize = 8192;

/// The prefetch thread: starts the reads of the small files asked for
/// whole (queued by the request thread, never waiting for this one), so
/// that with a cold cache the reads of many small files are in flight at
/// once rather than one per worker, each waiting for the disk. A slow
/// open (a network filesystem) holds up only this thread. Ends when the
/// request thread lets go of the queue, or as soon as the session is
/// `over` (what is still queued is not worth reading then).
///
/// 200,000 files of 0-8 KiB, cache dropped, to a fresh ext4 on this
/// project's 2-core test machine: 22.5-25.1 s against 26.6-31.4 s without
/// (rsync -a 27.3 s beside them).
pub(super) fn prefetcher(files: Receiver<Arc<SrcFile>>, over: &AtomicBool) {
    for f in files {
        if over.load(Ordering::Relaxed) {
            break;
        }
        f.prefetch();
    }
}

/// Whether a file asked for whole is read ahead by the [`prefetcher`]:
/// a regular file with data, small enough that a worker reads it through
/// the page cache in one call (larger ones are read in large calls the
/// kernel reads ahead for, or with `O_DIRECT`), and not one kept open (an
/// NBD export).
pub(super) fn prefetch_worthy(size: u64, kept_open: bool, device: bool) -> bool {
    size > 0 && size < crate::direct::MIN_SIZE && !kept_open && !device
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    const NAMED: Reach = Reach::Named { follow: false };
    const FOLLOWED: Reach = Reach::Named { follow: true };

    #[test]
    fn only_small_listed_files_are_read_ahead() {
        assert!(prefetch_worthy(1, false, false));
        assert!(prefetch_worthy(8 << 10, false, false));
        assert!(!prefetch_worthy(0, false, false));
        assert!(!prefetch_worthy(crate::direct::MIN_SIZE, false, false));
        assert!(!prefetch_worthy(4096, true, false));
        assert!(!prefetch_worthy(4096, false, true));
    }

    /// `open_listed` on another thread, its result within `secs` seconds
    /// (`None`: it was still waiting).
    fn open_within(
        p: &Path,
        ident: (u64, u64),
        secs: f64,
    ) -> (
        Option<std::io::Result<File>>,
        crossbeam_channel::Receiver<std::io::Result<File>>,
    ) {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let p = p.to_path_buf();
        std::thread::spawn(move || {
            let _ = tx.send(open_listed(&p, &NAMED, ident));
        });
        let got = rx
            .recv_timeout(std::time::Duration::from_secs_f64(secs))
            .ok();
        (got, rx)
    }

    /// A listed file, and its identity.
    fn listed(d: &Path) -> (PathBuf, (u64, u64)) {
        let p = d.join("f");
        std::fs::write(&p, b"data").unwrap();
        let m = std::fs::metadata(&p).unwrap();
        (p, (m.dev(), m.ino()))
    }

    #[test]
    fn a_listed_file_opens_blocking_and_a_fifo_in_its_place_is_refused_at_once() {
        let d = tempfile::tempdir().unwrap();
        let (p, ident) = listed(d.path());
        let h = open_listed(&p, &NAMED, ident).unwrap();
        let fl = rustix::fs::fcntl_getfl(&h).unwrap();
        assert!(!fl.contains(rustix::fs::OFlags::NONBLOCK));
        drop(h);
        // Swapped for a FIFO after the walk: an open for reading would wait
        // for a writer forever. (The listed file is kept, under another
        // name, so that the FIFO cannot get its inode number.)
        std::fs::rename(&p, d.path().join("kept")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &p,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let (got, _) = open_within(&p, ident, 10.0);
        let e = got.expect("the open waited").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
    }

    #[test]
    fn a_device_a_socket_a_symlink_or_a_file_for_a_directory_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let (p, ident) = listed(d.path());
        let kept = d.path().join("kept");
        std::fs::rename(&p, &kept).unwrap();
        // A symlink to the listed file itself: not followed.
        std::os::unix::fs::symlink(&kept, &p).unwrap();
        let e = open_listed(&p, &NAMED, ident).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
        // The user named the symlink: followed, to the listed file.
        assert!(open_as_listed(&p, &FOLLOWED, ident, true).is_ok());
        // Followed to a device: not the listed inode.
        std::fs::remove_file(&p).unwrap();
        std::os::unix::fs::symlink("/dev/null", &p).unwrap();
        let e = open_as_listed(&p, &FOLLOWED, ident, true).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
        // A socket: an error, at once (ENXIO, which a removed disk also
        // gives: not reported as vanished).
        std::fs::remove_file(&p).unwrap();
        let _socket = std::os::unix::net::UnixListener::bind(&p).unwrap();
        let e = open_listed(&p, &NAMED, ident).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENXIO), "{e}");
        // A directory on the way replaced by a file.
        let e = open_listed(&kept.join("f"), &NAMED, ident).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
    }

    #[test]
    fn a_file_of_a_tree_is_opened_below_its_handle_and_never_through_a_symlink() {
        let d = tempfile::tempdir().unwrap();
        let tree = d.path().join("tree");
        std::fs::create_dir_all(tree.join("sub")).unwrap();
        let p = tree.join("sub/f");
        std::fs::write(&p, b"data").unwrap();
        let m = std::fs::metadata(&p).unwrap();
        let ident = (m.dev(), m.ino());
        let root: Arc<OwnedFd> = Arc::new(File::open(&tree).unwrap().into());
        let reach = Reach::Beneath {
            root: root.clone(),
            rel: b"sub/f".to_vec(),
        };
        let mut got = String::new();
        let mut h = open_listed(&p, &reach, ident).unwrap();
        std::io::Read::read_to_string(&mut h, &mut got).unwrap();
        assert_eq!(got, "data");
        let how = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        assert!(open_walking(&root, b"sub/f", how).is_ok());
        // The directory on the way swapped for a symlink: to where the same
        // file is, or to /dev, where an open alone may do something.
        std::fs::rename(tree.join("sub"), d.path().join("moved")).unwrap();
        for target in [d.path().join("moved"), "/dev".into()] {
            std::os::unix::fs::symlink(&target, tree.join("sub")).unwrap();
            for name in ["f", "null"] {
                let rel = format!("sub/{name}").into_bytes();
                let reach = Reach::Beneath {
                    root: root.clone(),
                    rel: rel.clone(),
                };
                let e = open_listed(&tree.join("sub").join(name), &reach, ident).unwrap_err();
                assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
                let e = open_walking(&root, &rel, how).unwrap_err();
                assert!(matches!(e, Errno::LOOP | Errno::NOTDIR), "{e}");
            }
            std::fs::remove_file(tree.join("sub")).unwrap();
        }
        assert_eq!(
            open_walking(&root, b"sub/..", how).unwrap_err(),
            Errno::INVAL
        );
        // `..` leads nowhere above the tree.
        let reach = Reach::Beneath {
            root,
            rel: b"../tree/sub/f".to_vec(),
        };
        assert!(open_listed(&p, &reach, ident).is_err());
    }

    /// Holds a write lease on the file named by its argument, says "held",
    /// and lets it go when a line comes on its stdin.
    const LEASE_HOLDER: &str = r#"
import fcntl, os, signal, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
signal.signal(signal.SIGIO, lambda sig, frame: None)
fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
print("held", flush=True)
sys.stdin.readline()
fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
print("let go", flush=True)
sys.stdin.readline()
"#;

    /// Kills the process when dropped (a failed assertion included).
    struct Killed(std::process::Child);

    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[test]
    fn a_file_under_a_write_lease_is_opened_once_the_lease_is_let_go() {
        use std::io::{BufRead, Write};
        let d = tempfile::tempdir().unwrap();
        let (p, ident) = listed(d.path());
        // A file server's lease, held by another process (python3, which
        // the project's CI installs).
        let mut holder = Killed(
            std::process::Command::new("python3")
                .arg("-c")
                .arg(LEASE_HOLDER)
                .arg(&p)
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("python3 is needed to hold a lease"),
        );
        let mut said = std::io::BufReader::new(holder.0.stdout.take().unwrap());
        let mut line = String::new();
        said.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "held");
        // The prefetcher does not wait.
        let e = open_as_listed(&p, &NAMED, ident, false).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "{e}");
        // A worker waits, as a plain open would, until the lease is let go.
        let (got, rx) = open_within(&p, ident, 0.3);
        assert!(got.is_none(), "opened under the lease");
        let mut stdin = holder.0.stdin.take().unwrap();
        stdin.write_all(b"go\n").unwrap();
        line.clear();
        said.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "let go");
        let mut h = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("still waiting after the lease was let go")
            .unwrap();
        let mut got = Vec::new();
        std::io::Read::read_to_end(&mut h, &mut got).unwrap();
        assert_eq!(got, b"data");
    }
}
