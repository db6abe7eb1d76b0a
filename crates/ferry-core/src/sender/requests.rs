//! The request thread: reads what the receiver asks (`Want`, `Signature`,
//! `EndOfList`), checks each request against the list and against what was
//! asked before, and queues segment jobs for the workers: a whole file at
//! once, a delta once its signature is whole (or segment by segment early,
//! where the pre-hash finds blocks in place).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::ScopedJoinHandle;

use crossbeam_channel::Sender;
use ferry_link::{
    layout, HavePart, Message, MsgRx, MsgTx, ReceiverReport, SignaturePart, WantMode,
};

use crate::early::EarlySeg;
use crate::error::{Error, Result};
use crate::stats::Stats;

use super::credit::{Credit, Decided};
use super::prehash::worth_prehashing;
use super::resume::{held_of, interleave, Resuming};
use super::{holes, DeltaJob, Held, Job, SrcFile, Table};

/// Largest signature accepted from a receiver, in blocks (24 bytes each).
const MAX_SIGNATURE_BLOCKS: u64 = 1 << 22;

/// Sets its flag when dropped: however the request thread ends.
pub(super) struct SetOnDrop<'a>(pub(super) &'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A file the receiver asked for as a delta, until its signature is whole.
struct Pending {
    file: Arc<SrcFile>,
    sig: Option<ferry_delta::Signature>,
    inplace: bool,
}

/// Whether file may be asked for in `mode` after `prev` (what it was
/// asked for before, if anything). A delta or a resume may be turned into
/// a whole file once (the receiver found the delta no longer pays, or what
/// it kept failed its check); nothing else is asked twice, so a peer
/// cannot make this side queue the same file again and again.
fn may_ask(prev: Option<WantMode>, mode: WantMode) -> bool {
    match prev {
        None => true,
        Some(prev) => !is_final(prev) && mode == WantMode::Whole,
    }
}

/// A file asked for this way is never asked for again: once sent, the
/// sender forgets it.
fn is_final(mode: WantMode) -> bool {
    matches!(mode, WantMode::Whole | WantMode::Check)
}

/// Whether a signature's first part fits the file it is for: on the delta
/// grid of the source's size, and no bigger than
/// [`MAX_SIGNATURE_BLOCKS`] however big the receiver says its old copy is.
fn signature_acceptable(size: u64, block_size: u64, basis_size: u64) -> bool {
    block_size == layout::delta_block(size)
        && ferry_delta::Signature::block_count(basis_size, block_size) <= MAX_SIGNATURE_BLOCKS
}

/// The segments of a file of `size` bytes still to queue: all but those in
/// `skip` (sent early).
fn segments_to_queue(size: u64, skip: &[bool]) -> impl Iterator<Item = u64> + '_ {
    (0..layout::segment_count(size))
        .filter(|&seg| !skip.get(seg as usize).copied().unwrap_or(false))
}

/// The request thread's state.
pub(super) struct Requests<'s> {
    table: Table,
    tx: MsgTx,
    /// Where segment jobs go; `None` once the receiver's requests ended.
    jobs: Option<Sender<Job>>,
    /// Joined at the end of the requests, before `SenderDone`.
    workers: Option<Vec<ScopedJoinHandle<'s, Result<()>>>>,
    /// Delta sources to pre-hash.
    prehash: Sender<Arc<SrcFile>>,
    /// Small files to read ahead (see [`super::open::prefetcher`]).
    prefetch: Sender<Arc<SrcFile>>,
    progress: Option<&'s Stats>,
    /// Who lists a remote receiver's changes (`None`: none were asked for).
    changes: Option<&'s Stats>,
    pending: HashMap<u32, Pending>,
    /// What each file was asked for.
    wanted: HashMap<u32, WantMode>,
    /// Files being resumed whose `Have` list is not complete yet.
    resuming: HashMap<u32, Resuming>,
    /// The receiver has decided on every entry below this (`Decided`):
    /// those not asked for are forgotten.
    decided: u32,
    credit: &'s Credit,
}

