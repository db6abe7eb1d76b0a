//! The hash of one grid block fed in order as data and zero runs, with
//! the zeros of a block that also holds data costing little.
//!
//! A block that holds any data hashes to `blake3` of all its bytes, zeros
//! included (see [`crate::layout`]). Fed to one hasher, a 256 KiB extent
//! in a 1 MiB block (a sparse file over 128 GiB) costs 1 MiB of hashing.
//! BLAKE3 is a tree of 1 KiB chunks, so the block is hashed here as tiles
//! of [`TILE`] bytes, each a whole subtree: a tile of zeros is a chaining
//! value that depends only on where the tile starts, computed once per
//! process; the others are hashed as their bytes; and the tiles' values
//! are joined the way BLAKE3 joins subtrees. The result is `blake3` of the
//! block's bytes, bit for bit (the tests check it against `blake3::hash`).

use std::sync::OnceLock;

use blake3::hazmat::{
    left_subtree_len, merge_subtrees_non_root, merge_subtrees_root, ChainingValue, HasherExt, Mode,
};

/// A tile: a whole BLAKE3 subtree (64 chunks), long enough that each
/// hashes at full SIMD width.
pub const TILE: u64 = 64 << 10;

/// Tiles of zeros whose values are kept: those of a block of up to 1 MiB.
const KEPT_ZERO_TILES: usize = (crate::layout::MAX_BLOCK / TILE) as usize;

static ZEROS: [u8; TILE as usize] = [0; TILE as usize];

/// The chaining value of `len` zero bytes starting at byte `start` of a
/// block (a multiple of [`TILE`]).
fn zero_cv(start: u64, len: u64) -> ChainingValue {
    let mut h = blake3::Hasher::new();
    h.set_input_offset(start);
    let mut left = len;
    while left > 0 {
        let k = left.min(TILE);
        h.update(&ZEROS[..k as usize]);
        left -= k;
    }
    h.finalize_non_root()
}

/// The chaining value of a whole tile of zeros, tile `i` of its block.
fn zero_tile_cv(i: usize) -> ChainingValue {
    static KEPT: OnceLock<Vec<ChainingValue>> = OnceLock::new();
    let kept = KEPT.get_or_init(|| {
        (0..KEPT_ZERO_TILES)
            .map(|i| zero_cv(i as u64 * TILE, TILE))
            .collect()
    });
    kept.get(i)
        .copied()
        .unwrap_or_else(|| zero_cv(i as u64 * TILE, TILE))
}

/// One block's bytes so far.
#[derive(Clone, Debug, Default)]
pub(crate) struct BlockHash {
    /// Bytes of the block so far.
    filled: u64,
    /// Whether any of them is not zero.
    any_data: bool,
    /// The finished tiles before the current one: `None` for a tile of
    /// zeros (its value is looked up only if the block holds data).
    tiles: Vec<Option<ChainingValue>>,
    /// Bytes of the current tile so far.
    tile_filled: u64,
    /// The current tile's hasher, from its first byte that is not zero.
    tile: Option<blake3::Hasher>,
}

impl BlockHash {
    /// Bytes fed so far.
    pub(crate) fn filled(&self) -> u64 {
        self.filled
    }

    /// Ready for the next block, keeping the allocations.
    pub(crate) fn reset(&mut self) {
        self.filled = 0;
        self.any_data = false;
        self.tiles.clear();
        self.tile_filled = 0;
        self.tile = None;
    }

    /// A full current tile is closed when more bytes come: only then is
    /// it known not to be the whole block (whose hash is a root).
    fn close_full_tile(&mut self) {
        if self.tile_filled == TILE {
            let cv = self.tile.take().map(|h| h.finalize_non_root());
            self.tiles.push(cv);
            self.tile_filled = 0;
        }
    }

