//! Finding the parts of a source segment that exist in the basis.

use ferry_link::layout::{block_hash, is_zero, zero_block_hash};

use crate::sig::{short, Signature};
use crate::weak::{weak_hash, Roller};

/// One instruction to rebuild the source from the basis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// Source bytes `[offset, offset + len)` equal basis bytes
    /// `[basis_offset, basis_offset + len)`.
    Copy {
        offset: u64,
        basis_offset: u64,
        len: u64,
    },
    /// Source bytes `[offset, offset + len)` must be sent. They may contain
    /// zero runs: the caller sends those as `Zero` messages.
    Literal { offset: u64, len: u64 },
}

impl Op {
    /// Source offset of the op.
    pub fn offset(&self) -> u64 {
        match *self {
            Op::Copy { offset, .. } | Op::Literal { offset, .. } => offset,
        }
    }

    /// Length of the op in bytes.
    pub fn len(&self) -> u64 {
        match *self {
            Op::Copy { len, .. } | Op::Literal { len, .. } => len,
        }
    }

    /// True for an op of no bytes (never emitted by the matcher).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// At most this many indexed blocks share one weak value. Blocks with equal
/// contents are indexed once already, so more than a few distinct blocks
/// with one weak value means crafted or pathological data: bounding the
/// list bounds the strong-hash comparisons per byte.
pub const MAX_CANDIDATES: usize = 8;

/// Multiplier spreading the weak hash before bucketing on its high bits.
const SPREAD: u64 = 0xD6E8_FEB8_6659_FD93;

/// An index of a basis signature, ready to diff source segments against.
///
/// Immutable after [`Matcher::new`], so it is `Send + Sync` and several
/// segments can be diffed against it at once.
#[derive(Clone, Debug)]
pub struct Matcher {
    bs: u64,
    basis_size: u64,
    /// Blocks usable: the shortest of the signature's vectors and its
    /// block count (a peer's signature is not trusted to be consistent).
    n: u64,
    weak: Vec<u64>,
    strong: Vec<[u8; 16]>,
    /// Strong hash of an all-zero full block.
    zero_strong: [u8; 16],
    roller: Roller,
    /// log2 of the number of buckets.
    bits: u32,
    /// Bucket `k` holds `entries[starts[k]..starts[k + 1]]`.
    starts: Vec<u32>,
    /// `(weak, block index)`, grouped by bucket.
    entries: Vec<(u64, u32)>,
    /// A bit per slot of a much finer partition (about 64 slots per indexed
    /// block): set when some indexed weak hash falls in the slot. Most
    /// rolling positions miss here, on a well-predicted branch, without
    /// touching the buckets.
    filter: Vec<u64>,
    /// log2 of the number of filter bits.
    fbits: u32,
}

impl Matcher {
    /// Indexes `sig`. All-zero blocks are not indexed (zero runs are sent
    /// as such), nor partial blocks (the rolling window is one full block);
    /// blocks with equal strong hashes are indexed once (the first), and at
    /// most [`MAX_CANDIDATES`] blocks per weak value.
    pub fn new(sig: &Signature) -> Matcher {
        let bs = sig.block_size;
        let nblocks = Signature::block_count(sig.basis_size, bs);
        let n = nblocks
            .min(sig.weak.len() as u64)
            .min(sig.strong.len() as u64)
            .min(u64::from(u32::MAX));
        let weak = sig.weak[..n as usize].to_vec();
        let strong = sig.strong[..n as usize].to_vec();
        let zero_strong = short(&zero_block_hash(bs));

        let mut seen = std::collections::HashSet::with_capacity(n as usize);
        let mut per_weak: std::collections::HashMap<u64, usize> =
            std::collections::HashMap::with_capacity(n as usize);
        let mut chosen: Vec<(u64, u32)> = Vec::with_capacity(n as usize);
        for i in 0..n {
            let full = sig.basis_size.saturating_sub(i * bs) >= bs;
            let s = strong[i as usize];
            if !full || s == zero_strong || !seen.insert(s) {
                continue;
            }
            let w = weak[i as usize];
            let c = per_weak.entry(w).or_insert(0);
            if *c >= MAX_CANDIDATES {
                continue;
            }
            *c += 1;
            chosen.push((w, i as u32));
        }
        let bits = (chosen.len() as u64 * 2)
            .next_power_of_two()
            .max(16)
            .trailing_zeros();
        let nb = 1usize << bits;
        let bucket = |w: u64| (w.wrapping_mul(SPREAD) >> (64 - bits)) as usize;
        let mut starts = vec![0u32; nb + 1];
        for &(w, _) in &chosen {
            starts[bucket(w) + 1] += 1;
        }
        for k in 0..nb {
            starts[k + 1] += starts[k];
        }
        let mut fill = starts.clone();
        let mut entries = vec![(0u64, 0u32); chosen.len()];
        for &(w, i) in &chosen {
            let k = bucket(w);
            entries[fill[k] as usize] = (w, i);
            fill[k] += 1;
        }
        let fbits = (chosen.len() as u64 * 64)
            .next_power_of_two()
            .clamp(1 << 12, 1 << 27)
            .trailing_zeros();
        let mut filter = vec![0u64; 1 << (fbits - 6)];
        for &(w, _) in &chosen {
            let f = (w.wrapping_mul(SPREAD) >> (64 - fbits)) as usize;
            filter[f >> 6] |= 1 << (f & 63);
        }
        Matcher {
            filter,
            fbits,
            bs,
            basis_size: sig.basis_size,
            n,
            weak,
            strong,
            zero_strong,
            roller: Roller::new(bs),
            bits,
            starts,
            entries,
        }
    }

