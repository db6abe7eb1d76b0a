//! Buffers of READs already answered, kept for the next READs to land in.
//!
//! A fresh buffer costs a page fault (and a page cleared by the kernel)
//! for each 4 KiB the reply fills: measured with perf, a quarter of the
//! CPU of reading a 1 TiB sparse image with 1 GiB of data over a unix
//! socket went there. A reused buffer needs no clearing either: the reader
//! writes every byte of a READ's buffer (data, or zeros for a hole chunk)
//! and refuses a reply that does not cover the whole request.
//!
//! Bounded: at most [`KEEP_BYTES`] of capacity is kept, whatever the
//! server or the callers do; a buffer beyond that is freed.

use std::sync::Mutex;

/// Most capacity kept, over all buffers (what read-ahead keeps in flight
/// at the default request size, with room to spare).
pub const KEEP_BYTES: usize = 96 << 20;

struct Spare {
    bufs: Vec<Vec<u8>>,
    bytes: usize,
}

static SPARE: Mutex<Spare> = Mutex::new(Spare {
    bufs: Vec::new(),
    bytes: 0,
});

fn lock() -> std::sync::MutexGuard<'static, Spare> {
    SPARE.lock().unwrap_or_else(|p| p.into_inner())
}

/// A buffer of `n` bytes for a READ's reply: a kept one when one is large
/// enough (its old bytes are overwritten by the reply), else a new one.
pub(crate) fn read_buf(n: usize) -> Vec<u8> {
    let kept = {
        let mut s = lock();
        let i = s.bufs.iter().rposition(|b| b.capacity() >= n);
        i.map(|i| {
            let b = s.bufs.swap_remove(i);
            s.bytes -= b.capacity();
            b
        })
    };
    match kept {
        Some(mut b) => {
            // Shrinking writes nothing; growing within the capacity fills
            // only the part never used before.
            b.resize(n, 0);
            b
        }
        None => vec![0u8; n],
    }
}

/// Keep `b`, whose bytes were handed on, for a later READ.
pub(crate) fn give_back(b: Vec<u8>) {
    let mut s = lock();
    if b.capacity() > 0 && s.bytes + b.capacity() <= KEEP_BYTES {
        s.bytes += b.capacity();
        s.bufs.push(b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_buffers_are_reused_and_bounded() {
        let mut b = read_buf(4096);
        b.fill(7);
        give_back(b);
        // A kept buffer comes back sized as asked (other tests of this
        // crate may share the list: not necessarily the same one).
        let c = read_buf(100);
        assert_eq!(c.len(), 100);
        assert!(c.capacity() >= 100);
        // Far more than the bound given back: the rest is freed.
        for _ in 0..(KEEP_BYTES >> 20) + 8 {
            give_back(vec![0u8; 1 << 20]);
        }
        assert!(lock().bytes <= KEEP_BYTES);
    }
}
