//! Sparse-aware, parallel copies between an NBD export and a local file.
//!
//! Export -> file: block status first; extents the server says read as
//! zeroes (`NBD_STATE_ZERO`) are never read (the destination file is truncated and re-extended,
//! so they stay holes); data extents are read in requests of
//! [`CopyOptions::request_size`] with [`CopyOptions::in_flight`] requests in
//! flight per worker, and every 4 KiB block of what was read is checked for
//! zeroes: all-zero blocks are not written either.
//!
//! File -> export: the file's holes (`SEEK_DATA`/`SEEK_HOLE`) and all-zero
//! 4 KiB blocks become WRITE_ZEROES (FAST_ZERO first where offered); only
//! the rest is sent as data.
//!
//! Workers claim [`CopyOptions::segment`]-sized ranges of the export; with
//! `NBD_FLAG_CAN_MULTI_CONN` each worker has its own connection, otherwise
//! they share one.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::client::{
    append_descriptors, wait_data, wait_extents, Client, Extent, PendingZero, MAX_EXTENTS,
};
use crate::conn::Ticket;
use crate::error::{Error, Result};

/// Granularity of zero detection.
pub const ZERO_BLOCK: usize = 4096;

/// Tuning of the copy helpers.
#[derive(Clone, Debug)]
pub struct CopyOptions {
    /// Worker threads (and connections, when the server allows multi-conn).
    pub threads: usize,
    /// Bytes per READ/WRITE request.
    pub request_size: usize,
    /// Requests in flight per worker.
    pub in_flight: usize,
    /// Bytes of the export a worker claims at a time.
    pub segment: u64,
    /// The destination already reads as zeroes (a fresh export, a new block
    /// device area): zero areas are then skipped instead of being zeroed.
    /// Regular destination files are always truncated, so this only matters
    /// for block devices and NBD destinations.
    pub destination_is_zero: bool,
}

impl Default for CopyOptions {
    fn default() -> Self {
        CopyOptions {
            threads: 2,
            request_size: 1 << 20,
            in_flight: 16,
            segment: 32 << 20,
            destination_is_zero: false,
        }
    }
}

impl CopyOptions {
    /// The default tuning with `threads` workers.
    fn with_threads(threads: usize) -> CopyOptions {
        CopyOptions {
            threads,
            ..CopyOptions::default()
        }
    }
}

/// What a copy did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CopyStats {
    /// Bytes covered (the export size, or the file size for `copy_from_file`).
    pub size: u64,
    /// Bytes transferred as data over NBD (read or written).
    pub data_transferred: u64,
    /// Bytes written as data to the destination.
    pub data_written: u64,
    /// Bytes never read because block status (or the file's holes) said zero.
    pub zero_skipped: u64,
    /// Bytes that were read but found to be all-zero blocks (not written as data).
    pub zero_detected: u64,
    /// NBD requests issued for data (READ or WRITE).
    pub data_requests: u64,
    /// Connections used.
    pub connections: usize,
    /// Wall time.
    pub elapsed: Duration,
}

#[derive(Default)]
struct Counters {
    data_transferred: AtomicU64,
    data_written: AtomicU64,
    zero_skipped: AtomicU64,
    zero_detected: AtomicU64,
    data_requests: AtomicU64,
}

impl Counters {
    fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
    fn stats(&self, size: u64, connections: usize, start: Instant) -> CopyStats {
        CopyStats {
            size,
            data_transferred: self.data_transferred.load(Ordering::Relaxed),
            data_written: self.data_written.load(Ordering::Relaxed),
            zero_skipped: self.zero_skipped.load(Ordering::Relaxed),
            zero_detected: self.zero_detected.load(Ordering::Relaxed),
            data_requests: self.data_requests.load(Ordering::Relaxed),
            connections,
            elapsed: start.elapsed(),
        }
    }
}

/// True if `b` is all zero bytes.
pub fn is_zero(b: &[u8]) -> bool {
    // Cheap early exit for data, then an OR-reduction the compiler vectorizes.
    let head = b.len().min(16);
    if b[..head].iter().any(|&x| x != 0) {
        return false;
    }
    b.chunks(256)
        .all(|c| c.iter().fold(0u8, |a, &x| a | x) == 0)
}

