//! The receiving side: compares each entry of the file list with the
//! destination, asks for what changed, writes it with several workers,
//! verifies every segment against the sender's digest, and commits each
//! file atomically (temp file + rename, unless `--inplace`).
//!
//! The thread that calls [`run_receiver`] reads the link and dispatches;
//! ops of one segment always go to the same writer worker, so each worker
//! sees a segment's ops in order and can digest them as it writes.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{
    DirBuilderExt, FileExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt,
};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_channel::{bounded, Receiver, Sender};
use ferry_proto::layout::{self, SegmentHasher};
use ferry_proto::{Endpoint, Entry, EntryKind, Message, MsgTx, ReceiverReport, WantMode};

use crate::direct;
use crate::error::{describe, is_fatal_io, line, Error, IoOp, Result};
use crate::fsutil;
use crate::listcheck::{parent_of, shown, ListCheck, Shape};
use crate::plan::Dest;
use crate::stats::Stats;
use crate::SyncOptions;

/// The signature of an old copy, kept by the receiver; it grows in file
/// order while the old copy is signed.
#[derive(Default)]
struct BasisBlocks {
    size: u64,
    weak: Vec<u64>,
    full: Vec<[u8; 32]>,
}

/// Where a received file's bytes go.
enum Target {
    File(File),
    /// An NBD export, written in place (zero ranges as WRITE_ZEROES).
    Nbd(ferry_nbd::Client),
}

fn nbd_io(e: ferry_nbd::Error) -> io::Error {
    io::Error::other(format!("NBD: {e}"))
}

impl Target {
    fn write_all_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        match self {
            Target::File(f) => f.write_all_at(buf, off),
            Target::Nbd(c) => c.write_at(off, buf).map_err(nbd_io),
        }
    }
    fn zero_range(&self, off: u64, len: u64) -> io::Result<()> {
        match self {
            Target::File(f) => fsutil::zero_range(f, off, len),
            Target::Nbd(c) => c.write_zeroes(off, len).map_err(nbd_io),
        }
    }
    fn sync_data(&self) -> io::Result<()> {
        match self {
            Target::File(f) => f.sync_data(),
            Target::Nbd(c) => c.flush().map_err(nbd_io),
        }
    }
    fn as_file(&self) -> Option<&File> {
        match self {
            Target::File(f) => Some(f),
            Target::Nbd(_) => None,
        }
    }
}

/// A file being received.
/// Counts the files open for writing; a [`Slot`] holds one place.
struct InFlight {
    n: AtomicU64,
    /// Wakes the dispatcher when a place frees up without a message from
    /// the sender (a file applied, or an old copy that could not be signed).
    wake: Sender<()>,
}

/// One file's place among the files in flight, given back when the file
/// (its temp file and old copy) is dropped.
struct Slot(Arc<InFlight>);

impl Slot {
    fn take(f: &Arc<InFlight>) -> Slot {
        f.n.fetch_add(1, Ordering::SeqCst);
        Slot(f.clone())
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.n.fetch_sub(1, Ordering::SeqCst);
        let _ = self.0.wake.try_send(());
    }
}

struct DstFile {
    entry: Entry,
    final_path: PathBuf,
    /// Temporary file renamed over `final_path` at the end; `None` when
    /// writing in place.
    tmp: Option<PathBuf>,
    file: Target,
    /// The temp file opened again with `O_DIRECT` (see [`direct`]), while
    /// direct writes work.
    direct: Option<File>,
    direct_ok: AtomicBool,
    /// The old copy's delta-block hashes (delta transfers), as far as it is
    /// signed: unchanged blocks are verified with these instead of being
    /// read again.
    basis_blocks: std::sync::RwLock<BasisBlocks>,
    /// The old copy that `Copy` ops read from (delta transfers).
    basis: Option<direct::Reader>,
    /// Sent as a delta (cleared if the signer sends it whole after all).
    delta: AtomicBool,
    /// Reading the old copy over sending the file whole, in time, when the
    /// delta was chosen (0 when forced or free): see [`delta_saving`].
    delta_cost: f64,
    /// Digest what is written and compare with the sender's digests (all
    /// but whole-file transfers over the in-process link).
    verify: bool,
    /// Signature of what is written, for the cache (when enabled).
    sig_out: Option<SigOut>,
    /// The digest grid (the delta grid for deltas).
    block: AtomicU64,
    nseg: u64,
    remaining: AtomicU64,
    failed: Mutex<Option<Failure>>,
    /// Its failure has been counted and told (once).
    reported: AtomicBool,
    /// A block device written in place.
    is_device: bool,
    /// A character device or FIFO (`/dev/null`, a tape, a pipe): the data
    /// is assembled in an unnamed temporary file and, once verified,
    /// written to it in order at commit, as `cp` would. Never replaced.
    stream_to: bool,
    committed: AtomicBool,
    /// Declared last: dropped last, once the file's descriptors are closed.
    _slot: Slot,
}

/// Why a file was not committed. The first failure of a file counts.
#[derive(Clone, Debug)]
enum Failure {
    /// What was written differs from what the sender read: a delta is
    /// sent again whole.
    Mismatch(String),
    /// An operation on the file failed: its name and the OS's reason.
    Io(&'static str, String),
    /// The sender could not read it: its line, which names its path.
    Sender(String),
    /// Anything else, as a reason to print after the file's path.
    Other(String),
}

impl DstFile {
    fn fail(&self, why: String) {
        self.fail_with(Failure::Other(why));
    }
    fn fail_with(&self, why: Failure) {
        if let Ok(mut g) = self.failed.lock() {
            g.get_or_insert(why);
        }
    }
    fn failure(&self) -> Option<Failure> {
        self.failed.lock().ok().and_then(|g| g.clone())
    }
}

impl Drop for DstFile {
    fn drop(&mut self) {
        if let Some(t) = &self.tmp {
            if !self.committed.load(Ordering::SeqCst) {
                let _ = fs::remove_file(t);
                fsutil::unregister_temp(t);
            }
        }
    }
}

enum Op {
    Data(u64, Vec<u8>),
    Zero(u64, u64),
    Copy(u64, u64, u64),
    Done(u32, [u8; 32]),
}

/// Collects the delta signature of a file as it is written, so the next
/// run can take it from the cache instead of re-reading the file.
struct SigOut {
    cache: Arc<ferry_delta::SigCache>,
    bs: u64,
    parts: Mutex<Vec<Option<SigPart>>>,
}

/// Weak and full block hashes of one segment.
type SigPart = (Vec<u64>, Vec<[u8; 32]>);

/// Builds per-block weak and strong hashes from a segment's bytes in order.
struct SigBuild {
    bs: usize,
    cur: Vec<u8>,
    weak: Vec<u64>,
    full: Vec<[u8; 32]>,
}

impl SigBuild {
    fn feed(&mut self, mut b: &[u8]) {
        while !b.is_empty() {
            let k = (self.bs - self.cur.len()).min(b.len());
            self.cur.extend_from_slice(&b[..k]);
            b = &b[k..];
            if self.cur.len() == self.bs {
                self.flush();
            }
        }
    }
    fn zeros(&mut self, mut n: u64) {
        static Z: [u8; 1 << 16] = [0; 1 << 16];
        while n > 0 {
            let k = n.min(Z.len() as u64);
            self.feed(&Z[..k as usize]);
            n -= k;
        }
    }
    /// A whole block whose hashes are known; only at a block start.
    fn known(&mut self, weak: u64, full: [u8; 32]) {
        self.weak.push(weak);
        self.full.push(full);
    }
    fn flush(&mut self) {
        if !self.cur.is_empty() {
            self.weak.push(ferry_delta::weak_hash(&self.cur));
            self.full.push(layout::block_hash(&self.cur));
            self.cur.clear();
        }
    }
}

struct Shared<'a> {
    opts: &'a SyncOptions,
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
    /// Directories whose entries changed: fsynced once at the end.
    dirty: Mutex<HashSet<PathBuf>>,
}

