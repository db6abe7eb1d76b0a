//! How many cores compression may use right now: the machine's idle
//! cores plus what this process's compressors themselves used, measured
//! over windows of [`WINDOW`] (`/proc/stat` on Linux; unknown elsewhere).
//!
//! Owns the process-wide sample and the compressors' CPU counter. It must
//! not decide anything: [`crate::auto`] weighs the estimate. Compressing
//! on a machine with no idle core takes the CPU from the link's own work
//! (ssh's cipher, the peer on the same host), so a block shrunk there
//! arrives later than the same block raw.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Length of a measuring window.
pub const WINDOW: Duration = Duration::from_millis(100);
/// Length of the first window: blocks go raw until it has passed, so it
/// is short (five ticks of each core at the usual 100 Hz).
pub const FIRST_WINDOW: Duration = Duration::from_millis(100);

/// What [`free`] knows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Free {
    /// The first window has not passed yet.
    Measuring,
    /// Cores compression may use.
    Cores(f64),
    /// No way to tell on this system (no `/proc/stat`).
    Unknown,
}

/// Counters of one look at the machine: idle and total CPU ticks (all
/// cores), and nanoseconds of CPU this process's compressors had used.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Sample {
    pub idle: u64,
    pub total: u64,
    pub own_ns: u64,
}

/// Cores compression may use over the window from `a` to `b`, `wall`
/// long, on a machine of `cores`: the idle share of every core, plus the
/// cores the compressors kept busy themselves. `None` when the ticks did
/// not move (a window shorter than a tick).
pub(crate) fn free_cores(a: Sample, b: Sample, wall: Duration, cores: f64) -> Option<f64> {
    let total = b.total.checked_sub(a.total).filter(|t| *t > 0)? as f64;
    let idle = b.idle.saturating_sub(a.idle) as f64;
    let wall = wall.as_secs_f64();
    if wall <= 0.0 {
        return None;
    }
    let own = b.own_ns.saturating_sub(a.own_ns) as f64 * 1e-9 / wall;
    Some((cores * (idle / total).min(1.0) + own).min(cores))
}

/// The aggregate `cpu` line of `/proc/stat`: (idle + iowait, all).
pub(crate) fn parse_stat(text: &str) -> Option<(u64, u64)> {
    let line = text.lines().next()?;
    let mut f = line.split_ascii_whitespace();
    if f.next()? != "cpu" {
        return None;
    }
    // user nice system idle iowait irq softirq steal (guest time is
    // already in user).
    let v: Vec<u64> = f.take(8).map(|x| x.parse().ok()).collect::<Option<_>>()?;
    if v.len() < 5 {
        return None;
    }
    Some((v[3] + v[4], v.iter().sum()))
}

/// CPU nanoseconds spent compressing, by every compressor that watches
/// the CPU (see [`note_compressing`]).
static OWN_NS: AtomicU64 = AtomicU64::new(0);
/// The last estimate (f64 bits; NaN while unknown).
static FREE: AtomicU64 = AtomicU64::new(u64::MAX);
/// The last look, and whether `/proc/stat` could not be read.
static LAST: Mutex<(Option<(Instant, Sample)>, bool)> = Mutex::new((None, false));

/// Count `secs` of CPU that a compressor spent.
pub(crate) fn note_compressing(secs: f64) {
    OWN_NS.fetch_add((secs.max(0.0) * 1e9) as u64, Ordering::Relaxed);
}

/// Cores compression may use, refreshed when a window has passed.
pub(crate) fn free() -> Free {
    let unavailable = refresh(Instant::now());
    let v = f64::from_bits(FREE.load(Ordering::Relaxed));
    if v.is_finite() {
        Free::Cores(v)
    } else if unavailable {
        Free::Unknown
    } else {
        Free::Measuring
    }
}

/// Take a new look if a window has passed; true when there is no
/// `/proc/stat` to look at.
fn refresh(now: Instant) -> bool {
    // One thread looks; the others use the estimate it leaves.
    let Ok(mut guard) = LAST.try_lock() else {
        return false;
    };
    let (last, unavailable) = &mut *guard;
    if *unavailable {
        return true;
    }
    let measured = f64::from_bits(FREE.load(Ordering::Relaxed)).is_finite();
    let window = if measured { WINDOW } else { FIRST_WINDOW };
    if last.is_some_and(|(t, _)| now.saturating_duration_since(t) < window) {
        return false;
    }
    let Some((idle, total)) = std::fs::read_to_string("/proc/stat")
        .ok()
        .as_deref()
        .and_then(parse_stat)
    else {
        *unavailable = true;
        return true;
    };
    let s = Sample {
        idle,
        total,
        own_ns: OWN_NS.load(Ordering::Relaxed),
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    if let Some((t, a)) = *last {
        if let Some(f) = free_cores(a, s, now.saturating_duration_since(t), cores) {
            FREE.store(f.to_bits(), Ordering::Relaxed);
        }
    }
    *last = Some((now, s));
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(idle: u64, total: u64, own_ns: u64) -> Sample {
        Sample {
            idle,
            total,
            own_ns,
        }
    }

    #[test]
    fn idle_cores_and_the_compressors_own_use_are_free() {
        let w = Duration::from_millis(100);
        // 2 cores, 20 ticks: 10 idle (one core), compressors used 50 ms of
        // the 100: one and a half cores.
        let f = free_cores(s(100, 1000, 0), s(110, 1020, 50_000_000), w, 2.0).unwrap();
        assert!((f - 1.5).abs() < 1e-9, "{f}");
        // A saturated machine where compression used nothing: none free.
        let f = free_cores(s(100, 1000, 0), s(100, 1020, 0), w, 2.0).unwrap();
        assert_eq!(f, 0.0);
        // Never more than the machine has.
        let f = free_cores(s(0, 0, 0), s(20, 20, 900_000_000), w, 2.0).unwrap();
        assert_eq!(f, 2.0);
        // Ticks that did not move say nothing.
        assert_eq!(free_cores(s(1, 5, 0), s(1, 5, 9), w, 2.0), None);
        assert_eq!(
            free_cores(s(1, 5, 0), s(2, 9, 0), Duration::ZERO, 2.0),
            None
        );
    }

    #[test]
    fn the_cpu_line_of_proc_stat() {
        let t = "cpu  100 5 50 800 20 1 2 3 0 0\ncpu0 50 2 25 400 10 0 1 1 0 0\n";
        assert_eq!(parse_stat(t), Some((820, 981)));
        assert_eq!(parse_stat("cpu0 1 2 3 4 5\n"), None);
        assert_eq!(parse_stat("cpu 1 2 x 4 5\n"), None);
        assert_eq!(parse_stat("cpu 1 2 3\n"), None);
        assert_eq!(parse_stat(""), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_machine_reports_an_estimate_within_its_cores() {
        free();
        std::thread::sleep(WINDOW + Duration::from_millis(30));
        free();
        std::thread::sleep(WINDOW + Duration::from_millis(30));
        let Free::Cores(f) = free() else {
            panic!("no estimate from /proc/stat: {:?}", free());
        };
        let cores = std::thread::available_parallelism().unwrap().get() as f64;
        assert!((0.0..=cores).contains(&f), "{f} of {cores}");
    }
}
