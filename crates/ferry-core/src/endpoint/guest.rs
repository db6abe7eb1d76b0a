//! Sources seen through what their guest uses (`--sparsify`), and members
//! of tar archives read in place (`vm.ova#disk.img`).

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::sync::Arc;

use ferry_guest::{GuestMap, MapOptions, Ranges, ReadAt};

use super::Source;
use crate::error::{Error, Result};

/// A [`Source`] as a [`ReadAt`] of `size` bytes, for the guest readers.
struct AsReadAt<'a>(&'a dyn Source, u64);

impl ReadAt for AsReadAt<'_> {
    fn read_exact_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        match off.checked_add(buf.len() as u64) {
            Some(end) if end <= self.1 => self.0.read_exact_at(buf, off),
            _ => Err(io::ErrorKind::UnexpectedEof.into()),
        }
    }
    fn size(&self) -> u64 {
        self.1
    }
}

/// A source whose guest-unused ranges read as zeros and are reported as
/// holes: never read, never sent.
pub struct Sparsified {
    inner: Arc<dyn Source>,
    free: Ranges,
}

impl Sparsified {
    pub fn new(inner: Arc<dyn Source>, free: Ranges) -> Self {
        Self { inner, free }
    }
}

impl Source for Sparsified {
    fn next_data(&self, mut pos: u64, end: u64) -> io::Result<Option<(u64, u64)>> {
        while pos < end {
            let Some((s, e)) = self.inner.next_data(pos, end)? else {
                return Ok(None);
            };
            match self.free.first_ending_after(s) {
                // The data starts in a free range (which ends after `s`):
                // look again past it.
                Some((fs, fe)) if fs <= s => pos = fe,
                // A free range starts inside the data: the data stops there.
                Some((fs, _)) if fs < e => return Ok(Some((s, fs))),
                _ => return Ok(Some((s, e))),
            }
        }
        Ok(None)
    }

    fn read_exact_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        // Read only what the guest uses; the rest reads as zeros.
        let end = off + buf.len() as u64;
        let mut pos = off;
        while pos < end {
            let (used_end, free_end) = match self.free.first_ending_after(pos) {
                Some((fs, fe)) if fs <= pos => (pos, fe.min(end)),
                Some((fs, fe)) => (fs.min(end), fe.min(end)),
                None => (end, end),
            };
            if used_end > pos {
                let r = &mut buf[(pos - off) as usize..(used_end - off) as usize];
                self.inner.read_exact_at(r, pos)?;
            }
            let z0 = used_end.max(pos);
            if free_end > z0 {
                buf[(z0 - off) as usize..(free_end - off) as usize].fill(0);
            }
            pos = free_end.max(used_end);
        }
        Ok(())
    }

    fn stamp(&self) -> io::Result<Option<(u64, (i64, u32))>> {
        self.inner.stamp()
    }
}

/// `len` bytes of another source from `base`: a tar member.
pub struct MemberSource {
    inner: Arc<dyn Source>,
    base: u64,
    len: u64,
    /// The archive's size, which [`Source::stamp`] reports as the member's.
    archive_len: u64,
}

impl MemberSource {
    /// The member's size.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Source for MemberSource {
    fn next_data(&self, pos: u64, end: u64) -> io::Result<Option<(u64, u64)>> {
        let end = end.min(self.len);
        if pos >= end {
            return Ok(None);
        }
        Ok(self
            .inner
            .next_data(self.base + pos, self.base + end)?
            .map(|(s, e)| (s - self.base, e - self.base)))
    }

    fn read_exact_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        match off.checked_add(buf.len() as u64) {
            Some(e) if e <= self.len => self.inner.read_exact_at(buf, self.base + off),
            _ => Err(io::ErrorKind::UnexpectedEof.into()),
        }
    }

    /// The archive's time, and the member's size while the archive keeps
    /// its own: a changed archive is a changed member.
    fn stamp(&self) -> io::Result<Option<(u64, (i64, u32))>> {
        Ok(self.inner.stamp()?.map(|(size, t)| {
            let size = if size == self.archive_len {
                self.len
            } else {
                u64::MAX
            };
            (size, t)
        }))
    }
}

/// Split `arg` into an archive and a member name (`vm.ova#disk.img`) when
/// `arg` itself does not exist and what comes before its last `#` is a
/// regular file (or a symlink, which [`open_archive`] then refuses).
pub fn split_member(arg: &str) -> Option<(&str, &str)> {
    if std::fs::symlink_metadata(arg).is_ok() {
        return None;
    }
    let (archive, member) = arg.rsplit_once('#')?;
    if member.is_empty() || archive.is_empty() {
        return None;
    }
    std::fs::symlink_metadata(archive)
        .ok()
        .filter(|m| m.is_file() || m.file_type().is_symlink())?;
    Some((archive, member))
}

/// Open an archive named for its members: a regular file, not through a
/// symlink (on a daemon, a link could lead outside its root).
pub fn open_archive(archive: &Path) -> Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(archive)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => Error::Usage(format!(
                "{}: a symlink; name the archive itself to read its members",
                archive.display()
            )),
            _ => Error::io_op("open for reading", archive, e),
        })?;
    let meta = f.metadata().map_err(|e| Error::io(archive, e))?;
    if !meta.is_file() {
        return Err(Error::Usage(format!(
            "{}: members are read from a regular file (a tar archive)",
            archive.display()
        )));
    }
    Ok(f)
}