/// Splits `data` (at absolute `offset`) into runs of all-zero and non-zero
/// blocks aligned to [`ZERO_BLOCK`] in absolute offsets; calls `f(offset,
/// bytes, is_zero)` for each maximal run.
pub fn zero_runs<E>(
    offset: u64,
    data: &[u8],
    mut f: impl FnMut(u64, &[u8], bool) -> std::result::Result<(), E>,
) -> std::result::Result<(), E> {
    let mut pos = 0usize;
    let mut run_start = 0usize;
    let mut run_zero: Option<bool> = None;
    while pos < data.len() {
        let abs = offset + pos as u64;
        let to_boundary = ZERO_BLOCK - (abs % ZERO_BLOCK as u64) as usize;
        let n = to_boundary.min(data.len() - pos);
        let z = is_zero(&data[pos..pos + n]);
        match run_zero {
            Some(rz) if rz == z => {}
            Some(rz) => {
                f(offset + run_start as u64, &data[run_start..pos], rz)?;
                run_start = pos;
                run_zero = Some(z);
            }
            None => run_zero = Some(z),
        }
        pos += n;
    }
    if let Some(rz) = run_zero {
        f(offset + run_start as u64, &data[run_start..], rz)?;
    }
    Ok(())
}

fn file_err(what: &str, offset: u64, e: io::Error) -> Error {
    Error::io(format!("{what} at offset {offset}"), e)
}

/// Makes `[offset, offset+len)` of a non-regular destination (block device)
/// read as zeroes: punch a hole, else write zeroes.
fn zero_file_range(file: &File, offset: u64, len: u64) -> Result<()> {
    use rustix::fs::{fallocate, FallocateFlags};
    if fallocate(
        file,
        FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
        offset,
        len,
    )
    .is_ok()
    {
        return Ok(());
    }
    let z = crate::client::zero_buf();
    let mut pos = offset;
    let end = offset + len;
    while pos < end {
        let n = (end - pos).min(z.len() as u64) as usize;
        file.write_all_at(&z[..n], pos)
            .map_err(|e| file_err("writing zeroes to the destination", pos, e))?;
        pos += n as u64;
    }
    Ok(())
}

/// Copies the whole export to `file` with `threads` workers (see the module
/// documentation). A regular `file` is truncated and re-extended to the
/// export size first, so zero areas stay holes; a block device gets its zero
/// areas punched or written. The file is not fsynced.
pub fn copy_to_file(client: &Client, file: &File, threads: usize) -> Result<CopyStats> {
    copy_to_file_with(client, file, &CopyOptions::with_threads(threads))
}

/// [`copy_to_file`] with explicit tuning.
pub fn copy_to_file_with(client: &Client, file: &File, opts: &CopyOptions) -> Result<CopyStats> {
    let start = Instant::now();
    let size = client.size();
    let meta = file
        .metadata()
        .map_err(|e| Error::io("stat of the destination file", e))?;
    let regular = meta.file_type().is_file();
    if regular {
        file.set_len(0)
            .and_then(|_| file.set_len(size))
            .map_err(|e| Error::io("resizing the destination file", e))?;
    }
    let clients = client.connections(opts.threads)?;
    let punch = !regular && !opts.destination_is_zero;
    let counters = run_workers(&clients, |c, sh| to_file_worker(c, file, punch, opts, sh))?;
    Ok(counters.stats(size, clients_used(&clients), start))
}

/// What the workers of one copy share.
#[derive(Default)]
struct Shared {
    /// The start of the first segment no worker has claimed yet.
    next: AtomicU64,
    /// Raised by the first worker that fails: the others stop.
    abort: AtomicBool,
    counters: Counters,
}