impl Shared<'_> {
    /// `p` was created, renamed over or removed: its directory must reach
    /// the disk before the run says done.
    fn changed(&self, p: &Path) {
        if !self.opts.fsync {
            return;
        }
        let dir = match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        if let Ok(mut d) = self.dirty.lock() {
            d.insert(dir);
        }
    }

    fn set_fatal(&self, e: Error) {
        if let Ok(mut g) = self.fatal.lock() {
            g.get_or_insert(e);
        }
        self.fatal_flag.store(true, Ordering::SeqCst);
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
    crate::hello(&tx, &rx)?;
    // A file-or-directory destination that is an existing directory is a
    // directory; otherwise the first entry decides.
    let nbd = match dest {
        Dest::Nbd(uri) => Some(uri.clone()),
        _ => None,
    };
    let (root, late) = match dest {
        Dest::Nbd(_) => (PathBuf::from("."), None),
        Dest::Dir(r) => (r.clone(), None),
        Dest::FileOrDir(p) if fs::metadata(p).is_ok_and(|m| m.is_dir()) => (p.clone(), None),
        Dest::FileOrDir(p) => (p.clone(), Some(p.clone())),
    };
    let root = root.as_path();
    if !opts.dry_run && late.is_none() && nbd.is_none() {
        let replaceable = |m: &fs::Metadata| m.is_file() || m.file_type().is_symlink();
        match fs::symlink_metadata(root) {
            Ok(m) if m.is_dir() => {}
            Ok(m) if opts.force && replaceable(&m) => {
                if let Err(err) = fs::remove_file(root).and_then(|_| fs::create_dir(root)) {
                    let e = Error::io_op("replace with a directory", root, err);
                    let _ = tx.send(Message::Fatal {
                        error: e.to_string(),
                    });
                    return Err(e);
                }
            }
            Ok(m) => {
                let e = Error::io(
                    root,
                    io::Error::other(if replaceable(&m) {
                        "destination exists and is not a directory (--force replaces it)"
                    } else {
                        "destination exists and is not a directory"
                    }),
                );
                let _ = tx.send(Message::Fatal {
                    error: e.to_string(),
                });
                return Err(e);
            }
            Err(_) => {
                if let Err(err) = fs::create_dir_all(root) {
                    let e = Error::io_op("create directory", root, err);
                    let _ = tx.send(Message::Fatal {
                        error: e.to_string(),
                    });
                    return Err(e);
                }
            }
        }
    }

    let cache = match (&opts.sig_cache, opts.dry_run) {
        (Some(dir), false) => match ferry_delta::SigCache::open(dir) {
            Ok(c) => Some(Arc::new(c)),
            Err(e) => {
                let e = Error::io(dir, e);
                let _ = tx.send(Message::Fatal {
                    error: e.to_string(),
                });
                return Err(e);
            }
        },
        _ => None,
    };
    let (wake_tx, wake_rx) = bounded(1);
    let shared = Shared {
        opts,
        stats,
        cache,
        fatal: Mutex::new(None),
        fatal_flag: AtomicBool::new(false),
        delta_done: AtomicU64::new(0),
        in_flight: Arc::new(InFlight {
            n: AtomicU64::new(0),
            wake: wake_tx,
        }),
        wake: wake_rx,
        dirty: Mutex::new(HashSet::new()),
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
        let (sign_tx, sign_rx) = crossbeam_channel::unbounded::<SignJob>();
        {
            let sh = &shared;
            let tx = tx.clone();
            handles.push(s.spawn(move || signer(sign_rx, sh, tx)));
        }
        let mut d = Dispatcher {
            root: root.to_path_buf(),
            sh: &shared,
            tx: &tx,
            files: HashMap::new(),
            done: HashMap::new(),
            paths: HashMap::new(),
            seen: HashSet::new(),
            dirs_ok: HashSet::from([Vec::new()]),
            dirs: Vec::new(),
            dirs_queued: HashSet::new(),
            links: Vec::new(),
            late,
            nbd,
            received,
            started: std::time::Instant::now(),
            signer: Some(sign_tx),
            waiting: Default::default(),
            end_of_list: false,
            max_in_flight: max_in_flight(),
            check: {
                let mut c = ListCheck::new(Shape::Tree);
                c.expect_top(opts.expect_top.clone());
                c
            },
            source_unread: false,
            scanned: HashSet::new(),
        };
        let r = d.run(&rx, &senders);
        drop(senders);
        // The signer stops once its queue is closed.
        d.signer = None;
        d.files.clear();
        for h in handles {
            let _ = h.join();
        }
        match r {
            Ok(()) => {
                if let Some(e) = shared.fatal.lock().ok().and_then(|mut g| g.take()) {
                    return Err(e);
                }
                d.finish();
                Ok(())
            }
            Err(e) => Err(e),
        }
    });
    if let Err(e) = result {
        let _ = tx.send(Message::Fatal {
            error: e.to_string(),
        });
        return Err(e);
    }
    let rep = stats.report(0.0);
    let report = ReceiverReport {
        files_total: rep.files_total,
        files_transferred: rep.files_transferred,
        files_delta: rep.files_delta,
        files_deleted: rep.files_deleted,
        files_failed: rep.files_failed,
        bytes_total: rep.bytes_total,
        bytes_transferred: rep.bytes_transferred,
        bytes_written: rep.bytes_written,
        bytes_matched: rep.bytes_matched,
        dirs_total: rep.dirs_total,
        delete_skipped: rep.delete_skipped as u64,
        delta_mismatch: stats.delta_mismatch.load(Ordering::Relaxed),
        errors: rep.errors,
    };
    tx.send(Message::ReceiverDone(Box::new(report.clone())))?;
    Ok(report)
}

struct Dispatcher<'a, 'b> {
    root: PathBuf,
    sh: &'a Shared<'b>,
    tx: &'a MsgTx,
    files: HashMap<u32, Arc<DstFile>>,
    /// Segments of each file in flight that the sender has finished.
    done: HashMap<u32, HashSet<u32>>,
    /// Destination path of every file entry, for hard links.
    paths: HashMap<u32, PathBuf>,
    /// Every path in the source list, for `--delete`.
    seen: HashSet<Vec<u8>>,
    /// Paths known to be real directories at the destination.
    dirs_ok: HashSet<Vec<u8>>,
    /// Paths of the directories in `dirs`.
    dirs_queued: HashSet<Vec<u8>>,
    /// Directories to give their metadata at the end.
    dirs: Vec<(PathBuf, Entry)>,
    links: Vec<Entry>,
    /// A destination to resolve on the first entry (see [`Dest::FileOrDir`]).
    late: Option<PathBuf>,
    /// An NBD export that the one file of the list is written to.
    nbd: Option<String>,
    /// Bytes received so far and since when: the link's measured rate.
    received: ferry_proto::WireCounter,
    started: std::time::Instant,
    /// The signer thread's queue (delta signatures, then `EndOfList`).
    signer: Option<Sender<SignJob>>,
    /// Files listed while [`max_in_flight`] others are open, in list order.
    waiting: std::collections::VecDeque<(Entry, PathBuf)>,
    /// The sender's `EndOfList`, held until `waiting` is empty.
    end_of_list: bool,
    max_in_flight: usize,
    /// The rules a sender's list must keep (see [`crate::listcheck`]).
    check: ListCheck,
    /// Directories already cleared of stale temporary files.
    scanned: HashSet<PathBuf>,
    /// The sender reported a source entry it could not list or read:
    /// `--delete` is off for the run (unless `--ignore-errors`).
    source_unread: bool,
}

/// How many files may be open for writing at once: each holds a temp file,
/// its direct twin and an old copy, and the file list runs far ahead of the
/// data. A quarter of the open-file limit, less a margin for everything
/// else, and at most 4096.
fn max_in_flight() -> usize {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX);
    (limit.saturating_sub(48) / 4).clamp(4, 4096) as usize
}

/// Cold sequential read rate assumed for the old copy when weighing a
/// delta (measured on this project's machines: ~1.5 GB/s).
const BASIS_READ_RATE: f64 = 1.5e9;
/// Link rate assumed until enough has arrived to measure one (gigabit).
const ASSUMED_LINK_RATE: f64 = 117e6;
/// Below this size a file goes whole: a signature round trip costs more.
const MIN_DELTA_SIZE: u64 = 64 << 10;

