//! Which segments of a file sent whole hold no data at all: found from
//! the source's extents (`SEEK_DATA`, NBD block status) as the segments
//! are queued, one query per extent rather than one per segment, and sent
//! as one `Holes` message per run. A terabyte of holes is one message, not
//! 131,072 jobs each with its `Zero` and `SegmentDone`.

use ferry_link::layout;

use crate::endpoint::Source;

/// What to queue next for a file.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Item {
    /// A segment that holds data (or may: read it as usual).
    Seg(u64),
    /// Segments `first..first + count` hold no data.
    Holes(u64, u32),
}

/// The segments of a file of `size` bytes, in order, with the runs of
/// holes found along the way. A failed extent query ends the search: the
/// rest go as plain segments, whose reads then meet (and report) the
/// error.
pub(super) struct Plan<'a> {
    src: &'a dyn Source,
    size: u64,
    nseg: u64,
    /// The next segment to plan.
    next: u64,
    /// Segments below this are known to hold data (the extent found last
    /// reaches into them).
    data_until: u64,
}

impl<'a> Plan<'a> {
    pub(super) fn new(src: &'a dyn Source, size: u64) -> Self {
        Plan {
            src,
            size,
            nseg: layout::segment_count(size),
            next: 0,
            data_until: 0,
        }
    }
}

impl Iterator for Plan<'_> {
    type Item = Item;

    fn next(&mut self) -> Option<Item> {
        let seg = self.next;
        if seg >= self.nseg {
            return None;
        }
        if seg < self.data_until {
            self.next += 1;
            return Some(Item::Seg(seg));
        }
        let (start, _) = layout::segment_range(self.size, seg);
        let first_data = match self.src.next_data(start, self.size) {
            Ok(Some((d, e))) => {
                // Segments from the one holding `d` to the one holding the
                // extent's last byte have data: no need to ask again.
                self.data_until = (e.max(d + 1) - 1) / layout::SEGMENT + 1;
                d / layout::SEGMENT
            }
            Ok(None) => self.nseg,
            Err(_) => {
                self.data_until = self.nseg;
                seg
            }
        };
        // Segment numbers are 32-bit on the wire: a run ends below 2^32.
        if first_data > seg && seg < u32::MAX as u64 {
            let count = (first_data - seg).min(u32::MAX as u64 - seg);
            self.next = seg + count;
            return Some(Item::Holes(seg, count as u32));
        }
        self.next += 1;
        Some(Item::Seg(seg))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;
    use std::sync::atomic::{AtomicU32, Ordering};

    const SEG: u64 = layout::SEGMENT;

    /// A source made of data extents, counting the queries made of it.
    struct Extents(Vec<(u64, u64)>, AtomicU32, Option<u64>);

    impl Source for Extents {
        fn next_data(&self, pos: u64, end: u64) -> io::Result<Option<(u64, u64)>> {
            self.1.fetch_add(1, Ordering::Relaxed);
            if self.2.is_some_and(|at| pos >= at) {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
            Ok(self
                .0
                .iter()
                .find(|&&(_, e)| e > pos)
                .map(|&(s, e)| (s.max(pos), e.min(end)))
                .filter(|&(s, _)| s < end))
        }
        fn read_exact_at(&self, _: &mut [u8], _: u64) -> io::Result<()> {
            Ok(())
        }
        fn stamp(&self) -> io::Result<Option<(u64, (i64, u32))>> {
            Ok(None)
        }
    }

    fn plan(extents: &[(u64, u64)], size: u64, fail_at: Option<u64>) -> (Vec<Item>, u32) {
        let src = Extents(extents.to_vec(), AtomicU32::new(0), fail_at);
        let items = Plan::new(&src, size).collect();
        (items, src.1.load(Ordering::Relaxed))
    }

    #[test]
    fn a_sparse_file_is_its_data_segments_and_runs_of_holes() {
        // 1 TiB, 256 KiB of data every 256 MiB (the scale bench's image).
        let size = 1u64 << 40;
        let stride = 256 << 20;
        let ext: Vec<(u64, u64)> = (0..size / stride)
            .map(|i| (i * stride + 4096, i * stride + 4096 + (256 << 10)))
            .collect();
        let (items, queries) = plan(&ext, size, None);
        assert_eq!(items.len(), 2 * ext.len());
        assert_eq!(items[0], Item::Seg(0));
        assert_eq!(items[1], Item::Holes(1, 31));
        assert_eq!(items[2], Item::Seg(32));
        assert_eq!(*items.last().unwrap(), Item::Holes(size / SEG - 31, 31));
        // One query per extent, and one that finds the trailing hole.
        assert_eq!(queries as usize, ext.len() + 1);
    }

    #[test]
    fn every_segment_is_planned_once_in_order() {
        // An extent from the last byte of a segment across two more, one
        // ending on a boundary, a hole at the end, a short last segment.
        let size = 10 * SEG + 100;
        let ext = [
            (SEG - 1, 3 * SEG),
            (5 * SEG, 6 * SEG),
            (10 * SEG + 50, 10 * SEG + 60),
        ];
        let (items, _) = plan(&ext, size, None);
        use Item::*;
        assert_eq!(
            items,
            [
                Seg(0),
                Seg(1),
                Seg(2),
                Holes(3, 2),
                Seg(5),
                Holes(6, 4),
                Seg(10)
            ]
        );
        let (items, _) = plan(&[], size, None);
        assert_eq!(items, [Holes(0, 11)]);
        let (items, _) = plan(&[(0, size)], size, None);
        assert_eq!(items.len(), 11);
        assert!(plan(&[], 0, None).0.is_empty());
    }

    #[test]
    fn a_failed_query_leaves_the_rest_to_the_reads() {
        let size = 8 * SEG;
        let (items, _) = plan(&[(4 * SEG, 5 * SEG)], size, Some(4 * SEG + 1));
        use Item::*;
        assert_eq!(items, [Holes(0, 4), Seg(4), Seg(5), Seg(6), Seg(7)]);
    }
}