/// Runs `work` on one thread per connection of `clients`, all claiming
/// segments from one cursor and adding to one set of counters. The first
/// worker to fail raises the abort flag the others check; the error
/// returned is the most telling one (see [`first_error`]).
fn run_workers<F>(clients: &[Client], work: F) -> Result<Counters>
where
    F: Fn(&Client, &Shared) -> Result<()> + Sync,
{
    let shared = Shared::default();
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let hs: Vec<_> = clients
            .iter()
            .map(|c| {
                let (shared, work) = (&shared, &work);
                s.spawn(move || {
                    let r = work(c, shared);
                    if r.is_err() {
                        shared.abort.store(true, Ordering::SeqCst);
                    }
                    r
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::InvalidArgument("copy worker panicked".into())))
            })
            .collect()
    });
    first_error(results)?;
    Ok(shared.counters)
}

fn clients_used(clients: &[Client]) -> usize {
    let mut v: Vec<*const crate::conn::Connection> = clients
        .iter()
        .map(|c| std::sync::Arc::as_ptr(c.connection()))
        .collect();
    v.sort();
    v.dedup();
    v.len()
}

fn first_error(results: Vec<Result<()>>) -> Result<()> {
    // Prefer a real cause over the "connection lost" its siblings then saw.
    let mut errs: Vec<Error> = results.into_iter().filter_map(|r| r.err()).collect();
    if errs.is_empty() {
        return Ok(());
    }
    let i = errs
        .iter()
        .position(|e| !matches!(e, Error::ConnectionLost(_)))
        .unwrap_or(0);
    Err(errs.swap_remove(i))
}

fn claim(next: &AtomicU64, segment: u64, size: u64) -> Option<(u64, u64)> {
    let s = next.fetch_add(segment, Ordering::SeqCst);
    if s >= size {
        None
    } else {
        Some((s, (size - s).min(segment)))
    }
}

/// A claimed segment whose block status may already be in flight.
struct Mapping {
    start: u64,
    len: u64,
    ticket: Option<Ticket>,
}

/// Claims the next segment and submits its BLOCK_STATUS without waiting, so
/// the map of the next segment arrives while the current one is copied.
fn start_map(
    client: &Client,
    next: &AtomicU64,
    segment: u64,
    size: u64,
) -> Result<Option<Mapping>> {
    let Some((start, len)) = claim(next, segment, size) else {
        return Ok(None);
    };
    let ticket = if client.has_block_status() {
        Some(client.connection().submit_block_status(start, len as u32)?)
    } else {
        None
    };
    Ok(Some(Mapping { start, len, ticket }))
}

fn finish_map(client: &Client, m: Mapping) -> Result<Vec<Extent>> {
    let end = m.start + m.len;
    let Some(t) = m.ticket else {
        return client.extents(m.start, m.len);
    };
    let descs = wait_extents(t)?;
    let mut out = Vec::new();
    let mut pos = append_descriptors(&mut out, m.start, end, &descs, MAX_EXTENTS);
    if pos < end && out.len() < MAX_EXTENTS {
        // The server answered for less than asked: map the rest.
        let rest = client.extents_upto(pos, end - pos, MAX_EXTENTS - out.len())?;
        pos = rest.last().map_or(pos, |e| e.offset + e.len);
        out.extend(rest);
    }
    if pos < end {
        // Described in more pieces than are kept: the rest is read (holes
        // read as zeros, which the copy finds and skips).
        out.push(Extent {
            offset: pos,
            len: end - pos,
            hole: false,
            zero: false,
        });
    }
    Ok(out)
}

