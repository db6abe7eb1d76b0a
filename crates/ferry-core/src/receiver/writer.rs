use super::*;

/// The writer for a segment's ops (all ops of a segment go to one writer,
/// in order). Buffered writes to one inode serialise on its lock, and two
/// writers spinning on it cost more CPU than they save (measured: sys time
/// 5x on a 1 GiB delta), so such a file has one writer. A file written
/// directly (see [`direct`]) spreads its segments over all writers: its
/// writes take no page-cache locks, and a big delta's copies from the old
/// copy (one `pread` of cached pages per block run) then run in parallel.
pub(super) fn worker_for(f: &DstFile, seg: u64, n: usize) -> usize {
    decide::worker_index(f.entry.id, seg, f.direct.is_some(), n)
}

/// Queue `op` for writer `w`; what `out` holds for the sender goes first
/// when that has to wait (the writers are behind), so that the sender
/// does not wait for the disk with it.
pub(super) fn send_op(
    w: &Sender<(Arc<DstFile>, Op)>,
    f: Arc<DstFile>,
    op: Op,
    out: &outbox::Outbox<'_>,
) -> Result<()> {
    let stopped = || Error::Protocol("writer worker stopped".into());
    match w.try_send((f, op)) {
        Ok(()) => Ok(()),
        Err(crossbeam_channel::TrySendError::Full(job)) => {
            out.push();
            w.send(job).map_err(|_| stopped())
        }
        Err(crossbeam_channel::TrySendError::Disconnected(_)) => Err(stopped()),
    }
}

pub(super) struct SegState {
    pub(super) hasher: SegmentHasher,
    pub(super) next: u64,
    pub(super) sig: Option<SigBuild>,
    /// The segment assembled for one direct write (see [`direct`]).
    pub(super) buf: Option<direct::SegBuf>,
    /// Bytes of data and copies put into the file: what an `fdatasync`
    /// of this segment has to write (holes and zeros cost next to nothing).
    pub(super) dirty: u64,
}

impl SegState {
    /// Put `data`, the bytes at file offset `off`, into the segment's
    /// assembly buffer (direct writes) or into the file. Returns the bytes
    /// written to the file now.
    pub(super) fn put(&mut self, f: &DstFile, off: u64, data: &[u8]) -> io::Result<u64> {
        match &mut self.buf {
            Some(b) => {
                let rel = (off % layout::SEGMENT) as usize;
                let slot = b
                    .data_mut(rel, data.len())
                    .ok_or_else(|| io::Error::other("data beyond its segment"))?;
                slot.copy_from_slice(data);
                Ok(0)
            }
            None => f.file.put_at(data, off).map(|()| data.len() as u64),
        }
    }

    /// Read `len` bytes of the old copy at `boff` into the file at `off`,
    /// through the assembly buffer when there is one. Returns the bytes
    /// written to the file now.
    pub(super) fn put_from(
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
pub(super) fn flush_segment(
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

/// The state of the segment `off` falls in, opened on its first op; `None`
/// (and the run stopped) when the peer opens too many (see
/// [`decide::may_open_segment`]).
pub(super) fn seg_state<'m>(
    segs: &'m mut HashMap<(u32, u64), SegState>,
    pool: &mut direct::Pool,
    f: &DstFile,
    off: u64,
    sh: &Shared<'_>,
) -> Option<&'m mut SegState> {
    let seg = off / layout::SEGMENT;
    let key = (f.entry.id, seg);
    if !segs.contains_key(&key) {
        if !decide::may_open_segment(segs.len()) {
            sh.set_fatal(Error::Protocol(format!(
                "the sender opened more than {} segments at once",
                decide::MAX_OPEN_SEGMENTS
            )));
            return None;
        }
        let bufs = segs.values().filter(|s| s.buf.is_some()).count();
        let buffered =
            decide::buffer_segment(f.direct_ok.load(Ordering::Relaxed), bufs, sh.opts.threads);
        segs.insert(key, new_seg_state(pool, f, seg, buffered));
    }
    segs.get_mut(&key)
}

pub(super) fn new_seg_state(
    pool: &mut direct::Pool,
    f: &DstFile,
    seg: u64,
    buffered: bool,
) -> SegState {
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
        dirty: 0,
        sig: f.sig_out.as_ref().map(|s| SigBuild {
            bs: s.bs as usize,
            cur: Vec::new(),
            weak: Vec::new(),
            full: Vec::new(),
        }),
    }
}

