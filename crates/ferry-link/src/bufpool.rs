//! A small pool of data buffers. A local run moves each 1 MiB read buffer
//! from sender to receiver; giving it back after the write saves an
//! allocation, a zero fill and a page fault per 4 KiB for every MiB copied.

use std::sync::Mutex;

/// Buffers kept at most (64 MiB of 1 MiB buffers).
const KEEP: usize = 64;

static POOL: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// A buffer of exactly `n` bytes (contents unspecified: the caller
/// overwrites them).
pub fn take(n: usize) -> Vec<u8> {
    let reused = POOL.lock().ok().and_then(|mut p| p.pop());
    match reused {
        Some(mut v) if v.capacity() >= n => {
            // Shrinking or growing within what was once written costs no
            // fill beyond the old length.
            v.resize(n, 0);
            v
        }
        _ => vec![0u8; n],
    }
}

/// Return a buffer for reuse.
pub fn give(v: Vec<u8>) {
    if v.capacity() < (256 << 10) {
        return;
    }
    if let Ok(mut p) = POOL.lock() {
        if p.len() < KEEP {
            p.push(v);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn reuses() {
        let v = super::take(1 << 20);
        let ptr = v.as_ptr();
        super::give(v);
        let w = super::take(1000);
        assert_eq!(w.len(), 1000);
        // Usually the same allocation comes back (other tests may race).
        let _ = ptr;
    }
}
