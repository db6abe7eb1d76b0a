//! What a newcomer meets first, through the real binary: every documented
//! exit code, destinations that are devices or FIFOs, output into a closed
//! pipe, an interrupted run, the summary line and rsync habits.

mod common;

use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::FileTypeExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Exit 3 and one line naming the operation, the path and the reason;
/// the device is still a device.
#[test]
fn full_device_fails_with_enospc_and_stays_a_device() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("numbers.txt");
    fs::write(&src, bytes(3, 588_895)).unwrap();
    let out = ferry(&["sync", p(&src), "/dev/full"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains("write /dev/full: no space left on device"),
        "{err}"
    );
    assert!(
        !err.contains("transferred"),
        "no summary after a fatal error: {err}"
    );
    let m = fs::symlink_metadata("/dev/full").unwrap();
    assert!(m.file_type().is_char_device());
}

#[test]
fn null_device_takes_the_file_and_stays_a_device() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("f");
    fs::write(&src, bytes(4, 100_000)).unwrap();
    let j = ferry_ok(&["sync", p(&src), "/dev/null"]);
    assert_eq!(j["files_transferred"], 1, "{j}");
    assert!(fs::symlink_metadata("/dev/null")
        .unwrap()
        .file_type()
        .is_char_device());
}

/// A FIFO destination receives the bytes in order and stays a FIFO: a
/// dense file, and a sparse one that ends in segments of holes (sent as
/// `Holes`, written without growing the file).
#[test]
fn fifo_destination_receives_the_bytes() {
    let d = tempfile::tempdir().unwrap();
    let dense = d.path().join("dense");
    fs::write(&dense, bytes(5, 3 << 20)).unwrap();
    let sparse = d.path().join("sparse");
    sparse_file(&sparse, 40 << 20, &[(1 << 20, bytes(6, 100_000))]);
    let fifo = d.path().join("fifo");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    for src in [&dense, &sparse] {
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || {
                let mut v = Vec::new();
                fs::File::open(&fifo).unwrap().read_to_end(&mut v).unwrap();
                v
            })
        };
        ferry_ok(&["sync", p(src), p(&fifo)]);
        let got = reader.join().unwrap();
        assert!(
            got == fs::read(src).unwrap(),
            "{}: {} bytes",
            src.display(),
            got.len()
        );
        assert!(fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
    }
}

/// A directory source onto an existing file is refused without --force and
/// replaces it with --force; a device is never replaced.
#[test]
fn a_file_in_the_way_of_a_directory_needs_force() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("a"), b"a").unwrap();
    let dst = d.path().join("dst");
    fs::write(&dst, b"precious").unwrap();
    let out = ferry(&["sync", &slash(&src), p(&dst)]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("--force"), "{}", stderr(&out));
    assert_eq!(fs::read(&dst).unwrap(), b"precious");
    ferry_ok(&["sync", "--force", &slash(&src), p(&dst)]);
    assert_eq!(fs::read(dst.join("a")).unwrap(), b"a");
    let out = ferry(&["sync", "--force", &slash(&src), "/dev/null"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(fs::symlink_metadata("/dev/null")
        .unwrap()
        .file_type()
        .is_char_device());
}

/// `ferry sync -v many/ dst/ | head -1`: no panic, the run's own code.
#[test]
fn closed_stdout_ends_quietly_with_the_runs_code() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("many");
    fs::create_dir(&src).unwrap();
    // Long names: the listing (~100 KiB) outgrows the pipe's 64 KiB buffer,
    // so ferry must meet the closed pipe, not just fill the buffer.
    let long = "n".repeat(200);
    for i in 0..500 {
        fs::write(src.join(format!("{long}{i:04}")), bytes(i, 100)).unwrap();
    }
    let dst = d.path().join("dst");
    let mut child = Command::new(ferry_bin())
        .args(["sync", "-v", &slash(&src), p(&dst)])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    // The reading end is closed here, as `head -1` does.
    assert!(first.starts_with("new "), "{first}");
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let st = child.wait().unwrap();
    assert_eq!(st.code(), Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_same_tree(&src, &dst);
}

/// Ctrl-C: exit 130, the old file intact, no temporary file left.
#[test]
fn interrupted_run_exits_130_and_leaves_no_temp_files() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("big");
    fs::write(&src, bytes(6, 64 << 20)).unwrap();
    let dstdir = d.path().join("dst");
    fs::create_dir(&dstdir).unwrap();
    let dst = dstdir.join("big");
    fs::write(&dst, b"old").unwrap();
    // 4 MB/s: the 64 MiB take 16 s, so the signal lands mid-transfer.
    let child = Command::new(ferry_bin())
        .args(["sync", "--bwlimit", "4M", p(&src), p(&dst)])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Signal once the transfer is under way (its temp file exists), however
    // slow the machine is.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while temp_files(&dstdir).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the transfer never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200));
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap()
        .success());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    assert!(stderr(&out).contains("interrupted"));
    assert_eq!(fs::read(&dst).unwrap(), b"old");
    // Temporary files are gone; the partial file and its journal stay for
    // the next run, which resumes and leaves nothing.
    assert!(
        only_partial_state(&temp_files(&dstdir)),
        "{:?}",
        temp_files(&dstdir)
    );
    let j = ferry_ok(&["sync", p(&src), p(&dst)]);
    assert!(fs::read(&dst).unwrap() == fs::read(&src).unwrap(), "{j}");
    assert!(temp_files(&dstdir).is_empty(), "{:?}", temp_files(&dstdir));
}

