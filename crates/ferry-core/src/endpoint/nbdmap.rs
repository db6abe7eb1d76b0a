//! The allocation maps of an NBD export's regions, as BLOCK_STATUS gave
//! them, kept for the readers that come after the one that asked.
//!
//! The sender plans a file's holes region by region before its workers
//! read the segments with data, and every worker asks where the data of
//! its segment is. With one map kept, the planner and the workers
//! replaced it in turn: a 1 TiB export with one extent per 256 MiB
//! region asked for each region's map twice or more, each time with the
//! map locked against every other reader for the round trip. Kept here, a
//! region is asked for once while its map is kept (one thread asks, the
//! others wait for its answer), and a lookup holds the lock only to clone
//! an `Arc`. A map the client cut short (see [`ferry_nbd::MAX_EXTENTS`])
//! is continued from where it ends.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use ferry_nbd::Extent;

/// Bytes of the export whose allocation is asked for at once, from a
/// multiple of this.
pub(super) const REGION: u64 = 256 << 20;

/// Extents kept over all regions (about 12 MiB of them, each map also
/// charged [`MAP_COST`]; two answers of the most a query returns fit):
/// regions asked for first are dropped first beyond this, and are asked
/// for again if read.
const KEEP_EXTENTS: usize = 2 * (ferry_nbd::MAX_EXTENTS + MAP_COST);
/// What a kept map costs beyond its extents, in extents (its `Arc`, its
/// place in the index and in the order of arrival).
const MAP_COST: usize = 8;
/// Maps asked for at once, over all readers: each answer may hold
/// [`ferry_nbd::MAX_EXTENTS`] extents while it is decoded.
const MAX_FETCHES: usize = 2;

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
    pub(super) fn new(start: u64, mut exts: Vec<Extent>) -> Option<Map> {
        let end = exts.last().map(|e| e.offset + e.len)?;
        exts.shrink_to_fit();
        (end > start).then_some(Map { start, end, exts })
    }

    fn cost(&self) -> usize {
        self.exts.len() + MAP_COST
    }

    /// The first data at or after `pos` and before `end`, within the map
    /// (which must hold `pos`): its start and where it stops being data,
    /// at `end` or the map's end at the latest. `Err(next)`: no data
    /// before `next`, the map's end or `end`.
    pub(super) fn first_data(&self, pos: u64, end: u64) -> Result<(u64, u64), u64> {
        debug_assert!((self.start..self.end).contains(&pos));
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

/// The maps kept, by start, the order they came in, and the starts being
/// asked for now.
#[derive(Default)]
pub(super) struct Maps {
    by_start: BTreeMap<u64, Arc<Map>>,
    order: VecDeque<u64>,
    cost: usize,
    fetching: BTreeSet<u64>,
}

impl Maps {
    /// The kept map that holds `pos`.
    fn get(&self, pos: u64) -> Option<Arc<Map>> {
        let (_, m) = self.by_start.range(..=pos).next_back()?;
        (pos < m.end).then(|| m.clone())
    }

    /// Where to ask from for `pos` in the region from `region`: the end
    /// of the kept maps that reach towards it from the region's start (a
    /// map cut short, continued), or the region's start.
    fn gap_start(&self, pos: u64, region: u64) -> u64 {
        match self.by_start.range(region..=pos).next_back() {
            Some((_, m)) if m.end <= pos => m.end,
            _ => region,
        }
    }

    /// Keep `m` (replacing a map from the same start), dropping the
    /// oldest maps while they cost more than [`KEEP_EXTENTS`].
    fn keep(&mut self, m: Arc<Map>) {
        if let Some(old) = self.by_start.insert(m.start, m.clone()) {
            self.cost -= old.cost();
            self.order.retain(|&s| s != m.start);
        }
        self.cost += m.cost();
        self.order.push_back(m.start);
        while self.cost > KEEP_EXTENTS && self.order.len() > 1 {
            let Some(s) = self.order.pop_front() else {
                break;
            };
            if let Some(old) = self.by_start.remove(&s) {
                self.cost -= old.cost();
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_start.len()
    }
}

/// A region being asked for (`.2` until its answer is in): a panic while
/// asking still takes it off the list and wakes the readers waiting.
struct Asking<'a>(&'a Kept, u64, bool);

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        if self.2 {
            self.0.lock().fetching.remove(&self.1);
            self.0.answered.notify_all();
        }
    }
}

