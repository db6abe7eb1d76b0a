//! Writing new files around the page cache.
//!
//! A file received into a temp file is written once, renamed, and not read
//! again by ferry. Pushing it through the page cache costs a fresh page per
//! 4 KiB, and on virtual machines whose free memory goes back to the host
//! that is the slowest step of a transfer: measured on the 2-core CI VM,
//! 1 GiB took 3.6-4.5 s of system time buffered against 0.6 s with
//! `O_DIRECT`, which also leaves the kernel nothing to flush at `rename`.
//!
//! `O_DIRECT` needs 4 KiB-aligned memory, offsets and lengths, and a
//! segment's ops arrive as pieces of any size. So the writer assembles each
//! segment of such a file in a [`SegBuf`] (aligned memory reused from a
//! [`Pool`]) and writes it when the segment is complete: every run of data
//! rounded out to 4 KiB (the rounding covers only bytes the sender declared
//! zero, which a fresh temp file holds anyway), and the file's last partial
//! 4 KiB through the ordinary descriptor. Zero ranges are never written,
//! so holes stay holes.
//!
//! Filesystems without `O_DIRECT` (tmpfs, some FUSE) refuse it at `open`
//! or at the first write; the file is then written through the page cache
//! as before.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::endpoint::Source;

/// Alignment of memory, offsets and lengths for `O_DIRECT`.
pub const ALIGN: usize = 4096;

/// Files smaller than this go through the page cache: their few pages cost
/// little, and a direct write waits for the device.
pub const MIN_SIZE: u64 = 256 << 10;

/// The file `f` opened a second time, with `O_DIRECT`, through its
/// descriptor in `/proc` (the same inode, whatever its name is now).
/// `None` where the filesystem does not support direct I/O.
fn reopen_direct(f: &File, write: bool) -> Option<File> {
    use std::os::fd::AsRawFd;
    OpenOptions::new()
        .read(!write)
        .write(write)
        .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
        .open(format!("/proc/self/fd/{}", f.as_raw_fd()))
        .ok()
}

/// A temp file this process just created, opened again for direct
/// writes; `None` where the filesystem does not support them.
pub fn open(f: &File) -> Option<File> {
    reopen_direct(f, true)
}

/// Whether a write error means "this file cannot be written directly"
/// (rather than a real I/O error such as a full disk).
pub fn unsupported(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EINVAL) || e.raw_os_error() == Some(libc::EOPNOTSUPP)
}

/// Aligned buffers kept for reuse by one writer thread, so assembling a
/// segment touches memory that is already mapped.
#[derive(Default)]
pub struct Pool {
    free: Vec<Vec<u8>>,
}

/// Free buffers a pool keeps; more are dropped.
const POOL_KEEP: usize = 8;

impl Pool {
    /// A buffer for a segment of `len` bytes.
    pub fn take(&mut self, len: usize) -> SegBuf {
        let mut mem = self.free.pop().unwrap_or_default();
        let want = len.next_multiple_of(ALIGN) + ALIGN;
        if mem.len() < want {
            mem.resize(want, 0);
        }
        let start = mem.as_ptr().align_offset(ALIGN).min(ALIGN);
        SegBuf {
            mem,
            start,
            len,
            runs: Vec::new(),
        }
    }

    /// Return a buffer once its segment is written.
    pub fn give(&mut self, b: SegBuf) {
        if self.free.len() < POOL_KEEP {
            self.free.push(b.mem);
        }
    }
}

/// One segment being assembled: its bytes, and which of them hold data.
pub struct SegBuf {
    mem: Vec<u8>,
    /// Offset of the first aligned byte in `mem`.
    start: usize,
    /// Segment length.
    len: usize,
    /// Data runs `[from, to)` relative to the segment start, in order.
    runs: Vec<(usize, usize)>,
}