    /// Block size of the signature.
    pub fn block_size(&self) -> u64 {
        self.bs
    }

    /// Number of blocks in the rolling index.
    pub fn indexed_blocks(&self) -> usize {
        self.entries.len()
    }

    #[inline(always)]
    fn maybe_indexed(&self, w: u64) -> bool {
        let f = (w.wrapping_mul(SPREAD) >> (64 - self.fbits)) as usize;
        self.filter[f >> 6] & (1 << (f & 63)) != 0
    }

    #[inline(always)]
    fn bucket(&self, w: u64) -> usize {
        (w.wrapping_mul(SPREAD) >> (64 - self.bits)) as usize
    }

    /// Is the source block at index `k` of the aligned grid, `len` bytes
    /// whose block hash is `hash`, the basis block `k`? (An all-zero basis
    /// block never matches: zeros travel as zero runs.) The aligned pass of
    /// [`Matcher::diff_range`] decides the same way, without data.
    pub fn aligned_match(&self, k: u64, len: u64, hash: &[u8; 32]) -> bool {
        k < self.n
            && len > 0
            && self.block_len(k) == len
            && !self.is_zero_block(k)
            && short(hash) == self.strong[k as usize]
    }

    fn block_len(&self, j: u64) -> u64 {
        self.basis_size
            .saturating_sub(j.saturating_mul(self.bs))
            .min(self.bs)
    }

    fn is_zero_block(&self, j: u64) -> bool {
        let len = self.block_len(j);
        let s = &self.strong[j as usize];
        if len == self.bs {
            *s == self.zero_strong
        } else {
            *s == short(&zero_block_hash(len))
        }
    }

    /// Diffs one in-memory piece of the source, `data`, which starts at
    /// source offset `data_offset` (a multiple of the block size). Emits,
    /// in offset order, ops that cover `data` exactly; adjacent copies that
    /// are contiguous in both files come out as one op.
    pub fn diff(&self, data: &[u8], data_offset: u64, emit: &mut impl FnMut(Op)) {
        self.diff_range(data, data_offset, 0..data.len(), None, emit);
    }

