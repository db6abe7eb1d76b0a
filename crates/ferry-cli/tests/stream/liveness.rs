//! Keepalives and `--timeout` on an established stream: a slow producer
//! or a slow consumer is alive (both sides send keepalives while they have
//! nothing to say), a stopped peer (SIGSTOP: the socket stays open, nothing
//! arrives) is dead after `--timeout` seconds, exit 5.

use std::io::Write;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::{ferry, pipe_command, same, start_recv, start_send, write_data, Guard, FERRY, KEY};

fn signal(g: &Guard, sig: &str) {
    let st = Command::new("kill")
        .args([sig, &g.0.id().to_string()])
        .status()
        .expect("kill");
    assert!(st.success(), "kill {sig}");
}

/// The producer pauses 8 s after its first 3 MB, the consumer starts
/// reading only after 4 s, and both sides say `--timeout 3` with 1 MiB
/// buffers: the sender waits for its receiver's verdict the whole time and
/// the receiver waits on the socket for 4 s or more, so only keepalives
/// keep the stream alive. It completes, byte-identical.
#[test]
fn slow_producer_and_slow_consumer_are_alive() {
    let dir = tempfile::tempdir().expect("tmp");
    let src = dir.path().join("src");
    let dst = dir.path().join("dst");
    write_data(&src, 6 << 20, false);
    let consumer = format!("sleep 4; cat > '{}'", dst.display());
    let (mut r, port) = start_recv(
        KEY,
        &["--timeout", "3", "-m", "1M", "--", "sh", "-c", &consumer],
    );
    let producer = format!(
        "head -c 3145728 '{s}'; sleep 8; tail -c +3145729 '{s}'",
        s = src.display()
    );
    let t = Instant::now();
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "({producer}) | '{FERRY}' send --timeout 3 -m 1M 127.0.0.1:{port}"
        ))
        .env("FERRY_KEY", KEY)
        .output()
        .expect("send");
    assert!(
        out.status.success(),
        "send: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(t.elapsed() >= Duration::from_secs(8), "the producer paused");
    let st = r.wait_timeout(Duration::from_secs(20)).expect("recv exits");
    assert_eq!(st.code(), Some(0), "{}", r.stderr_text());
    assert!(same(&src, &dst));
}

/// A receiver that stops answering (SIGSTOP) is dead for a sender with
/// `--timeout 2`: exit 5 within a few seconds, one line naming the timeout.
#[test]
fn stopped_receiver_times_out_the_sender() {
    let dir = tempfile::tempdir().expect("tmp");
    let (r, port) = start_recv(KEY, &[dir.path().join("dst").to_str().expect("p")]);
    let (mut s, mut input) = start_send(port, &["--timeout", "2"], true);
    input.write_all(&vec![5u8; 1 << 20]).expect("feed");
    input.flush().expect("flush");
    thread::sleep(Duration::from_millis(500));
    signal(&r, "-STOP");
    let t = Instant::now();
    let st = s.wait_timeout(Duration::from_secs(15));
    signal(&r, "-CONT");
    let st = st.expect("the sender must give up");
    let err = s.stderr_text();
    assert_eq!(st.code(), Some(5), "{err}");
    // The receiver's last keepalive went out up to 1 s before the STOP
    // (later on a loaded machine), so the sender's 2 s of silence end
    // 1 s or less after it: only an immediate give-up is wrong.
    assert!(
        t.elapsed() >= Duration::from_millis(500),
        "too early: {err}"
    );
    assert!(err.contains("--timeout"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    drop(input);
}

/// A sender that stops sending (SIGSTOP) is dead for a receiver with
/// `--timeout 2`: exit 5, one line naming the timeout.
#[test]
fn stopped_sender_times_out_the_receiver() {
    let dir = tempfile::tempdir().expect("tmp");
    let dst = dir.path().join("dst");
    let (mut r, port) = start_recv(KEY, &["--timeout", "2", dst.to_str().expect("p")]);
    let (s, mut input) = start_send(port, &[], false);
    input.write_all(&vec![6u8; 1 << 20]).expect("feed");
    input.flush().expect("flush");
    thread::sleep(Duration::from_millis(500));
    signal(&s, "-STOP");
    let t = Instant::now();
    let st = r.wait_timeout(Duration::from_secs(15));
    signal(&s, "-CONT");
    let st = st.expect("the receiver must give up");
    let err = r.stderr_text();
    assert_eq!(st.code(), Some(5), "{err}");
    // The sender's last keepalive went out up to 1 s before the STOP
    // (later on a loaded machine), so the receiver's 2 s of silence end
    // 1 s or less after it: only an immediate give-up is wrong.
    assert!(
        t.elapsed() >= Duration::from_millis(500),
        "too early: {err}"
    );
    assert!(err.contains("--timeout"), "{err}");
    drop(input);
}

/// `pipe --timeout` through ssh's pipes (a stand-in ssh): the remote
/// command reads nothing for 5 s (`--timeout 3`); keepalives through ssh keep the stream
/// alive, and the command's status comes back.
#[test]
fn pipe_with_timeout_survives_a_slow_command() {
    for via_ssh in [true, false] {
        let dir = tempfile::tempdir().expect("tmp");
        let src = dir.path().join("src");
        let dst = dir.path().join("dst");
        write_data(&src, 4 << 20, false);
        let cmd = format!("sleep 5; cat > '{}'; exit 3", dst.display());
        let extra = ["--timeout", "3", "-m", "1M"];
        let out = pipe_command(dir.path(), &src, via_ssh, &extra, &cmd)
            .output()
            .expect("pipe");
        assert_eq!(
            out.status.code(),
            Some(3),
            "via ssh {via_ssh}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(same(&src, &dst), "via ssh {via_ssh}");
    }
}

/// A receiver stopped before the sender connects (the kernel still
/// completes the TCP connect from its backlog): the handshake is bounded
/// by `--timeout` too, exit 5.
#[test]
fn receiver_stopped_before_the_handshake_times_out_the_sender() {
    let dir = tempfile::tempdir().expect("tmp");
    let (r, port) = start_recv(KEY, &[dir.path().join("dst").to_str().expect("p")]);
    signal(&r, "-STOP");
    let t = Instant::now();
    let out = ferry(KEY)
        .args(["send", "--timeout", "2", &format!("127.0.0.1:{port}")])
        .stdin(Stdio::null())
        .output()
        .expect("send");
    signal(&r, "-CONT");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{err}");
    assert!(t.elapsed() < Duration::from_secs(15), "{err}");
    assert!(err.contains("--timeout"), "{err}");
}
