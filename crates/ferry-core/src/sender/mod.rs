//! The sending side: walks the sources, streams the file list, and answers
//! the receiver's requests with data, zero and copy ops, read by segments in
//! parallel.
//!
//! Threads: the caller's thread walks and sends entries; one thread reads
//! requests from the receiver and queues segment jobs; `threads` workers
//! read segments and send their ops. Every segment ends with a
//! `SegmentDone` carrying its digest; a file whose source changed or could
//! not be read gets a `FileFailed` before its last `SegmentDone`.
//!
//! This module holds what those threads share (the table of listed files,
//! the segment jobs) and starts them. The rest, by concern: `walk` sends
//! the list, `open` opens a listed file by its handle, `requests` answers
//! the receiver, `segment` sends one segment and keeps a file's failure
//! bookkeeping, `whole` and `delta` are the two ways a segment's bytes go
//! (`ops` turns a delta's ops into messages), `prehash` hashes delta
//! sources while the receiver signs, and `resume` answers a receiver that
//! resumes a partial file.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};

use crossbeam_channel::{bounded, unbounded};
use ferry_link::{Endpoint, ReceiverReport};

use crate::early::{EarlySeg, PreHash};
use crate::endpoint::Source;
use crate::error::{Error, Result};
use crate::plan::SourceSpec;
use crate::stats::Stats;
use crate::SyncOptions;

mod credit;
mod delta;
mod holes;
mod open;
mod ops;
mod prehash;
mod requests;
mod resume;
mod rules;
mod segment;
mod tree;
mod walk;
mod whole;

/// A file the receiver may ask for.
struct SrcFile {
    path: PathBuf,
    size: u64,
    mtime: (i64, u32),
    open: Mutex<Option<Arc<dyn Source>>>,
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
    /// How it is opened: a source the user named by its path, a file
    /// found in a tree below the tree's handle (see [`open::Reach`]).
    reach: open::Reach,
    /// It may have holes (fewer blocks allocated than its size, or an NBD
    /// export): its extents are looked up as it is queued.
    holey: bool,
    /// Small, with every block allocated when listed: read without
    /// extent queries (see [`crate::direct::dense`]).
    dense: bool,
    /// A block device: read through the page cache, never `O_DIRECT`.
    device: bool,
}

/// The listed files by id, shared by the walk and the request thread.
type Table = Arc<Mutex<HashMap<u32, Arc<SrcFile>, crate::fasthash::Ids>>>;

/// One segment for a worker to send.
struct Job {
    id: u32,
    file: Arc<SrcFile>,
    seg: u64,
    delta: Option<Arc<DeltaJob>>,
    /// A delta segment sent before the signature is complete.
    early: Option<Box<EarlySeg>>,
    /// What the receiver holds of it from an interrupted run.
    held: Held,
    /// The file is never asked for again (`Whole`, `Check`): once its
    /// last segment is sent, the table lets it go.
    fin: bool,
    /// Not 0: segments `seg..seg + holes` hold no data, sent as one
    /// `Holes` (see [`holes`]).
    holes: u32,
}

/// What the receiver's partial file holds of a segment (see
/// [`ferry_link::WantMode::Resume`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Held {
    /// Not a resumed file.
    Nothing,
    /// A resumed file that lacks this segment: sent whole, digested.
    Missing,
    /// The receiver has it with this digest: sent only if the source's
    /// differs.
    Kept([u8; 32]),
}

/// A file to send as a delta against the receiver's signature.
struct DeltaJob {
    matcher: ferry_delta::Matcher,
    /// The receiver writes in place: copies must keep their offset.
    inplace: bool,
}

/// How a worker reads and digests segments.
#[derive(Clone, Copy)]
struct ReadHow {
    /// Digest segments (all but the in-process link).
    hash: bool,
    /// Read large uncached files around the page cache (`direct::Reader`).
    direct_io: bool,
}

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
    crate::hello(&tx, &rx, opts.hello_wait, hello_features(sources))?;
    Stats::add(&stats.sessions, 1);
    // From here on a silent peer is a dead one (not during an ssh login).
    rx.set_idle_timeout(opts.timeout);

    let table: Table = Arc::default();
    let credit = credit::Credit::default();
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
            // Files that vanish are the receiver's to note, unless it is
            // remote: then this side, which prints, notes them too.
            let warn = (!opts.in_process).then_some(stats);
            let table = table.clone();
            workers.push(s.spawn(move || segment::worker(job_rx, tx, &table, progress, warn, how)));
        }
        drop(job_rx);

        // Requests from the receiver.
        let (prehash_tx, prehash_rx) = unbounded::<Arc<SrcFile>>();
        let direct_io = opts.direct_io;
        let over = &over;
        let credit = &credit;
        s.spawn(move || prehash::prehash(prehash_rx, direct_io, over));
        let (prefetch_tx, prefetch_rx) = bounded::<Arc<SrcFile>>(open::PREFETCH_QUEUE);
        s.spawn(move || open::prefetcher(prefetch_rx, over));
        let req = requests::Requests::new(
            table.clone(),
            tx.clone(),
            (job_tx, workers),
            (prehash_tx, prefetch_tx),
            progress,
            // The changes a remote receiver reports, when they were asked for.
            progress.filter(|_| opts.list_changes),
            credit,
        );
        let requests = s.spawn(move || -> Result<ReceiverReport> {
            let _over = requests::SetOnDrop(over);
            let _closed = credit::CloseOnDrop(credit);
            req.serve(&rx)
        });

        // On a thread of its own, whose stack holds the walk's recursion
        // to its deepest (see [`walk::MAX_DEPTH`]), whatever thread called.
        let walked = std::thread::scope(|w| {
            std::thread::Builder::new()
                .name("ferry-walk".into())
                .stack_size(walk::STACK)
                .spawn_scoped(w, || {
                    walk::walk_all(sources, opts, stats, &tx, &table, credit)
                })
                .map_err(|e| Error::io_op("start thread", "ferry-walk", e))?
                .join()
                .unwrap_or_else(|_| Err(Error::Protocol("the walk panicked".into())))
        });
        if let Err(e) = &walked {
            let _ = tx.send(crate::error::fatal(e));
        }
        drop(tx);
        let res = requests
            .join()
            .map_err(|_| Error::Protocol("sender request thread panicked".into()))?;
        // The receiver's own failure says more than the walk it stopped.
        let report = res?;
        walked?;
        Ok(report)
    })
}

/// What the sender announces: [`ferry_link::features::SUBTREES`] when its
/// list is one walk, a single source listed under a single name (several
/// sources may merge directories; a name with a `/` comes with the
/// directories leading to it).
fn hello_features(sources: &[SourceSpec]) -> u64 {
    let one_walk = matches!(sources, [s] if !s.name.contains(&b'/'));
    ferry_link::features::ALL
        | if one_walk {
            ferry_link::features::SUBTREES
        } else {
            0
        }
}