impl SegBuf {
    /// The `n` bytes at segment offset `rel`, to be filled by the caller,
    /// which marks them as data. `None` if they fall outside the segment.
    pub fn data_mut(&mut self, rel: usize, n: usize) -> Option<&mut [u8]> {
        let end = rel.checked_add(n).filter(|&e| e <= self.len)?;
        match self.runs.last_mut() {
            Some(last) if last.1 == rel => last.1 = end,
            _ => self.runs.push((rel, end)),
        }
        Some(&mut self.mem[self.start + rel..self.start + end])
    }

    /// Write the segment's data runs, the segment starting at file offset
    /// `seg_start` of a file of `size` bytes: aligned runs through
    /// `direct`, the file's unaligned tail through `buffered`. Returns the
    /// bytes of data written.
    pub fn flush(
        &mut self,
        direct: &File,
        buffered: &File,
        seg_start: u64,
        size: u64,
    ) -> io::Result<u64> {
        debug_assert!(seg_start.is_multiple_of(ALIGN as u64));
        // The last whole 4 KiB of the file, relative to the segment: bytes
        // from there on go through the page cache.
        let seg_end = (size - seg_start).min(self.len as u64) as usize;
        let direct_end = (seg_end / ALIGN) * ALIGN;
        let mut written = 0u64;
        let mut i = 0;
        while i < self.runs.len() {
            // Round the run out to 4 KiB and swallow the runs the rounding
            // reaches, so no block is written twice.
            let from = self.runs[i].0 / ALIGN * ALIGN;
            let mut to = self.runs[i].1.next_multiple_of(ALIGN).min(self.len);
            let mut j = i;
            let first = self.runs[i].0;
            while j + 1 < self.runs.len() && self.runs[j + 1].0 < to {
                // Bytes between two runs are declared zeros.
                let (gap_from, gap_to) = (self.runs[j].1, self.runs[j + 1].0);
                self.mem[self.start + gap_from..self.start + gap_to].fill(0);
                j += 1;
                to = self.runs[j].1.next_multiple_of(ALIGN).min(self.len);
            }
            let last = self.runs[j].1;
            self.mem[self.start + from..self.start + first].fill(0);
            self.mem[self.start + last..self.start + to.max(last)].fill(0);
            for r in &self.runs[i..=j] {
                written += (r.1 - r.0) as u64;
            }
            let d_to = to.min(direct_end);
            if from < d_to {
                direct.write_all_at(
                    &self.mem[self.start + from..self.start + d_to],
                    seg_start + from as u64,
                )?;
            }
            let t_from = from.max(direct_end);
            let t_to = to.min(seg_end);
            if t_from < t_to {
                buffered.write_all_at(
                    &self.mem[self.start + t_from..self.start + t_to],
                    seg_start + t_from as u64,
                )?;
            }
            i = j + 1;
        }
        self.runs.clear();
        Ok(written)
    }
}

/// A file read around the page cache where that pays: large, and not
/// already cached (reading cached data directly would go to the disk
/// again). Reads that are aligned go straight into the caller's memory;
/// others go through an aligned per-thread bounce buffer; small ones and
/// any the filesystem refuses go through the page cache.
pub struct Reader {
    file: File,
    direct: Option<File>,
    direct_ok: AtomicBool,
    /// Known to hold no holes (see [`Reader::listed`]): no extent query.
    dense: bool,
}

/// The first `len` bytes of `mem` from a 4 KiB boundary (growing `mem`),
/// for reads that [`Reader`] can serve without a bounce buffer.
pub fn aligned(mem: &mut Vec<u8>, len: usize) -> &mut [u8] {
    if mem.len() < len + ALIGN {
        mem.resize(len + ALIGN, 0);
    }
    let start = mem.as_ptr().align_offset(ALIGN).min(ALIGN);
    &mut mem[start..start + len]
}

/// Largest file [`dense`] takes at its block count's word.
pub const DENSE_MAX: u64 = 1 << 20;

/// Whether a regular file of `size` bytes with `blocks` 512-byte blocks
/// allocated can be read without asking where its data is: small, and
/// every byte backed. A large file so backed may still hold preallocated
/// (unwritten) extents that read as holes, which are worth finding; a
/// small one costs at most [`DENSE_MAX`] bytes read as zeros.
pub fn dense(blocks: u64, size: u64) -> bool {
    size <= DENSE_MAX && blocks.saturating_mul(512) >= size
}