    /// Diffs the part `range` of `data` (a segment), using the bytes of
    /// `data` around it as context: matches may start before the range or
    /// end after it, and are clipped to it. Ops cover `range` exactly.
    ///
    /// Segments are diffed independently, so without context a shifted
    /// file loses about one block at every segment end (the last window
    /// does not fit). With one block of context on each side (read
    /// `[seg_start - bs, seg_end + bs)`, clamped to the file, and pass the
    /// segment's place in it), a 7-byte insert costs 7 literal bytes in all.
    /// `data_offset` (the source offset of `data[0]`) must be a multiple of
    /// the block size. `hashes`, when given, are the block hashes of `data`
    /// as for [`Matcher::diff_with_hashes`] (ignored if their count is
    /// wrong). A range past the end of `data` is clamped to it.
    pub fn diff_range(
        &self,
        data: &[u8],
        data_offset: u64,
        range: std::ops::Range<usize>,
        hashes: Option<&[[u8; 32]]>,
        emit: &mut impl FnMut(Op),
    ) {
        let hashes = hashes.filter(|h| self.hashes_fit(data, data_offset, h));
        let n = data.len();
        let end = range.end.min(n);
        let start = range.start.min(end);
        if start == end || data_offset.checked_add(n as u64).is_none() {
            return;
        }
        let mut out = Out {
            emit,
            pending: None,
            lo: data_offset + start as u64,
            hi: data_offset + end as u64,
        };
        if self.bs == 0 || self.n == 0 {
            out.literal(data_offset, n as u64);
        } else {
            let lit = self.search(data, data_offset, hashes, &mut out);
            self.finish(data, data_offset, lit, hashes, &mut out);
        }
        out.flush();
    }

    fn hashes_fit(&self, data: &[u8], data_offset: u64, hashes: &[[u8; 32]]) -> bool {
        self.bs > 0
            && data_offset.is_multiple_of(self.bs)
            && hashes.len() as u64 == (data.len() as u64).div_ceil(self.bs)
    }

    /// [`Matcher::diff`] reusing the caller's block hashes of `data`:
    /// `hashes[k]` must be `ferry_link::layout::block_hash` of
    /// `data[k * bs..(k + 1) * bs]` (the last one may be partial), as the
    /// sender computes anyway for the segment digest. The aligned pass then
    /// hashes nothing. Hashes of the wrong count are ignored.
    pub fn diff_with_hashes(
        &self,
        data: &[u8],
        data_offset: u64,
        hashes: &[[u8; 32]],
        emit: &mut impl FnMut(Op),
    ) {
        self.diff_range(data, data_offset, 0..data.len(), Some(hashes), emit);
    }

    /// Strong hash of `data[p..p + len]`, from `hashes` when that is a
    /// whole block of them.
    fn strong_of(
        &self,
        data: &[u8],
        p: usize,
        len: usize,
        hashes: Option<&[[u8; 32]]>,
    ) -> [u8; 16] {
        let bs = self.bs as usize;
        if let Some(h) = hashes {
            if p.is_multiple_of(bs) && len == bs.min(data.len() - p) {
                return short(&h[p / bs]);
            }
        }
        short(&block_hash(&data[p..p + len]))
    }

    /// Does `data[p..]` start with basis block at `basis_off`? Returns the
    /// length matched (the block's length).
    fn try_at(
        &self,
        data: &[u8],
        p: usize,
        basis_off: u64,
        hashes: Option<&[[u8; 32]]>,
    ) -> Option<usize> {
        if !basis_off.is_multiple_of(self.bs) {
            return None;
        }
        let j = basis_off / self.bs;
        if j >= self.n {
            return None;
        }
        let len = self.block_len(j) as usize;
        if len == 0 || len > data.len() - p || self.is_zero_block(j) {
            return None;
        }
        (self.strong_of(data, p, len, hashes) == self.strong[j as usize]).then_some(len)
    }

    /// The indexed block (its basis offset) whose weak hash is `h` and
    /// whose strong hash is that of `data[q..q + bs]`, computed at most
    /// once, into `strong`. A weak hit whose strong hash then differs
    /// spends one of `budget`.
    #[inline(always)]
    fn lookup(
        &self,
        h: u64,
        data: &[u8],
        q: usize,
        hashes: Option<&[[u8; 32]]>,
        strong: &mut Option<[u8; 16]>,
        budget: &mut usize,
    ) -> Option<u64> {
        let k = self.bucket(h);
        let (s0, s1) = (self.starts[k] as usize, self.starts[k + 1] as usize);
        let mut hit = false;
        for &(w, i) in &self.entries[s0..s1] {
            if w != h {
                continue;
            }
            hit = true;
            let s =
                *strong.get_or_insert_with(|| self.strong_of(data, q, self.bs as usize, hashes));
            if s == self.strong[i as usize] {
                return Some(u64::from(i) * self.bs);
            }
        }
        if hit {
            *budget -= 1;
        }
        None
    }

