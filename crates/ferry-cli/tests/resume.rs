//! Resume and retry of `ferry sync`, through the real binary.
//!
//! A regular file of 32 MiB or more is received into `.NAME.ferry-partial`
//! with a journal `.NAME.ferry-journal` of the 8 MiB segments written,
//! synced and verified. Killed runs (kill -9 of either side or of ssh,
//! Ctrl-C, SIGTERM) keep both and the next run resumes from them; a
//! dropped link is retried in the same run (`--retries`, `--timeout`);
//! nothing in a partial or a journal is ever trusted without checking it
//! against the source.
//!
//! - [`kills`]: kill -9 loops on a 1 GiB file (local sender, remote
//!   receiver, ssh, local run) at random points of a run.
//! - [`netns`]: a link that goes down for 5 s in a pair of network
//!   namespaces (needs root, `ip`, `tc`, sshd).
//! - [`errors`]: errors a retry cannot fix are not retried.
//! - [`tree`]: a tree of small files killed half way needs no journal.
//! - here: tampered journals and partials, a changed source, `--no-partial`.
//!
//! `FERRY_RESUME_KILLS=N` sets the kills per kind (the issue asks 50; the
//! defaults keep this binary to about 4 minutes on 2 cores, run with
//! `--test-threads=1`); `FERRY_RESUME_SEED=N` replays the kill points of
//! an earlier run (each test prints its seed).

mod common;
#[path = "resume/errors.rs"]
mod errors;
#[path = "resume/kills.rs"]
mod kills;
#[path = "resume/netns.rs"]
mod netns;
#[path = "resume/procs.rs"]
mod procs;
#[path = "resume/tree.rs"]
mod tree;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

pub const MIB: u64 = 1 << 20;
/// The journal's segment size.
pub const SEG: usize = 8 << 20;
/// What a resuming run may send beyond what the partial lacked: segments
/// that were in flight, written but not yet journaled, at the kill.
pub const MARGIN: u64 = 128 * MIB;
/// What an interrupt (not a kill) may leave unrecorded: the segments
/// being written when it came.
pub const IN_FLIGHT: u64 = 3 * SEG as u64;

/// A line on the test's stderr even when libtest captures output (it
/// captures the print macros only), so a passing run shows what it did.
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}
pub(crate) use say;

// ---------------------------------------------------------------------------
// Shared by the tests.

/// A source file and its bytes, kept in memory to compare against.
pub struct Source {
    pub path: PathBuf,
    pub data: Vec<u8>,
}

impl Source {
    pub fn new(path: PathBuf, seed: u64, size: usize) -> Source {
        let data = bytes(seed, size);
        fs::write(&path, &data).unwrap();
        Source { path, data }
    }

    /// Change the bytes, keeping (`keep_mtime`) or not the file's mtime.
    pub fn rewrite(&mut self, keep_mtime: bool, f: impl FnOnce(&mut Vec<u8>)) {
        let mtime = fs::metadata(&self.path).unwrap().modified().unwrap();
        f(&mut self.data);
        fs::write(&self.path, &self.data).unwrap();
        let file = fs::File::options().write(true).open(&self.path).unwrap();
        let t = if keep_mtime {
            mtime
        } else {
            mtime - Duration::from_secs(3600)
        };
        file.set_modified(t).unwrap();
    }
}

/// `.NAME.ferry-partial` and `.NAME.ferry-journal` beside `dst`.
pub fn partial_state(dst: &Path) -> (PathBuf, PathBuf) {
    let name = dst.file_name().unwrap().to_string_lossy();
    (
        dst.with_file_name(format!(".{name}.ferry-partial")),
        dst.with_file_name(format!(".{name}.ferry-journal")),
    )
}

/// The bytes of `file` equal to `data` at the same offsets, counted in
/// whole 8 MiB segments (0 when there is no such file).
pub fn matched(file: &Path, data: &[u8]) -> u64 {
    use std::io::Read;
    let Ok(mut f) = fs::File::open(file) else {
        return 0;
    };
    let mut buf = vec![0u8; SEG];
    let mut n = 0;
    for chunk in data.chunks(SEG) {
        let b = &mut buf[..chunk.len()];
        if f.read_exact(b).is_err() {
            break;
        }
        if b == chunk {
            n += chunk.len() as u64;
        }
    }
    n
}

pub fn identical(file: &Path, data: &[u8]) -> bool {
    fs::metadata(file).is_ok_and(|m| m.len() == data.len() as u64)
        && matched(file, data) == data.len() as u64
}

/// One finished run of ferry.
pub struct Run {
    pub code: Option<i32>,
    pub json: serde_json::Value,
    pub err: String,
    pub secs: f64,
}

