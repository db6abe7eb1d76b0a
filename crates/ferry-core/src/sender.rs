//! The sending side: walks the sources, streams the file list, and answers
//! the receiver's requests with data, zero and copy ops, read by segments in
//! parallel.
//!
//! Threads: the caller's thread walks and sends entries; one thread reads
//! requests from the receiver and queues segment jobs; `threads` workers
//! read segments and send their ops. Every segment ends with a
//! `SegmentDone` carrying its digest; a file whose source changed or could
//! not be read gets a `FileFailed` before its last `SegmentDone`.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_channel::{unbounded, Receiver};
use ferry_proto::{
    layout, Endpoint, Entry, EntryKind, LinkError, Message, MsgTx, ReceiverReport, WantMode,
};

use crate::early::{EarlySeg, PreHash};
use crate::error::{describe, Error, Result};
use crate::fsutil;
use crate::plan::SourceSpec;
use crate::scan::{self, Piece, ScanError};
use crate::source::ExtentReader;
use crate::stats::Stats;
use crate::SyncOptions;

/// A file the receiver may ask for.
struct SrcFile {
    path: PathBuf,
    size: u64,
    mtime: (i64, u32),
    open: Mutex<Option<Arc<dyn ExtentReader>>>,
    /// Opened at walk time and kept (NBD exports), not reopened per use.
    kept_open: bool,
    remaining: AtomicU64,
    failed: AtomicBool,
    /// Block hashes on the delta grid, computed while the receiver signs
    /// its old copy, and the segments sent early (see [`crate::early`]).
    prehash: PreHash,
    /// Device and inode seen by the walk: the file opened later must be
    /// this one.
    ident: (u64, u64),
    /// A top-level source named through a symlink the user chose (a
    /// trailing slash): followed. Everything else is opened `O_NOFOLLOW`.
    follow: bool,
}

/// Open a listed file for reading: without following a symlink (unless
/// the user named it), and only if it is still the file the walk saw, so a
/// file swapped for a symlink or another file after the walk is never sent
/// in its place.
fn open_listed(path: &Path, ident: (u64, u64), follow: bool) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut o = std::fs::OpenOptions::new();
    o.read(true);
    if !follow {
        o.custom_flags(libc::O_NOFOLLOW);
    }
    let changed = || {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "vanished or replaced since it was listed",
        )
    };
    let h = o.open(path).map_err(|e| match e.raw_os_error() {
        Some(libc::ELOOP) => changed(),
        _ => e,
    })?;
    let m = h.metadata()?;
    if (m.dev(), m.ino()) != ident {
        return Err(changed());
    }
    Ok(h)
}

/// Delta sources smaller than this are not pre-hashed.
const PREHASH_MIN: u64 = 4 << 20;

/// Hash the delta sources sent by the request thread on the delta grid,
/// reading around the page cache (they are read again only where they
/// changed), as far as [`PreHash::go_on`] lets them; `over` ends waits
/// when the session ends.
fn prehash(files: Receiver<Arc<SrcFile>>, direct_io: bool, over: &AtomicBool) {
    let mut mems = vec![Vec::new(), Vec::new()];
    for f in files {
        let r = prehash_file(&f, direct_io, &mut mems, over);
        f.prehash.finish(r.is_ok());
    }
}

/// One file's pre-hash: a reader thread reads the next segment while this
/// one hashes the last (measured with strace on the 1 GiB mangled file:
/// reading and hashing one after the other made the pre-hash, not the
/// signing or the link, what early segments waited for).
fn prehash_file(
    f: &SrcFile,
    direct_io: bool,
    mems: &mut Vec<Vec<u8>>,
    over: &AtomicBool,
) -> std::io::Result<()> {
    let r = crate::direct::Reader::new(open_listed(&f.path, f.ident, f.follow)?, direct_io);
    let bs = layout::delta_block(f.size);
    let (full_tx, full_rx) = crossbeam_channel::bounded::<std::io::Result<(Vec<u8>, usize)>>(1);
    let (empty_tx, empty_rx) = crossbeam_channel::unbounded::<Vec<u8>>();
    for m in mems.drain(..) {
        let _ = empty_tx.send(m);
    }
    let (r, empty_rx) = (&r, &empty_rx);
    std::thread::scope(|s| {
        // `move`: the reader owns `full_tx`, so the loop below ends when the
        // reader does.
        s.spawn(move || {
            for seg in 0..layout::segment_count(f.size) {
                if !f.prehash.go_on(over) {
                    break;
                }
                let (start, end) = layout::segment_range(f.size, seg);
                let len = (end - start) as usize;
                let mut mem = empty_rx.recv().unwrap_or_default();
                let read = r.read_exact_at(crate::direct::aligned(&mut mem, len), start);
                let failed = read.is_err();
                if full_tx.send(read.map(|()| (mem, len))).is_err() || failed {
                    break;
                }
            }
        });
        let mut res = Ok(());
        for got in &full_rx {
            match got {
                Ok((mut mem, len)) => {
                    f.prehash.push(
                        crate::direct::aligned(&mut mem, len)
                            .chunks(bs as usize)
                            .map(layout::block_hash),
                    );
                    let _ = empty_tx.send(mem);
                }
                Err(e) => res = Err(e),
            }
        }
        res
    })?;
    mems.extend(empty_rx.try_iter());
    Ok(())
}