impl<'s> Requests<'s> {
    pub(super) fn new(
        table: Table,
        tx: MsgTx,
        (jobs, workers): (Sender<Job>, Vec<ScopedJoinHandle<'s, Result<()>>>),
        (prehash, prefetch): (Sender<Arc<SrcFile>>, Sender<Arc<SrcFile>>),
        progress: Option<&'s Stats>,
        changes: Option<&'s Stats>,
        credit: &'s Credit,
    ) -> Self {
        Self {
            decided: 0,
            credit,
            changes,
            table,
            tx,
            jobs: Some(jobs),
            workers: Some(workers),
            prehash,
            prefetch,
            progress,
            pending: HashMap::new(),
            wanted: HashMap::new(),
            resuming: HashMap::new(),
        }
    }

    /// Answer the receiver until it reports.
    pub(super) fn serve(mut self, rx: &MsgRx) -> Result<ReceiverReport> {
        loop {
            match rx.recv()? {
                Message::Want { file, mode } => self.want(file, mode)?,
                Message::Decided { below } => self.decided(below)?,
                Message::Signature(part) => self.signature(part)?,
                Message::Have(part) => self.have(part)?,
                Message::EndOfList => self.end_of_list()?,
                Message::ReceiverDone(r) => return Ok(*r),
                // A remote receiver's change, for the client to list.
                Message::Change(c) => match self.changes {
                    Some(st) => st.change(&c),
                    None => {
                        return Err(Error::Protocol(
                            "unrequested Change from the receiver".into(),
                        ))
                    }
                },
                Message::Fatal { class, error } => {
                    return Err(crate::error::from_fatal(class, error))
                }
                m => {
                    return Err(Error::Protocol(format!(
                        "sender got unexpected {}",
                        m.name()
                    )))
                }
            }
        }
    }

    /// The receiver decided on every entry below `below`: forget those it
    /// did not ask for, and let the walk list further.
    fn decided(&mut self, below: u32) -> Result<()> {
        match self.credit.decided(below) {
            Decided::Ok => {}
            Decided::Back => {
                return Err(Error::Protocol(format!(
                    "receiver decided below {below} after {}",
                    self.decided
                )))
            }
            Decided::Past => {
                return Err(Error::Protocol(format!(
                    "receiver decided below {below}, past the entries it was sent"
                )))
            }
        }
        if let Ok(mut t) = self.table.lock() {
            let wanted = &mut self.wanted;
            // What a `Want` still can come for: one asked for as a delta or
            // a resume (asked again whole if it fails). One asked for whole
            // or to check is never asked again, and its worker drops it
            // once sent.
            let keep = |id: u32, wanted: &HashMap<u32, WantMode>| {
                wanted.get(&id).is_some_and(|m| !is_final(*m))
            };
            let span = u64::from(below - self.decided);
            if span <= (t.len() + wanted.len()) as u64 {
                for id in self.decided..below {
                    if !keep(id, wanted) {
                        if !wanted.contains_key(&id) {
                            t.remove(&id);
                        }
                        wanted.remove(&id);
                    }
                }
            } else {
                // A receiver's `below` far past the list: walk what is kept
                // instead of the ids.
                let lo = self.decided;
                t.retain(|&id, _| !(lo..below).contains(&id) || wanted.contains_key(&id));
                wanted.retain(|&id, m| !(lo..below).contains(&id) || !is_final(*m));
            }
        }
        self.decided = below;
        Ok(())
    }

    fn want(&mut self, file: u32, mode: WantMode) -> Result<()> {
        if file < self.decided && !self.wanted.contains_key(&file) {
            return Err(Error::Protocol(format!(
                "receiver asked for file {file} after deciding on it"
            )));
        }
        let f = self.table.lock().ok().and_then(|t| t.get(&file).cloned());
        let Some(f) = f else {
            return Err(Error::Protocol(format!(
                "receiver asked for unknown file {file}"
            )));
        };
        let prev = self.wanted.insert(file, mode);
        if !may_ask(prev, mode) {
            return Err(Error::Protocol(format!(
                "receiver asked for file {file} again"
            )));
        }
        if prev.is_some() {
            // A fresh attempt: what went wrong with the delta (a read that
            // failed, a change seen) is judged again on this reading.
            f.failed.store(false, Ordering::SeqCst);
        }
        if let Some(st) = self.progress {
            Stats::add(&st.bytes_transferred, f.size);
        }
        f.remaining
            .store(layout::segment_count(f.size), Ordering::SeqCst);
        if mode == WantMode::Whole {
            self.resuming.remove(&file);
            // A delta given up: its signature will not complete, and no
            // segment of it goes early beside the whole file's.
            if let Some(p) = self.pending.remove(&file) {
                p.file.prehash.abandon();
            }
            self.read_ahead(&f);
            return enqueue(self.jobs.as_ref(), file, &f, None, &[]);
        }
        if matches!(mode, WantMode::Resume | WantMode::Check) {
            let check = mode == WantMode::Check;
            self.resuming.insert(file, Resuming::new(f, check));
            return Ok(());
        }
        // The receiver signs one file at a time: a signature still open now
        // never completes (it could not read that old copy).
        for p in self.pending.values() {
            p.file.prehash.abandon();
        }
        self.pending.insert(
            file,
            Pending {
                file: f.clone(),
                sig: None,
                inplace: mode == WantMode::DeltaInPlace,
            },
        );
        let bs = layout::delta_block(f.size);
        if let Some(jobs) = self
            .jobs
            .as_ref()
            .filter(|_| worth_prehashing(f.kept_open, f.size))
        {
            f.prehash
                .start(f.size, bs, early_sink(jobs.clone(), file, &f));
            if self.prehash.send(f.clone()).is_err() {
                f.prehash.finish(false);
            }
        }
        Ok(())
    }

    /// Hand a small file asked for whole to the prefetcher, unless the
    /// workers are far behind (what is read ahead would wait long in the
    /// page cache) or the prefetcher is (never waited for).
    fn read_ahead(&self, f: &Arc<SrcFile>) {
        let Some(jobs) = &self.jobs else {
            return;
        };
        if f.prefetch_worthy() && jobs.len() < super::open::PREFETCH_AHEAD {
            let _ = self.prefetch.try_send(f.clone());
        }
    }

    fn signature(&mut self, part: SignaturePart) -> Result<()> {
        let (file, bs, basis_size) = (part.file, part.block_size as u64, part.basis_size);
        let Some(Pending {
            file: f,
            sig,
            inplace,
        }) = self.pending.get_mut(&file)
        else {
            return Err(Error::Protocol(format!(
                "signature for file {file}, which is not awaiting one"
            )));
        };
        if sig.is_none() {
            if !signature_acceptable(f.size, bs, basis_size) {
                return Err(Error::Protocol(format!(
                    "unacceptable signature for file {file}: block size {bs}, basis {basis_size} bytes"
                )));
            }
            *sig = Some(ferry_delta::Signature::receiving(bs, basis_size));
        }
        let inplace = *inplace;
        if let Some(sg) = sig.as_mut() {
            sg.extend_part(part.first_block, &part.weak, &part.strong)
                .map_err(|e| Error::Protocol(format!("signature for file {file}: {e}")))?;
            f.prehash.offer(sg.basis_size, &part.strong);
        }
        if !part.last {
            return Ok(());
        }
        let Some(Pending { file: f, sig, .. }) = self.pending.remove(&file) else {
            return Ok(());
        };
        let early = f.prehash.close();
        let Some(sg) = sig.filter(|s| s.is_consistent()) else {
            return Err(Error::Protocol(format!(
                "incomplete signature for file {file}"
            )));
        };
        let job = DeltaJob {
            matcher: ferry_delta::Matcher::new(&sg),
            inplace,
        };
        enqueue(self.jobs.as_ref(), file, &f, Some(Arc::new(job)), &early)
    }

    /// Part of a resumed file's `Have` list: queue the segments it
    /// describes, each with what the receiver holds of it.
    fn have(&mut self, part: HavePart) -> Result<()> {
        let file = part.file;
        let Some(r) = self.resuming.get_mut(&file) else {
            return Err(Error::Protocol(format!(
                "Have for file {file}, which is not being resumed"
            )));
        };
        let range = r
            .advance(&part)
            .map_err(|why| Error::Protocol(format!("Have for file {file}: {why}")))?;
        let (f, check) = (r.file.clone(), r.check);
        // A check offers an old copy whole: every segment, each with its
        // digest (zeros, "unknown", would keep it unseen).
        let whole_offer = part.kept.len() as u64 == range.end - range.start
            && part.kept.iter().all(|(_, d)| *d != [0; 32]);
        if check && !whole_offer {
            return Err(Error::Protocol(format!(
                "Have for file {file}, which is checked: not every segment listed with its digest"
            )));
        }
        if r.complete() {
            self.resuming.remove(&file);
        }
        let Some(jobs) = self.jobs.as_ref() else {
            return Err(Error::Protocol("request after the end of requests".into()));
        };
        // Held segments are only read and hashed here, missing ones go out
        // on the link: alternated, the workers do both at once.
        let (held, missing): (Vec<u64>, Vec<u64>) =
            range.partition(|&s| held_of(&part.kept, s) != Held::Missing);
        for seg in interleave(&missing, &held) {
            let _ = jobs.send(Job {
                id: file,
                file: f.clone(),
                seg,
                delta: None,
                early: None,
                held: held_of(&part.kept, seg),
                fin: check,
                holes: 0,
            });
        }
        Ok(())
    }

    /// Signatures that never completed (the receiver could not read its
    /// old copy, or the requests ended without them) send nothing more
    /// early: each pre-hash lets go of its sink, and with it of the job
    /// queue, so the workers see the queue close.
    fn abandon_pending(&mut self) {
        for (_, p) in self.pending.drain() {
            p.file.prehash.abandon();
        }
    }

    /// No more requests: let the workers drain, then say so.
    fn end_of_list(&mut self) -> Result<()> {
        self.abandon_pending();
        self.jobs = None;
        if let Some(ws) = self.workers.take() {
            for w in ws {
                w.join()
                    .map_err(|_| Error::Protocol("sender worker panicked".into()))??;
            }
        }
        self.tx.send(Message::SenderDone)?;
        Ok(())
    }
}

impl Drop for Requests<'_> {
    /// However the requests end (a peer that hangs up, reports or breaks
    /// the protocol before `EndOfList`), no pre-hash keeps the job queue
    /// open: the workers would wait on it for ever, and the session with
    /// them.
    fn drop(&mut self) {
        self.abandon_pending();
    }
}

