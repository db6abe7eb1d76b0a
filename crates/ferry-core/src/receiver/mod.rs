//! The receiving side: compares each entry of the file list with the
//! destination, asks for what changed, writes it with several workers,
//! verifies every segment against the sender's digest, and commits each
//! file atomically (temp file + rename, unless `--inplace`).
//!
//! The thread that calls [`run_receiver`] reads the link and dispatches;
//! ops of one segment always go to the same writer worker, so each worker
//! sees a segment's ops in order and can digest them as it writes.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};
use ferry_link::layout::{self, SegmentHasher};
use ferry_link::{Endpoint, Entry, EntryKind, Message, MsgTx, ReceiverReport, WantMode};

use crate::destdir::{DestDir, Loc};
use crate::direct;
use crate::endpoint::{NbdExport, Sink};
use crate::error::{describe, is_fatal_io, line, Error, IoOp, Result};
use crate::fsutil;
use crate::itemize::{self, Attrs, Kind as ItemKind, Update};
use crate::listcheck::{parent_of, shown, ListCheck, Shape};
use crate::plan::Dest;
use crate::stats::Stats;
use crate::SyncOptions;

mod backup;
mod check;
mod clear;
mod commit;
mod decide;
mod deletes;
mod entries;
mod file;
mod finish;
mod link_dest;
mod live;
mod nodes;
mod outbox;
mod partial;
mod readback;
mod segments;
mod setup;
mod signer;
mod unlink;
mod writer;

pub use live::record_on_interrupt;

use file::*;
use setup::*;
use signer::*;
use writer::*;

struct Shared<'a> {
    opts: &'a SyncOptions,
    /// The attributes set (see [`decide::Keep`]).
    keep: decide::Keep,
    /// `--backup-dir`, opened (and made) at the start.
    backup_dir: Option<DestDir>,
    /// Its device and inode, kept from `--delete` (see [`Setup`]).
    backup_id: Option<(u64, u64)>,
    stats: &'a Stats,
    cache: Option<Arc<ferry_delta::SigCache>>,
    /// First fatal error (disk full, …): the run stops.
    fatal: Mutex<Option<Error>>,
    fatal_flag: AtomicBool,
    /// Bytes of files committed from deltas: with `stats.bytes_matched`,
    /// how much deltas have saved so far in this run.
    delta_done: AtomicU64,
    in_flight: Arc<InFlight>,
    /// The dispatcher's side of `in_flight.wake`.
    wake: crossbeam_channel::Receiver<()>,
    /// Directories (relative to the root) whose entries changed: fsynced
    /// once at the end.
    dirty: Mutex<HashSet<Vec<u8>>>,
    /// Files whose delta failed verification, to ask for again whole.
    retries: Mutex<Vec<Entry>>,
    /// Finished files waiting for their batch's `syncfs`.
    commits: commit::Commits,
}

impl Shared<'_> {
    /// `l` was created, renamed over or removed: its directory must reach
    /// the disk before the run says done.
    fn changed(&self, l: &Loc) {
        self.changed_rel(&l.rel);
    }

    /// The entry `rel` (relative to the root) changed.
    fn changed_rel(&self, rel: &[u8]) {
        if !self.opts.fsync {
            return;
        }
        if let Ok(mut d) = self.dirty.lock() {
            d.insert(parent_of(rel).to_vec());
        }
    }

    /// List a change to `rel` (see [`crate::itemize`]), when anyone
    /// listens.
    fn item(&self, code: [u8; 11], rel: &[u8], is_dir: bool, to: &[u8]) {
        if self.stats.listing() {
            self.stats
                .change(&crate::itemize::change(code, rel, is_dir, to));
        }
    }

    fn set_fatal(&self, e: Error) {
        if let Ok(mut g) = self.fatal.lock() {
            g.get_or_insert(e);
        }
        self.fatal_flag.store(true, Ordering::SeqCst);
    }
}

/// Sends each change to the peer (`--list-changes`) while it lives.
struct Forward(Arc<Mutex<Option<MsgTx>>>);

