//! Early deltas, on the sending side.
//!
//! When the receiver asks for a file as a delta, it signs its old copy in
//! file order and sends the signature in parts as it goes. Meanwhile the
//! sender's pre-hash thread hashes its own copy on the same block grid.
//! [`PreHash`] meets the two: as soon as both cover a segment, and most of
//! its blocks are where they were in the old copy, the segment is sent at
//! once — unchanged blocks as in-place copies, the others as literals —
//! without waiting for the rest of the signature. The receiver applies those
//! copies from its page cache, just filled by the signing, while it signs
//! on, so reading the old copy, sending the changes and writing the new
//! file overlap.
//!
//! Segments that moved (an insert shifts everything after it) wait for the
//! whole signature and the matcher, which finds blocks at any offset. After
//! a few such segments in a row the pre-hash stops, so a shifted file is
//! not read twice; it is also held a few segments ahead of the signature,
//! so the verdict comes before it has read much.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use ferry_link::layout;

/// At least this share (in quarters) of a segment's blocks must be in
/// place, unchanged, for it to go early; the rest goes as literals.
const EARLY_QUARTERS: u64 = 3;

/// The pre-hash stops after this many segments in a row that were not in
/// place: the file moved, and the matcher reads it anyway.
const STOP_AFTER_MISSES: u32 = 3;

/// How far, in segments, the pre-hash may run ahead of the signature.
const LEAD_SEGMENTS: u64 = 4;

/// One segment to send before the signature is complete.
pub(crate) struct EarlySeg {
    pub seg: u64,
    /// Per block of the segment: unchanged and in place (not a zero block).
    pub same: Vec<bool>,
    /// The source's hashes of the segment's blocks.
    pub hashes: Vec<[u8; 32]>,
}

type Sink = Box<dyn Fn(EarlySeg) + Send>;

/// A delta source's block hashes and the receiver's signature so far.
/// Made on first use: the sender keeps one per listed file, and most are
/// never asked for (a million unchanged files would otherwise hold a
/// million of these).
#[derive(Default)]
pub(crate) struct PreHash(std::sync::OnceLock<Box<PreHashState>>);

#[derive(Default)]
pub(crate) struct PreHashState {
    st: Mutex<Pre>,
    cv: Condvar,
}

impl std::ops::Deref for PreHash {
    type Target = PreHashState;
    fn deref(&self) -> &PreHashState {
        self.0.get_or_init(Box::default)
    }
}

#[derive(Default, PartialEq, Eq, Clone, Copy)]
enum Phase {
    /// Not asked for (whole files, small files).
    #[default]
    Idle,
    Running,
    Done,
    /// Could not read the source: segments read it themselves.
    Failed,
}

#[derive(Default)]
struct Pre {
    phase: Phase,
    size: u64,
    bs: u64,
    /// Hashes of the source's first blocks on the delta grid.
    hashes: Vec<[u8; 32]>,
    /// The receiver's strong hashes of its old copy, as far as received.
    strong: Vec<[u8; 16]>,
    /// Size of the old copy, known with the first signature part.
    basis_size: Option<u64>,
    /// Segments below this have been judged.
    next_seg: u64,
    /// Per segment: sent early.
    early: Vec<bool>,
    /// Segments in a row judged not in place.
    misses: u32,
    /// The signature is complete (or the session over): no more early
    /// segments; the rest go through the matcher.
    closed: bool,
    sink: Option<Sink>,
    /// Hash of an all-zero block of `bs` bytes.
    zero: [u8; 32],
}

