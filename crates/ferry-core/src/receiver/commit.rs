//! Batched commits. With `--fsync` (the default) a finished temporary
//! file's data must be on the disk before its name is: after a crash each
//! file is then the old one or the new one, never a torn one. An
//! `fdatasync` right after each file costs a journal commit per file,
//! which on many small files is most of the run (5,000 files of 0-8 KiB:
//! 1.32 s against 0.48 s without).
//!
//! So finished plain temporary files on a local filesystem (see
//! [`decide::batch_commit`], [`decide::batch_fs`]) wait here, written,
//! verified and with their metadata set, until the batch is due
//! ([`decide::batch_due`]: full, or its oldest file has waited 2 s,
//! checked as files come and by a timer). Then:
//!
//! 1. every file's write-back, started when it joined the batch (and
//!    again now), is waited for, one by one (`sync_file_range`): a file
//!    whose data cannot be written fails here (its temp file goes, the
//!    old copy stays). Not a small file's ([`decide::early_writeback`]):
//!    the `syncfs` writes those together, so a small file's failed write
//!    is met by the `syncfs` (step 2), which has then also written the
//!    rest of the filesystem and, on ext4, failed its journal commit
//!    (ext4 then turns read-only, as its periodic commit makes it within
//!    5 s on a disk that fails for real);
//! 2. one `syncfs` for each filesystem the batch is on writes the
//!    metadata and flushes the device's cache: one journal commit, one
//!    cache flush, for the whole batch;
//! 3. each file's own descriptor is asked again for a write error (the
//!    `syncfs` may have written pages of it), and only then is it renamed
//!    into place, in the order they finished.
//!
//! What cannot go that way gets one `fdatasync` per file, as without
//! batching: every file of a batch where a write failed in step 1 (the
//! disk is failing; a `syncfs` would also write, and fail, everything
//! else on it), the files of a filesystem whose `syncfs` failed (it
//! reports errors of any file there, not only ferry's), and a file whose
//! `sync_file_range` is not supported. What is left at the end of the run
//! is committed the same way, before the directories get their metadata
//! and are fsynced.
//!
//! A due batch is committed on the committer thread ([`committer`]), not
//! by the writer whose file filled it: a batch's `syncfs` waits for the
//! disk (20 ms a batch here), and a writer waiting with it stalls the
//! dispatcher, which routes each segment to its own writer. One batch is
//! committed while the next one fills; a third waits for the first (the
//! queue holds one), so batches are committed in the order they were
//! filled.

use std::time::Instant;

use crossbeam_channel::{bounded, Receiver, Sender};

use super::*;

/// The files waiting for their batch's sync.
pub(super) struct Commits {
    batch: Mutex<Batch>,
    limits: (usize, u64),
    /// The committer thread's queue while it runs (see [`Commits::start`]);
    /// without it, a due batch is committed by the thread that found it due.
    queue: Mutex<Option<Sender<Vec<Arc<DstFile>>>>>,
}

/// The committer thread: commit the batches that come, in order, until
/// [`Commits::stop`] closes its queue.
pub(super) fn committer(batches: Receiver<Vec<Arc<DstFile>>>, sh: &Shared<'_>) {
    for files in batches {
        let first = files
            .first()
            .map(|f| f.loc.shown.clone())
            .unwrap_or_default();
        // A panic (a bug) must not pass for a commit: the run fails, naming
        // the batch's first file, and the batches after it are still
        // committed.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| commit_batch(files, sh)));
        if r.is_err() {
            let e = io::Error::other("internal error while committing its batch");
            sh.set_fatal(Error::io(&first, e));
        }
    }
}

/// Closes the committer's queue when dropped ([`Commits::stop`]).
pub(super) struct Stop<'c>(pub(super) &'c Commits);

impl Drop for Stop<'_> {
    fn drop(&mut self) {
        self.0.stop();
    }
}

#[derive(Default)]
struct Batch {
    files: Vec<Arc<DstFile>>,
    bytes: u64,
    since: Option<Instant>,
}

impl Batch {
    fn due(&self, limits: (usize, u64)) -> bool {
        let age = self.since.map_or(0, |t| t.elapsed().as_millis() as u64);
        decide::batch_due(self.files.len(), self.bytes, age, limits)
    }
}

impl Commits {
    /// Batches that fit in the open-file budget `budget` (each waiting
    /// file keeps its place among the files in flight).
    pub(super) fn new(budget: decide::FileBudget) -> Commits {
        Commits {
            batch: Mutex::default(),
            limits: decide::batch_limits(budget.max()),
            queue: Mutex::default(),
        }
    }

    /// From now on due batches go to the [`committer`] that reads the
    /// other end of the returned queue.
    pub(super) fn start(&self) -> Receiver<Vec<Arc<DstFile>>> {
        let (tx, rx) = bounded(1);
        if let Ok(mut q) = self.queue.lock() {
            *q = Some(tx);
        }
        rx
    }

