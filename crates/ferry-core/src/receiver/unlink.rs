//! `--delete`'s unlinks of plain files, on a few threads. On a filesystem
//! that discards what it frees (ext4 `-o discard`, common on cloud
//! disks), each unlink waits for the device: one at a time, 10,000 small
//! files took 0.9 s here, most of it waiting. The decisions (what goes,
//! in which order, `--max-delete`) stay on the calling thread; only the
//! `unlinkat` calls run in parallel, and a directory is removed only
//! after the unlinks in it have finished ([`Unlinks::settle`]). The
//! workers live as long as the receiver's session, so that deletions
//! streamed while the list arrives (see `super::subtree`) run beside it.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};

use crossbeam_channel::{bounded, Receiver, Sender};

use crate::error::describe;
use crate::stats::Stats;

/// Threads that unlink: enough to keep a device's queue busy while each
/// waits for its discard; no more than the queue below needs.
pub(super) const THREADS: usize = 8;

/// One file to unlink: its directory, its name, its path to show.
pub(super) struct Job {
    pub(super) dir: std::sync::Arc<OwnedFd>,
    pub(super) name: OsString,
    pub(super) shown: std::path::PathBuf,
}

/// Unlinks queued (a bounded queue) and not yet done, and how many failed.
#[derive(Default)]
struct Tally {
    pending: u64,
    failed: u64,
}

/// What the workers and the calling thread share.
#[derive(Default)]
pub(super) struct Progress {
    tally: Mutex<Tally>,
    idle: Condvar,
}

impl Progress {
    /// A worker: unlink what comes until the queue closes.
    pub(super) fn work(&self, rx: Receiver<Job>, stats: &Stats) {
        for job in rx {
            // Counted done however the unlink ends (a panic too), so that
            // `settle` never waits for a worker that is gone.
            let mut done = Done(self, false);
            done.1 = unlink(&job.dir, &job.name, &job.shown, stats);
        }
    }

    fn finished(&self, ok: bool) {
        if let Ok(mut t) = self.tally.lock() {
            t.pending = t.pending.saturating_sub(1);
            t.failed += u64::from(!ok);
            if t.pending == 0 {
                self.idle.notify_all();
            }
        }
    }
}

/// One queued unlink, counted done (ok or not) when dropped.
struct Done<'p>(&'p Progress, bool);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.finished(self.1);
    }
}

/// The calling thread's side: queue unlinks, wait for them. Dropped, it
/// closes the queue, and the workers end once it is empty.
pub(super) struct Unlinks {
    tx: Sender<Job>,
    progress: Arc<Progress>,
}

impl Unlinks {
    /// A queue for workers that each run [`Progress::work`] on the
    /// receiver given back.
    pub(super) fn new(progress: Arc<Progress>) -> (Unlinks, Receiver<Job>) {
        let (tx, rx) = bounded(1024);
        (Unlinks { tx, progress }, rx)
    }

    /// Queue `job`; it is counted as deleted once done. Given back when no
    /// worker takes it (they are all gone): the caller unlinks it itself.
    pub(super) fn queue(&self, job: Job) -> Result<(), Job> {
        if let Ok(mut t) = self.progress.tally.lock() {
            t.pending += 1;
        }
        self.tx.send(job).map_err(|e| {
            // Not queued: neither done nor failed.
            if let Ok(mut t) = self.progress.tally.lock() {
                t.pending = t.pending.saturating_sub(1);
            }
            e.into_inner()
        })
    }

    /// Wait until every queued unlink is done; how many have failed so far.
    pub(super) fn settle(&self) -> u64 {
        let Ok(mut t) = self.progress.tally.lock() else {
            return 0;
        };
        while t.pending > 0 {
            t = match self.progress.idle.wait(t) {
                Ok(t) => t,
                Err(_) => return 0,
            };
        }
        t.failed
    }
}

/// Unlink `name` in `dir`: counted as deleted, or as an error.
pub(super) fn unlink(dir: &OwnedFd, name: &OsString, shown: &Path, stats: &Stats) -> bool {
    if crate::interrupt::stopping() {
        return false;
    }
    match rustix::fs::unlinkat(dir, name, rustix::fs::AtFlags::empty()) {
        Ok(()) => {
            Stats::add(&stats.files_deleted, 1);
            true
        }
        Err(err) => {
            let err = std::io::Error::from(err);
            stats.error(format!("{}: delete: {}", shown.display(), describe(&err)));
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unlinks_run_on_workers_and_settle_counts_failures() {
        let d = tempfile::tempdir().unwrap();
        for i in 0..50 {
            std::fs::write(d.path().join(format!("f{i}")), b"x").unwrap();
        }
        let dir = Arc::new(OwnedFd::from(std::fs::File::open(d.path()).unwrap()));
        let stats = Stats::default();
        let progress = Arc::new(Progress::default());
        let (u, rx) = Unlinks::new(progress.clone());
        std::thread::scope(|s| {
            for _ in 0..3 {
                let (p, rx, stats) = (&*progress, rx.clone(), &stats);
                s.spawn(move || p.work(rx, stats));
            }
            // 50 that exist and 2 that do not.
            for i in 0..52 {
                let name = OsString::from(format!("f{i}"));
                let shown = d.path().join(&name);
                let job = Job {
                    dir: dir.clone(),
                    name,
                    shown,
                };
                assert!(u.queue(job).is_ok());
            }
            assert_eq!(u.settle(), 2);
            drop(u);
        });
        assert_eq!(
            stats
                .files_deleted
                .load(std::sync::atomic::Ordering::SeqCst),
            50
        );
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
        assert_eq!(
            stats.files_failed.load(std::sync::atomic::Ordering::SeqCst),
            2
        );
    }
}
