//! The one progress display of every command: an indicatif bar on a
//! terminal, or with `--progress` on a non-terminal one plain line a
//! second. It reads a [`Meter`] (the engine's live counters) from a thread
//! of its own: a sync has a total and a bar; a stream has none and shows
//! its rates and buffer instead.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::human;

/// What a progress display reads.
pub trait Meter: Send + 'static {
    /// Bytes to do in all, when known.
    fn total(&self) -> Option<u64>;
    /// Bytes done so far.
    fn done(&self) -> u64;
    /// The rest of the line (files done, rates, buffer fill).
    fn message(&mut self) -> String;
    /// The work ended on its own (a stream's end).
    fn finished(&self) -> bool {
        false
    }
    /// Files done and files in all, where the work has files.
    fn files(&self) -> Option<(u64, u64)> {
        None
    }
}

/// A sync's counters: a bar over the bytes of the changed files.
pub struct SyncMeter(pub Arc<ferry_core::Stats>);

impl Meter for SyncMeter {
    fn total(&self) -> Option<u64> {
        Some(self.0.bytes_transferred.load(Relaxed))
    }
    fn done(&self) -> u64 {
        self.0.bytes_done.load(Relaxed)
    }
    fn message(&mut self) -> String {
        format!(
            "files {}/{}",
            self.0.files_transferred.load(Relaxed),
            self.0.files_total.load(Relaxed)
        )
    }
    fn files(&self) -> Option<(u64, u64)> {
        Some((
            self.0.files_transferred.load(Relaxed),
            self.0.files_total.load(Relaxed),
        ))
    }
}

/// A stream's counters, mbuffer-like: input and output rates since the
/// last line, buffer fill, compression ratio.
pub struct StreamMeter {
    stats: Arc<ferry_stream::Stats>,
    last: (Instant, u64, u64),
}

impl StreamMeter {
    pub fn new(stats: Arc<ferry_stream::Stats>) -> Self {
        StreamMeter {
            stats,
            last: (Instant::now(), 0, 0),
        }
    }
}

impl Meter for StreamMeter {
    fn total(&self) -> Option<u64> {
        None
    }
    fn done(&self) -> u64 {
        ferry_stream::Stats::get(&self.stats.plain_out)
    }
    fn message(&mut self) -> String {
        let now = Instant::now();
        let i = ferry_stream::Stats::get(&self.stats.plain_in);
        let o = self.done();
        let dt = now.duration_since(self.last.0).as_secs_f64().max(1e-3);
        let line = format!(
            "in @ {}, out @ {}, buffer {:3.0}% full, ratio {:.2}",
            human::rate(i.saturating_sub(self.last.1), dt),
            human::rate(o.saturating_sub(self.last.2), dt),
            self.stats.fill_pct(),
            self.stats.ratio()
        );
        self.last = (now, i, o);
        line
    }
    fn finished(&self) -> bool {
        self.stats.done.load(Relaxed)
    }
}

pub struct Progress {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Progress {
    /// Start showing `meter` if stderr is a terminal or `forced`, and not
    /// `quiet`; otherwise do nothing.
    pub fn start(meter: impl Meter, forced: bool, quiet: bool) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let tty = std::io::stderr().is_terminal();
        if quiet || !(tty || forced) {
            return Self { stop, thread: None };
        }
        let st = stop.clone();
        let thread = std::thread::Builder::new()
            .name("ferry-progress".into())
            .spawn(move || {
                if tty {
                    bar(meter, &st)
                } else {
                    lines(meter, &st)
                }
            })
            .ok();
        Self { stop, thread }
    }

    /// One JSON object a second on stderr, for programs (a Pod's log):
    /// whatever stderr is, and with `--json` too (that goes to stdout).
    pub fn start_json(meter: impl Meter) -> Self {
        Self::start_json_as(meter, None)
    }

    /// [`Progress::start_json`], each object naming `session` (a
    /// daemon's sessions run side by side).
    pub fn start_json_as(meter: impl Meter, session: Option<String>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let thread = std::thread::Builder::new()
            .name("ferry-progress".into())
            .spawn(move || json_lines(meter, &st, session.as_deref()))
            .ok();
        Self { stop, thread }
    }

