//! Streams striped over several TCP connections (`--streams N`): the bytes
//! arrive identical, and a connection that stops passing data fails the
//! stream within the timeout instead of hanging it.

use super::*;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

#[test]
fn a_striped_stream_arrives_byte_identical() {
    if !wired() {
        return;
    }
    let dir = tempfile::tempdir().expect("tmp");
    let src = dir.path().join("src");
    write_data(&src, 48 << 20, false);
    for n in ["2", "4", "16"] {
        let dst = dir.path().join(format!("dst{n}"));
        let (mut r, port) = start_recv(KEY, &[dst.to_str().expect("path")]);
        let out = ferry(KEY)
            .args(["send", "--streams", n, "--json"])
            .arg(format!("127.0.0.1:{port}"))
            .arg(&src)
            .output()
            .expect("send");
        assert!(
            out.status.success(),
            "send --streams {n}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(json["bytes"], 48 << 20);
        assert_eq!(json["connections"], n.parse::<u64>().expect("n"));
        let st = r.wait_timeout(Duration::from_secs(60)).expect("recv exits");
        assert!(st.success(), "recv: {}", r.stderr_text());
        assert!(same(&src, &dst), "--streams {n}: output differs");
    }
}

#[test]
fn pipe_stripes_its_direct_connection() {
    if !wired() {
        return;
    }
    let dir = tempfile::tempdir().expect("tmp");
    let src = dir.path().join("src");
    let dst = dir.path().join("dst");
    write_data(&src, 20 << 20, false);
    let cmd = format!("cat > '{}'", dst.display());
    let out = pipe_command(dir.path(), &src, false, &["--streams", "3"], &cmd)
        .output()
        .expect("pipe");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(same(&src, &dst));
}

/// Copy `from` to `to` until either ends; with `stall_after`, stop
/// reading after that many bytes and hold both sockets open (a path that
/// died without a reset).
fn forward(mut from: TcpStream, mut to: TcpStream, stall_after: Option<usize>) {
    let mut buf = vec![0u8; 64 << 10];
    let mut moved = 0;
    loop {
        if stall_after.is_some_and(|n| moved >= n) {
            thread::sleep(Duration::from_secs(90));
            return;
        }
        let want = stall_after.map_or(buf.len(), |n| (n - moved).clamp(1, buf.len()));
        match from.read(&mut buf[..want]) {
            Ok(0) | Err(_) => break,
            Ok(k) => {
                if to.write_all(&buf[..k]).is_err() {
                    break;
                }
                moved += k;
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

/// A proxy on 127.0.0.1 in front of `port`: connection number `stall` (in
/// the order they arrive) stops passing the client's bytes after
/// `after` of them. Its threads end with their connections (or after
/// 90 s for the stalled one); the test's process ends them in any case.
fn stalling_proxy(port: u16, stall: usize, after: usize) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let me = l.local_addr().expect("addr").port();
    let seen = Arc::new(AtomicUsize::new(0));
    thread::spawn(move || {
        for c in l.incoming() {
            let Ok(client) = c else { break };
            let Ok(server) = TcpStream::connect(("127.0.0.1", port)) else {
                break;
            };
            let i = seen.fetch_add(1, Ordering::SeqCst);
            let (c2, s2) = (
                client.try_clone().expect("clone"),
                server.try_clone().expect("clone"),
            );
            let stall_after = (i == stall).then_some(after);
            thread::spawn(move || forward(client, server, stall_after));
            thread::spawn(move || forward(s2, c2, None));
        }
    });
    me
}

#[test]
fn a_stalled_connection_fails_the_stream_within_the_timeout() {
    if !wired() {
        return;
    }
    let dir = tempfile::tempdir().expect("tmp");
    let src = dir.path().join("src");
    let dst = dir.path().join("dst");
    write_data(&src, 64 << 20, false);
    let (mut r, port) = start_recv(KEY, &["--timeout", "3", dst.to_str().expect("path")]);
    let via = stalling_proxy(port, 2, 1 << 20);
    let t = Instant::now();
    let mut s = Guard(
        ferry(KEY)
            .args(["send", "--streams", "4", "--timeout", "3"])
            .arg(format!("127.0.0.1:{via}"))
            .arg(&src)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("send"),
    );
    let rs = r
        .wait_timeout(Duration::from_secs(30))
        .expect("the receiver must not hang on a stalled connection");
    let ss = s
        .wait_timeout(Duration::from_secs(30))
        .expect("the sender must not hang on a stalled connection");
    let (rerr, serr) = (r.stderr_text(), s.stderr_text());
    eprintln!("after {:?}\nrecv: {rerr}\nsend: {serr}", t.elapsed());
    assert!(!rs.success() && !ss.success(), "a stalled stream succeeded");
    assert_eq!(rs.code(), Some(5), "recv: a connection error: {rerr}");
    assert!(
        !dst.exists() || !same(&src, &dst),
        "the output is complete although a connection stalled"
    );
}
