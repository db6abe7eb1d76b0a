//! How a file is cut up, and how its contents are digested.
//!
//! Both ends derive the same layout from the file's size alone:
//!
//! * **grid blocks** of [`grid_block`] bytes: the unit of content hashing
//!   (64 KiB, more for files over 8 GiB, so BLAKE3 runs at full SIMD width
//!   and a digest list stays under 2^17 entries);
//! * **delta blocks** of [`delta_block`] bytes: the unit of delta matching,
//!   finer so that scattered small edits cost little (8 KiB up to 1 GiB,
//!   growing so a signature has at most about 2^17 blocks, 1 MiB from
//!   128 GiB);
//! * **segments** of [`segment_size`] bytes (a whole number of grid blocks):
//!   the unit of parallel work. Every op of a segment travels in order; ops
//!   of different segments interleave freely.
//!
//! The hash of a grid block is `blake3(bytes)`, except that an all-zero
//! block hashes to [`zero_block_hash`] of its length, so holes and zero
//! runs are digested without reading or hashing them. A segment's digest is
//! `blake3` over its block hashes in order; a file's digest is `blake3` over
//! its segment digests. The sender digests what it read, the receiver what
//! it wrote, and they must agree: that is ferry's end-to-end check.

use std::sync::OnceLock;

use crate::blockhash::BlockHash;

/// Smallest grid block.
pub const MIN_BLOCK: u64 = 64 << 10;
/// Smallest delta block.
pub const MIN_DELTA_BLOCK: u64 = 8 << 10;
/// Largest grid block.
pub const MAX_BLOCK: u64 = 1 << 20;
/// Granularity of zero detection: runs of zeros this long and aligned are
/// sent as [`crate::Message::Zero`] and become holes at the destination.
pub const ZERO_GRAIN: u64 = 4 << 10;
/// Segment size: the unit of parallel work.
pub const SEGMENT: u64 = 8 << 20;

/// Grid block size for a file of `size` bytes.
pub fn grid_block(size: u64) -> u64 {
    (size >> 17).next_power_of_two().clamp(MIN_BLOCK, MAX_BLOCK)
}

/// Delta block size for a file of `size` bytes.
pub fn delta_block(size: u64) -> u64 {
    (size >> 17)
        .next_power_of_two()
        .clamp(MIN_DELTA_BLOCK, MAX_BLOCK)
}

/// Segment size for a file of `size` bytes (a multiple of its grid block).
pub fn segment_size(_size: u64) -> u64 {
    SEGMENT
}

/// Number of segments of a file of `size` bytes (an empty file has none).
pub fn segment_count(size: u64) -> u64 {
    size.div_ceil(SEGMENT)
}

/// Byte range `[start, end)` of segment `seg` of a file of `size` bytes.
pub fn segment_range(size: u64, seg: u64) -> (u64, u64) {
    let start = seg.saturating_mul(SEGMENT).min(size);
    (start, (start + SEGMENT).min(size))
}

/// True when every byte of `b` is zero. Vectorises well; stops at the first
/// non-zero 256-byte stretch.
pub fn is_zero(b: &[u8]) -> bool {
    let mut chunks = b.chunks_exact(256);
    for c in &mut chunks {
        let mut acc = 0u64;
        for w in c.chunks_exact(8) {
            acc |= u64::from_ne_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
        }
        if acc != 0 {
            return false;
        }
    }
    chunks.remainder().iter().all(|&x| x == 0)
}

/// Hash of an all-zero grid block of `len` bytes.
pub fn zero_block_hash(len: u64) -> [u8; 32] {
    static COMMON: OnceLock<Vec<(u64, [u8; 32])>> = OnceLock::new();
    let table = COMMON.get_or_init(|| {
        let mut v = Vec::new();
        let mut b = MIN_DELTA_BLOCK;
        while b <= MAX_BLOCK {
            v.push((b, compute_zero_hash(b)));
            b *= 2;
        }
        v
    });
    table
        .iter()
        .find(|(l, _)| *l == len)
        .map(|(_, h)| *h)
        .unwrap_or_else(|| compute_zero_hash(len))
}

