//! `ferry sync` across a real sshd on 127.0.0.1: push, pull, delta over
//! the link, and every way the link can fail.

mod common;
#[path = "remote/paths.rs"]
mod paths;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::*;

fn tree(root: &Path) {
    fs::create_dir_all(root.join("a/b")).unwrap();
    fs::write(root.join("a/one.bin"), bytes(1, 3 << 20)).unwrap();
    fs::write(root.join("a/b/two.txt"), b"two").unwrap();
    fs::write(root.join("top.txt"), b"top").unwrap();
    std::os::unix::fs::symlink("a/b/two.txt", root.join("link")).unwrap();
    fs::hard_link(root.join("top.txt"), root.join("top-again.txt")).unwrap();
}

fn remote_args<'a>(ssh: &'a str, bin: &'a str, rest: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["sync", "-e", ssh, "--remote-ferry", bin];
    v.extend_from_slice(rest);
    v
}

#[test]
fn push_and_pull_trees_and_files() {
    let Some(srv) = SshServer::start("push_and_pull_trees_and_files") else {
        return;
    };
    let rsh = srv.rsh();
    let bin = ferry_bin();
    let bin = p(&bin);
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    tree(&src);
    // Push the contents, re-run: nothing moves.
    let pushed = d.path().join("pushed");
    let dst = srv.remote(&pushed);
    let j = ferry_ok(&remote_args(&rsh, bin, &[&slash(&src), &dst]));
    assert_same_tree(&src, &pushed);
    assert!(j["bytes_wire"].as_u64().unwrap() > 3 << 20);
    // Through ssh's pipes: no direct connection.
    assert_eq!(j["direct_connections"], 0);
    let again = ferry_ok(&remote_args(&rsh, bin, &[&slash(&src), &dst]));
    assert_eq!(again["files_transferred"], 0);
    assert!(again["bytes_wire"].as_u64().unwrap() < 10_000);
    // Pull the directory itself.
    let pulled = d.path().join("pulled");
    let from = srv.remote(&src);
    ferry_ok(&remote_args(&rsh, bin, &[&from, p(&pulled)]));
    assert_same_tree(&src, &pulled.join("src"));
    // A single file pushed and pulled to a new name.
    let one = srv.remote(&d.path().join("copy.bin"));
    ferry_ok(&remote_args(&rsh, bin, &[p(&src.join("a/one.bin")), &one]));
    assert!(
        fs::read(d.path().join("copy.bin")).unwrap() == fs::read(src.join("a/one.bin")).unwrap()
    );
    ferry_ok(&remote_args(
        &rsh,
        bin,
        &[&one, p(&d.path().join("back.bin"))],
    ));
    assert!(
        fs::read(d.path().join("back.bin")).unwrap() == fs::read(src.join("a/one.bin")).unwrap()
    );
}

#[test]
fn changed_file_goes_as_a_delta_over_the_link() {
    let Some(srv) = SshServer::start("changed_file_goes_as_a_delta_over_the_link") else {
        return;
    };
    let rsh = srv.rsh();
    let bin = ferry_bin();
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("big");
    let mut data = bytes(3, 16 << 20);
    fs::write(&src, &data).unwrap();
    let dst = d.path().join("big.remote");
    ferry_ok(&remote_args(&rsh, p(&bin), &[p(&src), &srv.remote(&dst)]));
    data[7 << 20..(7 << 20) + 5000].fill(1);
    fs::write(&src, &data).unwrap();
    let j = ferry_ok(&remote_args(&rsh, p(&bin), &[p(&src), &srv.remote(&dst)]));
    assert!(fs::read(&dst).unwrap() == data);
    assert_eq!(j["files_delta"], 1, "{j}");
    assert!(j["bytes_wire"].as_u64().unwrap() < 1 << 20, "{j}");
    // A small changed file goes whole: a signature round trip costs more.
    let small = d.path().join("small");
    fs::write(&small, bytes(5, 20_000)).unwrap();
    let small_dst = d.path().join("small.remote");
    ferry_ok(&remote_args(
        &rsh,
        p(&bin),
        &[p(&small), &srv.remote(&small_dst)],
    ));
    fs::write(&small, bytes(6, 20_000)).unwrap();
    let j = ferry_ok(&remote_args(
        &rsh,
        p(&bin),
        &[p(&small), &srv.remote(&small_dst)],
    ));
    assert_eq!(j["files_delta"], 0, "{j}");
    assert!(fs::read(&small_dst).unwrap() == fs::read(&small).unwrap());
}

