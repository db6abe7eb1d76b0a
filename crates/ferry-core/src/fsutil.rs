//! Thin wrappers over the filesystem calls the engine needs: data extents,
//! hole punching, metadata, extended attributes, and the registry of
//! temporary files that an interrupted run must remove.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustix::fs::{FallocateFlags, SeekFrom, Timespec, Timestamps, XattrFlags};

/// The next data extent at or after `pos` and before `end`: `Some((start,
/// stop))`, or `None` when only a hole remains. Filesystems and devices
/// without `SEEK_DATA` report everything as data.
pub fn next_data(file: &File, pos: u64, end: u64) -> io::Result<Option<(u64, u64)>> {
    if pos >= end {
        return Ok(None);
    }
    let start = match rustix::fs::seek(file.as_fd(), SeekFrom::Data(pos)) {
        Ok(s) => s,
        Err(rustix::io::Errno::NXIO) => return Ok(None),
        Err(rustix::io::Errno::INVAL | rustix::io::Errno::OPNOTSUPP) => {
            return Ok(Some((pos, end)))
        }
        Err(e) => return Err(e.into()),
    };
    if start >= end {
        return Ok(None);
    }
    let stop = match rustix::fs::seek(file.as_fd(), SeekFrom::Hole(start)) {
        Ok(s) => s.min(end),
        Err(_) => end,
    };
    Ok(Some((start, stop.max(start + 1).min(end))))
}

/// Read exactly `buf.len()` bytes at `offset`, failing with `UnexpectedEof`
/// when the file is shorter (it shrank while being read).
pub fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    file.read_exact_at(buf, offset)
}

/// Make `[offset, offset+len)` read as zeros without writing zeros where
/// the filesystem or device can: punch a hole, else zero the range, else
/// write zeros.
pub fn zero_range(file: &File, offset: u64, len: u64) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    let keep = FallocateFlags::KEEP_SIZE;
    if rustix::fs::fallocate(file.as_fd(), FallocateFlags::PUNCH_HOLE | keep, offset, len).is_ok() {
        return Ok(());
    }
    if rustix::fs::fallocate(file.as_fd(), FallocateFlags::ZERO_RANGE | keep, offset, len).is_ok() {
        return Ok(());
    }
    static ZEROS: [u8; 1 << 16] = [0; 1 << 16];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(ZEROS.len() as u64) as usize;
        file.write_all_at(&ZEROS[..n], offset + done)?;
        done += n as u64;
    }
    Ok(())
}

/// Start writing `file`'s dirty pages back, without waiting
/// (`sync_file_range(SYNC_FILE_RANGE_WRITE)`). Only a hint: an error is
/// met again by [`wait_writeback`] or `fdatasync`.
pub fn start_writeback(file: &File) {
    let _ = sync_range(file, libc::SYNC_FILE_RANGE_WRITE);
}

/// Wait for the write-back [`start_writeback`] started, reporting a
/// failed write (`sync_file_range(SYNC_FILE_RANGE_WAIT_AFTER)`), for a
/// file that nothing writes to any more. Unlike `fdatasync` this neither
/// writes the inode nor flushes the device's cache: a `syncfs` must
/// follow for the data to be durable.
pub fn wait_writeback(file: &File) -> io::Result<()> {
    sync_range(file, libc::SYNC_FILE_RANGE_WAIT_AFTER)
}

/// A `sync_file_range` error that says the call is not available here
/// (seccomp, gVisor, WSL1, an odd filesystem), not that data was lost.
pub fn sync_range_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSYS | libc::EINVAL | libc::EPERM | libc::EOPNOTSUPP | libc::ESPIPE)
    )
}

fn sync_range(file: &File, flags: libc::c_uint) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain system call on a descriptor `file` keeps open; it
    // reads and writes no memory of this process.
    let rc = unsafe { libc::sync_file_range(file.as_raw_fd(), 0, 0, flags) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Size of a regular file or a block device.
pub fn size_of(file: &File, meta: &std::fs::Metadata) -> io::Result<u64> {
    if meta.file_type().is_block_device() {
        Ok(rustix::fs::seek(file.as_fd(), SeekFrom::End(0))?)
    } else {
        Ok(meta.len())
    }
}

/// True when the process can set owners (it is root).
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

fn ts(sec: i64, nsec: u32) -> Timespec {
    Timespec {
        tv_sec: sec,
        tv_nsec: nsec as _,
    }
}

pub(crate) fn mtime_only(sec: i64, nsec: u32) -> Timestamps {
    Timestamps {
        last_access: Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_OMIT,
        },
        last_modification: ts(sec, nsec),
    }
}

/// Set the modification time of an open file.
pub fn set_mtime_fd(file: &File, sec: i64, nsec: u32) -> io::Result<()> {
    Ok(rustix::fs::futimens(file.as_fd(), &mtime_only(sec, nsec))?)
}