/// Queue the segments of file `id`, but those in `skip` (sent early).
/// `remaining` is set when the file is asked for.
fn enqueue(
    jobs: Option<&Sender<Job>>,
    id: u32,
    f: &Arc<SrcFile>,
    delta: Option<Arc<DeltaJob>>,
    skip: &[bool],
) -> Result<()> {
    let Some(jobs) = jobs else {
        return Err(Error::Protocol("request after the end of requests".into()));
    };
    let job = |seg, holes| Job {
        id,
        file: f.clone(),
        seg,
        delta: delta.clone(),
        early: None,
        held: Held::Nothing,
        fin: delta.is_none(),
        holes,
    };
    if delta.is_none() && skip.is_empty() && layout::segment_count(f.size) > 1 {
        if let Some(src) = f.reader_for_plan() {
            // A file sent whole: its runs of holes go as one job each.
            if src.unused().is_none() {
                for item in holes::Plan::new(&*src, f.size) {
                    let _ = jobs.send(match item {
                        holes::Item::Seg(seg) => job(seg, 0),
                        holes::Item::Holes(first, count) => job(first, count),
                    });
                }
                return Ok(());
            }
        }
    }
    for seg in segments_to_queue(f.size, skip) {
        let _ = jobs.send(job(seg, 0));
    }
    Ok(())
}