impl Dispatcher<'_, '_> {
    fn run(
        &mut self,
        rx: &ferry_proto::MsgRx,
        workers: &[Sender<(Arc<DstFile>, Op)>],
    ) -> Result<()> {
        loop {
            if self.sh.fatal_flag.load(Ordering::Relaxed) {
                return Ok(());
            }
            let Some(m) = rx.recv_or_wake(&self.sh.wake)? else {
                self.admit()?;
                continue;
            };
            match m {
                Message::Entry(e) => self.entry(*e)?,
                Message::Data { file, offset, data } => {
                    let len = data.len() as u64;
                    self.route(workers, file, offset, len, Op::Data(offset, data))?
                }
                Message::Zero { file, offset, len } => {
                    self.route(workers, file, offset, len, Op::Zero(offset, len))?
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
                } => {
                    let f = self.lookup(file)?;
                    if segment as u64 >= f.nseg {
                        return Err(Error::Protocol(format!(
                            "segment {segment} of file {file}, which has {}",
                            f.nseg
                        )));
                    }
                    let done = self.done.entry(file).or_default();
                    if !done.insert(segment) {
                        return Err(Error::Protocol(format!(
                            "segment {segment} of file {file} finished twice"
                        )));
                    }
                    let last = done.len() as u64 >= f.nseg;
                    if last {
                        self.files.remove(&file);
                        self.done.remove(&file);
                    }
                    let k = worker_for(&f, segment as u64, workers.len());
                    send_op(&workers[k], f, Op::Done(segment, digest))?;
                    if last {
                        self.admit()?;
                    }
                }
                Message::FileFailed { file, error } => {
                    if let Some(f) = self.files.get(&file) {
                        f.fail_with(Failure::Sender(error));
                    } else {
                        // Part of the source could not be listed or read:
                        // its absence from the list means nothing.
                        self.source_unread = true;
                        self.sh.stats.error(error);
                    }
                }
                Message::EndOfList => {
                    self.end_of_list = true;
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
                                    f.final_path.display()
                                )))
                            }
                            Some(why) => report_failure(f, self.sh, why),
                        }
                    }
                    if let Some((e, _)) = self.waiting.front() {
                        return Err(Error::Protocol(format!(
                            "the sender finished before {} was asked for",
                            shown(&e.path)
                        )));
                    }
                    return Ok(());
                }
                Message::Fatal { error } => return Err(Error::Peer(error)),
                m => {
                    return Err(Error::Protocol(format!(
                        "receiver got unexpected {}",
                        m.name()
                    )))
                }
            }
        }
    }

    fn lookup(&self, file: u32) -> Result<Arc<DstFile>> {
        self.files.get(&file).cloned().ok_or_else(|| {
            Error::Protocol(format!("data for file {file}, which was not requested"))
        })
    }

    /// Hand a data op to the writer of its segment. An op must lie within
    /// one segment of the file as announced, of a segment not yet finished.
    fn route(
        &mut self,
        workers: &[Sender<(Arc<DstFile>, Op)>],
        file: u32,
        offset: u64,
        len: u64,
        op: Op,
    ) -> Result<()> {
        let f = self.lookup(file)?;
        let seg = offset / layout::SEGMENT;
        if len == 0 && offset <= f.entry.size {
            // Says nothing; harmless.
            return Ok(());
        }
        let inside = offset
            .checked_add(len)
            .is_some_and(|end| end <= f.entry.size && (end - 1) / layout::SEGMENT == seg);
        if !inside {
            return Err(Error::Protocol(format!(
                "{} bytes at offset {offset} of file {file} ({} bytes): not within one segment",
                len, f.entry.size
            )));
        }
        if self
            .done
            .get(&file)
            .is_some_and(|d| d.contains(&(seg as u32)))
        {
            return Err(Error::Protocol(format!(
                "data for segment {seg} of file {file} after it was finished"
            )));
        }
        let k = worker_for(&f, seg, workers.len());
        send_op(&workers[k], f, op)
    }

    fn entry(&mut self, mut e: Entry) -> Result<()> {
        // On a pull, only what was asked for; then the path is checked
        // (with the rest of the list's rules) once the first entry of a
        // file-or-directory destination has chosen which.
        self.check
            .top_ok(&e.path)
            .map_err(|r| Error::Protocol(r.to_string()))?;
        if let Some(p) = self.late.take() {
            self.resolve_root(&p, &mut e)?;
            if e.kind() != EntryKind::Dir {
                self.check.set_shape(Shape::SingleFile);
            }
        }
        self.check
            .admit(&e)
            .map_err(|r| Error::Protocol(r.to_string()))?;
        if let Some(uri) = self.nbd.clone() {
            return self.nbd_entry(e, &uri);
        }
        let stats = self.sh.stats;
        if e.kind() == EntryKind::Dir {
            Stats::add(&stats.dirs_total, 1);
        } else {
            Stats::add(&stats.files_total, 1);
        }
        if e.kind() == EntryKind::File {
            Stats::add(&stats.bytes_total, e.size);
        }
        if !self.dirs_ok.contains(parent_of(&e.path)) {
            stats.error(format!(
                "{}: skipped: its directory could not be made at the destination",
                shown(&e.path)
            ));
            return Ok(());
        }
        self.seen.insert(e.path.clone());
        let dest = if e.path.is_empty() {
            self.root.clone()
        } else {
            self.root.join(std::ffi::OsStr::from_bytes(&e.path))
        };
        let res = match e.kind() {
            EntryKind::Dir => self.dir(e, &dest),
            EntryKind::Symlink => self.symlink(&e, &dest),
            EntryKind::File => {
                self.paths.insert(e.id, dest.clone());
                if !self.waiting.is_empty() || self.open_files() >= self.max_in_flight {
                    self.waiting.push_back((e, dest));
                    return Ok(());
                }
                self.file(e, &dest)
            }
            EntryKind::HardLink => {
                self.links.push(e);
                Ok(())
            }
        };
        self.outcome(res, &dest)
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
        if open < self.max_in_flight {
            return open;
        }
        let stuck = self
            .files
            .values()
            .filter(|f| f.failure().is_some() && f.basis.is_some())
            .count();
        open.saturating_sub(stuck)
    }

    /// Open waiting files while there is room; once none wait, answer a
    /// held `EndOfList` (after every `Want` it must follow).
    fn admit(&mut self) -> Result<()> {
        while self.open_files() < self.max_in_flight {
            let Some((e, dest)) = self.waiting.pop_front() else {
                break;
            };
            let res = self.file(e, &dest);
            self.outcome(res, &dest)?;
        }
        if self.end_of_list && self.waiting.is_empty() {
            self.end_of_list = false;
            self.sign(SignJob::EndOfList)
                .map_err(|e| Error::Protocol(e.to_string()))?;
        }
        Ok(())
    }

    /// The one entry of a session whose destination is an NBD export.
    fn nbd_entry(&mut self, e: Entry, uri: &str) -> Result<()> {
        let stats = self.sh.stats;
        Stats::add(&stats.files_total, 1);
        if e.kind() != EntryKind::File || e.id != 0 {
            return Err(Error::Usage(format!(
                "{uri}: an NBD destination takes exactly one file"
            )));
        }
        Stats::add(&stats.bytes_total, e.size);
        Stats::add(&stats.bytes_transferred, e.size);
        stats.change(format!("write {} to {uri}", shown(&e.path)));
        if self.sh.opts.dry_run {
            Stats::add(&stats.files_transferred, 1);
            return Ok(());
        }
        let client = ferry_nbd::Client::connect(uri).map_err(|err| Error::io(uri, nbd_io(err)))?;
        if client.read_only() {
            return Err(Error::io(
                uri,
                io::Error::other("the NBD export is read-only"),
            ));
        }
        if client.size() < e.size {
            return Err(Error::io(
                uri,
                io::Error::other(format!(
                    "the export holds {} bytes, the source has {}",
                    client.size(),
                    e.size
                )),
            ));
        }
        let nseg = layout::segment_count(e.size);
        let id = e.id;
        let d = Arc::new(DstFile {
            _slot: Slot::take(&self.sh.in_flight),
            basis: None,
            basis_blocks: Default::default(),
            verify: !self.sh.opts.in_process,
            delta: AtomicBool::new(false),
            delta_cost: 0.0,
            sig_out: None,
            block: AtomicU64::new(layout::grid_block(e.size)),
            nseg,
            remaining: AtomicU64::new(nseg),
            failed: Mutex::new(None),
            final_path: PathBuf::from(uri),
            tmp: None,
            file: Target::Nbd(client),
            direct: None,
            direct_ok: AtomicBool::new(false),
            is_device: true,
            stream_to: false,
            reported: AtomicBool::new(false),
            committed: AtomicBool::new(false),
            entry: e,
        });
        if nseg == 0 {
            return finalize(&d, self.sh).map_err(|err| Error::io(uri, err));
        }
        self.files.insert(id, d);
        self.tx.send(Message::Want {
            file: id,
            mode: WantMode::Whole,
        })?;
        Ok(())
    }

    /// First entry of a [`Dest::FileOrDir`] session: a directory source
    /// goes under the path, a file source becomes the path.
    fn resolve_root(&mut self, p: &Path, e: &mut Entry) -> Result<()> {
        if e.kind() != EntryKind::Dir {
            let name = p
                .file_name()
                .map(|n| n.as_bytes().to_vec())
                .unwrap_or_default();
            if name.is_empty() {
                return Err(Error::Usage(format!("{}: not a file name", p.display())));
            }
            self.root = p
                .parent()
                .filter(|q| !q.as_os_str().is_empty())
                .map(Path::to_path_buf)
                .unwrap_or_else(|| PathBuf::from("."));
            e.path = name;
        }
        if !self.sh.opts.dry_run {
            fs::create_dir_all(&self.root)
                .map_err(|err| Error::io_op("create directory", &self.root, err))?;
        }
        Ok(())
    }

    /// Make room for a new entry of another type at `dest`.
    fn clear(&self, dest: &Path, meta: &fs::Metadata) -> io::Result<()> {
        if self.sh.opts.dry_run {
            return Ok(());
        }
        if meta.is_dir() {
            if self.sh.opts.delete || self.sh.opts.force {
                fs::remove_dir_all(dest).op("remove directory")
            } else {
                fs::remove_dir(dest).map_err(|_| {
                    io::Error::other("a directory is in the way (--force or --delete replaces it)")
                })
            }
        } else {
            fs::remove_file(dest).op("remove")
        }
    }

    fn dir(&mut self, e: Entry, dest: &Path) -> io::Result<()> {
        match fs::symlink_metadata(dest) {
            Ok(m) if m.is_dir() => {}
            other => {
                if let Ok(m) = &other {
                    self.clear(dest, m)?;
                }
                self.sh.stats.change(format!("created {}/", shown(&e.path)));
                if !self.sh.opts.dry_run {
                    fs::DirBuilder::new()
                        .mode(0o700 | (e.mode & 0o777))
                        .create(dest)
                        .op("create directory")?;
                    self.sh.changed(dest);
                }
            }
        }
        self.dirs_ok.insert(e.path.clone());
        // A directory sent again (two sources merging) is handled once.
        if self.dirs_queued.insert(e.path.clone()) {
            self.dirs.push((dest.to_path_buf(), e));
        }
        Ok(())
    }

    fn symlink(&mut self, e: &Entry, dest: &Path) -> io::Result<()> {
        let target = std::ffi::OsStr::from_bytes(&e.target);
        match fs::symlink_metadata(dest) {
            Ok(m) if m.file_type().is_symlink() && fs::read_link(dest)?.as_os_str() == target => {
                if !self.sh.opts.dry_run {
                    self.link_meta(e, dest)?;
                }
                return Ok(());
            }
            Ok(m) if m.is_dir() => self.clear(dest, &m)?,
            _ => {}
        }
        self.sh.stats.change(format!(
            "symlink {} -> {}",
            shown(&e.path),
            target.to_string_lossy()
        ));
        if self.sh.opts.dry_run {
            return Ok(());
        }
        let tmp = fsutil::temp_path_for(dest);
        std::os::unix::fs::symlink(target, &tmp).op("create symlink")?;
        if let Err(err) = self
            .link_meta(e, &tmp)
            .op("set metadata of")
            .and_then(|_| fs::rename(&tmp, dest).op("rename into place"))
        {
            let _ = fs::remove_file(&tmp);
            return Err(err);
        }
        Stats::add(&self.sh.stats.files_transferred, 1);
        self.sh.changed(dest);
        Ok(())
    }

    fn link_meta(&self, e: &Entry, p: &Path) -> io::Result<()> {
        if self.sh.opts.owner {
            fsutil::lchown(p, e.uid, e.gid)?;
        }
        fsutil::set_mtime_path(p, e.mtime, e.mtime_nsec)
    }

    fn file(&mut self, e: Entry, dest: &Path) -> io::Result<()> {
        let opts = self.sh.opts;
        let stats = self.sh.stats;
        let mut is_device = false;
        let mut stream_to = false;
        let mut exists_regular = false;
        let mut old_meta = None;
        match fs::symlink_metadata(dest) {
            Ok(m) if m.is_dir() => {
                self.clear(dest, &m)?;
            }
            Ok(m) if m.file_type().is_block_device() => is_device = true,
            Ok(m) if m.file_type().is_char_device() || m.file_type().is_fifo() => stream_to = true,
            Ok(m) if m.is_file() => {
                exists_regular = true;
                if m.len() == e.size && self.unchanged(&e, dest, &m)? {
                    if !opts.dry_run {
                        self.fix_meta(&e, dest, &m)?;
                    }
                    return Ok(());
                }
                old_meta = Some(m);
            }
            _ => {}
        }
        stats.change(format!(
            "{} {}",
            if exists_regular || is_device || stream_to {
                "update"
            } else {
                "new"
            },
            shown(&e.path)
        ));
        Stats::add(&stats.bytes_transferred, e.size);
        if opts.dry_run {
            Stats::add(&stats.files_transferred, 1);
            return Ok(());
        }
        let inplace = is_device || (opts.inplace && exists_regular);
        let delta_cost = if !is_device && e.size > 0 {
            old_meta
                .as_ref()
                .filter(|m| m.len() > 0)
                .and_then(|m| self.delta_cost(&e, m, dest))
        } else {
            None
        };
        let delta = delta_cost.is_some_and(|c| c < delta_saving(self.sh));
        let (file, tmp) = if is_device {
            let f = OpenOptions::new()
                .write(true)
                .open(dest)
                .op("open device")?;
            let dev_size = fsutil::size_of(&f, &f.metadata()?)?;
            if dev_size < e.size {
                return Err(io::Error::other(format!(
                    "device holds {dev_size} bytes, source has {}",
                    e.size
                )));
            }
            (f, None)
        } else if stream_to {
            (tempfile::tempfile().op("create temporary file for")?, None)
        } else if inplace {
            (
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(dest)
                    .op("open for writing")?,
                None,
            )
        } else {
            self.clean_stale_temps(dest);
            let tmp = fsutil::temp_path_for(dest);
            let f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)
                .op("create temporary file for")?;
            fsutil::register_temp(&tmp);
            if let Err(err) = f.set_len(e.size).op("allocate") {
                let _ = fs::remove_file(&tmp);
                fsutil::unregister_temp(&tmp);
                return Err(err);
            }
            (f, Some(tmp))
        };
        let direct = match &tmp {
            Some(t) if opts.direct_io && e.size >= direct::MIN_SIZE => direct::open(t),
            _ => None,
        };
        let nseg = layout::segment_count(e.size);
        let id = e.id;
        let basis = match (delta, inplace) {
            (false, _) => None,
            // The old copy is read through the page cache: signing it
            // leaves it there for the copies, which would otherwise read it
            // from the disk a second time (measured on the 1 GiB mangled
            // file: 3.9-4.5 s buffered, 5.1-8.2 s direct). In place it is
            // also the file being written.
            (true, true) => Some(direct::Reader::new(file.try_clone()?, dest, false)),
            (true, false) => Some(direct::Reader::new(
                File::open(dest).op("open old copy of")?,
                dest,
                false,
            )),
        };
        let file = Target::File(file);
        // A signature kept for the cache grows with the file: none beyond
        // 2^17 segments (1 TiB).
        let sig_out = self
            .sh
            .cache
            .as_ref()
            .filter(|_| nseg > 0 && nseg <= 1 << 17)
            .map(|c| SigOut {
                cache: c.clone(),
                bs: layout::delta_block(e.size),
                parts: Mutex::new(vec![None; nseg as usize]),
            });
        let d = Arc::new(DstFile {
            _slot: Slot::take(&self.sh.in_flight),
            basis,
            basis_blocks: Default::default(),
            verify: delta || !opts.in_process,
            delta: AtomicBool::new(delta),
            delta_cost: delta_cost.unwrap_or(0.0),
            sig_out,
            // Deltas digest on the delta grid, so the old copy's block
            // hashes can stand for blocks that did not change.
            block: AtomicU64::new(if delta {
                layout::delta_block(e.size)
            } else {
                layout::grid_block(e.size)
            }),
            nseg,
            remaining: AtomicU64::new(nseg),
            failed: Mutex::new(None),
            final_path: dest.to_path_buf(),
            tmp,
            file,
            direct_ok: AtomicBool::new(direct.is_some()),
            direct,
            is_device,
            stream_to,
            reported: AtomicBool::new(false),
            committed: AtomicBool::new(false),
            entry: e,
        });
        if nseg == 0 {
            // Empty file: nothing to ask for.
            return finalize(&d, self.sh);
        }
        self.files.insert(id, d.clone());
        let link = |err: ferry_proto::LinkError| io::Error::other(err.to_string());
        match old_meta {
            Some(meta) if d.basis.is_some() => {
                // Signing the old copy reads all of it: the signer thread
                // does that, so this thread keeps routing data meanwhile.
                let job = SignJob::Sign {
                    d,
                    meta: Box::new(meta),
                    dest: dest.to_path_buf(),
                    inplace,
                };
                self.sign(job)?;
            }
            _ => self
                .tx
                .send(Message::Want {
                    file: id,
                    mode: WantMode::Whole,
                })
                .map_err(link)?,
        }
        Ok(())
    }

    /// Before the first temporary file of this run in a directory, remove
    /// what killed runs left there (the files they were writing are
    /// written again now, so this is where their temporary files are).
    fn clean_stale_temps(&mut self, dest: &Path) {
        let dir = match dest.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        if self.scanned.insert(dir.clone()) {
            let n = fsutil::remove_stale_temps(&dir);
            if n > 0 {
                self.sh.changed(dest);
                self.sh.stats.notice(format!(
                    "{}: removed {n} temporary file(s) of an interrupted run",
                    dir.display()
                ));
            }
        }
    }

    /// Whether to send this changed file as a delta. `--delta`/`--whole-file`
    /// decide; otherwise a local run sends whole files (reading the old copy
    /// costs more than the memory copy it saves, as rsync finds), and across
    /// a link the delta is taken when reading the old copy (skipped when its
    /// signature is cached) takes less time than sending the file whole at
    /// the link rate measured so far.
    fn delta_cost(&self, e: &Entry, m: &fs::Metadata, dest: &Path) -> Option<f64> {
        let opts = self.sh.opts;
        match opts.delta {
            crate::DeltaMode::Delta => return Some(0.0),
            crate::DeltaMode::Whole => return None,
            crate::DeltaMode::Auto if opts.in_process || e.size < MIN_DELTA_SIZE => return None,
            crate::DeltaMode::Auto => {}
        }
        let got = self.received.get() as f64;
        let secs = self.started.elapsed().as_secs_f64();
        let mut rate = if got > (4 << 20) as f64 && secs > 0.2 {
            got / secs
        } else {
            ASSUMED_LINK_RATE
        };
        if let Some(cap) = opts.bwlimit {
            rate = rate.min(cap as f64);
        }
        let whole = e.size as f64 / rate;
        let cached = self.sh.cache.as_ref().is_some_and(|c| {
            c.get(&cache_key(dest, m, layout::delta_block(e.size)))
                .is_some()
        });
        let read = if cached {
            0.0
        } else {
            m.len() as f64 / BASIS_READ_RATE
        };
        Some(read / whole)
    }

    /// Queue work for the signer thread.
    fn sign(&self, job: SignJob) -> io::Result<()> {
        self.signer
            .as_ref()
            .and_then(|s| s.send(job).ok())
            .ok_or_else(|| io::Error::other("signer thread gone"))
    }

    /// Is the regular file at `dest` (same size as the source) unchanged?
    fn unchanged(&self, e: &Entry, dest: &Path, m: &fs::Metadata) -> io::Result<bool> {
        if self.sh.opts.checksum {
            let Some(want) = e.digest else {
                return Ok(e.size == 0);
            };
            let f = File::open(dest)?;
            return Ok(crate::scan::file_digest(&f, e.size, self.sh.opts.threads)? == want);
        }
        Ok(fsutil::mtime_of(m) == (e.mtime, e.mtime_nsec))
    }

    /// Bring an unchanged file's metadata in line with the source.
    fn fix_meta(&self, e: &Entry, dest: &Path, m: &fs::Metadata) -> io::Result<()> {
        if m.mode() & 0o7777 != e.mode & 0o7777 {
            fs::set_permissions(dest, fs::Permissions::from_mode(e.mode & 0o7777))
                .op("set permissions of")?;
        }
        if self.sh.opts.owner && (m.uid() != e.uid || m.gid() != e.gid) {
            fsutil::lchown(dest, e.uid, e.gid).op("set owner of")?;
        }
        if fsutil::mtime_of(m) != (e.mtime, e.mtime_nsec) {
            fsutil::set_mtime_path(dest, e.mtime, e.mtime_nsec).op("set mtime of")?;
        }
        if self.sh.opts.xattrs && !e.xattrs.is_empty() {
            fsutil::write_xattrs(dest, &e.xattrs).op("set xattrs of")?;
        }
        Ok(())
    }

    /// After all data: hard links, deletions, directory metadata.
    fn finish(&mut self) {
        let stats = self.sh.stats;
        let opts = self.sh.opts;
        for e in std::mem::take(&mut self.links) {
            let dest = self.root.join(std::ffi::OsStr::from_bytes(&e.path));
            let Some(target) = self.paths.get(&e.link_to) else {
                stats.error(format!(
                    "{}: hard link to an entry not in the list",
                    dest.display()
                ));
                continue;
            };
            if let (Ok(a), Ok(b)) = (fs::symlink_metadata(&dest), fs::metadata(target)) {
                if a.dev() == b.dev() && a.ino() == b.ino() {
                    continue;
                }
            }
            stats.change(format!(
                "hardlink {} => {}",
                shown(&e.path),
                target.display()
            ));
            if opts.dry_run {
                continue;
            }
            let tmp = fsutil::temp_path_for(&dest);
            let r = fs::hard_link(target, &tmp).and_then(|_| fs::rename(&tmp, &dest));
            match r {
                Ok(()) => {
                    Stats::add(&stats.files_transferred, 1);
                    self.sh.changed(&dest);
                }
                Err(err) => {
                    let _ = fs::remove_file(&tmp);
                    stats.error(line(&dest, &err));
                }
            }
        }
        if opts.delete && self.source_unread && !opts.ignore_errors {
            Stats::add(&stats.delete_skipped, 1);
            stats.error_line(
                "I/O error on the sending side: skipping deletion (--ignore-errors deletes anyway)"
                    .into(),
            );
        } else if opts.delete {
            for (dir, e) in &self.dirs {
                self.delete_extras(dir, &e.path);
            }
        }
        if opts.dry_run {
            return;
        }
        for (dir, e) in self.dirs.iter().rev() {
            let r = (|| -> io::Result<()> {
                if opts.owner {
                    fsutil::lchown(dir, e.uid, e.gid).op("set owner of")?;
                }
                if opts.xattrs && !e.xattrs.is_empty() {
                    fsutil::write_xattrs(dir, &e.xattrs).op("set xattrs of")?;
                }
                fs::set_permissions(dir, fs::Permissions::from_mode(e.mode & 0o7777))
                    .op("set permissions of")?;
                fsutil::set_mtime_path(dir, e.mtime, e.mtime_nsec).op("set mtime of")
            })();
            if let Err(err) = r {
                stats.error(line(dir, &err));
            }
        }
        self.sync_dirs();
    }

    /// fsync every directory whose entries changed (once each, at the end:
    /// a tree of many small files pays one fsync per directory, not per
    /// file), so that what the run reports is on the disk.
    fn sync_dirs(&self) {
        let dirs = self
            .sh
            .dirty
            .lock()
            .map(|mut d| std::mem::take(&mut *d))
            .unwrap_or_default();
        for dir in dirs {
            let r = File::open(&dir)
                .and_then(|d| d.sync_all())
                .op("fsync directory");
            match r {
                // Deleted in this run (--delete): its parent records that.
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => self.sh.stats.error(line(&dir, &err)),
                Ok(()) => {}
            }
        }
    }

    fn delete_extras(&self, dir: &Path, rel: &[u8]) {
        let stats = self.sh.stats;
        let Ok(rd) = fs::read_dir(dir) else { return };
        for c in rd.flatten() {
            let name = c.file_name();
            let mut crel = rel.to_vec();
            if !crel.is_empty() {
                crel.push(b'/');
            }
            crel.extend_from_slice(name.as_bytes());
            if self.seen.contains(&crel) {
                continue;
            }
            let is_dir = c.file_type().map(|t| t.is_dir()).unwrap_or(false);
            if self
                .sh
                .opts
                .excludes
                .excluded(Path::new(std::ffi::OsStr::from_bytes(&crel)), is_dir)
            {
                continue;
            }
            // Every entry removed is listed and counted, contents before
            // their directory, as rsync lists them.
            let mut doomed = Vec::new();
            list_tree(&c.path(), crel, is_dir, &mut doomed);
            for (p, rel, dir) in doomed {
                stats.change(format!(
                    "delete {}{}",
                    shown(&rel),
                    if dir { "/" } else { "" }
                ));
                if self.sh.opts.dry_run {
                    Stats::add(&stats.files_deleted, 1);
                    continue;
                }
                let r = if dir {
                    fs::remove_dir(&p)
                } else {
                    fs::remove_file(&p)
                };
                match r {
                    Ok(()) => {
                        Stats::add(&stats.files_deleted, 1);
                        self.sh.changed(&p);
                    }
                    Err(err) => stats.error(format!("{}: delete: {}", p.display(), describe(&err))),
                }
            }
        }
    }
}

