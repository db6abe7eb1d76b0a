//! A failing disk: EIO on reads of the source and on writes to the
//! destination, from a real block device, through the real binary.
//!
//! The kernels ferry's CI runs on have no device-mapper (no `dm-error`, no
//! `dm-flakey`), so the failing disk is built from what they do have: a
//! loop device over a file that this test process serves itself through
//! FUSE. Each READ or WRITE the loop driver sends for that file is answered
//! from a backing file, or with EIO where the test says the disk is bad
//! (sector ranges for reads, every write once writes are switched off).
//! That is what `dmsetup` with an `error` target (or `flakey` with
//! `error_writes`) gives, one layer down: ext4 and ferry above the loop
//! device see a block device whose bios fail with an I/O error.
//!
//! The same disk can also lie instead of failing ([`Rot`]): every request
//! succeeds, but a block of data written while the lie is on reads back
//! with one bit flipped, as a disk with bit rot (or a controller that
//! acknowledges what it never stored) does. That is for `--verify`.
//!
//! Needs root (mount, losetup), `/dev/fuse`, and e2fsprogs (`mkfs.ext4`,
//! `filefrag`); without them each test prints SKIPPED, and fails under CI.

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use common::*;

// ---------------------------------------------------------------------------
// The failing disk.

/// What the disk does wrong right now.
#[derive(Default)]
struct Faults {
    /// Byte ranges `[start, end)` of the device whose reads fail with EIO.
    bad_reads: Vec<(u64, u64)>,
    /// Every write (and flush) fails with EIO.
    writes_fail: bool,
    /// Requests answered with EIO so far.
    eio_reads: u64,
    eio_writes: u64,
    /// Data that reads back other than it was written.
    rot: Option<Rot>,
}

/// Bit rot: wherever on the device the 4 KiB `block` of data is written
/// (at a 4 KiB-aligned offset, as ext4 places file data) while this is
/// set, every read of it that reaches the disk gets byte `ROT_BYTE` of it
/// with bit `ROT_MASK` flipped; writes and flushes all succeed. The
/// block is chosen by its contents, pseudo-random bytes of one file, so
/// nothing but that file's data ever rots: no ext4 metadata or journal
/// block looks like it, and the test need not know in advance where ext4
/// will put the file.
struct Rot {
    block: Vec<u8>,
    /// Device offsets that hold `block` now, written since the lie began.
    at: Vec<u64>,
    /// Reads answered with the bit flipped.
    flipped_reads: u64,
}

const ROT_BYTE: u64 = 1234;
const ROT_MASK: u8 = 0x10;

impl Rot {
    fn new(block: &[u8]) -> Rot {
        assert_eq!(block.len(), 4096);
        Rot {
            block: block.to_vec(),
            at: Vec::new(),
            flipped_reads: 0,
        }
    }

    /// `[off, off + len)` of `store` was just written: note where it now
    /// holds the block, and forget where it no longer does.
    fn written(&mut self, store: &File, off: u64, len: u64) {
        let mut b = off / 4096 * 4096;
        let mut cur = vec![0u8; 4096];
        while b < off + len {
            let holds = store.read_exact_at(&mut cur, b).is_ok() && cur == self.block;
            self.at.retain(|&x| x != b);
            if holds {
                self.at.push(b);
            }
            b += 4096;
        }
    }

    /// `data`, read from `off`, as the rotten disk returns it.
    fn read(&mut self, off: u64, data: &mut [u8]) {
        let mut flipped = false;
        for &b in &self.at {
            let x = b + ROT_BYTE;
            if off <= x && x < off + data.len() as u64 {
                data[(x - off) as usize] ^= ROT_MASK;
                flipped = true;
            }
        }
        if flipped {
            self.flipped_reads += 1;
        }
    }
}

/// A loop device whose reads and writes go to an in-process FUSE server,
/// which fails them as `faults` says. Dropping it unmounts what it
/// mounted, detaches the loop device and ends the server, each by the
/// name or device it made, even when the test failed halfway.
struct FaultyDisk {
    /// `/dev/loopN`.
    dev: String,
    size: u64,
    faults: Arc<Mutex<Faults>>,
    /// The backing file the server answers from.
    store: PathBuf,
    fuse_mnt: PathBuf,
    /// Where the filesystem on the device is mounted, if it is.
    fs_mnt: PathBuf,
    fs_mounted: bool,
    fuse_mounted: bool,
    loop_attached: bool,
    server: Option<std::thread::JoinHandle<()>>,
    dir: Option<tempfile::TempDir>,
}

const MAX_WRITE: usize = 1 << 20;
/// The loop device's largest request, well under one FUSE request
/// (`MAX_WRITE`), so that no request is split: a split read whose second
/// half failed would come back short, and the loop driver zero-fills a
/// short read instead of failing it.
const LOOP_MAX_SECTORS_KB: u32 = 128;

static DISKS: AtomicUsize = AtomicUsize::new(0);

fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

