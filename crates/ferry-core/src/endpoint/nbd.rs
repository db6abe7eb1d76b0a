//! An NBD export as an endpoint: read as a [`Source`], written as a
//! [`Sink`], over a [`ferry_nbd::Pool`] of up to [`NBD_CONNECTIONS`]
//! connections when the server offers multi-conn.

use std::collections::VecDeque;
use std::io;
use std::sync::Mutex;

use super::{nbd_io, Sink, Source};

/// Connections opened to an export that offers multi-conn (nbdcopy's
/// default too): enough to keep a server's threads and a long link busy.
pub const NBD_CONNECTIONS: usize = 4;

/// The name an NBD export gets in a destination directory: its export
/// name, or `nbd-export.img` for the default export.
pub(super) fn export_file_name(uri: &str) -> Vec<u8> {
    let after = uri.split_once("://").map(|x| x.1).unwrap_or("");
    let path = after.split(['?', '#']).next().unwrap_or("");
    let export = path.split_once('/').map(|x| x.1).unwrap_or("");
    let name = export.rsplit('/').next().unwrap_or("");
    if name.is_empty() || name == "." || name == ".." {
        b"nbd-export.img".to_vec()
    } else {
        name.as_bytes().to_vec()
    }
}

/// An NBD export as an endpoint: read as a source, or written in place as
/// a destination (zero ranges as WRITE_ZEROES, durability as FLUSH).
pub struct NbdExport(ferry_nbd::Pool, Extents, Mutex<Map>);

/// The allocation map of the region being read: one BLOCK_STATUS walk of
/// [`REGION`] bytes answers the scans of all its segments (a 1 TiB image
/// with 1 GiB of data took 131,072 round trips, one per 8 MiB segment,
/// and ferry spent its time in the thread hand-offs around them).
#[derive(Default)]
struct Map {
    start: u64,
    end: u64,
    exts: Vec<ferry_nbd::Extent>,
}

/// Bytes of the export whose allocation is asked for at once. Bounds the
/// map a server can make this side keep: at most one descriptor per
/// 512-byte block, 12 MiB of them.
const REGION: u64 = 256 << 20;

impl Map {
    /// The first data at or after `pos` and before `end`, within the map
    /// (which must hold `pos`): its start and where it stops being data,
    /// at `end` or the map's end at the latest. `Err(next)`: no data
    /// before `next`, the map's end or `end`.
    fn first_data(&self, pos: u64, end: u64) -> Result<(u64, u64), u64> {
        let stop = end.min(self.end);
        let mut start = None;
        for x in &self.exts {
            let (a, b) = (x.offset.max(pos), (x.offset + x.len).min(stop));
            if a >= b {
                if x.offset >= stop {
                    break;
                }
                continue;
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

/// The data extents [`Source::next_data`] returned last: a read inside one
/// is followed by reads of the rest of it, which are asked for ahead.
#[derive(Default)]
struct Extents(Mutex<VecDeque<(u64, u64)>>);

impl Extents {
    const KEEP: usize = 32;

    fn found(&self, start: u64, end: u64) {
        let mut v = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if v.len() >= Self::KEEP {
            v.pop_front();
        }
        v.push_back((start, end));
    }

    /// Where the extent holding `off` ends (`off` itself when none does).
    fn end_of(&self, off: u64) -> u64 {
        let v = self.0.lock().unwrap_or_else(|p| p.into_inner());
        v.iter()
            .rev()
            .find(|(s, e)| (*s..*e).contains(&off))
            .map_or(off, |x| x.1)
    }
}

impl NbdExport {
    pub fn connect(uri: &str) -> io::Result<Self> {
        ferry_nbd::Pool::connect(uri, NBD_CONNECTIONS)
            .map(|p| NbdExport(p, Extents::default(), Mutex::default()))
            .map_err(nbd_io)
    }
    pub fn size(&self) -> u64 {
        self.0.first().size()
    }
    pub fn read_only(&self) -> bool {
        self.0.first().read_only()
    }
    /// How many connections reads and writes are spread over.
    pub fn connections(&self) -> usize {
        self.0.connections()
    }
}

impl Source for NbdExport {
    fn next_data(&self, pos: u64, end: u64) -> io::Result<Option<(u64, u64)>> {
        let found = self.find_data(pos, end)?;
        if let Some((s, e)) = found {
            self.1.found(s, e);
        }
        Ok(found)
    }
    fn read_exact_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        let limit = self.1.end_of(off);
        self.0.read_ahead_at(off, buf, limit).map_err(nbd_io)
    }
    fn stamp(&self) -> io::Result<Option<(u64, (i64, u32))>> {
        Ok(None)
    }
}

impl NbdExport {
    /// The next data extent at or after `pos` and before `end`, from the
    /// server's allocation map (holes and zero ranges are zeros), asked
    /// for a [`REGION`] at a time.
    fn find_data(&self, mut pos: u64, end: u64) -> io::Result<Option<(u64, u64)>> {
        let end = end.min(self.size());
        let mut map = self.2.lock().unwrap_or_else(|p| p.into_inner());
        while pos < end {
            if !(map.start..map.end).contains(&pos) {
                let len = REGION.min(self.size() - pos);
                map.exts = self.0.first().extents(pos, len).map_err(nbd_io)?;
                (map.start, map.end) = (pos, pos + len);
                if map.exts.is_empty() {
                    // No map of it: read it all.
                    map.end = pos;
                    return Ok(Some((pos, end)));
                }
            }
            match map.first_data(pos, end) {
                Ok(found) => return Ok(Some(found)),
                Err(next) if next > pos => pos = next,
                // A map that does not cover what it says: read it all.
                Err(_) => return Ok(Some((pos, end))),
            }
        }
        Ok(None)
    }
}

impl Sink for NbdExport {
    fn put_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        self.0.write_at(off, buf).map_err(nbd_io)
    }
    fn zero_range(&self, off: u64, len: u64) -> io::Result<()> {
        self.0.write_zeroes(off, len).map_err(nbd_io)
    }
    fn durable(&self) -> io::Result<()> {
        self.0.flush().map_err(nbd_io)
    }
    fn read_back_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        self.0.read_at(off, buf).map_err(nbd_io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_nbd::Extent;

    fn ext(offset: u64, len: u64, skip: bool) -> Extent {
        Extent {
            offset,
            len,
            hole: skip,
            zero: false,
        }
    }

    #[test]
    fn one_region_map_answers_every_segment_in_it() {
        // 0..10 hole, 10..30 data, 30..50 zero, 50..60 data, 60..100 hole.
        let map = Map {
            start: 0,
            end: 100,
            exts: vec![
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
        };
        assert_eq!(map.first_data(0, 100), Ok((10, 30)));
        assert_eq!(map.first_data(15, 100), Ok((15, 30)));
        assert_eq!(map.first_data(30, 100), Ok((50, 60)));
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
        let map = Map {
            start: 100,
            end: 200,
            exts: vec![ext(100, 50, true), ext(150, 50, false)],
        };
        assert_eq!(map.first_data(100, 400), Ok((150, 200)));
        let holes = Map {
            start: 100,
            end: 200,
            exts: vec![ext(100, 100, true)],
        };
        assert_eq!(holes.first_data(120, 400), Err(200));
    }
}
