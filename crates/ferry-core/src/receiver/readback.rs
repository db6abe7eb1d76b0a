//! `--verify`: a committed file read back from the disk, not the page
//! cache, and checked against the sender's segment digests again, for
//! storage that may lose or corrupt what it acknowledged.

use super::*;

use std::num::NonZeroU64;
use std::os::fd::AsRawFd;

/// Remember the sender's digest of segment `seg` for the read-back. One
/// entry per `SegmentDone` received, so what a peer can make this hold
/// grows only with what it sends.
pub(super) fn keep_digest(f: &DstFile, seg: u64, digest: [u8; 32]) {
    keep(f, (seg, 1, Some(digest)));
}

/// Remember that segments `first..first + count` are holes: one entry per
/// `Holes` message, however many segments it names.
pub(super) fn keep_holes(f: &DstFile, first: u64, count: u64) {
    keep(f, (first, count, None));
}

fn keep(f: &DstFile, e: SegDigest) {
    if let Some(d) = &f.readback {
        if let Ok(mut v) = d.lock() {
            v.push(e);
        }
    }
}

/// Read every segment of `file` (data already fdatasync'd) back from the
/// disk and hash it as the sender did. `Ok(None)` when all match, else
/// the first range that differs.
pub(super) fn verify_on_disk(f: &DstFile, file: &File) -> io::Result<Option<String>> {
    let Some(digests) = &f.readback else {
        return Ok(None);
    };
    let mut digests = digests.lock().map(|v| v.clone()).unwrap_or_default();
    digests.sort_unstable();
    // The file's own descriptor where it may read (temp files and files
    // written in place are opened read-write), else a second one (a device
    // opened write-only). The page cache's clean pages are dropped so that
    // the reads reach the device.
    let write_only = rustix::fs::fcntl_getfl(file)
        .is_ok_and(|f| f & rustix::fs::OFlags::RWMODE == rustix::fs::OFlags::WRONLY);
    let reopened;
    let r = if write_only {
        reopened = File::open(format!("/proc/self/fd/{}", file.as_raw_fd())).op("read back")?;
        &reopened
    } else {
        file
    };
    let size = f.entry.size;
    let _ = rustix::fs::fadvise(r, 0, NonZeroU64::new(size), rustix::fs::Advice::DontNeed);
    let block = f.block.load(Ordering::SeqCst);
    let left = f.left.lock().map(|l| l.clone()).unwrap_or_default();
    let mut buf = vec![0u8; 1 << 20];
    // A run of `Holes` that is all holes on the disk too costs one query,
    // however many segments it names; one with data is checked segment by
    // segment.
    let runs = digests.into_iter().filter(|&(first, count, want)| {
        let (start, _) = layout::segment_range(size, first);
        let (_, end) = layout::segment_range(size, first.saturating_add(count.saturating_sub(1)));
        !(want.is_none() && matches!(crate::fsutil::next_data(r, start, end), Ok(None)))
    });
    let segments = runs.flat_map(|(first, count, want)| {
        (first..first.saturating_add(count)).map(move |s| (s, want))
    });
    for (seg, want) in segments {
        let (start, end) = layout::segment_range(size, seg);
        // A hole on the disk reads as zeros without a read (a terabyte of
        // them in a sparse image): digested as zeros.
        let hole = matches!(crate::fsutil::next_data(r, start, end), Ok(None));
        if hole && want.is_none() {
            continue;
        }
        let mut h = SegmentHasher::new(block);
        let mut zeros = true;
        if hole {
            h.zeros(end - start);
        } else {
            let mut off = start;
            while off < end {
                let n = ((end - off) as usize).min(buf.len());
                read_counting_left_as_zeros(r, &left, &mut buf[..n], off)?;
                zeros = zeros && layout::is_zero(&buf[..n]);
                h.data(&buf[..n]);
                off += n as u64;
            }
        }
        // A run of `Holes` must read as zeros; any other segment as the
        // sender's digest says.
        let same = match want {
            None => zeros,
            Some(want) => h.finish().0 == want,
        };
        if !same {
            return Ok(Some(format!(
                "read back from the disk, bytes {start}..{end} differ from the source"
            )));
        }
    }
    Ok(None)
}

/// Read `buf.len()` bytes at `off`, where the ranges `left` as they were
/// (unused by the source's guest) read as the zeros the sender digested.
fn read_counting_left_as_zeros(
    r: &File,
    left: &ferry_guest::Ranges,
    buf: &mut [u8],
    off: u64,
) -> io::Result<()> {
    r.read_exact_at(buf, off).op("read back")?;
    let end = off + buf.len() as u64;
    let mut pos = off;
    while pos < end {
        let Some((s, e)) = left.first_ending_after(pos).filter(|r| r.0 < end) else {
            break;
        };
        let (s, e) = (s.max(pos), e.min(end));
        buf[(s - off) as usize..(e - off) as usize].fill(0);
        pos = e;
    }
    Ok(())
}
