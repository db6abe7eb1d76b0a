//! Errors that a retry cannot fix (bad arguments, I/O errors, protocol
//! errors) end the run at once, with their documented code: no reconnect,
//! no backoff.

use std::fs;
use std::path::Path;
use std::process::Command;

use crate::common::*;
use crate::{run, say, Run, Source};

/// Check a failed run: the documented code, no reconnect, and no time
/// spent in a backoff (the first is 1 s). `stats`: whether the run gets
/// far enough to print its `--json` object (bad arguments and a missing
/// local source end before).
fn not_retried(r: &Run, codes: &[i32], base: f64, stats: bool, what: &str) {
    r.no_panic();
    assert!(
        r.code.is_some_and(|c| codes.contains(&c)),
        "{what}: exit {:?}, want one of {codes:?}: {}",
        r.code,
        r.err
    );
    if stats {
        assert_eq!(r.json["reconnects"], 0, "{what}: {}", r.json);
    }
    assert!(!r.err.contains("reconnecting"), "{what}: {}", r.err);
    assert!(
        r.secs < base + 0.9,
        "{what}: {:.2} s (a plain run takes {base:.2} s): a backoff? {}",
        r.secs,
        r.err
    );
    say!(
        "{what}: exit {:?} in {:.2} s (a run that works: {base:.2} s)",
        r.code,
        r.secs
    );
}

#[test]
fn errors_a_retry_cannot_fix_are_not_retried() {
    let Some(srv) = SshServer::start("errors_a_retry_cannot_fix_are_not_retried") else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let src = Source::new(d.path().join("big"), 27, 40 << 20);
    let blocker = d.path().join("blocker");
    fs::write(&blocker, b"a file, not a directory").unwrap();
    let under_file = blocker.join("sub/big");
    let bin = ferry_bin();
    let rsh = srv.rsh();
    let sync = |extra: &[&str], from: &str, to: &str| {
        run(Command::new(&bin)
            .args(["sync", "--retries", "3", "--timeout", "2", "--json"])
            .args(extra)
            .args([from, to]))
    };
    let remote = ["-e", rsh.as_str(), "--remote-ferry", p(&bin)];

    // What a run that works takes, locally and through ssh (the slower
    // of two).
    let (mut base, mut base_remote) = (0f64, 0f64);
    for i in 0..2 {
        let ok = sync(&[], p(&src.path), p(&d.path().join(format!("ok{i}"))));
        assert_eq!(ok.code, Some(0), "{}", ok.err);
        base = base.max(ok.secs);
        let to = srv.remote(&d.path().join(format!("ok-remote{i}")));
        let ok = sync(&remote, p(&src.path), &to);
        assert_eq!(ok.code, Some(0), "{}", ok.err);
        assert_eq!(ok.n("reconnects"), 0);
        base_remote = base_remote.max(ok.secs);
    }

    let r = sync(&[], p(&src.path), p(&under_file));
    not_retried(&r, &[2, 3], base, true, "local destination under a file");
    let r = sync(&[], p(&d.path().join("missing")), p(&d.path().join("x")));
    not_retried(&r, &[2, 3], base, false, "local missing source");
    let r = sync(&remote, p(&src.path), &srv.remote(&under_file));
    not_retried(
        &r,
        &[2, 3],
        base_remote,
        true,
        "remote destination under a file",
    );
    let r = sync(
        &remote,
        &srv.remote(&d.path().join("missing")),
        p(&d.path().join("y")),
    );
    not_retried(&r, &[2, 3], base_remote, true, "remote missing source");
    let echo = ["-e", rsh.as_str(), "--remote-ferry", "/bin/echo"];
    let r = sync(&echo, p(&src.path), &srv.remote(&d.path().join("z")));
    not_retried(&r, &[4], base_remote, true, "a remote that is not ferry");
    let none = ["-e", rsh.as_str(), "--remote-ferry", "/nonexistent/ferry"];
    let r = sync(&none, p(&src.path), &srv.remote(&d.path().join("v")));
    not_retried(&r, &[5], base_remote, true, "no ferry on the remote");
    let r = sync(
        &[],
        &srv.remote(&src.path),
        &srv.remote(&d.path().join("w")),
    );
    not_retried(&r, &[1], base, false, "both sides remote");
    let r = run(Command::new(&bin).args(["sync", "--retries", "many", p(&src.path), "q"]));
    not_retried(&r, &[1], base, false, "--retries many");

    // A read-only filesystem (root: permissions alone do not stop root).
    if is_root() {
        let ro = d.path().join("ro");
        fs::create_dir(&ro).unwrap();
        let m = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "ro,size=1m", "ferry-resume-ro"])
            .arg(&ro)
            .status()
            .unwrap();
        assert!(m.success(), "mount a read-only tmpfs");
        struct Umount<'a>(&'a Path);
        impl Drop for Umount<'_> {
            fn drop(&mut self) {
                let _ = Command::new("umount").arg(self.0).status();
            }
        }
        let _u = Umount(&ro);
        let r = sync(&[], p(&src.path), p(&ro.join("big")));
        not_retried(&r, &[2, 3], base, true, "local read-only destination");
        let r = sync(&remote, p(&src.path), &srv.remote(&ro.join("big")));
        not_retried(
            &r,
            &[2, 3],
            base_remote,
            true,
            "remote read-only destination",
        );
    } else {
        skip("errors_a_retry_cannot_fix_are_not_retried: the read-only case needs root");
    }
    // ssh refuses the login (a key the server does not know): another
    // connection would be refused the same way.
    let other_key = d.path().join("other-key");
    let keygen = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&other_key)
        .status()
        .unwrap();
    assert!(keygen.success());
    let words: Vec<&str> = rsh.split(' ').collect();
    let key = words[words.iter().position(|w| *w == "-i").unwrap() + 1];
    let bad_rsh = rsh.replace(key, p(&other_key));
    let refused = ["-e", bad_rsh.as_str(), "--remote-ferry", p(&bin)];
    let r = sync(&refused, p(&src.path), &srv.remote(&d.path().join("u")));
    assert!(r.err.contains("Permission denied"), "{}", r.err);
    not_retried(&r, &[5], base_remote, true, "ssh login refused");
}
