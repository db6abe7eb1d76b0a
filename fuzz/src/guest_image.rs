//! `guest_image`: the readers of disk images behind `--sparsify`
//! ([`ferry_guest::map_image`]: partition tables, ext2/3/4, XFS, swap) and
//! of tar archives ([`ferry_guest::tar::find_member`]), whose bytes are not
//! trusted (an image is whatever a guest, or an attacker, left in it).
//!
//! Input: `mode`, a size exponent, then records (see
//! [`crate::util::records`]) each placed in a sparse image: a record's
//! first 4 bytes are its offset in 512-byte sectors, the rest its bytes;
//! everything else reads as zeros up to the image's size (up to 1 TiB), so
//! that superblocks, group descriptors, bitmaps and B+tree blocks deep in a
//! large image are all within the fuzzer's reach. With `mode & 1` the
//! image is read as a tar archive instead.
//!
//! Whatever is returned must lie inside the image: free ranges sorted,
//! disjoint and within its size; a member's bytes within the archive.

use std::io;

use ferry_guest::{map_image, MapOptions, ReadAt};

use crate::util::records;

/// A sparse image in memory: pieces at offsets, zeros elsewhere.
struct Sparse {
    size: u64,
    pieces: Vec<(u64, Vec<u8>)>,
}

impl ReadAt for Sparse {
    fn read_exact_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        let end = off
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= self.size)
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        buf.fill(0);
        for (at, bytes) in &self.pieces {
            let pend = at + bytes.len() as u64;
            if pend <= off || *at >= end {
                continue;
            }
            let s = (*at).max(off);
            let e = pend.min(end);
            buf[(s - off) as usize..(e - off) as usize]
                .copy_from_slice(&bytes[(s - at) as usize..(e - at) as usize]);
        }
        Ok(())
    }
    fn size(&self) -> u64 {
        self.size
    }
}

pub fn run(data: &[u8]) {
    let [mode, exp, rest @ ..] = data else {
        return;
    };
    let size = 1u64 << (12 + u32::from(*exp % 29));
    let mut pieces = Vec::new();
    for r in records(rest) {
        if r.len() < 4 {
            continue;
        }
        let at = u64::from(u32::from_le_bytes([r[0], r[1], r[2], r[3]])) * 512;
        if at < size {
            pieces.push((at, r[4..].to_vec()));
        }
    }
    let img = Sparse { size, pieces };
    if mode & 1 != 0 {
        if let Ok(m) = ferry_guest::tar::find_member(&img, "disk.img") {
            assert!(m.offset.checked_add(m.size).is_some_and(|e| e <= size));
        }
        return;
    }
    let force = mode & 2 != 0;
    if let Ok(map) = map_image(&img, &MapOptions { force }) {
        let mut last = 0;
        for &(s, e) in map.free.as_slice() {
            assert!(s >= last && s < e && e <= size, "free range {s}..{e} of {size}");
            last = e;
        }
    }
}