pub(super) fn writer(rx: Receiver<(Arc<DstFile>, Op)>, sh: &Shared<'_>) {
    let mut segs: HashMap<(u32, u64), SegState> = HashMap::new();
    let mut pool = direct::Pool::default();
    let mut scratch = Vec::new();
    let mut zero_sig = ZeroSig::default();
    for (f, op) in rx {
        // Interrupted: what is queued is not written (an in-place file is
        // the destination itself).
        if sh.fatal_flag.load(Ordering::Relaxed) || crate::interrupt::stopping() {
            continue;
        }
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
                st.dirty += data.len() as u64;
                st.hasher.data(&data);
                if let Some(b) = &mut st.sig {
                    b.feed(&data);
                }
                ferry_link::bufpool::give(data);
            }
            Op::Copy(off, boff, len) => {
                let Some(st) = seg_state(&mut segs, &mut pool, &f, off, sh) else {
                    continue;
                };
                if !in_order(&f, st, off, len) {
                    continue;
                }
                st.dirty += len;
                copy_from_basis(&f, st, sh, off, boff, len, &mut scratch);
            }
            Op::Zero(off, len, unused) => {
                let Some(st) = seg_state(&mut segs, &mut pool, &f, off, sh) else {
                    continue;
                };
                zero_op(&f, st, sh, off, len, unused);
            }
            Op::Done(seg, digest) => segment_done(&f, sh, &mut segs, &mut pool, seg as u64, digest),
            Op::Holes(first, count) => holes_run(&f, sh, first as u64, count as u64, &mut zero_sig),
        }
    }
}

/// Apply a `Zero` op of `len` bytes at `off` to its segment's state.
fn zero_op(f: &DstFile, st: &mut SegState, sh: &Shared<'_>, off: u64, len: u64, unused: bool) {
    if !in_order(f, st, off, len) {
        return;
    }
    let resumed = f.partial.as_ref().is_some_and(|p| p.resumed);
    if decide::zeros_written(f.tmp.is_some(), resumed) && f.failure().is_none() {
        // In place: the old bytes must become zeros (a hole
        // where the filesystem allows), unless the source's
        // guest does not use them and nobody asked to discard.
        let left = unused && !sh.opts.discard && f.leave(off, len);
        if !left {
            if let Err(e) = f.file.zero_range(off, len) {
                write_failed(f, sh, e);
            }
        }
    }
    Stats::add(&sh.stats.bytes_done, len);
    st.hasher.zeros(len);
    if let Some(b) = &mut st.sig {
        b.zeros(len);
    }
}

/// A run of segments with no data (`Message::Holes`), none of which got
/// ops: what a `Zero` over each and its `Done` would do, at once. Nothing
/// is digested (the digest would be this side's own hash of zeros, checked
/// against itself) nor journaled (a resumed run is sent them again, for
/// nothing); the dispatcher kept the run for the read-back.
fn holes_run(f: &Arc<DstFile>, sh: &Shared<'_>, first: u64, count: u64, zero_sig: &mut ZeroSig) {
    let size = f.entry.size;
    let (start, _) = layout::segment_range(size, first);
    let (_, end) = layout::segment_range(size, first + count - 1);
    let resumed = f.partial.as_ref().is_some_and(|p| p.resumed);
    if decide::zeros_written(f.tmp.is_some(), resumed) && f.failure().is_none() {
        if let Err(e) = f.file.zero_range(start, end - start) {
            write_failed(f, sh, e);
        }
    }
    Stats::add(&sh.stats.bytes_done, end - start);
    if let Some(out) = &f.sig_out {
        if let Ok(mut p) = out.parts.lock() {
            for seg in first..first + count {
                let (a, b) = layout::segment_range(size, seg);
                if let Some(slot) = p.get_mut(seg as usize) {
                    *slot = Some(zero_sig.of(out.bs as usize, b - a));
                }
            }
        }
    }
    if f.remaining.fetch_sub(count, Ordering::SeqCst) == count {
        told(f, sh, finalize(f, sh));
    }
}

/// Segment `seg` of `f` is complete (`Done`): check it, write it out,
/// journal it, and finish the file on its last segment.
fn segment_done(
    f: &Arc<DstFile>,
    sh: &Shared<'_>,
    segs: &mut HashMap<(u32, u64), SegState>,
    pool: &mut direct::Pool,
    seg: u64,
    digest: [u8; 32],
) {
    let (start, end) = layout::segment_range(f.entry.size, seg);
    let st = segs.remove(&(f.entry.id, seg));
    let dirty = st.as_ref().map_or(0, |st| st.dirty);
    super::readback::keep_digest(f, seg, digest);
    let kept = match (&st, &f.partial) {
        (None, Some(p)) if p.offered(seg) => Some(p),
        _ => None,
    };
    if let (Some(p), None) = (kept, f.failure()) {
        // Kept from the partial file of an interrupted run: it
        // counts once it reads back as the sender's segment.
        match p.verify_kept(&*f.file, f.entry.size, seg, &digest) {
            Ok(true) => {
                Stats::add(&sh.stats.bytes_resumed, end - start);
                Stats::add(&sh.stats.bytes_done, end - start);
            }
            Ok(false) => f.fail_with(Failure::Mismatch(format!(
                "the partial file differs from the source at bytes {start}..{end}"
            ))),
            Err(e) => f.fail_with(Failure::Io("read partial file", describe(&e))),
        }
    } else if f.failure().is_none() {
        let reached = st.as_ref().map(|st| st.next);
        if let Err(why) = decide::segment_check(reached, start, end) {
            f.fail_with(why);
        } else if let Some(mut st) = st {
            match flush_segment(f, &mut st, start, pool) {
                Ok(n) => Stats::add(&sh.stats.bytes_written, n),
                Err(e) => write_failed(f, sh, e),
            }
            if let (Some(mut b), Some(out)) = (st.sig.take(), &f.sig_out) {
                b.flush();
                if let Ok(mut p) = out.parts.lock() {
                    p[seg as usize] = Some((b.weak, b.full));
                }
            }
            let got = st.hasher.finish().0;
            if let Err(why) = decide::digest_check(&got, &digest, start, end) {
                f.fail_with(why);
            }
        }
        journal_segment(f, seg, digest, dirty);
    }
    if f.remaining.fetch_sub(1, Ordering::SeqCst) == 1 {
        told(f, sh, finalize(f, sh));
    }
}