#[test]
fn failures_give_one_clear_line_and_documented_codes() {
    let Some(srv) = SshServer::start("failures_give_one_clear_line_and_documented_codes") else {
        return;
    };
    let rsh = srv.rsh();
    let bin = ferry_bin();
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("f");
    fs::write(&src, b"data").unwrap();
    let dst = srv.remote(&d.path().join("g"));

    // ssh cannot connect: wrong port.
    let bad = rsh.replace(&format!("-p {}", srv.port), "-p 1");
    let out = ferry(&remote_args(&bad, p(&bin), &[p(&src), &dst]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{err}");
    assert!(err.contains("ssh to") && err.contains("failed"), "{err}");

    // No ferry on the other side.
    let out = ferry(&remote_args(&rsh, "/nonexistent/ferry", &[p(&src), &dst]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{err}");
    assert!(
        err.contains("not installed") && err.contains("--deploy"),
        "{err}"
    );

    // With --rsync-exit-codes, rsync's numbers for the same failures:
    // 255 when ssh fails, 12 when the remote shell finds no such program.
    // (rsync 3.5.0 itself gives 255 or 12 for the first, 12 or 127 for
    // the second, depending on whether it reaps ssh before it reports;
    // measured over this sshd. ferry gives one number for each.)
    let out = ferry(&remote_args(
        &bad,
        p(&bin),
        &["--rsync-exit-codes", p(&src), &dst],
    ));
    assert_eq!(out.status.code(), Some(255));
    let none = "/nonexistent/ferry";
    let out = ferry(&remote_args(
        &rsh,
        none,
        &["--rsync-exit-codes", p(&src), &dst],
    ));
    assert_eq!(out.status.code(), Some(12));
    // Something that is not ferry answers.
    let out = ferry(&remote_args(&rsh, "/bin/echo", &[p(&src), &dst]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(err.contains("did not answer as ferry"), "{err}");

    // An incompatible version.
    let wrapper = d.path().join("old-ferry");
    fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nFERRY_TEST_PROTOCOL_VERSION=99 exec {} \"$@\"\n",
            bin.display()
        ),
    )
    .unwrap();
    fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755)).unwrap();
    let out = ferry(&remote_args(&rsh, p(&wrapper), &[p(&src), &dst]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        err.contains("version 99") && err.contains("run with --deploy"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");

    // A directory pushed onto a file (named `file/` or `file`): refused
    // as a usage error (exit 1), the file untouched; a dry run says the
    // same.
    let tree_src = d.path().join("t");
    tree(&tree_src);
    let tree_src = slash(&tree_src);
    for to in ["f/", "f"] {
        for dry in [&["-n"][..], &[]] {
            let to = srv.remote(&d.path().join(to));
            let args = [dry, &[&tree_src, &to]].concat();
            let out = ferry(&remote_args(&rsh, p(&bin), &args));
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{to}: {err}");
            assert!(err.contains("--force replaces it"), "{err}");
            assert_eq!(fs::read(&src).unwrap(), b"data");
        }
    }

    // With --force, a file in the way of the destination directory is
    // replaced only once the sender lists something: a pull of a source
    // that is not there leaves it.
    let in_way = d.path().join("in-way");
    fs::write(&in_way, b"mine").unwrap();
    let missing = srv.remote(&d.path().join("missing"));
    let to = slash(&in_way);
    let out = ferry(&remote_args(&rsh, p(&bin), &["--force", &missing, &to]));
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(fs::read(&in_way).unwrap(), b"mine");

    // A pull of a source that is not there leaves no destination behind
    // (as with rsync), with a trailing slash or without.
    for to in ["new/", "new"] {
        let to = d.path().join(to);
        let missing = srv.remote(&d.path().join("missing"));
        let out = ferry(&remote_args(&rsh, p(&bin), &[&missing, p(&to)]));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{err}");
        assert!(err.contains("no such file"), "{err}");
        assert!(!d.path().join("new").exists(), "{to:?} made: {err}");
    }
}

#[test]
fn remote_that_dies_mid_transfer_leaves_the_old_file() {
    let Some(srv) = SshServer::start("remote_that_dies_mid_transfer_leaves_the_old_file") else {
        return;
    };
    let rsh = srv.rsh();
    let bin = ferry_bin();
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("big");
    fs::write(&src, bytes(4, 64 << 20)).unwrap();
    let target_dir = d.path().join("remote");
    fs::create_dir(&target_dir).unwrap();
    fs::write(target_dir.join("big"), b"old").unwrap();
    // The remote ferry is terminated after half a second; --bwlimit keeps
    // the transfer going longer than that.
    let wrapper = d.path().join("dying-ferry");
    fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec timeout -s TERM 0.5 {} \"$@\"\n",
            bin.display()
        ),
    )
    .unwrap();
    fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755)).unwrap();
    let start = std::time::Instant::now();
    let out = ferry(&remote_args(
        &rsh,
        p(&wrapper),
        &[
            "--retries",
            "0",
            "--bwlimit",
            "20M",
            p(&src),
            &srv.remote(&target_dir),
        ],
    ));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{err}");
    assert!(err.contains("lost"), "{err}");
    assert!(
        start.elapsed().as_secs() < 20,
        "the sender noticed promptly"
    );
    assert!(
        fs::read(target_dir.join("big")).unwrap() == b"old",
        "old file kept"
    );
    // Nothing is left but the partial file and its journal, kept for the
    // next run to resume.
    assert!(
        only_partial_state(&temp_files(&target_dir)),
        "{:?}",
        temp_files(&target_dir)
    );
}

#[test]
fn compression_pays_on_text_and_costs_nothing_on_random() {
    let Some(srv) = SshServer::start("compression_pays_on_text_and_costs_nothing_on_random") else {
        return;
    };
    let rsh = srv.rsh();
    let bin = ferry_bin();
    let d = tempfile::tempdir().unwrap();
    let text: Vec<u8> = (0..8 << 20)
        .map(|i: usize| b"ferry moves data between hosts; "[i % 32] ^ ((i / 4096) as u8 & 1))
        .collect();
    let src = d.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("text"), &text).unwrap();
    fs::write(src.join("random"), bytes(9, 8 << 20)).unwrap();
    let total = 16u64 << 20;
    for (mode, min, max) in [
        ("auto", total / 2, total + total / 50),
        ("zstd:3", total / 2, total + total / 50),
        ("none", total, total + total / 50),
    ] {
        let dst = d.path().join(format!("dst-{mode}"));
        // A 100 MB/s link: compression pays when it beats that.
        let j = ferry_ok(&remote_args(
            &rsh,
            p(&bin),
            &[
                "--compress",
                mode,
                "--bwlimit",
                "100M",
                &slash(&src),
                &srv.remote(&dst),
            ],
        ));
        assert_same_tree(&src, &dst);
        let wire = j["bytes_wire"].as_u64().unwrap();
        assert!(
            wire >= min && wire <= max,
            "{mode}: {wire} bytes on the wire for {total}"
        );
        if mode != "none" {
            assert!(wire < total * 3 / 4, "{mode}: text compressed: {wire}");
        }
    }
}

