//! Reading a segment of a file as data runs and zero runs, and digesting it.
//!
//! Only data extents are read (`SEEK_DATA`/`SEEK_HOLE`); inside what is
//! read, every aligned 4 KiB grain of zeros is reported as zeros, so holes
//! and written zeros alike never cross the wire and end up as holes.

use std::io;

use ferry_link::layout::{self, SegmentHasher, ZERO_GRAIN};

use crate::endpoint::Source;

/// Largest read, and largest data run reported at once.
pub const CHUNK: usize = 1 << 20;

/// A piece of a segment, in offset order.
pub enum Piece<'a> {
    /// Data at an offset, borrowed from the scan buffer.
    Data(u64, &'a [u8]),
    /// Data at an offset that filled a whole read: the buffer itself, so a
    /// sender can move it into a message without copying.
    Owned(u64, Vec<u8>),
    Zero(u64, u64),
    /// Zeros the source's guest does not use (`--sparsify`): see
    /// [`Source::unused`].
    Unused(u64, u64),
}

/// Emit the zero run `[z, upto)` as `Zero` pieces and, where `unused`
/// covers it, `Unused` pieces.
fn emit_zeros<E>(
    z: u64,
    upto: u64,
    unused: Option<&ferry_guest::Ranges>,
    emit: &mut dyn FnMut(Piece<'_>) -> Result<(), E>,
) -> Result<(), E> {
    let Some(unused) = unused else {
        return emit(Piece::Zero(z, upto - z));
    };
    let mut pos = z;
    while pos < upto {
        match unused.first_ending_after(pos) {
            Some((s, e)) if s <= pos => {
                let stop = e.min(upto);
                emit(Piece::Unused(pos, stop - pos))?;
                pos = stop;
            }
            Some((s, _)) if s < upto => {
                emit(Piece::Zero(pos, s - pos))?;
                pos = s;
            }
            _ => {
                emit(Piece::Zero(pos, upto - pos))?;
                pos = upto;
            }
        }
    }
    Ok(())
}

/// Scan segment `seg` of `file` (logical size `size`): call `emit` for each
/// maximal data or zero run (data runs at most [`CHUNK`] bytes), and return
/// the segment digest. `buf` is scratch space reused between calls.
pub fn scan_segment<E>(
    file: &dyn Source,
    size: u64,
    seg: u64,
    hash: bool,
    buf: &mut Vec<u8>,
    emit: &mut dyn FnMut(Piece<'_>) -> Result<(), E>,
) -> Result<[u8; 32], ScanError<E>> {
    let (start, end) = layout::segment_range(size, seg);
    let mut h = if hash {
        SegmentHasher::new(layout::grid_block(size))
    } else {
        SegmentHasher::disabled()
    };
    let mut zero_from: Option<u64> = None;
    let mut pos = start;
    let unused = file.unused();
    let flush_zero = |zero_from: &mut Option<u64>,
                      upto: u64,
                      emit: &mut dyn FnMut(Piece<'_>) -> Result<(), E>| {
        if let Some(z) = zero_from.take() {
            if upto > z {
                emit_zeros(z, upto, unused, emit).map_err(ScanError::Emit)?;
            }
        }
        Ok::<(), ScanError<E>>(())
    };
    while pos < end {
        let (dstart, dstop) = match file.next_data(pos, end).map_err(ScanError::Io)? {
            Some(x) => x,
            None => (end, end),
        };
        if dstart > pos {
            // A hole.
            h.zeros(dstart - pos);
            zero_from.get_or_insert(pos);
            pos = dstart;
        }
        while pos < dstop {
            let n = ((dstop - pos) as usize).min(CHUNK);
            if buf.capacity() < n {
                // The last buffer went out in a message: take a recycled one.
                *buf = ferry_link::bufpool::take(n);
            } else {
                buf.resize(n, 0);
            }
            file.read_exact_at(&mut buf[..n], pos)
                .map_err(ScanError::Io)?;
            // Split the chunk into runs of zero grains and data, on grain
            // boundaries of the file (not of the chunk).
            let mut whole: Option<u64> = None;
            let mut res = Ok(());
            grain_runs(&buf[..n], pos, |zero, i, j| {
                if res.is_err() {
                    return;
                }
                let off = pos + i as u64;
                if zero {
                    h.zeros((j - i) as u64);
                    zero_from.get_or_insert(off);
                } else {
                    res = flush_zero(&mut zero_from, off, emit);
                    h.data(&buf[i..j]);
                    if i == 0 && j == n {
                        whole = Some(off);
                    } else if res.is_ok() {
                        res = emit(Piece::Data(off, &buf[i..j])).map_err(ScanError::Emit);
                    }
                }
            });
            res?;
            if let Some(off) = whole {
                emit(Piece::Owned(off, std::mem::take(buf))).map_err(ScanError::Emit)?;
            }
            pos += n as u64;
        }
    }
    flush_zero(&mut zero_from, end, emit)?;
    Ok(h.finish().0)
}

/// Split `data`, which sits at file offset `off`, into maximal runs of
/// zero grains and of data, on [`ZERO_GRAIN`] boundaries of the file:
/// `f(is_zero, start, end)` with indexes into `data`, in order.
pub fn grain_runs(data: &[u8], off: u64, mut f: impl FnMut(bool, usize, usize)) {
    let n = data.len();
    let g = ZERO_GRAIN as usize;
    let mut i = 0usize;
    while i < n {
        let first_end =
            (((off + i as u64) / ZERO_GRAIN + 1) * ZERO_GRAIN - off).min(n as u64) as usize;
        let zero = layout::is_zero(&data[i..first_end]);
        let mut j = first_end;
        while j < n {
            let k = (j + g).min(n);
            if layout::is_zero(&data[j..k]) != zero {
                break;
            }
            j = k;
        }
        f(zero, i, j);
        i = j;
    }
}

/// Why a scan stopped.
#[derive(Debug)]
pub enum ScanError<E> {
    Io(io::Error),
    Emit(E),
}

/// Whole-file digest (as [`layout::file_digest`]), computed with up to
/// `threads` segments in parallel.
pub fn file_digest(file: &dyn Source, size: u64, threads: usize) -> io::Result<[u8; 32]> {
    use std::sync::atomic::{AtomicU64, Ordering};
    let nseg = layout::segment_count(size);
    let next = AtomicU64::new(0);
    let digests = std::sync::Mutex::new(vec![[0u8; 32]; nseg as usize]);
    let workers = threads.clamp(1, nseg.max(1) as usize);
    std::thread::scope(|s| {
        let mut handles = Vec::new();
        for _ in 0..workers {
            handles.push(s.spawn(|| -> io::Result<()> {
                let mut buf = Vec::new();
                loop {
                    let seg = next.fetch_add(1, Ordering::Relaxed);
                    if seg >= nseg {
                        return Ok(());
                    }
                    let d = scan_segment::<()>(file, size, seg, true, &mut buf, &mut |_| Ok(()))
                        .map_err(|e| match e {
                            ScanError::Io(e) => e,
                            ScanError::Emit(()) => io::Error::other("scan stopped"),
                        })?;
                    if let Ok(mut g) = digests.lock() {
                        g[seg as usize] = d;
                    }
                }
            }));
        }
        for h in handles {
            h.join()
                .map_err(|_| io::Error::other("digest worker panicked"))??;
        }
        Ok::<(), io::Error>(())
    })?;
    let d = digests
        .into_inner()
        .map_err(|_| io::Error::other("digest lock poisoned"))?;
    Ok(layout::file_digest(d.iter()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::os::unix::fs::FileExt;

    #[test]
    fn holes_and_zero_grains_become_zero_runs() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        let f = File::create(&p).unwrap();
        let size = 3 * layout::SEGMENT / 2;
        f.set_len(size).unwrap();
        f.write_all_at(&[7u8; 10_000], 100_000).unwrap();
        f.write_all_at(&[0u8; 65_536], 1 << 20).unwrap(); // written zeros
        f.write_all_at(&[5u8; 3], size - 3).unwrap();
        let f = File::open(&p).unwrap();
        let mut all = vec![0u8; size as usize];
        let mut seen = 0u64;
        let mut digests = Vec::new();
        for seg in 0..layout::segment_count(size) {
            let dg = scan_segment::<()>(&f, size, seg, true, &mut Vec::new(), &mut |p| {
                match p {
                    Piece::Data(o, b) => {
                        assert_eq!(o, seen);
                        assert!(!layout::is_zero(b));
                        all[o as usize..o as usize + b.len()].copy_from_slice(b);
                        seen += b.len() as u64;
                    }
                    Piece::Owned(o, b) => {
                        assert_eq!(o, seen);
                        all[o as usize..o as usize + b.len()].copy_from_slice(&b);
                        seen += b.len() as u64;
                    }
                    Piece::Zero(o, l) | Piece::Unused(o, l) => {
                        assert_eq!(o, seen);
                        seen += l;
                    }
                }
                Ok(())
            })
            .unwrap();
            digests.push(dg);
        }
        assert_eq!(seen, size);
        let mut expect = vec![0u8; size as usize];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut expect, 0).unwrap();
        assert!(all == expect);
        assert_eq!(
            layout::file_digest(digests.iter()),
            file_digest(&f, size, 2).unwrap()
        );
    }
}
