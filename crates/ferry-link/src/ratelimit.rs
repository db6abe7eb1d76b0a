//! `--bwlimit`: a token bucket shared by every clone of a link's sender.

use std::sync::Mutex;

/// A token bucket: at most `rate` bytes a second, bursts of 1/20 s.
pub struct RateLimit {
    rate: f64,
    state: Mutex<(f64, std::time::Instant)>,
}

impl RateLimit {
    pub fn new(bytes_per_sec: u64) -> Self {
        Self {
            rate: bytes_per_sec.max(1) as f64,
            state: Mutex::new((0.0, std::time::Instant::now())),
        }
    }

    /// Wait until `n` bytes may go.
    pub fn take(&self, n: u64) {
        let wait = {
            let Ok(mut g) = self.state.lock() else { return };
            let now = std::time::Instant::now();
            let burst = self.rate / 20.0;
            let (tokens, last) = *g;
            let tokens =
                (tokens + now.duration_since(last).as_secs_f64() * self.rate).min(burst) - n as f64;
            *g = (tokens, now);
            if tokens < 0.0 {
                -tokens / self.rate
            } else {
                0.0
            }
        };
        if wait > 0.0 {
            std::thread::sleep(std::time::Duration::from_secs_f64(wait));
        }
    }
}