/// [`Maps`] shared by an export's readers.
#[derive(Default)]
pub(super) struct Kept {
    maps: Mutex<Maps>,
    answered: Condvar,
}

impl Kept {
    fn lock(&self) -> MutexGuard<'_, Maps> {
        self.maps.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The map that holds `pos` (below `size`, the export's), kept or
    /// asked for with `fetch(start, len)` from the start of its
    /// [`REGION`] (or where a kept map of it ends) to the region's end.
    /// The lock is not held while asking; a reader that needs a map being
    /// asked for waits for it. `None`: the server gave no map of it.
    pub(super) fn map_for(
        &self,
        pos: u64,
        size: u64,
        fetch: impl Fn(u64, u64) -> io::Result<Vec<Extent>>,
    ) -> io::Result<Option<Arc<Map>>> {
        let region = pos - pos % REGION;
        let region_end = region.saturating_add(REGION).min(size);
        // Where the last answer of this call ended: asking goes on from
        // there even if its map was dropped meanwhile.
        let mut from = region;
        let mut g = self.lock();
        loop {
            if let Some(m) = g.get(pos) {
                return Ok(Some(m));
            }
            let start = g.gap_start(pos, region).max(from);
            if g.fetching.contains(&start) || g.fetching.len() >= MAX_FETCHES {
                g = self.answered.wait(g).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            g.fetching.insert(start);
            drop(g);
            let mut asking = Asking(self, start, true);
            let got =
                fetch(start, region_end - start).map(|exts| Map::new(start, exts).map(Arc::new));
            g = self.lock();
            // Done asking, and the answer kept, before the waiting wake.
            asking.2 = false;
            g.fetching.remove(&start);
            if let Ok(Some(m)) = &got {
                g.keep(m.clone());
            }
            self.answered.notify_all();
            let Some(m) = got? else {
                return Ok(None);
            };
            if m.end > pos {
                return Ok(Some(m));
            }
            from = m.end;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An extent of data, or (`skip`) a hole that reads as zeros.
    fn ext(offset: u64, len: u64, skip: bool) -> Extent {
        ext_flags(offset, len, skip, skip)
    }

    /// An extent with the server's two flags as given.
    fn ext_flags(offset: u64, len: u64, hole: bool, zero: bool) -> Extent {
        Extent {
            offset,
            len,
            hole,
            zero,
        }
    }

    fn map(start: u64, exts: Vec<Extent>) -> Arc<Map> {
        Arc::new(Map::new(start, exts).expect("a map"))
    }

    #[test]
    fn one_region_map_answers_every_segment_in_it() {
        // 0..10 hole, 10..30 data, 30..50 zero, 50..60 data, 60..100 hole,
        // 100..110 a hole the server does not say reads as zeros (data).
        let map = map(
            0,
            vec![
                ext(0, 10, true),
                ext(10, 20, false),
                ext_flags(30, 20, false, true),
                ext(50, 10, false),
                ext(60, 40, true),
                ext_flags(100, 10, true, false),
            ],
        );
        assert_eq!(map.first_data(0, 100), Ok((10, 30)));
        assert_eq!(map.first_data(15, 100), Ok((15, 30)));
        assert_eq!(map.first_data(30, 100), Ok((50, 60)));
        assert_eq!(map.first_data(59, 100), Ok((59, 60)));
        // Data cut at the segment's end.
        assert_eq!(map.first_data(0, 20), Ok((10, 20)));
        assert_eq!(map.first_data(52, 55), Ok((52, 55)));
        assert_eq!(map.first_data(60, 200), Ok((100, 110)));
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
        let n = (KEEP_EXTENTS / (1000 + MAP_COST)) as u64;
        for r in 0..n + 5 {
            maps.keep(region(r));
            assert!(maps.cost <= KEEP_EXTENTS);
        }
        assert_eq!(maps.len() as u64, n);
        assert!(maps.get(0).is_none() && maps.get(4 * REGION).is_none());
        assert!(maps.get(5 * REGION).is_some() && maps.get((n + 4) * REGION).is_some());
        // Maps of one extent each still cost their keeping.
        let mut small = Maps::default();
        for r in 0..KEEP_EXTENTS as u64 {
            small.keep(map(r * REGION, vec![ext(r * REGION, REGION, true)]));
        }
        assert_eq!(small.len(), KEEP_EXTENTS / (1 + MAP_COST));
        // One map bigger than the bound alone is still kept (the last).
        let s = (n + 10) * REGION;
        let huge = (0..KEEP_EXTENTS as u64 + 1)
            .map(|i| ext(s + i, 1, i % 2 == 1))
            .collect();
        maps.keep(map(s, huge));
        assert_eq!(maps.len(), 1);
        assert!(maps.get(s).is_some());
    }

    /// A server whose answers from `start` end after `cut` bytes (all of
    /// the asked range when `None`), data then hole, counting the asks.
    struct Server {
        asked: std::sync::atomic::AtomicUsize,
        cut: Option<u64>,
        wait: std::time::Duration,
    }

    impl Server {
        fn new(cut: Option<u64>, wait_ms: u64) -> Self {
            Server {
                asked: Default::default(),
                cut,
                wait: std::time::Duration::from_millis(wait_ms),
            }
        }
        fn fetch(&self, start: u64, len: u64) -> io::Result<Vec<Extent>> {
            self.asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::thread::sleep(self.wait);
            let len = self.cut.map_or(len, |c| c.min(len));
            Ok(vec![
                ext(start, len / 2, false),
                ext(start + len / 2, len - len / 2, true),
            ])
        }
        fn asked(&self) -> usize {
            self.asked.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    #[test]
    fn a_map_cut_short_is_continued_from_its_end() {
        let kept = Kept::default();
        let srv = Server::new(Some(1000), 0);
        let size = 4 * REGION;
        let get = |pos| {
            kept.map_for(pos, size, |s, l| srv.fetch(s, l))
                .unwrap()
                .unwrap()
        };
        // 2,500 bytes into the second region: three answers of 1,000.
        let m = get(REGION + 2500);
        assert_eq!((m.start, m.end), (REGION + 2000, REGION + 3000));
        assert_eq!(srv.asked(), 3);
        // What was answered is kept: nothing asked again.
        assert_eq!(get(REGION + 10).start, REGION);
        assert_eq!(get(REGION + 1999).start, REGION + 1000);
        assert_eq!(srv.asked(), 3);
        // The last region ends at the export's end.
        let whole = Server::new(None, 0);
        let size = 3 * REGION + 12345;
        let m = kept
            .map_for(size - 1, size, |s, l| whole.fetch(s, l))
            .unwrap()
            .unwrap();
        assert_eq!((m.start, m.end), (3 * REGION, size));
    }

    #[test]
    fn readers_of_one_region_wait_for_one_answer() {
        let kept = Kept::default();
        let srv = Server::new(None, 50);
        std::thread::scope(|s| {
            for i in 0..6u64 {
                let (kept, srv) = (&kept, &srv);
                s.spawn(move || {
                    let m = kept
                        .map_for(REGION + i * 4096, 8 * REGION, |a, l| srv.fetch(a, l))
                        .unwrap()
                        .unwrap();
                    assert_eq!((m.start, m.end), (REGION, 2 * REGION));
                });
            }
        });
        assert_eq!(srv.asked(), 1);
    }

    /// The first region is not kept: a reader of it asks the server once.
    fn next_reader_asks(kept: &Kept) {
        let srv = Server::new(None, 0);
        assert!(kept
            .map_for(10, REGION, |s, l| srv.fetch(s, l))
            .unwrap()
            .is_some());
        assert_eq!(srv.asked(), 1);
    }

    #[test]
    fn a_panic_while_asking_leaves_the_region_askable() {
        let kept = Kept::default();
        let mad = |_, _| -> io::Result<Vec<Extent>> { panic!("a fetch that panics") };
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = kept.map_for(10, REGION, mad);
        }));
        assert!(r.is_err());
        // Not left "being asked for": the next reader asks, not waits.
        next_reader_asks(&kept);
    }

    #[test]
    fn a_failed_answer_is_an_error_and_keeps_nothing() {
        let kept = Kept::default();
        let fail = |_, _| -> io::Result<Vec<Extent>> { Err(io::Error::other("link down")) };
        assert!(kept.map_for(10, REGION, fail).is_err());
        next_reader_asks(&kept);
        // No extents at all: no map, the caller reads.
        let none = |_, _| -> io::Result<Vec<Extent>> { Ok(Vec::new()) };
        assert!(kept
            .map_for(REGION + 1, 2 * REGION, none)
            .unwrap()
            .is_none());
    }
}