/// The process umask, read without changing it (`/proc/self/status`);
/// 022 where that cannot be read.
pub fn umask() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Umask:"))
                .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        })
        .unwrap_or(0o022)
}

/// Set owner and group of an open file (`None`: left as it is).
pub fn fchown(file: &File, uid: Option<u32>, gid: Option<u32>) -> io::Result<()> {
    Ok(rustix::fs::fchown(
        file.as_fd(),
        uid.map(rustix::fs::Uid::from_raw),
        gid.map(rustix::fs::Gid::from_raw),
    )?)
}

/// Set permission bits of an open file.
pub fn fchmod(file: &File, mode: u32) -> io::Result<()> {
    Ok(rustix::fs::fchmod(
        file.as_fd(),
        rustix::fs::Mode::from_raw_mode((mode & 0o7777) as _),
    )?)
}

/// The extended attributes of a path (not following a final symlink).
/// Filesystems without xattr support give none.
pub fn read_xattrs(path: &Path) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    xattrs_of(path, false)
}

/// The extended attributes of the inode `fd` holds (an `O_PATH` handle
/// will do, a symlink's included), read through its entry in `/proc`,
/// which names that inode and nothing a path resolves to.
pub fn read_xattrs_of(fd: &impl AsRawFd) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    xattrs_of(
        &PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd())),
        true,
    )
}

/// [`read_xattrs`] of `path`, following its last symlink if `follow` (a
/// `/proc` entry, which leads to the very inode it names).
fn xattrs_of(path: &Path, follow: bool) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    use rustix::fs::{getxattr, getxattr_query, lgetxattr, lgetxattr_query};
    use rustix::fs::{listxattr, listxattr_query, llistxattr, llistxattr_query};
    let size = match if follow {
        listxattr_query(path)
    } else {
        llistxattr_query(path)
    } {
        Ok(n) => n,
        Err(rustix::io::Errno::NOTSUP) => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    if size == 0 {
        return Ok(Vec::new());
    }
    let mut names = vec![0u8; size + 256];
    let n = if follow {
        listxattr(path, &mut names[..])?
    } else {
        llistxattr(path, &mut names[..])?
    };
    names.truncate(n);
    let mut out = Vec::new();
    for name in names.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let name_os = std::ffi::OsStr::from_bytes(name);
        let q = if follow {
            getxattr_query(path, name_os)
        } else {
            lgetxattr_query(path, name_os)
        };
        let vlen = match q {
            Ok(n) => n,
            Err(rustix::io::Errno::NODATA) => continue,
            Err(e) => return Err(e.into()),
        };
        let mut v = vec![0u8; vlen];
        let got = match (vlen, follow) {
            (0, _) => 0,
            (_, true) => getxattr(path, name_os, &mut v[..])?,
            (_, false) => lgetxattr(path, name_os, &mut v[..])?,
        };
        v.truncate(got);
        out.push((name.to_vec(), v));
    }
    Ok(out)
}

/// Whether a run makes the extended attribute `name` agree with the
/// source: `user.*` with `-X`, the POSIX ACLs (`system.posix_acl_*`) with
/// `-A`. Others at the destination (`security.*` labels, `trusted.*`)
/// are left as they are.
pub fn xattr_in_scope(name: &[u8], xattrs: bool, acls: bool) -> bool {
    (xattrs && name.starts_with(b"user.")) || (acls && name.starts_with(b"system.posix_acl_"))
}

/// The attribute names a `listxattr` call filled `buf` with.
fn xattr_names(buf: &[u8]) -> impl Iterator<Item = &[u8]> {
    buf.split(|&b| b == 0).filter(|n| !n.is_empty())
}