impl Run {
    fn of(out: Output, secs: f64) -> Run {
        Run {
            code: out.status.code(),
            json: serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null),
            err: String::from_utf8_lossy(&out.stderr).into_owned(),
            secs,
        }
    }

    /// A counter from `--json`, which must be there.
    pub fn n(&self, key: &str) -> u64 {
        self.json[key]
            .as_u64()
            .unwrap_or_else(|| panic!("no {key} in --json: {}\n{}", self.json, self.err))
    }

    pub fn no_panic(&self) {
        assert!(
            !self.err.contains("panicked") && !self.err.contains("RUST_BACKTRACE"),
            "ferry panicked:\n{}",
            self.err
        );
    }
}

pub fn run(cmd: &mut Command) -> Run {
    let start = Instant::now();
    let out = cmd.output().expect("run ferry");
    Run::of(out, start.elapsed().as_secs_f64())
}

/// Wait for `child` (stdout and stderr piped) at most `limit`, then kill
/// it and fail.
pub fn finish(mut child: Child, start: Instant, limit: Duration, what: &str) -> Run {
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{what}: still running after {limit:?}; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let secs = start.elapsed().as_secs_f64();
    Run::of(child.wait_with_output().unwrap(), secs)
}

/// A run that finished the job: exit 0, `dst` holds `src` (bytes, mtime,
/// mode), and no partial, journal or temp file is left beside it.
pub fn assert_complete(r: &Run, src: &Source, dst: &Path, what: &str) {
    r.no_panic();
    assert_eq!(r.code, Some(0), "{what}: {}\n{}", r.err, r.json);
    assert!(
        identical(dst, &src.data),
        "{what}: {} differs",
        dst.display()
    );
    let (s, d) = (fs::metadata(&src.path).unwrap(), fs::metadata(dst).unwrap());
    assert_eq!(
        (s.mtime(), s.mtime_nsec(), s.mode()),
        (d.mtime(), d.mtime_nsec(), d.mode()),
        "{what}: mtime/mode of {}",
        dst.display()
    );
    let left = temp_files(dst.parent().unwrap());
    assert!(left.is_empty(), "{what}: left behind: {left:?}");
}