/// The entries of a tree to delete, contents before their directory: each
/// with its path, its path relative to the destination root, and whether it
/// is a directory. Symlinks are entries, never followed.
fn list_tree(p: &Path, rel: Vec<u8>, is_dir: bool, out: &mut Vec<(PathBuf, Vec<u8>, bool)>) {
    if is_dir {
        if let Ok(rd) = fs::read_dir(p) {
            for c in rd.flatten() {
                let mut crel = rel.clone();
                crel.push(b'/');
                crel.extend_from_slice(c.file_name().as_bytes());
                let d = c.file_type().is_ok_and(|t| t.is_dir());
                list_tree(&c.path(), crel, d, out);
            }
        }
    }
    out.push((p.to_path_buf(), rel, is_dir));
}

/// Cache key of the file at `dest` with metadata `m`.
fn cache_key(dest: &Path, m: &fs::Metadata, bs: u64) -> ferry_delta::CacheKey {
    let abs = std::path::absolute(dest).unwrap_or_else(|_| dest.to_path_buf());
    ferry_delta::CacheKey {
        path: abs.into_os_string().into_vec(),
        size: m.len(),
        mtime: m.mtime(),
        mtime_nsec: m.mtime_nsec() as u32,
        inode: m.ino(),
        block_size: bs,
    }
}