/// Sets its flag when dropped: however the request thread ends.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

type Table = Arc<Mutex<HashMap<u32, Arc<SrcFile>>>>;

struct Job {
    id: u32,
    file: Arc<SrcFile>,
    seg: u64,
    delta: Option<Arc<DeltaJob>>,
    /// A delta segment sent before the signature is complete.
    early: Option<Box<EarlySeg>>,
}

/// A file the receiver asked for as a delta, until its signature is whole.
struct Pending {
    file: Arc<SrcFile>,
    sig: Option<ferry_delta::Signature>,
    inplace: bool,
}

/// A file to send as a delta against the receiver's signature.
struct DeltaJob {
    matcher: ferry_delta::Matcher,
    /// The receiver writes in place: copies must keep their offset.
    inplace: bool,
}

/// Largest signature accepted from a receiver, in blocks (24 bytes each).
const MAX_SIGNATURE_BLOCKS: u64 = 1 << 22;

/// Run the sending side of a session over `ep` until the receiver reports.
/// With `progress`, the sender counts what it was asked for and has sent
/// into `stats` (when the receiver is remote, nobody else does).
pub fn run_sender(
    ep: Endpoint,
    sources: &[SourceSpec],
    opts: &SyncOptions,
    stats: &Stats,
    progress: bool,
) -> Result<ReceiverReport> {
    let progress = progress.then_some(stats);
    let Endpoint { tx, rx, .. } = ep;
    crate::hello(&tx, &rx)?;
    // From here on a silent peer is a dead one (not during an ssh login).
    rx.set_idle_timeout(opts.timeout);

    let table: Table = Arc::default();
    let (job_tx, job_rx) = unbounded::<Job>();
    let over = AtomicBool::new(false);
    // Reading is often I/O-bound (cold cache, small files): more readers
    // than cores keep the device busy.
    let threads = opts.threads.max(1) * 2;

    std::thread::scope(|s| {
        // Workers.
        let mut workers = Vec::new();
        for _ in 0..threads {
            let job_rx = job_rx.clone();
            let tx = tx.clone();
            let how = ReadHow {
                hash: !opts.in_process || opts.verify,
                direct_io: opts.direct_io,
            };
            workers.push(s.spawn(move || worker(job_rx, tx, progress, how)));
        }
        drop(job_rx);

        // Requests from the receiver.
        let (prehash_tx, prehash_rx) = unbounded::<Arc<SrcFile>>();
        let direct_io = opts.direct_io;
        let over = &over;
        s.spawn(move || prehash(prehash_rx, direct_io, over));
        let req_table = table.clone();
        let req_tx = tx.clone();
        let requests = s.spawn(move || -> Result<ReceiverReport> {
            let _over = SetOnDrop(over);
            let mut job_tx = Some(job_tx);
            let mut workers = Some(workers);
            let mut pending: HashMap<u32, Pending> = HashMap::new();
            // What each file was asked for: a peer may not make this side
            // queue the same file again and again.
            let mut wanted: HashMap<u32, WantMode> = HashMap::new();
            loop {
                match rx.recv()? {
                    Message::Want { file, mode } => {
                        let f = req_table.lock().ok().and_then(|t| t.get(&file).cloned());
                        let Some(f) = f else {
                            return Err(Error::Protocol(format!("receiver asked for unknown file {file}")));
                        };
                        // A delta may be turned into a whole file once (the
                        // receiver found the delta no longer pays); nothing else
                        // is asked twice.
                        match wanted.insert(file, mode) {
                            None => {}
                            Some(prev) if prev != WantMode::Whole && mode == WantMode::Whole => {}
                            Some(_) => {
                                return Err(Error::Protocol(format!(
                                    "receiver asked for file {file} again"
                                )))
                            }
                        }
                        if let Some(st) = progress {
                            Stats::add(&st.bytes_transferred, f.size);
                        }
                        f.remaining.store(layout::segment_count(f.size), Ordering::SeqCst);
                        if mode == WantMode::Whole {
                            enqueue(job_tx.as_ref(), file, &f, None, &[])?;
                        } else {
                            // The receiver signs one file at a time: a
                            // signature still open now never completes
                            // (it could not read that old copy).
                            for p in pending.values() {
                                p.file.prehash.abandon();
                            }
                            pending.insert(
                                file,
                                Pending {
                                    file: f.clone(),
                                    sig: None,
                                    inplace: mode == WantMode::DeltaInPlace,
                                },
                            );
                            let bs = layout::delta_block(f.size);
                            if let Some(jobs) = job_tx.as_ref().filter(|_| {
                                !f.kept_open && f.size >= PREHASH_MIN && layout::SEGMENT.is_multiple_of(bs)
                            }) {
                                f.prehash.start(f.size, bs, early_sink(jobs.clone(), file, &f));
                                if prehash_tx.send(f.clone()).is_err() {
                                    f.prehash.finish(false);
                                }
                            }
                        }
                    }
                    Message::Signature {
                        file,
                        block_size,
                        basis_size,
                        first_block,
                        weak,
                        strong,
                        last,
                    } => {
                        let Some(Pending { file: f, sig, inplace }) = pending.get_mut(&file) else {
                            return Err(Error::Protocol(format!("signature for file {file}, which is not awaiting one")));
                        };
                        let bs = block_size as u64;
                        if sig.is_none() {
                            if bs != layout::delta_block(f.size)
                                || ferry_delta::Signature::block_count(basis_size, bs) > MAX_SIGNATURE_BLOCKS
                            {
                                return Err(Error::Protocol(format!(
                                    "unacceptable signature for file {file}: block size {bs}, basis {basis_size} bytes"
                                )));
                            }
                            *sig = Some(ferry_delta::Signature::receiving(bs, basis_size));
                        }
                        let inplace = *inplace;
                        if let Some(sg) = sig.as_mut() {
                            sg.extend_part(first_block, &weak, &strong)
                                .map_err(|e| Error::Protocol(format!("signature for file {file}: {e}")))?;
                            f.prehash.offer(sg.basis_size, &strong);
                        }
                        if last {
                            let Some(Pending { file: f, sig, .. }) = pending.remove(&file) else {
                                continue;
                            };
                            let early = f.prehash.close();
                            let Some(sg) = sig.filter(|s| s.is_consistent()) else {
                                return Err(Error::Protocol(format!("incomplete signature for file {file}")));
                            };
                            let job = DeltaJob {
                                matcher: ferry_delta::Matcher::new(&sg),
                                inplace,
                            };
                            enqueue(job_tx.as_ref(), file, &f, Some(Arc::new(job)), &early)?;
                        }
                    }
                    Message::EndOfList => {
                        // No more requests: let the workers drain, then say so.
                        // Signatures that never completed (the receiver could
                        // not read its old copy) send nothing more early.
                        for p in pending.values() {
                            p.file.prehash.abandon();
                        }
                        job_tx = None;
                        if let Some(ws) = workers.take() {
                            for w in ws {
                                w.join().map_err(|_| {
                                    Error::Protocol("sender worker panicked".into())
                                })??;
                            }
                        }
                        req_tx.send(Message::SenderDone)?;
                    }
                    Message::ReceiverDone(r) => return Ok(*r),
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
        });

        let walked = walk_all(sources, opts, stats, &tx, &table);
        if let Err(e) = &walked {
            let _ = tx.send(crate::error::fatal(e));
        }
        drop(tx);
        let res = requests
            .join()
            .map_err(|_| Error::Protocol("sender request thread panicked".into()))?;
        walked?;
        res
    })
}

/// Queue the segments of file `id`, but those in `skip` (sent early).
/// `remaining` is set when the file is asked for.
fn enqueue(
    jobs: Option<&crossbeam_channel::Sender<Job>>,
    id: u32,
    f: &Arc<SrcFile>,
    delta: Option<Arc<DeltaJob>>,
    skip: &[bool],
) -> Result<()> {
    let Some(jobs) = jobs else {
        return Err(Error::Protocol("request after the end of requests".into()));
    };
    for seg in 0..layout::segment_count(f.size) {
        if skip.get(seg as usize).copied().unwrap_or(false) {
            continue;
        }
        let _ = jobs.send(Job {
            id,
            file: f.clone(),
            seg,
            delta: delta.clone(),
            early: None,
        });
    }
    Ok(())
}

/// Where the pre-hash sends segments that go early: to the workers.
fn early_sink(
    jobs: crossbeam_channel::Sender<Job>,
    id: u32,
    f: &Arc<SrcFile>,
) -> Box<dyn Fn(EarlySeg) + Send> {
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
            });
        }
    })
}

