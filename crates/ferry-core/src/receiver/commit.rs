//! Batched commits. With `--fsync` (the default) a finished temporary
//! file's data must be on the disk before its name is: after a crash each
//! file is then the old one or the new one, never a torn one. An
//! `fdatasync` right after each file costs a journal commit per file,
//! which on many small files is most of the run (5,000 files of 0-8 KiB:
//! 1.32 s against 0.48 s without).
//!
//! So finished plain temporary files (see [`decide::batch_commit`]) wait
//! here, written, verified and with their metadata set, until the batch
//! is due ([`decide::batch_due`]). Then:
//!
//! 1. every file's write-back is started, then waited for, one by one
//!    (`sync_file_range`): a file whose data cannot be written is dropped
//!    here (its temp file goes, the old copy stays), as its `fdatasync`
//!    would have failed;
//! 2. one `syncfs` for each filesystem the batch is on writes the
//!    metadata and flushes the device's cache: one journal commit, one
//!    cache flush, for the whole batch;
//! 3. only then is each file renamed into place, in the order they
//!    finished. If the `syncfs` fails, none of its files is.
//!
//! If a write failed in step 1 the disk is failing: the rest of the batch
//! falls back to one `fdatasync` each (a `syncfs` would also write, and
//! fail, the metadata of everything else on that filesystem), and a
//! fatal error stops the renames. What is left at the end of the run is
//! committed the same way, before the directories get their metadata and
//! are fsynced.

use std::time::Instant;

use super::*;

/// The files waiting for their batch's sync.
pub(super) struct Commits {
    batch: Mutex<Batch>,
    limits: (usize, u64),
}

#[derive(Default)]
struct Batch {
    files: Vec<Arc<DstFile>>,
    bytes: u64,
    since: Option<Instant>,
}

impl Commits {
    /// Batches that fit in the open-file budget `budget` (each waiting
    /// file keeps its place among the files in flight).
    pub(super) fn new(budget: decide::FileBudget) -> Commits {
        Commits {
            batch: Mutex::default(),
            limits: decide::batch_limits(budget.max()),
        }
    }

    /// `f` is written, verified and given its metadata: it is committed
    /// with its batch, now if that is due.
    pub(super) fn add(&self, f: Arc<DstFile>, sh: &Shared<'_>) {
        let due = {
            let Ok(mut b) = self.batch.lock() else {
                return;
            };
            b.bytes += f.entry.size;
            b.files.push(f);
            let since = *b.since.get_or_insert_with(Instant::now);
            let age = since.elapsed().as_millis() as u64;
            decide::batch_due(b.files.len(), b.bytes, age, self.limits)
                .then(|| std::mem::take(&mut *b))
        };
        if let Some(b) = due {
            commit_batch(b.files, sh);
        }
    }

    /// Commit every file still waiting (the run's data is all in).
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
        if let Some(file) = f.file.as_file() {
            fsutil::start_writeback(file);
        }
    }
    let mut written = Vec::with_capacity(files.len());
    let mut failing = false;
    for f in files {
        let Some(file) = f.file.as_file() else {
            continue;
        };
        match fsutil::wait_writeback(file) {
            Ok(()) => written.push((f.clone(), dev_of(file))),
            Err(e) => {
                failing = true;
                told(&f, sh, Err(e).op("fsync"));
            }
        }
    }
    let mut synced: Vec<(u64, bool)> = Vec::new();
    for (f, dev) in written {
        if sh.fatal_flag.load(Ordering::SeqCst) {
            // The run stops: not renamed, the old copies stay.
            continue;
        }
        let Some(file) = f.file.as_file() else {
            continue;
        };
        let ok = if failing || dev.is_none() {
            file.sync_data().op("fsync")
        } else {
            match synced.iter().find(|(d, _)| Some(*d) == dev) {
                Some((_, true)) => Ok(()),
                Some((_, false)) => Err(io::Error::other("the filesystem could not be synced")),
                None => {
                    let r = rustix::fs::syncfs(file)
                        .map_err(io::Error::from)
                        .op("fsync");
                    synced.extend(dev.map(|d| (d, r.is_ok())));
                    r
                }
            }
        };
        told(&f, sh, ok.and_then(|()| commit(&f, sh)));
    }
}

/// The device `file` is on (`None` if that cannot be told).
fn dev_of(file: &File) -> Option<u64> {
    rustix::fs::fstat(file).ok().map(|st| st.st_dev)
}
