//! [`Ticket`], the handle of a request in flight, and [`Reply`], what it
//! yields; the [`Slot`] the reader thread completes them through.

use std::sync::{Arc, Condvar, Mutex};

use super::lock;
use crate::error::Result;

/// The result of a completed request.
#[derive(Debug)]
pub enum Reply {
    /// Command succeeded (no payload).
    Done,
    /// READ data (the buffer given to [`Connection::submit_read`](super::Connection::submit_read), filled).
    Data(Vec<u8>),
    /// BLOCK_STATUS descriptors of `base:allocation` as (length, flags).
    Extents(Vec<(u32, u32)>),
}

pub(super) struct Slot {
    pub(super) result: Mutex<Option<Result<Reply>>>,
    pub(super) cv: Condvar,
}

impl Slot {
    pub(super) fn complete(&self, r: Result<Reply>) {
        let mut g = lock(&self.result);
        if g.is_none() {
            *g = Some(r);
        }
        self.cv.notify_all();
    }
}

/// A request in flight; [`Ticket::wait`] blocks until its reply.
#[must_use = "a ticket must be waited on to learn whether the request succeeded"]
pub struct Ticket {
    pub(super) slot: Arc<Slot>,
}

impl Ticket {
    /// Waits for the reply. Never blocks forever: a dead connection fails
    /// every outstanding ticket.
    pub fn wait(self) -> Result<Reply> {
        let mut g = lock(&self.slot.result);
        loop {
            if let Some(r) = g.take() {
                return r;
            }
            g = self.slot.cv.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// True if the reply has arrived (wait will not block).
    pub fn is_ready(&self) -> bool {
        lock(&self.slot.result).is_some()
    }
}
