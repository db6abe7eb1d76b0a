//! A file's way from first op to commit: whether an op fits its file
//! ([`op_fit`], [`in_order`]), which writer takes it ([`worker_index`]),
//! when all its segments are done ([`SegmentTally`]) and agree with the
//! sender ([`segment_check`], [`digest_check`]), what a failure leads to
//! ([`after_failure`]), what a `Copy` op may skip ([`known_run`]), and the
//! budgets of open files and segments ([`FileBudget`]).

use std::collections::{BTreeMap, BTreeSet};

use ferry_link::layout;

use crate::receiver::file::Failure;

/// Where an op of `len` bytes at `offset` lies in its file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OpFit {
    /// No bytes, within the file: says nothing, harmless.
    Empty,
    /// Within this one segment.
    Segment(u64),
    /// Past the end of the file or across a segment boundary.
    Outside,
}

/// Where the op of `len` bytes at `offset` lies in a file of `size` bytes.
pub(crate) fn op_fit(offset: u64, len: u64, size: u64) -> OpFit {
    let seg = offset / layout::SEGMENT;
    if len == 0 && offset <= size {
        return OpFit::Empty;
    }
    let inside = offset
        .checked_add(len)
        .is_some_and(|end| end <= size && (end - 1) / layout::SEGMENT == seg);
    if inside {
        OpFit::Segment(seg)
    } else {
        OpFit::Outside
    }
}

/// A segment's ops must come in order, without gaps or overlaps: the op at
/// `off` must start where the last one ended (`next`) and end within the
/// file of `size` bytes.
pub(crate) fn in_order(next: u64, off: u64, len: u64, size: u64) -> bool {
    off == next && off.checked_add(len).is_some_and(|end| end <= size)
}

/// The writer (of `n`) that takes segment `seg` of file `file`. All ops of
/// a segment go to one writer; a file written through the page cache keeps
/// all its segments on one writer (writers would serialise on the inode's
/// lock), one written directly (`spread`) spreads them over all.
/// Consecutive files take the writers in turn; a direct file's segments
/// are mixed through every bit of the key (SplitMix64's finaliser) first:
/// a sparse image's data often sits at a power-of-two stride of segments,
/// which a plain multiply sends to one writer.
pub(crate) fn worker_index(file: u32, seg: u64, spread: bool, n: usize) -> usize {
    let n = n.max(1) as u64;
    let key = if spread {
        mix64(((file as u64) << 32) ^ seg)
    } else {
        file as u64
    };
    (key % n) as usize
}

/// SplitMix64's output function: every input bit reaches every output bit.
fn mix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A `SegmentDone` the file cannot take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SegmentError {
    /// The file has no such segment.
    OutOfRange,
    /// The segment was finished before.
    Twice,
    /// A run of holes names a segment that got ops and is not finished.
    Started,
}

/// The segments of one file the sender has finished.
#[derive(Debug)]
pub(crate) struct SegmentTally {
    nseg: u64,
    /// Finished segments as disjoint, non-adjacent runs: start -> end
    /// (exclusive). One entry per message at most, however many segments
    /// a `Holes` names.
    runs: BTreeMap<u64, u64>,
    done: u64,
    /// Segments that got ops and are not finished yet (at most as many
    /// as the writers keep open, [`MAX_OPEN_SEGMENTS`]).
    started: BTreeSet<u32>,
}

impl SegmentTally {
    /// A file of `nseg` segments, none finished.
    pub(crate) fn new(nseg: u64) -> SegmentTally {
        SegmentTally {
            nseg,
            runs: BTreeMap::new(),
            done: 0,
            started: BTreeSet::new(),
        }
    }

    /// An op for segment `seg` (within the file) came: refused once the
    /// segment is finished.
    pub(crate) fn start(&mut self, seg: u32) -> Result<(), SegmentError> {
        if self.finished(seg as u64) {
            return Err(SegmentError::Twice);
        }
        self.started.insert(seg);
        Ok(())
    }

    /// The sender finished `seg`: `Ok(true)` when it was the last one.
    #[cfg(test)]
    pub(crate) fn finish(&mut self, seg: u32) -> Result<bool, SegmentError> {
        self.finish_run(seg, 1, false)
    }

