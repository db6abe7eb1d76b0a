//! Helpers shared by the targets: the record container most inputs use, a
//! bounded byte reader, scratch directories and deadlines.

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

/// What a Rust `main` does before it runs and libFuzzer's C `main` does
/// not: ignore SIGPIPE, so that a write to a closed socket or pipe is an
/// `EPIPE` error, as in the `ferry` binary, not the death of the process.
/// Every fuzz binary calls it first (`fuzz_target!(init: …)`).
pub fn init() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    // SAFETY: setting a signal's disposition to SIG_IGN, before any thread
    // of the targets runs; no handler code is involved.
    ONCE.call_once(|| unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    });
}

/// How long one session of a target may take before it counts as a hang.
/// Inputs are small (a few KiB); a healthy run takes milliseconds.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// The records of an input: each is a `u16` little-endian length and that
/// many bytes; a last record shorter than its length takes what is left.
/// Keeping message boundaries outside the messages lets the fuzzer mutate
/// one message without breaking the framing of the others.
pub fn records(data: &[u8]) -> Records<'_> {
    Records(data)
}

pub struct Records<'a>(&'a [u8]);

impl<'a> Iterator for Records<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        if self.0.len() < 2 {
            return None;
        }
        let n = u16::from_le_bytes([self.0[0], self.0[1]]) as usize;
        let rest = &self.0[2..];
        let n = n.min(rest.len());
        let (r, tail) = rest.split_at(n);
        self.0 = tail;
        Some(r)
    }
}

/// The inverse of [`records`] (for seeds).
pub fn pack<T: AsRef<[u8]>>(head: &[u8], recs: &[T]) -> Vec<u8> {
    let mut v = head.to_vec();
    for r in recs {
        let r = r.as_ref();
        let n = u16::try_from(r.len()).expect("a seed record fits a u16 length");
        v.extend_from_slice(&n.to_le_bytes());
        v.extend_from_slice(r);
    }
    v
}

/// A reader over the input that yields zeros once it runs out.
pub struct Bytes<'a>(pub &'a [u8]);

impl<'a> Bytes<'a> {
    pub fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    pub fn u32(&mut self) -> u32 {
        u32::from(self.u16()) | (u32::from(self.u16()) << 16)
    }
    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let (a, b) = self.0.split_at(n.min(self.0.len()));
        self.0 = b;
        a
    }
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.0)
    }
}

/// With `FERRY_FUZZ_VERBOSE` set, the session targets print each
/// outcome (to see what a seed reaches: `cargo test -- --nocapture`).
pub fn verbose() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| std::env::var_os("FERRY_FUZZ_VERBOSE").is_some())
}

/// A fresh scratch directory: on tmpfs (`/dev/shm`) when there is one, as
/// the targets that write files create and remove a tree per input.
pub fn scratch_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    let b = tempfile::Builder::new()
        .prefix("ferry-fuzz-")
        .tempdir_in(shm);
    match b {
        Ok(d) => d,
        Err(_) => tempfile::Builder::new()
            .prefix("ferry-fuzz-")
            .tempdir()
            .expect("a scratch directory"),
    }
}

/// A directory for the whole process (a fixed source tree, a socket):
/// `ferry-fuzz-proc-<pid>-<what>` beside [`scratch_dir`]'s, removed when
/// the process exits, or by the next process that makes one if it died.
pub fn process_dir(what: &str) -> std::path::PathBuf {
    static DIRS: std::sync::Mutex<Vec<std::path::PathBuf>> = std::sync::Mutex::new(Vec::new());
    static ONCE: std::sync::Once = std::sync::Once::new();
    extern "C" fn remove_all() {
        if let Ok(dirs) = DIRS.lock() {
            for d in dirs.iter() {
                let _ = std::fs::remove_dir_all(d);
            }
        }
    }
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    for e in std::fs::read_dir(&base).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = name
            .strip_prefix("ferry-fuzz-proc-")
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|p| !Path::new(&format!("/proc/{p}")).exists()) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
    let d = base.join(format!("ferry-fuzz-proc-{}-{what}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("a process directory");
    if let Ok(mut dirs) = DIRS.lock() {
        dirs.push(d.clone());
    }
    // SAFETY: registers a plain function that only removes directories.
    ONCE.call_once(|| unsafe {
        libc::atexit(remove_all);
    });
    d
}

/// Make every directory under `p` writable again, so that a tree whose
/// modes a hostile peer chose can be removed by a user that is not root.
pub fn unlock_tree(p: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(m) = std::fs::symlink_metadata(p) else {
        return;
    };
    if !m.is_dir() {
        return;
    }
    let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700));
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            unlock_tree(&e.path());
        }
    }
}

/// Wait for `done` (sent when the code under test returned); a session
/// that outlives [`DEADLINE`] is a hang, reported as a crash.
pub fn await_done(done: &mpsc::Receiver<()>, what: &str) {
    match done.recv_timeout(DEADLINE) {
        Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => {}
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what} HUNG: no result after {DEADLINE:?}")
        }
    }
}

/// Run `f` on a thread of its own and return its result, or panic (a
/// crash for libFuzzer) when it does not return within [`DEADLINE`].
pub fn bounded<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let h = std::thread::Builder::new()
        .name(format!("fuzz {what}"))
        .spawn(move || {
            let r = f();
            let _ = tx.send(());
            r
        })
        .expect("spawn");
    await_done(&rx, what);
    match h.join() {
        Ok(r) => r,
        Err(p) => std::panic::resume_unwind(p),
    }
}

/// Threads of this process now (`/proc/self/status`).
pub fn threads() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|n| n.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// The threads before a session, to check that none the session started
/// outlives it: a thread per connection that never ends is a leak in a
/// long-running `ferry recv` or server, and a thread still ending when
/// libFuzzer checks for leaks makes its bookkeeping look leaked.
pub struct Threads(usize);

impl Threads {
    pub fn before() -> Threads {
        Threads(threads())
    }

    /// Wait (at most [`DEADLINE`]) for the count to come back.
    pub fn settle(self, what: &str) {
        let start = std::time::Instant::now();
        let mut nap = Duration::from_micros(50);
        loop {
            let now = threads();
            if now <= self.0 {
                return;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "{what}: {} threads still running {DEADLINE:?} after the session",
                now - self.0
            );
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(5));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_roundtrip() {
        let v = pack(b"H", &[&b"abc"[..], b"", b"xy"]);
        assert_eq!(v[0], b'H');
        let r: Vec<&[u8]> = records(&v[1..]).collect();
        assert_eq!(r, vec![&b"abc"[..], b"", b"xy"]);
        // A short last record takes what is left.
        let r: Vec<&[u8]> = records(&[9, 0, 1, 2]).collect();
        assert_eq!(r, vec![&[1u8, 2][..]]);
    }
}
