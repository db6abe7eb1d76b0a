//! Delta sending: a segment diffed against the receiver's signature (read
//! with a block of context on each side, or only where the pre-hash found
//! blocks changed), or sent early from the pre-hash alone, as ops (see
//! `ops`). Digests are on the delta grid.

use ferry_link::{layout, Message, MsgTx};

use crate::early::EarlySeg;
use crate::endpoint::Source;
use crate::error::{Error, Result};

use super::ops::{literal, send_ops};
use super::{DeltaJob, Job};

/// Send one segment as a delta: read it with a block of context on each
/// side, diff it against the receiver's signature, send copies as `Copy`
/// and literals as data and zero runs. Returns the segment digest, or the
/// read error.
pub(super) fn send_delta_segment(
    job: &Job,
    file: &dyn Source,
    d: &DeltaJob,
    tx: &MsgTx,
    buf: &mut Vec<u8>,
) -> Result<std::io::Result<[u8; 32]>> {
    let size = job.file.size;
    let bs = d.matcher.block_size();
    let (start, end) = layout::segment_range(size, job.seg);
    if let Some(known) = job.file.prehash.hashes_for(start / bs, end.div_ceil(bs)) {
        return send_prehashed_segment(job, file, d, tx, buf, known);
    }
    let lo = start.saturating_sub(bs);
    let hi = (end + bs).min(size);
    buf.clear();
    buf.resize((hi - lo) as usize, 0);
    if let Err(e) = file.read_exact_at(buf, lo) {
        return Ok(Err(e));
    }
    let range = (start - lo) as usize..(end - lo) as usize;
    // Deltas digest on the delta grid (see the receiver's known blocks).
    // The block hashes serve twice: for the segment digest, and for the
    // matcher's strong checks at block offsets (one BLAKE3 pass, not two).
    let hashes: Vec<[u8; 32]> = buf.chunks(bs as usize).map(layout::block_hash).collect();
    let mut h = layout::SegmentHasher::new(bs);
    let first = range.start / bs as usize;
    let last = range.end.div_ceil(bs as usize);
    for b in &hashes[first..last] {
        h.known_block(*b);
    }
    let mut ops = Vec::new();
    d.matcher
        .diff_range(buf, lo, range, Some(&hashes), &mut |op| ops.push(op));
    send_ops(job.id, d.inplace, tx, ops, buf, lo)?;
    Ok(Ok(h.finish().0))
}

/// A segment sent before the signature is complete (see [`crate::early`]):
/// blocks in place as copies, the others read and sent as literals.
pub(super) fn send_early_segment(
    job: &Job,
    file: &dyn Source,
    e: &EarlySeg,
    tx: &MsgTx,
    buf: &mut Vec<u8>,
) -> Result<std::io::Result<[u8; 32]>> {
    let bs = layout::delta_block(job.file.size);
    let k0 = layout::segment_range(job.file.size, job.seg).0 / bs;
    let same = |k: u64| e.same[(k - k0) as usize];
    send_in_place_runs(job, file, bs, &same, (k0, &e.hashes), None, tx, buf)
}

/// [`send_delta_segment`] with the file's block hashes known: blocks that
/// match the old copy in place become copies without being read; only the
/// runs of other blocks are read (with a block of context on each side, as
/// a whole segment is) and diffed.
fn send_prehashed_segment(
    job: &Job,
    file: &dyn Source,
    d: &DeltaJob,
    tx: &MsgTx,
    buf: &mut Vec<u8>,
    (first, known): (u64, Vec<[u8; 32]>),
) -> Result<std::io::Result<[u8; 32]>> {
    let size = job.file.size;
    let bs = d.matcher.block_size();
    let block_len = |k: u64| (size - k * bs).min(bs);
    let same = |k: u64| {
        d.matcher
            .aligned_match(k, block_len(k), &known[(k - first) as usize])
    };
    send_in_place_runs(job, file, bs, &same, (first, &known), Some(d), tx, buf)
}

/// Maximal runs of blocks in `[k0, k1)` for which `same` agrees: `(start,
/// end, same)` for each, in order, `same` asked as the runs are walked.
fn block_runs(
    k0: u64,
    k1: u64,
    same: &dyn Fn(u64) -> bool,
) -> impl Iterator<Item = (u64, u64, bool)> + '_ {
    let mut k = k0;
    std::iter::from_fn(move || {
        if k >= k1 {
            return None;
        }
        let start = k;
        let s = same(k);
        while k < k1 && same(k) == s {
            k += 1;
        }
        Some((start, k, s))
    })
}

/// The copy of the run of blocks `[a, b)` from the same offset of the old
/// copy, ending with the segment (at `end`).
fn in_place_copy(id: u32, (a, b): (u64, u64), bs: u64, end: u64) -> Message {
    let offset = a * bs;
    Message::Copy {
        file: id,
        offset,
        basis_offset: offset,
        len: (b * bs).min(end) - offset,
    }
}