/// The writer for a segment's ops (all ops of a segment go to one writer,
/// in order). Buffered writes to one inode serialise on its lock, and two
/// writers spinning on it cost more CPU than they save (measured: sys time
/// 5x on a 1 GiB delta), so such a file has one writer. A file written
/// directly (see [`direct`]) spreads its segments over all writers: its
/// writes take no page-cache locks, and a big delta's copies from the old
/// copy (one `pread` of cached pages per block run) then run in parallel.
fn worker_for(f: &DstFile, seg: u64, n: usize) -> usize {
    let file = f.entry.id as u64;
    let key = if f.direct.is_some() {
        file.wrapping_mul(0x9E37_79B9) ^ seg.wrapping_mul(0x85EB_CA6B)
    } else {
        file.wrapping_mul(0x9E37_79B9)
    };
    (key % n as u64) as usize
}

fn send_op(w: &Sender<(Arc<DstFile>, Op)>, f: Arc<DstFile>, op: Op) -> Result<()> {
    w.send((f, op))
        .map_err(|_| Error::Protocol("writer worker stopped".into()))
}

struct SegState {
    hasher: SegmentHasher,
    next: u64,
    sig: Option<SigBuild>,
    /// The segment assembled for one direct write (see [`direct`]).
    buf: Option<direct::SegBuf>,
}

