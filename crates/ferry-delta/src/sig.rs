//! Block signatures of a basis file.

use std::fs::File;
use std::io;

use ferry_link::layout::{block_hash, zero_block_hash};

use crate::weak::{weak_hash, zero_weak};

/// The block signature of a basis: one weak and one strong hash per grid
/// block (the last block may be partial).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Signature {
    /// Grid block size: `ferry_link::layout::grid_block(source_size)`.
    pub block_size: u64,
    /// Size of the basis in bytes.
    pub basis_size: u64,
    /// Rolling weak hash ([`crate::weak_hash`]) of each block.
    pub weak: Vec<u64>,
    /// First 16 bytes of `ferry_link::layout::block_hash` of each block.
    pub strong: Vec<[u8; 16]>,
}

/// Why a signature part from a peer was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PartError {
    #[error("signature block size is 0")]
    BlockSize,
    #[error("signature part out of order: expected block {expected}, got {got}")]
    OutOfOrder { expected: u64, got: u64 },
    #[error("signature part has unequal weak and strong counts")]
    Lengths,
    #[error("signature has more blocks than its basis ({total})")]
    TooMany { total: u64 },
}

/// First 16 bytes of a 32-byte block hash.
#[inline]
pub fn short(h: &[u8; 32]) -> [u8; 16] {
    let mut s = [0u8; 16];
    s.copy_from_slice(&h[..16]);
    s
}

impl Signature {
    /// Number of blocks a basis of `basis_size` bytes has at `block_size`
    /// (0 when `block_size` is 0).
    pub fn block_count(basis_size: u64, block_size: u64) -> u64 {
        basis_size
            .checked_div(block_size)
            .map_or(0, |q| q + u64::from(!basis_size.is_multiple_of(block_size)))
    }

    /// True when the vectors have exactly one entry per block of the basis
    /// and the block size is not zero. A signature from a peer should be
    /// checked with this before use; the matcher tolerates bad ones anyway.
    pub fn is_consistent(&self) -> bool {
        let n = Self::block_count(self.basis_size, self.block_size);
        self.block_size > 0 && self.weak.len() as u64 == n && self.strong.len() as u64 == n
    }

    /// Length of block `i` of the basis (0 past the end).
    pub fn block_len(&self, i: u64) -> u64 {
        let start = i.saturating_mul(self.block_size);
        self.basis_size.saturating_sub(start).min(self.block_size)
    }

    /// An empty signature to be filled by [`Signature::extend_part`] from
    /// the parts a peer sends (`Message::Signature`).
    pub fn receiving(block_size: u64, basis_size: u64) -> Self {
        Self {
            block_size,
            basis_size,
            weak: Vec::new(),
            strong: Vec::new(),
        }
    }

    /// Appends one part received from a peer: `weak[i]`/`strong[i]`
    /// describe block `first_block + i`. Parts must come in order, and the
    /// whole may not exceed the basis's block count, so a peer cannot make
    /// the receiver of a signature allocate more than its claimed basis
    /// implies (24 bytes per block; the caller decides how large a claimed
    /// basis it accepts before calling [`Signature::receiving`]). Check
    /// [`Signature::is_consistent`] after the last part.
    pub fn extend_part(
        &mut self,
        first_block: u64,
        weak: &[u64],
        strong: &[[u8; 16]],
    ) -> Result<(), PartError> {
        let have = self.weak.len() as u64;
        let total = Self::block_count(self.basis_size, self.block_size);
        if self.block_size == 0 {
            return Err(PartError::BlockSize);
        }
        if first_block != have {
            return Err(PartError::OutOfOrder {
                expected: have,
                got: first_block,
            });
        }
        if weak.len() != strong.len() {
            return Err(PartError::Lengths);
        }
        if have + weak.len() as u64 > total {
            return Err(PartError::TooMany { total });
        }
        self.weak.extend_from_slice(weak);
        self.strong.extend_from_slice(strong);
        Ok(())
    }

    /// Builds a signature from the 32-byte block hashes and weak hashes.
    pub fn from_parts(block_size: u64, basis_size: u64, weak: Vec<u64>, full: &[[u8; 32]]) -> Self {
        Self {
            block_size,
            basis_size,
            weak,
            strong: full.iter().map(short).collect(),
        }
    }
}