    /// The sender finished segments `first..first + count` at once: all
    /// or none are taken; `holes` (a `Holes` run): none of them may have
    /// got ops. `Ok(true)` when they were the last ones.
    pub(crate) fn finish_run(
        &mut self,
        first: u32,
        count: u32,
        holes: bool,
    ) -> Result<bool, SegmentError> {
        let (s, e) = (first as u64, first as u64 + count as u64);
        if count == 0 || e > self.nseg {
            return Err(SegmentError::OutOfRange);
        }
        let run = s..e;
        if holes
            && self
                .started
                .range(first..)
                .next()
                .is_some_and(|&g| run.contains(&(g as u64)))
        {
            return Err(SegmentError::Started);
        }
        let before = self.runs.range(..e).next_back().map(|(&a, &b)| (a, b));
        if before.is_some_and(|(_, b)| b > s) {
            return Err(SegmentError::Twice);
        }
        let (mut start, mut end) = (s, e);
        if let Some((a, _)) = before.filter(|&(_, b)| b == s) {
            self.runs.remove(&a);
            start = a;
        }
        if let Some(b) = self.runs.remove(&e) {
            end = b;
        }
        self.runs.insert(start, end);
        self.done += count as u64;
        if !holes {
            self.started.remove(&first);
        }
        Ok(self.done >= self.nseg)
    }

    /// Whether segment `seg` is finished (no more data may come for it).
    pub(crate) fn finished(&self, seg: u64) -> bool {
        self.runs
            .range(..=seg)
            .next_back()
            .is_some_and(|(_, &end)| seg < end)
    }
}

/// A segment is complete when its ops reached its end; `reached` is where
/// they ended (`None`: no op came).
pub(crate) fn segment_check(reached: Option<u64>, start: u64, end: u64) -> Result<(), Failure> {
    if reached == Some(end) {
        Ok(())
    } else {
        Err(Failure::Other(format!(
            "incomplete data for bytes {start}..{end}"
        )))
    }
}

/// What was written must hash as the sender's copy did.
pub(crate) fn digest_check(
    got: &[u8; 32],
    want: &[u8; 32],
    start: u64,
    end: u64,
) -> Result<(), Failure> {
    if got == want {
        Ok(())
    } else {
        Err(Failure::Mismatch(format!(
            "verification failed: bytes {start}..{end} differ from the source"
        )))
    }
}

/// What a file that failed comes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AfterFailure {
    /// Asked for again, whole, in this session.
    RetryWhole,
    /// Counted and reported as failed; the old file stays.
    Fail,
}

/// A delta that did not reproduce the source (the old copy or the source
/// changed under it) is asked for again whole; any other failure, and a
/// whole file that does not verify, is a failed file.
pub(crate) fn after_failure(why: &Failure, was_delta: bool) -> AfterFailure {
    match why {
        Failure::Mismatch(_) if was_delta => AfterFailure::RetryWhole,
        _ => AfterFailure::Fail,
    }
}

/// Where a `Copy` op stands, for [`known_run`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct CopyAt {
    /// Offset in the new file.
    pub(crate) off: u64,
    /// Offset in the old copy.
    pub(crate) boff: u64,
    /// Bytes left to copy.
    pub(crate) len: u64,
    /// The delta block size.
    pub(crate) bs: u64,
    /// The new file's size.
    pub(crate) size: u64,
    /// The old copy's size.
    pub(crate) basis_size: u64,
    /// Old-copy blocks whose hashes are known so far (signed in order).
    pub(crate) known: usize,
    /// Segments are verified and both the digest and the cache signature
    /// stand at a block boundary.
    pub(crate) aligned: bool,
}

/// How many whole delta blocks of a `Copy` op can be taken on the old
/// copy's known block hashes instead of being read and hashed: blocks
/// whole on both grids, within the new file's segment, the new file and
/// the old copy, and already signed.
pub(crate) fn known_run(c: CopyAt) -> u64 {
    let bs = c.bs;
    if !c.aligned || bs == 0 || !c.off.is_multiple_of(bs) || !c.boff.is_multiple_of(bs) {
        return 0;
    }
    let seg_end = (c.off / layout::SEGMENT + 1) * layout::SEGMENT;
    let limit = c
        .len
        .min(seg_end - c.off)
        .min(c.basis_size.saturating_sub(c.boff))
        .min(c.size.saturating_sub(c.off));
    let first = (c.boff / bs) as usize;
    (limit / bs).min(c.known.saturating_sub(first) as u64)
}

