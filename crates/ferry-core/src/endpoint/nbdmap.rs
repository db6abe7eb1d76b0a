//! The allocation maps of an NBD export's regions, as BLOCK_STATUS gave
//! them, kept for the readers that come after the one that asked.
//!
//! The sender plans a file's holes region by region before its workers
//! read the segments with data, and every worker asks where the data of
//! its segment is. With one map kept, the planner and the workers
//! replaced it in turn: a 1 TiB export with one extent per 256 MiB
//! region asked for each region's map twice or more, each time with the
//! map locked against every other reader for the round trip. Kept here,
//! a region is asked for once, and a lookup holds the lock only to clone
//! an `Arc`.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use ferry_nbd::Extent;

/// Bytes of the export whose allocation is asked for at once, from a
/// multiple of this.
pub(super) const REGION: u64 = 256 << 20;

/// Extents kept over all regions (about 12 MiB of them): regions asked for
/// first are dropped first beyond this, and are asked for again if read.
const KEEP_EXTENTS: usize = 1 << 19;

/// One region's map: contiguous extents from `start` to `end`.
pub(super) struct Map {
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) exts: Vec<Extent>,
}

impl Map {
    /// The map of the extents `exts` (contiguous, non-empty) returned for
    /// a query from `start`: it ends where they do, which may be before
    /// the end of the region (see [`ferry_nbd::MAX_EXTENTS`]).
    pub(super) fn new(start: u64, exts: Vec<Extent>) -> Option<Map> {
        let end = exts.last().map(|e| e.offset + e.len)?;
        (end > start).then_some(Map { start, end, exts })
    }

    /// The first data at or after `pos` and before `end`, within the map
    /// (which must hold `pos`): its start and where it stops being data,
    /// at `end` or the map's end at the latest. `Err(next)`: no data
    /// before `next`, the map's end or `end`.
    pub(super) fn first_data(&self, pos: u64, end: u64) -> Result<(u64, u64), u64> {
        let stop = end.min(self.end);
        // The first extent that ends after `pos`.
        let from = self.exts.partition_point(|x| x.offset + x.len <= pos);
        let mut start = None;
        for x in &self.exts[from..] {
            let (a, b) = (x.offset.max(pos), (x.offset + x.len).min(stop));
            if a >= b {
                break;
            }
            match (start, x.skippable()) {
                (None, false) => start = Some(a),
                (Some(s), true) => return Ok((s, a)),
                _ => {}
            }
        }
        match start {
            Some(s) => Ok((s, stop)),
            None => Err(stop),
        }
    }
}

/// The maps kept, by start, and the order they came in.
#[derive(Default)]
pub(super) struct Maps {
    by_start: BTreeMap<u64, Arc<Map>>,
    order: VecDeque<u64>,
    extents: usize,
}

impl Maps {
    /// The kept map that holds `pos`.
    pub(super) fn get(&self, pos: u64) -> Option<Arc<Map>> {
        let (_, m) = self.by_start.range(..=pos).next_back()?;
        (pos < m.end).then(|| m.clone())
    }

