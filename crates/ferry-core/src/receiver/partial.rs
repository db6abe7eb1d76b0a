//! Partial files: a large file is received into `.NAME.ferry-partial`
//! beside its destination, with the journal of [`crate::journal`] in
//! `.NAME.ferry-journal`, so that a run that is killed, cut off or
//! interrupted leaves what it wrote for the next run to resume.
//!
//! The partial file is locked (`flock`) while a run writes it: a second
//! ferry writing the same destination at the same time uses a temporary
//! file of its own instead. Both names are reached through the
//! destination directory's handle like every other entry.
//!
//! A block device or an NBD export is written in place: there is no
//! partial file, and its journal is kept (and locked) in the directory
//! `--partial-dir` names, under a name made from the device's path or the
//! export's URI; kept segments are read back through the [`Sink`].

use super::*;

use std::ffi::{OsStr, OsString};

use crate::journal::{self, Identity, Journal};

/// Files smaller than this get no partial file: sending them again costs
/// less than a journal (a tree of small files resumes by the normal
/// comparison of each file).
pub(crate) const MIN_SIZE: u64 = 32 << 20;
/// Kept segments offered to the sender per `Have` part.
const HAVE_PART: usize = 4096;

fn with_suffix(name: &OsStr, suffix: &str) -> Option<OsString> {
    let mut n = b".".to_vec();
    n.extend_from_slice(name.as_bytes());
    n.extend_from_slice(suffix.as_bytes());
    (n.len() <= 255).then(|| OsString::from_vec(n))
}

/// `.NAME.ferry-partial`, unless that is too long a name.
pub(crate) fn partial_name(name: &OsStr) -> Option<OsString> {
    with_suffix(name, ".ferry-partial")
}

/// `.NAME.ferry-journal`, unless that is too long a name.
pub(crate) fn journal_name(name: &OsStr) -> Option<OsString> {
    with_suffix(name, ".ferry-journal")
}

/// The journal's name for a device written in place at `shown`: its path
/// with `/` as `_`, `.ferry-journal` added (a BLAKE3 of the path when
/// that is too long a name).
pub(crate) fn device_journal_name(shown: &Path) -> OsString {
    let mut n: Vec<u8> = shown
        .as_os_str()
        .as_bytes()
        .iter()
        .map(|&b| if b == b'/' { b'_' } else { b })
        .collect();
    if n.len() > 200 {
        n = blake3::hash(&n).to_hex().as_bytes().to_vec();
    }
    n.extend_from_slice(b".ferry-journal");
    OsString::from_vec(n)
}

/// Take the partial file's lock without waiting; `false` when another run
/// holds it, or the filesystem has no locks (two runs could then write
/// one partial file: such a run uses a temporary file of its own).
fn try_lock(f: &File) -> bool {
    use rustix::fs::FlockOperation;
    rustix::fs::flock(f, FlockOperation::NonBlockingLockExclusive).is_ok()
}

