//! How many cores compression may use right now: the machine's idle
//! cores (`/proc/stat`), but no more than this process's own share
//! (`available_parallelism`, which follows a cgroup's CPU quota) leaves
//! after its other work, plus what its compressors themselves used;
//! measured over windows of [`WINDOW`]. Unknown where `/proc/stat` is
//! missing or its counters do not move (gVisor shows zeros).
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
/// Length of the first window, whose look is thrown away: while it runs
/// the pipes, ssh's channel and the socket's buffers fill at memory speed,
/// so the machine is as busy on a gigabit link as on loopback. The
/// estimate starts with the window after it (ten ticks of each core at
/// the usual 100 Hz).
pub const FIRST_WINDOW: Duration = Duration::from_millis(100);

/// What [`free`] knows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Free {
    /// The first window (see [`FIRST_WINDOW`]) has not passed yet.
    Settling,
    /// The second window, the first one measured, has not passed yet.
    Measuring,
    /// Cores compression may use (`free`: idle, within this process's
    /// share, plus what the compressors used themselves) and the cores
    /// nobody used (`spare`: the same without the compressors' own use;
    /// near zero while the machine is saturated, compressing or not).
    Cores { free: f64, spare: f64 },
    /// No way to tell on this system (no `/proc/stat`).
    Unknown,
}

/// Counters of one look: the machine's idle and total CPU ticks (all its
/// cores), nanoseconds of CPU this process had used, and how many of them
/// its compressors used.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Sample {
    pub idle: u64,
    pub total: u64,
    pub proc_ns: u64,
    pub own_ns: u64,
}

/// The machine: how many cores `/proc/stat` counts, and how many this
/// process may use (its cgroup quota or affinity).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Cores {
    pub host: f64,
    pub mine: f64,
}

/// Cores compression may use over the window from `a` to `b`, `wall`
/// long: the idle share of the machine's cores, but no more than this
/// process's share leaves after its work other than compressing (the
/// spare cores), plus the cores the compressors kept busy themselves; at
/// most `mine`. Returns (free, spare); `None` when the ticks did not move.
pub(crate) fn free_cores(a: Sample, b: Sample, wall: Duration, cores: Cores) -> Option<(f64, f64)> {
    let total = b.total.checked_sub(a.total).filter(|t| *t > 0)? as f64;
    let idle = b.idle.saturating_sub(a.idle) as f64;
    let wall = wall.as_secs_f64();
    if wall <= 0.0 {
        return None;
    }
    let per_wall = |x: u64, y: u64| y.saturating_sub(x) as f64 * 1e-9 / wall;
    let own = per_wall(a.own_ns, b.own_ns);
    let other_work = (per_wall(a.proc_ns, b.proc_ns) - own).max(0.0);
    let idle_cores = cores.host * (idle / total).min(1.0);
    // Within the process's share, what the compressors use is not spare
    // either: a quota it fills is saturated however idle the host is.
    let spare = idle_cores.min((cores.mine - other_work - own).max(0.0));
    Some((
        (spare + own).clamp(0.0, cores.mine),
        spare.clamp(0.0, cores.mine),
    ))
}