/// Make an entry's extended attributes the source's: set each of
/// `xattrs`, then remove those in `scope` that the source does not have.
/// `list` fills a buffer with the names (as `listxattr`, growing it when
/// too small), `set` and `remove` act on one name.
pub fn sync_xattrs(
    xattrs: &[(Vec<u8>, Vec<u8>)],
    scope: &dyn Fn(&[u8]) -> bool,
    list: impl Fn(&mut [u8]) -> rustix::io::Result<usize>,
    set: impl Fn(&OsStr, &[u8]) -> rustix::io::Result<()>,
    remove: impl Fn(&OsStr) -> rustix::io::Result<()>,
) -> io::Result<()> {
    for (k, v) in xattrs {
        set(OsStr::from_bytes(k), v)?;
    }
    let mut buf = vec![0u8; 4096];
    let n = loop {
        match list(&mut buf) {
            Ok(n) => break n,
            Err(rustix::io::Errno::RANGE) if buf.len() < (1 << 20) => buf.resize(buf.len() * 4, 0),
            Err(rustix::io::Errno::NOTSUP) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    };
    for name in xattr_names(&buf[..n]) {
        if scope(name) && !xattrs.iter().any(|(k, _)| k == name) {
            match remove(OsStr::from_bytes(name)) {
                Ok(()) | Err(rustix::io::Errno::NODATA) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
}

/// [`sync_xattrs`] on an open file.
pub fn fwrite_xattrs(
    file: &File,
    xattrs: &[(Vec<u8>, Vec<u8>)],
    scope: &dyn Fn(&[u8]) -> bool,
) -> io::Result<()> {
    let fd = file.as_fd();
    sync_xattrs(
        xattrs,
        scope,
        |b| rustix::fs::flistxattr(fd, b),
        |k, v| rustix::fs::fsetxattr(fd, k, v, XattrFlags::empty()),
        |k| rustix::fs::fremovexattr(fd, k),
    )
}

/// Modification time of metadata as (seconds, nanoseconds).
pub fn mtime_of(m: &std::fs::Metadata) -> (i64, u32) {
    (m.mtime(), m.mtime_nsec() as u32)
}

/// Temporary files being written, by directory handle and name.
type TempSet = HashMap<(RawFd, OsString), Arc<OwnedFd>>;
static TEMPS: Mutex<Option<TempSet>> = Mutex::new(None);

/// Remember a temporary file so [`remove_temp_files`] can clean it up.
pub fn register_temp(dir: &Arc<OwnedFd>, name: &OsStr) {
    if let Ok(mut g) = TEMPS.lock() {
        g.get_or_insert_with(HashMap::new)
            .insert((dir.as_raw_fd(), name.to_os_string()), dir.clone());
    }
}

/// Forget a temporary file (renamed into place or removed).
pub fn unregister_temp(dir: &Arc<OwnedFd>, name: &OsStr) {
    if let Ok(mut g) = TEMPS.lock() {
        if let Some(s) = g.as_mut() {
            s.remove(&(dir.as_raw_fd(), name.to_os_string()));
        }
    }
}

/// Remove every temporary file still registered. Called by the CLI when a
/// run is interrupted, so no `.ferry-` file is left behind.
pub fn remove_temp_files() {
    if let Ok(mut g) = TEMPS.lock() {
        if let Some(s) = g.take() {
            for ((_, name), dir) in s {
                let _ = rustix::fs::unlinkat(&*dir, &name, rustix::fs::AtFlags::empty());
            }
        }
    }
}

/// `p` without trailing slashes (`/` stays `/`): the entry itself, for
/// `lstat`, `unlink` and `rename`, which fail on `file/` with ENOTDIR.
pub fn bare(p: &Path) -> &Path {
    let b = p.as_os_str().as_bytes();
    let end = b
        .iter()
        .rposition(|&c| c != b'/')
        .map_or(1.min(b.len()), |i| i + 1);
    Path::new(std::ffi::OsStr::from_bytes(&b[..end]))
}

/// This process's id, asked of the kernel once: a temporary file's name
/// carries it, and a run names one per file. (ferry never forks without
/// exec, so the id cannot change under it.)
pub fn own_pid() -> u32 {
    static PID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *PID.get_or_init(std::process::id)
}

/// Name for a temporary file beside the file `name`: hidden, and
/// recognisable by [`temp_owner`].
pub fn temp_name_for(name: &OsStr) -> OsString {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let name = name.as_bytes();
    let mut t = b".".to_vec();
    // Keep the name short enough for NAME_MAX with the suffix added.
    t.extend_from_slice(&name[..name.len().min(200)]);
    t.extend_from_slice(
        format!(
            ".ferry-{}-{}",
            own_pid(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        )
        .as_bytes(),
    );
    OsString::from_vec(t)
}

/// The process id in a temporary file name made by [`temp_path_for`]
/// (`.NAME.ferry-PID-SEQ`), or `None` for any other name.
pub fn temp_owner(name: &[u8]) -> Option<u32> {
    if !name.starts_with(b".") {
        return None;
    }
    let at = name.windows(7).rposition(|w| w == b".ferry-")?;
    let tail = std::str::from_utf8(&name[at + 7..]).ok()?;
    let (pid, seq) = tail.split_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(pid) || !digits(seq) {
        return None;
    }
    pid.parse().ok()
}

/// Remove the temporary files that killed ferry runs left in the
/// directory `dir`: names of [`temp_name_for`]'s form whose process no
/// longer exists (a live process's, another ferry's under way, are left
/// alone). Directories are left alone. Returns how many.
pub fn remove_stale_temps(dir: &OwnedFd) -> u64 {
    let Ok(entries) = crate::destdir::list(dir) else {
        return 0;
    };
    let mut n = 0;
    for (name, is_dir) in entries {
        let Some(pid) = temp_owner(name.as_bytes()) else {
            continue;
        };
        let alive = pid == own_pid() || Path::new(&format!("/proc/{pid}")).exists();
        if !alive
            && !is_dir
            && rustix::fs::unlinkat(dir, &name, rustix::fs::AtFlags::empty()).is_ok()
        {
            n += 1;
        }
    }
    n
}

#[cfg(test)]
mod tests {
    #[test]
    fn xattrs_in_scope_that_the_source_lost_are_removed() {
        use std::cell::RefCell;
        let have = RefCell::new(vec![
            b"user.old".to_vec(),
            b"user.keep".to_vec(),
            b"security.selinux".to_vec(),
            b"system.posix_acl_access".to_vec(),
        ]);
        let want = vec![
            (b"user.keep".to_vec(), b"1".to_vec()),
            (b"user.new".to_vec(), b"2".to_vec()),
        ];
        let scope = |n: &[u8]| xattr_in_scope(n, true, false);
        sync_xattrs(
            &want,
            &scope,
            |b| {
                let list: Vec<u8> = have
                    .borrow()
                    .iter()
                    .flat_map(|n| n.iter().copied().chain([0]))
                    .collect();
                if b.len() < list.len() {
                    return Err(rustix::io::Errno::RANGE);
                }
                b[..list.len()].copy_from_slice(&list);
                Ok(list.len())
            },
            |k, _| {
                let k = k.as_bytes().to_vec();
                if !have.borrow().contains(&k) {
                    have.borrow_mut().push(k);
                }
                Ok(())
            },
            |k| {
                have.borrow_mut().retain(|n| n != k.as_bytes());
                Ok(())
            },
        )
        .unwrap();
        let mut got = have.into_inner();
        got.sort();
        // user.old goes; labels and (without -A) ACLs stay.
        assert_eq!(
            got,
            [
                &b"security.selinux"[..],
                b"system.posix_acl_access",
                b"user.keep",
                b"user.new"
            ]
        );
        assert!(xattr_in_scope(b"system.posix_acl_default", false, true));
        assert!(!xattr_in_scope(b"trusted.x", true, true));
    }

    use super::*;

    #[test]
    fn bare_drops_trailing_slashes_only() {
        for (p, want) in [
            ("dst/", "dst"),
            ("a/b//", "a/b"),
            ("/", "/"),
            ("///", "/"),
            ("x", "x"),
            ("", ""),
        ] {
            assert_eq!(bare(Path::new(p)), Path::new(want), "{p}");
        }
    }
    use std::io::Write;

    #[test]
    fn stale_temps_are_recognised_and_removed() {
        let t = temp_name_for(OsStr::new("a b.img"));
        let name = t.as_bytes();
        assert_eq!(temp_owner(name), Some(std::process::id()));
        for other in [
            &b"a.ferry-1-2"[..],
            b".a.ferry-x-2",
            b".a.ferry-1-",
            b".a",
            b".a.ferry-12",
        ] {
            assert_eq!(
                temp_owner(other),
                None,
                "{:?}",
                String::from_utf8_lossy(other)
            );
        }
        let d = tempfile::tempdir().unwrap();
        // pid 0 never names a live ferry; u32::MAX - 1 is beyond pid_max.
        let dead = d.path().join(format!(".f.ferry-{}-3", u32::MAX - 1));
        let mine = d.path().join(temp_name_for(OsStr::new("g")));
        let user = d.path().join(".f.ferry-notes");
        for p in [&dead, &mine, &user] {
            std::fs::write(p, b"x").unwrap();
        }
        let fd: OwnedFd = File::open(d.path()).unwrap().into();
        assert_eq!(remove_stale_temps(&fd), 1);
        assert!(!dead.exists() && mine.exists() && user.exists());
    }

    #[test]
    fn extents_and_zeroing() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        let mut f = File::create(&p).unwrap();
        f.set_len(1 << 20).unwrap();
        f.write_all_at(&[1u8; 4096], 512 << 10).unwrap();
        f.flush().unwrap();
        let f = File::options().read(true).write(true).open(&p).unwrap();
        let (s, e) = next_data(&f, 0, 1 << 20).unwrap().unwrap();
        assert!(s <= 512 << 10 && e >= (512 << 10) + 4096, "{s} {e}");
        zero_range(&f, 512 << 10, 4096).unwrap();
        let mut b = [9u8; 4096];
        f.read_exact_at(&mut b, 512 << 10).unwrap();
        assert!(b.iter().all(|&x| x == 0));
    }

    #[test]
    fn temp_names_are_hidden_and_distinct() {
        let a = temp_name_for(OsStr::new("y.img"));
        let b = temp_name_for(OsStr::new("y.img"));
        assert_ne!(a, b);
        assert!(a.as_bytes().starts_with(b".y.img.ferry-"));
    }
}