/// Open member `member` of the tar archive `file` as a source.
pub fn open_member(file: Arc<dyn Source>, archive: &Path, member: &str) -> Result<MemberSource> {
    let size = file
        .stamp()
        .map_err(|e| Error::io(archive, e))?
        .map(|s| s.0)
        .ok_or_else(|| Error::Usage(format!("{}: not a regular file", archive.display())))?;
    let m = ferry_guest::tar::find_member(&AsReadAt(&*file, size), member)
        .map_err(|e| Error::Usage(format!("{}: {e}", archive.display())))?;
    Ok(MemberSource {
        inner: file,
        base: m.offset,
        len: m.size,
        archive_len: size,
    })
}

/// Why a local image or device must not be mapped now: it is mounted, or
/// attached to a loop device.
pub fn looks_mounted(file: &File) -> Option<String> {
    let meta = file.metadata().ok()?;
    if meta.file_type().is_block_device() {
        // An exclusive open fails while the device is mounted or held.
        use std::os::unix::fs::OpenOptionsExt;
        let path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(file));
        let held = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_EXCL)
            .open(&path)
            .err()
            .is_some_and(|e| e.raw_os_error() == Some(libc::EBUSY));
        return held.then(|| "the device is mounted or held by another user".into());
    }
    if let Some(why) = locked(file) {
        return Some(why);
    }
    let ident = (meta.dev(), meta.ino());
    let loops = std::fs::read_dir("/sys/block").ok()?;
    for d in loops.flatten() {
        let backing = d.path().join("loop/backing_file");
        let Ok(p) = std::fs::read_to_string(&backing) else {
            continue;
        };
        let same = std::fs::metadata(p.trim_end()).is_ok_and(|m| (m.dev(), m.ino()) == ident);
        if same {
            return Some(format!(
                "the image is attached to /dev/{}",
                d.file_name().to_string_lossy()
            ));
        }
    }
    None
}

/// Whether another process holds a lock on the image: QEMU locks the
/// images its virtual machines run on (open file description locks), so a
/// running, paused or saved VM's disk is seen here.
fn locked(file: &File) -> Option<String> {
    use std::os::fd::AsRawFd;
    // SAFETY: an all-zero flock is a valid value; F_OFD_GETLK only fills it.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as _;
    fl.l_whence = libc::SEEK_SET as _;
    // SAFETY: `fl` outlives the call, which only reads and writes it.
    let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) };
    (r == 0 && fl.l_type != libc::F_UNLCK as _)
        .then(|| "another process holds a lock on it (a virtual machine running on it?)".into())
}

/// Map `src` (of `size` bytes) through its guest's filesystems and wrap it
/// so the unused blocks read as holes. `mounted` says why a local image
/// looks in use, if it does.
pub fn sparsify(
    src: Arc<dyn Source>,
    size: u64,
    shown: &str,
    force: bool,
    mounted: Option<String>,
) -> Result<(Arc<dyn Source>, GuestMap)> {
    if let (Some(why), false) = (&mounted, force) {
        return Err(Error::Usage(format!(
            "{shown}: --sparsify refuses an image in use ({why}); its maps may change under the copy (--force copies it anyway)"
        )));
    }
    let map = ferry_guest::map_image(&AsReadAt(&*src, size), &MapOptions { force }).map_err(
        |e| match e {
            ferry_guest::GuestError::Io(io) => Error::io(shown, io),
            other => Error::Usage(format!("{shown}: --sparsify: {other}")),
        },
    )?;
    let wrapped: Arc<dyn Source> = Arc::new(Sparsified::new(src, map.free.clone()));
    Ok((wrapped, map))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An in-memory source with data everywhere.
    struct Mem(Vec<u8>);
    impl Source for Mem {
        fn next_data(&self, pos: u64, end: u64) -> io::Result<Option<(u64, u64)>> {
            Ok((pos < end).then_some((pos, end)))
        }
        fn read_exact_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
            buf.copy_from_slice(&self.0[off as usize..off as usize + buf.len()]);
            Ok(())
        }
        fn stamp(&self) -> io::Result<Option<(u64, (i64, u32))>> {
            Ok(None)
        }
    }

    fn sparsified(free: &[(u64, u64)]) -> Sparsified {
        let mut r = Ranges::new();
        for &(s, e) in free {
            r.push(s, e);
        }
        Sparsified::new(Arc::new(Mem(vec![7u8; 100])), r)
    }

    #[test]
    fn free_ranges_are_holes_and_read_as_zeros() {
        let s = sparsified(&[(10, 20), (30, 40), (90, 100)]);
        let mut got = Vec::new();
        let mut pos = 0;
        while let Some((a, b)) = s.next_data(pos, 100).expect("next_data") {
            got.push((a, b));
            pos = b;
        }
        assert_eq!(got, vec![(0, 10), (20, 30), (40, 90)]);
        let mut buf = vec![1u8; 50];
        s.read_exact_at(&mut buf, 5).expect("read");
        for (i, b) in buf.iter().enumerate() {
            let at = i as u64 + 5;
            let free = (10..20).contains(&at) || (30..40).contains(&at);
            assert_eq!(*b, if free { 0 } else { 7 }, "byte {at}");
        }
    }

    #[test]
    fn all_free_has_no_data() {
        let s = sparsified(&[(0, 100)]);
        assert_eq!(s.next_data(0, 100).expect("next_data"), None);
        assert_eq!(s.next_data(50, 60).expect("next_data"), None);
    }
}
