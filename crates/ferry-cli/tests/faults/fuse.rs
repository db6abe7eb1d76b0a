//! A minimal FUSE server, std only: one regular file, `disk`, in the root
//! directory, answered from a backing file, or with EIO (or with a bit
//! flipped) as [`Faults`] says. Struct layouts from <linux/fuse.h>
//! (protocol 7.31).

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

/// What the disk does wrong right now.
#[derive(Default)]
pub struct Faults {
    /// Byte ranges `[start, end)` of the device whose reads fail with EIO.
    pub bad_reads: Vec<(u64, u64)>,
    /// Every write (and flush) fails with EIO.
    pub writes_fail: bool,
    /// Requests answered with EIO so far.
    pub eio_reads: u64,
    pub eio_writes: u64,
    /// Data that reads back other than it was written.
    pub rot: Option<Rot>,
}

/// Bit rot: wherever on the device the 4 KiB `block` of data is written
/// (at a 4 KiB-aligned offset, as ext4 places file data) while this is
/// set, every read of it that reaches the disk gets byte `ROT_BYTE` of it
/// with bit `ROT_MASK` flipped; writes and flushes all succeed. The
/// block is chosen by its contents, pseudo-random bytes of one file, so
/// nothing but that file's data ever rots: no ext4 metadata or journal
/// block looks like it, and the test need not know in advance where ext4
/// will put the file.
pub struct Rot {
    block: Vec<u8>,
    /// Device offsets that hold `block` now, written since the lie began.
    pub at: Vec<u64>,
    /// Reads answered with the bit flipped.
    pub flipped_reads: u64,
}

pub const ROT_BYTE: u64 = 1234;
pub const ROT_MASK: u8 = 0x10;

impl Rot {
    pub fn new(block: &[u8]) -> Rot {
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

pub const MAX_WRITE: usize = 1 << 20;

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
pub fn lock(faults: &Mutex<Faults>) -> std::sync::MutexGuard<'_, Faults> {
    faults.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn serve(dev: File, store: File, size: u64, faults: Arc<Mutex<Faults>>) {
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