/// How a worker reads and digests segments.
#[derive(Clone, Copy)]
struct ReadHow {
    /// Digest segments (all but the in-process link).
    hash: bool,
    /// Read large uncached files around the page cache (`direct::Reader`).
    direct_io: bool,
}

fn worker(jobs: Receiver<Job>, tx: MsgTx, progress: Option<&Stats>, how: ReadHow) -> Result<()> {
    let mut buf = Vec::with_capacity(scan::CHUNK);
    for job in jobs {
        send_segment(&job, &tx, &mut buf, how)?;
        if let Some(st) = progress {
            let (a, b) = layout::segment_range(job.file.size, job.seg);
            Stats::add(&st.bytes_done, b - a);
        }
    }
    Ok(())
}

fn send_segment(job: &Job, tx: &MsgTx, buf: &mut Vec<u8>, how: ReadHow) -> Result<()> {
    let (hash, direct_io) = (how.hash, how.direct_io);
    let f = &job.file;
    let id = job.id;
    let fail = |error: String| -> Result<()> {
        f.failed.store(true, Ordering::SeqCst);
        tx.send(Message::FileFailed { file: id, error })?;
        Ok(())
    };
    let file = {
        let mut g = f
            .open
            .lock()
            .map_err(|_| Error::Protocol("lock poisoned".into()))?;
        match &*g {
            Some(h) => Some(h.clone()),
            None if f.failed.load(Ordering::SeqCst) => None,
            None => match open_listed(&f.path, f.ident, f.follow) {
                Ok(h) => {
                    let h: Arc<dyn ExtentReader> =
                        Arc::new(crate::direct::Reader::new(h, direct_io));
                    *g = Some(h.clone());
                    Some(h)
                }
                Err(e) => {
                    drop(g);
                    fail(format!("read {}: {}", f.path.display(), describe(&e)))?;
                    None
                }
            },
        }
    };
    let mut digest = [0u8; 32];
    let delta = match (&file, &job.early, &job.delta) {
        (Some(file), Some(e), _) => Some(send_early_segment(job, &**file, e, tx, buf)),
        (Some(file), None, Some(d)) => Some(send_delta_segment(job, &**file, d, tx, buf)),
        _ => None,
    };
    if let Some(sent) = delta {
        match sent {
            Ok(Ok(dg)) => digest = dg,
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                fail(format!(
                    "{}: file shrank while being read",
                    f.path.display()
                ))?;
            }
            Ok(Err(e)) => fail(format!("read {}: {}", f.path.display(), describe(&e)))?,
            Err(e) => return Err(e),
        }
    } else if let Some(file) = &file {
        let res =
            scan::scan_segment::<LinkError>(
                &**file,
                f.size,
                job.seg,
                hash,
                buf,
                &mut |p| match p {
                    Piece::Data(offset, d) => tx.send(Message::Data {
                        file: id,
                        offset,
                        data: d.to_vec(),
                    }),
                    Piece::Owned(offset, data) => tx.send(Message::Data {
                        file: id,
                        offset,
                        data,
                    }),
                    Piece::Zero(offset, len) => tx.send(Message::Zero {
                        file: id,
                        offset,
                        len,
                    }),
                },
            );
        match res {
            Ok(d) => digest = d,
            Err(ScanError::Emit(e)) => return Err(e.into()),
            Err(ScanError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                fail(format!(
                    "{}: file shrank while being read",
                    f.path.display()
                ))?;
            }
            Err(ScanError::Io(e)) => fail(format!("read {}: {}", f.path.display(), describe(&e)))?,
        }
    }
    if f.remaining.fetch_sub(1, Ordering::SeqCst) == 1 {
        // Last segment of this file: was it stable while we read it?
        if let Some(file) = &file {
            if !f.failed.load(Ordering::SeqCst) {
                match file.stamp() {
                    Ok(Some((size, mtime))) if size == f.size && mtime == f.mtime => {}
                    Ok(None) => {}
                    Ok(Some(_)) => fail(format!(
                        "{}: file changed while being read",
                        f.path.display()
                    ))?,
                    Err(e) => fail(format!("read {}: {}", f.path.display(), describe(&e)))?,
                }
            }
        }
        if !f.kept_open {
            if let Ok(mut g) = f.open.lock() {
                *g = None;
            }
        }
    }
    tx.send(Message::SegmentDone {
        file: id,
        segment: job.seg as u32,
        digest,
    })?;
    Ok(())
}

