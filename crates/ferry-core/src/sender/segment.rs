//! The workers: each sends one segment at a time (its ops by `whole` or
//! `delta`, then its `SegmentDone`), and keeps the file's failure
//! bookkeeping: a file that cannot be opened or read gets a `FileFailed`
//! before its last `SegmentDone`, one that vanished or changed while it
//! was read (an application still writing) a `FileChanged`.

use std::cell::Cell;
use std::path::Path;
use std::sync::atomic::Ordering;

use crossbeam_channel::Receiver;
use ferry_link::{layout, Message, MsgTx};

use crate::error::{describe, Result};
use crate::scan;
use crate::stats::Stats;

use super::{delta, resume, whole, Held, Job, ReadHow, Table};

/// A worker thread: sends the segments queued for it until the queue
/// closes.
pub(super) fn worker(
    jobs: Receiver<Job>,
    tx: MsgTx,
    table: &Table,
    progress: Option<&Stats>,
    warn: Option<&Stats>,
    how: ReadHow,
) -> Result<()> {
    let mut buf = Vec::with_capacity(scan::CHUNK);
    for job in jobs {
        if send_segment(&job, &tx, &mut buf, how, warn)? && job.fin {
            // Never asked for again: the table lets it go.
            if let Ok(mut t) = table.lock() {
                t.remove(&job.id);
            }
        }
        if let Some(st) = progress {
            let (a, _) = layout::segment_range(job.file.size, job.seg);
            let last = job.seg + (job.holes as u64).max(1) - 1;
            let (_, b) = layout::segment_range(job.file.size, last);
            Stats::add(&st.bytes_done, b - a);
        }
    }
    Ok(())
}

/// Why a file was not sent, and whether that is a failure or the file
/// vanished or changed while it was read (a warning: the receiver keeps
/// its copy, the next run sends the new one).
#[derive(Debug, PartialEq, Eq)]
enum NotSent {
    Failed(String),
    Changed(String),
}

/// Why a file could not be opened: gone since the walk listed it (or
/// replaced by another file), or unreadable.
fn open_failure(path: &Path, e: &std::io::Error) -> NotSent {
    if e.kind() == std::io::ErrorKind::NotFound {
        NotSent::Changed(format!(
            "{}: file vanished before it was read",
            path.display()
        ))
    } else {
        NotSent::Failed(format!("read {}: {}", path.display(), describe(e)))
    }
}

/// Why a segment of a file could not be read: the file ended early (it
/// shrank after the walk), or the read failed.
fn read_failure(path: &Path, e: &std::io::Error) -> NotSent {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        NotSent::Changed(format!("{}: file shrank while being read", path.display()))
    } else {
        NotSent::Failed(format!("read {}: {}", path.display(), describe(e)))
    }
}

/// After a file's last segment: why it cannot be sent as read, given the
/// size and modification time the walk listed and its `stamp` now (see
/// [`crate::endpoint::Source::stamp`]); `None` when it was stable or
/// cannot tell.
fn changed_failure(
    path: &Path,
    listed: (u64, (i64, u32)),
    stamp: std::io::Result<Option<(u64, (i64, u32))>>,
) -> Option<NotSent> {
    match stamp {
        Ok(Some(now)) if now == listed => None,
        Ok(None) => None,
        Ok(Some(_)) => Some(NotSent::Changed(format!(
            "{}: file changed while being read",
            path.display()
        ))),
        Err(e) => Some(open_failure(path, &e)),
    }
}

