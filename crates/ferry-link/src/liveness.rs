//! Keepalives and the idle timeout of a stream link.
//!
//! A writer with nothing to send for [`KEEPALIVE`] sends an empty frame,
//! so a live peer is never silent for long, whatever its side is busy
//! with (signing a big file, fsyncing, deleting). With an idle timeout set
//! (`--timeout`), a peer that has sent no frame, or has taken none of
//! ours, for that long is dead: the link fails with
//! [`LinkError::TimedOut`] instead of waiting forever.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::transport::LinkError;

/// Idle time after which a writer sends a keepalive frame.
pub const KEEPALIVE: Duration = Duration::from_secs(1);

/// How often a waiting side looks at the clocks.
pub(crate) const TICK: Duration = Duration::from_millis(250);

/// When frames last arrived and left, and how long the peer may be idle.
#[derive(Debug)]
pub struct Liveness {
    start: Instant,
    heard_ms: AtomicU64,
    moved_ms: AtomicU64,
    /// 0: no timeout.
    idle_ms: AtomicU64,
}

impl Default for Liveness {
    fn default() -> Self {
        Liveness {
            start: Instant::now(),
            heard_ms: AtomicU64::new(0),
            moved_ms: AtomicU64::new(0),
            idle_ms: AtomicU64::new(0),
        }
    }
}

impl Liveness {
    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// Bytes of a frame arrived.
    pub fn heard(&self) {
        self.heard_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// Bytes of a frame were taken by the pipe.
    pub fn moved(&self) {
        self.moved_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// Set (or clear) the idle timeout; the clocks start now.
    pub fn set_idle(&self, d: Option<Duration>) {
        self.heard();
        self.moved();
        let ms = d.map_or(0, |d| (d.as_millis() as u64).max(1));
        self.idle_ms.store(ms, Ordering::Relaxed);
    }

    /// Whether an idle timeout is set.
    pub fn watching(&self) -> bool {
        self.idle_ms.load(Ordering::Relaxed) > 0
    }

    fn check(&self, last: u64) -> Result<(), LinkError> {
        let idle = self.idle_ms.load(Ordering::Relaxed);
        let quiet = self.now_ms().saturating_sub(last);
        if idle > 0 && quiet > idle {
            return Err(LinkError::TimedOut(idle.div_ceil(1000)));
        }
        Ok(())
    }

    /// An error once the peer has sent nothing for longer than the timeout.
    pub fn check_heard(&self) -> Result<(), LinkError> {
        self.check(self.heard_ms.load(Ordering::Relaxed))
    }

    /// An error once the peer has neither taken anything nor sent anything
    /// (not even a keepalive) for longer than the timeout. A peer that is
    /// busy and not reading still sends keepalives: that is not a dead one.
    pub fn check_moved(&self) -> Result<(), LinkError> {
        let last = self
            .moved_ms
            .load(Ordering::Relaxed)
            .max(self.heard_ms.load(Ordering::Relaxed));
        self.check(last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silence_longer_than_the_timeout_is_an_error() {
        let l = Liveness::default();
        assert!(l.check_heard().is_ok(), "no timeout set");
        l.set_idle(Some(Duration::from_millis(30)));
        assert!(l.check_heard().is_ok() && l.check_moved().is_ok());
        std::thread::sleep(Duration::from_millis(60));
        assert!(matches!(l.check_moved(), Err(LinkError::TimedOut(_))));
        l.moved();
        assert!(matches!(l.check_heard(), Err(LinkError::TimedOut(_))));
        assert!(l.check_moved().is_ok());
        std::thread::sleep(Duration::from_millis(60));
        l.heard();
        assert!(l.check_heard().is_ok());
        assert!(l.check_moved().is_ok(), "a peer heard from is not dead");
        l.set_idle(None);
        std::thread::sleep(Duration::from_millis(40));
        assert!(l.check_heard().is_ok() && l.check_moved().is_ok());
    }
}
