//! The one estimate of how fast the link drains compressed bytes, which
//! [`Mode::Auto`](crate::Mode) weighs against the codecs' speeds. Both the
//! sync link's frame writer and the stream sender's network writer feed
//! it what each write moved and how long it blocked; it owns no clock of
//! its own beyond the window it is given.

use std::time::{Duration, Instant};

/// Length of a measuring window.
pub const WINDOW: Duration = Duration::from_millis(200);

/// Drain-rate estimate over windows of about [`WINDOW`]: when writing
/// took most of a window (the link is the bottleneck), bytes written
/// divided by the time spent blocked writing them. When it did not, the
/// link is at least as fast as what went through and maybe faster: the
/// estimate becomes at least that, rises beyond the last one by a quarter
/// at most per window, and never above 1.25x what went through. A jump to "unlimited" would make the compressor drop
/// to a fast codec, which floods the link, which then measures slow again
/// (seen over ssh, whose buffers hide the link for a while); and when the
/// CPU is the bottleneck, a rate compounded from nothing would make the
/// compressor trade ratio for speed it cannot use.
#[derive(Debug)]
pub struct DrainRate {
    start: Instant,
    bytes: u64,
    busy: Duration,
    rate: f64,
}

impl Default for DrainRate {
    fn default() -> Self {
        DrainRate::new(Instant::now())
    }
}

impl DrainRate {
    /// A new estimate (unknown) whose first window starts at `now`.
    pub fn new(now: Instant) -> Self {
        DrainRate {
            start: now,
            bytes: 0,
            busy: Duration::ZERO,
            rate: 0.0,
        }
    }

    /// `bytes` went out in a write that blocked for `busy`; `now` is the
    /// time after it. Returns the new estimate when a window closed.
    pub fn wrote(&mut self, bytes: u64, busy: Duration, now: Instant) -> Option<f64> {
        self.bytes += bytes;
        self.busy += busy;
        let span = now.saturating_duration_since(self.start);
        if span < WINDOW {
            return None;
        }
        let (b, busy, span) = (
            self.bytes as f64,
            self.busy.as_secs_f64(),
            span.as_secs_f64(),
        );
        self.rate = if busy > 0.5 * span {
            b / busy
        } else if self.rate > 0.0 {
            let pushed = b / span;
            (self.rate * 1.25).min(pushed * 1.25).max(pushed)
        } else {
            0.0
        };
        self.start = now;
        self.bytes = 0;
        self.busy = Duration::ZERO;
        Some(self.rate)
    }

    /// Bytes per second; 0 while unknown.
    pub fn rate(&self) -> f64 {
        self.rate
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_blocked_window_measures_bytes_over_blocked_time() {
        let t0 = Instant::now();
        let mut d = DrainRate::new(t0);
        assert_eq!(d.wrote(1_000_000, 100 * MS, t0 + 100 * MS), None);
        // 2 MB in 200 ms blocked out of 250 ms: the link drains 10 MB/s.
        let r = d.wrote(1_000_000, 100 * MS, t0 + 250 * MS).unwrap();
        assert!((r - 10e6).abs() < 1.0, "{r}");
        assert_eq!(d.rate(), r);
    }

    #[test]
    fn unknown_until_the_link_has_been_the_bottleneck() {
        let t0 = Instant::now();
        let mut d = DrainRate::new(t0);
        assert_eq!(d.wrote(5_000_000, MS, t0 + 300 * MS), Some(0.0));
    }

    #[test]
    fn a_link_that_never_blocks_is_at_least_what_went_through() {
        let t0 = Instant::now();
        let mut d = DrainRate::new(t0);
        // 1 MB/s measured while blocked.
        d.wrote(200_000, 200 * MS, t0 + 200 * MS).unwrap();
        assert!((d.rate() - 1e6).abs() < 1.0);
        // Then 400 KB go through 200 ms without blocking (2 MB/s): the
        // link is at least that fast.
        let r = d.wrote(400_000, MS, t0 + 400 * MS).unwrap();
        assert!((r - 2e6).abs() < 1.0, "{r}");
        // 480 KB (2.4 MB/s): a quarter above the last estimate at most.
        let r = d.wrote(480_000, MS, t0 + 600 * MS).unwrap();
        assert!((r - 2.5e6).abs() < 1.0, "{r}");
        // A window that pushed little: the estimate is not above 1.25x it,
        // and not below what went through.
        let r = d.wrote(100_000, MS, t0 + 800 * MS).unwrap();
        assert!((r - 0.625e6).abs() < 1.0, "{r}");
    }
}