impl SegState {
    /// Put `data`, the bytes at file offset `off`, into the segment's
    /// assembly buffer (direct writes) or into the file. Returns the bytes
    /// written to the file now.
    fn put(&mut self, f: &DstFile, off: u64, data: &[u8]) -> io::Result<u64> {
        match &mut self.buf {
            Some(b) => {
                let rel = (off % layout::SEGMENT) as usize;
                let slot = b
                    .data_mut(rel, data.len())
                    .ok_or_else(|| io::Error::other("data beyond its segment"))?;
                slot.copy_from_slice(data);
                Ok(0)
            }
            None => f.file.write_all_at(data, off).map(|()| data.len() as u64),
        }
    }

    /// Read `len` bytes of the old copy at `boff` into the file at `off`,
    /// through the assembly buffer when there is one. Returns the bytes
    /// written to the file now.
    fn put_from(
        &mut self,
        f: &DstFile,
        basis: &direct::Reader,
        boff: u64,
        off: u64,
        len: u64,
    ) -> io::Result<u64> {
        match &mut self.buf {
            Some(b) => {
                let rel = (off % layout::SEGMENT) as usize;
                let slot = b
                    .data_mut(rel, len as usize)
                    .ok_or_else(|| io::Error::other("copy beyond its segment"))?;
                basis.read_exact_at(slot, boff)?;
                Ok(0)
            }
            None => copy_range(basis, f, boff, off, len).map(|()| len),
        }
    }
}

/// Write a complete segment's assembly buffer, if any, and return it to
/// the pool. A filesystem that refuses direct writes gets the segment (and
/// the rest of the file) through the page cache.
fn flush_segment(
    f: &DstFile,
    st: &mut SegState,
    seg_start: u64,
    pool: &mut direct::Pool,
) -> io::Result<u64> {
    let Some(mut b) = st.buf.take() else {
        return Ok(0);
    };
    let (Some(direct), Some(file)) = (&f.direct, f.file.as_file()) else {
        return Err(io::Error::other("direct write without a file"));
    };
    let size = f.entry.size;
    let res = match b.flush(direct, file, seg_start, size) {
        Err(e) if direct::unsupported(&e) => {
            f.direct_ok.store(false, Ordering::Relaxed);
            b.flush(file, file, seg_start, size)
        }
        r => r,
    };
    pool.give(b);
    res
}

/// Segments one writer may have open at once. A sender has one segment
/// per worker in flight (and a few sent early), so more is a peer driving
/// this side's memory: a protocol error.
const MAX_OPEN_SEGMENTS: usize = 1024;

/// Segment assembly buffers (8 MiB each) all writers together may hold; a
/// segment opened beyond that is written through the page cache instead.
const MAX_SEGMENT_BUFFERS: usize = 16;

/// The state of the segment `off` falls in, opened on its first op; `None`
/// (and the run stopped) when the peer opens too many.
fn seg_state<'m>(
    segs: &'m mut HashMap<(u32, u64), SegState>,
    pool: &mut direct::Pool,
    f: &DstFile,
    off: u64,
    sh: &Shared<'_>,
) -> Option<&'m mut SegState> {
    let seg = off / layout::SEGMENT;
    let key = (f.entry.id, seg);
    if !segs.contains_key(&key) {
        if segs.len() >= MAX_OPEN_SEGMENTS {
            sh.set_fatal(Error::Protocol(format!(
                "the sender opened more than {MAX_OPEN_SEGMENTS} segments at once"
            )));
            return None;
        }
        let bufs = segs.values().filter(|s| s.buf.is_some()).count();
        let share = (MAX_SEGMENT_BUFFERS / sh.opts.threads.max(1)).max(1);
        let buffered = f.direct_ok.load(Ordering::Relaxed) && bufs < share;
        segs.insert(key, new_seg_state(pool, f, seg, buffered));
    }
    segs.get_mut(&key)
}

fn new_seg_state(pool: &mut direct::Pool, f: &DstFile, seg: u64, buffered: bool) -> SegState {
    SegState {
        buf: buffered.then(|| {
            let (start, end) = layout::segment_range(f.entry.size, seg);
            pool.take((end - start) as usize)
        }),
        hasher: if f.verify {
            SegmentHasher::new(f.block.load(Ordering::SeqCst))
        } else {
            SegmentHasher::disabled()
        },
        next: seg * layout::SEGMENT,
        sig: f.sig_out.as_ref().map(|s| SigBuild {
            bs: s.bs as usize,
            cur: Vec::new(),
            weak: Vec::new(),
            full: Vec::new(),
        }),
    }
}

fn writer(rx: Receiver<(Arc<DstFile>, Op)>, sh: &Shared<'_>) {
    let mut segs: HashMap<(u32, u64), SegState> = HashMap::new();
    let mut pool = direct::Pool::default();
    let mut scratch = Vec::new();
    for (f, op) in rx {
        if sh.fatal_flag.load(Ordering::Relaxed) {
            continue;
        }
        let id = f.entry.id;
        match op {
            Op::Data(off, data) => {
                let Some(st) = seg_state(&mut segs, &mut pool, &f, off, sh) else {
                    continue;
                };
                if !in_order(&f, st, off, data.len() as u64) {
                    continue;
                }
                if f.failure().is_none() {
                    match st.put(&f, off, &data) {
                        Ok(n) => Stats::add(&sh.stats.bytes_written, n),
                        Err(e) => write_failed(&f, sh, e),
                    }
                }
                Stats::add(&sh.stats.bytes_done, data.len() as u64);
                st.hasher.data(&data);
                if let Some(b) = &mut st.sig {
                    b.feed(&data);
                }
                ferry_proto::bufpool::give(data);
            }
            Op::Copy(off, boff, len) => {
                let Some(st) = seg_state(&mut segs, &mut pool, &f, off, sh) else {
                    continue;
                };
                if !in_order(&f, st, off, len) {
                    continue;
                }
                copy_from_basis(&f, st, sh, off, boff, len, &mut scratch);
            }
            Op::Zero(off, len) => {
                let Some(st) = seg_state(&mut segs, &mut pool, &f, off, sh) else {
                    continue;
                };
                if !in_order(&f, st, off, len) {
                    continue;
                }
                if f.tmp.is_none() && f.failure().is_none() {
                    // In place: the old bytes must become zeros (a hole
                    // where the filesystem allows).
                    if let Err(e) = f.file.zero_range(off, len) {
                        write_failed(&f, sh, e);
                    }
                }
                Stats::add(&sh.stats.bytes_done, len);
                st.hasher.zeros(len);
                if let Some(b) = &mut st.sig {
                    b.zeros(len);
                }
            }
            Op::Done(seg, digest) => {
                let seg = seg as u64;
                let (start, end) = layout::segment_range(f.entry.size, seg);
                let st = segs.remove(&(id, seg));
                if f.failure().is_none() {
                    match st {
                        Some(mut st) if st.next == end => {
                            match flush_segment(&f, &mut st, start, &mut pool) {
                                Ok(n) => Stats::add(&sh.stats.bytes_written, n),
                                Err(e) => write_failed(&f, sh, e),
                            }
                            if let (Some(mut b), Some(out)) = (st.sig.take(), &f.sig_out) {
                                b.flush();
                                if let Ok(mut p) = out.parts.lock() {
                                    p[seg as usize] = Some((b.weak, b.full));
                                }
                            }
                            if st.hasher.finish().0 != digest {
                                f.fail_with(Failure::Mismatch(format!(
                                    "verification failed: bytes {start}..{end} differ from the source"
                                )));
                            }
                        }
                        _ => f.fail(format!("incomplete data for bytes {start}..{end}")),
                    }
                }
                if f.remaining.fetch_sub(1, Ordering::SeqCst) == 1 {
                    if let Err(e) = finalize(&f, sh) {
                        if is_fatal_io(&e) {
                            sh.set_fatal(Error::io(&f.final_path, e));
                        } else {
                            sh.stats.error(line(&f.final_path, &e));
                        }
                    }
                }
            }
        }
    }
}

