//! Progress display: an indicatif bar on a terminal, or with `--progress`
//! on a non-terminal one plain line a second. Both read the engine's live
//! counters from a thread of their own.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ferry_core::Stats;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::human;

pub struct Progress {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Progress {
    /// Start showing progress of `stats` if stderr is a terminal or
    /// `forced`; otherwise do nothing.
    pub fn start(stats: Arc<Stats>, forced: bool, quiet: bool) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let tty = std::io::stderr().is_terminal();
        if quiet || !(tty || forced) {
            return Self { stop, thread: None };
        }
        let st = stop.clone();
        let thread = std::thread::spawn(move || {
            if tty {
                bar(&stats, &st)
            } else {
                lines(&stats, &st)
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }

    pub fn finish(mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn bar(stats: &Stats, stop: &AtomicBool) {
    let pb = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr_with_hz(10));
    let style = ProgressStyle::with_template(
        "{bar:30.cyan/blue} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta} {msg}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    pb.set_style(style.progress_chars("=> "));
    while !stop.load(Relaxed) {
        pb.set_length(stats.bytes_transferred.load(Relaxed));
        pb.set_position(stats.bytes_done.load(Relaxed));
        pb.set_message(format!(
            "files {}/{}",
            stats.files_transferred.load(Relaxed),
            stats.files_total.load(Relaxed)
        ));
        std::thread::sleep(Duration::from_millis(100));
    }
    pb.finish_and_clear();
}

fn lines(stats: &Stats, stop: &AtomicBool) {
    let start = Instant::now();
    let mut last = Instant::now();
    while !stop.load(Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
        if last.elapsed() >= Duration::from_secs(1) {
            last = Instant::now();
            let done = stats.bytes_done.load(Relaxed);
            errln!(
                "ferry: {} / {}, {}, files {}/{}",
                human::bytes(done),
                human::bytes(stats.bytes_transferred.load(Relaxed)),
                human::rate(done, start.elapsed().as_secs_f64()),
                stats.files_transferred.load(Relaxed),
                stats.files_total.load(Relaxed)
            );
        }
    }
}
