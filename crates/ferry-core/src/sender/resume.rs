//! A receiver resuming a partial file (`Want` with
//! [`ferry_link::WantMode::Resume`]) lists what it holds in `Have` parts;
//! each segment is queued as its part arrives, and a segment it holds is
//! read and digested here and sent only if the source's digest differs.

use std::ops::Range;
use std::sync::Arc;

use ferry_link::{layout, HavePart, LinkError, MsgTx};

use crate::endpoint::Source;
use crate::error::Result;
use crate::scan::{self, ScanError};

use super::{whole, Held, Job, SrcFile};

/// A file being resumed, until its `Have` list is complete.
pub(super) struct Resuming {
    pub(super) file: Arc<SrcFile>,
    /// Asked for with [`ferry_link::WantMode::Check`]: final, forgotten
    /// once sent.
    pub(super) check: bool,
    /// Segments below this are queued.
    upto: u64,
    nseg: u64,
}

impl Resuming {
    pub(super) fn new(file: Arc<SrcFile>, check: bool) -> Self {
        let nseg = layout::segment_count(file.size);
        Self {
            file,
            check,
            upto: 0,
            nseg,
        }
    }

    /// Take the next part: the segments it describes, or why it breaks the
    /// protocol (each part must reach further, no further than the file's
    /// end, and list only segments it describes).
    pub(super) fn advance(&mut self, part: &HavePart) -> std::result::Result<Range<u64>, String> {
        let (from, to) = (self.upto, part.upto);
        next_range(from, to, self.nseg, part.kept.first().map(|k| k.0))?;
        self.upto = to;
        Ok(from..to)
    }

    /// The list has reached the file's end.
    pub(super) fn complete(&self) -> bool {
        self.upto == self.nseg
    }
}

/// Checks a part that goes from `from` to `to` of `nseg` segments, whose
/// first kept segment is `first`. (The decoder has checked that the kept
/// segments increase and lie below `to`.)
fn next_range(
    from: u64,
    to: u64,
    nseg: u64,
    first: Option<u64>,
) -> std::result::Result<(), String> {
    if to <= from || to > nseg {
        return Err(format!("segments up to {to} after {from}, of {nseg}"));
    }
    if first.is_some_and(|s| s < from) {
        return Err(format!("segment listed again below {from}"));
    }
    Ok(())
}

/// `a` and `b` alternated, the rest of the longer one after.
pub(super) fn interleave(a: &[u64], b: &[u64]) -> Vec<u64> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    for i in 0..a.len().max(b.len()) {
        out.extend(a.get(i));
        out.extend(b.get(i));
    }
    out
}

/// What the part's kept list says of segment `seg`.
pub(super) fn held_of(kept: &[(u64, [u8; 32])], seg: u64) -> Held {
    match kept.binary_search_by_key(&seg, |k| k.0) {
        Ok(i) => Held::Kept(kept[i].1),
        Err(_) => Held::Missing,
    }
}

/// A segment the receiver holds with digest `have` (zeros: a digest it
/// did not record): read and digested; nothing is sent but its
/// `SegmentDone` unless the receiver's digest is known and differs, when
/// it goes whole. The receiver reads its copy back and checks it against
/// that `SegmentDone`. A segment sent whole leaves its last op in `held`
/// (see [`whole::send_whole_segment`]).
pub(super) fn send_held_segment(
    job: &Job,
    file: &dyn Source,
    have: [u8; 32],
    tx: &MsgTx,
    buf: &mut Vec<u8>,
    held: &std::cell::Cell<Option<ferry_link::Message>>,
) -> Result<std::io::Result<[u8; 32]>> {
    let res =
        scan::scan_segment::<LinkError>(file, job.file.size, job.seg, true, buf, &mut |_| Ok(()));
    match res {
        Ok(d) if d == have || have == [0; 32] => Ok(Ok(d)),
        Ok(_) => whole::send_whole_segment(job, file, true, tx, buf, held),
        Err(ScanError::Emit(e)) => Err(e.into()),
        Err(ScanError::Io(e)) => Ok(Err(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_part_must_reach_further_within_the_file() {
        assert!(next_range(0, 8, 20, Some(0)).is_ok());
        assert!(next_range(8, 20, 20, None).is_ok());
        assert!(next_range(8, 8, 20, None).is_err(), "no progress");
        assert!(next_range(8, 4, 20, None).is_err(), "backwards");
        assert!(next_range(8, 21, 20, None).is_err(), "past the end");
        assert!(
            next_range(8, 12, 20, Some(7)).is_err(),
            "below the last part"
        );
    }

    #[test]
    fn missing_and_held_segments_alternate() {
        assert_eq!(interleave(&[5, 6, 7], &[0, 1]), [5, 0, 6, 1, 7]);
        assert_eq!(interleave(&[], &[0, 1]), [0, 1]);
        assert_eq!(interleave(&[3], &[]), [3]);
    }

    #[test]
    fn segments_not_listed_are_missing() {
        let kept = [(1, [1; 32]), (4, [4; 32])];
        assert_eq!(held_of(&kept, 1), Held::Kept([1; 32]));
        assert_eq!(held_of(&kept, 4), Held::Kept([4; 32]));
        assert_eq!(held_of(&kept, 0), Held::Missing);
        assert_eq!(held_of(&kept, 2), Held::Missing);
        assert_eq!(held_of(&[], 2), Held::Missing);
    }

    #[test]
    fn a_list_is_complete_at_the_files_end() {
        let mut r = Resuming {
            file: Arc::new(SrcFile::listed(
                "f".into(),
                20 << 20,
                (0, 0),
                (0, 0),
                super::super::open::Reach::Named { follow: false },
            )),
            check: false,
            upto: 0,
            nseg: 3,
        };
        let part = |upto, kept: Vec<(u64, [u8; 32])>| HavePart {
            file: 1,
            upto,
            kept,
        };
        assert_eq!(r.advance(&part(2, vec![(1, [0; 32])])).unwrap(), 0..2);
        assert!(!r.complete());
        assert!(r.advance(&part(2, vec![])).is_err());
        assert_eq!(r.advance(&part(3, vec![])).unwrap(), 2..3);
        assert!(r.complete());
    }
}