/// Signature and full block hashes of an in-memory basis.
pub fn signature_of_bytes(basis: &[u8], block_size: u64) -> (Signature, Vec<[u8; 32]>) {
    let bs = block_size.max(1) as usize;
    let mut weak = Vec::with_capacity(basis.len().div_ceil(bs));
    let mut full = Vec::with_capacity(weak.capacity());
    for b in basis.chunks(bs) {
        hash_block(b, &mut weak, &mut full);
    }
    let sig = Signature::from_parts(block_size.max(1), basis.len() as u64, weak, &full);
    (sig, full)
}

fn hash_block(b: &[u8], weak: &mut Vec<u64>, full: &mut Vec<[u8; 32]>) {
    let h = block_hash(b);
    let zero = zero_block_hash(b.len() as u64);
    if h == zero {
        weak.push(zero_weak(b.len() as u64));
    } else {
        weak.push(weak_hash(b));
    }
    full.push(h);
}

/// Size of one read: at least 1 MiB and a whole number of blocks.
fn read_chunk(block_size: u64) -> u64 {
    const TARGET: u64 = 4 << 20;
    if block_size >= TARGET {
        block_size
    } else {
        TARGET / block_size * block_size
    }
}

/// Data extents of `file` within `[start, end)`, in order, found with
/// `SEEK_DATA`/`SEEK_HOLE`. When the filesystem cannot tell, the whole range
/// is one extent.
fn data_extents(file: &File, start: u64, end: u64) -> Vec<(u64, u64)> {
    use rustix::fs::{seek, SeekFrom};
    let mut out = Vec::new();
    let mut pos = start;
    while pos < end {
        let data = match seek(file, SeekFrom::Data(pos)) {
            Ok(d) => d,
            // No data at or after `pos`: the rest is a hole.
            Err(rustix::io::Errno::NXIO) => break,
            Err(_) => {
                out.push((pos, end));
                break;
            }
        };
        if data >= end {
            break;
        }
        let hole = match seek(file, SeekFrom::Hole(data)) {
            Ok(h) if h > data => h.min(end),
            _ => end,
        };
        out.push((data.max(pos), hole));
        pos = hole;
    }
    out
}

/// A basis file to sign: the file itself (for its holes) and positioned
/// reads, which an implementation may serve around the page cache.
pub trait Basis: Sync {
    /// The open file.
    fn file(&self) -> &File;
    /// Read exactly `buf.len()` bytes at `off`.
    fn read_exact_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(self.file(), buf, off)
    }
}

impl Basis for File {
    fn file(&self) -> &File {
        self
    }
}

/// Hashes blocks `[first, last)` of the basis into `weak`/`full`.
fn hash_range<B: Basis + ?Sized>(
    file: &B,
    basis_size: u64,
    block_size: u64,
    (first, last): (u64, u64),
    buf: &mut Vec<u8>,
) -> io::Result<Hashes> {
    let mut weak = Vec::with_capacity((last - first) as usize);
    let mut full = Vec::with_capacity((last - first) as usize);
    let start = first * block_size;
    let end = (last * block_size).min(basis_size);
    let extents = data_extents(file.file(), start, end);
    let chunk = read_chunk(block_size);
    let zero_full = zero_block_hash(block_size);
    let zero_w = zero_weak(block_size);
    // Cursor into `extents`: the first extent that ends after the block
    // being looked at (blocks only move forward).
    let mut ei = 0usize;
    let mut touches_data = |bstart: u64| {
        let bend = (bstart + block_size).min(basis_size);
        while ei < extents.len() && extents[ei].1 <= bstart {
            ei += 1;
        }
        ei < extents.len() && extents[ei].0 < bend
    };
    let mut b = first;
    while b < last {
        let bstart = b * block_size;
        let bend = (bstart + block_size).min(basis_size);
        if !touches_data(bstart) {
            // Entirely inside a hole: all zeros, nothing to read.
            if bend - bstart == block_size {
                weak.push(zero_w);
                full.push(zero_full);
            } else {
                weak.push(zero_weak(bend - bstart));
                full.push(zero_block_hash(bend - bstart));
            }
            b += 1;
            continue;
        }
        // A run of blocks touching data, up to one chunk, read at once; it
        // stops before a block wholly inside a hole.
        let mut run_end = b + 1;
        while run_end < last
            && (run_end - b) * block_size < chunk
            && touches_data(run_end * block_size)
        {
            run_end += 1;
        }
        let rend = (run_end * block_size).min(basis_size);
        let len = (rend - bstart) as usize;
        if buf.len() < len {
            buf.resize(len, 0);
        }
        let dst = &mut buf[..len];
        file.read_exact_at(dst, bstart)?;
        for blk in dst.chunks(block_size as usize) {
            hash_block(blk, &mut weak, &mut full);
        }
        b = run_end;
    }
    Ok((weak, full))
}