fn ok(cmd: &mut Command) {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl FaultyDisk {
    /// A zeroed disk of `size` bytes, or None (after a loud SKIPPED, a
    /// panic under CI) where this machine cannot make one.
    fn new(test: &str, size: u64) -> Option<FaultyDisk> {
        if !is_root() {
            skip(&format!("{test} needs root to mount and losetup"));
            return None;
        }
        for tool in ["mkfs.ext4", "filefrag", "losetup", "mount", "umount"] {
            if !which(tool) {
                skip(&format!(
                    "{test}: {tool} not installed (packages e2fsprogs, mount)"
                ));
                return None;
            }
        }
        let Ok(fuse) = OpenOptions::new().read(true).write(true).open("/dev/fuse") else {
            skip(&format!("{test}: no /dev/fuse here"));
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        File::create(&store).unwrap().set_len(size).unwrap();
        let fuse_mnt = dir.path().join("fuse");
        let fs_mnt = dir.path().join("fs");
        fs::create_dir(&fuse_mnt).unwrap();
        fs::create_dir(&fs_mnt).unwrap();
        let faults = Arc::new(Mutex::new(Faults::default()));
        let mut disk = FaultyDisk {
            dev: String::new(),
            size,
            faults: faults.clone(),
            store: store.clone(),
            fuse_mnt: fuse_mnt.clone(),
            fs_mnt,
            fs_mounted: false,
            fuse_mounted: false,
            loop_attached: false,
            server: None,
            dir: Some(dir),
        };
        let server_dev = fuse.try_clone().unwrap();
        // The kernel takes the FUSE connection from the fd that mount(2)
        // is given: the mount command's stdin. -i: no mount.fuse helper.
        let name = format!(
            "ferry-faults-{}-{}",
            std::process::id(),
            DISKS.fetch_add(1, Ordering::Relaxed)
        );
        let out = Command::new("mount")
            .args([
                "-i",
                "-t",
                "fuse",
                "-o",
                "fd=0,rootmode=40000,user_id=0,group_id=0,allow_other",
                &name,
            ])
            .arg(&fuse_mnt)
            .stdin(Stdio::from(fuse))
            .output()
            .unwrap();
        if !out.status.success() {
            skip(&format!(
                "{test}: cannot mount a FUSE filesystem here: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
            return None;
        }
        disk.fuse_mounted = true;
        // Served from here on: /dev/fuse cannot be read before the mount.
        let backing = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&store)
            .unwrap();
        disk.server = Some(
            std::thread::Builder::new()
                .name("faulty-disk".into())
                .spawn(move || serve(server_dev, backing, size, faults))
                .unwrap(),
        );
        let out = Command::new("losetup")
            .args(["--find", "--show", "--direct-io=off"])
            .arg(fuse_mnt.join("disk"))
            .output()
            .unwrap();
        if !out.status.success() {
            skip(&format!(
                "{test}: no loop device here: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
            return None;
        }
        disk.dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        disk.loop_attached = true;
        let name = disk.dev.trim_start_matches("/dev/");
        fs::write(
            format!("/sys/block/{name}/queue/max_sectors_kb"),
            LOOP_MAX_SECTORS_KB.to_string(),
        )
        .expect("cap the loop device's request size");
        let kb = fs::read_to_string(format!("/sys/block/{name}/queue/max_sectors_kb")).unwrap();
        assert!(
            kb.trim().parse::<u32>().unwrap() <= LOOP_MAX_SECTORS_KB,
            "max_sectors_kb {kb}"
        );
        let mut f = File::open(&disk.dev).unwrap();
        assert_eq!(f.seek(SeekFrom::End(0)).unwrap(), disk.size, "{}", disk.dev);
        Some(disk)
    }

    /// An ext4 filesystem over the whole disk, mounted at `self.fs_mnt`.
    fn mkfs_and_mount(&mut self) {
        ok(Command::new("mkfs.ext4")
            .args([
                "-q",
                "-F",
                "-b",
                "4096",
                "-E",
                "nodiscard,lazy_itable_init=0,lazy_journal_init=0",
            ])
            .arg(&self.dev));
        self.mount("rw");
    }

    fn mount(&mut self, opts: &str) {
        assert!(!self.fs_mounted);
        ok(Command::new("mount")
            .args(["-t", "ext4", "-o", opts, &self.dev])
            .arg(&self.fs_mnt));
        self.fs_mounted = true;
    }

    /// Unmount the filesystem: its cached pages go with it, so the next
    /// mount reads from the (failing) disk again.
    fn umount(&mut self) {
        assert!(self.fs_mounted);
        ok(Command::new("umount").arg(&self.fs_mnt));
        self.fs_mounted = false;
    }

    fn set(&self, f: impl FnOnce(&mut Faults)) {
        f(&mut self.faults.lock().unwrap())
    }

    fn eio_counts(&self) -> (u64, u64) {
        let f = self.faults.lock().unwrap();
        (f.eio_reads, f.eio_writes)
    }

    /// With bit rot on: how many places hold the rotting block, and how
    /// many reads came back with its bit flipped.
    fn rot_counts(&self) -> (usize, u64) {
        let f = self.faults.lock().unwrap();
        let r = f.rot.as_ref().expect("bit rot is on");
        (r.at.len(), r.flipped_reads)
    }

    /// Where on the device the bytes `[start, end)` of `file` (on the
    /// mounted filesystem) live, from `filefrag -e`.
    fn device_ranges(&self, file: &Path, start: u64, end: u64) -> Vec<(u64, u64)> {
        let out = run(Command::new("filefrag").args(["-e", "-s"]).arg(file));
        assert!(out.status.success(), "filefrag {}", file.display());
        let text = String::from_utf8_lossy(&out.stdout);
        let bs: u64 = text
            .split("blocks of ")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no block size in filefrag output:\n{text}"));
        let mut ranges = Vec::new();
        for line in text.lines() {
            // "   0:        0..    1023:      34816..     35839:   1024:  last,eof"
            let l = line.trim_start();
            let Some((idx, rest)) = l.split_once(':') else {
                continue;
            };
            if idx.parse::<u64>().is_err() {
                continue;
            }
            let n: Vec<u64> = rest
                .replace("..", " ")
                .replace(':', " ")
                .split_whitespace()
                .take(4)
                .map(|t| t.parse().unwrap())
                .collect();
            let (log0, log1, phys0) = (n[0] * bs, (n[1] + 1) * bs, n[2] * bs);
            let (a, b) = (start.max(log0), end.min(log1));
            if a < b {
                ranges.push((phys0 + (a - log0), phys0 + (b - log0)));
            }
        }
        let covered: u64 = ranges.iter().map(|(a, b)| b - a).sum();
        assert_eq!(
            covered,
            end - start,
            "extents of {}:\n{text}",
            file.display()
        );
        ranges
    }
}

impl Drop for FaultyDisk {
    fn drop(&mut self) {
        // Whatever happened, the disk works again while it is taken apart.
        {
            let mut f = lock(&self.faults);
            f.bad_reads.clear();
            f.writes_fail = false;
            f.rot = None;
        }
        let mut clean = true;
        if self.fs_mounted {
            let st = Command::new("umount").arg(&self.fs_mnt).status();
            if !matches!(st, Ok(s) if s.success()) {
                let _ = Command::new("umount").arg("-l").arg(&self.fs_mnt).status();
                clean = false;
            }
        }
        if self.loop_attached {
            let _ = Command::new("losetup").args(["-d", &self.dev]).status();
        }
        if self.fuse_mounted {
            // The loop driver lets go of its file a moment after the
            // detach (in a work item): the mount is busy until then.
            let mut unmounted = false;
            for _ in 0..100 {
                let out = Command::new("umount").arg(&self.fuse_mnt).output();
                if matches!(&out, Ok(o) if o.status.success()) {
                    unmounted = true;
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            if !unmounted {
                eprintln!(
                    "faulty disk: {} still busy, unmounting lazily",
                    self.fuse_mnt.display()
                );
                let _ = Command::new("umount")
                    .arg("-l")
                    .arg(&self.fuse_mnt)
                    .status();
                clean = false;
            }
        }
        // The server ends when its connection does (the FUSE unmount);
        // after a lazy unmount it may live on, so it is not waited for.
        if let Some(h) = self.server.take() {
            if clean {
                let _ = h.join();
            }
        }
        if !clean {
            // Never delete through a mount point that is still there.
            if let Some(d) = self.dir.take() {
                let _ = d.keep();
            }
        }
    }
}

// A minimal FUSE server: one regular file, `disk`, in the root directory.
// Struct layouts from <linux/fuse.h> (protocol 7.31).

const FUSE_LOOKUP: u32 = 1;
const FUSE_FORGET: u32 = 2;
const FUSE_GETATTR: u32 = 3;
const FUSE_SETATTR: u32 = 4;
const FUSE_OPEN: u32 = 14;
const FUSE_READ: u32 = 15;
const FUSE_WRITE: u32 = 16;
const FUSE_STATFS: u32 = 17;
const FUSE_RELEASE: u32 = 18;
const FUSE_FSYNC: u32 = 20;
const FUSE_FLUSH: u32 = 25;
const FUSE_INIT: u32 = 26;
const FUSE_OPENDIR: u32 = 27;
const FUSE_READDIR: u32 = 28;
const FUSE_RELEASEDIR: u32 = 29;
const FUSE_INTERRUPT: u32 = 36;
const FUSE_DESTROY: u32 = 38;
const FUSE_BATCH_FORGET: u32 = 42;
const FUSE_MAX_PAGES: u32 = 1 << 22;
/// Open reply flag: no page cache for the file, every read reaches us.
const FOPEN_DIRECT_IO: u32 = 1;

const EIO: i32 = 5;
const ENOENT: i32 = 2;
const ENOSYS: i32 = 38;

const ROOT: u64 = 1;
const DISK: u64 = 2;

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// `struct fuse_attr` (88 bytes).
fn attr(node: u64, size: u64) -> Vec<u8> {
    let mut a = Vec::with_capacity(88);
    a.extend_from_slice(&node.to_le_bytes()); // ino
    a.extend_from_slice(&(if node == DISK { size } else { 0 }).to_le_bytes());
    a.extend_from_slice(&(if node == DISK { size / 512 } else { 0 }).to_le_bytes());
    a.extend_from_slice(&[0u8; 24]); // atime, mtime, ctime
    a.extend_from_slice(&[0u8; 12]); // their nsecs
    let mode: u32 = if node == DISK { 0o100600 } else { 0o040755 };
    a.extend_from_slice(&mode.to_le_bytes());
    a.extend_from_slice(&1u32.to_le_bytes()); // nlink
    a.extend_from_slice(&[0u8; 12]); // uid, gid, rdev
    a.extend_from_slice(&4096u32.to_le_bytes()); // blksize
    a.extend_from_slice(&0u32.to_le_bytes()); // flags
    debug_assert_eq!(a.len(), 88);
    a
}

/// The faults, even after a test thread panicked holding them: the server
/// must never stop answering, or the loop device's I/O would hang for good.
fn lock(faults: &Mutex<Faults>) -> std::sync::MutexGuard<'_, Faults> {
    faults.lock().unwrap_or_else(|e| e.into_inner())
}

fn serve(dev: File, store: File, size: u64, faults: Arc<Mutex<Faults>>) {
    let mut buf = vec![0u8; MAX_WRITE + (64 << 10)];
    loop {
        let n = match (&dev).read(&mut buf) {
            Ok(n) => n,
            // ENOENT: the request was interrupted; EINTR, EAGAIN: try again.
            Err(e) if matches!(e.raw_os_error(), Some(2 | 4 | 11)) => continue,
            // ENODEV: unmounted.
            Err(e) if e.raw_os_error() == Some(19) => return,
            Err(e) => {
                eprintln!("faulty disk: /dev/fuse: {e}");
                return;
            }
        };
        if n < 40 {
            continue;
        }
        let msg = &buf[..n];
        let (opcode, unique, node) = (u32_at(msg, 4), u64_at(msg, 8), u64_at(msg, 16));
        let body = &msg[40..];
        let reply: Result<Vec<u8>, i32> = match opcode {
            FUSE_FORGET | FUSE_BATCH_FORGET | FUSE_INTERRUPT => continue,
            FUSE_INIT => {
                let mut o = Vec::with_capacity(64);
                o.extend_from_slice(&7u32.to_le_bytes()); // major
                o.extend_from_slice(&31u32.to_le_bytes()); // minor
                o.extend_from_slice(&u32_at(body, 8).to_le_bytes()); // max_readahead
                o.extend_from_slice(&FUSE_MAX_PAGES.to_le_bytes()); // flags
                o.extend_from_slice(&16u16.to_le_bytes()); // max_background
                o.extend_from_slice(&12u16.to_le_bytes()); // congestion_threshold
                o.extend_from_slice(&(MAX_WRITE as u32).to_le_bytes());
                o.extend_from_slice(&1u32.to_le_bytes()); // time_gran
                o.extend_from_slice(&((MAX_WRITE / 4096) as u16).to_le_bytes()); // max_pages
                o.resize(64, 0);
                Ok(o)
            }
            FUSE_LOOKUP => {
                let name = body.split(|&c| c == 0).next().unwrap_or_default();
                if node == ROOT && name == b"disk" {
                    let mut o = Vec::with_capacity(128);
                    o.extend_from_slice(&DISK.to_le_bytes()); // nodeid
                    o.extend_from_slice(&0u64.to_le_bytes()); // generation
                    o.extend_from_slice(&3600u64.to_le_bytes()); // entry_valid
                    o.extend_from_slice(&3600u64.to_le_bytes()); // attr_valid
                    o.extend_from_slice(&[0u8; 8]); // nsecs
                    o.extend(attr(DISK, size));
                    Ok(o)
                } else {
                    Err(ENOENT)
                }
            }
            FUSE_GETATTR | FUSE_SETATTR => {
                let mut o = Vec::with_capacity(104);
                o.extend_from_slice(&3600u64.to_le_bytes()); // attr_valid
                o.extend_from_slice(&[0u8; 8]); // nsec, dummy
                o.extend(attr(node, size));
                Ok(o)
            }
            FUSE_OPEN | FUSE_OPENDIR => {
                let mut o = vec![0u8; 16];
                if opcode == FUSE_OPEN {
                    o[8..12].copy_from_slice(&FOPEN_DIRECT_IO.to_le_bytes());
                }
                Ok(o)
            }
            FUSE_READ => {
                let (off, len) = (u64_at(body, 8), u32_at(body, 16) as u64);
                let end = (off + len).min(size);
                let mut f = lock(&faults);
                if f.bad_reads.iter().any(|&(a, b)| a < end && off < b) {
                    f.eio_reads += 1;
                    Err(EIO)
                } else {
                    let mut data = vec![0u8; end.saturating_sub(off) as usize];
                    match store.read_exact_at(&mut data, off) {
                        Ok(()) => {
                            if let Some(r) = &mut f.rot {
                                r.read(off, &mut data);
                            }
                            Ok(data)
                        }
                        Err(_) => Err(EIO),
                    }
                }
            }
            FUSE_WRITE => {
                let (off, len) = (u64_at(body, 8), u32_at(body, 16) as usize);
                let mut f = lock(&faults);
                if f.writes_fail {
                    f.eio_writes += 1;
                    Err(EIO)
                } else if off + len as u64 > size || body.len() < 40 + len {
                    Err(EIO)
                } else {
                    match store.write_all_at(&body[40..40 + len], off) {
                        Ok(()) => {
                            if let Some(r) = &mut f.rot {
                                r.written(&store, off, len as u64);
                            }
                            let mut o = (len as u32).to_le_bytes().to_vec();
                            o.extend_from_slice(&[0u8; 4]);
                            Ok(o)
                        }
                        Err(_) => Err(EIO),
                    }
                }
            }
            FUSE_FSYNC => {
                let mut f = lock(&faults);
                if f.writes_fail {
                    f.eio_writes += 1;
                    Err(EIO)
                } else {
                    Ok(Vec::new())
                }
            }
            FUSE_STATFS => Ok(vec![0u8; 80]),
            FUSE_READDIR | FUSE_RELEASE | FUSE_RELEASEDIR | FUSE_FLUSH | FUSE_DESTROY => {
                Ok(Vec::new())
            }
            _ => Err(ENOSYS),
        };
        let (err, data) = match reply {
            Ok(d) => (0i32, d),
            Err(e) => (-e, Vec::new()),
        };
        let mut out = Vec::with_capacity(16 + data.len());
        out.extend_from_slice(&((16 + data.len()) as u32).to_le_bytes());
        out.extend_from_slice(&err.to_le_bytes());
        out.extend_from_slice(&unique.to_le_bytes());
        out.extend(data);
        // ENOENT: the request was interrupted meanwhile; nothing to do.
        let _ = (&dev).write(&out);
    }
}

// ---------------------------------------------------------------------------
// Checks shared by the cases.

fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The lines ferry wrote on stderr.
fn lines(err: &str) -> Vec<&str> {
    err.lines().filter(|l| !l.trim().is_empty()).collect()
}

fn no_panic(err: &str) {
    assert!(
        !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
        "ferry panicked:\n{err}"
    );
}

fn says_eio(line: &str) -> bool {
    line.to_lowercase().contains("input/output error")
}

/// The one error line, which names `path` and says "input/output error".
fn one_eio_line<'a>(err: &'a str, path: &str) -> &'a str {
    let l = lines(err);
    assert_eq!(l.len(), 1, "one error line expected:\n{err}");
    assert!(
        l[0].starts_with("ferry: ") && l[0].contains(path) && says_eio(l[0]),
        "the line names {path} and the I/O error:\n{err}"
    );
    l[0]
}

const MIB: u64 = 1 << 20;

/// A source tree on a failing disk: `src/big.bin` (4 MiB) has 64 KiB of bad
/// sectors 1 MiB in (ferry has read and written the first MiB when the
/// error comes); `small.txt` and `sub/mid.bin` are healthy. The disk is
/// mounted read-only, afresh, so nothing of the bad file is cached.
struct BadTree {
    disk: FaultyDisk,
    src: PathBuf,
    bad: PathBuf,
}

fn bad_tree(test: &str) -> Option<BadTree> {
    let mut disk = FaultyDisk::new(test, 64 * MIB)?;
    disk.mkfs_and_mount();
    let src = disk.fs_mnt.join("src");
    fs::create_dir_all(src.join("sub")).unwrap();
    fs::write(src.join("big.bin"), bytes(1, 4 * MIB as usize)).unwrap();
    fs::write(src.join("small.txt"), b"healthy small\n").unwrap();
    // From 256 KiB ferry reads an uncached source with O_DIRECT.
    fs::write(src.join("sub/mid.bin"), bytes(2, 300_000)).unwrap();
    let bad = src.join("big.bin");
    let ranges = disk.device_ranges(&bad, MIB, MIB + (64 << 10));
    disk.umount();
    disk.set(|f| f.bad_reads = ranges);
    disk.mount("ro");
    Some(BadTree { disk, src, bad })
}

/// The destination's older copy of the tree, plus `stale.txt`, which the
/// source does not have.
fn old_copy(dst: &Path) {
    fs::create_dir_all(dst.join("sub")).unwrap();
    fs::write(dst.join("big.bin"), old_big()).unwrap();
    fs::write(dst.join("small.txt"), b"old small\n").unwrap();
    fs::write(dst.join("sub/mid.bin"), b"old mid").unwrap();
    fs::write(dst.join("stale.txt"), b"only in the destination").unwrap();
    for f in ["big.bin", "small.txt", "sub/mid.bin", "stale.txt"] {
        set_mtime(&dst.join(f), 1_000_000_000);
    }
}

fn old_big() -> Vec<u8> {
    bytes(9, 3 * MIB as usize)
}

/// The bad file fails with one line naming it, the rest are copied, exit 2
/// (partial), the old copy of the bad file stays byte for byte, no temp
/// file is left, whether the error comes while copying or while hashing
/// (`-c`); with `--delete --ignore-errors`, deletion goes ahead but never
/// takes the file that could not be read.
#[test]
fn source_read_error_in_a_tree_fails_that_file_only() {
    let Some(t) = bad_tree("source_read_error_in_a_tree_fails_that_file_only") else {
        return;
    };
    let bad = p(&t.bad);
    for extra in [None, Some("-c"), Some("--buffered-io")] {
        let d = tempfile::tempdir().unwrap();
        let dst = d.path().join("dst");
        old_copy(&dst);
        let mut args = vec!["sync"];
        args.extend(extra);
        let s = slash(&t.src);
        args.extend([s.as_str(), p(&dst)]);
        let before = t.disk.eio_counts().0;
        let out = ferry(&args);
        let err = stderr_of(&out);
        no_panic(&err);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: partial transfer:\n{err}"
        );
        one_eio_line(&err, bad);
        assert!(t.disk.eio_counts().0 > before, "the bad sectors were read");
        assert!(
            fs::read(dst.join("big.bin")).unwrap() == old_big(),
            "{args:?}: the old big.bin changed"
        );
        assert_eq!(fs::read(dst.join("small.txt")).unwrap(), b"healthy small\n");
        assert!(fs::read(dst.join("sub/mid.bin")).unwrap() == bytes(2, 300_000));
        assert!(dst.join("stale.txt").exists());
        assert!(temp_files(&dst).is_empty(), "{:?}", temp_files(&dst));
    }

    let d = tempfile::tempdir().unwrap();
    let dst = d.path().join("dst");
    old_copy(&dst);
    let s = slash(&t.src);
    let out = ferry(&["sync", "--delete", "--ignore-errors", &s, p(&dst)]);
    let err = stderr_of(&out);
    no_panic(&err);
    assert_eq!(out.status.code(), Some(2), "partial transfer:\n{err}");
    one_eio_line(&err, bad);
    assert!(!dst.join("stale.txt").exists(), "--ignore-errors deletes");
    assert!(
        fs::read(dst.join("big.bin")).unwrap() == old_big(),
        "the old big.bin changed"
    );
    assert_eq!(fs::read(dst.join("small.txt")).unwrap(), b"healthy small\n");
    assert!(temp_files(&dst).is_empty(), "{:?}", temp_files(&dst));
}

/// README, `--ignore-errors`: "with --delete, delete even after the sender
/// could not read part of the source (by default any such error turns
/// deletion off for the run: one line on stderr, delete_skipped in
/// --json, exit 2)". A file whose data cannot be read is such an error,
/// whether it comes while hashing (`-c`) or while copying.
#[test]
fn source_read_error_turns_delete_off() {
    let Some(t) = bad_tree("source_read_error_turns_delete_off") else {
        return;
    };
    let bad = p(&t.bad);
    for extra in [Some("-c"), None] {
        let d = tempfile::tempdir().unwrap();
        let dst = d.path().join("dst");
        old_copy(&dst);
        let mut args = vec!["sync", "--delete", "--json"];
        args.extend(extra);
        let s = slash(&t.src);
        args.extend([s.as_str(), p(&dst)]);
        let out = ferry(&args);
        let err = stderr_of(&out);
        no_panic(&err);
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("--json object");
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: partial transfer:\n{err}{j}"
        );
        assert!(
            dst.join("stale.txt").exists(),
            "{args:?}: --delete deleted after a read error of the source:\n{err}{j}"
        );
        assert!(
            fs::read(dst.join("big.bin")).unwrap() == old_big(),
            "{args:?}: the old big.bin changed"
        );
        assert!(temp_files(&dst).is_empty(), "{:?}", temp_files(&dst));
        assert_eq!(j["delete_skipped"], true, "{args:?}: {err}{j}");
        assert_eq!(j["files_deleted"], 0, "{args:?}: {j}");
        assert_eq!(j["files_failed"], 1, "{args:?}: {j}");
        assert_eq!(j["exit_code"], 2, "{args:?}: {j}");
        let l = lines(&err);
        assert_eq!(
            l.len(),
            2,
            "{args:?}: the read error and the skipped deletion:\n{err}"
        );
        assert_eq!(
            l.iter().filter(|l| l.contains(bad) && says_eio(l)).count(),
            1,
            "{args:?}: {err}"
        );
        assert_eq!(
            l.iter().filter(|l| l.contains("skipping deletion")).count(),
            1,
            "{args:?}: {err}"
        );
    }
}

/// One file on a failing disk as the whole source: one line naming it, a
/// non-zero documented exit, the old copy byte for byte, no temp file.
#[test]
fn source_read_error_on_a_single_file_keeps_the_old_copy() {
    let Some(mut disk) = FaultyDisk::new(
        "source_read_error_on_a_single_file_keeps_the_old_copy",
        64 * MIB,
    ) else {
        return;
    };
    disk.mkfs_and_mount();
    let src = disk.fs_mnt.join("big.bin");
    fs::write(&src, bytes(1, 4 * MIB as usize)).unwrap();
    let bad = disk.device_ranges(&src, 2 * MIB, 2 * MIB + 4096);
    disk.umount();
    disk.set(|f| f.bad_reads = bad);
    disk.mount("ro");

    let t = tempfile::tempdir().unwrap();
    let dst = t.path().join("big.bin");
    let old = bytes(9, 3 * MIB as usize);
    fs::write(&dst, &old).unwrap();
    set_mtime(&dst, 1_000_000_000);
    for extra in [None, Some("--buffered-io"), Some("--inplace")] {
        let mut args = vec!["sync"];
        args.extend(extra);
        args.extend([p(&src), p(&dst)]);
        let before = disk.eio_counts().0;
        let out = ferry(&args);
        let err = stderr_of(&out);
        no_panic(&err);
        assert_eq!(out.status.code(), Some(2), "{args:?}:\n{err}");
        one_eio_line(&err, p(&src));
        assert!(disk.eio_counts().0 > before, "the bad sector was read");
        assert!(
            temp_files(t.path()).is_empty(),
            "{:?}",
            temp_files(t.path())
        );
        if extra == Some("--inplace") {
            // In place there is no old copy to keep, but what is left
            // must not pass for the source's copy: the next run (size +
            // mtime) would skip it.
            let (s, d) = (fs::metadata(&src).unwrap(), fs::metadata(&dst).unwrap());
            assert!(
                (s.len(), s.mtime(), s.mtime_nsec()) != (d.len(), d.mtime(), d.mtime_nsec()),
                "{args:?}: a half-written file looks up to date"
            );
        } else {
            assert!(
                fs::read(&dst).unwrap() == old,
                "{args:?}: the old copy changed"
            );
        }
    }
}

/// A block device that fails partway as the source of an image copy: one
/// line naming the device, a non-zero documented exit, an existing image
/// unchanged, no image made where there was none, no temp file.
#[test]
fn failing_block_device_source_leaves_the_image_alone() {
    let Some(disk) = FaultyDisk::new(
        "failing_block_device_source_leaves_the_image_alone",
        16 * MIB,
    ) else {
        return;
    };
    let data = bytes(3, 16 * MIB as usize);
    fs::write(&disk.store, &data).unwrap();
    disk.set(|f| f.bad_reads = vec![(6 * MIB, 6 * MIB + (64 << 10))]);

    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("dst.img");
    let old = bytes(4, 16 * MIB as usize);
    fs::write(&img, &old).unwrap();
    set_mtime(&img, 1_000_000_000);
    let fresh = t.path().join("fresh.img");
    for dst in [&img, &fresh] {
        for extra in [None, Some("--buffered-io")] {
            let mut args = vec!["sync"];
            args.extend(extra);
            args.extend([disk.dev.as_str(), p(dst)]);
            let before = disk.eio_counts().0;
            let out = ferry(&args);
            let err = stderr_of(&out);
            no_panic(&err);
            assert_eq!(out.status.code(), Some(2), "{args:?}:\n{err}");
            one_eio_line(&err, &disk.dev);
            assert!(disk.eio_counts().0 > before, "the bad sectors were read");
            assert!(fs::read(&img).unwrap() == old, "{args:?}: dst.img changed");
            assert!(!fresh.exists(), "{args:?}: a half image was left");
            assert!(
                temp_files(t.path()).is_empty(),
                "{:?}",
                temp_files(t.path())
            );
        }
    }
}

/// The destination's disk stops taking writes (the filesystem is still
/// mounted): ferry says so in one line, exits with a documented non-zero
/// code, and neither claims success nor puts anything in place of the old
/// files, which are intact on the disk afterwards.
#[test]
fn failing_destination_disk_is_an_error_and_keeps_the_old_files() {
    let Some(mut disk) = FaultyDisk::new(
        "failing_destination_disk_is_an_error_and_keeps_the_old_files",
        64 * MIB,
    ) else {
        return;
    };
    disk.mkfs_and_mount();
    let dst = disk.fs_mnt.join("dst");
    fs::create_dir(&dst).unwrap();
    let keep = bytes(5, MIB as usize);
    fs::write(dst.join("keep.bin"), &keep).unwrap();
    fs::write(dst.join("f.txt"), b"old f\n").unwrap();
    set_mtime(&dst.join("f.txt"), 1_000_000_000);
    // All of it on the disk, nothing left to write back. No periodic
    // journal commit during the test (commit=300): one that failed would
    // abort the journal at a moment of its own choosing, and the fs would
    // turn read-only halfway through a run.
    disk.umount();
    disk.mount("rw,commit=300");
    disk.set(|f| f.writes_fail = true);

    let t = tempfile::tempdir().unwrap();
    fs::write(t.path().join("new.bin"), bytes(6, 2 * MIB as usize)).unwrap();
    fs::write(t.path().join("f.txt"), b"new f, longer than the old one\n").unwrap();
    // A new file of 2 MiB (written with O_DIRECT: the write fails), the
    // same through the page cache (the error comes at fdatasync), and a
    // small changed file (buffered too). Exit 2 (this entry failed) or 3
    // (unwritable destination): the README's table fits either.
    for (name, extra) in [
        ("new.bin", None),
        ("new.bin", Some("--buffered-io")),
        ("f.txt", None),
    ] {
        let mut args = vec!["sync", "--json"];
        args.extend(extra);
        let (s, d) = (t.path().join(name), dst.join(name));
        args.extend([p(&s), p(&d)]);
        let out = ferry(&args);
        let err = stderr_of(&out);
        no_panic(&err);
        let code = out.status.code();
        assert!(
            matches!(code, Some(2 | 3)),
            "{args:?}: exit {code:?}:\n{err}"
        );
        let l = lines(&err);
        assert_eq!(l.len(), 1, "{args:?}: one error line:\n{err}");
        assert!(
            l[0].contains(p(&dst))
                && (says_eio(l[0]) || l[0].to_lowercase().contains("read-only file system")),
            "{args:?}: the line names the destination and the I/O error:\n{err}"
        );
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("--json object");
        assert_eq!(j["exit_code"].as_i64(), code.map(i64::from), "{j}");
        assert_eq!(
            j["files_transferred"], 0,
            "{args:?}: claims a transfer: {j}"
        );
        assert!(
            !dst.join("new.bin").exists(),
            "{args:?}: a failed new.bin was put in place"
        );
        assert_eq!(fs::read(dst.join("f.txt")).unwrap(), b"old f\n", "{args:?}");
        assert!(
            temp_files(&dst).is_empty(),
            "{args:?}: {:?}",
            temp_files(&dst)
        );
    }
    assert!(disk.eio_counts().1 > 0, "the writes failed");
    // What is on the disk itself: the old files, nothing else.
    disk.set(|f| f.writes_fail = false);
    disk.umount();
    disk.mount("ro");
    assert!(fs::read(dst.join("keep.bin")).unwrap() == keep);
    assert_eq!(fs::read(dst.join("f.txt")).unwrap(), b"old f\n");
    let mut names: Vec<_> = fs::read_dir(&dst)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["f.txt", "keep.bin"]);
}

/// The file's bytes as they are on the disk now: read with `O_DIRECT`,
/// past any page cache, so every read reaches the (lying) disk.
fn read_from_disk(file: &Path) -> Vec<u8> {
    let out = run(Command::new("dd")
        .arg(format!("if={}", file.display()))
        .args(["iflag=direct", "bs=1M", "status=none"]));
    assert!(
        out.status.success(),
        "dd {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// README, `--verify`: "read it back from the disk past the page cache and
/// check it against the sender's segment digests again; a file that reads
/// back different keeps its old version and the run exits 2".
///
/// The destination's disk rots: every write and flush succeeds, but one
/// 4 KiB block of the new file (in its second 8 MiB segment, so checking
/// only the first would not do) reads back with a bit flipped. With
/// `--verify` (`O_DIRECT` writes and `--buffered-io`), that file fails in
/// one line naming it and the range that differs, the old copy stays, no
/// temp file is left, the healthy file beside it is copied, exit 2; the
/// disk was really read (the flipped bit was served). The control: the
/// same runs without `--verify` believe the disk, exit 0, and never read
/// the file back, although it reads back wrong.
#[test]
fn verify_catches_a_disk_that_returns_other_bytes_than_were_written() {
    let Some(mut disk) = FaultyDisk::new(
        "verify_catches_a_disk_that_returns_other_bytes_than_were_written",
        64 * MIB,
    ) else {
        return;
    };
    disk.mkfs_and_mount();
    let size = 9 * MIB as usize + 4321;
    let data = bytes(7, size);
    // File offset of the block that rots, and of its bad bit.
    let rotten = 8 * MIB + (512 << 10);
    let bad_byte = rotten + ROT_BYTE;
    let block = &data[rotten as usize..rotten as usize + 4096];
    let s = tempfile::tempdir().unwrap();
    let src = s.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("big.bin"), &data).unwrap();
    fs::write(src.join("small.txt"), b"new small\n").unwrap();

    let old = bytes(9, 3 * MIB as usize);
    let cases = [
        (true, None),
        (true, Some("--buffered-io")),
        (false, None),
        (false, Some("--buffered-io")),
    ];
    let dsts: Vec<PathBuf> = (0..cases.len())
        .map(|i| disk.fs_mnt.join(format!("dst{i}")))
        .collect();
    for dst in &dsts {
        fs::create_dir(dst).unwrap();
        fs::write(dst.join("big.bin"), &old).unwrap();
        fs::write(dst.join("small.txt"), b"old small\n").unwrap();
        set_mtime(&dst.join("big.bin"), 1_000_000_000);
        set_mtime(&dst.join("small.txt"), 1_000_000_000);
    }
    // All of it on the disk, nothing cached or left to write back.
    disk.umount();
    disk.mount("rw");

    for ((verify, extra), dst) in cases.into_iter().zip(&dsts) {
        let mut args = vec!["sync"];
        args.extend(verify.then_some("--verify"));
        args.extend(extra);
        let s = slash(&src);
        args.extend([s.as_str(), p(dst)]);
        disk.set(|f| f.rot = Some(Rot::new(block)));
        let out = ferry(&args);
        let err = stderr_of(&out);
        no_panic(&err);
        let (places, flipped) = disk.rot_counts();
        assert!(places >= 1, "{args:?}: the new data never reached the disk");
        let big = dst.join("big.bin");
        if verify {
            assert_eq!(out.status.code(), Some(2), "{args:?}:\n{err}");
            assert!(
                flipped >= 1,
                "{args:?}: nothing was read back from the disk"
            );
            let l = lines(&err);
            assert_eq!(l.len(), 1, "{args:?}: one error line expected:\n{err}");
            assert!(
                l[0].starts_with("ferry: ") && l[0].contains("--verify") && l[0].contains(p(&big)),
                "{args:?}: the line names --verify and {}:\n{err}",
                big.display()
            );
            // "bytes A..B differ from the source": the range holds the bad bit.
            let range = l[0]
                .split("--verify: read back from the disk, bytes ")
                .nth(1)
                .and_then(|r| r.split_once(" differ from the source"))
                .and_then(|(r, _)| r.split_once(".."))
                .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)))
                .unwrap_or_else(|| panic!("{args:?}: no range in:\n{err}"));
            assert!(
                range.0 <= bad_byte && bad_byte < range.1 && range.1 <= size as u64,
                "{args:?}: byte {bad_byte} is bad, not in {range:?}:\n{err}"
            );
            assert!(
                fs::read(&big).unwrap() == old,
                "{args:?}: the old copy changed"
            );
        } else {
            assert_eq!(out.status.code(), Some(0), "{args:?}:\n{err}");
            assert!(
                !err.contains("--verify"),
                "{args:?}: --verify is off:\n{err}"
            );
            assert_eq!(flipped, 0, "{args:?}: read back without --verify");
            // The disk lies, and ferry believed it: what it put in place
            // reads back with one bit flipped.
            let mut want = data.clone();
            want[bad_byte as usize] ^= ROT_MASK;
            assert!(
                read_from_disk(&big) == want,
                "{args:?}: the disk does not lie as it should"
            );
            assert!(disk.rot_counts().1 >= 1);
        }
        assert_eq!(fs::read(dst.join("small.txt")).unwrap(), b"new small\n");
        assert!(
            temp_files(dst).is_empty(),
            "{args:?}: {:?}",
            temp_files(dst)
        );
        disk.set(|f| f.rot = None);
    }

    // What is on the disk itself, read afresh: the old copy where --verify
    // failed, the (correctly stored) new one where ferry believed the disk.
    disk.umount();
    disk.mount("ro");
    for ((verify, _), dst) in cases.into_iter().zip(&dsts) {
        let big = fs::read(dst.join("big.bin")).unwrap();
        if verify {
            assert!(big == old, "{}: the old copy changed", dst.display());
        } else {
            assert!(big == data, "{}", dst.display());
        }
        assert_eq!(fs::read(dst.join("small.txt")).unwrap(), b"new small\n");
        let mut names: Vec<_> = fs::read_dir(dst)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["big.bin", "small.txt"], "{}", dst.display());
    }
}