/// Send one segment as a delta: read it with a block of context on each
/// side, diff it against the receiver's signature, send copies as `Copy`
/// and literals as data and zero runs. Returns the segment digest, or the
/// read error.
fn send_delta_segment(
    job: &Job,
    file: &dyn ExtentReader,
    d: &DeltaJob,
    tx: &MsgTx,
    buf: &mut Vec<u8>,
) -> Result<std::io::Result<[u8; 32]>> {
    let size = job.file.size;
    let bs = d.matcher.block_size();
    let (start, end) = layout::segment_range(size, job.seg);
    if let Some(known) = job.file.prehash.hashes_for(start / bs, end.div_ceil(bs)) {
        return send_prehashed_segment(job, file, d, tx, buf, known);
    }
    let lo = start.saturating_sub(bs);
    let hi = (end + bs).min(size);
    buf.clear();
    buf.resize((hi - lo) as usize, 0);
    if let Err(e) = file.read_exact_at(buf, lo) {
        return Ok(Err(e));
    }
    let range = (start - lo) as usize..(end - lo) as usize;
    // Deltas digest on the delta grid (see the receiver's known blocks).
    // The block hashes serve twice: for the segment digest, and for the
    // matcher's strong checks at block offsets (one BLAKE3 pass, not two).
    let hashes: Vec<[u8; 32]> = buf.chunks(bs as usize).map(layout::block_hash).collect();
    let mut h = layout::SegmentHasher::new(bs);
    let first = range.start / bs as usize;
    let last = range.end.div_ceil(bs as usize);
    for b in &hashes[first..last] {
        h.known_block(*b);
    }
    let mut ops = Vec::new();
    d.matcher
        .diff_range(buf, lo, range, Some(&hashes), &mut |op| ops.push(op));
    send_ops(job.id, d.inplace, tx, ops, buf, lo)?;
    Ok(Ok(h.finish().0))
}

