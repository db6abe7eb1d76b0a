//! Read-ahead over a [`Pool`]: a reader that goes through a range in
//! requests of one size (ferry's sender reads each data extent in 1 MiB
//! pieces) waits one round trip per piece. [`Pool::read_ahead_at`] asks
//! for the next pieces of the range before waiting for this one, spread
//! over the pool's connections, so a server far away or slow per request
//! is kept busy. What is asked ahead is bounded ([`AHEAD_MAX`] requests in
//! all); a piece read ahead that is never asked for is dropped.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::client::unexpected;
use crate::conn::{Reply, Ticket};
use crate::error::Result;
use crate::pool::Pool;

/// Most requests read ahead and not yet taken, over all readers.
pub const AHEAD_MAX: usize = 64;

/// Requests in flight for pieces not asked for yet, by offset.
#[derive(Default)]
pub(crate) struct Ahead(Mutex<HashMap<u64, (usize, Ticket)>>);

impl std::fmt::Debug for Ahead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.0.lock().map(|m| m.len()).unwrap_or(0);
        write!(f, "Ahead({n} in flight)")
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
            Some(t) => match t.wait()? {
                Reply::Data(d) if d.len() == len => {
                    buf.copy_from_slice(&d);
                    Ok(())
                }
                other => Err(unexpected("READ", &other)),
            },
            None => self.read_at(offset, buf),
        }
    }

    fn ahead_take(&self, offset: u64, len: usize) -> Option<Ticket> {
        let mut m = self.ahead().0.lock().unwrap_or_else(|p| p.into_inner());
        match m.remove(&offset) {
            Some((l, t)) if l == len => Some(t),
            // Asked ahead with another size: drop it, read afresh.
            _ => None,
        }
    }

    /// Ask for up to two pieces per connection after `from`, below `limit`.
    fn ask_ahead(&self, from: u64, len: usize, limit: u64) {
        let mut m = self.ahead().0.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() >= AHEAD_MAX {
            // Full of pieces nobody took (a reader that gave up on its
            // range): start afresh rather than never read ahead again.
            m.clear();
        }
        let mut at = from;
        for _ in 0..self.connections() * 2 {
            if at >= limit || m.len() >= AHEAD_MAX {
                return;
            }
            let n = len.min((limit - at) as usize);
            if let std::collections::hash_map::Entry::Vacant(slot) = m.entry(at) {
                let conn = self.next_client(1).connection();
                match conn.submit_read(at, vec![0u8; n]) {
                    Ok(t) => {
                        slot.insert((n, t));
                    }
                    // The read itself will say what is wrong.
                    Err(_) => return,
                }
            }
            at += n as u64;
        }
    }
}
