//! A file whose time changed but not its size (touched, restored from a
//! backup, copied without `-t`) is checked before it is copied (protocol
//! version 11, `Want` mode `Check`): one that holds the same bytes keeps
//! its inode and only gets the source's time; one whose bytes changed is
//! replaced. Locally, pushed and pulled over a real sshd, with rsync's
//! itemized lines for what happened.

mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::*;

/// Files that are touched (same bytes), changed (same size), and one
/// left alone; all with fixed times.
fn make(src: &Path) {
    fs::create_dir_all(src.join("d")).unwrap();
    for (name, seed) in [("same", 1), ("d/same2", 2), ("changed", 3), ("alone", 4)] {
        fs::write(src.join(name), bytes(seed, 6000)).unwrap();
        set_mtime(&src.join(name), 1_600_000_000);
    }
}

fn touch_and_change(src: &Path) {
    set_mtime(&src.join("same"), 1_600_000_500);
    set_mtime(&src.join("d/same2"), 1_600_000_600);
    let mut b = bytes(3, 6000);
    b[3000] ^= 0xff;
    fs::write(src.join("changed"), b).unwrap();
    set_mtime(&src.join("changed"), 1_600_000_700);
}

fn inodes(dst: &Path) -> Vec<u64> {
    ["same", "d/same2", "changed", "alone"]
        .iter()
        .map(|n| fs::metadata(dst.join(n)).unwrap().ino())
        .collect()
}

/// Sync `src` to `to` (a local path or `user@host:path`) with `extra`
/// flags, `-ai`; the itemized lines, sorted.
fn run(extra: &[&str], src: &str, to: &str) -> Vec<String> {
    let mut a = vec!["sync", "-ai"];
    a.extend_from_slice(extra);
    a.extend([src, to]);
    let out = ferry(&a);
    assert_eq!(
        out.status.code(),
        Some(0),
        "ferry {a:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut v: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        // The itemized lines, not the summary.
        .filter(|l| l.as_bytes().get(11) == Some(&b' '))
        .map(|l| l.to_string())
        .collect();
    v.sort();
    v
}

/// What the run must have done to `dst`: the touched files kept (same
/// inode, the source's time), the changed one replaced.
fn check(src: &Path, dst: &Path, before: &[u64], lines: &[String], sent: char) {
    let after = inodes(dst);
    assert_eq!(after[0], before[0], "same: rewritten; {lines:?}");
    assert_eq!(after[1], before[1], "d/same2: rewritten; {lines:?}");
    assert_ne!(after[2], before[2], "changed: not replaced; {lines:?}");
    assert_eq!(after[3], before[3], "alone: rewritten");
    assert_same_tree(src, dst);
    for want in [
        ".f..t...... same".to_string(),
        ".f..t...... d/same2".to_string(),
        format!("{sent}f..t...... changed"),
    ] {
        assert!(lines.contains(&want), "{want:?} not in {lines:?}");
    }
    assert!(!lines.iter().any(|l| l.ends_with(" alone")), "{lines:?}");
}

#[test]
fn a_touched_file_is_checked_not_copied_locally() {
    let d = tempfile::tempdir().unwrap();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    make(&src);
    run(&[], &slash(&src), p(&dst));
    let before = inodes(&dst);
    touch_and_change(&src);
    let lines = run(&[], &slash(&src), p(&dst));
    check(&src, &dst, &before, &lines, '>');
    // Nothing left to do.
    let again = run(&[], &slash(&src), p(&dst));
    assert!(again.is_empty(), "{again:?}");
    // With --checksum the contents are compared up front instead: the
    // same outcome for a touched file.
    set_mtime(&src.join("same"), 1_600_000_900);
    let lines = run(&["--checksum"], &slash(&src), p(&dst));
    assert_eq!(lines, [".f..t...... same"]);
    assert_eq!(inodes(&dst)[0], before[0]);
}

#[test]
fn a_touched_file_is_checked_not_copied_over_ssh() {
    let Some(srv) = SshServer::start("a_touched_file_is_checked_not_copied_over_ssh") else {
        return;
    };
    let bin = ferry_bin();
    let rsh = srv.rsh();
    let remote = ["-e", &rsh, "--remote-ferry", p(&bin)];
    let d = tempfile::tempdir().unwrap();
    // Pushed: the remote receiver checks.
    let (src, dst) = (d.path().join("src"), d.path().join("pushed"));
    make(&src);
    run(&remote, &slash(&src), &srv.remote(&dst));
    let before = inodes(&dst);
    touch_and_change(&src);
    let lines = run(&remote, &slash(&src), &srv.remote(&dst));
    check(&src, &dst, &before, &lines, '<');
    // Pulled: the remote sender answers.
    let (src2, dst2) = (d.path().join("src2"), d.path().join("pulled"));
    make(&src2);
    let from = format!("{}/", srv.remote(&src2));
    run(&remote, &from, p(&dst2));
    let before = inodes(&dst2);
    touch_and_change(&src2);
    let lines = run(&remote, &from, p(&dst2));
    check(&src2, &dst2, &before, &lines, '>');
}