/// Where the pre-hash sends segments that go early: to the workers.
fn early_sink(jobs: Sender<Job>, id: u32, f: &Arc<SrcFile>) -> Box<dyn Fn(EarlySeg) + Send> {
    // Weak: the file owns its pre-hash, which owns this until closed.
    let f = Arc::downgrade(f);
    Box::new(move |e| {
        if let Some(file) = f.upgrade() {
            let _ = jobs.send(Job {
                id,
                file,
                seg: e.seg,
                delta: None,
                early: Some(Box::new(e)),
                held: Held::Nothing,
                fin: false,
                holes: 0,
            });
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use WantMode::{Check, Delta, DeltaInPlace, Resume, Whole};

    #[test]
    fn a_file_is_asked_for_once() {
        let all = [Whole, Delta, DeltaInPlace, Resume, Check];
        for mode in all {
            assert!(may_ask(None, mode), "{mode:?}");
        }
        // Asked again the same way, or whole or checked then anything:
        // refused.
        for prev in all {
            assert!(!may_ask(Some(prev), prev), "{prev:?} twice");
            assert!(!may_ask(Some(Whole), prev), "whole then {prev:?}");
            assert!(!may_ask(Some(Check), prev), "check then {prev:?}");
        }
        assert!(!may_ask(Some(Delta), DeltaInPlace));
        assert!(!may_ask(Some(DeltaInPlace), Delta));
    }

    #[test]
    fn a_delta_may_fall_back_to_whole() {
        assert!(may_ask(Some(Delta), Whole));
        assert!(may_ask(Some(DeltaInPlace), Whole));
        assert!(may_ask(Some(Resume), Whole));
    }

    #[test]
    fn a_signature_must_be_on_the_sources_delta_grid() {
        let size = 100 << 20;
        let bs = layout::delta_block(size);
        assert!(signature_acceptable(size, bs, size));
        assert!(signature_acceptable(size, bs, 0));
        assert!(!signature_acceptable(size, bs * 2, size));
        assert!(!signature_acceptable(size, bs / 2, size));
        // A zero block size is never the grid (and never divides by zero).
        assert!(!signature_acceptable(size, 0, size));
    }

    #[test]
    fn a_signature_may_not_claim_a_huge_old_copy() {
        let size = 1 << 20;
        let bs = layout::delta_block(size);
        let max = MAX_SIGNATURE_BLOCKS * bs;
        assert!(signature_acceptable(size, bs, max));
        // One byte more is one block more.
        assert!(!signature_acceptable(size, bs, max + 1));
        assert!(!signature_acceptable(size, bs, u64::MAX));
    }

    #[test]
    fn segments_sent_early_are_not_queued_again() {
        let size = 4 * layout::SEGMENT + 1;
        let all: Vec<u64> = segments_to_queue(size, &[]).collect();
        assert_eq!(all, [0, 1, 2, 3, 4]);
        let rest: Vec<u64> = segments_to_queue(size, &[true, false, true]).collect();
        assert_eq!(rest, [1, 3, 4]);
        // A skip list longer than the file changes nothing past its end.
        let rest: Vec<u64> = segments_to_queue(size, &[false; 9]).collect();
        assert_eq!(rest, all);
        assert_eq!(segments_to_queue(0, &[]).count(), 0);
    }
}