/// Apply a `Copy` op: the old copy's bytes at `boff` become the new file's
/// at `off`. In place at the same offset nothing is written; the bytes are
/// still read, because the segment digest covers them.
fn copy_from_basis(
    f: &DstFile,
    st: &mut SegState,
    sh: &Shared<'_>,
    off: u64,
    boff: u64,
    len: u64,
    scratch: &mut Vec<u8>,
) {
    let Some(basis) = &f.basis else {
        f.fail("protocol error: copy op for a file sent whole".into());
        return;
    };
    let same_place = f.tmp.is_none() && boff == off;
    let mut done = 0u64;
    while done < len {
        // Whole unchanged blocks on both grids: their hashes are known from
        // the signature, so they are not read; in place they are not even
        // touched, into a temp file they move in the kernel.
        let run = known_run(f, st, off + done, boff + done, len - done);
        if run > 0 {
            let bs = f.block.load(Ordering::SeqCst);
            if !same_place && f.failure().is_none() {
                match st.put_from(f, basis, boff + done, off + done, run * bs) {
                    Ok(n) => Stats::add(&sh.stats.bytes_written, n),
                    Err(e) => write_failed(f, sh, e),
                }
            }
            if let Ok(bb) = f.basis_blocks.read() {
                let j0 = ((boff + done) / bs) as usize;
                for j in j0..j0 + run as usize {
                    st.hasher.known_block(bb.full[j]);
                    if let Some(b) = &mut st.sig {
                        b.known(bb.weak[j], bb.full[j]);
                    }
                }
            }
            done += run * bs;
            continue;
        }
        let n = (len - done).min(1 << 20) as usize;
        scratch.resize(n, 0);
        if let Err(e) = basis.read_exact_at(scratch, boff + done) {
            f.fail_with(Failure::Io("read old copy of", describe(&e)));
            return;
        }
        if !same_place && f.failure().is_none() {
            match st.put(f, off + done, scratch) {
                Ok(n) => Stats::add(&sh.stats.bytes_written, n),
                Err(e) => write_failed(f, sh, e),
            }
        }
        st.hasher.data(scratch);
        if let Some(b) = &mut st.sig {
            b.feed(scratch);
        }
        done += n as u64;
    }
    Stats::add(&sh.stats.bytes_matched, len);
    Stats::add(&sh.stats.bytes_done, len);
}

/// How many whole delta blocks starting at new offset `off` / old offset
/// `boff` (at most `len` bytes) can be taken on the old copy's hashes.
fn known_run(f: &DstFile, st: &SegState, off: u64, boff: u64, len: u64) -> u64 {
    let Ok(bb) = f.basis_blocks.read() else {
        return 0;
    };
    let bs = f.block.load(Ordering::SeqCst);
    let sig_aligned = st.sig.as_ref().is_none_or(|s| s.cur.is_empty());
    if !f.verify
        || !st.hasher.at_block_start()
        || !sig_aligned
        || !off.is_multiple_of(bs)
        || !boff.is_multiple_of(bs)
    {
        return 0;
    }
    // Blocks must be whole in the new file's segment and in the old copy.
    let seg_end = (off / layout::SEGMENT + 1) * layout::SEGMENT;
    let limit = len
        .min(seg_end - off)
        .min(bb.size.saturating_sub(boff))
        .min(f.entry.size - off);
    let n = limit / bs;
    let first = (boff / bs) as usize;
    n.min((bb.full.len().saturating_sub(first)) as u64)
}

/// Work for the signer thread, in the order the dispatcher queued it.
enum SignJob {
    /// Sign the old copy of `d`, then ask for the file as a delta.
    Sign {
        d: Arc<DstFile>,
        meta: Box<fs::Metadata>,
        dest: PathBuf,
        inplace: bool,
    },
    /// The sender's list is complete: answer `EndOfList`, after every
    /// `Want` queued before it.
    EndOfList,
}

/// The share of a delta file that deltas have saved so far in this run
/// (bytes copied from old copies over bytes of committed deltas); a delta
/// pays when reading the old copy costs less than that share of sending
/// the file whole. Until 4 deltas or 8 MiB of them are done: one half. Files
/// rewritten through and through save nothing, so after a few of them the
/// rest go whole (30% of a 1 GiB tree rewritten: 2.97-3.10 s as deltas,
/// 2.27-2.71 s whole, side by side).
fn delta_saving(sh: &Shared<'_>) -> f64 {
    let done = sh.delta_done.load(Ordering::Relaxed) as f64;
    if done < (8 << 20) as f64 && sh.stats.files_delta.load(Ordering::Relaxed) < 4 {
        return 0.5;
    }
    (sh.stats.bytes_matched.load(Ordering::Relaxed) as f64 / done).min(1.0)
}

/// Signs old copies and asks for deltas, off the dispatcher's thread.
fn signer(jobs: Receiver<SignJob>, sh: &Shared<'_>, tx: MsgTx) {
    for job in jobs {
        match job {
            SignJob::EndOfList => {
                if tx.send(Message::EndOfList).is_err() {
                    return;
                }
            }
            SignJob::Sign {
                d,
                meta,
                dest,
                inplace,
            } => {
                if let Err(err) = sign_and_want(sh, &tx, &d, &meta, &dest, inplace) {
                    d.fail(describe(&err));
                    d.reported.store(true, Ordering::SeqCst);
                    let _ = sh.in_flight.wake.try_send(());
                    if is_fatal_io(&err) {
                        sh.set_fatal(Error::io(&dest, err));
                    } else {
                        sh.stats.error(line(&dest, &err));
                    }
                }
            }
        }
    }
}

fn sign_and_want(
    sh: &Shared<'_>,
    tx: &MsgTx,
    d: &DstFile,
    meta: &fs::Metadata,
    dest: &Path,
    inplace: bool,
) -> io::Result<()> {
    let Some(basis) = &d.basis else {
        return Err(io::Error::other("delta without an old copy"));
    };
    let size = d.entry.size;
    let id = d.entry.id;
    if d.delta_cost > 0.0 && d.delta_cost >= delta_saving(sh) {
        // Deltas finished since this one was chosen say it will not pay:
        // ask for the file whole (on the whole-file digest grid).
        d.block.store(layout::grid_block(size), Ordering::SeqCst);
        d.delta.store(false, Ordering::SeqCst);
        return tx
            .send(Message::Want {
                file: id,
                mode: WantMode::Whole,
            })
            .map_err(|err| io::Error::other(err.to_string()));
    }
    let mode = if inplace {
        WantMode::DeltaInPlace
    } else {
        WantMode::Delta
    };
    // Ask before signing: the sender reads its copy into memory while this
    // side reads the old one, so the two reads overlap. A signature that
    // then fails leaves the sender waiting for nothing it must finish.
    tx.send(Message::Want { file: id, mode })
        .map_err(|err| io::Error::other(err.to_string()))?;
    let bs = layout::delta_block(size);
    let basis_size = meta.len();
    if let Ok(mut bb) = d.basis_blocks.write() {
        bb.size = basis_size;
    }
    let key = cache_key(dest, meta, bs);
    if let Some((sig, full)) = sh.cache.as_ref().and_then(|c| c.get(&key)) {
        if let Ok(mut bb) = d.basis_blocks.write() {
            bb.weak = sig.weak.clone();
            bb.full = full;
        }
        return send_signature(tx, id, &sig, basis_size, bs);
    }
    // Signed in file order and sent as it goes: the sender copies the
    // blocks that did not move while the rest is still being read here,
    // and this side applies those copies from the page cache just filled.
    let sent = std::cell::Cell::new(0u64);
    let n = ferry_delta::Signature::block_count(basis_size, bs);
    ferry_delta::sign_file_in_order(
        basis,
        basis_size,
        bs,
        sh.opts.threads,
        |first, weak, full| {
            if let Ok(mut bb) = d.basis_blocks.write() {
                bb.weak.extend_from_slice(weak);
                bb.full.extend_from_slice(full);
            }
            let end = first + weak.len() as u64;
            sent.set(end);
            tx.send(Message::Signature {
                file: id,
                block_size: bs as u32,
                basis_size,
                first_block: first,
                weak: weak.to_vec(),
                strong: full.iter().map(ferry_delta::sig::short).collect(),
                last: end == n,
            })
            .map_err(|err| io::Error::other(err.to_string()))
        },
    )?;
    if sent.get() == 0 {
        // An empty old copy: one empty, last part.
        let sig = ferry_delta::Signature::receiving(bs, basis_size);
        send_signature(tx, id, &sig, basis_size, bs)?;
    }
    if let (Some(c), Ok(bb)) = (&sh.cache, d.basis_blocks.read()) {
        // A cache that cannot be written only costs a re-read.
        let sig = ferry_delta::Signature::from_parts(bs, basis_size, bb.weak.clone(), &bb.full);
        let _ = c.put(&key, &sig, &bb.full);
    }
    Ok(())
}