    /// Feed literal bytes.
    pub(crate) fn data(&mut self, mut b: &[u8]) {
        while !b.is_empty() {
            self.close_full_tile();
            let room = (TILE - self.tile_filled) as usize;
            let (part, rest) = b.split_at(room.min(b.len()));
            if self.tile.is_none() && !crate::layout::is_zero(part) {
                let mut h = blake3::Hasher::new();
                h.set_input_offset(self.filled - self.tile_filled);
                let mut z = self.tile_filled;
                while z > 0 {
                    let k = z.min(TILE);
                    h.update(&ZEROS[..k as usize]);
                    z -= k;
                }
                self.tile = Some(h);
                self.any_data = true;
            }
            if let Some(h) = &mut self.tile {
                h.update(part);
            }
            self.tile_filled += part.len() as u64;
            self.filled += part.len() as u64;
            b = rest;
        }
    }

    /// Feed `len` zero bytes.
    pub(crate) fn zeros(&mut self, mut len: u64) {
        while len > 0 {
            self.close_full_tile();
            let k = len.min(TILE - self.tile_filled);
            if let Some(h) = &mut self.tile {
                h.update(&ZEROS[..k as usize]);
            }
            self.tile_filled += k;
            self.filled += k;
            len -= k;
        }
    }

    /// The block's hash: `blake3` of its bytes, or `None` when all of
    /// them are zero (the caller's zero-block hash).
    pub(crate) fn finish(&mut self) -> Option<[u8; 32]> {
        if !self.any_data {
            return None;
        }
        if self.tiles.is_empty() {
            // One tile is the whole block: its hash is the root. (Data
            // in the block's only tile started its hasher.)
            debug_assert!(self.tile.is_some());
            let h = self.tile.take()?;
            return Some(*h.finalize().as_bytes());
        }
        let start = self.filled - self.tile_filled;
        let last = match self.tile.take() {
            Some(h) => h.finalize_non_root(),
            None if self.tile_filled == TILE => zero_tile_cv(self.tiles.len()),
            None => zero_cv(start, self.tile_filled),
        };
        let cvs: Vec<ChainingValue> = self
            .tiles
            .iter()
            .enumerate()
            .map(|(i, cv)| cv.unwrap_or_else(|| zero_tile_cv(i)))
            .chain(std::iter::once(last))
            .collect();
        let (l, r) = split(&cvs, self.filled);
        Some(*merge_subtrees_root(&l, &r, Mode::Hash).as_bytes())
    }
}

/// The two children of the subtree made of the tiles `cvs`, `len` bytes
/// in all (more than one tile): BLAKE3 puts the largest power of two
/// chunks that leaves some input on the left, a whole number of tiles.
fn split(cvs: &[ChainingValue], len: u64) -> (ChainingValue, ChainingValue) {
    let left = left_subtree_len(len);
    let k = (left / TILE) as usize;
    (join(&cvs[..k], left), join(&cvs[k..], len - left))
}