/// Reads smaller than this go through the page cache.
const READ_MIN: usize = 64 << 10;
/// Largest bounce-buffer read.
const BOUNCE: usize = 8 << 20;

impl Reader {
    /// Wrap `file`, opened from `path`, adding a direct descriptor when
    /// `on` and the file is large and mostly not in the page cache.
    pub fn new(file: File, on: bool) -> Reader {
        let size = match on {
            true => file
                .metadata()
                .map(|m| if m.is_file() { m.len() } else { 0 })
                .unwrap_or(0),
            false => 0,
        };
        Reader::listed(file, on, size, false)
    }

    /// [`Reader::new`] for a file whose size the walk has just read (no
    /// second `stat`). `dense` says it is small and has every block
    /// allocated (see [`dense`]): its data is asked for without a
    /// `SEEK_DATA`/`SEEK_HOLE` pair. Should it have gained holes since,
    /// they read as zeros, which are found and sent as zeros all the same.
    pub fn listed(file: File, on: bool, size: u64, dense: bool) -> Reader {
        let direct = on && size >= MIN_SIZE && !mostly_cached(&file, size);
        Reader::build(file, direct, dense)
    }

    fn build(file: File, direct: bool, dense: bool) -> Reader {
        let direct = direct.then(|| reopen_direct(&file, false)).flatten();
        Reader {
            direct_ok: AtomicBool::new(direct.is_some()),
            direct,
            file,
            dense,
        }
    }

    /// Read exactly `buf.len()` bytes at `off`.
    pub fn read_exact_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        if let (Some(d), true) = (&self.direct, buf.len() >= READ_MIN) {
            if self.direct_ok.load(Ordering::Relaxed) {
                let aligned = (buf.as_ptr() as usize).is_multiple_of(ALIGN)
                    && off.is_multiple_of(ALIGN as u64)
                    && buf.len().is_multiple_of(ALIGN);
                let res = if aligned {
                    direct_read(d, buf, off)
                } else {
                    bounce_read(d, buf, off)
                };
                match res {
                    Err(e) if unsupported(&e) => self.direct_ok.store(false, Ordering::Relaxed),
                    r => return r,
                }
            }
        }
        FileExt::read_exact_at(&self.file, buf, off)
    }
}

/// Fill `buf` from `off` with direct reads (all aligned). A read past the
/// end of the file is `UnexpectedEof`, as with `read_exact_at`.
fn direct_read(d: &File, buf: &mut [u8], off: u64) -> io::Result<()> {
    let need = buf.len();
    let got = direct_fill(d, buf, off)?;
    if got < need {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "file shorter than expected",
        ));
    }
    Ok(())
}

/// Direct reads into aligned `buf` until it is full or the file ends
/// (a short, unaligned read). Returns the bytes read.
fn direct_fill(d: &File, buf: &mut [u8], off: u64) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match d.read_at(&mut buf[got..], off + got as u64) {
            Ok(0) => break,
            Ok(n) => {
                got += n;
                if !got.is_multiple_of(ALIGN) {
                    break; // the end of the file
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Unaligned read: direct reads of the enclosing aligned range into a
/// per-thread aligned buffer, copied out.
fn bounce_read(d: &File, buf: &mut [u8], off: u64) -> io::Result<()> {
    thread_local! {
        static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    BUF.with(|b| {
        let mut mem = b.borrow_mut();
        let mem = aligned(&mut mem, BOUNCE + ALIGN);
        let mut done = 0usize;
        while done < buf.len() {
            let pos = off + done as u64;
            let a = pos / ALIGN as u64 * ALIGN as u64;
            let skip = (pos - a) as usize;
            let want = (buf.len() - done).min(BOUNCE - skip);
            let span = (skip + want).next_multiple_of(ALIGN);
            let got = direct_fill(d, &mut mem[..span], a)?;
            if got < skip + want {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "file shorter than expected",
                ));
            }
            buf[done..done + want].copy_from_slice(&mem[skip..skip + want]);
            done += want;
        }
        Ok(())
    })
}

/// Whether at least half of the file's pages are in the page cache
/// (`cachestat`, Linux 6.5; older kernels answer no).
fn mostly_cached(file: &File, size: u64) -> bool {
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    const SYS_CACHESTAT: libc::c_long = 451;
    let range = Range { off: 0, len: 0 };
    let mut st = Stat::default();
    use std::os::fd::AsRawFd;
    // SAFETY: cachestat(2) reads `range` and writes one `struct cachestat`
    // (five u64, as `Stat`) to `st`; both outlive the call, and the fd is
    // open for the duration of the borrow of `file`.
    let rc = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &range as *const Range,
            &mut st as *mut Stat,
            0u32,
        )
    };
    rc == 0 && st.nr_cache.saturating_mul(4096) >= size / 2
}

