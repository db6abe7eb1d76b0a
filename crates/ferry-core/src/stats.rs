//! Live counters shared by the engine and whoever watches it (the CLI's
//! progress bar), and the final report.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};

use serde::Serialize;

use crate::itemize::{Change, Listed};

/// Counters updated while a run goes on. All fields are monotonic.
#[derive(Debug, Default)]
pub struct Stats {
    /// Non-directory entries in the source list (files, links).
    pub files_total: AtomicU64,
    /// Directory entries in the source list.
    pub dirs_total: AtomicU64,
    /// 1 when `--delete` was skipped after a read error on the sending side.
    pub delete_skipped: AtomicU64,
    pub files_transferred: AtomicU64,
    pub files_delta: AtomicU64,
    pub files_deleted: AtomicU64,
    pub files_failed: AtomicU64,
    /// Files that vanished or changed while the sender read them (not
    /// sent; warnings, see [`Stats::vanished`]).
    pub files_vanished: AtomicU64,
    /// Deletions `--max-delete` held back.
    pub deletes_held: AtomicU64,
    /// Logical size of the source's files.
    pub bytes_total: AtomicU64,
    /// Logical size of the files that are being transferred (the progress
    /// bar's total).
    pub bytes_transferred: AtomicU64,
    /// Logical bytes of transferred files completed so far (progress).
    pub bytes_done: AtomicU64,
    /// Bytes written to the destination (data only: holes and zero runs
    /// are not written).
    pub bytes_written: AtomicU64,
    /// Bytes reused from the destination's old copy (delta).
    pub bytes_matched: AtomicU64,
    /// Bytes that crossed the transport, both directions.
    pub bytes_wire: AtomicU64,
    /// Connections to the NBD export this side read or wrote (most at
    /// once; 0 without one).
    pub nbd_connections: AtomicU64,
    /// TCP connections of the `--direct` session (0: none, ssh's pipes).
    pub direct_connections: AtomicU64,
    /// Delta (or resumed) results that failed verification (re-sent whole).
    pub delta_mismatch: AtomicU64,
    /// Bytes of partial files from interrupted runs, verified against the
    /// source and kept instead of being sent again.
    pub bytes_resumed: AtomicU64,
    /// Times the run reconnected after the link dropped (`--retries`).
    pub reconnects: AtomicU64,
    /// Sessions that got as far as the peer's `Hello` (kept over
    /// reconnects): a run that never reached its peer is not retried.
    pub sessions: AtomicU64,
    /// Human-readable lines for entries that failed (capped).
    pub errors: Mutex<Vec<String>>,
    /// Who is told of each change as it happens ([`Stats::on_change`]);
    /// without one, changes are not kept (a run of millions of files
    /// would hold them all).
    sink: ChangeSink,
    /// Things the user should know that are not failures (a fallback).
    pub notices: Mutex<Vec<String>>,
}

type SinkFn = Box<dyn Fn(Listed<'_>) + Send + Sync>;

/// Who is told of each change as it happens.
#[derive(Default)]
struct ChangeSink(OnceLock<SinkFn>);

impl std::fmt::Debug for ChangeSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "ChangeSink(set)"
        } else {
            "ChangeSink(none)"
        })
    }
}

/// Most error lines kept.
pub const MAX_ERRORS: usize = 1000;