    /// Keep `m` (replacing a map from the same start), dropping the
    /// oldest maps while more than [`KEEP_EXTENTS`] extents are kept.
    pub(super) fn keep(&mut self, m: Arc<Map>) {
        if let Some(old) = self.by_start.insert(m.start, m.clone()) {
            self.extents -= old.exts.len();
            self.order.retain(|&s| s != m.start);
        }
        self.extents += m.exts.len();
        self.order.push_back(m.start);
        while self.extents > KEEP_EXTENTS && self.order.len() > 1 {
            let Some(s) = self.order.pop_front() else {
                break;
            };
            if let Some(old) = self.by_start.remove(&s) {
                self.extents -= old.exts.len();
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_start.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(offset: u64, len: u64, skip: bool) -> Extent {
        Extent {
            offset,
            len,
            hole: skip,
            zero: false,
        }
    }

    fn map(start: u64, exts: Vec<Extent>) -> Arc<Map> {
        Arc::new(Map::new(start, exts).expect("a map"))
    }

    #[test]
    fn one_region_map_answers_every_segment_in_it() {
        // 0..10 hole, 10..30 data, 30..50 zero, 50..60 data, 60..100 hole.
        let map = map(
            0,
            vec![
                ext(0, 10, true),
                ext(10, 20, false),
                Extent {
                    offset: 30,
                    len: 20,
                    hole: false,
                    zero: true,
                },
                ext(50, 10, false),
                ext(60, 40, true),
            ],
        );
        assert_eq!(map.first_data(0, 100), Ok((10, 30)));
        assert_eq!(map.first_data(15, 100), Ok((15, 30)));
        assert_eq!(map.first_data(30, 100), Ok((50, 60)));
        assert_eq!(map.first_data(59, 100), Ok((59, 60)));
        // Data cut at the segment's end.
        assert_eq!(map.first_data(0, 20), Ok((10, 20)));
        assert_eq!(map.first_data(52, 55), Ok((52, 55)));
        // Nothing: where to look next.
        assert_eq!(map.first_data(60, 100), Err(100));
        assert_eq!(map.first_data(0, 5), Err(5));
        assert_eq!(map.first_data(30, 45), Err(45));
    }

    #[test]
    fn data_running_past_the_map_stops_at_its_end() {
        let m = map(100, vec![ext(100, 50, true), ext(150, 50, false)]);
        assert_eq!(m.first_data(100, 400), Ok((150, 200)));
        let holes = map(100, vec![ext(100, 100, true)]);
        assert_eq!(holes.first_data(120, 400), Err(200));
    }

    #[test]
    fn a_short_answer_ends_the_map_where_it_ends() {
        // Asked for a region, answered for its first 30 bytes only.
        let m = map(0, vec![ext(0, 10, true), ext(10, 20, false)]);
        assert_eq!(m.end, 30);
        assert_eq!(m.first_data(0, 100), Ok((10, 30)));
        assert!(Map::new(0, Vec::new()).is_none());
    }

    #[test]
    fn kept_maps_are_found_by_any_offset_inside() {
        let mut maps = Maps::default();
        maps.keep(map(0, vec![ext(0, REGION, true)]));
        maps.keep(map(2 * REGION, vec![ext(2 * REGION, 10, false)]));
        assert_eq!(maps.get(5).map(|m| m.start), Some(0));
        assert_eq!(maps.get(REGION - 1).map(|m| m.start), Some(0));
        // Between the two, and past the short second one: not kept.
        assert!(maps.get(REGION).is_none());
        assert!(maps.get(2 * REGION + 10).is_none());
        assert_eq!(maps.get(2 * REGION + 9).map(|m| m.start), Some(2 * REGION));
        // The same region again replaces its map.
        maps.keep(map(0, vec![ext(0, 5, false)]));
        assert_eq!(maps.len(), 2);
        assert!(maps.get(5).is_none());
    }

    #[test]
    fn the_oldest_maps_go_first_beyond_the_bound() {
        let mut maps = Maps::default();
        // Regions of 1,000 one-byte extents each.
        let region = |r: u64| {
            let s = r * REGION;
            map(s, (0..1000).map(|i| ext(s + i, 1, i % 2 == 1)).collect())
        };
        let n = (KEEP_EXTENTS / 1000) as u64;
        for r in 0..n + 5 {
            maps.keep(region(r));
            assert!(maps.extents <= KEEP_EXTENTS);
        }
        assert_eq!(maps.len() as u64, n);
        assert!(maps.get(0).is_none() && maps.get(4 * REGION).is_none());
        assert!(maps.get(5 * REGION).is_some() && maps.get((n + 4) * REGION).is_some());
        // One map bigger than the bound alone is still kept (the last).
        let s = (n + 10) * REGION;
        let huge = (0..KEEP_EXTENTS as u64 + 1)
            .map(|i| ext(s + i, 1, i % 2 == 1))
            .collect();
        maps.keep(map(s, huge));
        assert_eq!(maps.len(), 1);
        assert!(maps.get(s).is_some());
    }
}