/// Whether the name `at` still names the inode `f` holds (not replaced
/// since it was opened: a lock taken on a file that another run then
/// renamed into place or removed locks nothing of ours).
pub(super) fn same_inode(at: &Loc, f: &File) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (at.stat(), f.metadata()) {
        (Ok(Some(a)), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Whether an existing partial or journal file may be taken over: a
/// regular file of this user with no other name (a hard link planted
/// there would make this run write someone else's file).
fn ours(f: &File) -> bool {
    use std::os::unix::fs::MetadataExt;
    f.metadata().is_ok_and(|m| {
        m.is_file() && m.nlink() == 1 && m.uid() == rustix::process::geteuid().as_raw()
    })
}

/// How long a partial file held by another process is waited for: the
/// remote side of an attempt that lost its link may still be on its way
/// out (it stops at its own `--timeout`) when the next attempt arrives.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Take the lock, waiting up to [`LOCK_WAIT`] for a holder to go.
fn lock_soon(f: &File) -> bool {
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        if try_lock(f) {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

fn read_journal(jloc: &Loc) -> Option<Journal> {
    use std::io::Read;
    let f = jloc.open(false).ok()?;
    let mut b = Vec::new();
    f.take(journal::MAX_LEN).read_to_end(&mut b).ok()?;
    journal::parse(&b).ok()
}

/// The journal being appended to.
struct JournalW {
    file: File,
    check: [u8; 8],
    len: u64,
    /// Segments complete since the last append, with their bytes.
    pending: Vec<(u64, [u8; 32])>,
    pending_bytes: u64,
    /// When the last batch was appended (or the journal begun).
    last: std::time::Instant,
    /// Someone is syncing and appending a batch.
    syncing: bool,
}

/// The partial state of one file being received.
pub(super) struct Partial {
    journal: Loc,
    /// The journal's segments from the interrupted run, in order, with the
    /// digests it recorded: offered to the sender (a resume).
    offer: Vec<(u64, [u8; 32])>,
    pub(super) resumed: bool,
    w: Mutex<JournalW>,
    /// Its file's place among those an interrupt records (see
    /// [`super::live`]).
    pub(super) live: super::live::Key,
}

impl Drop for Partial {
    fn drop(&mut self) {
        super::live::forget(self.live);
    }
}

impl Partial {
    /// Segment `seg` is written and verified (`digest`: its digest on the
    /// file's grid, or zeros when not known); `dirty`: the bytes of data it
    /// wrote. Every [`journal::SYNC_EVERY`] bytes of data, or
    /// [`journal::SYNC_RECORDS`] segments (runs of holes), or with the
    /// first segment [`journal::SYNC_AFTER`] after the last append, the data is
    /// fdatasync'd and the segments complete before that are appended to
    /// the journal. Counting data, not segment lengths, keeps a terabyte of
    /// holes from costing an `fdatasync` every 64 MiB of them.
    pub(super) fn segment_done(&self, data: &dyn Sink, seg: u64, digest: [u8; 32], dirty: u64) {
        let batch = {
            let Ok(mut w) = self.w.lock() else { return };
            w.pending.push((seg, digest));
            w.pending_bytes += dirty;
            let since = w.last.elapsed();
            if w.syncing || !journal::sync_due(w.pending_bytes, w.pending.len(), since) {
                return;
            }
            w.syncing = true;
            w.pending_bytes = 0;
            std::mem::take(&mut w.pending)
        };
        // Synced before it is recorded: a record never names data that a
        // crash could lose (and a kill loses nothing from the page cache).
        let synced = data.durable().is_ok();
        if let Ok(mut w) = self.w.lock() {
            if synced {
                append(&mut w, &batch);
            }
            w.syncing = false;
        }
    }

    /// Record what is complete so far (the run is ending without the file).
    pub(super) fn flush(&self, data: &dyn Sink) {
        let Ok(mut w) = self.w.lock() else { return };
        if w.pending.is_empty() || data.durable().is_err() {
            return;
        }
        let batch = std::mem::take(&mut w.pending);
        append(&mut w, &batch);
    }

    /// Remove the journal (the file is committed, or failed).
    pub(super) fn remove_journal(&self) {
        let _ = self.journal.remove_file();
    }
}

fn append(w: &mut JournalW, batch: &[(u64, [u8; 32])]) {
    let mut b = Vec::with_capacity(batch.len() * journal::RECORD_LEN);
    for (seg, d) in batch {
        b.extend_from_slice(&journal::record(&w.check, *seg, d));
    }
    // A journal that cannot be written only costs a resend next time.
    if w.file.write_all_at(&b, w.len).is_ok() {
        w.len += b.len() as u64;
    }
    w.last = std::time::Instant::now();
}

impl Dispatcher<'_, '_> {
    /// `--no-partial`: remove what an interrupted run left for `dest`
    /// (unless a run under way holds it).
    pub(super) fn drop_partial(&self, dest: &Loc) {
        let (Some(pn), Some(jn)) = (partial_name(dest.name()), journal_name(dest.name())) else {
            return;
        };
        let ploc = dest.sibling(&pn);
        if let Ok(f) = ploc.open(false) {
            if !try_lock(&f) {
                return;
            }
            if ploc.remove_file().is_ok() {
                self.sh.changed(&ploc);
            }
        }
        let _ = dest.sibling(&jn).remove_file();
    }

    /// The partial file to receive `e` into at `dest`: the one an
    /// interrupted run left, resumed, when its journal describes this
    /// source; else one started afresh. `None` (a temporary file of this
    /// run instead) when the name is too long, another run holds it, or it
    /// cannot be made.
    pub(super) fn open_partial(
        &mut self,
        e: &Entry,
        dest: &Loc,
        may_resume: bool,
    ) -> Option<(File, Loc, Partial)> {
        let pn = partial_name(dest.name())?;
        let jn = journal_name(dest.name())?;
        let (ploc, jloc) = (dest.sibling(&pn), dest.sibling(&jn));
        let want = Identity {
            size: e.size,
            mtime: e.mtime,
            mtime_nsec: e.mtime_nsec,
            name: dest.name().as_bytes().to_vec(),
        };
        let (header, check) = journal::header(&want)?;
        let found = match ploc.open(true) {
            Ok(f) if ours(&f) => Some(f),
            // Not a file this run may take over: it goes, and a new one
            // is made (never written through another name).
            Ok(_) => {
                ploc.remove_file().ok()?;
                None
            }
            Err(err) if err.kind() == io::ErrorKind::NotFound => None,
            // A symlink or something else in the way: leave it to the
            // temporary file of this run.
            Err(_) => return None,
        };
        let (f, offer) = match found {
            Some(f) => {
                if !lock_soon(&f) || !same_inode(&ploc, &f) {
                    return None;
                }
                let len = f.metadata().ok()?.len();
                let journal = read_journal(&jloc)
                    .filter(|_| may_resume)
                    .filter(|j| journal::resumable(j, &want, len));
                match journal {
                    Some(j) => (f, j.segments.into_iter().collect::<Vec<_>>()),
                    // Another source, a journal that cannot be read, or a
                    // delta chosen instead: nothing in the file is trusted.
                    None => {
                        f.set_len(0).ok()?;
                        (f, Vec::new())
                    }
                }
            }
            None => {
                self.clean_stale_temps(dest);
                let f = ploc.create_new(0o600).ok()?;
                self.sh.changed(&ploc);
                if !try_lock(&f) {
                    let _ = ploc.remove_file();
                    return None;
                }
                (f, Vec::new())
            }
        };
        if offer.is_empty() {
            f.set_len(e.size).ok()?;
        }
        let _ = jloc.remove_file();
        let jf = jloc.create_new(0o600).ok()?;
        Some((f, ploc, Partial::start(jloc, jf, (header, check), offer)?))
    }

    /// `--partial-dir DIR`: the journal of the block device `dest`, written
    /// in place, kept in DIR: resumed when it describes this source, else
    /// started afresh. `None` (no journal) when DIR cannot hold it or
    /// another run holds it.
    pub(super) fn open_device_journal(
        &mut self,
        e: &Entry,
        dest: &Loc,
        dir: &Path,
    ) -> Option<Partial> {
        let name = device_journal_name(&dest.shown);
        let want = Identity {
            size: e.size,
            mtime: e.mtime,
            mtime_nsec: e.mtime_nsec,
            name: name.as_bytes().to_vec(),
        };
        let head = journal::header(&want)?;
        let jloc = DestDir::open(dir).ok()?.loc(name.as_bytes(), false).ok()?;
        let (jf, offer) = match jloc.open(true) {
            Ok(jf) if !ours(&jf) => {
                jloc.remove_file().ok()?;
                let jf = jloc.create_new(0o600).ok()?;
                if !try_lock(&jf) {
                    return None;
                }
                (jf, Vec::new())
            }
            Ok(jf) => {
                if !lock_soon(&jf) || !same_inode(&jloc, &jf) {
                    return None;
                }
                let offer = read_journal(&jloc)
                    .filter(|j| journal::resumable(j, &want, e.size))
                    .map(|j| j.segments.into_iter().collect())
                    .unwrap_or_default();
                // Written afresh through the locked descriptor.
                jf.set_len(0).ok()?;
                (jf, offer)
            }
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                let jf = jloc.create_new(0o600).ok()?;
                if !try_lock(&jf) {
                    return None;
                }
                (jf, Vec::new())
            }
            Err(_) => return None,
        };
        Partial::start(jloc, jf, head, offer)
    }
}

impl Partial {
    /// A journal written afresh in `jf`: its header, then the segments to
    /// re-hash (a torn record at its end would hide later appends).
    fn start(
        journal: Loc,
        jf: File,
        (header, check): (Vec<u8>, [u8; 8]),
        offer: Vec<(u64, [u8; 32])>,
    ) -> Option<Partial> {
        let mut w = JournalW {
            file: jf,
            check,
            len: 0,
            pending: Vec::new(),
            pending_bytes: 0,
            last: std::time::Instant::now(),
            syncing: false,
        };
        w.file.write_all_at(&header, 0).ok()?;
        w.len = header.len() as u64;
        append(&mut w, &offer);
        Some(Partial {
            journal,
            resumed: !offer.is_empty(),
            offer,
            w: Mutex::new(w),
            live: super::live::reserve(),
        })
    }
}

/// Resume `d`: ask for it with [`WantMode::Resume`], and offer the
/// segments the journal names. Those it recorded a digest for go at once,
/// with that digest (the sender sends the segments it lacks meanwhile, and
/// checks the others; each one it confirms is read back here and digested
/// before it counts: [`Partial::verify_kept`]). Those it recorded none for
/// (a local run digests nothing) are digested here first, and offered only
/// if they read back at all, with the digest found: a partial file changed
/// since costs those segments, not the whole file.
pub(super) fn resume_and_want(tx: &MsgTx, d: &DstFile) -> io::Result<()> {
    let Some(p) = &d.partial else {
        return Err(io::Error::other("resume without a partial file"));
    };
    let written: &dyn Sink = &*d.file;
    let link = |err: ferry_link::LinkError| io::Error::other(err.to_string());
    let id = d.entry.id;
    let size = d.entry.size;
    tx.send(Message::Want {
        file: id,
        mode: WantMode::Resume,
    })
    .map_err(link)?;
    let nseg = layout::segment_count(size);
    let reopened = reader_for(written)?;
    let file = reopened.as_ref().map_or(written, |f| f as &dyn Sink);
    let mut part = Vec::new();
    let mut hashed = 0;
    for (n, &(seg, recorded)) in p.offer.iter().enumerate() {
        let digest = if recorded == [0; 32] {
            hashed += 1;
            segment_digest(file, size, seg).op("read partial file")?
        } else {
            recorded
        };
        part.push((seg, digest));
        // Parts go as soon as hashing has something to say; the last one
        // reaches the file's end.
        if n + 1 < p.offer.len() && (part.len() == HAVE_PART || hashed == HASHED_PART) {
            hashed = 0;
            send_have(tx, id, seg + 1, &mut part).map_err(link)?;
        }
    }
    send_have(tx, id, nseg, &mut part).map_err(link)
}

/// Segments digested before a `Have` part goes.
const HASHED_PART: usize = 8;

fn send_have(
    tx: &MsgTx,
    file: u32,
    upto: u64,
    part: &mut Vec<(u64, [u8; 32])>,
) -> std::result::Result<(), ferry_link::LinkError> {
    tx.send(Message::Have(ferry_link::HavePart {
        file,
        upto,
        kept: std::mem::take(part),
    }))
}

/// A second descriptor of `written`'s inode that may read, when `written`
/// is a file that may not (a device is opened for writing only).
fn reader_for(written: &dyn Sink) -> io::Result<Option<File>> {
    let Some(written) = written.as_file() else {
        return Ok(None);
    };
    if rustix::fs::fcntl_getfl(written)
        .is_ok_and(|f| f & rustix::fs::OFlags::RWMODE == rustix::fs::OFlags::WRONLY)
    {
        use std::os::fd::AsRawFd;
        return File::open(format!("/proc/self/fd/{}", written.as_raw_fd())).map(Some);
    }
    Ok(None)
}

/// The segment digest of segment `seg` of a file of `size` bytes, as it
/// reads back from `file`.
fn segment_digest(file: &dyn Sink, size: u64, seg: u64) -> io::Result<[u8; 32]> {
    let (start, end) = layout::segment_range(size, seg);
    let mut h = SegmentHasher::new(layout::grid_block(size));
    let mut buf = vec![0u8; 1 << 20];
    let mut off = start;
    while off < end {
        let n = ((end - off) as usize).min(buf.len());
        file.read_back_at(&mut buf[..n], off)?;
        h.data(&buf[..n]);
        off += n as u64;
    }
    Ok(h.finish().0)
}

impl Partial {
    /// Whether segment `seg` was offered as held.
    pub(super) fn offered(&self, seg: u64) -> bool {
        self.offer.binary_search_by_key(&seg, |o| o.0).is_ok()
    }

    /// Read segment `seg` of a file of `size` bytes back from `written`
    /// and digest it: whether it is the sender's segment (`want`).
    pub(super) fn verify_kept(
        &self,
        written: &dyn Sink,
        size: u64,
        seg: u64,
        want: &[u8; 32],
    ) -> io::Result<bool> {
        let reopened = reader_for(written)?;
        let file = reopened.as_ref().map_or(written, |f| f as &dyn Sink);
        Ok(segment_digest(file, size, seg)? == *want)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_names_are_hidden_and_fit() {
        let n = partial_name(OsStr::new("disk.img")).unwrap();
        assert_eq!(n, ".disk.img.ferry-partial");
        let j = journal_name(OsStr::new("disk.img")).unwrap();
        assert_eq!(j, ".disk.img.ferry-journal");
        let d = device_journal_name(Path::new("/dev/loop3"));
        assert_eq!(d, "_dev_loop3.ferry-journal");
        let d = device_journal_name(Path::new(&"/x".repeat(200)));
        assert_eq!(d.len(), 64 + ".ferry-journal".len());
        let long = "x".repeat(241);
        assert!(partial_name(OsStr::new(&"x".repeat(240))).is_some());
        assert!(partial_name(OsStr::new(&long)).is_none());
        assert!(journal_name(OsStr::new(&long)).is_none());
    }
}