impl PreHash {
    fn lock(&self) -> Option<MutexGuard<'_, Pre>> {
        self.st.lock().ok()
    }

    /// The state even after a thread panicked holding it: for the calls
    /// that only stop things (close, abandon, finish). Were they no-ops
    /// then, the sink (a clone of the workers' job queue) would outlive
    /// the session and the workers would wait on it for ever.
    fn lock_to_stop(&self) -> MutexGuard<'_, Pre> {
        self.st
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Start pre-hashing a file of `size` bytes on delta blocks of `bs`;
    /// early segments go to `sink`.
    pub fn start(&self, size: u64, bs: u64, sink: Sink) {
        if let Some(mut g) = self.lock() {
            *g = Pre {
                phase: Phase::Running,
                size,
                bs,
                early: vec![false; layout::segment_count(size) as usize],
                sink: Some(sink),
                zero: layout::zero_block_hash(bs),
                ..Pre::default()
            };
        }
    }

    /// The source's hashes of the next segment.
    pub fn push(&self, hashes: impl IntoIterator<Item = [u8; 32]>) {
        if let Some(mut g) = self.lock() {
            g.hashes.extend(hashes);
            g.advance();
        }
        self.cv.notify_all();
    }

    /// The next part of the receiver's signature.
    pub fn offer(&self, basis_size: u64, strong: &[[u8; 16]]) {
        if let Some(mut g) = self.lock() {
            if g.phase == Phase::Idle {
                return;
            }
            g.basis_size = Some(basis_size);
            g.strong.extend_from_slice(strong);
            g.advance();
        }
        self.cv.notify_all();
    }

    /// The signature is complete (or will not be): no more early segments.
    /// Returns which segments went early.
    pub fn close(&self) -> Vec<bool> {
        let early = {
            let mut g = self.lock_to_stop();
            g.closed = true;
            g.sink = None;
            g.early.clone()
        };
        self.cv.notify_all();
        early
    }

    /// The signature will not complete (the receiver could not read its
    /// old copy): no more early segments, and the pre-hash stops.
    pub fn abandon(&self) {
        self.lock_to_stop().misses = STOP_AFTER_MISSES;
        self.close();
    }

    /// The pre-hash stopped: `ok` if what it hashed can be used.
    pub fn finish(&self, ok: bool) {
        self.lock_to_stop().phase = if ok { Phase::Done } else { Phase::Failed };
        self.cv.notify_all();
    }

    /// Whether the pre-hash should hash another segment: not once the file
    /// proved to have moved, and not while it is far ahead of the
    /// signature (it waits, until `over` is set).
    pub fn go_on(&self, over: &AtomicBool) -> bool {
        let Some(mut g) = self.lock() else {
            return false;
        };
        loop {
            if g.misses >= STOP_AFTER_MISSES {
                return false;
            }
            // The session is over (the requests ended): nothing more to
            // hash for it, however far the signature came.
            if over.load(Ordering::SeqCst) {
                return false;
            }
            let lead = LEAD_SEGMENTS * layout::SEGMENT / g.bs.max(1);
            if g.closed || (g.hashes.len() as u64) < g.strong.len() as u64 + lead {
                return true;
            }
            g = match self.cv.wait_timeout(g, Duration::from_millis(50)) {
                Ok((g, _)) => g,
                Err(_) => return false,
            };
        }
    }

    /// The source's hashes of blocks `[k0, k1)` and of the blocks either
    /// side when known, once the pre-hash has them: `(first, hashes)` with
    /// `hashes[i]` the hash of block `first + i`. `None` if it was not asked
    /// for, failed, or stopped short of them.
    pub fn hashes_for(&self, k0: u64, k1: u64) -> Option<(u64, Vec<[u8; 32]>)> {
        let mut g = self.lock()?;
        while g.phase == Phase::Running && (g.hashes.len() as u64) < k1 + 1 {
            g = self.cv.wait(g).ok()?;
        }
        let have = g.hashes.len() as u64;
        if g.phase == Phase::Idle || g.phase == Phase::Failed || have < k1 {
            return None;
        }
        let lo = k0.saturating_sub(1);
        Some((
            lo,
            g.hashes[lo as usize..(k1 + 1).min(have) as usize].to_vec(),
        ))
    }
}