/// A segment sent before the signature is complete (see [`crate::early`]):
/// blocks in place as copies, the others read and sent as literals.
fn send_early_segment(
    job: &Job,
    file: &dyn ExtentReader,
    e: &EarlySeg,
    tx: &MsgTx,
    buf: &mut Vec<u8>,
) -> Result<std::io::Result<[u8; 32]>> {
    let bs = layout::delta_block(job.file.size);
    let k0 = layout::segment_range(job.file.size, job.seg).0 / bs;
    let same = |k: u64| e.same[(k - k0) as usize];
    send_in_place_runs(job, file, bs, &same, (k0, &e.hashes), None, tx, buf)
}

/// [`send_delta_segment`] with the file's block hashes known: blocks that
/// match the old copy in place become copies without being read; only the
/// runs of other blocks are read (with a block of context on each side, as
/// a whole segment is) and diffed.
fn send_prehashed_segment(
    job: &Job,
    file: &dyn ExtentReader,
    d: &DeltaJob,
    tx: &MsgTx,
    buf: &mut Vec<u8>,
    (first, known): (u64, Vec<[u8; 32]>),
) -> Result<std::io::Result<[u8; 32]>> {
    let size = job.file.size;
    let bs = d.matcher.block_size();
    let block_len = |k: u64| (size - k * bs).min(bs);
    let same = |k: u64| {
        d.matcher
            .aligned_match(k, block_len(k), &known[(k - first) as usize])
    };
    send_in_place_runs(job, file, bs, &same, (first, &known), Some(d), tx, buf)
}