impl Forward {
    fn install(tx: &MsgTx, stats: &Stats) -> Forward {
        let slot = Arc::new(Mutex::new(Some(tx.clone())));
        let to = slot.clone();
        stats.on_change(move |l| {
            if let (itemize::Listed::Change(c), Ok(g)) = (l, to.lock()) {
                if let Some(tx) = &*g {
                    let _ = tx.send(Message::Change(Box::new(c.clone())));
                }
            }
        });
        Forward(slot)
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        if let Ok(mut g) = self.0.lock() {
            g.take();
        }
    }
}

/// Run the receiving side of a session over `ep`, writing under `root`.
pub fn run_receiver(
    ep: Endpoint,
    dest: &Dest,
    opts: &SyncOptions,
    stats: &Stats,
) -> Result<ReceiverReport> {
    let Endpoint {
        tx, rx, received, ..
    } = ep;
    let peer = crate::hello(&tx, &rx, opts.hello_wait, ferry_link::features::ALL)?;
    Stats::add(&stats.sessions, 1);
    // A remote receiver's changes go to the client that lists them, until
    // the session ends (the link's writer ends with its last sender).
    let _forward = opts.list_changes.then(|| Forward::install(&tx, stats));
    // From here on a silent peer is a dead one (not during an ssh login).
    rx.set_idle_timeout(opts.timeout);
    let setup = match Setup::open(dest, opts) {
        Ok(s) => s,
        Err(e) => {
            let _ = tx.send(crate::error::fatal(&e));
            return Err(e);
        }
    };
    // A failed run takes back the destination directory it made, if
    // nothing landed in it (a pull of a source that is not there).
    let made_root = match dest {
        Dest::Dir(r) if setup.root_created => Some(r.clone()),
        _ => None,
    };
    let (wake_tx, wake_rx) = bounded(1);
    let root = fsutil::is_root();
    let budget = file_budget();
    let shared = Shared {
        opts,
        backup_dir: setup.backup_dir,
        backup_id: setup.backup_id,
        keep: decide::Keep {
            // --chown sets what it names, as rsync's does.
            owner: (opts.owner || setup.chown.0.is_some()) && root,
            group: (opts.group || setup.chown.1.is_some()) && root,
            perms: opts.perms,
            times: opts.times,
        },
        stats,
        cache: setup.cache,
        fatal: Mutex::new(None),
        fatal_flag: AtomicBool::new(false),
        delta_done: AtomicU64::new(0),
        in_flight: Arc::new(InFlight {
            n: AtomicU64::new(0),
            wake: wake_tx,
            deltas: AtomicU64::new(0),
            stuck: AtomicU64::new(0),
        }),
        wake: wake_rx,
        dirty: Mutex::new(HashSet::new()),
        retries: Mutex::new(Vec::new()),
        commits: commit::Commits::new(budget),
    };
    let nworkers = opts.threads.max(1);
    let result = std::thread::scope(|s| {
        let mut senders = Vec::new();
        let mut handles = Vec::new();
        for _ in 0..nworkers {
            let (wtx, wrx) = bounded::<(Arc<DstFile>, Op)>(32);
            senders.push(wtx);
            let sh = &shared;
            handles.push(s.spawn(move || writer(wrx, sh)));
        }
        // Commits the batches that are due (see `commit`). Its queue
        // closes when `committing` is dropped, however this closure ends
        // (a panic too, which the scope would otherwise wait on for ever).
        let committer = {
            let (sh, batches) = (&shared, shared.commits.start());
            s.spawn(move || commit::committer(batches, sh))
        };
        let committing = commit::Stop(&shared.commits);
        // Commits batches that have waited long enough while nothing else
        // comes to commit them (a slow link, a big file behind them).
        // It stops as soon as `stop` is dropped, however this closure
        // ends (a panic too, which the scope would otherwise wait on for
        // ever); a sleeping timer would hold every run's end back by up to
        // a tick.
        let (stop, stopped) = bounded::<()>(0);
        let ticker = {
            let sh = &shared;
            s.spawn(move || {
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(COMMIT_TICK) {
                    sh.commits.tick(sh);
                }
            })
        };
        // Old copies of touched files, digested off the dispatcher.
        let (digest_tx, digest_rx) = bounded::<check::CheckJob>(256);
        let (digested_tx, digested_rx) = crossbeam_channel::unbounded();
        for _ in 0..check::DIGESTERS {
            let (jobs, out) = (digest_rx.clone(), digested_tx.clone());
            let wake = shared.in_flight.wake.clone();
            handles.push(s.spawn(move || check::digester(jobs, out, wake)));
        }
        drop((digest_rx, digested_tx));
        let (sign_tx, sign_rx) = crossbeam_channel::unbounded::<SignJob>();
        {
            let sh = &shared;
            let tx = tx.clone();
            handles.push(s.spawn(move || signer(sign_rx, sh, tx)));
        }
        // Deletions wait for the end of the list when it is checked there
        // (a listed path that is missing turns them off).
        let one_walk = peer & ferry_link::features::SUBTREES != 0 && !opts.listed_by_receiver;
        let deletes = opts
            .delete
            .then(|| deletes::start(s, stats, opts.max_delete, one_walk));
        let mut d = Dispatcher {
            deletes,
            warm: entries::Warm::NotYet,
            tree: setup.tree,
            root_created: setup.root_created,
            sh: &shared,
            tx: outbox::Outbox::new(&tx),
            files: HashMap::new(),
            checks: HashMap::new(),
            digesters: Some(digest_tx),
            digested_rx,
            digesting: Default::default(),
            done: HashMap::new(),
            seen: Default::default(),
            skipped: Default::default(),
            left_alone: Default::default(),
            dirs_ok: crate::pathset::DirSet::with(b""),
            dirs: Vec::new(),
            dirs_queued: HashSet::new(),
            links: Vec::new(),
            late: setup.late,
            replace_root: setup.replace_root,
            nbd: setup.nbd,
            received,
            started: std::time::Instant::now(),
            signer: Some(sign_tx),
            waiting: Default::default(),
            next_entry: 0,
            window: Default::default(),
            end_of_list: false,
            budget,
            check: {
                let mut c = ListCheck::new(Shape::Tree);
                c.expect_top(opts.expect_top.clone());
                c.expect_top_patterns(opts.expect_patterns.clone());
                c
            },
            source_unread: false,
            scanned: HashMap::new(),
            whole_only: HashSet::new(),
            link_dests: None,
            ids: Default::default(),
            chown: setup.chown,
            umask: fsutil::umask(),
        };
        let r = d.run(&rx, &senders);
        drop(senders);
        // The signer and the digesters stop once their queues are closed.
        d.signer = None;
        d.digesters = None;
        // What is still queued for them is dropped (with its places), not
        // digested for no one.
        drop(std::mem::replace(
            &mut d.digested_rx,
            crossbeam_channel::never(),
        ));
        d.files.clear();
        for h in handles {
            let _ = h.join();
        }
        drop(stop);
        let _ = ticker.join();
        drop(committing);
        let _ = committer.join();
        // Files verified before the run ended, even by an error, are
        // committed (as each would have been on its own).
        shared.commits.flush(&shared);
        r?;
        if let Some(e) = shared.fatal.lock().ok().and_then(|mut g| g.take()) {
            return Err(e);
        }
        d.finish();
        Ok(())
    });
    if let Err(e) = result {
        let _ = tx.send(crate::error::fatal(&e));
        if let Some(r) = made_root {
            // Only an empty directory goes.
            let _ = fs::remove_dir(r);
        }
        return Err(e);
    }
    let report = receiver_report(stats);
    tx.send(Message::ReceiverDone(Box::new(report.clone())))?;
    Ok(report)
}

