//! Stat-ahead: a few threads that list a tree's directories and `lstat`
//! their entries a little ahead of a walk that visits them in name order,
//! so that the walk's own calls find the inodes cached.
//!
//! A walk `lstat`s one entry at a time: with a cold cache each call may
//! wait for a read of the disk, one at a time. Warmers keep several such
//! reads in flight. What they learn is thrown away: the walk still makes
//! every decision from its own calls, so a warmer can only make it faster,
//! never wrong. (A million-file tree on this project's 2-core test machine,
//! unchanged re-run with the cache dropped: 9.0 s became 7.5 s; with the
//! cache warm, the warmers stop after a few slices and it stays 2.2 s.)
//!
//! Bounded: the warmers stay at most [`LEAD`] entries (and a slice each)
//! ahead of where the walk says it is ([`Warmer::at`]), and what waits to
//! be done holds at most [`MAX_QUEUED`] bytes, the farthest work dropped
//! first. Directories are opened beneath the root without following
//! symlinks or crossing mounts, so a tree a peer shaped leads them nowhere
//! else. Errors are ignored.

mod job;

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

pub use job::Skip;
use job::{dir_key, entry_key, listing, passed, Job};

/// Warmers per tree: enough reads in flight for a disk's queue, few
/// enough to stay cheap on a small machine.
pub const THREADS: usize = 4;
/// How many entries the warmers may have warmed ahead of the walk.
pub const LEAD: u64 = 16_384;
/// Bytes of work waiting, at most.
pub const MAX_QUEUED: usize = 8 << 20;
/// After this many entries in a row warmed without waiting for the disk,
/// the tree is taken as cached and the warmers stop: on a cached tree they
/// would only double the walk's work.
const CACHED_ENTRIES: u64 = 1024;
/// The walk tells where it is at every directory and every this many
/// entries.
const EVERY: u64 = 32;

#[derive(Default)]
struct State {
    /// Work waiting, by key: the nearest first, the farthest dropped.
    jobs: BTreeMap<Vec<u8>, Job>,
    queued: usize,
    /// Slices done that the walk has not passed yet (by key: their end
    /// and size), and the sum of their sizes.
    ahead: BTreeMap<Vec<u8>, (Vec<u8>, u64)>,
    ahead_sum: u64,
    /// Warmers at work (who may still queue more).
    busy: usize,
    /// Entries in a row warmed without waiting for the disk.
    cached: u64,
}

impl State {
    /// Forget the slices the walk at `pos` has passed.
    fn retire(&mut self, pos: &[u8]) {
        let gone: Vec<Vec<u8>> = self
            .ahead
            .range::<[u8], _>((std::ops::Bound::Unbounded, std::ops::Bound::Excluded(pos)))
            .filter(|(_, (end, _))| passed(pos, end))
            .map(|(k, _)| k.clone())
            .collect();
        for k in gone {
            if let Some((_, n)) = self.ahead.remove(&k) {
                self.ahead_sum -= n;
            }
        }
    }

    /// Queue `job`, dropping the farthest work (maybe this) past the bound.
    fn queue(&mut self, key: Vec<u8>, job: Job) {
        let size = job.size(&key);
        while self.queued + size > MAX_QUEUED {
            match self.jobs.last_key_value() {
                Some((last, _)) if *last > key => {
                    if let Some((k, j)) = self.jobs.pop_last() {
                        self.queued -= j.size(&k);
                    }
                }
                _ => return,
            }
        }
        self.queued += size;
        if let Some(old) = self.jobs.insert(key.clone(), job) {
            self.queued -= old.size(&key);
        }
    }
}

struct Shared {
    root: Arc<OwnedFd>,
    /// The root's filesystem: warmers never cross into another (a mount
    /// may be slow, dead, or left out with `-x`).
    dev: u64,
    /// Where the walk is (see [`Warmer::at`]).
    pos: Mutex<Vec<u8>>,
    /// Entries the walk has told of.
    told: AtomicU64,
    state: Mutex<State>,
    cv: Condvar,
    skip: Option<Skip>,
    stop: AtomicBool,
    /// Set when the warmers stopped because the tree was cached.
    cached: AtomicBool,
    /// Whether a cached tree stops the warmers (always, but in tests).
    stop_when_cached: bool,
}