fn to_file_worker(
    client: &Client,
    file: &File,
    zero_dest: bool,
    opts: &CopyOptions,
    sh: &Shared,
) -> Result<()> {
    let (next, abort, c) = (&sh.next, &sh.abort, &sh.counters);
    let rs = client.request_size(opts.request_size) as u64;
    // BLOCK_STATUS lengths are 32-bit.
    let segment = opts.segment.max(rs).min(1 << 30);
    let depth = opts.in_flight.max(1);
    let size = client.size();
    let mut work: VecDeque<(u64, u64)> = VecDeque::new();
    let mut queue: VecDeque<(u64, Ticket)> = VecDeque::new();
    let mut free: Vec<Vec<u8>> = Vec::new();
    let mut mapping = start_map(client, next, segment, size)?;
    loop {
        if abort.load(Ordering::Relaxed) {
            return Ok(());
        }
        while queue.len() < depth {
            if work.is_empty() {
                if let Some(m) = mapping.take() {
                    let extents = finish_map(client, m)?;
                    mapping = start_map(client, next, segment, size)?;
                    for e in extents {
                        if e.skippable() {
                            Counters::add(&c.zero_skipped, e.len);
                            if zero_dest {
                                zero_file_range(file, e.offset, e.len)?;
                            }
                        } else {
                            let mut p = e.offset;
                            while p < e.offset + e.len {
                                let n = rs.min(e.offset + e.len - p);
                                work.push_back((p, n));
                                p += n;
                            }
                        }
                    }
                }
            }
            let Some((off, len)) = work.pop_front() else {
                if mapping.is_some() {
                    continue;
                }
                break;
            };
            let mut buf = free.pop().unwrap_or_default();
            buf.resize(len as usize, 0);
            queue.push_back((off, client.connection().submit_read(off, buf)?));
            Counters::add(&c.data_requests, 1);
        }
        let Some((off, t)) = queue.pop_front() else {
            return Ok(());
        };
        let data = wait_data(t)?;
        Counters::add(&c.data_transferred, data.len() as u64);
        zero_runs(off, &data, |o, run, z| -> Result<()> {
            if z {
                Counters::add(&c.zero_detected, run.len() as u64);
                if zero_dest {
                    zero_file_range(file, o, run.len() as u64)?;
                }
            } else {
                file.write_all_at(run, o)
                    .map_err(|e| file_err("writing the destination file", o, e))?;
                Counters::add(&c.data_written, run.len() as u64);
            }
            Ok(())
        })?;
        free.push(data);
    }
}

/// Copies `file` into the export (from offset 0) with `threads` workers.
/// The file's holes and all-zero blocks become WRITE_ZEROES; the export
/// beyond the file's length is left untouched. Ends with a FLUSH when the
/// server supports it.
pub fn copy_from_file(file: &File, client: &Client, threads: usize) -> Result<CopyStats> {
    copy_from_file_with(file, client, &CopyOptions::with_threads(threads))
}

/// [`copy_from_file`] with explicit tuning.
pub fn copy_from_file_with(file: &File, client: &Client, opts: &CopyOptions) -> Result<CopyStats> {
    let start = Instant::now();
    let size = file
        .metadata()
        .map_err(|e| Error::io("stat of the source file", e))?
        .len();
    if size > client.size() {
        return Err(Error::OutOfRange {
            offset: 0,
            len: size,
            size: client.size(),
        });
    }
    if client.read_only() {
        return Err(Error::Unsupported("destination export is read-only".into()));
    }
    let clients = client.connections(opts.threads)?;
    let counters = run_workers(&clients, |c, sh| from_file_worker(file, size, c, opts, sh))?;
    // All writes on all connections are acknowledged; with multi-conn one
    // flush covers them, without it there was only one connection.
    client.flush()?;
    Ok(counters.stats(size, clients_used(&clients), start))
}

enum Pend {
    Write(Ticket),
    Zero(PendingZero),
}

/// Next data region at or after `pos` in the file: `(data_start, data_end)`,
/// or `None` if the rest is a hole. Falls back to "all data" where
/// `SEEK_DATA` is not supported.
fn next_data(file: &File, pos: u64, end: u64) -> Result<Option<(u64, u64)>> {
    use rustix::fs::{seek, SeekFrom};
    let d = match seek(file, SeekFrom::Data(pos)) {
        Ok(d) => d,
        Err(rustix::io::Errno::NXIO) => return Ok(None),
        Err(rustix::io::Errno::INVAL) | Err(rustix::io::Errno::NOTSUP) => {
            return Ok(Some((pos, end)))
        }
        Err(e) => return Err(file_err("SEEK_DATA in the source file", pos, e.into())),
    };
    if d >= end {
        return Ok(None);
    }
    let h = match seek(file, SeekFrom::Hole(d)) {
        Ok(h) => h,
        Err(e) => return Err(file_err("SEEK_HOLE in the source file", d, e.into())),
    };
    Ok(Some((d, h.min(end).max(d + 1).min(end))))
}