/// Send a segment whose blocks' hashes are known (`hashes.1[i]` is block
/// `hashes.0 + i`, covering at least the segment): runs of blocks for which
/// `same` holds as in-place copies, unread; the other runs read and, with
/// `d`, diffed with a block of context on each side, else sent as literals.
/// Returns the segment digest, or the read error.
#[allow(clippy::too_many_arguments)]
fn send_in_place_runs(
    job: &Job,
    file: &dyn ExtentReader,
    bs: u64,
    same: &dyn Fn(u64) -> bool,
    (first, hashes): (u64, &[[u8; 32]]),
    d: Option<&DeltaJob>,
    tx: &MsgTx,
    buf: &mut Vec<u8>,
) -> Result<std::io::Result<[u8; 32]>> {
    let size = job.file.size;
    let (start, end) = layout::segment_range(size, job.seg);
    let (k0, k1) = (start / bs, end.div_ceil(bs));
    let hash_of = |k: u64| hashes.get(k.wrapping_sub(first) as usize);
    let mut h = layout::SegmentHasher::new(bs);
    for k in k0..k1 {
        match hash_of(k) {
            Some(b) => h.known_block(*b),
            None => return Err(Error::Protocol("segment hashes missing".into())),
        }
    }
    let inplace = d.is_none_or(|d| d.inplace);
    let mut k = k0;
    while k < k1 {
        let run_start = k;
        if same(k) {
            while k < k1 && same(k) {
                k += 1;
            }
            let offset = run_start * bs;
            tx.send(Message::Copy {
                file: job.id,
                offset,
                basis_offset: offset,
                len: (k * bs).min(end) - offset,
            })?;
            continue;
        }
        while k < k1 && !same(k) {
            k += 1;
        }
        // Blocks [run_start, k) changed: with a matcher, diff them with
        // their neighbours; else send them as they are.
        let (lo_k, hi_k) = match d {
            Some(_) => (run_start.saturating_sub(1), (k + 1).min(size.div_ceil(bs))),
            None => (run_start, k),
        };
        let (lo, hi) = (lo_k * bs, (hi_k * bs).min(size));
        let data = crate::direct::aligned(buf, (hi - lo) as usize);
        if let Err(e) = file.read_exact_at(data, lo) {
            return Ok(Err(e));
        }
        let range = ((run_start - lo_k) * bs) as usize..((k * bs).min(end) - lo) as usize;
        let mut ops = Vec::new();
        match d {
            Some(d) => {
                let known = hashes
                    .get(lo_k.saturating_sub(first) as usize..hi_k.saturating_sub(first) as usize);
                d.matcher.diff_range(
                    data,
                    lo,
                    range,
                    known.filter(|_| lo_k >= first),
                    &mut |op| ops.push(op),
                );
            }
            None => ops.push(ferry_delta::Op::Literal {
                offset: lo + range.start as u64,
                len: range.len() as u64,
            }),
        }
        send_ops(job.id, inplace, tx, ops, data, lo)?;
    }
    Ok(Ok(h.finish().0))
}

/// Send a segment's delta ops; literals come from `buf`, which holds the
/// source from offset `lo`.
fn send_ops(
    id: u32,
    inplace: bool,
    tx: &MsgTx,
    ops: Vec<ferry_delta::Op>,
    buf: &[u8],
    lo: u64,
) -> Result<()> {
    for op in ops {
        match op {
            ferry_delta::Op::Copy {
                offset,
                basis_offset,
                len,
            } if !inplace || basis_offset == offset => {
                tx.send(Message::Copy {
                    file: id,
                    offset,
                    basis_offset,
                    len,
                })?;
            }
            op => {
                let (offset, len) = (op.offset(), op.len());
                let lit = &buf[(offset - lo) as usize..(offset - lo + len) as usize];
                let mut err = None;
                scan::grain_runs(lit, offset, |zero, i, j| {
                    if err.is_some() {
                        return;
                    }
                    let off = offset + i as u64;
                    let r = if zero {
                        tx.send(Message::Zero {
                            file: id,
                            offset: off,
                            len: (j - i) as u64,
                        })
                    } else {
                        lit[i..j]
                            .chunks(scan::CHUNK)
                            .enumerate()
                            .try_for_each(|(k, c)| {
                                tx.send(Message::Data {
                                    file: id,
                                    offset: off + (k * scan::CHUNK) as u64,
                                    data: c.to_vec(),
                                })
                            })
                    };
                    if let Err(e) = r {
                        err = Some(e);
                    }
                });
                if let Some(e) = err {
                    return Err(e.into());
                }
            }
        }
    }
    Ok(())
}