/// Send one segment; true when it was the file's last.
fn send_segment(
    job: &Job,
    tx: &MsgTx,
    buf: &mut Vec<u8>,
    how: ReadHow,
    warn: Option<&Stats>,
) -> Result<bool> {
    let f = &job.file;
    let id = job.id;
    // The whole path's last op, sent with the `SegmentDone` (one hand-over
    // instead of two); anything else sent first sends it first.
    let held = Cell::new(None);
    let fail = |why: NotSent| -> Result<()> {
        if let Some(m) = held.take() {
            tx.send(m)?;
        }
        f.failed.store(true, Ordering::SeqCst);
        tx.send(match why {
            NotSent::Failed(error) => Message::FileFailed { file: id, error },
            NotSent::Changed(error) => {
                if let Some(st) = warn {
                    st.vanished(error.clone());
                }
                Message::FileChanged { file: id, error }
            }
        })?;
        Ok(())
    };
    let file = match f.reader(how.direct_io)? {
        Ok(file) => file,
        Err(e) => {
            fail(open_failure(&f.path, &e))?;
            None
        }
    };
    if job.holes > 0 {
        // Nothing to read: the receiver digests the zeros itself.
        let last = finish(job, job.holes as u64, file.as_deref(), &fail)?;
        tx.send(Message::Holes {
            file: id,
            first: job.seg as u32,
            count: job.holes,
        })?;
        return Ok(last);
    }
    let mut digest = [0u8; 32];
    if let Some(file) = &file {
        let sent = match (&job.early, &job.delta) {
            (Some(e), _) => delta::send_early_segment(job, &**file, e, tx, buf)?,
            (None, Some(d)) => delta::send_delta_segment(job, &**file, d, tx, buf)?,
            (None, None) => match job.held {
                Held::Kept(have) => resume::send_held_segment(job, &**file, have, tx, buf, &held)?,
                // A resumed file is digested throughout, even in process:
                // the receiver checks what it kept against these.
                Held::Missing => whole::send_whole_segment(job, &**file, true, tx, buf, &held)?,
                Held::Nothing => whole::send_whole_segment(job, &**file, how.hash, tx, buf, &held)?,
            },
        };
        match sent {
            Ok(d) => digest = d,
            Err(e) => fail(read_failure(&f.path, &e))?,
        }
    }
    let last = finish(job, 1, file.as_deref(), &fail)?;
    let done = Message::SegmentDone {
        file: id,
        segment: job.seg as u32,
        digest,
    };
    match held.take() {
        Some(m) => tx.send_then(m, done)?,
        None => tx.send(done)?,
    }
    Ok(last)
}

/// `n` segments of the job's file are sent but for their `SegmentDone`
/// (or `Holes`): true when they were its last, which first checks that
/// the file was stable while it was read (a `FileChanged` before the last
/// done) and lets it go.
fn finish(
    job: &Job,
    n: u64,
    file: Option<&dyn crate::endpoint::Source>,
    fail: &dyn Fn(NotSent) -> Result<()>,
) -> Result<bool> {
    let f = &job.file;
    let last = f.remaining.fetch_sub(n, Ordering::SeqCst) == n;
    if last {
        if let Some(file) = file {
            if !f.failed.load(Ordering::SeqCst) {
                if let Some(error) = changed_failure(&f.path, (f.size, f.mtime), file.stamp()) {
                    fail(error)?;
                }
            }
        }
        f.release();
    }
    Ok(last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Error, ErrorKind};

    const LISTED: (u64, (i64, u32)) = (4096, (1_700_000_000, 5));

    fn failed(s: &str) -> NotSent {
        NotSent::Failed(s.into())
    }

    fn changed(s: &str) -> NotSent {
        NotSent::Changed(s.into())
    }

    #[test]
    fn a_short_read_means_the_file_shrank() {
        let p = Path::new("src/a.bin");
        let eof = Error::from(ErrorKind::UnexpectedEof);
        assert_eq!(
            read_failure(p, &eof),
            changed("src/a.bin: file shrank while being read")
        );
        let denied = Error::from(ErrorKind::PermissionDenied);
        assert_eq!(
            read_failure(p, &denied),
            failed("read src/a.bin: permission denied")
        );
        // Opening is not reading: no "shrank" there.
        assert_eq!(
            open_failure(p, &denied),
            failed("read src/a.bin: permission denied")
        );
        // Gone since the walk: an application removed it meanwhile.
        let gone = Error::from(ErrorKind::NotFound);
        assert_eq!(
            open_failure(p, &gone),
            changed("src/a.bin: file vanished before it was read")
        );
    }

    #[test]
    fn a_file_stable_while_read_is_not_failed() {
        let p = Path::new("f");
        assert_eq!(changed_failure(p, LISTED, Ok(Some(LISTED))), None);
        // A device or an NBD export cannot tell: taken as stable.
        assert_eq!(changed_failure(p, LISTED, Ok(None)), None);
    }

    #[test]
    fn a_file_changed_while_read_is_a_warning() {
        let p = Path::new("f");
        let grown = (LISTED.0 + 1, LISTED.1);
        let want = Some(changed("f: file changed while being read"));
        assert_eq!(changed_failure(p, LISTED, Ok(Some(grown))), want);
        let touched = (LISTED.0, (LISTED.1 .0, LISTED.1 .1 + 1));
        assert_eq!(changed_failure(p, LISTED, Ok(Some(touched))), want);
        let older = (LISTED.0, (LISTED.1 .0 - 1, LISTED.1 .1));
        assert_eq!(changed_failure(p, LISTED, Ok(Some(older))), want);
        let gone = changed_failure(p, LISTED, Err(Error::from(ErrorKind::NotFound)));
        assert_eq!(gone, Some(changed("f: file vanished before it was read")));
        let eio = changed_failure(p, LISTED, Err(Error::from_raw_os_error(5)));
        assert!(matches!(eio, Some(NotSent::Failed(_))));
    }
}
