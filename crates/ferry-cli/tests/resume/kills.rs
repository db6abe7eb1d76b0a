//! kill -9 at random points of a 1 GiB transfer, then a run to the end:
//! the copy is right, nothing is left, and the run after the kill sent at
//! most what the partial lacked (plus the segments in flight).

use std::fs;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use crate::{
    assert_complete, finish, kills, matched, partial_state, procs, run, say, Rng, Run, Source,
    MARGIN, MIB,
};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Target {
    /// The local `ferry sync` of a push over ssh.
    Sender,
    /// The remote `ferry serve` that sshd started.
    Receiver,
    /// The `ssh` child of the local ferry.
    Ssh,
    /// A local run, no ssh.
    Local,
}

/// Kills per kind over ssh (a push of 1 GiB takes 3.5 s on 2 idle cores,
/// twice that on busy ones; a kill and the run after it 7-12 s), and of a
/// local run (about 0.7 s; 2.5 s per kill). With these the whole binary
/// takes about 4 minutes (6 on a busy machine). The issue asks 50 of
/// each: `FERRY_RESUME_KILLS=50` (6-10 minutes per ssh kind).
pub const KILLS: usize = 5;
pub const LOCAL_KILLS: usize = 20;

const SIZE: usize = 1 << 30;
/// A partial with this much right at the kill is "late": the next run
/// must resume it.
const LATE: u64 = 256 * MIB;

struct Setup {
    srv: Option<SshServer>,
    bin: PathBuf,
    src: Source,
    dst: PathBuf,
    _dir: tempfile::TempDir,
}

impl Setup {
    fn cmd(&self, extra: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.arg("sync");
        if let Some(s) = &self.srv {
            c.args(["-e", &s.rsh(), "--remote-ferry", p(&self.bin)]);
        }
        c.args(extra).arg(&self.src.path);
        match &self.srv {
            Some(s) => c.arg(s.remote(&self.dst)),
            None => c.arg(&self.dst),
        };
        c
    }

    /// The pid to kill, once it is there.
    fn victim(&self, target: Target, ferry: i32) -> Option<i32> {
        match target {
            Target::Sender | Target::Local => Some(ferry),
            // The ssh that carries the session: not ferry's `ssh -V` and
            // `ssh -G` probes of the cipher, which come first.
            Target::Ssh => procs::child_with(ferry, "ssh", |a| {
                !a.iter().any(|w| w == "-G" || w == "-V") && a.iter().any(|w| w.contains(" serve "))
            }),
            Target::Receiver => {
                let sshd = self.srv.as_ref().unwrap().pid() as i32;
                procs::serves(&self.bin, p(&self.dst))
                    .into_iter()
                    .find(|&s| procs::descends_from(s, sshd))
            }
        }
    }