/// `--direct`, on one connection (`auto` on loopback) and striped over
/// several (`--streams N`), both ways, with a file large enough to cross
/// all of them.
#[test]
fn direct_channel_push_and_pull() {
    let Some(srv) = SshServer::start("direct_channel_push_and_pull") else {
        return;
    };
    let rsh = srv.rsh();
    let bin = ferry_bin();
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    tree(&src);
    fs::write(src.join("big.bin"), bytes(9, 40 << 20)).unwrap();
    // auto: loopback's round trip asks for one connection.
    for (n, want) in [("auto", 1), ("3", 3), ("8", 8)] {
        let pushed = d.path().join(format!("pushed-{n}"));
        let to = srv.remote(&pushed);
        let j = ferry_ok(&remote_args(
            &rsh,
            p(&bin),
            &["--direct", "--streams", n, &slash(&src), &to],
        ));
        assert_same_tree(&src, &pushed);
        assert!(j["bytes_wire"].as_u64().unwrap() > 40 << 20);
        assert_eq!(j["direct_connections"], want, "--streams {n}");
        let pulled = d.path().join(format!("pulled-{n}"));
        let from = format!("{}/", srv.remote(&src));
        ferry_ok(&remote_args(
            &rsh,
            p(&bin),
            &["--direct", "--streams", n, &from, p(&pulled)],
        ));
        assert_same_tree(&src, &pulled);
    }
}

