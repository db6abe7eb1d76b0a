//! `recv FILE` resumes a stream that an interrupted run left part of, when
//! the sender reads a regular file with the same first bytes; anything
//! else starts over, and the output is always the whole stream.

use super::*;

const MIB: usize = 1 << 20;

/// Run `recv DST` and `send SRC` (the sender's input: `src` as a file, or
/// fed through a pipe with `piped`), both with `--json`; returns the
/// sender's JSON after checking both succeeded.
fn resend(src: &Path, dst: &Path, recv_extra: &[&str], piped: bool) -> serde_json::Value {
    let mut args = vec![dst.to_str().expect("path")];
    args.extend_from_slice(recv_extra);
    let (mut r, port) = start_recv(KEY, &args);
    let mut c = ferry(KEY);
    c.args(["send", &format!("127.0.0.1:{port}"), "--json"]);
    if piped {
        c.stdin(Stdio::piped());
    } else {
        c.arg(src);
    }
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("send");
    if piped {
        let mut input = child.stdin.take().expect("stdin");
        let data = std::fs::read(src).expect("read src");
        thread::spawn(move || {
            let _ = input.write_all(&data);
        });
    }
    let out = child.wait_with_output().expect("send");
    assert!(
        out.status.success(),
        "send: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let st = r.wait_timeout(Duration::from_secs(60)).expect("recv exits");
    assert!(st.success(), "recv: {}", r.stderr_text());
    if std::fs::metadata(dst).is_ok_and(|m| m.is_file()) {
        assert!(same(src, dst), "output differs from the source");
    }
    serde_json::from_slice(&out.stdout).expect("json")
}

fn resumed(j: &serde_json::Value) -> u64 {
    j["bytes_resumed"].as_u64().expect("bytes_resumed")
}

fn wire(j: &serde_json::Value) -> u64 {
    j["wire_bytes"].as_u64().expect("wire_bytes")
}

#[test]
fn a_prefix_left_by_an_interrupted_run_is_not_sent_again() {
    let dir = tempfile::tempdir().expect("tmp");
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    write_data(&src, 64 * MIB, false);
    let data = std::fs::read(&src).expect("src");
    std::fs::write(&dst, &data[..40 * MIB]).expect("prefix");
    let j = resend(&src, &dst, &[], false);
    assert_eq!(resumed(&j), 40 << 20, "{j}");
    assert_eq!(j["bytes"], 64 << 20, "the summary counts the whole stream");
    // Only the rest crossed the link (random data: no compression).
    assert!(wire(&j) < 25 << 20, "{} bytes on the wire", wire(&j));
}

#[test]
fn a_prefix_that_differs_or_runs_past_the_source_starts_over() {
    let dir = tempfile::tempdir().expect("tmp");
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    write_data(&src, 16 * MIB, false);
    let data = std::fs::read(&src).expect("src");
    let mut bad = data[..10 * MIB].to_vec();
    bad[5 * MIB] ^= 1;
    std::fs::write(&dst, &bad).expect("bad prefix");
    let j = resend(&src, &dst, &[], false);
    assert_eq!(resumed(&j), 0, "a prefix with a flipped bit was kept: {j}");
    // Longer than the source: the whole of it cannot be a prefix.
    let mut long = data.clone();
    long.extend_from_slice(&[9u8; 4096]);
    std::fs::write(&dst, &long).expect("long");
    let j = resend(&src, &dst, &[], false);
    assert_eq!(resumed(&j), 0, "{j}");
}

#[test]
fn a_pipe_cannot_resume_and_no_resume_truncates() {
    let dir = tempfile::tempdir().expect("tmp");
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    write_data(&src, 16 * MIB, true);
    let data = std::fs::read(&src).expect("src");
    std::fs::write(&dst, &data[..8 * MIB]).expect("prefix");
    let j = resend(&src, &dst, &[], true);
    assert_eq!(resumed(&j), 0, "a pipe was resumed: {j}");
    std::fs::write(&dst, &data[..8 * MIB]).expect("prefix");
    let j = resend(&src, &dst, &["--no-resume"], false);
    assert_eq!(resumed(&j), 0, "--no-resume resumed: {j}");
}

#[test]
fn killed_senders_leave_a_prefix_that_the_next_run_completes() {
    let dir = tempfile::tempdir().expect("tmp");
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    write_data(&src, 192 * MIB, false);
    let (mut kills, mut kept) = (0, 0u64);
    for round in 0..4u64 {
        let _ = std::fs::remove_file(&dst);
        let (mut r, port) = start_recv(KEY, &[dst.to_str().expect("path")]);
        let mut s = Guard(
            ferry(KEY)
                .args(["send", &format!("127.0.0.1:{port}")])
                .arg(&src)
                .stderr(Stdio::null())
                .spawn()
                .expect("send"),
        );
        thread::sleep(Duration::from_millis(150 + 100 * round));
        let _ = s.0.kill();
        let _ = s.0.wait();
        kills += 1;
        let st = r.wait_timeout(Duration::from_secs(20)).expect("recv exits");
        if st.success() {
            // The stream finished before the kill: nothing to resume.
            assert!(same(&src, &dst));
            continue;
        }
        let left = std::fs::metadata(&dst).map(|m| m.len()).unwrap_or(0);
        let j = resend(&src, &dst, &[], false);
        assert_eq!(resumed(&j), left, "kept {left} bytes, resumed {j}");
        kept += left;
    }
    eprintln!("stream resume: {kills} senders killed, {kept} bytes kept and resumed");
    assert!(kept > 0, "no kill left anything to resume");
}

#[test]
fn a_fifo_as_file_is_written_in_order_and_an_unopenable_file_is_reported() {
    let dir = tempfile::tempdir().expect("tmp");
    let (src, fifo, out) = (
        dir.path().join("src"),
        dir.path().join("fifo"),
        dir.path().join("out"),
    );
    write_data(&src, 4 * MIB, false);
    let st = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(st.success());
    let reader = Command::new("sh")
        .args(["-c", &format!("cat {} > {}", fifo.display(), out.display())])
        .spawn()
        .expect("cat");
    let mut reader = Guard(reader);
    let j = resend(&src, &fifo, &[], false);
    assert_eq!(resumed(&j), 0);
    let st = reader
        .wait_timeout(Duration::from_secs(20))
        .expect("cat exits");
    assert!(st.success());
    assert!(same(&src, &out), "the FIFO's reader got something else");
    // A FILE recv cannot create: the sender says why, as an I/O error.
    let bad = dir.path().join("no/such/dir/out");
    let (_r, port) = start_recv(KEY, &[bad.to_str().expect("path")]);
    let o = ferry(KEY)
        .args(["send", &format!("127.0.0.1:{port}")])
        .arg(&src)
        .output()
        .expect("send");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(err.contains("cannot create"), "{err}");
}