    /// The search of [`Matcher::diff_range`] (`bs` and the index not
    /// empty): emits the ops of `data` up to where the matches end, and
    /// returns where the literal that is still pending starts.
    #[inline(always)]
    fn search<F: FnMut(Op)>(
        &self,
        data: &[u8],
        data_offset: u64,
        hashes: Option<&[[u8; 32]]>,
        out: &mut Out<'_, F>,
    ) -> usize {
        let n = data.len();
        let bs = self.bs as usize;
        let abs = |p: usize| data_offset + p as u64;
        // Weak hits whose strong hash then differs: bounded per segment so a
        // crafted signature cannot make the search quadratic.
        let mut budget = n / bs * 4 + 16;
        let mut p = 0usize; // next byte not yet decided
        let mut lit = 0usize; // start of the pending literal

        // Where in the basis the next source byte is expected: the aligned
        // phase at first, then the phase of the last match.
        let mut expect: Option<u64> = Some(data_offset);
        // Back-off for data that matches nothing (a rewritten file): each
        // whole block rolled in vain doubles the number of grid blocks that
        // then get only the aligned check before rolling resumes. A shift is
        // still found within a block of where rolling resumes; all-new data
        // costs a few percent of a full rolling search.
        let mut fruitless = 0u32;
        let mut quiet = 0usize;

        'outer: while p < n {
            if let Some(b) = expect.take() {
                // Synchronised. A zero block is left in the literal for the
                // caller's zero-run detection, and the phase carries on
                // past it: zero runs need neither hashing nor rolling.
                let zlen = bs.min(n - p);
                if is_zero(&data[p..p + zlen]) {
                    p += zlen;
                    expect = Some(b.saturating_add(zlen as u64));
                    continue 'outer;
                }
                // One strong check, no rolling.
                let aligned = abs(p);
                let tries = [Some(b), (b != aligned).then_some(aligned)];
                for b in tries.into_iter().flatten() {
                    if let Some(len) = self.try_at(data, p, b, hashes) {
                        out.literal(abs(lit), (p - lit) as u64);
                        out.copy(abs(p), b, len as u64);
                        p += len;
                        lit = p;
                        expect = Some(b.saturating_add(len as u64));
                        fruitless = 0;
                        quiet = 0;
                        continue 'outer;
                    }
                }
                if quiet > 0 && abs(p) % self.bs == 0 {
                    quiet -= 1;
                    p += zlen;
                    expect = Some(abs(p));
                    continue 'outer;
                }
            }
            // Rolling search for shifted data, from p.
            if n - p < bs {
                break;
            }
            let mut h = weak_hash(&data[p..p + bs]);
            let mut q = p;
            let roll_start = p;
            // Next source position on the block grid (relative).
            let rem = (abs(q) % self.bs) as usize;
            let mut next_grid = if rem == 0 { q } else { q + (bs - rem) };
            loop {
                let mut strong: Option<[u8; 16]> = None;
                if q == next_grid && q >= roll_start + 2 * bs {
                    // Two whole blocks rolled and nothing found (a shift
                    // would have shown within one): back off
                    // (the aligned check of this block is the first thing
                    // the synchronised branch does).
                    fruitless += 1;
                    quiet = (1usize << fruitless.min(6)) - 1;
                    p = q;
                    expect = Some(abs(q));
                    continue 'outer;
                }
                if q == next_grid {
                    next_grid += bs;
                    if is_zero(&data[q..q + bs]) {
                        // A zero block on the grid: skip it (and the rest of
                        // the zero run) synchronised instead of rolling.
                        p = q;
                        expect = Some(abs(q));
                        continue 'outer;
                    }
                    // Aligned phase: the basis block at the same index.
                    let j = abs(q) / self.bs;
                    if j < self.n
                        && self.weak[j as usize] == h
                        && self.block_len(j) == self.bs
                        && !self.is_zero_block(j)
                    {
                        let s = self.strong_of(data, q, bs, hashes);
                        strong = Some(s);
                        if s == self.strong[j as usize] {
                            out.literal(abs(lit), (q - lit) as u64);
                            out.copy(abs(q), j * self.bs, self.bs);
                            p = q + bs;
                            lit = p;
                            expect = Some((j + 1) * self.bs);
                            fruitless = 0;
                            continue 'outer;
                        }
                    }
                }
                if self.maybe_indexed(h) && budget > 0 {
                    if let Some(b) = self.lookup(h, data, q, hashes, &mut strong, &mut budget) {
                        out.literal(abs(lit), (q - lit) as u64);
                        out.copy(abs(q), b, self.bs);
                        p = q + bs;
                        lit = p;
                        expect = Some(b + self.bs);
                        fruitless = 0;
                        continue 'outer;
                    }
                }
                if q + bs >= n {
                    break 'outer;
                }
                h = self.roller.roll(h, data[q], data[q + bs]);
                q += 1;
            }
        }
        lit
    }

