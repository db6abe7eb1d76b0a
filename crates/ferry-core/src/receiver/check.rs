//! Checking a changed file's old copy before asking for it
//! ([`WantMode::Check`], see [`decide::check_first`]): a file whose time
//! changed but not its size is offered to the sender as its old copy's
//! segment digest. The sender answers with only a `SegmentDone` when its
//! bytes are the same (then the old copy stays, and gets the source's
//! metadata: no temporary file, no write, no sync, no rename), or with the
//! file's data (then it is written as any other changed file, from the
//! first op on).
//!
//! Only files of one segment are checked, so a check has one answer:
//! either the segment's ops and its `SegmentDone`, or a `SegmentDone`
//! alone, whose digest must be the one offered.
//!
//! The old copy stays open while the answer comes (a place among the
//! files in flight), and is kept only if neither it nor its name changed
//! meanwhile: otherwise its new bytes would get the source's time, and no
//! later run would look at it again. A hard-linked old copy is not
//! checked: it is replaced, as rsync replaces it, not changed under its
//! other names.

use super::*;

use ferry_link::HavePart;

/// What `fstat` says of an old copy, as far as a change shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Seen {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, u64),
    ctime: (i64, u64),
}

impl Seen {
    /// The facts of `f` now, and its link count.
    #[allow(clippy::unnecessary_cast)]
    fn of(f: &File) -> io::Result<(Seen, u64)> {
        let st = rustix::fs::fstat(f)?;
        let seen = Seen {
            dev: st.st_dev as u64,
            ino: st.st_ino as u64,
            size: st.st_size as u64,
            mtime: (st.st_mtime as i64, st.st_mtime_nsec as u64),
            ctime: (st.st_ctime as i64, st.st_ctime_nsec as u64),
        };
        Ok((seen, st.st_nlink as u64))
    }
}

/// A file asked for with [`WantMode::Check`], waiting for the answer.
pub(super) struct Checking {
    entry: Entry,
    dest: Loc,
    old: decide::Stat,
    /// The old copy's segment digest, as offered.
    digest: [u8; 32],
    /// The old copy, open, and what it was when digested (`None` once
    /// `failed`).
    copy: Option<(File, Seen)>,
    /// It differs, but what it is written to could not be opened, or the
    /// sender could not send it (`FileFailed`, `FileChanged`; counted
    /// either way): its data is dropped as it comes, and its `SegmentDone`
    /// only ends it.
    failed: bool,
    /// A place among the files in flight: what waits for an answer is
    /// bounded as open files are.
    _slot: Slot,
}

/// Threads that read and digest old copies: each read of a cold cache
/// waits for the disk, so several are in flight at once (one at a time on
/// the dispatcher, the touched files of a cold re-run took most of it).
pub(super) const DIGESTERS: usize = 4;

/// An old copy to digest, on a [`digester`] thread.
pub(super) struct CheckJob {
    entry: Entry,
    dest: Loc,
    old: decide::Stat,
    _slot: Slot,
}

/// A digested old copy (`None`: not to be checked after all: it could not
/// be read whole, is hard-linked, or changed while it was read).
pub(super) struct Digested {
    job: CheckJob,
    copy: Option<(File, Seen, [u8; 32])>,
}

/// A digester thread: digest old copies until the queue closes, handing
/// each back to the dispatcher and waking it.
pub(super) fn digester(jobs: Receiver<CheckJob>, out: Sender<Digested>, wake: Sender<()>) {
    let mut buf = Vec::new();
    for job in jobs {
        // A panic must not lose the file (the list could not end): it is
        // then asked for as any changed file.
        let run = std::panic::AssertUnwindSafe(|| digest_old(&job, &mut buf));
        let copy = std::panic::catch_unwind(run).ok().flatten();
        if out.send(Digested { job, copy }).is_err() {
            return;
        }
        let _ = wake.try_send(());
    }
}

/// Open, `fstat`, digest and `fstat` again the old copy of `job`.
fn digest_old(job: &CheckJob, buf: &mut Vec<u8>) -> Option<(File, Seen, [u8; 32])> {
    let (e, old) = (&job.entry, &job.old);
    let f = job.dest.open(false).ok()?;
    let before = match Seen::of(&f) {
        Ok((s, 1)) if (s.dev, s.ino, s.size) == (old.dev, old.ino, e.size) => s,
        _ => return None,
    };
    let scan = crate::scan::scan_segment::<std::convert::Infallible>(
        &f,
        e.size,
        0,
        true,
        buf,
        &mut |_| Ok(()),
    );
    // What a read left in the buffer is not kept past the check.
    if buf.capacity() > crate::scan::CHUNK {
        *buf = Vec::new();
    }
    let digest = scan.ok()?;
    match Seen::of(&f) {
        Ok((s, _)) if s == before => Some((f, before, digest)),
        _ => None,
    }
}

impl Dispatcher<'_, '_> {
    /// Offer the old copy at `dest` of the changed file `e` (see the
    /// module's doc): its digest is read on a [`digester`] thread, and
    /// the file is asked for when it comes back ([`Self::digested`]). Gives
    /// `e` back when it is not checked.
    pub(super) fn start_check(
        &mut self,
        e: Entry,
        dest: &Loc,
        old: decide::Stat,
    ) -> io::Result<Option<Entry>> {
        let Some(jobs) = self.digesters.as_ref() else {
            return Ok(Some(e));
        };
        if layout::segment_count(e.size) != 1 {
            return Ok(Some(e));
        }
        let id = e.id;
        let job = CheckJob {
            entry: e,
            dest: dest.clone(),
            old,
            _slot: Slot::take(&self.sh.in_flight),
        };
        if let Err(back) = jobs.send(job) {
            return Ok(Some(back.into_inner().entry));
        }
        self.digesting.insert(id);
        Ok(None)
    }