/// Warmers over one tree; stopped and joined when dropped.
pub struct Warmer {
    shared: Arc<Shared>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Warmer {
    /// Start `threads` warmers on the tree whose root is `root`, leaving
    /// alone the directories `skip` names.
    pub fn start(root: Arc<OwnedFd>, threads: usize, skip: Option<Skip>) -> Warmer {
        Self::spawn(root, threads, skip, true)
    }

    fn spawn(
        root: Arc<OwnedFd>,
        threads: usize,
        skip: Option<Skip>,
        stop_when_cached: bool,
    ) -> Warmer {
        let mut state = State::default();
        let (key, job) = listing(Vec::new());
        state.queue(key, job);
        #[allow(clippy::unnecessary_cast)]
        let dev = rustix::fs::fstat(&*root).map_or(0, |st| st.st_dev as u64);
        let shared = Arc::new(Shared {
            root,
            dev,
            pos: Mutex::new(Vec::new()),
            told: AtomicU64::new(0),
            state: Mutex::new(state),
            cv: Condvar::new(),
            skip,
            stop: AtomicBool::new(false),
            cached: AtomicBool::new(false),
            stop_when_cached,
        });
        let threads = (0..threads)
            .filter_map(|_| {
                let sh = shared.clone();
                std::thread::Builder::new()
                    .name("ferry-warm".into())
                    .spawn(move || warmer(&sh))
                    .ok()
            })
            .collect();
        Warmer { shared, threads }
    }

    /// The walk is at entry `rel` (relative to the root), a directory it
    /// goes into if `is_dir`: what comes before it in the walk's order is
    /// no longer worth warming.
    pub fn at(&self, rel: &[u8], is_dir: bool) {
        // One walk tells, so a plain load and store count: a locked add
        // here cost more than the rest of the call (it waits for every
        // store of the walk before it).
        let n = self.shared.told.load(Ordering::Relaxed);
        self.shared.told.store(n + 1, Ordering::Relaxed);
        if !is_dir && !n.is_multiple_of(EVERY) {
            return;
        }
        // Stopped (the tree was cached): nobody left to tell.
        if self.shared.stop.load(Ordering::Relaxed) {
            return;
        }
        // Only advisory: never wait for a warmer that holds it.
        if let Ok(mut p) = self.shared.pos.try_lock() {
            *p = if is_dir { dir_key(rel) } else { entry_key(rel) };
        }
        self.shared.cv.notify_all();
    }

    /// Whether the warmers found the tree cached (and stopped).
    pub fn found_cached(&self) -> bool {
        self.shared.cached.load(Ordering::SeqCst)
    }
}

impl Drop for Warmer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // A warmer between its look at `stop` and its wait holds the lock.
        drop(self.shared.state.lock());
        self.shared.cv.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Voluntary context switches of this thread so far: a warmer that made
/// none while it did a slice never waited for the disk.
fn waits() -> i64 {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given; RUSAGE_THREAD reads
    // only the calling thread's counters.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, ru.as_mut_ptr()) };
    if rc != 0 {
        return -1;
    }
    // SAFETY: zeroed, then filled by a call that succeeded.
    unsafe { ru.assume_init() }.ru_nvcsw
}

fn warmer(sh: &Shared) {
    loop {
        let (key, job) = {
            let Ok(mut st) = sh.state.lock() else { return };
            loop {
                if sh.stop.load(Ordering::SeqCst) {
                    return;
                }
                if st.jobs.is_empty() && st.busy == 0 {
                    // The whole tree is warm (or given up on).
                    sh.cv.notify_all();
                    return;
                }
                let pos = sh.pos.lock().map(|p| p.clone()).unwrap_or_default();
                st.retire(&pos);
                if st.ahead_sum < LEAD {
                    if let Some((k, j)) = st.jobs.pop_first() {
                        st.queued -= j.size(&k);
                        if passed(&pos, &j.end) {
                            continue;
                        }
                        st.busy += 1;
                        break (k, j);
                    }
                }
                // Far enough ahead, or others may yet find work: the walk
                // wakes us when it moves (the timeout only as a backstop).
                st = match sh.cv.wait_timeout(st, Duration::from_millis(50)) {
                    Ok((g, _)) => g,
                    Err(_) => return,
                };
            }
        };
        let before = waits();
        let end = job.end.clone();
        let (more, warmed) = job::run(&sh.root, sh.dev, job, sh.skip.as_ref(), &sh.stop);
        let waited = before < 0 || waits() != before;
        let Ok(mut st) = sh.state.lock() else { return };
        st.busy -= 1;
        if warmed > 0 {
            st.ahead_sum += warmed;
            st.ahead.insert(key, (end, warmed));
        }
        st.cached = cached_streak(st.cached, waited, warmed);
        if sh.stop_when_cached && st.cached >= CACHED_ENTRIES {
            sh.cached.store(true, Ordering::SeqCst);
            sh.stop.store(true, Ordering::SeqCst);
        }
        for (k, j) in more {
            st.queue(k, j);
        }
        sh.cv.notify_all();
    }
}

/// Entries in a row warmed without waiting for the disk, after a job that
/// warmed `warmed` entries (a listing: none, counted as one) and `waited`
/// or not: any wait starts again.
fn cached_streak(streak: u64, waited: bool, warmed: u64) -> u64 {
    if waited {
        0
    } else {
        streak + warmed.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::job::SLICE;
    use super::*;

    fn open(p: &std::path::Path) -> Arc<OwnedFd> {
        use rustix::fs::{Mode, OFlags};
        Arc::new(rustix::fs::open(p, OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).unwrap())
    }

    fn join(mut w: Warmer) -> (u64, usize, usize) {
        for t in std::mem::take(&mut w.threads) {
            t.join().unwrap();
        }
        let st = w.shared.state.lock().unwrap();
        (st.ahead_sum, st.busy, st.jobs.len())
    }

    #[test]
    fn a_streak_of_entries_that_never_waited_means_cached() {
        assert_eq!(cached_streak(3, false, 128), 131);
        assert_eq!(cached_streak(3, true, 128), 0);
        // A listing counts as one entry, and a wait there starts again.
        assert_eq!(cached_streak(3, false, 0), 4);
        assert_eq!(cached_streak(3, true, 0), 0);
        assert!(waits() >= 0);
    }

    #[test]
    fn a_small_tree_is_warmed_whole_and_the_warmers_end() {
        let d = tempfile::tempdir().unwrap();
        for i in 0..3 {
            let sub = d.path().join(format!("d{i}"));
            std::fs::create_dir(&sub).unwrap();
            for j in 0..300 {
                std::fs::write(sub.join(format!("f{j}")), b"x").unwrap();
            }
        }
        std::os::unix::fs::symlink("/", d.path().join("out")).unwrap();
        // (The files were just written: a cached tree would stop them.)
        let w = Warmer::spawn(open(d.path()), 3, None, false);
        // Nothing told: the root's 4 entries and 300 in each directory,
        // the symlink not entered.
        assert_eq!(join(w), (4 + 3 * 300, 0, 0));
    }

    #[test]
    fn the_lead_holds_the_warmers_back_until_the_walk_moves() {
        let d = tempfile::tempdir().unwrap();
        let big = (LEAD as usize) + 2 * SLICE;
        for j in 0..big {
            std::fs::write(d.path().join(format!("f{j:06}")), b"").unwrap();
        }
        let w = Warmer::spawn(open(d.path()), 2, None, false);
        let mut waited = 0;
        loop {
            std::thread::sleep(Duration::from_millis(20));
            let st = w.shared.state.lock().unwrap();
            if st.busy == 0 && st.ahead_sum >= LEAD {
                // Each of the 2 warmers may take one slice past it.
                assert!(st.ahead_sum <= LEAD + 2 * SLICE as u64, "{}", st.ahead_sum);
                assert!(!st.jobs.is_empty(), "held back, not done");
                break;
            }
            waited += 1;
            assert!(waited < 1000, "the warmers never reached the lead");
        }
        // The walk passes the first slices: the rest is warmed.
        w.at(format!("f{:06}", 4 * SLICE).as_bytes(), true);
        let (ahead, busy, jobs) = join(w);
        assert_eq!((busy, jobs), (0, 0));
        assert_eq!(ahead, big as u64 - 4 * SLICE as u64);
    }

    #[test]
    fn the_queue_keeps_the_nearest_work() {
        let mut st = State::default();
        let job = |n: usize| Job {
            rel: vec![b'x'; 100],
            names: Some(vec![std::ffi::OsString::from("n".repeat(n)); 100]),
            end: Vec::new(),
        };
        let size = job(1000).size(b"k00000");
        let fit = MAX_QUEUED / size;
        for i in (0..fit + 10).rev() {
            st.queue(format!("k{i:05}").into_bytes(), job(1000));
        }
        assert!(st.queued <= MAX_QUEUED);
        assert_eq!(st.jobs.len(), fit);
        assert_eq!(st.jobs.keys().next().unwrap(), b"k00000");
        // Farther than all: not queued.
        st.queue(b"z".to_vec(), job(1000));
        assert!(!st.jobs.contains_key(&b"z"[..]));
    }
}