fn from_file_worker(
    file: &File,
    size: u64,
    client: &Client,
    opts: &CopyOptions,
    sh: &Shared,
) -> Result<()> {
    let (next, abort, c) = (&sh.next, &sh.abort, &sh.counters);
    let rs = client.request_size(opts.request_size) as u64;
    let segment = opts.segment.max(rs);
    let depth = opts.in_flight.max(1);
    let mut queue: VecDeque<Pend> = VecDeque::new();
    let mut buf = vec![0u8; rs as usize];

    let drain_to = |queue: &mut VecDeque<Pend>, n: usize| -> Result<()> {
        while queue.len() > n {
            match queue.pop_front() {
                Some(Pend::Write(t)) => crate::client::wait_done(t)?,
                Some(Pend::Zero(z)) => client.finish_zero(z)?,
                None => break,
            }
        }
        Ok(())
    };
    let zero = |queue: &mut VecDeque<Pend>, mut off: u64, len: u64| -> Result<()> {
        if opts.destination_is_zero {
            return Ok(());
        }
        let end = off + len;
        while off < end {
            drain_to(queue, depth - 1)?;
            let z = client.submit_zero_chunk(off, end - off)?;
            off += z.len;
            queue.push_back(Pend::Zero(z));
        }
        Ok(())
    };

    while let Some((s, l)) = claim(next, segment, size) {
        let end = s + l;
        let mut pos = s;
        while pos < end {
            if abort.load(Ordering::Relaxed) {
                return Ok(());
            }
            let (ds, de) = match next_data(file, pos, end)? {
                None => (end, end),
                Some(r) => r,
            };
            if ds > pos {
                Counters::add(&c.zero_skipped, ds - pos);
                zero(&mut queue, pos, ds - pos)?;
            }
            let mut p = ds;
            while p < de {
                let n = rs.min(de - p) as usize;
                let b = &mut buf[..n];
                file.read_exact_at(b, p)
                    .map_err(|e| file_err("reading the source file", p, e))?;
                let mut runs: Vec<(u64, u64, bool)> = Vec::new();
                zero_runs(p, b, |o, run, z| -> Result<()> {
                    runs.push((o, run.len() as u64, z));
                    Ok(())
                })?;
                for (o, rl, z) in runs {
                    if z {
                        Counters::add(&c.zero_detected, rl);
                        zero(&mut queue, o, rl)?;
                    } else {
                        drain_to(&mut queue, depth - 1)?;
                        let at = (o - p) as usize;
                        let t =
                            client
                                .connection()
                                .submit_write(o, &b[at..at + rl as usize], false)?;
                        queue.push_back(Pend::Write(t));
                        Counters::add(&c.data_transferred, rl);
                        Counters::add(&c.data_written, rl);
                        Counters::add(&c.data_requests, 1);
                    }
                }
                p += n as u64;
            }
            pos = de.max(ds);
        }
    }
    drain_to(&mut queue, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_detection() {
        assert!(is_zero(&[]));
        assert!(is_zero(&[0; 10000]));
        let mut v = vec![0u8; 10000];
        v[9999] = 1;
        assert!(!is_zero(&v));
        v[9999] = 0;
        v[3] = 1;
        assert!(!is_zero(&v));
    }

    #[test]
    fn runs_align_to_absolute_blocks() {
        // Starts 1 KiB before a block boundary: first block is 1 KiB.
        let mut d = vec![0u8; 1024 + 4096 * 3];
        d[1024 + 4096 + 5] = 7; // second full block non-zero
        let mut runs = Vec::new();
        zero_runs::<()>(3072, &d, |o, r, z| {
            runs.push((o, r.len(), z));
            Ok(())
        })
        .unwrap();
        assert_eq!(
            runs,
            vec![
                (3072, 1024 + 4096, true),
                (8192, 4096, false),
                (12288, 4096, true)
            ]
        );
    }
}