/// Kills per kind: `FERRY_RESUME_KILLS`, else `default`.
pub fn kills(default: usize) -> usize {
    std::env::var("FERRY_RESUME_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// xorshift, seeded by `FERRY_RESUME_SEED` or the clock (printed).
pub struct Rng(u64);

impl Rng {
    pub fn new(test: &str) -> Rng {
        let seed = std::env::var("FERRY_RESUME_SEED")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
            });
        say!("{test}: FERRY_RESUME_SEED={seed}");
        Rng(seed | 1)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

// ---------------------------------------------------------------------------
// 1. kill -9 loops, 2. a link that goes down.

#[test]
fn kill_the_local_sender_of_a_push() {
    kills::kill_loop(kills::Target::Sender, "kill_the_local_sender_of_a_push");
}

#[test]
fn kill_the_remote_receiver_of_a_push() {
    kills::kill_loop(
        kills::Target::Receiver,
        "kill_the_remote_receiver_of_a_push",
    );
}

#[test]
fn kill_the_ssh_of_a_push() {
    kills::kill_loop(kills::Target::Ssh, "kill_the_ssh_of_a_push");
}

#[test]
fn kill_a_local_run() {
    kills::kill_loop(kills::Target::Local, "kill_a_local_run");
}

#[test]
fn a_link_down_for_5s_is_retried_in_the_same_run() {
    netns::link_down_for_5s("a_link_down_for_5s_is_retried_in_the_same_run");
}

// ---------------------------------------------------------------------------
// 3. What a killed local run leaves, tampered with.

/// 256 MiB at 128 MiB/s: a run of 2 s at least, killed from 1.4 s on,
/// once the journal has had two batches appended (by 1.9 s at the latest).
const LOCAL_SIZE: usize = 256 << 20;
const LOCAL_RATE: &str = "128M";
const LOCAL_KILL: Duration = Duration::from_millis(1400);
const LOCAL_KILL_LAST: Duration = Duration::from_millis(1900);

struct Local {
    _dir: tempfile::TempDir,
    src: Source,
    dst: PathBuf,
}

fn local(seed: u64) -> Local {
    let dir = tempfile::tempdir().unwrap();
    let src = Source::new(dir.path().join("big"), seed, LOCAL_SIZE);
    fs::create_dir(dir.path().join("dst")).unwrap();
    let dst = dir.path().join("dst/big");
    Local {
        _dir: dir,
        src,
        dst,
    }
}

impl Local {
    fn sync(&self, extra: &[&str]) -> Run {
        run(Command::new(ferry_bin())
            .args(["sync", "--json"])
            .args(extra)
            .args([p(&self.src.path), p(&self.dst)]))
    }

    /// A run (at a limited rate) stopped by `sig` 70-95% of the way
    /// through. Returns the bytes of its partial that match the source.
    fn stop_late(&self, sig: &str, extra: &[&str]) -> u64 {
        let start = Instant::now();
        let child = Command::new(ferry_bin())
            .args(["sync", "--bwlimit", LOCAL_RATE])
            .args(extra)
            .args([p(&self.src.path), p(&self.dst)])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The journal's lengths: its header, then one more per batch.
        let mut lens = std::collections::BTreeSet::new();
        let (part, journal) = partial_state(&self.dst);
        loop {
            let t = start.elapsed();
            lens.extend(fs::metadata(&journal).map(|m| m.len()));
            let ready = lens.len() >= 3 || extra.contains(&"--no-partial");
            if (t >= LOCAL_KILL && ready) || t >= LOCAL_KILL_LAST {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        procs::signal(child.id() as i32, sig);
        let r = finish(child, start, Duration::from_secs(30), sig);
        r.no_panic();
        if sig != "-KILL" {
            assert_eq!(r.code, Some(130), "{sig}: interrupted: {}", r.err);
        }
        if !extra.contains(&"--no-partial") {
            assert!(
                part.exists() && journal.exists(),
                "{sig} late in the run: partial state kept? {:?}",
                fs::read_dir(self.dst.parent().unwrap())
                    .unwrap()
                    .map(|e| e.unwrap().file_name())
                    .collect::<Vec<_>>()
            );
        }
        assert!(
            !self.dst.exists(),
            "{sig}: the run finished before the kill"
        );
        matched(&part, &self.src.data)
    }

    /// The run after a kill (and a tamper): complete, and it resumed at
    /// most the `limit` bytes that were really right.
    fn rerun(&self, what: &str, limit: u64, extra: &[&str]) -> Run {
        let r = self.sync(extra);
        assert_complete(&r, &self.src, &self.dst, what);
        let resumed = r.n("bytes_resumed");
        assert!(
            resumed <= limit,
            "{what}: bytes_resumed {resumed} > {limit} bytes of the partial that were right: {}",
            r.json
        );
        say!(
            "{what}: resumed {} MiB, written {} MiB, {:.2} s",
            resumed >> 20,
            r.n("bytes_written") >> 20,
            r.secs
        );
        r
    }
}

/// kill -9, Ctrl-C and SIGTERM late in a run keep the partial and its
/// journal, and the next run resumes: it sends at most what the partial
/// lacked (plus the segments in flight).
#[test]
fn a_killed_or_interrupted_run_is_resumed() {
    let l = local(21);
    for sig in ["-KILL", "-INT", "-TERM"] {
        let good = l.stop_late(sig, &[]);
        assert!(good >= 64 * MIB, "{sig}: only {good} bytes right at 70%");
        let r = l.rerun(sig, good, &[]);
        let size = LOCAL_SIZE as u64;
        assert!(r.n("bytes_resumed") > 0, "{sig}: not resumed: {}", r.json);
        if sig != "-KILL" {
            // An interrupt records every segment complete by then: only
            // those still being written are sent again, not the up to
            // 64 MiB done since the journal's last timed append.
            let lost = good.saturating_sub(r.n("bytes_resumed"));
            say!(
                "{sig}: {} MiB right in the partial, not resumed",
                lost >> 20
            );
            assert!(
                lost <= IN_FLIGHT,
                "{sig}: {good} bytes right, {lost} of them not recorded: {}",
                r.json
            );
        }
        assert!(
            r.n("bytes_written") <= size - good + MARGIN,
            "{sig}: wrote {} of {size} with {good} in the partial",
            r.n("bytes_written")
        );
        fs::remove_file(&l.dst).unwrap();
    }
}

/// Garbage in the journal in every shape: flipped bytes, random bytes,
/// cut short, empty, 2 GiB, another file's journal. No panic, the copy is
/// right, nothing is left.
#[test]
fn a_corrupt_or_foreign_journal_is_never_trusted() {
    let l = local(22);
    // Another file's journal, from a run killed the same way.
    let other = local(23);
    other.stop_late("-KILL", &[]);
    let foreign = fs::read(partial_state(&other.dst).1).unwrap();
    type Tamper<'a> = (&'a str, Box<dyn Fn(&Path)>);
    let cases: Vec<Tamper> = vec![
        (
            "flipped bytes",
            Box::new(|j: &Path| {
                let mut b = fs::read(j).unwrap();
                assert!(!b.is_empty(), "empty journal");
                let len = b.len();
                for i in 0..16 {
                    b[i * len / 16] ^= 0x5a;
                }
                b[len - 1] ^= 0xff;
                fs::write(j, b).unwrap();
            }),
        ),
        (
            "random bytes",
            Box::new(|j: &Path| fs::write(j, bytes(99, 4096)).unwrap()),
        ),
        (
            "cut in half",
            Box::new(|j: &Path| {
                let len = fs::metadata(j).unwrap().len();
                fs::File::options()
                    .write(true)
                    .open(j)
                    .unwrap()
                    .set_len(len / 2)
                    .unwrap();
            }),
        ),
        ("empty", Box::new(|j: &Path| fs::write(j, b"").unwrap())),
        (
            "2 GiB",
            Box::new(|j: &Path| {
                let f = fs::File::options().write(true).open(j).unwrap();
                f.set_len(2 << 30).unwrap();
            }),
        ),
        (
            "another file's",
            Box::new(move |j: &Path| fs::write(j, &foreign).unwrap()),
        ),
    ];
    for (what, tamper) in cases {
        let good = l.stop_late("-KILL", &[]);
        tamper(&partial_state(&l.dst).1);
        let limit = if what == "another file's" { 0 } else { good };
        l.rerun(&format!("journal {what}"), limit, &[]);
        fs::remove_file(&l.dst).unwrap();
    }
}

/// Other bytes in journaled segments of the partial, or a partial cut
/// short, with the journal kept: those segments are sent again (the rest
/// of a partial with other bytes is resumed).
#[test]
fn a_partial_with_other_bytes_is_sent_again() {
    let l = local(24);
    for what in ["other bytes", "cut short"] {
        l.stop_late("-KILL", &[]);
        let part = partial_state(&l.dst).0;
        if what == "other bytes" {
            use std::os::unix::fs::FileExt;
            let f = fs::File::options().write(true).open(&part).unwrap();
            f.write_all_at(&bytes(98, 4096), 0).unwrap();
            f.write_all_at(&bytes(97, MIB as usize), SEG as u64 + 1000)
                .unwrap();
        } else {
            let f = fs::File::options().write(true).open(&part).unwrap();
            f.set_len(40 * MIB).unwrap();
        }
        let good = matched(&part, &l.src.data);
        let r = l.rerun(what, good, &[]);
        // A partial of another length than the file is not resumed at all
        // (allowed: nothing has to be resumed, only what is right may be).
        assert!(
            what == "cut short" || r.n("bytes_resumed") > 0,
            "{what}: the segments still right were not resumed: {}",
            r.json
        );
        fs::remove_file(&l.dst).unwrap();
    }
}

/// A source changed since the kill: a new mtime (same bytes) or new bytes
/// and size discard the partial state; new bytes under the old mtime are
/// caught by the sender's check of the segments.
#[test]
fn a_changed_source_discards_or_resends_the_partial() {
    let mut l = local(25);
    for what in ["new mtime", "new size", "new bytes, old mtime"] {
        l.stop_late("-KILL", &[]);
        match what {
            "new mtime" => l.src.rewrite(false, |_| {}),
            "new size" => l.src.rewrite(false, |d| d.extend(bytes(96, MIB as usize))),
            _ => l.src.rewrite(true, |d| {
                d[SEG / 2..SEG / 2 + 4096].fill(7);
                d[3 * SEG + 5..3 * SEG + 100].fill(9);
            }),
        }
        let good = matched(&partial_state(&l.dst).0, &l.src.data);
        let limit = if what.starts_with("new bytes") {
            good
        } else {
            0
        };
        l.rerun(what, limit, &[]);
        fs::remove_file(&l.dst).unwrap();
    }
}

/// `--no-partial` removes what a killed run left and sends everything; a
/// `--no-partial` run that is killed leaves no partial state.
#[test]
fn no_partial_removes_and_keeps_no_partial_state() {
    let l = local(26);
    l.stop_late("-KILL", &[]);
    let r = l.rerun("--no-partial after a kill", 0, &["--no-partial"]);
    assert_eq!(r.n("bytes_written"), LOCAL_SIZE as u64, "{}", r.json);
    fs::remove_file(&l.dst).unwrap();

    l.stop_late("-KILL", &["--no-partial"]);
    let (part, journal) = partial_state(&l.dst);
    assert!(
        !part.exists() && !journal.exists(),
        "a killed --no-partial run left partial state"
    );
    l.rerun("after a killed --no-partial run", 0, &[]);
}