/// The chaining value of the (non-root) subtree made of the tiles `cvs`.
fn join(cvs: &[ChainingValue], len: u64) -> ChainingValue {
    match cvs {
        [one] => *one,
        _ => {
            let (l, r) = split(cvs, len);
            merge_subtrees_non_root(&l, &r, Mode::Hash)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// How a piece of a block is fed.
    #[derive(Clone, Copy, Debug)]
    enum Kind {
        /// `zeros()`.
        Zeros,
        /// `data()` with no zero byte.
        Dense,
        /// `data()` of zeros (read from a disk or an old copy).
        ZeroData,
        /// `data()` of zeros but for one byte, at this fraction in /256.
        OneByte(u8),
    }

    fn piece(kind: Kind, len: usize, n: usize) -> Vec<u8> {
        match kind {
            Kind::Zeros | Kind::ZeroData => vec![0; len],
            Kind::Dense => (0..len).map(|i| (i * 7 + n) as u8 | 1).collect(),
            Kind::OneByte(at) => {
                let mut d = vec![0; len];
                if len > 0 {
                    d[len * usize::from(at) / 256] = 0x5a;
                }
                d
            }
        }
    }

    fn hash_of(pieces: &[(usize, Kind)]) -> (Option<[u8; 32]>, Vec<u8>) {
        let mut b = BlockHash::default();
        let mut bytes = Vec::new();
        for (n, &(len, kind)) in pieces.iter().enumerate() {
            let d = piece(kind, len, n);
            match kind {
                Kind::Zeros => b.zeros(len as u64),
                _ => b.data(&d),
            }
            bytes.extend_from_slice(&d);
        }
        assert_eq!(b.filled(), bytes.len() as u64);
        (b.finish(), bytes)
    }

    /// What a block of `bytes` hashes to here: `None` for all zeros.
    fn want(bytes: &[u8]) -> Option<[u8; 32]> {
        (!crate::layout::is_zero(bytes)).then(|| *blake3::hash(bytes).as_bytes())
    }

    #[test]
    fn a_sparse_extent_in_a_big_block_is_blake3_of_the_block() {
        let t = TILE as usize;
        for (data, zeros) in [
            (256 << 10, 768 << 10),
            (1, (1 << 20) - 1),
            (t, t),
            (5000, 3 * t + 17),
        ] {
            let (h, bytes) = hash_of(&[(data, Kind::Dense), (zeros, Kind::Zeros)]);
            assert_eq!(h, want(&bytes), "{data} + {zeros}");
            let (h, bytes) = hash_of(&[(zeros, Kind::Zeros), (data, Kind::Dense)]);
            assert_eq!(h, want(&bytes), "{zeros} + {data}");
        }
    }

    #[test]
    fn every_length_at_a_chunk_or_tile_edge_is_blake3_of_the_block() {
        let t = TILE as usize;
        for len in [
            1,
            1023,
            1024,
            1025,
            2048,
            t - 1,
            t,
            t + 1,
            t + 1023,
            t + 1024,
            2 * t,
            3 * t + 17,
            15 * t + 1,
            16 * t - 1,
            16 * t,
        ] {
            for at in [0, 128, 255] {
                let (h, bytes) = hash_of(&[(len, Kind::OneByte(at))]);
                assert_eq!(h, want(&bytes), "{len} bytes, one at {at}/256");
                // The same bytes as 4 KiB pieces.
                let mut b = BlockHash::default();
                for c in bytes.chunks(4096) {
                    b.data(c);
                }
                assert_eq!(b.finish(), want(&bytes), "{len} bytes in 4 KiB pieces");
            }
        }
    }

    #[test]
    fn zeros_alone_are_left_to_the_caller_and_reset_starts_over() {
        let mut b = BlockHash::default();
        b.zeros(3 * TILE + 5);
        b.data(&[0; 100]);
        assert_eq!(b.finish(), None);
        b.reset();
        b.data(b"x");
        assert_eq!(b.finish(), Some(*blake3::hash(b"x").as_bytes()));
    }

    #[test]
    fn kept_zero_tiles_match_computed_ones() {
        for i in [
            0,
            1,
            7,
            KEPT_ZERO_TILES - 1,
            KEPT_ZERO_TILES,
            KEPT_ZERO_TILES + 3,
        ] {
            assert_eq!(zero_tile_cv(i), zero_cv(i as u64 * TILE, TILE), "tile {i}");
        }
    }

    proptest! {
        #![proptest_config(proptest::test_runner::Config { failure_persistence: None, cases: 200, ..proptest::test_runner::Config::default() })]
        /// Any mix of data and zeros (fed either way), up to about 3 MB
        /// (past the kept zero tiles too), in any split: `blake3` of the
        /// bytes.
        #[test]
        fn any_mix_is_blake3_of_the_bytes(
            pieces in proptest::collection::vec(
                (
                    prop_oneof![0usize..3000, 0usize..70_000, 60_000usize..300_000],
                    prop_oneof![
                        Just(Kind::Zeros),
                        Just(Kind::Dense),
                        Just(Kind::ZeroData),
                        any::<u8>().prop_map(Kind::OneByte),
                    ],
                ),
                1..10,
            ),
        ) {
            let (h, bytes) = hash_of(&pieces);
            prop_assert_eq!(h, want(&bytes));
        }
    }
}