fn compute_zero_hash(len: u64) -> [u8; 32] {
    let mut h = blake3::Hasher::new_derive_key("ferry 2026 zero block");
    h.update(&len.to_le_bytes());
    *h.finalize().as_bytes()
}

/// Hash of one grid block given all its bytes.
pub fn block_hash(b: &[u8]) -> [u8; 32] {
    if is_zero(b) {
        zero_block_hash(b.len() as u64)
    } else {
        *blake3::hash(b).as_bytes()
    }
}

/// Digest of a whole file from its segment digests, in order.
pub fn file_digest<'a>(segments: impl IntoIterator<Item = &'a [u8; 32]>) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    for s in segments {
        h.update(s);
    }
    *h.finalize().as_bytes()
}

/// Computes a segment's digest from its contents fed in offset order as
/// data, zero runs, or whole blocks whose hash is already known.
pub struct SegmentHasher {
    block: u64,
    /// The current block so far (its zeros are hashed only where it also
    /// holds data, and then mostly not: see [`crate::blockhash`]).
    cur: BlockHash,
    seg: blake3::Hasher,
    /// Hashes of the finished blocks, when the caller wants them kept.
    keep: Option<Vec<[u8; 32]>>,
    /// A hasher that hashes nothing and digests to zeros.
    off: bool,
}

impl SegmentHasher {
    /// A hasher for a segment of a file whose grid block is `block`.
    pub fn new(block: u64) -> Self {
        Self {
            block,
            cur: BlockHash::default(),
            seg: blake3::Hasher::new(),
            keep: None,
            off: false,
        }
    }

    /// A hasher that skips all work and digests to all zeros: for links
    /// that move the sender's own buffers (in process), where hashing them
    /// twice would verify nothing.
    pub fn disabled() -> Self {
        let mut h = Self::new(MIN_BLOCK);
        h.off = true;
        h
    }

    /// Also keep every finished block hash (for signature caches).
    pub fn keeping_blocks(mut self) -> Self {
        self.keep = Some(Vec::new());
        self
    }

    fn finish_block(&mut self) {
        let filled = self.cur.filled();
        let h = self.cur.finish().unwrap_or_else(|| zero_block_hash(filled));
        self.push_block(h);
    }

    fn push_block(&mut self, h: [u8; 32]) {
        self.seg.update(&h);
        if let Some(k) = &mut self.keep {
            k.push(h);
        }
        self.cur.reset();
    }

    /// Feed literal bytes.
    pub fn data(&mut self, mut b: &[u8]) {
        if self.off {
            return;
        }
        while !b.is_empty() {
            let room = (self.block - self.cur.filled()) as usize;
            let (part, rest) = b.split_at(room.min(b.len()));
            self.cur.data(part);
            b = rest;
            if self.cur.filled() == self.block {
                self.finish_block();
            }
        }
    }

    /// Feed `len` zero bytes.
    pub fn zeros(&mut self, mut len: u64) {
        if self.off {
            return;
        }
        while len > 0 {
            if self.cur.filled() == 0 && len >= self.block {
                let n = len / self.block;
                let h = zero_block_hash(self.block);
                for _ in 0..n {
                    self.push_block(h);
                }
                len -= n * self.block;
                continue;
            }
            let k = len.min(self.block - self.cur.filled());
            self.cur.zeros(k);
            len -= k;
            if self.cur.filled() == self.block {
                self.finish_block();
            }
        }
    }

    /// True when the next byte starts a grid block.
    pub fn at_block_start(&self) -> bool {
        self.cur.filled() == 0
    }

    /// Feed a whole block whose hash is known. Only valid at a block start.
    pub fn known_block(&mut self, h: [u8; 32]) {
        debug_assert!(self.cur.filled() == 0);
        self.push_block(h);
    }