impl ferry_delta::Basis for Reader {
    fn file(&self) -> &File {
        &self.file
    }
    fn read_exact_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        Reader::read_exact_at(self, buf, off)
    }
}

impl Source for Reader {
    fn next_data(&self, pos: u64, end: u64) -> io::Result<Option<(u64, u64)>> {
        match self.dense {
            true => Ok((pos < end).then_some((pos, end))),
            false => crate::fsutil::next_data(&self.file, pos, end),
        }
    }
    fn read_exact_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        Reader::read_exact_at(self, buf, off)
    }
    fn stamp(&self) -> io::Result<Option<(u64, (i64, u32))>> {
        Source::stamp(&self.file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::path::Path;

    fn read_all(p: &Path) -> Vec<u8> {
        let mut v = Vec::new();
        File::open(p)
            .and_then(|mut f| f.read_to_end(&mut v))
            .expect("read back");
        v
    }

    /// Assemble a file of `size` bytes from `(offset, bytes)` pieces the
    /// way the writer does, one segment of `seg` bytes at a time.
    fn assemble(
        dir: &Path,
        pool: &mut Pool,
        size: u64,
        seg: usize,
        pieces: &[(u64, Vec<u8>)],
    ) -> Vec<u8> {
        let p = dir.join("f");
        let buffered = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .expect("create");
        buffered.set_len(size).expect("size");
        // Where the filesystem refuses O_DIRECT the buffered file stands in:
        // the assembly logic is the same.
        let direct = open(&buffered).unwrap_or_else(|| buffered.try_clone().expect("clone"));
        let mut s0 = 0u64;
        while s0 < size {
            let len = (size - s0).min(seg as u64) as usize;
            let mut b = pool.take(len);
            // Ops never cross a segment: clip each piece to this one.
            for (off, bytes) in pieces {
                let (from, to) = (
                    (*off).max(s0),
                    (off + bytes.len() as u64).min(s0 + len as u64),
                );
                if from < to {
                    let part = &bytes[(from - off) as usize..(to - off) as usize];
                    b.data_mut((from - s0) as usize, part.len())
                        .expect("inside")
                        .copy_from_slice(part);
                }
            }
            b.flush(&direct, &buffered, s0, size).expect("flush");
            pool.give(b);
            s0 += len as u64;
        }
        read_all(&p)
    }

    #[test]
    fn pieces_of_any_size_land_in_place_and_gaps_read_as_zeros() {
        let dir = tempfile::tempdir().expect("tempdir");
        let size = 3 * 65536 + 1234;
        // Unaligned pieces, gaps (declared zeros) between and around them,
        // a piece reaching the unaligned end of the file.
        let pieces: Vec<(u64, Vec<u8>)> = vec![
            (10, vec![1; 5000]),
            (5010, vec![2; 3]),
            (9000, vec![3; 70000]),
            (131072, vec![4; 4096]),
            (size - 2000, vec![5; 2000]),
        ];
        // Reuse dirty buffers: the pool hands back memory full of old bytes.
        let mut want = vec![0u8; size as usize];
        for (o, b) in &pieces {
            want[*o as usize..*o as usize + b.len()].copy_from_slice(b);
        }
        for seg in [65536usize, 1 << 20] {
            let mut pool = Pool::default();
            assert_eq!(
                assemble(dir.path(), &mut pool, size, seg, &pieces),
                want,
                "segment {seg}"
            );
        }
        let mut pool = Pool::default();
        let _ = assemble(
            dir.path(),
            &mut pool,
            size,
            65536,
            &[(0, vec![0xEE; size as usize])],
        );
        assert_eq!(
            assemble(dir.path(), &mut pool, size, 65536, &pieces),
            want,
            "after a dirty pool"
        );
    }

    #[test]
    fn reads_of_any_alignment_match_the_file_and_end_at_its_end() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("r");
        let size = (1 << 20) + 4321;
        let data: Vec<u8> = (0..size).map(|i| (i * 7 + i / 4096) as u8).collect();
        std::fs::write(&p, &data).expect("write");
        let r = Reader::build(File::open(&p).expect("open"), true, false);
        let mut pool = Pool::default();
        let mut aligned = pool.take(1 << 19);
        let slot = aligned.data_mut(0, 1 << 19).expect("slot");
        r.read_exact_at(slot, 1 << 19).expect("aligned read");
        assert_eq!(&slot[..], &data[1 << 19..1 << 20]);
        for (off, len) in [
            (1usize, 70000usize),
            (4095, 65536 * 3 + 5),
            (size - 70000, 70000),
            (0, size),
        ] {
            let mut buf = vec![0u8; len];
            r.read_exact_at(&mut buf, off as u64).expect("read");
            assert_eq!(buf, &data[off..off + len], "{off}+{len}");
        }
        let mut past = vec![0u8; 70000];
        let e = r
            .read_exact_at(&mut past, (size - 1000) as u64)
            .expect_err("past the end");
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn pieces_outside_the_segment_are_refused() {
        let mut pool = Pool::default();
        let mut b = pool.take(8192);
        assert!(b.data_mut(8000, 193).is_none());
        assert!(b.data_mut(usize::MAX, 2).is_none());
        assert!(b.data_mut(8000, 192).is_some());
    }

    #[test]
    fn dense_means_small_and_fully_backed() {
        assert!(dense(0, 0));
        assert!(dense(8, 4096));
        assert!(dense(16, 4097));
        assert!(!dense(8, 4097), "a block short");
        assert!(!dense(0, 100), "no blocks: inline data or a hole");
        assert!(dense(DENSE_MAX / 512, DENSE_MAX));
        assert!(!dense(DENSE_MAX / 512 + 1, DENSE_MAX + 1), "past the cap");
        assert!(!dense(u64::MAX, 1 << 40), "fully allocated but large");
    }

    /// A file listed dense and holed since reads whole: its hole comes
    /// back as zeros (which the scan then finds and sends as zeros), where
    /// a reader that asks finds only the data.
    #[test]
    fn a_dense_reader_asks_nothing_and_reads_holes_as_zeros() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("f");
        let f = File::create(&p).expect("create");
        f.set_len(256 << 10).expect("size");
        f.write_all_at(&[7u8; 4096], 0).expect("write");
        f.sync_all().expect("sync");
        let size = 256 << 10;
        let asks = Reader::listed(File::open(&p).expect("open"), false, size, false);
        let data = Source::next_data(&asks, 0, size).expect("next_data");
        // A filesystem without SEEK_DATA reports it all as data.
        assert!(
            matches!(data, Some((0, e)) if e == 4096 || e == size),
            "{data:?}"
        );
        let dense = Reader::listed(File::open(&p).expect("open"), false, size, true);
        assert_eq!(
            Source::next_data(&dense, 0, size).expect("next"),
            Some((0, size))
        );
        assert_eq!(Source::next_data(&dense, size, size).expect("next"), None);
        let mut buf = vec![1u8; 8192];
        Source::read_exact_at(&dense, &mut buf, 0).expect("read");
        assert!(buf[..4096].iter().all(|&b| b == 7) && buf[4096..].iter().all(|&b| b == 0));
    }
}
