//! The list window of protocol version 10 (`Decided`), through the real
//! binary: lists longer than the window, locally and through a real sshd.

mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::*;

fn remote_args<'a>(ssh: &'a str, bin: &'a str, rest: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["sync", "-e", ssh, "--remote-ferry", bin];
    v.extend_from_slice(rest);
    v
}

/// A list longer than the 65,536-entry window of protocol version 10: the
/// sender waits for the receiver's `Decided` and forgets what was decided;
/// a hard link reaches back across the window by path. Locally, then
/// pushed and pulled through a real sshd, each followed by a re-run that
/// moves only the one file changed past the window.
#[test]
fn a_list_longer_than_the_window_goes_through() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    // 70 directories of 1,000 files: 70,071 entries with the root.
    for i in 0..70 {
        let dir = src.join(format!("d{i:02}"));
        fs::create_dir_all(&dir).unwrap();
        for j in 0..1000 {
            let body = if j % 100 == 0 {
                format!("{i}/{j}")
            } else {
                String::new()
            };
            fs::write(dir.join(format!("f{j:03}")), body).unwrap();
        }
    }
    fs::hard_link(src.join("d00/f100"), src.join("d69/zz-link")).unwrap();
    let check = |dst: &Path| {
        assert_same_tree(&src, dst);
        let (a, b) = (dst.join("d00/f100"), dst.join("d69/zz-link"));
        assert_eq!(
            fs::metadata(&a).unwrap().ino(),
            fs::metadata(&b).unwrap().ino(),
            "the hard link across the window"
        );
    };
    let changed = src.join("d68/f500");
    let change = |n: i64| {
        fs::write(&changed, format!("changed {n}")).unwrap();
        set_mtime(&changed, 1_700_000_000 + n);
    };
    let local = d.path().join("local");
    let j = ferry_ok(&["sync", &slash(&src), p(&local)]);
    assert_eq!(j["files_total"], 70_001, "{j}");
    check(&local);
    change(1);
    let j = ferry_ok(&["sync", &slash(&src), p(&local)]);
    assert_eq!(j["files_transferred"], 1, "{j}");
    check(&local);

    let Some(srv) = SshServer::start("a_list_longer_than_the_window_goes_through") else {
        return;
    };
    let rsh = srv.rsh();
    let bin = ferry_bin();
    let bin = p(&bin);
    let pushed = d.path().join("pushed");
    ferry_ok(&remote_args(
        &rsh,
        bin,
        &[&slash(&src), &srv.remote(&pushed)],
    ));
    check(&pushed);
    change(2);
    let j = ferry_ok(&remote_args(
        &rsh,
        bin,
        &[&slash(&src), &srv.remote(&pushed)],
    ));
    assert_eq!(j["files_transferred"], 1, "{j}");
    check(&pushed);
    let pulled = d.path().join("pulled");
    let from = format!("{}/", srv.remote(&src));
    ferry_ok(&remote_args(&rsh, bin, &[&from, p(&pulled)]));
    check(&pulled);
}

/// The window counts entries sent, not ids: 70,000 skipped symlinks
/// (`--no-links`) use up ids the receiver never sees, and the file after
/// them still goes (a window in ids would wait for ever). Locally and
/// pushed through a real sshd, each under a deadline.
#[test]
fn a_long_run_of_skipped_entries_does_not_close_the_window() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    fs::create_dir_all(src.join("links")).unwrap();
    for i in 0..70_000 {
        std::os::unix::fs::symlink("nowhere", src.join(format!("links/l{i:05}"))).unwrap();
    }
    fs::write(src.join("z"), b"after the links").unwrap();
    let run = |args: &[&str]| {
        let mut child = std::process::Command::new(ferry_bin())
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let t = std::time::Instant::now();
        while child.try_wait().unwrap().is_none() {
            if t.elapsed() > std::time::Duration::from_secs(120) {
                let _ = child.kill();
                panic!("ferry {args:?} still running after 120 s: the window closed");
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        assert!(child.wait().unwrap().success(), "ferry {args:?} failed");
    };
    let local = d.path().join("local");
    run(&["sync", "-q", "--no-links", &slash(&src), p(&local)]);
    assert_eq!(fs::read(local.join("z")).unwrap(), b"after the links");
    assert_eq!(fs::read_dir(local.join("links")).unwrap().count(), 0);

    let Some(srv) = SshServer::start("a_long_run_of_skipped_entries_does_not_close_the_window")
    else {
        return;
    };
    let rsh = srv.rsh();
    let bin = ferry_bin();
    let pushed = d.path().join("pushed");
    let dst = srv.remote(&pushed);
    let s = slash(&src);
    run(&[
        "sync",
        "-q",
        "--no-links",
        "-e",
        &rsh,
        "--remote-ferry",
        p(&bin),
        &s,
        &dst,
    ]);
    assert_eq!(fs::read(pushed.join("z")).unwrap(), b"after the links");
}