/// Walks every source and sends the file list.
fn walk_all(
    sources: &[SourceSpec],
    opts: &SyncOptions,
    stats: &Stats,
    tx: &MsgTx,
    table: &Table,
) -> Result<()> {
    let mut w = Walker {
        opts,
        stats,
        tx,
        table,
        next_id: 0,
        inodes: HashMap::new(),
        // Several sources can bring the same name (`a/ b/ dst`): the first
        // one is sent, as rsync keeps the first; directories merge.
        names: (sources.len() > 1).then(HashMap::new),
    };
    for src in sources {
        let text = src.path.to_string_lossy();
        if crate::source::is_nbd_uri(&text) {
            w.nbd(&text, src.name.clone())?;
            continue;
        }
        let meta = if src.follow {
            std::fs::metadata(&src.path)
        } else {
            std::fs::symlink_metadata(&src.path)
        }
        .map_err(|e| Error::io_op("stat", &src.path, e))?;
        w.visit(&src.path, src.name.clone(), &meta, true)?;
    }
    tx.send(Message::EndOfList)?;
    Ok(())
}

struct Walker<'a> {
    opts: &'a SyncOptions,
    stats: &'a Stats,
    tx: &'a MsgTx,
    table: &'a Table,
    next_id: u32,
    inodes: HashMap<(u64, u64), u32>,
    /// With several sources: every name sent and whether it is a directory.
    names: Option<HashMap<Vec<u8>, bool>>,
}