struct Dispatcher<'a, 'b> {
    /// The destination, reached through directory handles only.
    tree: DestDir,
    /// Warmers on it, told of each entry of the list (see
    /// [`Dispatcher::warm_at`]).
    warm: entries::Warm,
    /// The root did not exist: its parent directory is fsynced at the end.
    root_created: bool,
    sh: &'a Shared<'b>,
    /// The link to the sender, for the `Want`s and `Have`s this thread
    /// makes (see [`outbox`]).
    tx: outbox::Outbox<'a>,
    files: HashMap<u32, Arc<DstFile>>,
    /// Files asked for with [`WantMode::Check`], waiting for the answer.
    checks: HashMap<u32, check::Checking>,
    /// `--delete`: its workers, limit and progress (see [`deletes`]).
    deletes: Option<deletes::Deletes>,
    /// The digesters' queue (see [`check::digester`]).
    digesters: Option<Sender<check::CheckJob>>,
    /// What they digested, for [`Self::digested`].
    digested_rx: Receiver<check::Digested>,
    /// Files whose old copy is being digested: not asked for yet, so
    /// neither `Decided` nor `EndOfList` may pass them.
    digesting: std::collections::BTreeSet<u32>,
    /// Segments of each file in flight that the sender has finished.
    done: HashMap<u32, decide::SegmentTally>,
    /// With `--delete`, every path in the source list (by keyed digest:
    /// see [`crate::pathset`]); without it, nothing.
    seen: crate::pathset::PathSet,
    /// Entries of the list this run skipped (a reserved name, below a
    /// directory it could not make): no hard link may name them.
    skipped: crate::pathset::PathSet,
    /// With `-H`: files a skip rule left as the destination has them
    /// (`-u`, `--ignore-existing`, `--min-size`, `--max-size`), with the
    /// source's size and time: a later name of one is not linked to what
    /// is there, which is not the source's content.
    left_alone: crate::pathset::PathMap<(u64, (i64, u32))>,
    /// Paths known to be real directories at the destination.
    dirs_ok: crate::pathset::DirSet,
    /// Paths of the directories in `dirs`.
    dirs_queued: HashSet<Vec<u8>>,
    /// Directories to give their metadata at the end.
    dirs: Vec<Entry>,
    links: Vec<Entry>,
    /// A destination to resolve on the first entry (see [`Dest::FileOrDir`]).
    late: Option<PathBuf>,
    /// See [`setup::Setup::replace_root`].
    replace_root: Option<PathBuf>,
    /// An NBD export that the one file of the list is written to.
    nbd: Option<String>,
    /// Bytes received so far and since when: the link's measured rate.
    received: ferry_link::WireCounter,
    started: std::time::Instant,
    /// The signer thread's queue (delta signatures, then `EndOfList`).
    signer: Option<Sender<SignJob>>,
    /// Files listed while the [`file_budget`] is spent, in list order.
    waiting: std::collections::VecDeque<Entry>,
    /// One past the last entry of the list read so far.
    next_entry: u32,
    /// The list window as sent in `Decided` (see [`crate::window`]): a
    /// sender that runs past it breaks the protocol.
    window: crate::window::Window,
    /// The sender's `EndOfList`, held until `waiting` is empty.
    end_of_list: bool,
    /// How many files may be open for writing at once.
    budget: decide::FileBudget,
    /// The rules a sender's list must keep (see [`crate::listcheck`]).
    check: ListCheck,
    /// Directories already cleared of stale temporary files, with whether
    /// their filesystem takes batch commits (one `fstatfs` a directory,
    /// not one a file).
    scanned: HashMap<Vec<u8>, Option<bool>>,
    /// The sender reported a source entry it could not list or read:
    /// `--delete` is off for the run (unless `--ignore-errors`).
    source_unread: bool,
    /// Files asked for again whole after a delta failed: never a delta.
    whole_only: HashSet<u32>,
    /// The `--link-dest` directories, opened at their first use.
    link_dests: Option<Vec<DestDir>>,
    /// The sender's owners and groups, by name, as this host's ids.
    ids: crate::ids::Mapper,
    /// `--chown`: the owner and group every entry gets.
    chown: (Option<u32>, Option<u32>),
    /// The process umask: what new entries' permissions lose without
    /// `--perms`.
    umask: u32,
}