impl Pre {
    /// Judge every segment that both sides now cover, in order.
    fn advance(&mut self) {
        let Some(basis_size) = self.basis_size else {
            return;
        };
        if self.closed || self.sink.is_none() || self.bs == 0 {
            return;
        }
        let bs = self.bs;
        let nbasis = basis_size.div_ceil(bs);
        let nseg = layout::segment_count(self.size);
        while self.next_seg < nseg {
            let seg = self.next_seg;
            let (start, end) = layout::segment_range(self.size, seg);
            let (k0, k1) = (start / bs, end.div_ceil(bs));
            if (self.hashes.len() as u64) < k1 || (self.strong.len() as u64) < k1.min(nbasis) {
                return;
            }
            let mut in_place = 0u64;
            let mut same = Vec::with_capacity((k1 - k0) as usize);
            for k in k0..k1 {
                let len = (self.size - k * bs).min(bs);
                let h = &self.hashes[k as usize];
                let eq = k < nbasis
                    && (basis_size - k * bs).min(bs) == len
                    && ferry_delta::sig::short(h) == self.strong[k as usize];
                // Zero blocks in place count as unchanged but are sent as
                // zero runs, so that holes stay holes.
                let zero = eq
                    && if len == bs {
                        *h == self.zero
                    } else {
                        *h == layout::zero_block_hash(len)
                    };
                in_place += eq as u64;
                same.push(eq && !zero);
            }
            self.next_seg += 1;
            if in_place * 4 >= (k1 - k0) * EARLY_QUARTERS {
                self.misses = 0;
                self.early[seg as usize] = true;
                let hashes = self.hashes[k0 as usize..k1 as usize].to_vec();
                if let Some(sink) = &self.sink {
                    sink(EarlySeg { seg, same, hashes });
                }
            } else {
                self.misses += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    const BS: u64 = 64 << 10;
    const PER_SEG: usize = (layout::SEGMENT / BS) as usize;

    fn h(i: usize) -> [u8; 32] {
        layout::block_hash(&i.to_le_bytes())
    }

    fn strong(hs: &[[u8; 32]]) -> Vec<[u8; 16]> {
        hs.iter().map(ferry_delta::sig::short).collect()
    }

    fn started(size: u64) -> (PreHash, mpsc::Receiver<EarlySeg>) {
        let p = PreHash::default();
        let (tx, rx) = mpsc::channel();
        let tx = Mutex::new(tx);
        p.start(
            size,
            BS,
            Box::new(move |e| {
                if let Ok(t) = tx.lock() {
                    let _ = t.send(e);
                }
            }),
        );
        (p, rx)
    }

    #[test]
    fn segments_in_place_go_once_both_sides_cover_them() {
        let size = 3 * layout::SEGMENT + 1000;
        let n = size.div_ceil(BS) as usize;
        let new: Vec<[u8; 32]> = (0..n).map(h).collect();
        let mut old = new.clone();
        old[3] = h(1_000_000); // segment 0: one block changed
        for b in &mut old[PER_SEG..2 * PER_SEG] {
            *b = h(2_000_000); // segment 1: rewritten
        }
        let (p, rx) = started(size);
        // The source is ahead; nothing goes before the signature covers it.
        p.push(new[..2 * PER_SEG].iter().copied());
        assert!(rx.try_recv().is_err());
        p.offer(size, &strong(&old[..PER_SEG - 1]));
        assert!(rx.try_recv().is_err(), "segment 0 not yet covered");
        p.offer(size, &strong(&old[PER_SEG - 1..2 * PER_SEG]));
        let e = rx.try_recv().expect("segment 0 early");
        assert_eq!(e.seg, 0);
        assert_eq!(e.same.iter().filter(|s| !**s).count(), 1);
        assert!(!e.same[3]);
        assert_eq!(e.hashes, new[..PER_SEG]);
        assert!(rx.try_recv().is_err(), "segment 1 moved: it waits");
        // The signature is now ahead; the source catches up.
        p.offer(size, &strong(&old[2 * PER_SEG..]));
        p.push(new[2 * PER_SEG..].iter().copied());
        let segs: Vec<u64> = rx.try_iter().map(|e| e.seg).collect();
        assert_eq!(segs, [2, 3]);
        assert_eq!(p.close(), [true, false, true, true]);
        p.finish(true);
        let (first, hs) = p
            .hashes_for(PER_SEG as u64, 2 * PER_SEG as u64)
            .expect("hashes");
        assert_eq!(first, PER_SEG as u64 - 1);
        assert_eq!(hs, new[PER_SEG - 1..2 * PER_SEG + 1]);
        let last = n as u64;
        let (first, hs) = p.hashes_for(last - 2, last).expect("hashes");
        assert_eq!((first, hs.as_slice()), (last - 3, &new[n - 3..]));
    }

    #[test]
    fn a_shifted_file_stops_the_prehash_and_closing_ends_early_sends() {
        let size = 16 * layout::SEGMENT;
        let n = size.div_ceil(BS) as usize;
        let new: Vec<[u8; 32]> = (0..n).map(h).collect();
        let old: Vec<[u8; 32]> = (0..n).map(|i| h(i + 1)).collect();
        let (p, rx) = started(size);
        let over = AtomicBool::new(false);
        let mut pushed = 0;
        while p.go_on(&over) {
            if pushed == 0 {
                p.offer(size, &strong(&old[..8 * PER_SEG]));
            }
            p.push(new[pushed..pushed + PER_SEG].iter().copied());
            pushed += PER_SEG;
            assert!(pushed < n, "never stopped");
        }
        assert_eq!(pushed, STOP_AFTER_MISSES as usize * PER_SEG);
        assert!(rx.try_recv().is_err());
        // Segments it hashed are served; those past where it stopped not.
        let seg = PER_SEG as u64;
        assert!(p.hashes_for(seg, 2 * seg).is_some());
        p.finish(true);
        assert!(p.hashes_for(2 * seg, 3 * seg).is_some());
        assert!(p.hashes_for(3 * seg, 4 * seg).is_none());
        p.close();
        p.offer(size, &strong(&old[8 * PER_SEG..]));
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn the_prehash_waits_for_the_signature_until_the_session_is_over() {
        let size = 64 * layout::SEGMENT;
        let (p, _rx) = started(size);
        let over = AtomicBool::new(false);
        for _ in 0..LEAD_SEGMENTS {
            assert!(p.go_on(&over));
            p.push((0..PER_SEG).map(h));
        }
        std::thread::scope(|s| {
            let t = s.spawn(|| p.go_on(&over));
            std::thread::sleep(Duration::from_millis(120));
            assert!(!t.is_finished(), "ran ahead of the signature");
            over.store(true, Ordering::SeqCst);
            assert!(!t.join().expect("join"));
        });
        // A closed file (complete signature) is hashed to the end while
        // the session lasts ...
        let running = AtomicBool::new(false);
        p.close();
        assert!(p.go_on(&running));
        // ... not once it is over: the workers that would use the hashes
        // are gone (a receiver that hangs up after its signatures does not
        // keep the sender reading).
        assert!(!p.go_on(&over));
        // One whose signature will never complete is not.
        p.abandon();
        assert!(!p.go_on(&running));
    }

    #[test]
    fn zero_blocks_in_place_count_as_unchanged_but_are_not_copied() {
        let size = layout::SEGMENT;
        let zero = layout::zero_block_hash(BS);
        let new: Vec<[u8; 32]> = (0..PER_SEG)
            .map(|i| if i < 10 { zero } else { h(i) })
            .collect();
        let (p, rx) = started(size);
        p.push(new.iter().copied());
        p.offer(size, &strong(&new));
        let e = rx.try_recv().expect("early");
        assert!(e.same[..10].iter().all(|s| !s));
        assert!(e.same[10..].iter().all(|s| *s));
    }

    #[test]
    fn a_panic_under_the_lock_still_lets_close_drop_the_sink() {
        let (p, rx) = started(4 * layout::SEGMENT);
        let poison = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _g = p.st.lock().unwrap();
            panic!("a panic while the state is held");
        }));
        assert!(poison.is_err() && p.st.is_poisoned());
        p.abandon();
        // The sink, and the queue it held, are gone.
        let got = rx.recv_timeout(Duration::from_secs(5));
        assert!(matches!(got, Err(mpsc::RecvTimeoutError::Disconnected)));
        p.finish(false);
        assert!(p.hashes_for(0, 1).is_none());
    }
}
