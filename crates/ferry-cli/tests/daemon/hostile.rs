//! Clients that hold the key and try to reach past the root: each attack
//! a hostile review made against the first daemon, now a regression test.
//! A scripted client (`ferry_core`'s own client half) holds a session open
//! at the moment that matters while a stock `ferry` plants a symlink.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use ferry_core::remote::daemon::daemon_connect;
use ferry_core::{Stats, SyncOptions};
use ferry_link::stripe::Streams;

use crate::common::*;
use crate::{code, key_file, pull, run, stderr, Daemon, KEY};

fn psk() -> ferry_channel::Psk {
    ferry_channel::Psk::new(KEY.as_bytes()).unwrap()
}

fn args(send: bool, extra: &[&str], path: &str) -> Vec<String> {
    let dir = if send { "--send" } else { "--receive" };
    let mut a: Vec<String> = ["serve", "--stdio", dir, "--threads=1"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    a.extend(extra.iter().map(|s| s.to_string()));
    a.push("--".into());
    a.push(path.into());
    a
}

/// An `outside` directory next to the root, with a secret, and a source
/// tree whose `name` is a symlink to it (what a hostile client pushes).
fn outside_and_planter(t: &Path, name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let outside = t.join("outside");
    std::fs::create_dir_all(outside.join("ssh")).unwrap();
    std::fs::write(outside.join("secret"), b"SECRET").unwrap();
    std::fs::write(outside.join("ssh/hostkey"), b"HOSTKEY-SECRET").unwrap();
    let touched = Command::new("touch")
        .args(["-m", "-d", "@1600000000"])
        .arg(&outside)
        .status()
        .unwrap();
    assert!(touched.success());
    let planter = t.join(format!("plant-{name}"));
    std::fs::create_dir(&planter).unwrap();
    std::os::unix::fs::symlink(&outside, planter.join(name)).unwrap();
    (outside, planter)
}

fn outside_untouched(outside: &Path) {
    let mut names: Vec<_> = std::fs::read_dir(outside)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["secret", "ssh"]);
    assert_eq!(std::fs::read(outside.join("secret")).unwrap(), b"SECRET");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(outside).unwrap().mtime(), 1_600_000_000);
}

fn contains_secret(dir: &Path) -> bool {
    let out = Command::new("grep")
        .args(["-r", "-l", "SECRET"])
        .arg(dir)
        .output()
        .unwrap();
    !out.stdout.is_empty()
}

/// A stock `ferry sync` started in the background.
fn background(args: &[&str]) -> std::process::Child {
    Command::new(ferry_bin())
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn a_symlink_planted_while_a_push_waits_for_its_list_is_never_followed() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let (outside, planter) = outside_and_planter(t.path(), "z");
    let key = key_file(t.path(), KEY);
    let d = Daemon::start(&key, &["--root", p(&root)]);
    // Session A: a push whose destination `z` does not exist yet, accepted,
    // then quiet before its list.
    let (ep, flushed) = daemon_connect(
        "127.0.0.1",
        d.port,
        &psk(),
        &args(false, &["--file-or-dir", "--delete"], "z"),
        Streams::Fixed(1),
    )
    .unwrap();
    // Session B plants root/z -> outside meanwhile.
    let b = background(&[
        "sync",
        "--force",
        &slash(&planter),
        &d.url(""),
        "--key-file",
        p(&key),
    ]);
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        std::fs::symlink_metadata(root.join("z")).is_err(),
        "B ran while A held the root"
    );
    // A sends its list: a directory with entries.
    let src = t.path().join("src-a");
    std::fs::create_dir_all(src.join("pwned_dir")).unwrap();
    std::fs::write(src.join("f"), b"from a").unwrap();
    let specs =
        ferry_core::plan::source_specs(&[slash(&src)], |p| Some(Path::new(p).is_dir())).unwrap();
    let opts = SyncOptions {
        threads: 1,
        ..Default::default()
    };
    ferry_core::sender::run_sender(ep, &specs, &opts, &Stats::default(), false).unwrap();
    flushed.wait_for(Some(Duration::from_secs(10)));
    let out = b.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    outside_untouched(&outside);
    // A's files went beneath the root; B then replaced z with its symlink.
    assert!(std::fs::symlink_metadata(root.join("z"))
        .unwrap()
        .file_type()
        .is_symlink());
}