/// How often the timer thread looks for batches of finished files that
/// have waited long enough (see [`commit::Commits::tick`]).
const COMMIT_TICK: std::time::Duration = std::time::Duration::from_millis(250);

/// How many files may be open for writing at once, from this process's
/// open-file limit (see [`decide::FileBudget::from_nofile`]).
fn file_budget() -> decide::FileBudget {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    decide::FileBudget::from_nofile(limit)
}

impl Dispatcher<'_, '_> {
    fn run(
        &mut self,
        rx: &ferry_link::MsgRx,
        workers: &[Sender<(Arc<DstFile>, Op)>],
    ) -> Result<()> {
        loop {
            if self.sh.fatal_flag.load(Ordering::Relaxed) {
                return Ok(());
            }
            if crate::interrupt::stopping() {
                return Err(Error::Interrupted);
            }
            self.tx.check()?;
            if self.digested()? {
                self.admit()?;
            }
            if !rx.ready() {
                self.tx.flush()?;
            }
            let Some(m) = rx.recv_or_wake(&self.sh.wake)? else {
                self.digested()?;
                self.admit()?;
                continue;
            };
            match m {
                Message::Entry(e) => {
                    if !self.window.push(e.id) {
                        return Err(Error::Protocol(format!(
                            "the sender listed entry {} past the list window",
                            e.id
                        )));
                    }
                    self.next_entry = e.id.saturating_add(1);
                    self.entry(*e)?;
                    self.tell_decided()?;
                }
                Message::Data { file, offset, data } => {
                    let len = data.len() as u64;
                    self.route(workers, file, offset, len, Op::Data(offset, data))?
                }
                Message::Zero { file, offset, len } => {
                    self.route(workers, file, offset, len, Op::Zero(offset, len, false))?
                }
                Message::Unused { file, offset, len } => {
                    self.route(workers, file, offset, len, Op::Zero(offset, len, true))?
                }
                Message::Copy {
                    file,
                    offset,
                    basis_offset,
                    len,
                } => self.route(
                    workers,
                    file,
                    offset,
                    len,
                    Op::Copy(offset, basis_offset, len),
                )?,
                Message::SegmentDone {
                    file,
                    segment,
                    digest,
                } => self.segment_done(workers, file, segment, digest)?,
                Message::Holes { file, first, count } => self.holes(workers, file, first, count)?,
                Message::FileChanged { file, error } => {
                    // Vanished or changed while read (an application
                    // still writing): the old copy stays, a warning; the
                    // source's listing was fine, so --delete stays on.
                    if let Some(f) = self.files.get(&file) {
                        f.fail_with(Failure::Changed(error));
                    } else {
                        self.check_dropped(file);
                        self.sh.stats.vanished(error);
                    }
                }
                Message::FileFailed { file, error } => {
                    // Part of the source could not be read: whether a
                    // listed file or something the list lacks, `--delete`
                    // is off for the run (see [`decide::deletion`]).
                    self.source_unread = true;
                    if let Some(f) = self.files.get(&file) {
                        f.fail_with(Failure::Sender(error));
                    } else {
                        self.check_dropped(file);
                        self.sh.stats.error(error);
                    }
                }
                Message::EndOfList => {
                    self.check_listed();
                    self.end_of_list = true;
                    self.warm = entries::Warm::Off;
                    self.admit()?;
                }
                Message::SenderDone => {
                    // All data must have come: a file asked for and not
                    // finished would otherwise go missing while the run
                    // reports success. One that failed on the way is
                    // counted (once) as the failure it is.
                    for (id, f) in &self.files {
                        match f.failure() {
                            None => {
                                return Err(Error::Protocol(format!(
                                    "the sender finished before sending all of file {id} ({})",
                                    f.loc.shown.display()
                                )))
                            }
                            Some(why) => report_failure(f, self.sh, why),
                        }
                    }
                    self.checks_answered()?;
                    if let Some(id) = self.digesting.first() {
                        return Err(Error::Protocol(format!(
                            "the sender finished before file {id} was asked for"
                        )));
                    }
                    if let Some(e) = self.waiting.front() {
                        return Err(Error::Protocol(format!(
                            "the sender finished before {} was asked for",
                            shown(&e.path)
                        )));
                    }
                    return Ok(());
                }
                Message::Fatal { class, error } => {
                    return Err(crate::error::from_fatal(class, error))
                }
                m => {
                    return Err(Error::Protocol(format!(
                        "receiver got unexpected {}",
                        m.name()
                    )))
                }
            }
        }
    }