/// The blocks read for the changed run `[a, b)` of a file of `size` bytes:
/// to `diff`, a block of context on each side (a moved block may straddle
/// the run's edge), within the file; else the run itself.
fn diff_window((a, b): (u64, u64), size: u64, bs: u64, diff: bool) -> (u64, u64) {
    if diff {
        (a.saturating_sub(1), (b + 1).min(size.div_ceil(bs)))
    } else {
        (a, b)
    }
}

/// Send a segment whose blocks' hashes are known (`hashes.1[i]` is block
/// `hashes.0 + i`, covering at least the segment): runs of blocks for which
/// `same` holds as in-place copies, unread; the other runs read and, with
/// `d`, diffed with a block of context on each side, else sent as literals.
/// Returns the segment digest, or the read error.
#[allow(clippy::too_many_arguments)]
fn send_in_place_runs(
    job: &Job,
    file: &dyn Source,
    bs: u64,
    same: &dyn Fn(u64) -> bool,
    (first, hashes): (u64, &[[u8; 32]]),
    d: Option<&DeltaJob>,
    tx: &MsgTx,
    buf: &mut Vec<u8>,
) -> Result<std::io::Result<[u8; 32]>> {
    let size = job.file.size;
    let (start, end) = layout::segment_range(size, job.seg);
    let (k0, k1) = (start / bs, end.div_ceil(bs));
    let hash_of = |k: u64| hashes.get(k.wrapping_sub(first) as usize);
    let mut h = layout::SegmentHasher::new(bs);
    for k in k0..k1 {
        match hash_of(k) {
            Some(b) => h.known_block(*b),
            None => return Err(Error::Protocol("segment hashes missing".into())),
        }
    }
    let inplace = d.is_none_or(|d| d.inplace);
    for (run_start, k, in_place) in block_runs(k0, k1, same) {
        if in_place {
            tx.send(in_place_copy(job.id, (run_start, k), bs, end))?;
            continue;
        }
        // Blocks [run_start, k) changed: with a matcher, diff them with
        // their neighbours; else send them as they are.
        let (lo_k, hi_k) = diff_window((run_start, k), size, bs, d.is_some());
        let (lo, hi) = (lo_k * bs, (hi_k * bs).min(size));
        let data = crate::direct::aligned(buf, (hi - lo) as usize);
        if let Err(e) = file.read_exact_at(data, lo) {
            return Ok(Err(e));
        }
        let range = ((run_start - lo_k) * bs) as usize..((k * bs).min(end) - lo) as usize;
        let mut ops = Vec::new();
        match d {
            Some(d) => {
                let known = hashes
                    .get(lo_k.saturating_sub(first) as usize..hi_k.saturating_sub(first) as usize);
                d.matcher.diff_range(
                    data,
                    lo,
                    range,
                    known.filter(|_| lo_k >= first),
                    &mut |op| ops.push(op),
                );
            }
            None => ops.push(literal(lo, range)),
        }
        send_ops(job.id, inplace, tx, ops, data, lo)?;
    }
    Ok(Ok(h.finish().0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(k0: u64, same: &[bool]) -> Vec<(u64, u64, bool)> {
        let f = |k: u64| same[(k - k0) as usize];
        block_runs(k0, k0 + same.len() as u64, &f).collect()
    }

    #[test]
    fn blocks_split_into_maximal_runs() {
        assert_eq!(
            runs(10, &[true, true, false, true, false, false]),
            [
                (10, 12, true),
                (12, 13, false),
                (13, 14, true),
                (14, 16, false)
            ]
        );
        assert_eq!(runs(0, &[false; 4]), [(0, 4, false)]);
        assert_eq!(runs(5, &[true]), [(5, 6, true)]);
        assert_eq!(runs(3, &[]), []);
    }

    #[test]
    fn an_in_place_run_ends_with_its_segment() {
        let bs = 64 << 10;
        let m = in_place_copy(4, (2, 5), bs, 10 * bs);
        assert_eq!(
            m,
            Message::Copy {
                file: 4,
                offset: 2 * bs,
                basis_offset: 2 * bs,
                len: 3 * bs
            }
        );
        // The file's last block is short: the copy stops at its end.
        let m = in_place_copy(4, (8, 10), bs, 9 * bs + 100);
        assert_eq!(
            m,
            Message::Copy {
                file: 4,
                offset: 8 * bs,
                basis_offset: 8 * bs,
                len: bs + 100
            }
        );
    }

    #[test]
    fn a_changed_run_is_diffed_with_a_block_of_context_within_the_file() {
        let bs = 8 << 10;
        let size = 10 * bs + 1; // 11 blocks, the last one byte long
        assert_eq!(diff_window((3, 5), size, bs, true), (2, 6));
        assert_eq!(diff_window((0, 2), size, bs, true), (0, 3));
        assert_eq!(diff_window((9, 11), size, bs, true), (8, 11));
        // Sent as literals (early): exactly the run.
        assert_eq!(diff_window((3, 5), size, bs, false), (3, 5));
        assert_eq!(diff_window((0, 11), size, bs, false), (0, 11));
    }
}