    /// Take the old copies digested so far: ask for each with its digest,
    /// or as any changed file when it is not to be checked. Whether it
    /// took any (then `Decided` and `EndOfList` may be due).
    pub(super) fn digested(&mut self) -> Result<bool> {
        let mut took = false;
        while let Ok(Digested { job, copy }) = self.digested_rx.try_recv() {
            took = true;
            let CheckJob {
                entry,
                dest,
                old,
                _slot,
            } = job;
            let id = entry.id;
            self.digesting.remove(&id);
            let Some((f, seen, digest)) = copy else {
                let at = decide::FileAt::Regular;
                // Its metadata again, for whether a delta pays.
                let meta = dest.stat().ok().flatten();
                let res = self.transfer(entry, &dest, at, Some(old), meta, false, false);
                self.outcome(res, &dest.shown)?;
                continue;
            };
            self.tx.send(Message::Want {
                file: id,
                mode: WantMode::Check,
            })?;
            self.tx.send(Message::Have(HavePart {
                file: id,
                upto: 1,
                kept: vec![(0, digest)],
            }))?;
            self.checks.insert(
                id,
                Checking {
                    entry,
                    dest,
                    old,
                    digest,
                    copy: Some((f, seen)),
                    failed: false,
                    _slot,
                },
            );
        }
        Ok(took)
    }

    /// An op for `file`: if it is being checked, it differs, and is now
    /// written as any changed file. False when the op is to be dropped
    /// (what it would be written to could not be opened).
    pub(super) fn check_op(&mut self, file: u32, offset: u64, len: u64) -> Result<bool> {
        let Some(c) = self.checks.get(&file) else {
            return Ok(true);
        };
        match decide::op_fit(offset, len, c.entry.size) {
            decide::OpFit::Segment(0) => {}
            // Says nothing (as for any file): not an answer.
            decide::OpFit::Empty => return Ok(false),
            _ => {
                return Err(Error::Protocol(format!(
                    "{len} bytes at offset {offset} of file {file} ({} bytes): not within the file",
                    c.entry.size
                )))
            }
        }
        if c.failed {
            return Ok(false);
        }
        let Some(c) = self.checks.remove(&file) else {
            return Ok(true);
        };
        let Checking {
            entry, dest, old, ..
        } = c;
        let at = decide::FileAt::Regular;
        let res = self.transfer(entry.clone(), &dest, at, Some(old), None, false, true);
        self.outcome(res, &dest.shown)?;
        if self.files.contains_key(&file) {
            return Ok(true);
        }
        // Not opened (counted as failed): the rest of its data goes too.
        self.checks.insert(
            file,
            Checking {
                entry,
                dest,
                old,
                digest: [0; 32],
                copy: None,
                failed: true,
                _slot: Slot::take(&self.sh.in_flight),
            },
        );
        Ok(false)
    }

    /// `SegmentDone` for `file`: true when it answered a check (the file is
    /// the same: its old copy stays, with the source's metadata).
    pub(super) fn check_done(&mut self, file: u32, segment: u32, digest: [u8; 32]) -> Result<bool> {
        let Some(c) = self.checks.remove(&file) else {
            return Ok(false);
        };
        if segment != 0 {
            return Err(Error::Protocol(format!(
                "segment {segment} of file {file}, which has 1"
            )));
        }
        if !c.failed {
            if digest != c.digest {
                return Err(Error::Protocol(format!(
                    "file {file}: kept without data, but its digest is not the one offered"
                )));
            }
            if still_the_same(&c) {
                let res = self.keep_old(&c.entry, &c.dest, &c.old);
                self.outcome(res, &c.dest.shown)?;
            } else {
                self.sh.stats.vanished(format!(
                    "{}: changed while it was checked: left as it is",
                    c.dest.shown.display()
                ));
            }
        }
        drop(c);
        self.admit()?;
        Ok(true)
    }

    /// The sender could not send `file` (`FileChanged`, `FileFailed`): if
    /// it was being checked, its old copy stays (its `SegmentDone` still
    /// comes).
    pub(super) fn check_dropped(&mut self, file: u32) {
        if let Some(c) = self.checks.get_mut(&file) {
            c.failed = true;
            c.copy = None;
        }
    }

    /// At `SenderDone`: every check must have had its answer.
    pub(super) fn checks_answered(&self) -> Result<()> {
        match self.checks.iter().next() {
            Some((id, c)) => Err(Error::Protocol(format!(
                "the sender finished before answering the check of file {id} ({})",
                c.dest.shown.display()
            ))),
            None => Ok(()),
        }
    }
}

/// Whether the old copy of `c` is as it was digested, and still under its
/// name.
#[allow(clippy::unnecessary_cast)]
fn still_the_same(c: &Checking) -> bool {
    let Some((f, seen)) = &c.copy else {
        return false;
    };
    let named = c.dest.lstat().ok().flatten();
    matches!(Seen::of(f), Ok((now, _)) if now == *seen)
        && named.is_some_and(|st| (st.st_dev as u64, st.st_ino as u64) == (seen.dev, seen.ino))
}