    /// Report what handling an entry came to: a fatal error ends the run.
    fn outcome(&self, res: io::Result<()>, dest: &Path) -> Result<()> {
        if let Err(err) = res {
            if is_fatal_io(&err) {
                return Err(Error::io(dest, err));
            }
            self.sh.stats.error(line(dest, &err));
        }
        Ok(())
    }

    /// Files open for writing that may still get data (a file whose old
    /// copy could not be signed gets none, and holds no place).
    fn open_files(&self) -> usize {
        let open = self.sh.in_flight.n.load(Ordering::SeqCst) as usize;
        self.budget.holding(open, || {
            self.sh.in_flight.stuck.load(Ordering::SeqCst) as usize
        })
    }

    /// Open waiting files while there is room; once none wait, answer a
    /// held `EndOfList` (after every `Want` it must follow).
    fn admit(&mut self) -> Result<()> {
        let retries = self
            .sh
            .retries
            .lock()
            .map(|mut r| std::mem::take(&mut *r))
            .unwrap_or_default();
        for e in retries {
            // Once only: a whole file that fails too is a failed file.
            if !self.whole_only.insert(e.id) {
                continue;
            }
            if let Some(uri) = self.nbd.clone() {
                self.nbd_open(e, &uri)?;
                continue;
            }
            let shown = self.tree.show(&e.path);
            let res = self.tree.loc(&e.path, false).and_then(|l| self.file(e, &l));
            self.outcome(res, &shown)?;
        }
        while self.budget.has_room(self.open_files()) {
            let Some(e) = self.waiting.pop_front() else {
                break;
            };
            let shown = self.tree.show(&e.path);
            let res = self.tree.loc(&e.path, false).and_then(|l| self.file(e, &l));
            self.outcome(res, &shown)?;
        }
        self.tell_decided()?;
        // Every delta must be finished first: one that fails is asked for
        // again, and no `Want` may follow `EndOfList`.
        let deltas = self.sh.in_flight.deltas.load(Ordering::SeqCst);
        let retrying = self.sh.retries.lock().is_ok_and(|r| !r.is_empty());
        let waiting = self.waiting.len() + self.digesting.len();
        if decide::may_end_list(self.end_of_list, waiting, deltas, retrying) {
            self.end_of_list = false;
            self.sign(SignJob::EndOfList)
                .map_err(|e| Error::Protocol(e.to_string()))?;
        }
        Ok(())
    }

    /// Tell the sender how far the list is decided, every so often: it
    /// lists at most a window past that (see [`decide::decided_due`]).
    fn tell_decided(&mut self) -> Result<()> {
        // Not past a file still waiting for room or for its digest.
        let below = [
            self.waiting.front().map(|e| e.id),
            self.digesting.first().copied(),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(self.next_entry);
        if decide::decided_due(below, self.window.below()) {
            self.sign(SignJob::Decided(below))
                .map_err(|e| Error::Protocol(e.to_string()))?;
            self.window.decided(below);
        }
        Ok(())
    }

    /// Queue work for the signer thread, after what this thread holds for
    /// the sender (the signer's `Decided` and `EndOfList` must not pass a
    /// `Want`; a failed hand-over is the run loop's error, see [`outbox`]).
    fn sign(&self, job: SignJob) -> io::Result<()> {
        self.tx.push();
        self.signer
            .as_ref()
            .and_then(|s| s.send(job).ok())
            .ok_or_else(|| io::Error::other("signer thread gone"))
    }
}