/// A destination that cannot be made: exit 3 for a file and a directory
/// source alike, and the line says what ferry was doing.
#[test]
fn unwritable_destination_exits_3_and_names_the_operation() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("f"), b"x").unwrap();
    for s in [slash(&src), p(&src.join("f")).to_string()] {
        let out = ferry(&["sync", &s, "/proc/ferry-nonexistent/x"]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(3), "{s}: {err}");
        assert!(
            err.contains("create directory /proc/ferry-nonexistent"),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1, "one line: {err}");
    }
}

/// `pipe` whose ssh fails: exit 6, whatever ssh itself returned.
#[test]
fn pipe_whose_ssh_fails_exits_6() {
    for rsh in ["/bin/false", "sh -c exit"] {
        let out = Command::new(ferry_bin())
            .args(["pipe", "-e", rsh, "nohost", "--", "cat"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(6), "{rsh}: {}", stderr(&out));
    }
}

/// Counts that match the lines listed, singulars, directories apart,
/// binary units, and a dry run without a rate.
#[test]
fn summary_counts_match_the_listed_lines() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("one"), b"1").unwrap();
    let dst = d.path().join("dst");
    let out = ferry(&["sync", &slash(&src), p(&dst)]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("1 file, 1 directory: 1 transferred"),
        "{text}"
    );
    assert!(!text.contains("MB/s") && !text.contains("GB/s"), "{text}");
    fs::create_dir_all(dst.join("gone/sub")).unwrap();
    fs::write(dst.join("gone/sub/x"), b"x").unwrap();
    fs::write(dst.join("zz"), b"z").unwrap();
    let out = ferry(&["sync", "-n", "--delete", &slash(&src), p(&dst)]);
    let text = String::from_utf8_lossy(&out.stdout);
    let listed = text
        .lines()
        .filter(|l| l.starts_with("would delete"))
        .count();
    assert_eq!(listed, 4, "{text}");
    assert!(text.contains(", 4 deleted"), "{text}");
    assert!(!text.contains("B/s"), "a dry run has no rate: {text}");
    assert!(dst.join("gone/sub/x").exists(), "a dry run changes nothing");
}

/// Completions and man pages come from the parser's own definitions.
#[test]
fn completions_and_man_pages() {
    let text = |args: &[&str]| {
        let o = ferry(args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
        String::from_utf8(o.stdout).unwrap()
    };
    let bash = text(&["completions", "bash"]);
    assert!(
        bash.contains("_ferry") && bash.contains("--bwlimit"),
        "{bash}"
    );
    assert!(text(&["completions", "zsh"]).starts_with("#compdef ferry"));
    assert!(text(&["completions", "fish"]).contains("complete -c ferry"));
    let man = text(&["man"]);
    assert!(man.contains(".TH ferry 1") && man.contains("sync"), "{man}");
    let sync = text(&["man", "sync"]);
    assert!(sync.contains(".TH ferry-sync 1"), "{sync}");
    assert!(
        sync.contains("bwlimit") && sync.contains("delete"),
        "{sync}"
    );
    // The daemon has its page (serve is public since --listen).
    let serve = text(&["man", "serve"]);
    assert!(
        serve.contains(".TH ferry-serve 1") && serve.contains("listen"),
        "{serve}"
    );
    // A typo is a usage error.
    for bad in ["nope", "syncc"] {
        let o = ferry(&["man", bad]);
        assert_eq!(o.status.code(), Some(1), "{bad}");
        assert_eq!(stderr(&o).lines().count(), 1, "{bad}: {}", stderr(&o));
    }
    assert_eq!(ferry(&["completions", "tcsh"]).status.code(), Some(1));
}

/// `--progress=json`: one JSON object a second on stderr and a last one
/// with phase "done", beside --json's summary on stdout (a Pod's log).
#[test]
fn json_progress_lines_on_stderr() {
    let t = tempfile::tempdir().unwrap();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("big"), bytes(3, 24 << 20)).unwrap();
    // 24 MiB at 10 MiB/s: two seconds or more, so at least two lines.
    let o = ferry(&[
        "sync",
        "--json",
        "--progress=json",
        "--bwlimit=10M",
        &slash(&src),
        &slash(&dst),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let lines: Vec<serde_json::Value> = stderr(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|_| panic!("not JSON: {l}")))
        .collect();
    assert!(lines.len() >= 3, "{lines:?}");
    let last = lines.last().unwrap();
    assert_eq!(last["phase"], "done");
    assert_eq!(last["bytes_done"], 24 << 20);
    assert_eq!(last["files_total"], 1);
    assert!(lines
        .iter()
        .any(|l| l["phase"] == "transferring" && l["eta_s"].is_u64()));
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(summary["files_transferred"], 1);
}
