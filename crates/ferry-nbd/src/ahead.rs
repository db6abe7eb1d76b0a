//! Read-ahead over a [`Pool`]: a reader that goes through a range in
//! requests of one size (ferry's sender reads each data extent in 1 MiB
//! pieces) waits one round trip per piece. [`Pool::read_ahead_at`] asks
//! for the next pieces of the range before waiting for this one, spread
//! over the pool's connections, so a server far away or slow per request
//! is kept busy. What is asked ahead is bounded ([`AHEAD_MAX`] requests in
//! all, a reader's share shrinking when many read at once); a piece
//! nobody takes is dropped, and a write over a piece forgets it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::client::wait_into;
use crate::conn::Ticket;
use crate::error::Result;
use crate::pool::Pool;

/// Most requests read ahead and not yet taken, over all readers.
pub const AHEAD_MAX: usize = 64;

/// A piece nobody took for this long belongs to a reader that gave up
/// on its range: its place may go to another reader.
const STALE: Duration = Duration::from_secs(5);

/// Requests in flight for pieces not asked for yet, by offset: their
/// length, the request, and when it was asked.
#[derive(Default)]
pub(crate) struct Ahead(Mutex<HashMap<u64, (usize, Ticket, Instant)>>);

impl std::fmt::Debug for Ahead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Ahead({} in flight)", self.lock().len())
    }
}

impl Ahead {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, (usize, Ticket, Instant)>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Forget pieces that overlap `[offset, offset + len)`: it is being
    /// written, so what was read ahead there is old.
    pub(crate) fn forget(&self, offset: u64, len: u64) {
        let mut m = self.lock();
        if !m.is_empty() {
            let end = offset.saturating_add(len);
            m.retain(|&at, (n, _, _)| at.saturating_add(*n as u64) <= offset || at >= end);
        }
    }
}

impl Pool {
    /// Reads `buf.len()` bytes at `offset` like [`Pool::read_at`], and
    /// asks ahead for the pieces of the same size that follow, up to
    /// `limit` (the end of the range the caller is reading through).
    pub fn read_ahead_at(&self, offset: u64, buf: &mut [u8], limit: u64) -> Result<()> {
        let len = buf.len();
        if len == 0 || len > self.request_size() {
            return self.read_at(offset, buf);
        }
        let hit = self.ahead_take(offset, len);
        self.ask_ahead(offset.saturating_add(len as u64), len, limit);
        match hit {
            Some(t) => wait_into(t, buf),
            None => self.read_at(offset, buf),
        }
    }

    fn ahead_take(&self, offset: u64, len: usize) -> Option<Ticket> {
        match self.ahead().lock().remove(&offset) {
            Some((l, t, _)) if l == len => Some(t),
            // Asked ahead with another size: drop it, read afresh.
            _ => None,
        }
    }

    /// Ask for up to two pieces per connection after `from`, below
    /// `limit`, while fewer than [`AHEAD_MAX`] are out. The requests are
    /// sent with the map unlocked (a submit may wait for the server).
    fn ask_ahead(&self, from: u64, len: usize, limit: u64) {
        let mut want = Vec::new();
        {
            let mut m = self.ahead().lock();
            if m.len() >= AHEAD_MAX {
                m.retain(|_, (_, _, asked)| asked.elapsed() < STALE);
            }
            let mut at = from;
            for _ in 0..self.connections() * 2 {
                if at >= limit || m.len() + want.len() >= AHEAD_MAX {
                    break;
                }
                let n = len.min((limit - at) as usize);
                if !m.contains_key(&at) {
                    want.push((at, n));
                }
                at += n as u64;
            }
        }
        let mut asked = Vec::with_capacity(want.len());
        for (at, n) in want {
            match self
                .next_client(1)
                .connection()
                .submit_read(at, crate::spare::read_buf(n))
            {
                Ok(t) => asked.push((at, (n, t, Instant::now()))),
                // The read itself will say what is wrong.
                Err(_) => break,
            }
        }
        self.ahead().lock().extend(asked);
    }
}