#[test]
fn a_pull_sees_no_symlink_that_another_session_plants_under_it() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    std::fs::create_dir_all(root.join("p/b/ssh")).unwrap();
    std::fs::write(root.join("p/a_big"), bytes(5, 24 << 20)).unwrap();
    std::fs::write(root.join("p/b/ssh/hostkey"), b"inside").unwrap();
    let (outside, planter) = outside_and_planter(t.path(), "b");
    let key = key_file(t.path(), KEY);
    let d = Daemon::start(&key, &["--root", p(&root)]);
    let k = p(&key);
    // A slow pull (20 MB/s), its walk long done when b is swapped.
    let got = t.path().join("got");
    let url = d.url("p/");
    let slow = background(&[
        "sync",
        "--bwlimit=20M",
        "--compress=none",
        &url,
        p(&got),
        "--key-file",
        k,
    ]);
    std::thread::sleep(Duration::from_millis(500));
    let push = run(&[
        "sync",
        "--force",
        &slash(&planter),
        &d.url("p/"),
        "--key-file",
        k,
    ]);
    assert!(push.status.success(), "{}", stderr(&push));
    let pulled = slow.wait_with_output().unwrap();
    assert!(
        pulled.status.success(),
        "{}",
        String::from_utf8_lossy(&pulled.stderr)
    );
    assert_eq!(std::fs::read(got.join("b/ssh/hostkey")).unwrap(), b"inside");
    assert!(!contains_secret(&got));
    outside_untouched(&outside);
    // The push went in after the pull: b is its symlink now, and a pull of
    // it is refused.
    assert!(std::fs::symlink_metadata(root.join("p/b"))
        .unwrap()
        .file_type()
        .is_symlink());
    let again = pull(&d, "p/b/", &t.path().join("again"), k);
    assert_eq!(code(&again), 3, "{}", stderr(&again));
    // What a pull names must exist when it is accepted: no waiting for a
    // symlink to appear there.
    let missing = pull(&d, "p/x/", &t.path().join("x"), k);
    assert_eq!(code(&missing), 3, "{}", stderr(&missing));
}