    /// The segment digest (a trailing partial block is finished first), and
    /// the block hashes when they were kept.
    pub fn finish(mut self) -> ([u8; 32], Option<Vec<[u8; 32]>>) {
        if self.off {
            return ([0; 32], None);
        }
        if self.cur.filled() > 0 {
            self.finish_block();
        }
        (*self.seg.finalize().as_bytes(), self.keep)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn reference(block: u64, bytes: &[u8]) -> [u8; 32] {
        let mut seg = blake3::Hasher::new();
        for b in bytes.chunks(block as usize) {
            seg.update(&block_hash(b));
        }
        *seg.finalize().as_bytes()
    }

    #[test]
    fn grid_sizes() {
        assert_eq!(grid_block(0), MIN_BLOCK);
        assert_eq!(grid_block(1 << 30), 64 << 10);
        assert_eq!(grid_block(16 << 30), 128 << 10);
        assert_eq!(delta_block(1 << 30), 8 << 10);
        assert_eq!(delta_block(8 << 30), 64 << 10);
        assert_eq!(grid_block(1 << 40), MAX_BLOCK);
        assert_eq!(segment_count(0), 0);
        assert_eq!(segment_count(SEGMENT + 1), 2);
        assert_eq!(segment_range(SEGMENT + 1, 1), (SEGMENT, SEGMENT + 1));
    }

    #[test]
    fn is_zero_finds_a_late_byte() {
        let mut v = vec![0u8; 10_000];
        assert!(is_zero(&v));
        v[9_999] = 1;
        assert!(!is_zero(&v));
        v[9_999] = 0;
        v[3] = 1;
        assert!(!is_zero(&v));
    }

    proptest! {
        #![proptest_config(proptest::test_runner::Config { failure_persistence: None, ..proptest::test_runner::Config::default() })]
        /// However a segment's bytes are split into data and zero ops, the
        /// digest equals the reference digest of the bytes.
        #[test]
        fn any_split_gives_the_reference_digest(
            pieces in proptest::collection::vec((0usize..20_000, any::<bool>(), any::<u8>()), 0..12),
        ) {
            let block = MIN_DELTA_BLOCK;
            let mut bytes = Vec::new();
            let mut h = SegmentHasher::new(block);
            for (len, zero, fill) in pieces {
                if zero || fill == 0 {
                    bytes.extend(std::iter::repeat_n(0u8, len));
                    h.zeros(len as u64);
                } else {
                    let d: Vec<u8> = (0..len).map(|i| fill.wrapping_add(i as u8) | 1).collect();
                    bytes.extend_from_slice(&d);
                    h.data(&d);
                }
            }
            prop_assert_eq!(h.finish().0, reference(block, &bytes));
        }

        /// The same in grid blocks of 64 KiB to 1 MiB (tiled: see
        /// crate::blockhash), with runs long enough to span tiles and
        /// blocks, and whole blocks fed at once.
        #[test]
        fn any_split_in_big_blocks_gives_the_reference_digest(
            shift in 0u32..5,
            pieces in proptest::collection::vec((0usize..400_000, any::<bool>(), any::<u8>()), 0..8),
        ) {
            let block = MIN_BLOCK << shift;
            let mut bytes = Vec::new();
            let mut h = SegmentHasher::new(block);
            for (len, zero, fill) in pieces {
                if zero {
                    bytes.extend(std::iter::repeat_n(0u8, len));
                    h.zeros(len as u64);
                } else {
                    // fill 0: zeros fed as data; odd: no zero byte; even:
                    // zeros but for one byte in 64 Ki.
                    let d: Vec<u8> = (0..len)
                        .map(|i| match fill {
                            0 => 0,
                            f if f % 2 == 1 => f.wrapping_add((i / 3) as u8) | 1,
                            f => u8::from(i % 65_536 == usize::from(f) * 7) * f,
                        })
                        .collect();
                    bytes.extend_from_slice(&d);
                    h.data(&d);
                }
            }
            prop_assert_eq!(h.finish().0, reference(block, &bytes));
        }
    }
}