    pub fn finish(mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn running(m: &impl Meter, stop: &AtomicBool) -> bool {
    !stop.load(Relaxed) && !m.finished()
}

fn bar(mut m: impl Meter, stop: &AtomicBool) {
    let target = ProgressDrawTarget::stderr_with_hz(10);
    let (pb, template) = match m.total() {
        Some(_) => (
            ProgressBar::with_draw_target(Some(0), target),
            "{bar:30.cyan/blue} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta} {msg}",
        ),
        None => (
            ProgressBar::with_draw_target(None, target),
            "{bytes} {binary_bytes_per_sec} {msg}",
        ),
    };
    let style =
        ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar());
    pb.set_style(style.progress_chars("=> "));
    let mut last = Instant::now();
    while running(&m, stop) {
        if let Some(t) = m.total() {
            pb.set_length(t);
        }
        pb.set_position(m.done());
        // Rates in the message are per interval: refresh it twice a second.
        if last.elapsed() >= Duration::from_millis(500) {
            last = Instant::now();
            pb.set_message(m.message());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    pb.finish_and_clear();
}

/// Call `f` with the meter and the seconds since the start, once a
/// second until the work ends.
fn each_second<M: Meter>(m: &mut M, stop: &AtomicBool, mut f: impl FnMut(&mut M, f64)) {
    let start = Instant::now();
    let mut last = Instant::now();
    while running(m, stop) {
        std::thread::sleep(Duration::from_millis(100));
        if last.elapsed() >= Duration::from_secs(1) {
            last = Instant::now();
            f(m, start.elapsed().as_secs_f64());
        }
    }
}

fn lines(mut m: impl Meter, stop: &AtomicBool) {
    each_second(&mut m, stop, |m, secs| {
        let done = m.done();
        let of = m.total().map(|t| format!(" / {}", human::bytes(t)));
        errln!(
            "ferry: {}{}, {}, {}",
            human::bytes(done),
            of.unwrap_or_default(),
            human::rate(done, secs),
            m.message()
        );
    });
}

/// Where a sync stands, from its counters: `starting` (nothing listed),
/// `comparing` (files listed, no data moved yet), `transferring`,
/// `finishing` (all data there: commits, deletions, fsync), `done`.
fn phase(total: Option<u64>, done: u64, files: Option<(u64, u64)>, over: bool) -> &'static str {
    match (over, total, files) {
        (true, _, _) => "done",
        (_, Some(t), _) if t > 0 && done >= t => "finishing",
        (_, _, _) if done > 0 => "transferring",
        (_, _, Some((_, n))) if n > 0 => "comparing",
        _ => "starting",
    }
}

/// The JSON progress object: bytes done and in all, the rate since the
/// start, the seconds left at that rate, the phase, files.
fn json_line(m: &impl Meter, elapsed: f64, over: bool, session: Option<&str>) -> String {
    let done = m.done();
    let total = m.total();
    let rate = if elapsed > 0.0 {
        done as f64 / elapsed
    } else {
        0.0
    };
    let eta = match total {
        Some(t) if rate > 0.0 && t >= done => Some(((t - done) as f64 / rate).round() as u64),
        _ => None,
    };
    let mut o = serde_json::json!({
        "elapsed_s": (elapsed * 10.0).round() / 10.0,
        "bytes_done": done,
        "bytes_total": total,
        "rate_bps": rate.round() as u64,
        "eta_s": eta,
        "phase": phase(total, done, m.files(), over),
    });
    if let Some((f, n)) = m.files() {
        o["files_done"] = f.into();
        o["files_total"] = n.into();
    }
    if let Some(s) = session {
        o["session"] = s.into();
    }
    o.to_string()
}

fn json_lines(mut m: impl Meter, stop: &AtomicBool, session: Option<&str>) {
    let start = Instant::now();
    each_second(&mut m, stop, |m, secs| {
        errln!("{}", json_line(m, secs, false, session))
    });
    errln!(
        "{}",
        json_line(&m, start.elapsed().as_secs_f64(), true, session)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(Option<u64>, u64, Option<(u64, u64)>);

    impl Meter for Fixed {
        fn total(&self) -> Option<u64> {
            self.0
        }
        fn done(&self) -> u64 {
            self.1
        }
        fn message(&mut self) -> String {
            String::new()
        }
        fn files(&self) -> Option<(u64, u64)> {
            self.2
        }
    }

    #[test]
    fn json_progress_says_where_the_sync_stands() {
        let v = |m: Fixed, t: f64, over: bool| -> serde_json::Value {
            serde_json::from_str(&json_line(&m, t, over, None)).unwrap()
        };
        let start = v(Fixed(Some(0), 0, Some((0, 0))), 0.0, false);
        assert_eq!(start["phase"], "starting");
        let mid = v(Fixed(Some(1000), 250, Some((1, 4))), 2.0, false);
        assert_eq!(mid["phase"], "transferring");
        assert_eq!(mid["rate_bps"], 125);
        assert_eq!(mid["eta_s"], 6);
        assert_eq!(mid["files_total"], 4);
        assert_eq!(
            v(Fixed(Some(1000), 0, Some((0, 9))), 1.0, false)["phase"],
            "comparing"
        );
        assert_eq!(
            v(Fixed(Some(1000), 1000, None), 1.0, false)["phase"],
            "finishing"
        );
        assert_eq!(v(Fixed(Some(1000), 1000, None), 1.0, true)["phase"], "done");
    }
}