impl Stats {
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Relaxed);
    }

    pub fn error(&self, line: String) {
        self.files_failed.fetch_add(1, Relaxed);
        if let Ok(mut e) = self.errors.lock() {
            if e.len() < MAX_ERRORS {
                e.push(line);
            }
        }
    }

    /// A file that vanished or changed while it was read: counted apart
    /// from failures, its line kept with the notices (what the user should
    /// know that is not a failure).
    pub fn vanished(&self, line: String) {
        self.files_vanished.fetch_add(1, Relaxed);
        if let Ok(mut n) = self.notices.lock() {
            if n.len() < MAX_ERRORS {
                n.push(line);
            }
        }
    }

    /// An error line that is not an entry's failure (not counted).
    pub fn error_line(&self, line: String) {
        if let Ok(mut e) = self.errors.lock() {
            if e.len() < MAX_ERRORS {
                e.push(line);
            }
        }
    }

    /// A line the user should know that is not a failure; said once
    /// however many attempts of the run (`--retries`) come to it.
    pub fn notice(&self, line: String) {
        if let Ok(mut n) = self.notices.lock() {
            if !n.contains(&line) {
                n.push(line);
            }
        }
    }

    /// Hand every later change to `f` as it happens. Set once; later
    /// calls are ignored.
    pub fn on_change(&self, f: impl Fn(Listed<'_>) + Send + Sync + 'static) {
        let _ = self.sink.0.set(Box::new(f));
    }

    /// Whether anyone listens to changes (building one costs nothing then).
    pub fn listing(&self) -> bool {
        self.sink.0.get().is_some()
    }

    /// One change to an entry (see [`crate::itemize`]).
    pub fn change(&self, c: &Change) {
        if let Some(f) = self.sink.0.get() {
            f(Listed::Change(c));
        }
    }

    /// A line listed with the changes that is not one (a file sent
    /// again, a special file skipped).
    pub fn change_line(&self, line: String) {
        if let Some(f) = self.sink.0.get() {
            f(Listed::Line(&line));
        }
    }

    /// Start counting afresh for another attempt at the same run (after a
    /// reconnect): every counter but `reconnects` and `sessions` goes back
    /// to zero, and
    /// the error lines of the attempt that failed are dropped (what still
    /// fails will fail again). The caller keeps what the attempt did.
    pub fn restart(&self) {
        for c in [
            &self.files_total,
            &self.dirs_total,
            &self.delete_skipped,
            &self.files_transferred,
            &self.files_delta,
            &self.files_deleted,
            &self.files_failed,
            &self.files_vanished,
            &self.deletes_held,
            &self.bytes_total,
            &self.bytes_transferred,
            &self.bytes_done,
            &self.bytes_written,
            &self.bytes_matched,
            &self.bytes_wire,
            &self.nbd_connections,
            &self.direct_connections,
            &self.delta_mismatch,
            &self.bytes_resumed,
        ] {
            c.store(0, Relaxed);
        }
        if let Ok(mut l) = self.errors.lock() {
            l.clear();
        }
    }

    pub fn report(&self, seconds: f64) -> Report {
        Report {
            files_total: self.files_total.load(Relaxed),
            dirs_total: self.dirs_total.load(Relaxed),
            delete_skipped: self.delete_skipped.load(Relaxed) > 0,
            files_transferred: self.files_transferred.load(Relaxed),
            files_delta: self.files_delta.load(Relaxed),
            files_deleted: self.files_deleted.load(Relaxed),
            files_failed: self.files_failed.load(Relaxed),
            files_vanished: self.files_vanished.load(Relaxed),
            deletes_held: self.deletes_held.load(Relaxed),
            bytes_total: self.bytes_total.load(Relaxed),
            bytes_transferred: self.bytes_transferred.load(Relaxed),
            bytes_wire: self.bytes_wire.load(Relaxed),
            bytes_written: self.bytes_written.load(Relaxed),
            bytes_matched: self.bytes_matched.load(Relaxed),
            nbd_connections: self.nbd_connections.load(Relaxed),
            direct_connections: self.direct_connections.load(Relaxed),
            bytes_resumed: self.bytes_resumed.load(Relaxed),
            reconnects: self.reconnects.load(Relaxed),
            seconds,
            errors: self.errors.lock().map(|e| e.clone()).unwrap_or_default(),
            notices: self.notices.lock().map(|n| n.clone()).unwrap_or_default(),
        }
    }
}

/// The result of a run, as `--json` prints it.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Report {
    pub files_total: u64,
    pub dirs_total: u64,
    /// `--delete` was skipped: the sender could not read part of the source.
    pub delete_skipped: bool,
    pub files_transferred: u64,
    pub files_delta: u64,
    pub files_deleted: u64,
    pub files_failed: u64,
    /// Files that vanished or changed while being read: not sent, the
    /// destination's copy kept (exit 24 when nothing failed).
    pub files_vanished: u64,
    /// Deletions `--max-delete` held back (rsync's exit 25).
    pub deletes_held: u64,
    pub bytes_total: u64,
    pub bytes_transferred: u64,
    pub bytes_wire: u64,
    pub bytes_written: u64,
    pub bytes_matched: u64,
    /// Connections to an NBD export on this side (0: none).
    pub nbd_connections: u64,
    /// TCP connections of the `--direct` session (0: none).
    pub direct_connections: u64,
    /// Bytes of partial files kept from interrupted runs (not sent again).
    pub bytes_resumed: u64,
    /// Reconnects after the link dropped (`--retries`).
    pub reconnects: u64,
    pub seconds: f64,
    pub errors: Vec<String>,
    pub notices: Vec<String>,
}
