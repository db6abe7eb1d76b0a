use super::*;

/// The signature of an old copy, kept by the receiver; it grows in file
/// order while the old copy is signed.
#[derive(Default)]
pub(super) struct BasisBlocks {
    pub(super) size: u64,
    pub(super) weak: Vec<u64>,
    pub(super) full: Vec<[u8; 32]>,
}

/// A file being received.
/// Counts the files open for writing; a [`Slot`] holds one place.
pub(super) struct InFlight {
    pub(super) n: AtomicU64,
    /// Wakes the dispatcher when a place frees up without a message from
    /// the sender (a file applied, or an old copy that could not be signed).
    pub(super) wake: Sender<()>,
    /// Delta files not yet finished: a delta that fails verification is
    /// asked for again whole, which must happen before `EndOfList`.
    pub(super) deltas: AtomicU64,
    /// Files alive that failed while holding an old copy (one that could
    /// not be signed: no data will come for them). Kept as a count, not
    /// found by a scan of the files in flight: that scan ran on every
    /// message once the budget was full, 4096 files a time, and took most
    /// of the CPU of a million-file run.
    pub(super) stuck: AtomicU64,
}

/// One file's place among the files in flight, given back when the file
/// (its temp file and old copy) is dropped.
pub(super) struct Slot(pub(super) Arc<InFlight>);