    /// Close the committer's queue: it commits what is queued and ends;
    /// a batch due after this is committed by the thread that finds it
    /// due.
    pub(super) fn stop(&self) {
        if let Ok(mut q) = self.queue.lock() {
            q.take();
        }
    }

    /// Commit a due batch: on the committer thread if it runs (waiting
    /// while it commits the batch before), or here.
    fn due(&self, files: Vec<Arc<DstFile>>, sh: &Shared<'_>) {
        let queue = self.queue.lock().ok().and_then(|q| q.clone());
        let files = match queue {
            Some(tx) => match tx.send(files) {
                Ok(()) => return,
                // The committer is gone (it panicked): commit here.
                Err(e) => e.into_inner(),
            },
            None => files,
        };
        commit_batch(files, sh);
    }

    /// `f` is written, verified and given its metadata: it is committed
    /// with its batch, now if that is due.
    pub(super) fn add(&self, f: Arc<DstFile>, sh: &Shared<'_>) {
        // Its write-back starts now, while the rest of the run still
        // comes in, not when the batch is due: the batch's sync then
        // finds it written (at the end of a run, one batch of a 125 MiB
        // tree spent 0.11 s writing back what had waited in the cache).
        // Not a small file's: the `syncfs` writes those together.
        if let (Some(file), true) = (f.file.as_file(), decide::early_writeback(f.entry.size)) {
            fsutil::start_writeback(file);
        }
        let due = {
            let Ok(mut b) = self.batch.lock() else {
                return;
            };
            b.bytes += f.entry.size;
            b.files.push(f);
            b.since.get_or_insert_with(Instant::now);
            b.due(self.limits).then(|| std::mem::take(&mut *b))
        };
        if let Some(b) = due {
            self.due(b.files, sh);
        }
    }

    /// Commit the batch if it has become due by age (called by a timer).
    pub(super) fn tick(&self, sh: &Shared<'_>) {
        let due = match self.batch.lock() {
            Ok(mut b) => b.due(self.limits).then(|| std::mem::take(&mut *b)),
            Err(_) => None,
        };
        if let Some(b) = due {
            self.due(b.files, sh);
        }
    }

    /// Commit every file still waiting (the run's data is all in, and the
    /// committer has been stopped and has ended).
    pub(super) fn flush(&self, sh: &Shared<'_>) {
        let b = match self.batch.lock() {
            Ok(mut b) => std::mem::take(&mut *b),
            Err(_) => return,
        };
        if !b.files.is_empty() {
            commit_batch(b.files, sh);
        }
    }
}

/// Sync the batch's data (see the module's doc), then rename each file
/// that made it.
fn commit_batch(files: Vec<Arc<DstFile>>, sh: &Shared<'_>) {
    for f in &files {
        if let (Some(file), true) = (f.file.as_file(), decide::early_writeback(f.entry.size)) {
            fsutil::start_writeback(file);
        }
    }
    // Files that get their own `fdatasync`.
    let mut own = Vec::new();
    let mut written = Vec::with_capacity(files.len());
    let mut failing = false;
    for f in files {
        let Some(file) = f.file.as_file() else {
            own.push(f);
            continue;
        };
        match fsutil::wait_writeback(file) {
            Ok(()) => written.push(f),
            Err(e) if fsutil::sync_range_unsupported(&e) => own.push(f),
            Err(e) => {
                failing = true;
                told(&f, sh, Err(e).op("fsync"));
            }
        }
    }
    if failing {
        own.append(&mut written);
    }
    let mut synced: Vec<(u64, bool)> = Vec::new();
    for f in written {
        let Some(file) = f.file.as_file() else {
            continue;
        };
        let ok = match rustix::fs::fstat(file).map(|st| st.st_dev) {
            Err(_) => false,
            Ok(dev) => match synced.iter().find(|(d, _)| *d == dev) {
                Some(&(_, ok)) => ok,
                None => {
                    let ok = rustix::fs::syncfs(file).is_ok();
                    synced.push((dev, ok));
                    ok
                }
            },
        };
        if !ok {
            own.push(f);
            continue;
        }
        // A write of this file that failed during the `syncfs` is this
        // descriptor's to report (and then no longer `fdatasync`'s).
        let mine = fsutil::wait_writeback(file).op("fsync");
        told(&f, sh, mine.and_then(|()| commit(&f, sh)));
    }
    for f in own {
        let synced = match f.file.as_file() {
            Some(file) => file.sync_data().op("fsync"),
            None => f.file.durable().op("fsync"),
        };
        // Not renamed unless synced: dropped, its temp file goes.
        told(&f, sh, synced.and_then(|()| commit(&f, sh)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committers_queue_closes_when_the_run_ends_even_by_a_panic() {
        let c = Commits::new(decide::FileBudget::from_nofile(Some(1024)));
        let batches = c.start();
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _committing = Stop(&c);
            panic!("a bug in the run");
        }));
        assert!(run.is_err());
        // The committer's loop ends: nothing queued, the queue closed.
        assert!(batches.recv().is_err());
        // A batch due after that is no one else's: `due` keeps it here.
        assert!(c.queue.lock().unwrap().is_none());
    }
}
