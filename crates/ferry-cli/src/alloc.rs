//! The process's allocator: small blocks from mimalloc, large ones from the
//! C library.
//!
//! A million-file list allocates small blocks per entry on one thread and
//! frees them on another, which glibc's arenas serialise on a lock (the
//! unchanged re-run took 4.8 s with it, 2.3 s with mimalloc; musl's
//! allocator, in the static build, is slower still). Large buffers (a
//! stream's ring blocks, data segments) go the other way: made on one
//! thread and freed on another, mimalloc keeps them for reuse by their
//! first thread, and a stream with a 256 MiB ring peaked at 387 MiB
//! against glibc's 240 MiB, which maps such blocks and unmaps them when
//! freed. mimalloc's long-standing v2 line, without transparent huge
//! pages: on a host whose memory is full of page cache, a huge-page fault
//! may stall in compaction.

use std::alloc::{GlobalAlloc, Layout, System};

use mimalloc::MiMalloc;

/// Blocks of at least this size come from the C library.
const LARGE: usize = 256 << 10;

pub struct Split;

fn large(layout: &Layout) -> bool {
    layout.size() >= LARGE
}

// SAFETY: each block is freed (or grown) by the allocator that made it:
// which one is a function of its layout's size, which the caller passes
// back unchanged; a reallocation that crosses the boundary copies into a
// block of the other allocator and frees the old one where it came from.
unsafe impl GlobalAlloc for Split {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe {
            if large(&layout) {
                System.alloc(layout)
            } else {
                MiMalloc.alloc(layout)
            }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe {
            if large(&layout) {
                System.alloc_zeroed(layout)
            } else {
                MiMalloc.alloc_zeroed(layout)
            }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from the allocator `layout` selects.
        unsafe {
            if large(&layout) {
                System.dealloc(ptr, layout)
            } else {
                MiMalloc.dealloc(ptr, layout)
            }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's guarantees; a new layout of `new_size`
        // with the same alignment is valid because theirs is.
        unsafe {
            let new = Layout::from_size_align_unchecked(new_size, layout.align());
            match (large(&layout), large(&new)) {
                (true, true) => System.realloc(ptr, layout, new_size),
                (false, false) => MiMalloc.realloc(ptr, layout, new_size),
                _ => {
                    let p = self.alloc(new);
                    if !p.is_null() {
                        std::ptr::copy_nonoverlapping(ptr, p, layout.size().min(new_size));
                        self.dealloc(ptr, layout);
                    }
                    p
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_grow_and_shrink_across_the_boundary_with_their_bytes() {
        let a = Split;
        for (from, to) in [
            (100, LARGE * 2),
            (LARGE * 2, 100),
            (LARGE - 1, LARGE),
            (10, 20),
        ] {
            let l = Layout::from_size_align(from, 16).unwrap();
            // SAFETY: a non-zero layout; every block is freed with the
            // layout it has at that point.
            unsafe {
                let p = a.alloc(l);
                assert!(!p.is_null());
                for i in 0..from {
                    *p.add(i) = i as u8;
                }
                let q = a.realloc(p, l, to);
                assert!(!q.is_null());
                for i in 0..from.min(to) {
                    assert_eq!(*q.add(i), i as u8, "{from} -> {to} at {i}");
                }
                a.dealloc(q, Layout::from_size_align(to, 16).unwrap());
            }
        }
        let v: Vec<u8> = (0..LARGE * 3).map(|i| i as u8).collect();
        assert_eq!(v[LARGE * 2 + 5], (LARGE * 2 + 5) as u8);
    }
}