/// A `Copy` writes unless it copies a file written in place onto itself
/// (its bytes are still read: the segment digest covers them).
pub(crate) fn copy_writes(in_place: bool, off: u64, boff: u64) -> bool {
    !(in_place && off == boff)
}

/// A `Zero` op writes zeros unless the file is a new temporary file,
/// created sized and full of holes. A partial file being resumed is a
/// temporary file, but its segments that were not kept hold whatever the
/// interrupted run (or anyone since) left there: zeros must be written.
pub(crate) fn zeros_written(temp: bool, resumed: bool) -> bool {
    !temp || resumed
}

/// Segments one writer may have open at once. A sender has one segment
/// per worker in flight (and a few sent early), so more is a peer driving
/// this side's memory: a protocol error.
pub(crate) const MAX_OPEN_SEGMENTS: usize = 1024;

/// Segment assembly buffers (8 MiB each) all writers together may hold; a
/// segment opened beyond that is written through the page cache instead.
pub(crate) const MAX_SEGMENT_BUFFERS: usize = 16;

/// A writer with `open` segments may open another.
pub(crate) fn may_open_segment(open: usize) -> bool {
    open < MAX_OPEN_SEGMENTS
}

/// Assemble a new segment in a buffer for one direct write: while direct
/// writes work for the file and the writer (one of `threads`) holds fewer
/// than its share of [`MAX_SEGMENT_BUFFERS`] (at least one).
pub(crate) fn buffer_segment(direct_ok: bool, buffers: usize, threads: usize) -> bool {
    let share = (MAX_SEGMENT_BUFFERS / threads.max(1)).max(1);
    direct_ok && buffers < share
}

/// How many files may be open for writing at once: each holds a temp file,
/// its direct twin, an old copy and (shared with its siblings) its parent
/// directory's handle, and the file list runs far ahead of the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FileBudget {
    max: usize,
}

impl FileBudget {
    /// A quarter of the open-file limit (`None`: unlimited), less a margin
    /// for everything else (the warmers of both sides of a local run hold
    /// up to 17 of it), and from 4 to 4096. The destination's cached
    /// directory handles (up to 64) come on top; the CLI raises the soft
    /// limit to the hard one first, which leaves room for them.
    pub(crate) fn from_nofile(limit: Option<u64>) -> FileBudget {
        let limit = limit.unwrap_or(u64::MAX);
        FileBudget {
            max: (limit.saturating_sub(64) / 4).clamp(4, 4096) as usize,
        }
    }

    pub(crate) fn max(self) -> usize {
        self.max
    }

    /// Of `open` files, those that hold a place: once the budget is
    /// reached, the `stuck` ones (whose old copy could not be signed: no
    /// data will come for them) are not counted. `stuck` is only asked
    /// then.
    pub(crate) fn holding(self, open: usize, stuck: impl FnOnce() -> usize) -> usize {
        if open < self.max {
            return open;
        }
        open.saturating_sub(stuck())
    }

    /// Another file may be opened while `holding` files hold places.
    pub(crate) fn has_room(self, holding: usize) -> bool {
        holding < self.max
    }

    /// A newly listed file waits behind the `queued` ones (list order) or
    /// for a place.
    pub(crate) fn must_wait(self, queued: usize, holding: usize) -> bool {
        queued > 0 || !self.has_room(holding)
    }
}

/// Entries between two `Decided` messages: the sender's list runs up to
/// 65,536 entries ahead of the last one (`sender::credit`).
pub(crate) const DECIDED_EVERY: u32 = 1024;

/// Whether to tell the sender that every entry below `below` is decided,
/// the last `Decided` having said `sent`.
pub(crate) fn decided_due(below: u32, sent: u32) -> bool {
    below >= sent.saturating_add(DECIDED_EVERY)
}

/// Answer the sender's `EndOfList` (no `Want` may follow it): once it
/// came (`held`), no file waits to be asked for, no delta is unfinished
/// (one may fail and be asked for again) and no retry is queued.
pub(crate) fn may_end_list(held: bool, waiting: usize, deltas: u64, retrying: bool) -> bool {
    held && waiting == 0 && deltas == 0 && !retrying
}

#[cfg(test)]
mod tests;