/// The aggregate `cpu` line of `/proc/stat` and the number of `cpuN`
/// lines: (idle + iowait, all, cores).
pub(crate) fn parse_stat(text: &str) -> Option<(u64, u64, usize)> {
    let mut lines = text.lines();
    let mut f = lines.next()?.split_ascii_whitespace();
    if f.next()? != "cpu" {
        return None;
    }
    // user nice system idle iowait irq softirq steal (guest time is
    // already in user).
    let v: Vec<u64> = f.take(8).map(|x| x.parse().ok()).collect::<Option<_>>()?;
    if v.len() < 5 {
        return None;
    }
    let cores = lines
        .take_while(|l| l.starts_with("cpu"))
        .filter(|l| l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .count();
    Some((v[3] + v[4], v.iter().sum(), cores.max(1)))
}

/// CPU nanoseconds spent compressing, by every compressor that watches
/// the CPU (see [`note_compressing`]).
static OWN_NS: AtomicU64 = AtomicU64::new(0);
/// What the last look found, for the threads that do not take the next
/// one: [`Free`] in one word (see [`encode`]), so that no thread sees a
/// phase without its estimate.
static STATE: AtomicU64 = AtomicU64::new(SETTLING);
/// This process's share of the cores at the last look (f64 bits), stored
/// before [`STATE`].
static CORES: AtomicU64 = AtomicU64::new(u64::MAX);
/// The looks themselves: one thread takes each.
static LOOKS: Mutex<Looks> = Mutex::new(Looks::new());

/// [`Free`]'s phases as NaN payloads, which no estimate can be: an
/// estimate is two finite `f32`s (free, spare), free in the high half.
const SETTLING: u64 = 0x7ff8_0000_0000_0001;
const MEASURING: u64 = 0x7ff8_0000_0000_0002;
const UNKNOWN: u64 = 0x7ff8_0000_0000_0003;

/// No compressor looked for this long: the next look starts over with a
/// window thrown away, as at the start (a daemon's next session, a retry
/// in the same process, bulk data that comes long after the first block).
pub const IDLE_GAP: Duration = Duration::from_secs(2);

pub(crate) fn encode(f: Free) -> u64 {
    match f {
        Free::Settling => SETTLING,
        Free::Measuring => MEASURING,
        Free::Unknown => UNKNOWN,
        Free::Cores { free, spare } if free.is_finite() && spare.is_finite() => {
            let half = |x: f64| u64::from((x.max(0.0) as f32).to_bits());
            half(free) << 32 | half(spare)
        }
        Free::Cores { .. } => UNKNOWN,
    }
}

pub(crate) fn decode(bits: u64) -> Free {
    match bits {
        SETTLING => Free::Settling,
        MEASURING => Free::Measuring,
        UNKNOWN => Free::Unknown,
        b => Free::Cores {
            free: f64::from(f32::from_bits((b >> 32) as u32)),
            spare: f64::from(f32::from_bits(b as u32)),
        },
    }
}

/// The windows so far: the sample that opened the current one, and what
/// the last closed window gave.
#[derive(Debug)]
pub(crate) struct Looks {
    last: Option<(Instant, Sample)>,
    state: Free,
    /// The spare cores of the last [`SPARE_WINDOWS`] measured windows,
    /// newest last.
    spares: [f64; SPARE_WINDOWS],
    /// How many of `spares` are measured.
    measured: usize,
}

/// Windows over which the spare cores are reported as their most: a
/// machine that had a core to spare in one of them is not saturated. While
/// compressing for a link that leaves cores idle, the compressors take the
/// idle cores, and most windows, not all, show none spare (measured at
/// 1 Gbit/s over ssh on two cores: 0.0-0.38 a window); on a link that
/// saturates the machine (loopback ssh), no window does.
pub const SPARE_WINDOWS: usize = 3;

impl Looks {
    pub(crate) const fn new() -> Looks {
        Looks {
            last: None,
            state: Free::Settling,
            spares: [0.0; SPARE_WINDOWS],
            measured: 0,
        }
    }

    /// Whether a look at `now` would close a window.
    pub(crate) fn due(&self, now: Instant) -> bool {
        let window = match self.state {
            Free::Settling => FIRST_WINDOW,
            Free::Unknown => return false,
            _ => WINDOW,
        };
        self.last
            .is_none_or(|(t, _)| now.saturating_duration_since(t) >= window)
    }

    /// A look at `now`: `sample` is `None` when `/proc/stat` is missing
    /// or unreadable as such. The look that closes the first window opens
    /// the second instead (see [`FIRST_WINDOW`]), and so does the first
    /// look after [`IDLE_GAP`]; a window without a tick means counters
    /// that do not move.
    pub(crate) fn look(&mut self, now: Instant, sample: Option<Sample>, cores: Cores) -> Free {
        let Some(s) = sample else {
            self.state = Free::Unknown;
            return self.state;
        };
        let idle = self
            .last
            .is_some_and(|(t, _)| now.saturating_duration_since(t) >= IDLE_GAP);
        match (self.last, self.state) {
            (None, _) => {}
            _ if idle => {
                self.state = Free::Settling;
                self.measured = 0;
            }
            (Some(_), Free::Settling) => self.state = Free::Measuring,
            (Some((t, a)), _) => {
                self.state = match free_cores(a, s, now.saturating_duration_since(t), cores) {
                    Some((free, spare)) => Free::Cores {
                        free,
                        spare: self.most_spare(spare),
                    },
                    None => Free::Unknown,
                }
            }
        }
        self.last = Some((now, s));
        self.state
    }

    /// Note a window's spare cores; the most of the last
    /// [`SPARE_WINDOWS`].
    fn most_spare(&mut self, spare: f64) -> f64 {
        self.spares.rotate_left(1);
        self.spares[SPARE_WINDOWS - 1] = spare;
        self.measured = (self.measured + 1).min(SPARE_WINDOWS);
        self.spares[SPARE_WINDOWS - self.measured..]
            .iter()
            .fold(0.0, |m, &x| x.max(m))
    }
}

/// Count `secs` of CPU that a compressor spent.
pub(crate) fn note_compressing(secs: f64) {
    OWN_NS.fetch_add((secs.max(0.0) * 1e9) as u64, Ordering::Relaxed);
}

/// Cores compression may use, refreshed when a window has passed.
pub(crate) fn free() -> Free {
    refresh(Instant::now());
    decode(STATE.load(Ordering::Acquire))
}

/// Take a new look if a window has passed.
fn refresh(now: Instant) {
    // One thread looks; the others use the estimate it leaves.
    let Ok(mut looks) = LOOKS.try_lock() else {
        return;
    };
    if !looks.due(now) {
        return;
    }
    // Missing or unparsable: no way to tell here, for good. Any other
    // error (out of file descriptors) only skips this look.
    let parsed = match std::fs::read_to_string("/proc/stat") {
        Ok(text) => parse_stat(&text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(_) => return,
    };
    let host = parsed.map_or(1, |(_, _, n)| n);
    let c = cores(host);
    let sample = parsed.map(|(idle, total, _)| {
        let cpu = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
        Sample {
            idle,
            total,
            proc_ns: (cpu.tv_sec as u64).saturating_mul(1_000_000_000) + cpu.tv_nsec as u64,
            own_ns: OWN_NS.load(Ordering::Relaxed),
        }
    });
    let state = looks.look(now, sample, c);
    CORES.store(c.mine.to_bits(), Ordering::Relaxed);
    STATE.store(encode(state), Ordering::Release);
}

/// The cores of the machine and this process's share of them.
fn cores(host: usize) -> Cores {
    let mine = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    Cores {
        host: host as f64,
        mine: mine.min(host as f64).max(1.0),
    }
}

/// This process's share of the cores, as of the last look.
pub(crate) fn my_cores() -> f64 {
    let c = f64::from_bits(CORES.load(Ordering::Relaxed));
    if c.is_finite() {
        c
    } else {
        1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn s(idle: u64, total: u64, proc_ns: u64, own_ns: u64) -> Sample {
        Sample {
            idle,
            total,
            proc_ns,
            own_ns,
        }
    }

    fn two(host: f64) -> Cores {
        Cores { host, mine: 2.0 }
    }

    /// One core idle, none of it the compressors'.
    fn one() -> Free {
        Free::Cores {
            free: 1.0,
            spare: 1.0,
        }
    }

    #[test]
    fn idle_cores_and_the_compressors_own_use_are_free() {
        let w = Duration::from_millis(100);
        // 2 cores, 20 ticks: 10 idle (one core); this process used 60 ms,
        // 50 of them compressing: one and a half cores.
        let a = s(100, 1000, 0, 0);
        let (f, spare) = free_cores(a, s(110, 1020, 60 * MS, 50 * MS), w, two(2.0)).unwrap();
        assert!((f - 1.5).abs() < 1e-9, "{f}");
        assert!((spare - 1.0).abs() < 1e-9, "{spare}");
        // A saturated machine where compression used nothing: none free.
        let f = free_cores(a, s(100, 1020, 90 * MS, 0), w, two(2.0)).unwrap();
        assert_eq!(f, (0.0, 0.0));
        // Saturated while compressing: what the compressors use is free,
        // nothing is spare.
        let f = free_cores(a, s(100, 1020, 90 * MS, 60 * MS), w, two(2.0)).unwrap();
        assert!((f.0 - 0.6).abs() < 1e-9 && f.1 == 0.0, "{f:?}");
        // Never more than this process's share, and compressors that
        // fill it leave none spare.
        let b = s(20, 20, 900 * MS, 900 * MS);
        assert_eq!(free_cores(s(0, 0, 0, 0), b, w, two(2.0)), Some((2.0, 0.0)));
        // Ticks that did not move say nothing.
        let still = s(1, 5, 9, 9);
        assert_eq!(free_cores(s(1, 5, 0, 0), still, w, two(2.0)), None);
        let z = Duration::ZERO;
        assert_eq!(free_cores(s(1, 5, 0, 0), s(2, 9, 0, 0), z, two(2.0)), None);
    }

    #[test]
    fn a_quota_of_two_on_a_big_busy_host_counts_its_own_share() {
        let w = Duration::from_millis(100);
        // 16 host cores, 70% busy (4.8 idle); this process may use 2 and
        // used half a core for other work: 1.5 cores are its to use.
        let a = s(0, 0, 0, 0);
        let (f, _) = free_cores(a, s(48, 160, 50 * MS, 0), w, two(16.0)).unwrap();
        assert!((f - 1.5).abs() < 1e-9, "{f}");
        // The host is full: its idle share is all there is.
        let (f, _) = free_cores(a, s(2, 160, 50 * MS, 0), w, two(16.0)).unwrap();
        assert!((f - 0.2).abs() < 1e-9, "{f}");
        // The host is idle but the share is full (0.6 of a core of other
        // work, 1.4 compressing): saturated, nothing spare.
        let (f, spare) = free_cores(a, s(130, 160, 200 * MS, 140 * MS), w, two(16.0)).unwrap();
        assert!((f - 1.4).abs() < 1e-9 && spare == 0.0, "{f} {spare}");
    }

    #[test]
    fn the_cpu_line_of_proc_stat() {
        let t = "cpu  100 5 50 800 20 1 2 3 0 0\ncpu0 50 2 25 400 10 0 1 1 0 0\n\
                 cpu1 50 3 25 400 10 1 1 2 0 0\nintr 5\n";
        assert_eq!(parse_stat(t), Some((820, 981, 2)));
        assert_eq!(parse_stat("cpu0 1 2 3 4 5\n"), None);
        assert_eq!(parse_stat("cpu 1 2 x 4 5\n"), None);
        assert_eq!(parse_stat("cpu 1 2 3\n"), None);
        assert_eq!(parse_stat(""), None);
    }

    #[test]
    fn the_first_window_is_thrown_away_and_the_second_measured() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut l = Looks::new();
        assert!(l.due(t0));
        assert_eq!(l.look(t0, Some(s(0, 0, 0, 0)), two(2.0)), Free::Settling);
        assert!(!l.due(at(50)));
        // The buffers filled: both cores busy, nothing of it compressing.
        // Thrown away, not taken as a machine with no core to spare.
        assert!(l.due(at(100)));
        let busy = s(0, 20, 100 * MS, 0);
        assert_eq!(l.look(at(100), Some(busy), two(2.0)), Free::Measuring);
        assert!(!l.due(at(150)));
        // The link drains at its own rate: one core idle.
        let f = l.look(at(200), Some(s(10, 40, 150 * MS, 0)), two(2.0));
        assert_eq!(f, one());
        assert!(l.due(at(300)));
        // Counters that stop moving: unknown from then on.
        assert_eq!(
            l.look(at(300), Some(s(10, 40, 150 * MS, 0)), two(2.0)),
            Free::Unknown
        );
        assert!(!l.due(at(900)));
    }

    #[test]
    fn after_an_idle_gap_a_window_is_thrown_away_again() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut l = Looks::new();
        l.look(t0, Some(s(0, 0, 0, 0)), two(2.0));
        l.look(at(100), Some(s(0, 20, 0, 0)), two(2.0));
        assert_eq!(l.look(at(200), Some(s(10, 40, 0, 0)), two(2.0)), one());
        // An hour without a block (a daemon between sessions): the next
        // look does not average the idle hour, and the burst after it
        // is not measured either.
        let later = at(200) + Duration::from_secs(3600);
        let idle = s(700_000, 720_040, 0, 0);
        assert_eq!(l.look(later, Some(idle), two(2.0)), Free::Settling);
        let busy = s(700_000, 720_060, 0, 0);
        let f = l.look(later + FIRST_WINDOW, Some(busy), two(2.0));
        assert_eq!(f, Free::Measuring);
        let f = l.look(
            later + FIRST_WINDOW + WINDOW,
            Some(s(700_010, 720_080, 0, 0)),
            two(2.0),
        );
        assert_eq!(f, one());
    }

    #[test]
    fn the_spare_cores_are_the_most_of_the_last_windows() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut l = Looks::new();
        l.look(t0, Some(s(0, 0, 0, 0)), two(2.0));
        l.look(at(100), Some(s(0, 20, 0, 0)), two(2.0));
        // Window by window (20 ticks each): idle 12, then 0, 2, 4, 0 (the
        // compressors took the rest), 0.
        let mut idle = 0;
        let mut got = Vec::new();
        for (i, ticks) in [12, 0, 2, 4, 0, 0].into_iter().enumerate() {
            idle += ticks;
            let at = at(200 + 100 * i as u64);
            let total = 20 * (i as u64 + 2);
            match l.look(at, Some(s(idle, total, 0, 0)), two(2.0)) {
                Free::Cores { free, spare } => {
                    assert!((free - ticks as f64 / 10.0).abs() < 1e-9, "{free}");
                    got.push((spare * 10.0).round() as u64);
                }
                f => panic!("{f:?}"),
            }
        }
        assert_eq!(got, [12, 12, 12, 4, 4, 4]);
        // After an idle gap the windows before it no longer count.
        let later = at(800) + IDLE_GAP;
        l.look(later, Some(s(1000, 2000, 0, 0)), two(2.0));
        l.look(later + FIRST_WINDOW, Some(s(1000, 2020, 0, 0)), two(2.0));
        let f = l.look(
            later + FIRST_WINDOW + WINDOW,
            Some(s(1001, 2040, 0, 0)),
            two(2.0),
        );
        assert!(
            matches!(f, Free::Cores { spare, .. } if (spare - 0.1).abs() < 1e-9),
            "{f:?}"
        );
    }

    #[test]
    fn phases_and_estimates_share_one_word() {
        for f in [
            Free::Settling,
            Free::Measuring,
            Free::Unknown,
            Free::Cores {
                free: 0.0,
                spare: 0.0,
            },
            Free::Cores {
                free: 1.5,
                spare: 0.25,
            },
            Free::Cores {
                free: 64.0,
                spare: 0.5,
            },
        ] {
            assert_eq!(decode(encode(f)), f);
        }
        let cores = |free, spare| Free::Cores { free, spare };
        assert_eq!(decode(encode(cores(f64::NAN, 1.0))), Free::Unknown);
        assert_eq!(decode(encode(cores(1.0, f64::INFINITY))), Free::Unknown);
        assert_eq!(decode(encode(cores(-1.0, -2.0))), cores(0.0, 0.0));
    }

    #[test]
    fn no_proc_stat_is_unknown_at_once() {
        let mut l = Looks::new();
        assert_eq!(l.look(Instant::now(), None, two(2.0)), Free::Unknown);
        assert!(!l.due(Instant::now() + Duration::from_secs(1)));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_machine_reports_an_estimate_within_its_cores() {
        // The first look, the end of the window thrown away, the end of
        // the measured one.
        free();
        std::thread::sleep(FIRST_WINDOW + Duration::from_millis(30));
        free();
        std::thread::sleep(WINDOW + Duration::from_millis(30));
        let Free::Cores { free: f, spare } = free() else {
            panic!("no estimate from /proc/stat: {:?}", free());
        };
        let cores = my_cores();
        assert!(cores >= 1.0, "{cores}");
        assert!((0.0..=cores).contains(&f), "{f} of {cores}");
        assert!((0.0..=f).contains(&spare), "{spare} spare of {f} free");
    }
}