impl Slot {
    pub(super) fn take(f: &Arc<InFlight>) -> Slot {
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

/// Held by a file sent as a delta until it is finished (committed, failed
/// or queued to be asked for again whole).
pub(super) struct DeltaSlot(pub(super) Arc<InFlight>);

impl DeltaSlot {
    pub(super) fn take(f: &Arc<InFlight>) -> DeltaSlot {
        f.deltas.fetch_add(1, Ordering::SeqCst);
        DeltaSlot(f.clone())
    }
}

impl Drop for DeltaSlot {
    fn drop(&mut self) {
        self.0.deltas.fetch_sub(1, Ordering::SeqCst);
        let _ = self.0.wake.try_send(());
    }
}

pub(super) struct DstFile {
    pub(super) entry: Entry,
    /// Where the file goes (for an NBD export: its URI, shown only).
    pub(super) loc: Loc,
    /// Temporary file renamed over `final_path` at the end; `None` when
    /// writing in place.
    pub(super) tmp: Option<Loc>,
    /// Whether the filesystem of the temporary file's directory takes
    /// batch commits ([`decide::batch_fs`]), when known: then the file's
    /// own `fstatfs` is not needed.
    pub(super) batch_fs: Option<bool>,
    pub(super) file: Box<dyn Sink>,
    /// The temp file opened again with `O_DIRECT` (see [`direct`]), while
    /// direct writes work.
    pub(super) direct: Option<File>,
    pub(super) direct_ok: AtomicBool,
    /// The old copy's delta-block hashes (delta transfers), as far as it is
    /// signed: unchanged blocks are verified with these instead of being
    /// read again.
    pub(super) basis_blocks: std::sync::RwLock<BasisBlocks>,
    /// The old copy that `Copy` ops read from (delta transfers).
    pub(super) basis: Option<direct::Reader>,
    /// Sent as a delta (cleared if the signer sends it whole after all).
    pub(super) delta: AtomicBool,
    /// Reading the old copy over sending the file whole, in time, when the
    /// delta was chosen (0 when forced or free): see [`delta_saving`].
    pub(super) delta_cost: f64,
    /// Digest what is written and compare with the sender's digests (all
    /// but whole-file transfers over the in-process link).
    pub(super) verify: bool,
    /// `--verify`: the sender's segment digests, kept for reading the
    /// file back once it is on the disk (see [`super::readback`]).
    pub(super) readback: Option<Mutex<Vec<SegDigest>>>,
    /// Ranges the source's guest does not use that were left as they were
    /// (written in place, without `--discard`): they count as zeros when
    /// the file is read back. At most [`MAX_LEFT`] ranges; past that,
    /// unused ranges are zeroed like any others.
    pub(super) left: Mutex<ferry_guest::Ranges>,
    /// Signature of what is written, for the cache (when enabled).
    pub(super) sig_out: Option<SigOut>,
    /// The digest grid (the delta grid for deltas).
    pub(super) block: AtomicU64,
    pub(super) nseg: u64,
    pub(super) remaining: AtomicU64,
    pub(super) failed: Mutex<Option<Failure>>,
    /// Its failure has been counted and told (once).
    pub(super) reported: AtomicBool,
    /// A block device written in place.
    pub(super) is_device: bool,
    /// A character device or FIFO (`/dev/null`, a tape, a pipe): the data
    /// is assembled in an unnamed temporary file and, once verified,
    /// written to it in order at commit, as `cp` would. Never replaced.
    pub(super) stream_to: bool,
    pub(super) committed: AtomicBool,
    /// The partial file and its journal (see [`super::partial`]), when
    /// `tmp` is one.
    pub(super) partial: Option<super::partial::Partial>,
    /// A delta: released when the file is finished (see [`DeltaSlot`]).
    pub(super) delta_slot: Mutex<Option<DeltaSlot>>,
    /// Declared last: dropped last, once the file's descriptors are closed.
    pub(super) _slot: Slot,
}

/// Unused ranges a file may leave as they were (16 bytes each).
pub(super) const MAX_LEFT: usize = 1 << 20;

impl DstFile {
    /// Leave `[off, off + len)` as it is, unused by the source's guest:
    /// false when too many ranges are left already (zero it instead).
    pub(super) fn leave(&self, off: u64, len: u64) -> bool {
        let Ok(mut left) = self.left.lock() else {
            return false;
        };
        if left.as_slice().len() >= MAX_LEFT {
            return false;
        }
        left.push(off, off.saturating_add(len));
        true
    }
}

/// Why a file was not committed. The first failure of a file counts.
#[derive(Clone, Debug)]
pub(super) enum Failure {
    /// What was written differs from what the sender read: a delta is
    /// sent again whole.
    Mismatch(String),
    /// An operation on the file failed: its name and the OS's reason.
    Io(&'static str, String),
    /// The sender could not read it: its line, which names its path.
    Sender(String),
    /// It vanished or changed while the sender read it: its line. Not a
    /// failure: the old copy stays and the next run takes the new one.
    Changed(String),
    /// Anything else, as a reason to print after the file's path.
    Other(String),
}

impl Failure {
    /// Whether a partial file whose transfer ended this way is kept for
    /// the next run (see [`super::partial`]).
    pub(super) fn keeps_partial(&self) -> bool {
        matches!(self, Failure::Io(..) | Failure::Other(_))
    }
}

impl DstFile {
    pub(super) fn fail(&self, why: String) {
        self.fail_with(Failure::Other(why));
    }
    pub(super) fn fail_with(&self, why: Failure) {
        if let Ok(mut g) = self.failed.lock() {
            if g.is_none() && self.basis.is_some() {
                self._slot.0.stuck.fetch_add(1, Ordering::SeqCst);
            }
            g.get_or_insert(why);
        }
    }
    pub(super) fn failure(&self) -> Option<Failure> {
        self.failed.lock().ok().and_then(|g| g.clone())
    }

    /// An interrupt: record what is complete in the journal, as a drop
    /// would (see [`super::live`]).
    pub(super) fn record_partial(&self) {
        if self.committed.load(Ordering::SeqCst) {
            return;
        }
        match &self.partial {
            Some(p) if self.failure().is_none_or(|f| f.keeps_partial()) => p.flush(&*self.file),
            _ => {}
        }
    }
}

impl Drop for DstFile {
    fn drop(&mut self) {
        if self.basis.is_some() && self.failed.lock().is_ok_and(|g| g.is_some()) {
            self._slot.0.stuck.fetch_sub(1, Ordering::SeqCst);
        }
        if self.committed.load(Ordering::SeqCst) {
            return;
        }
        let Some(t) = &self.tmp else {
            // Written in place: a device's journal stays while its data
            // does, for the next run.
            match (&self.partial, self.failure()) {
                (Some(p), None) => p.flush(&*self.file),
                (Some(p), Some(f)) if f.keeps_partial() => p.flush(&*self.file),
                (Some(p), Some(_)) => p.remove_journal(),
                _ => {}
            }
            return;
        };
        match &self.partial {
            // The run ends without it (cut off, stopped, a write that
            // failed, another file's fatal error): what is complete stays
            // for the next run, which verifies it again anyway. Only a
            // result that failed verification, or a source that could not
            // be read as listed, is not worth keeping.
            Some(p) if self.failure().is_none_or(|f| f.keeps_partial()) => p.flush(&*self.file),
            Some(p) => {
                let _ = t.remove_file();
                p.remove_journal();
            }
            None => {
                let _ = t.remove_file();
                t.unregister_temp();
            }
        }
    }
}

pub(super) enum Op {
    Data(u64, Vec<u8>),
    /// Zeros; `true`: unused by the source's guest (`Message::Unused`).
    Zero(u64, u64, bool),
    Copy(u64, u64, u64),
    Done(u32, [u8; 32]),
    /// Segments `first..first + count` hold no data (`Message::Holes`),
    /// none of which got ops.
    Holes(u32, u32),
}

/// Collects the delta signature of a file as it is written, so the next
/// run can take it from the cache instead of re-reading the file.
pub(super) struct SigOut {
    pub(super) cache: Arc<ferry_delta::SigCache>,
    pub(super) bs: u64,
    pub(super) parts: Mutex<Vec<Option<SigPart>>>,
}

/// A segment index and the sender's digest of it.
/// Segments `first..first + count` and the sender's digest of each
/// (`None`: holes, each digested as zeros).
pub(super) type SegDigest = (u64, u64, Option<[u8; 32]>);

/// Weak and full block hashes of one segment.
pub(super) type SigPart = (Vec<u64>, Vec<[u8; 32]>);

/// Builds per-block weak and strong hashes from a segment's bytes in order.
pub(super) struct SigBuild {
    pub(super) bs: usize,
    pub(super) cur: Vec<u8>,
    pub(super) weak: Vec<u64>,
    pub(super) full: Vec<[u8; 32]>,
}

impl SigBuild {
    pub(super) fn feed(&mut self, mut b: &[u8]) {
        while !b.is_empty() {
            let k = (self.bs - self.cur.len()).min(b.len());
            self.cur.extend_from_slice(&b[..k]);
            b = &b[k..];
            if self.cur.len() == self.bs {
                self.flush();
            }
        }
    }
    pub(super) fn zeros(&mut self, mut n: u64) {
        static Z: [u8; 1 << 16] = [0; 1 << 16];
        while n > 0 {
            let k = n.min(Z.len() as u64);
            self.feed(&Z[..k as usize]);
            n -= k;
        }
    }
    /// A whole block whose hashes are known; only at a block start.
    pub(super) fn known(&mut self, weak: u64, full: [u8; 32]) {
        self.weak.push(weak);
        self.full.push(full);
    }
    pub(super) fn flush(&mut self) {
        if !self.cur.is_empty() {
            self.weak.push(ferry_delta::weak_hash(&self.cur));
            self.full.push(layout::block_hash(&self.cur));
            self.cur.clear();
        }
    }
}

/// Give a completely received file its metadata and move it into place, or
/// drop it (the temp file goes with it) when anything failed.
/// The error line of a failed file (its path, and what failed).
pub(super) fn failure_line(f: &DstFile, why: Failure) -> String {
    match why {
        Failure::Mismatch(why) | Failure::Other(why) => {
            format!("{}: {why}", f.loc.shown.display())
        }
        Failure::Sender(why) | Failure::Changed(why) => why,
        Failure::Io(op, why) => format!("{op} {}: {why}", f.loc.shown.display()),
    }
}

/// Count a failed file once, with its line.
pub(super) fn report_failure(f: &DstFile, sh: &Shared<'_>, why: Failure) {
    if !f.reported.swap(true, Ordering::SeqCst) {
        match why {
            Failure::Changed(line) => sh.stats.vanished(line),
            why => sh.stats.error(failure_line(f, why)),
        }
    }
}

/// The file no longer holds up `EndOfList` (see [`DeltaSlot`]).
pub(super) fn release_delta(f: &DstFile) {
    if let Ok(mut g) = f.delta_slot.lock() {
        g.take();
    }
}

pub(super) fn finalize(f: &Arc<DstFile>, sh: &Shared<'_>) -> io::Result<()> {
    let r = finalize_inner(f, sh);
    release_delta(f);
    r
}

/// Tell what committing `f` came to: an I/O error that stops the run
/// (a full disk) is fatal, any other is this file's error line.
pub(super) fn told(f: &DstFile, sh: &Shared<'_>, r: io::Result<()>) {
    if let Err(e) = r {
        if is_fatal_io(&e) {
            sh.set_fatal(Error::io(&f.loc.shown, e));
        } else {
            sh.stats.error(line(&f.loc.shown, &e));
        }
    }
}

fn finalize_inner(f: &Arc<DstFile>, sh: &Shared<'_>) -> io::Result<()> {
    if crate::interrupt::stopping() {
        // Not sized, set or written out in order: the run is stopping.
        return Err(io::Error::other("interrupted"));
    }
    if let Some(why) = f.failure() {
        let resumed = f.partial.as_ref().is_some_and(|p| p.resumed);
        let after = decide::after_failure(&why, f.delta.load(Ordering::SeqCst) || resumed);
        if after == decide::AfterFailure::RetryWhole {
            // The delta (or the partial file resumed) did not reproduce the
            // source (the old copy, the partial file or the source changed
            // under it): ask for the file again, whole, in this session.
            // The queue entry exists before the file's slot is released,
            // so `EndOfList` cannot overtake it.
            Stats::add(&sh.stats.delta_mismatch, 1);
            let what = if resumed {
                "partial file"
            } else {
                "delta result"
            };
            sh.stats.change_line(format!(
                "{}: {what} failed verification; sending it whole",
                f.loc.shown.display()
            ));
            if let Ok(mut r) = sh.retries.lock() {
                r.push(f.entry.clone());
            }
            release_delta(f);
            return Ok(());
        }
        report_failure(f, sh, why);
        release_delta(f);
        return Ok(());
    }
    let e = &f.entry;
    if let (true, Some(file)) = (f.stream_to, f.file.as_file()) {
        write_in_order(file, e.size, &f.loc)?;
    } else if let (false, Some(file)) = (f.is_device, f.file.as_file()) {
        if f.tmp.is_none() {
            file.set_len(e.size)?;
        }
        let steps = decide::meta_for_new(EntryKind::File, sh.keep, sh.opts.meta_xattrs());
        if steps.owner {
            let (u, g) = sh.keep.ids(e);
            fsutil::fchown(file, u, g).op("set owner of")?;
        }
        if steps.mode {
            fsutil::fchmod(file, e.mode).op("set permissions of")?;
        }
        if steps.xattrs {
            fsutil::fwrite_xattrs(file, &e.xattrs, &|n| sh.opts.xattr_scope(n))
                .op("set xattrs of")?;
        }
        if steps.mtime {
            fsutil::set_mtime_fd(file, e.mtime, e.mtime_nsec).op("set mtime of")?;
        }
        if decide::fsync_before_rename(sh.opts.fsync, f.readback.is_some()) {
            let temp = f.tmp.is_some();
            let local = || match f.batch_fs {
                Some(b) => b,
                None => rustix::fs::fstatfs(file).is_ok_and(|s| decide::batch_fs(s.f_type as u64)),
            };
            if decide::batch_commit(
                sh.opts.fsync,
                temp,
                f.partial.is_some(),
                f.readback.is_some(),
            ) && local()
            {
                // Synced with its batch, then renamed (see [`super::commit`]).
                sh.commits.add(f.clone(), sh);
                return Ok(());
            }
            // The data reaches the disk before the name does: after a crash
            // the file is the old one or the new one, never a torn one.
            file.sync_data().op("fsync")?;
        }
    } else {
        f.file.durable().op("fsync")?;
    }
    commit(f, sh)
}

/// Commit `f`, whose data is durable where that was asked for: read it
/// back (`--verify`), back up and replace the old copy, and count it.
pub(super) fn commit(f: &DstFile, sh: &Shared<'_>) -> io::Result<()> {
    let e = &f.entry;
    if let (Some(_), Some(file), false) = (&f.readback, f.file.as_file(), f.stream_to) {
        if let Some(why) = super::readback::verify_on_disk(f, file)? {
            // The disk does not hold what was written: the old file stays.
            report_failure(f, sh, Failure::Other(format!("--verify: {why}")));
            return Ok(());
        }
    }
    if let (Some(t), Some(_), Some(file)) = (&f.tmp, &f.partial, f.file.as_file()) {
        if !super::partial::same_inode(t, file) {
            // Someone replaced the partial file under this run (another
            // run, a file listed under that name): never rename what was
            // not written and verified here.
            let why = Failure::Other("partial file was replaced during the run".into());
            f.fail_with(why.clone());
            report_failure(f, sh, why);
            return Ok(());
        }
    }
    if crate::interrupt::stopping() {
        // Interrupted: nothing more changes (the partial file stays).
        return Err(io::Error::other("interrupted")).op("rename into place");
    }
    if let Some(t) = &f.tmp {
        super::backup::keep_replaced(sh, &f.loc).op("back up")?;
        t.rename_to(&f.loc).op("rename into place")?;
        sh.changed(&f.loc);
        t.unregister_temp();
        if let Some(p) = &f.partial {
            p.remove_journal();
        }
    }
    if let (None, Some(p)) = (&f.tmp, &f.partial) {
        p.remove_journal();
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
pub(super) fn write_in_order(tmp: &File, size: u64, dest: &Loc) -> io::Result<()> {
    use std::io::{Read, Seek, Write};
    let mut out = dest.open_write_only().op("open for writing")?;
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
pub(super) fn store_signature(f: &DstFile, out: &SigOut) {
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
        .put(&cache_key(&f.loc.shown, &m, out.bs), &sig, &full);
}

/// Cache key of the file at `dest` with metadata `m`.
pub(super) fn cache_key(dest: &Path, m: &fs::Metadata, bs: u64) -> ferry_delta::CacheKey {
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