/// `--direct` when the offered port cannot be reached (a firewall): the
/// run goes on through ssh, says so, and the copy is complete.
#[test]
fn direct_falls_back_to_ssh_when_unreachable() {
    let Some(srv) = SshServer::start("direct_falls_back_to_ssh_when_unreachable") else {
        return;
    };
    let rsh = srv.rsh();
    let bin = ferry_bin();
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    tree(&src);
    for (name, args) in [
        (
            "pushed",
            vec![
                "--direct".to_string(),
                slash(&src),
                srv.remote(&d.path().join("pushed")),
            ],
        ),
        (
            "pulled",
            vec![
                "--direct".to_string(),
                format!("{}/", srv.remote(&src)),
                p(&d.path().join("pulled")).to_string(),
            ],
        ),
    ] {
        let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
        args.push("--json");
        let out = std::process::Command::new(&bin)
            .args(remote_args(&rsh, p(&bin), &args))
            .env("FERRY_TEST_DIRECT_UNREACHABLE", "1")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}: {err}");
        assert!(
            err.contains("note:") && err.contains("through ssh"),
            "{name}: {err}"
        );
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let notices = j["notices"].as_array().unwrap();
        assert!(
            notices
                .iter()
                .any(|n| n.as_str().unwrap().contains("instead of --direct")),
            "{j}"
        );
        assert_same_tree(&src, &d.path().join(name));
    }
}

/// `--direct` to an ssh alias (`Host NAME` with `HostName` in an ssh
/// config): the name does not resolve here, but ssh got there; the direct
/// connection goes to the address ssh reached, with no fallback.
#[test]
fn direct_through_an_ssh_alias() {
    let Some(srv) = SshServer::start("direct_through_an_ssh_alias") else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let cfg = d.path().join("ssh_config");
    std::fs::write(
        &cfg,
        "Host ferry-test-alias.invalid\n  HostName 127.0.0.1\n",
    )
    .unwrap();
    let rsh = format!("{} -F {}", srv.rsh(), cfg.display());
    let alias = |path: &std::path::Path| {
        srv.remote(path)
            .replacen("@127.0.0.1:", "@ferry-test-alias.invalid:", 1)
    };
    let bin = ferry_bin();
    let src = d.path().join("src");
    tree(&src);
    for (name, from, to) in [
        ("pushed", slash(&src), alias(&d.path().join("pushed"))),
        (
            "pulled",
            format!("{}/", alias(&src)),
            p(&d.path().join("pulled")).to_string(),
        ),
    ] {
        let out = std::process::Command::new(&bin)
            .args(remote_args(
                &rsh,
                p(&bin),
                &["--direct", "--json", &from, &to],
            ))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}: {err}");
        assert!(!err.contains("through ssh"), "{name}: fell back: {err}");
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(j["notices"], serde_json::json!([]), "{name}: {j}");
        assert_same_tree(&src, &d.path().join(name));
    }
}

/// `producer | ferry pipe host -- COMMAND` through a real sshd, direct and
/// through ssh, with COMMAND's exit status passed back.
#[test]
fn pipe_through_real_ssh_runs_the_command() {
    use std::io::Write;
    let Some(srv) = SshServer::start("pipe_through_real_ssh_runs_the_command") else {
        return;
    };
    let rsh = srv.rsh();
    let bin = ferry_bin();
    let d = tempfile::tempdir().unwrap();
    let data = bytes(31, 5 << 20);
    let host = format!("{}@127.0.0.1", srv.user);
    for via in [false, true] {
        let out_file = d.path().join(format!("out-{via}"));
        let mut args = vec!["pipe", "-e", &rsh, "--remote-ferry", p(&bin)];
        if via {
            args.push("--via-ssh");
        }
        let cmd = format!("cat > {}", out_file.display());
        args.extend([host.as_str(), "--", "sh", "-c", &cmd]);
        let mut child = std::process::Command::new(&bin)
            .args(&args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(&data).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "via_ssh={via}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(fs::read(&out_file).unwrap() == data, "via_ssh={via}");
    }
    // The remote command's own exit status comes back.
    let mut child = std::process::Command::new(&bin)
        .args([
            "pipe",
            "-e",
            &rsh,
            "--remote-ferry",
            p(&bin),
            &host,
            "--",
            "sh",
            "-c",
            "cat >/dev/null; exit 7",
        ])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"hello").unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(7));
}