    /// A run whose `target` gets SIGKILL `at` after the start, unless the
    /// run is over by then. Waits for the remote side to be gone too.
    fn kill_at(&self, target: Target, at: Duration, extra: &[&str]) -> Run {
        let start = Instant::now();
        let mut child = self
            .cmd(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let ferry = child.id() as i32;
        while child.try_wait().unwrap().is_none() {
            if let Some(v) = self.victim(target, ferry) {
                if let Some(wait) = at.checked_sub(start.elapsed()) {
                    std::thread::sleep(wait);
                }
                if child.try_wait().unwrap().is_none() {
                    procs::signal(v, "-KILL");
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let r = finish(child, start, Duration::from_secs(120), "the killed run");
        r.no_panic();
        if self.srv.is_some() {
            let gone = procs::wait_gone(
                || procs::serves(&self.bin, p(&self.dst)),
                Duration::from_secs(20),
            );
            assert!(
                gone,
                "{target:?}: the remote ferry serve still runs 20 s after the kill"
            );
        }
        r
    }
}

#[derive(Default)]
struct Counts {
    kills: usize,
    over_first: usize,
    with_partial: usize,
    late: usize,
    resumed: usize,
    late_resumed: usize,
}

pub fn kill_loop(target: Target, test: &str) {
    let srv = if target == Target::Local {
        None
    } else {
        match SshServer::start(test) {
            Some(s) => Some(s),
            None => return,
        }
    };
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("dst")).unwrap();
    let s = Setup {
        srv,
        bin: ferry_bin(),
        src: Source::new(dir.path().join("big"), 11, SIZE),
        dst: dir.path().join("dst/big"),
        _dir: dir,
    };
    let t0 = Instant::now();
    // Whole runs, timed: the kills fall uniformly over the duration of
    // one (the faster of two: the first is often slower).
    let mut secs = f64::MAX;
    for _ in 0..2 {
        let full = run(&mut s.cmd(&["--json"]));
        assert_complete(&full, &s.src, &s.dst, "a whole run");
        secs = secs.min(full.secs);
        fs::remove_file(&s.dst).unwrap();
    }
    let mut dur = Duration::from_secs_f64(secs);

    let n = kills(if target == Target::Local {
        LOCAL_KILLS
    } else {
        KILLS
    });
    let mut rng = Rng::new(test);
    let mut c = Counts::default();
    // Without retries a kill of ssh or of the remote side ends the run
    // (with them, the run goes on by itself: see the end).
    let once: &[&str] = match target {
        Target::Receiver | Target::Ssh => &["--retries", "0"],
        _ => &[],
    };
    for i in 0..n {
        // Stratified: one point uniform in each n-th of the run.
        let frac = (i as f64 + rng.unit()) / n as f64;
        let at = dur.mul_f64(frac);
        let k = s.kill_at(target, at, once);
        let over = k.code == Some(0);
        if over {
            // The whole runs were timed on a busier machine (other tests
            // beside them): the kills after this one fall over the length
            // of the run that just ended, not past its end.
            dur = dur.min(Duration::from_secs_f64(k.secs));
        }
        if !over {
            let want = if once.is_empty() { None } else { Some(5) };
            assert_eq!(k.code, want, "{test} #{i}: the killed run: {}", k.err);
        }
        let (part, journal) = partial_state(&s.dst);
        let good = matched(&part, &s.src.data);
        let (had_partial, had_journal) = (part.exists(), journal.exists());

        let r = run(&mut s.cmd(&["--json"]));
        let what = format!("{test} #{i} (kill at {:.0}%)", frac * 100.0);
        assert_complete(&r, &s.src, &s.dst, &what);
        let (written, resumed) = (r.n("bytes_written"), r.n("bytes_resumed"));
        say!(
            "{what}: exit {:?}, partial {had_partial} ({} MiB right), journal {had_journal}; \
             next run wrote {} MiB, resumed {} MiB, {:.1} s",
            k.code,
            good >> 20,
            written >> 20,
            resumed >> 20,
            r.secs
        );
        assert!(
            written <= SIZE as u64 - good + MARGIN,
            "{what}: wrote {written} though {good} of {SIZE} were right in the partial: {}",
            r.json
        );
        assert!(
            resumed <= good,
            "{what}: resumed {resumed}, but only {good} bytes of the partial were right"
        );
        c.kills += usize::from(!over);
        c.over_first += usize::from(over);
        c.with_partial += usize::from(had_partial);
        c.resumed += usize::from(resumed > 0);
        if good >= LATE {
            c.late += 1;
            c.late_resumed += usize::from(resumed > 0);
        }
        fs::remove_file(&s.dst).unwrap();
    }
    say!(
        "{test}: {} kills ({} runs over before it), partial left by {}, late (>= {} MiB right) {}, \
         resumed {} (late: {}); whole run {:.1} s, all {:.0} s",
        c.kills,
        c.over_first,
        c.with_partial,
        LATE >> 20,
        c.late,
        c.resumed,
        c.late_resumed,
        secs,
        t0.elapsed().as_secs_f64()
    );
    if n >= 4 {
        assert!(
            c.late >= 1,
            "{test}: no kill left a partial of {LATE} bytes"
        );
    }
    assert!(
        c.late_resumed * 4 >= c.late * 3,
        "{test}: only {} of {} late kills were resumed",
        c.late_resumed,
        c.late
    );

    // With the default retries, a kill of ssh or of the remote side is a
    // dropped link: the same run reconnects and resumes.
    if !once.is_empty() {
        // Timed from the whole runs at the start: on a loaded machine those
        // can be slower than this one, which then ends before the kill.
        // Such a run proves nothing here: killed earlier in a run of its
        // own length, up to three times.
        let mut at = dur.mul_f64(0.6);
        let mut r = s.kill_at(target, at, &["--json"]);
        for _ in 0..3 {
            if r.n("reconnects") > 0 || r.n("bytes_resumed") > 0 {
                break;
            }
            say!(
                "{test}: the run ended before the kill at {at:?} ({:.1} s); again, earlier",
                r.secs
            );
            at = at.min(Duration::from_secs_f64(r.secs)).mul_f64(0.6);
            fs::remove_file(&s.dst).unwrap();
            r = s.kill_at(target, at, &["--json"]);
        }
        let what = format!("{test}: kill at {at:?} with --retries 3");
        assert_complete(&r, &s.src, &s.dst, &what);
        let (written, resumed) = (r.n("bytes_written"), r.n("bytes_resumed"));
        say!(
            "{what}: {} reconnects, wrote {} MiB, resumed {} MiB, {:.1} s",
            r.n("reconnects"),
            written >> 20,
            resumed >> 20,
            r.secs
        );
        assert!(r.n("reconnects") >= 1, "{what}: {}", r.json);
        assert!(resumed > 0, "{what}: {}", r.json);
        assert!(written <= SIZE as u64 + MARGIN, "{what}: {}", r.json);
        // The last attempt wrote what the earlier one had not: together
        // the whole file. (A push learns what the remote side wrote only
        // from attempts that finished, so the earlier attempt's writes are
        // not in bytes_written; README says so.)
        assert!(
            written + resumed >= SIZE as u64,
            "{what}: written {written} + resumed {resumed} < {SIZE}: {}",
            r.json
        );
    }
}