/// Weak hashes and full hashes of a range of blocks.
type Hashes = (Vec<u64>, Vec<[u8; 32]>);

/// Signature and full 32-byte block hashes of the first `basis_size` bytes
/// of `file`: [`sign_file_in_order`], collected.
///
/// Fails as [`sign_file_in_order`] does.
pub fn signature_of_file<B: Basis + ?Sized>(
    file: &B,
    basis_size: u64,
    block_size: u64,
    threads: usize,
) -> io::Result<(Signature, Vec<[u8; 32]>)> {
    let n = Signature::block_count(basis_size, block_size.max(1));
    let mut weak = Vec::with_capacity(n as usize);
    let mut full = Vec::with_capacity(n as usize);
    sign_file_in_order(file, basis_size, block_size, threads, |_, w, f| {
        weak.extend_from_slice(w);
        full.extend_from_slice(f);
        Ok(())
    })?;
    let sig = Signature::from_parts(block_size, basis_size, weak, &full);
    Ok((sig, full))
}

/// Hash the first `basis_size` bytes of `file` block by block and hand the
/// hashes to `emit` in file order, a read chunk (about 4 MiB of blocks) at
/// a time, as soon as every block before it is hashed: `emit(first_block,
/// weak, full)`. A peer can act on the first blocks while the rest is
/// still being read.
///
/// `threads` workers (at least one) take chunks in turn with positioned
/// reads; blocks wholly in a hole (found with `SEEK_DATA`/`SEEK_HOLE`) get
/// the zero hashes without being read. An error from `emit` stops the
/// workers and is returned. Fails with `UnexpectedEof` if a read of data
/// comes up short, and with `InvalidInput` if `block_size` is 0.
pub fn sign_file_in_order<B: Basis + ?Sized>(
    file: &B,
    basis_size: u64,
    block_size: u64,
    threads: usize,
    mut emit: impl FnMut(u64, &[u64], &[[u8; 32]]) -> io::Result<()>,
) -> io::Result<()> {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    if block_size == 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "block size 0"));
    }
    let n = Signature::block_count(basis_size, block_size);
    let per_chunk = read_chunk(block_size) / block_size;
    let chunks = n.div_ceil(per_chunk);
    let workers = (threads.max(1) as u64).min(chunks.max(1));
    let next = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        // Results are a few dozen bytes per block: the channel and the
        // reordering map stay small even when one worker lags.
        let (tx, rx) = std::sync::mpsc::channel::<(u64, io::Result<Hashes>)>();
        for _ in 0..workers {
            let tx = tx.clone();
            let (next, stop) = (&next, &stop);
            s.spawn(move || {
                let mut buf = Vec::new();
                loop {
                    let c = next.fetch_add(1, Ordering::Relaxed);
                    if c >= chunks || stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let blocks = (c * per_chunk, ((c + 1) * per_chunk).min(n));
                    let r = hash_range(file, basis_size, block_size, blocks, &mut buf);
                    let failed = r.is_err();
                    if tx.send((c, r)).is_err() || failed {
                        return;
                    }
                }
            });
        }
        drop(tx);
        let mut ready: BTreeMap<u64, Hashes> = BTreeMap::new();
        let mut want = 0u64;
        let res = (|| {
            // A worker that dies without sending ends the channel early:
            // the loop then stops short of `chunks`.
            for (c, r) in &rx {
                ready.insert(c, r?);
                while let Some((w, f)) = ready.remove(&want) {
                    emit(want * per_chunk, &w, &f)?;
                    want += 1;
                }
            }
            if want < chunks {
                return Err(io::Error::other("signature worker failed"));
            }
            Ok(())
        })();
        if res.is_err() {
            stop.store(true, Ordering::Relaxed);
        }
        res
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    #[test]
    fn parts_assemble_and_are_bounded() {
        let data: Vec<u8> = (0..50_000u32).map(|i| (i % 253) as u8).collect();
        let (sig, _) = signature_of_bytes(&data, 8192);
        let mut r = Signature::receiving(8192, 50_000);
        r.extend_part(0, &sig.weak[..3], &sig.strong[..3])
            .expect("part 1");
        assert_eq!(
            r.extend_part(4, &sig.weak[4..], &sig.strong[4..]),
            Err(PartError::OutOfOrder {
                expected: 3,
                got: 4
            })
        );
        assert_eq!(
            r.extend_part(3, &sig.weak[3..], &sig.strong[4..]),
            Err(PartError::Lengths)
        );
        r.extend_part(3, &sig.weak[3..], &sig.strong[3..])
            .expect("part 2");
        assert!(r.is_consistent());
        assert_eq!(r, sig);
        assert_eq!(
            r.extend_part(7, &[1], &[[0; 16]]),
            Err(PartError::TooMany { total: 7 })
        );
        let mut z = Signature::receiving(0, 10);
        assert_eq!(z.extend_part(0, &[], &[]), Err(PartError::BlockSize));
    }

    #[test]
    fn extents_skip_holes_where_the_filesystem_reports_them() {
        let f = tempfile::tempfile().expect("tempfile");
        f.write_all_at(&[1u8; 4096], 0).expect("write");
        f.write_all_at(&[2u8; 4096], 12 << 20).expect("write");
        f.set_len(16 << 20).expect("set_len");
        let ext = data_extents(&f, 0, 16 << 20);
        if ext == [(0, 16 << 20)] {
            return; // no SEEK_HOLE support here: one extent is correct too
        }
        assert!(
            ext.iter().all(|e| e.1 <= 1 << 20 || e.0 >= 12 << 20),
            "{ext:?}"
        );
        assert!(ext
            .iter()
            .any(|e| e.0 <= (12 << 20) && e.1 >= (12 << 20) + 4096));
        // A range inside the hole has no extent; one clipped to data does.
        assert!(data_extents(&f, 2 << 20, 4 << 20).is_empty());
        assert_eq!(data_extents(&f, 100, 200), vec![(100, 200)]);
    }

    #[test]
    fn signing_in_order_emits_every_chunk_once_in_file_order() {
        // 9.5 chunks of 8 KiB blocks (512 per chunk), with a hole.
        let bs = 8192u64;
        let size = 19 * (2 << 20) + 12_345;
        let data: Vec<u8> = (0..size)
            .map(|i| (i % 251) as u8 ^ (i >> 17) as u8)
            .collect();
        let f = tempfile::tempfile().expect("tempfile");
        f.write_all_at(&data[..5 << 20], 0).expect("write");
        f.write_all_at(&data[9 << 20..], 9 << 20).expect("write");
        f.set_len(size).expect("set_len");
        let mut expect = data.clone();
        expect[5 << 20..9 << 20].fill(0);
        let (want, want_full) = signature_of_bytes(&expect, bs);
        for threads in [1, 2, 5] {
            let mut next = 0u64;
            let mut full = Vec::new();
            let mut weak = Vec::new();
            sign_file_in_order(&f, size, bs, threads, |first, w, h| {
                assert_eq!(first, next, "chunks out of order");
                assert_eq!(w.len(), h.len());
                assert!(!w.is_empty());
                next += w.len() as u64;
                weak.extend_from_slice(w);
                full.extend_from_slice(h);
                Ok(())
            })
            .expect("sign");
            assert_eq!(weak, want.weak, "{threads} threads");
            assert_eq!(full, want_full, "{threads} threads");
        }
    }

    #[test]
    fn signing_in_order_stops_on_the_first_error() {
        let f = tempfile::tempfile().expect("tempfile");
        f.set_len(64 << 20).expect("set_len");
        let mut calls = 0;
        let r = sign_file_in_order(&f, 64 << 20, 8192, 2, |_, _, _| {
            calls += 1;
            Err(io::Error::other("peer gone"))
        });
        assert_eq!(r.map_err(|e| e.to_string()), Err("peer gone".to_string()));
        assert_eq!(calls, 1);
    }
}