/// A peer that stops (SIGSTOP: alive, connected, silent) is dead after
/// `--timeout`: exit 5 with a clear line, in push and in pull, instead of
/// a run that waits forever. Without it, the keepalives of a busy but
/// live peer must not trip the timeout (checked by every other remote
/// test passing --timeout... here: a slow transfer with a short timeout).
#[test]
fn a_silent_peer_times_out_and_a_slow_one_does_not() {
    let Some(srv) = SshServer::start("a_silent_peer_times_out_and_a_slow_one_does_not") else {
        return;
    };
    let rsh = srv.rsh();
    let bin = ferry_bin();
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("big");
    fs::write(&src, bytes(9, 24 << 20)).unwrap();
    let pidfile = d.path().join("remote.pid");
    let wrapper = d.path().join("stoppable-ferry");
    fs::write(
        &wrapper,
        format!(
            // (stdin by way of fd 3: a background job's would be /dev/null.)
            "#!/bin/sh\nexec 3<&0\n{} \"$@\" 0<&3 3<&- &\necho $! > {}\nwait $!\n",
            bin.display(),
            pidfile.display()
        ),
    )
    .unwrap();
    fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755)).unwrap();
    let remote_dir = d.path().join("remote");
    fs::create_dir(&remote_dir).unwrap();
    fs::write(remote_dir.join("big"), bytes(9, 24 << 20)).unwrap();

    // Slow (about 4 s at 6 MB/s) but alive: a 2 s timeout must not trip.
    let slow = d.path().join("slow");
    let out = ferry(&remote_args(
        &rsh,
        p(&bin),
        &[
            "--timeout",
            "2",
            "--bwlimit",
            "6M",
            p(&src),
            &srv.remote(&slow),
        ],
    ));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(fs::read(&slow).unwrap(), fs::read(&src).unwrap());

    for push in [true, false] {
        let _ = fs::remove_file(&pidfile);
        let local = d.path().join(format!("local-{push}"));
        let (from, to) = if push {
            (
                p(&src).to_string(),
                srv.remote(&remote_dir.join(format!("pushed-{push}"))),
            )
        } else {
            (srv.remote(&remote_dir.join("big")), p(&local).to_string())
        };
        let child = std::process::Command::new(&bin)
            .args(remote_args(&rsh, p(&wrapper), &[]))
            // Without retries: a timed-out attempt would be retried
            // (tests/resume.rs covers that).
            .args([
                "--retries",
                "0",
                "--timeout",
                "2",
                "--bwlimit",
                "2M",
                &from,
                &to,
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Stop the remote ferry once the transfer is under way.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let pid = loop {
            if let Some(pid) = fs::read_to_string(&pidfile)
                .ok()
                .and_then(|s| s.trim().parse::<i32>().ok())
            {
                break pid;
            }
            assert!(std::time::Instant::now() < deadline, "remote never started");
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        std::thread::sleep(std::time::Duration::from_millis(1500));
        let kill = |sig: &str| {
            let _ = std::process::Command::new("kill")
                .args([sig, &pid.to_string()])
                .status();
        };
        kill("-STOP");
        let stopped = std::time::Instant::now();
        let out = child.wait_with_output().unwrap();
        let waited = stopped.elapsed();
        kill("-KILL");
        kill("-CONT");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(5), "push={push}: {err}");
        assert!(err.contains("timed out"), "push={push}: {err}");
        assert_eq!(err.lines().count(), 1, "push={push}: one line: {err}");
        assert!(
            waited < std::time::Duration::from_secs(15),
            "push={push}: noticed after {waited:?}"
        );
    }
}

/// A terabyte of holes pushed and pulled over ssh (digests on, read back
/// with `--verify`): the holes cross as runs, a few bytes on the wire.
#[test]
fn a_terabyte_of_holes_crosses_ssh_as_runs() {
    let Some(srv) = SshServer::start("a_terabyte_of_holes_crosses_ssh_as_runs") else {
        return;
    };
    let rsh = srv.rsh();
    let bin = ferry_bin();
    let bin = p(&bin);
    let d = tempfile::tempdir().unwrap();
    let size = 1u64 << 40;
    let pieces = vec![(8 << 20, bytes(21, 70_000)), (777 << 30, bytes(22, 4096))];
    let src = d.path().join("big.img");
    sparse_file(&src, size, &pieces);
    let pushed = d.path().join("pushed.img");
    let to = srv.remote(&pushed);
    let j = ferry_ok(&remote_args(&rsh, bin, &["--verify", p(&src), &to]));
    holds_only(&pushed, size, &pieces);
    let wire = j["bytes_wire"].as_u64().unwrap();
    assert!(wire < 74_096 + 65_536, "{wire} bytes on the wire: {j}");
    let pulled = d.path().join("pulled.img");
    let from = srv.remote(&pushed);
    let j = ferry_ok(&remote_args(&rsh, bin, &["--verify", &from, p(&pulled)]));
    holds_only(&pulled, size, &pieces);
    assert!(j["bytes_wire"].as_u64().unwrap() < 74_096 + 65_536, "{j}");
}