impl Walker<'_> {
    /// Report a source entry that cannot be sent. It travels to the
    /// receiver, which keeps the tally, so a remote sender's problems reach
    /// the side that prints.
    fn warn(&self, error: String) -> Result<()> {
        self.tx.send(Message::FileFailed {
            file: ferry_proto::NO_FILE,
            error,
        })?;
        Ok(())
    }

    fn visit(
        &mut self,
        path: &Path,
        rel: Vec<u8>,
        meta: &std::fs::Metadata,
        top: bool,
    ) -> Result<()> {
        let ft = meta.file_type();
        if !top
            && self
                .opts
                .excludes
                .excluded(Path::new(std::ffi::OsStr::from_bytes(&rel)), ft.is_dir())
        {
            return Ok(());
        }
        if let Some(names) = &mut self.names {
            match names.get(&rel) {
                Some(true) if ft.is_dir() => {}
                Some(_) => {
                    self.stats.notice(format!(
                        "{}: another source has the same name; the first one is kept",
                        path.display()
                    ));
                    return Ok(());
                }
                None => {
                    names.insert(rel.clone(), ft.is_dir());
                }
            }
        }
        let id = self.next_id;
        self.next_id = self
            .next_id
            .checked_add(1)
            .ok_or_else(|| Error::Usage("more than 4 billion entries".into()))?;
        let mut e = Entry {
            id,
            path: rel.clone(),
            kind: None,
            mode: meta.mode(),
            uid: meta.uid(),
            gid: meta.gid(),
            size: 0,
            mtime: meta.mtime(),
            mtime_nsec: meta.mtime_nsec() as u32,
            ..Default::default()
        };
        if self.opts.xattrs {
            e.xattrs = fsutil::read_xattrs(path).map_err(|err| Error::io(path, err))?;
        }
        if ft.is_dir() {
            e.kind = Some(EntryKind::Dir);
            self.tx.send(Message::Entry(Box::new(e)))?;
            let mut children: Vec<_> = match std::fs::read_dir(path) {
                Ok(rd) => rd.filter_map(|d| d.ok()).collect(),
                Err(err) => {
                    self.warn(format!(
                        "list directory {}: {}",
                        path.display(),
                        describe(&err)
                    ))?;
                    return Ok(());
                }
            };
            children.sort_by_key(|d| d.file_name());
            for c in children {
                let cp = c.path();
                let m = match std::fs::symlink_metadata(&cp) {
                    Ok(m) => m,
                    Err(err) => {
                        self.warn(format!("stat {}: {}", cp.display(), describe(&err)))?;
                        continue;
                    }
                };
                let mut crel = rel.clone();
                if !crel.is_empty() {
                    crel.push(b'/');
                }
                crel.extend_from_slice(c.file_name().as_bytes());
                self.visit(&cp, crel, &m, false)?;
            }
            return Ok(());
        }
        if ft.is_symlink() {
            e.kind = Some(EntryKind::Symlink);
            e.target = std::fs::read_link(path)
                .map_err(|err| Error::io(path, err))?
                .into_os_string()
                .as_bytes()
                .to_vec();
            self.tx.send(Message::Entry(Box::new(e)))?;
            return Ok(());
        }
        let is_file = ft.is_file() || (top && ft.is_block_device());
        if !is_file {
            self.stats
                .change(format!("skipping non-regular file {}", path.display()));
            return Ok(());
        }
        if meta.nlink() > 1 && ft.is_file() {
            if let Some(&first) = self.inodes.get(&(meta.dev(), meta.ino())) {
                e.kind = Some(EntryKind::HardLink);
                e.link_to = first;
                self.tx.send(Message::Entry(Box::new(e)))?;
                return Ok(());
            }
            self.inodes.insert((meta.dev(), meta.ino()), id);
        }
        e.kind = Some(EntryKind::File);
        let size = if ft.is_block_device() {
            let f = open_listed(path, (meta.dev(), meta.ino()), top)
                .map_err(|err| Error::io_op("open for reading", path, err))?;
            fsutil::size_of(&f, meta).map_err(|err| Error::io(path, err))?
        } else {
            meta.len()
        };
        e.size = size;
        if self.opts.checksum && size > 0 {
            match open_listed(path, (meta.dev(), meta.ino()), top)
                .and_then(|f| scan::file_digest(&f, size, self.opts.threads))
            {
                Ok(d) => e.digest = Some(d),
                Err(err) => {
                    self.warn(format!("read {}: {}", path.display(), describe(&err)))?;
                    return Ok(());
                }
            }
        }
        if let Ok(mut t) = self.table.lock() {
            t.insert(
                id,
                Arc::new(SrcFile {
                    path: path.to_path_buf(),
                    size,
                    mtime: (e.mtime, e.mtime_nsec),
                    open: Mutex::new(None),
                    kept_open: false,
                    remaining: AtomicU64::new(0),
                    failed: Default::default(),
                    prehash: PreHash::default(),
                    ident: (meta.dev(), meta.ino()),
                    follow: top,
                }),
            );
        }
        self.tx.send(Message::Entry(Box::new(e)))?;
        Ok(())
    }

    /// An NBD export as a source file: its size from the server, "now" as
    /// its modification time (an export has none, so it is never taken as
    /// unchanged by size and time; `--checksum` compares contents).
    fn nbd(&mut self, uri: &str, name: Vec<u8>) -> Result<()> {
        let src = crate::source::NbdSource::connect(uri).map_err(|e| Error::io(uri, e))?;
        let size = src.size();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let id = self.next_id;
        self.next_id += 1;
        let mut e = Entry {
            id,
            path: name,
            kind: Some(EntryKind::File),
            mode: 0o100644,
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
            size,
            mtime: now.as_secs() as i64,
            mtime_nsec: now.subsec_nanos(),
            ..Default::default()
        };
        let reader: Arc<dyn ExtentReader> = Arc::new(src);
        if self.opts.checksum && size > 0 {
            e.digest = Some(
                scan::file_digest(&*reader, size, self.opts.threads)
                    .map_err(|err| Error::io(uri, err))?,
            );
        }
        if let Ok(mut t) = self.table.lock() {
            t.insert(
                id,
                Arc::new(SrcFile {
                    path: PathBuf::from(uri),
                    size,
                    mtime: (e.mtime, e.mtime_nsec),
                    open: Mutex::new(Some(reader)),
                    kept_open: true,
                    remaining: AtomicU64::new(0),
                    failed: Default::default(),
                    prehash: PreHash::default(),
                    // Kept open from the start: never opened by path again.
                    ident: (0, 0),
                    follow: true,
                }),
            );
        }
        self.tx.send(Message::Entry(Box::new(e)))?;
        Ok(())
    }
}