    /// The end of [`Matcher::diff_range`]: the literal pending from `lit`,
    /// but for the source's last, partial block, which may still equal the
    /// basis's last block at the same place.
    fn finish<F: FnMut(Op)>(
        &self,
        data: &[u8],
        data_offset: u64,
        mut lit: usize,
        hashes: Option<&[[u8; 32]]>,
        out: &mut Out<'_, F>,
    ) {
        let n = data.len();
        let bs = self.bs as usize;
        let abs = |p: usize| data_offset + p as u64;
        // Fewer than a block left unmatched: the source's last, partial
        // block may still equal the basis's last block at the same place.
        if lit < n {
            let rem = (abs(lit) % self.bs) as usize;
            let t = if rem == 0 {
                lit
            } else {
                lit.saturating_add(bs - rem)
            };
            if t < n && n - t < bs {
                if let Some(len) = self.try_at(data, t, abs(t), hashes) {
                    out.literal(abs(lit), (t - lit) as u64);
                    out.copy(abs(t), abs(t), len as u64);
                    lit = t + len;
                }
            }
        }
        out.literal(abs(lit), (n - lit) as u64);
    }
}

/// Merges ops before passing them on.
struct Out<'a, F: FnMut(Op)> {
    emit: &'a mut F,
    pending: Option<Op>,
    /// Ops are clipped to the source range `[lo, hi)`.
    lo: u64,
    hi: u64,
}

impl<F: FnMut(Op)> Out<'_, F> {
    /// `[offset, offset + len)` clipped to `[lo, hi)`: the new offset, the
    /// bytes cut off the front, and the new length.
    fn clip(&self, offset: u64, len: u64) -> Option<(u64, u64, u64)> {
        let start = offset.max(self.lo);
        let end = (offset + len).min(self.hi);
        (start < end).then(|| (start, start - offset, end - start))
    }

    fn copy(&mut self, offset: u64, basis_offset: u64, len: u64) {
        let Some((offset, cut, len)) = self.clip(offset, len) else {
            return;
        };
        let basis_offset = basis_offset + cut;
        if let Some(Op::Copy {
            offset: o,
            basis_offset: b,
            len: l,
        }) = &mut self.pending
        {
            if *o + *l == offset && *b + *l == basis_offset {
                *l += len;
                return;
            }
        }
        self.flush();
        self.pending = Some(Op::Copy {
            offset,
            basis_offset,
            len,
        });
    }

    fn literal(&mut self, offset: u64, len: u64) {
        let Some((offset, _, len)) = self.clip(offset, len) else {
            return;
        };
        if let Some(Op::Literal { offset: o, len: l }) = &mut self.pending {
            if *o + *l == offset {
                *l += len;
                return;
            }
        }
        self.flush();
        self.pending = Some(Op::Literal { offset, len });
    }

    fn flush(&mut self) {
        if let Some(op) = self.pending.take() {
            (self.emit)(op);
        }
    }
}
