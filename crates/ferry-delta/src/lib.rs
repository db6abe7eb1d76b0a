//! ferry's delta engine: the pure algorithms.
//!
//! When the destination holds an old copy of a file (the *basis*), the
//! receiver sends a block [`Signature`] of it; the sender diffs the new file
//! (the *source*) against it segment by segment and sends only what the
//! basis lacks, as [`Op::Literal`]s between [`Op::Copy`]s. This crate does
//! the hashing, indexing and matching; it knows nothing of the protocol.
//!
//! # Signature
//!
//! The basis is cut on the *source's* grid (`block_size =
//! ferry_link::layout::grid_block(source_size)`, passed in by the caller),
//! so aligned blocks of the two files line up. Per block it holds a rolling
//! [`weak_hash`] (see [`weak`] for why a 64-bit polynomial and not rsync's
//! Adler sum or buzhash) and the first 16 bytes of
//! `ferry_link::layout::block_hash` (blake3; the zero-block constant for
//! all-zero blocks). [`signature_of_file`] also returns the full 32-byte
//! hashes, which are the receiver's segment digests' inputs, so reading the
//! basis once serves both the delta and the end-to-end check. It reads with
//! `pread` in ~4 MiB runs on `threads` workers over contiguous ranges, and
//! blocks wholly inside holes (`SEEK_DATA`/`SEEK_HOLE`) get the zero hashes
//! without being read. [`SigCache`] keeps signatures between runs, keyed by
//! path, size, mtime, inode and block size.
//!
//! # Matching
//!
//! [`Matcher::new`] indexes the signature by weak hash: a bucket array on
//! the high bits of the spread weak hash, entries `(weak, block)` grouped by
//! bucket. All-zero blocks are left out (the sender sends zero runs as
//! such), blocks with equal contents are indexed once, and at most
//! [`MAX_CANDIDATES`] blocks share a weak value, so the work per byte is
//! bounded however repetitive the basis.
//!
//! [`Matcher::diff`] walks one segment (up to 8 MiB, starting on the block
//! grid) and keeps an *expected basis position* for the next byte:
//!
//! 1. **Aligned fast path.** At first the expectation is the same offset:
//!    source block `k` is compared with basis block `k` by strong hash
//!    alone. For VM images and databases, which change in place, this is
//!    nearly every block, and it costs one blake3 per block and no rolling
//!    (none at all with [`Matcher::diff_with_hashes`], which reuses the
//!    hashes the sender computes for the segment digest).
//! 2. **Rolling search.** Where the expectation fails, a window of one block
//!    rolls byte by byte from there. At every position the index is probed
//!    with the weak hash; the strong hash is computed only on a weak hit.
//!    Whenever the window sits on the source grid it is also compared with
//!    the basis block of the same index (a weak compare first), so after an
//!    in-place overwrite the search falls back into the aligned phase as
//!    soon as the overwrite ends.
//! 3. **Follow the new phase.** After any match at basis block `j`, the
//!    expectation becomes block `j + 1` right after it: one strong check,
//!    no rolling. A shifted file (bytes inserted or deleted) therefore costs
//!    one rolling search of at most a block plus the shift per segment, and
//!    is then matched block by block at the new phase, so inserting 7 bytes
//!    near the start of a 1 GiB file costs kilobytes of literals, not the
//!    file. When the followed block fails, the aligned block of the same
//!    index is tried too before rolling.
//!
//! Weak hits whose strong hash differs are budgeted per segment (four per
//! block of data), so a crafted signature cannot make matching quadratic:
//! past the budget the rest is sent as literals, which is always correct.
//! Copies contiguous in both files are merged into one op.
//!
//! Segments are diffed independently (and in parallel), so a match cannot
//! be followed from one segment into the next. With [`Matcher::diff`] a
//! shifted file therefore loses about one block per segment end (the last
//! window does not fit): 8 KiB per 8 MiB, 0.1%. [`Matcher::diff_range`]
//! takes one block of context on each side of the segment, lets matches
//! start before or end after it, and clips the ops to the segment: then a
//! 7-byte insert costs the block it lands in plus 7 bytes, in total.
//! All-zero source blocks never become copies; they come out in literals,
//! which the caller scans for zero runs as it does for whole transfers.
//! They are also never rolled over: a zero block met while synchronised is
//! passed with the phase kept, and one met on the grid while rolling ends
//! the search, so the zero runs of a sparse image cost a zero check only.
//!
//! # Wiring (for the transfer engine)
//!
//! * Receiver, holding a basis of `basis_size` bytes for a source of
//!   `size` bytes: `bs = grid_block(size)`; look in [`SigCache`] with a
//!   [`CacheKey`] of the basis's path, size, mtime, inode and `bs`, else
//!   [`signature_of_file`]`(&basis, basis_size, bs, threads)` and `put`;
//!   send the signature in `Message::Signature` parts; keep the full
//!   hashes for verification.
//! * Sender: assemble the parts with [`Signature::receiving`] and
//!   [`Signature::extend_part`] (bounded by the claimed basis size), check
//!   [`Signature::is_consistent`] and that `block_size` is `grid_block(size)`,
//!   build one [`Matcher`] per file and share it between segment workers.
//!   For each segment read `[start - bs, end + bs)` clamped to the file and
//!   call [`Matcher::diff_range`] with the segment's place in that buffer
//!   (or [`Matcher::diff`] on the bare segment). `Copy` ops become `Copy`
//!   messages; `Literal` ranges are scanned for zero grains and sent as
//!   `Zero`/`Data`, as in a whole-file transfer. The segment digest is
//!   computed over the source bytes as always.

pub mod apply;
pub mod cache;
pub mod matcher;
pub mod sig;
pub mod weak;

pub use apply::apply_to_vec;
pub use cache::{CacheKey, SigCache};
pub use matcher::{Matcher, Op, MAX_CANDIDATES};
pub use sig::{
    sign_file_in_order, signature_of_bytes, signature_of_file, Basis, PartError, Signature,
};
pub use weak::{weak_hash, zero_weak, Roller};

#[cfg(test)]
mod tests;
