//! An NBD export as an endpoint: read as a [`Source`], written as a
//! [`Sink`], over a [`ferry_nbd::Pool`] of up to [`NBD_CONNECTIONS`]
//! connections when the server offers multi-conn.

use std::collections::VecDeque;
use std::io;
use std::sync::Mutex;

use super::nbdmap::Kept;
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
pub struct NbdExport(ferry_nbd::Pool, Extents, Kept);

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
            .map(|p| NbdExport(p, Extents::default(), Kept::default()))
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
    /// server's allocation map (ranges flagged `NBD_STATE_ZERO` are zeros), asked
    /// for 256 MiB at a time and kept (see `endpoint::nbdmap`).
    fn find_data(&self, mut pos: u64, end: u64) -> io::Result<Option<(u64, u64)>> {
        let (size, client) = (self.size(), self.0.first());
        let fetch = |start, len| client.extents(start, len).map_err(nbd_io);
        let end = end.min(size);
        while pos < end {
            let Some(map) = self.2.map_for(pos, size, fetch)? else {
                // No map of it: read it all.
                return Ok(Some((pos, end)));
            };
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
