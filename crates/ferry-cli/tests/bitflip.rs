//! A remote shell that flips one bit of the byte stream, 1,000 times:
//! every run either exits 0 with a result identical to the source, or
//! exits non-zero with the old data intact. Nothing in between.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::*;

/// Runs `sh -c CMD` (ferry's remote side; the host word is ignored) and
/// relays its stdin and stdout, flipping one bit at a seeded offset of one
/// direction. Appends "flipped" to $FLIP_LOG when the bit was flipped.
const FLIPPER: &str = r#"
import os, random, subprocess, sys, threading
seed = int(sys.argv[1]); limit = int(sys.argv[2]); cmd = sys.argv[-1]
rnd = random.Random(seed)
direction = seed % 2
at = rnd.randrange(limit)
bit = rnd.randrange(8)
p = subprocess.Popen(["sh", "-c", cmd], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
def pump(src, dst, flip):
    pos = 0
    try:
        while True:
            b = os.read(src, 65536)
            if not b:
                break
            if flip and pos <= at < pos + len(b):
                b = bytearray(b)
                b[at - pos] ^= 1 << bit
                b = bytes(b)
                with open(os.environ["FLIP_LOG"], "a") as f:
                    f.write("flipped\n")
            pos += len(b)
            while b:
                n = os.write(dst, b)
                b = b[n:]
    except OSError:
        pass
    try:
        os.close(dst)
    except OSError:
        pass
t = threading.Thread(target=pump, args=(0, p.stdin.fileno(), direction == 0), daemon=True)
t.start()
pump(p.stdout.fileno(), 1, direction == 1)
sys.exit(p.wait())
"#;

/// The source tree at version `v`: small files, one of several segments
/// (so deltas and segment digests are exercised), a symlink, a mode.
fn make_tree(root: &Path, v: u64) {
    fs::create_dir_all(root.join("d")).unwrap();
    for i in 0..4u64 {
        let f = root.join(format!("d/f{i}"));
        fs::write(&f, bytes(v * 10 + i, 3000 + i as usize * 700)).unwrap();
        // Versions differ in mtime too, or a same-size file is rightly
        // skipped without -c.
        set_mtime(&f, 1_600_000_000 + v as i64 * 100 + i as i64);
    }
    let mut big = bytes(77, 300_000);
    big[1000 + v as usize] ^= 0xff;
    fs::write(root.join("big"), big).unwrap();
    let _ = fs::remove_file(root.join("link"));
    std::os::unix::fs::symlink(format!("d/f{v}"), root.join("link")).unwrap();
    set_mtime(&root.join("big"), 1_600_000_000 + v as i64);
}

/// Every file under `dst` holds the content it has in `old` or in `new`.
fn each_file_old_or_new(dst: &Path, old: &Path, new: &Path) -> Result<(), String> {
    for rel in ["big", "d/f0", "d/f1", "d/f2", "d/f3"] {
        let got = fs::read(dst.join(rel)).map_err(|e| format!("{rel}: {e}"))?;
        if got != fs::read(old.join(rel)).unwrap() && got != fs::read(new.join(rel)).unwrap() {
            return Err(format!("{rel} is neither the old nor the new version"));
        }
    }
    Ok(())
}

#[test]
fn a_flipped_bit_never_gives_exit_0_with_wrong_data() {
    const RUNS: u64 = 1000;
    // Where in a direction's bytes the bit may fall: the first frames (the
    // handshake, the list, the requests), or anywhere in a session's data.
    // Offsets beyond a stream's end flip nothing (counted below).
    const LIMITS: [u64; 3] = [400, 3_000, 20_000];
    if !which("python3") {
        skip("a_flipped_bit_never_gives_exit_0_with_wrong_data: python3 not installed");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let flipper = d.path().join("flip.py");
    fs::write(&flipper, FLIPPER).unwrap();
    let (old, new) = (d.path().join("old"), d.path().join("new"));
    make_tree(&old, 1);
    make_tree(&new, 2);
    let log = d.path().join("flips.log");
    fs::write(&log, b"").unwrap();
    let bin = ferry_bin();
    let (ok, refused) = (AtomicU64::new(0), AtomicU64::new(0));
    let started = Instant::now();
    std::thread::scope(|s| {
        for worker in 0..2u64 {
            let (flipper, old, new, log, bin) = (&flipper, &old, &new, &log, &bin);
            let (ok, refused) = (&ok, &refused);
            let d = d.path();
            s.spawn(move || {
                let work: PathBuf = d.join(format!("w{worker}"));
                for seed in (worker..RUNS).step_by(2) {
                    let dst = work.join("dst");
                    let _ = fs::remove_dir_all(&work);
                    fs::create_dir_all(&work).unwrap();
                    copy_tree(old, &dst);
                    let limit = LIMITS[(seed / 4) as usize % LIMITS.len()];
                    let rsh = format!("python3 {} {seed} {limit}", flipper.display());
                    let pull = seed % 4 >= 2;
                    let (from, to) = if pull {
                        (format!("localhost:{}/", new.display()), p(&dst).to_string())
                    } else {
                        (slash(new), format!("localhost:{}", dst.display()))
                    };
                    // One attempt per run: a damaged frame is an error a
                    // reconnect could fix, and each retry would wait its
                    // backoff (what this loop checks is one attempt's
                    // outcome).
                    let mut args = vec![
                        "sync",
                        "-q",
                        "--retries",
                        "0",
                        "-e",
                        &rsh,
                        "--remote-ferry",
                        p(bin),
                    ];
                    if seed % 3 == 0 {
                        args.push("--delta");
                    }
                    args.extend([from.as_str(), to.as_str()]);
                    let mut child = Command::new(bin)
                        .args(&args)
                        .env("FLIP_LOG", log)
                        .stdout(Stdio::null())
                        .stderr(Stdio::piped())
                        .spawn()
                        .unwrap();
                    let deadline = Instant::now() + Duration::from_secs(60);
                    let st = loop {
                        if let Some(st) = child.try_wait().unwrap() {
                            break st;
                        }
                        if Instant::now() > deadline {
                            let _ = child.kill();
                            panic!("seed {seed}: ferry hung for 60 s after a flipped bit");
                        }
                        std::thread::sleep(Duration::from_millis(5));
                    };
                    let mut err = String::new();
                    use std::io::Read;
                    let _ = child.stderr.take().unwrap().read_to_string(&mut err);
                    assert!(!err.contains("panicked"), "seed {seed}: {err}");
                    assert!(
                        temp_files(&dst).is_empty(),
                        "seed {seed}: temp files left: {err}"
                    );
                    if st.success() {
                        assert_same_tree(new, &dst);
                        ok.fetch_add(1, Ordering::Relaxed);
                    } else {
                        if let Err(e) = each_file_old_or_new(&dst, old, new) {
                            panic!("seed {seed} exited {:?}: {e}\n{err}", st.code());
                        }
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let flips = fs::read_to_string(&log).unwrap().lines().count();
    let (ok, refused) = (ok.into_inner(), refused.into_inner());
    eprintln!(
        "bit-flip loop: {RUNS} runs in {:.0} s, {flips} bits flipped: {ok} exited 0 identical, {refused} exited non-zero with the old data intact",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(ok + refused, RUNS);
    // Most runs must really have had a bit flipped, or this proves little.
    assert!(flips as u64 >= RUNS / 2, "only {flips} flips");
    assert!(refused > 0, "no flip was ever noticed");
}

fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap().flatten() {
        let (src, dst) = (e.path(), to.join(e.file_name()));
        let t = e.file_type().unwrap();
        if t.is_dir() {
            copy_tree(&src, &dst);
        } else if t.is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(&src).unwrap(), &dst).unwrap();
        } else {
            fs::copy(&src, &dst).unwrap();
            let m = fs::metadata(&src).unwrap();
            let f = fs::File::options().write(true).open(&dst).unwrap();
            f.set_modified(m.modified().unwrap()).unwrap();
        }
    }
}