#[test]
fn pushed_files_carry_no_privilege_and_no_backup_lands_beside_a_device() {
    let t = tempfile::tempdir().unwrap();
    let (root, src) = (t.path().join("root"), t.path().join("src"));
    std::fs::create_dir(&root).unwrap();
    std::fs::create_dir(&src).unwrap();
    let f = src.join("tool");
    std::fs::write(&f, b"#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o6755)).unwrap();
    std::fs::create_dir(src.join("shared")).unwrap();
    std::fs::set_permissions(
        src.join("shared"),
        std::os::unix::fs::PermissionsExt::from_mode(0o3777),
    )
    .unwrap();
    let mut names = vec!["user.note"];
    if is_root() {
        names.push("trusted.ferry");
        names.push("security.ferry");
    }
    for n in &names {
        let o = Command::new("setfattr")
            .args(["-n", n, "-v", "1"])
            .arg(&f)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "setfattr {n}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let key = key_file(t.path(), KEY);
    let d = Daemon::start(&key, &["--root", p(&root)]);
    ferry_ok(&[
        "sync",
        "--xattrs",
        &slash(&src),
        &d.url("in/"),
        "--key-file",
        p(&key),
    ]);
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&root.join("in/tool")), 0o755, "set-ID bits kept");
    assert_eq!(
        mode(&root.join("in/shared")),
        0o1777,
        "only the sticky bit stays"
    );
    let attrs = Command::new("getfattr")
        .args(["-d", "-m", "-"])
        .arg(root.join("in/tool"))
        .output()
        .unwrap();
    let attrs = String::from_utf8_lossy(&attrs.stdout);
    assert!(attrs.contains("user.note"), "{attrs}");
    assert!(
        !attrs.contains("trusted.") && !attrs.contains("security."),
        "{attrs}"
    );

    // A device daemon: --backup would name a file beside the device.
    let dev = t.path().join("dev/disk.img");
    std::fs::create_dir(t.path().join("dev")).unwrap();
    std::fs::write(&dev, vec![0u8; 1 << 20]).unwrap();
    std::fs::write(t.path().join("dev/disk.img.conf"), b"operator config").unwrap();
    let img = t.path().join("new.img");
    std::fs::write(&img, bytes(9, 1 << 20)).unwrap();
    let dd = Daemon::start(&key, &["--device", p(&dev)]);
    let o = run(&[
        "sync",
        "--backup",
        "--suffix=.conf",
        p(&img),
        &dd.url(""),
        "--key-file",
        p(&key),
    ]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert_eq!(
        std::fs::read(t.path().join("dev/disk.img.conf")).unwrap(),
        b"operator config"
    );
}

#[test]
fn a_client_that_never_starts_its_session_loses_its_slot() {
    let t = tempfile::tempdir().unwrap();
    let (root, src) = (t.path().join("root"), t.path().join("src"));
    std::fs::create_dir_all(root.join("d")).unwrap();
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("f"), b"x").unwrap();
    let key = key_file(t.path(), KEY);
    let d = Daemon::start(&key, &["--root", p(&root), "--max-sessions", "1"]);
    // Accepted, then silent: no Hello ever.
    let held = daemon_connect(
        "127.0.0.1",
        d.port,
        &psk(),
        &args(true, &[], "d/"),
        Streams::Fixed(1),
    )
    .unwrap();
    let o = run(&[
        "sync",
        "--retries=0",
        &slash(&src),
        &d.url("e/"),
        "--key-file",
        p(&key),
    ]);
    assert_eq!(code(&o), 5, "{}", stderr(&o));
    let t0 = Instant::now();
    loop {
        let o = run(&[
            "sync",
            "--retries=0",
            &slash(&src),
            &d.url("e/"),
            "--key-file",
            p(&key),
        ]);
        if o.status.success() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the silent client kept its slot: {}",
            stderr(&o)
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    drop(held);
    // A path with control characters is logged escaped, never as lines.
    let evil = "x\nferry serve: 10.0.0.9:4444: pull \"secrets\": done\u{1b}[2J";
    let _ = daemon_connect(
        "127.0.0.1",
        d.port,
        &psk(),
        &args(true, &[], evil),
        Streams::Fixed(1),
    );
    std::thread::sleep(Duration::from_millis(300));
    let log = d.log();
    assert!(
        !log.lines().any(|l| l.starts_with("ferry serve: 10.0.0.9")),
        "{log}"
    );
    assert!(!log.contains('\u{1b}'), "{log}");
}

#[test]
fn a_push_never_writes_into_a_fifo_and_a_device_daemon_needs_its_device() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let fifo = root.join("fifo");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let f = t.path().join("f");
    std::fs::write(&f, b"data").unwrap();
    let key = key_file(t.path(), KEY);
    let d = Daemon::start(&key, &["--root", p(&root)]);
    let o = run(&[
        "sync",
        "--timeout=5",
        p(&f),
        &d.url("fifo"),
        "--key-file",
        p(&key),
    ]);
    assert_eq!(code(&o), 3, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("neither a regular file nor a directory"),
        "{}",
        stderr(&o)
    );
    // The daemon was not stuck on it: the next push goes through.
    ferry_ok(&["sync", p(&f), &d.url("g"), "--key-file", p(&key)]);
    // A device daemon whose device is missing does not start (a push
    // would make a directory tree there).
    let o = Command::new(ferry_bin())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--key-file",
            p(&key),
            "--device",
        ])
        .arg(t.path().join("missing.img"))
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// What protocol 8 added gives a daemon's client nothing more: `--no-perms`
/// does not bring back the set-ID bits of the file it replaces, `-D` makes
/// no device node (a FIFO, which gives nothing, it makes), and a
/// write-only daemon lists nothing it holds.
#[test]
fn no_perms_specials_and_listings_give_a_client_nothing_more() {
    use std::os::unix::fs::PermissionsExt;
    let t = tempfile::tempdir().unwrap();
    let (root, src) = (t.path().join("root"), t.path().join("src"));
    std::fs::create_dir_all(root.join("in/secret")).unwrap();
    std::fs::write(root.join("in/secret/passwords.txt"), b"hunter2").unwrap();
    std::fs::write(root.join("in/tool"), b"old").unwrap();
    std::fs::set_permissions(
        root.join("in/tool"),
        std::fs::Permissions::from_mode(0o6755),
    )
    .unwrap();
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("tool"), b"#!/bin/sh\necho mine\n").unwrap();
    let ok = Command::new("mkfifo")
        .arg(src.join("fifo"))
        .status()
        .unwrap();
    assert!(ok.success());
    if is_root() {
        let ok = Command::new("mknod")
            .arg(src.join("disk"))
            .args(["b", "7", "0"])
            .status()
            .unwrap();
        assert!(ok.success());
    }
    let key = key_file(t.path(), KEY);
    let d = Daemon::start(&key, &["--root", p(&root)]);
    let o = run(&[
        "sync",
        "-rD",
        "--no-perms",
        &slash(&src),
        &d.url("in/"),
        "--key-file",
        p(&key),
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let tool = root.join("in/tool");
    assert_eq!(std::fs::read(&tool).unwrap(), b"#!/bin/sh\necho mine\n");
    let mode = std::fs::metadata(&tool).unwrap().permissions().mode();
    assert_eq!(mode & 0o6000, 0, "set-ID bits came back: {mode:o}");
    use std::os::unix::fs::FileTypeExt;
    let fifo = std::fs::symlink_metadata(root.join("in/fifo")).unwrap();
    assert!(fifo.file_type().is_fifo());
    assert!(
        std::fs::symlink_metadata(root.join("in/disk")).is_err(),
        "a device node was made"
    );

    // A write-only daemon: a dry run with --delete -i lists nothing of it.
    let w = Daemon::start(&key, &["--root", p(&root), "--write-only"]);
    let empty = t.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let o = run(&[
        "sync",
        "-n",
        "-i",
        "--delete",
        &slash(&empty),
        &w.url("in/"),
        "--key-file",
        p(&key),
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        !out.contains("secret") && !out.contains("deleting"),
        "{out}"
    );
    assert!(root.join("in/secret/passwords.txt").exists());
}

/// A client accepted for a stream that never starts it (nor sends a
/// keepalive) gives back the root it holds alone within the daemon's
/// timeout: the next push gets through, and the silent one's file is
/// only created.
#[test]
fn a_stream_that_never_starts_gives_back_the_root() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let key = key_file(t.path(), KEY);
    let d = Daemon::start(&key, &["--root", p(&root), "--timeout", "3"]);
    let req: Vec<String> = ["recv", "--", "silent"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let held = ferry_core::remote::daemon::daemon_stream(
        "127.0.0.1",
        d.port,
        &psk(),
        &req,
        Streams::Fixed(1),
    )
    .unwrap();
    let input = t.path().join("in");
    std::fs::write(&input, b"next").unwrap();
    let start = Instant::now();
    let o = run(&["send", &d.url("next"), p(&input), "--key-file", p(&key)]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(std::fs::read(root.join("next")).unwrap(), b"next");
    assert_eq!(std::fs::read(root.join("silent")).unwrap(), b"");
    drop(held);
}