/// The signature of a segment of zeros (`--sig-cache`), for the last
/// block size and length asked: a sparse file's hole segments all ask the
/// same, and hashing 8 MiB of zeros for each would undo the run.
#[derive(Default)]
struct ZeroSig(Option<(usize, u64, SigPart)>);

impl ZeroSig {
    fn of(&mut self, bs: usize, len: u64) -> SigPart {
        if let Some((b, l, s)) = &self.0 {
            if (*b, *l) == (bs, len) {
                return s.clone();
            }
        }
        let mut b = SigBuild {
            bs,
            cur: Vec::new(),
            weak: Vec::new(),
            full: Vec::new(),
        };
        b.zeros(len);
        b.flush();
        let s = (b.weak, b.full);
        self.0 = Some((bs, len, s.clone()));
        s
    }
}

/// A segment of a file with a partial file is complete: journal it, with
/// its digest where that is one on the whole-file grid that this side
/// checked (else zeros: the next run re-hashes it anyway). `dirty`: the
/// bytes of data the segment put into the file.
fn journal_segment(f: &DstFile, seg: u64, digest: [u8; 32], dirty: u64) {
    if let (Some(p), None) = (&f.partial, f.failure()) {
        let known = f.verify && !f.delta.load(Ordering::SeqCst);
        p.segment_done(&*f.file, seg, if known { digest } else { [0; 32] }, dirty);
    }
}

/// Apply a `Copy` op: the old copy's bytes at `boff` become the new file's
/// at `off`. In place at the same offset nothing is written; the bytes are
/// still read, because the segment digest covers them.
pub(super) fn copy_from_basis(
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
    let writes = decide::copy_writes(f.tmp.is_none(), off, boff);
    let mut done = 0u64;
    while done < len {
        // Whole unchanged blocks on both grids: their hashes are known from
        // the signature, so they are not read; in place they are not even
        // touched, into a temp file they move in the kernel.
        let run = known_run(f, st, off + done, boff + done, len - done);
        if run > 0 {
            let bs = f.block.load(Ordering::SeqCst);
            if writes && f.failure().is_none() {
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
        if writes && f.failure().is_none() {
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
pub(super) fn known_run(f: &DstFile, st: &SegState, off: u64, boff: u64, len: u64) -> u64 {
    let Ok(bb) = f.basis_blocks.read() else {
        return 0;
    };
    let sig_aligned = st.sig.as_ref().is_none_or(|s| s.cur.is_empty());
    decide::known_run(decide::CopyAt {
        off,
        boff,
        len,
        bs: f.block.load(Ordering::SeqCst),
        size: f.entry.size,
        basis_size: bb.size,
        known: bb.full.len(),
        aligned: f.verify && st.hasher.at_block_start() && sig_aligned,
    })
}

/// Copy `len` bytes from the old copy into the file being written, through
/// a reused 1 MiB buffer. Not `copy_file_range`: without reflinks (ext4)
/// the kernel splices page by page, and measured here it took 2.6 s per GiB
/// in 1 MiB calls against 0.22 s for `pread` + `pwrite`.
pub(super) fn copy_range(
    basis: &direct::Reader,
    f: &DstFile,
    from: u64,
    to: u64,
    len: u64,
) -> io::Result<()> {
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
pub(super) const COPY_BUF: u64 = 1 << 20;

pub(super) fn in_order(f: &DstFile, st: &mut SegState, off: u64, len: u64) -> bool {
    if !decide::in_order(st.next, off, len, f.entry.size) {
        f.fail(format!("protocol error: data out of order at offset {off}"));
        return false;
    }
    st.next = off + len;
    true
}

pub(super) fn write_failed(f: &DstFile, sh: &Shared<'_>, e: io::Error) {
    let e = crate::error::with_op("write", e);
    f.fail_with(Failure::Io(
        crate::error::op_of(&e).unwrap_or("write"),
        describe(&e),
    ));
    if is_fatal_io(&e) {
        sh.set_fatal(Error::io(&f.loc.shown, e));
    }
}