/// Send a signature in parts.
fn send_signature(
    tx: &MsgTx,
    id: u32,
    sig: &ferry_delta::Signature,
    basis_size: u64,
    bs: u64,
) -> io::Result<()> {
    const PART: usize = 8192;
    let n = sig.weak.len();
    let mut first = 0usize;
    loop {
        let end = (first + PART).min(n);
        tx.send(Message::Signature {
            file: id,
            block_size: bs as u32,
            basis_size,
            first_block: first as u64,
            weak: sig.weak[first..end].to_vec(),
            strong: sig.strong[first..end].to_vec(),
            last: end == n,
        })
        .map_err(|err| io::Error::other(err.to_string()))?;
        if end == n {
            return Ok(());
        }
        first = end;
    }
}

/// Copy `len` bytes from the old copy into the file being written, through
/// a reused 1 MiB buffer. Not `copy_file_range`: without reflinks (ext4)
/// the kernel splices page by page, and measured here it took 2.6 s per GiB
/// in 1 MiB calls against 0.22 s for `pread` + `pwrite`.
fn copy_range(basis: &direct::Reader, f: &DstFile, from: u64, to: u64, len: u64) -> io::Result<()> {
    thread_local! {
        static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let Some(out) = f.file.as_file() else {
        return Err(io::Error::other("copy into a non-file target"));
    };
    BUF.with(|b| {
        let mut buf = b.borrow_mut();
        let (mut from, mut to, mut left) = (from, to, len);
        while left > 0 {
            let n = left.min(COPY_BUF) as usize;
            if buf.len() < n {
                buf.resize(n, 0);
            }
            basis.read_exact_at(&mut buf[..n], from)?;
            out.write_all_at(&buf[..n], to)?;
            from += n as u64;
            to += n as u64;
            left -= n as u64;
        }
        Ok(())
    })
}

/// Buffer of [`copy_range`].
const COPY_BUF: u64 = 1 << 20;

fn in_order(f: &DstFile, st: &mut SegState, off: u64, len: u64) -> bool {
    if off != st.next || off + len > f.entry.size {
        f.fail(format!("protocol error: data out of order at offset {off}"));
        return false;
    }
    st.next = off + len;
    true
}

fn write_failed(f: &DstFile, sh: &Shared<'_>, e: io::Error) {
    let e = crate::error::with_op("write", e);
    f.fail_with(Failure::Io(
        crate::error::op_of(&e).unwrap_or("write"),
        describe(&e),
    ));
    if is_fatal_io(&e) {
        sh.set_fatal(Error::io(&f.final_path, e));
    }
}

/// Give a completely received file its metadata and move it into place, or
/// drop it (the temp file goes with it) when anything failed.
/// The error line of a failed file (its path, and what failed).
fn failure_line(f: &DstFile, why: Failure) -> String {
    match why {
        Failure::Mismatch(why) | Failure::Other(why) => {
            format!("{}: {why}", f.final_path.display())
        }
        Failure::Sender(why) => why,
        Failure::Io(op, why) => format!("{op} {}: {why}", f.final_path.display()),
    }
}

/// Count a failed file once, with its line.
fn report_failure(f: &DstFile, sh: &Shared<'_>, why: Failure) {
    if !f.reported.swap(true, Ordering::SeqCst) {
        sh.stats.error(failure_line(f, why));
    }
}

fn finalize(f: &DstFile, sh: &Shared<'_>) -> io::Result<()> {
    if let Some(why) = f.failure() {
        if matches!(why, Failure::Mismatch(_)) && f.delta.load(Ordering::SeqCst) {
            // The delta did not reproduce the source: send it whole.
            Stats::add(&sh.stats.delta_mismatch, 1);
            sh.stats.change(format!(
                "{}: delta result failed verification; sending it whole",
                f.final_path.display()
            ));
            return Ok(());
        }
        report_failure(f, sh, why);
        return Ok(());
    }
    let e = &f.entry;
    if let (true, Some(file)) = (f.stream_to, f.file.as_file()) {
        write_in_order(file, e.size, &f.final_path)?;
    } else if let (false, Some(file)) = (f.is_device, f.file.as_file()) {
        if f.tmp.is_none() {
            file.set_len(e.size)?;
        }
        if sh.opts.owner {
            fsutil::fchown(file, e.uid, e.gid).op("set owner of")?;
        }
        fsutil::fchmod(file, e.mode).op("set permissions of")?;
        if sh.opts.xattrs && !e.xattrs.is_empty() {
            fsutil::fwrite_xattrs(file, &e.xattrs).op("set xattrs of")?;
        }
        fsutil::set_mtime_fd(file, e.mtime, e.mtime_nsec).op("set mtime of")?;
        if sh.opts.fsync {
            // The data reaches the disk before the name does: after a crash
            // the file is the old one or the new one, never a torn one.
            file.sync_data().op("fsync")?;
        }
    } else {
        f.file.sync_data().op("fsync")?;
    }
    if let Some(t) = &f.tmp {
        fs::rename(t, &f.final_path).op("rename into place")?;
        sh.changed(&f.final_path);
        fsutil::unregister_temp(t);
    }
    f.committed.store(true, Ordering::SeqCst);
    Stats::add(&sh.stats.files_transferred, 1);
    if f.delta.load(Ordering::SeqCst) {
        Stats::add(&sh.stats.files_delta, 1);
        sh.delta_done.fetch_add(e.size, Ordering::Relaxed);
    }
    if let Some(out) = &f.sig_out {
        store_signature(f, out);
    }
    Ok(())
}

/// Write the `size` bytes assembled in `tmp` to the character device or
/// FIFO at `dest`, in order. It is opened only now, after the data has
/// arrived and been verified (a FIFO's open waits for a reader), without
/// `O_CREAT`: if it has gone, nothing is created in its place.
fn write_in_order(tmp: &File, size: u64, dest: &Path) -> io::Result<()> {
    use std::io::{Read, Seek, Write};
    let mut out = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(dest)
        .op("open for writing")?;
    let mut src = tmp;
    src.seek(io::SeekFrom::Start(0)).op("read back")?;
    let mut buf = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        let n = (left as usize).min(buf.len());
        src.read_exact(&mut buf[..n]).op("read back")?;
        out.write_all(&buf[..n]).op("write")?;
        left -= n as u64;
    }
    out.flush().op("write")
}

/// Put the signature of what was just written into the cache, keyed by the
/// file's final metadata.
fn store_signature(f: &DstFile, out: &SigOut) {
    let Ok(parts) = out.parts.lock() else { return };
    let mut weak = Vec::new();
    let mut full = Vec::new();
    for p in parts.iter() {
        let Some((w, h)) = p else { return };
        weak.extend_from_slice(w);
        full.extend_from_slice(h);
    }
    let Some(Ok(m)) = f.file.as_file().map(|x| x.metadata()) else {
        return;
    };
    let sig = ferry_delta::Signature::from_parts(out.bs, f.entry.size, weak, &full);
    let _ = out
        .cache
        .put(&cache_key(&f.final_path, &m, out.bs), &sig, &full);
}
