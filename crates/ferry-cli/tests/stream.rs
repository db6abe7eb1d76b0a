//! `ferry send` / `ferry recv` / `ferry pipe` through the real binary, on
//! 127.0.0.1 only. Every process a test starts is killed by a guard.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

#[path = "stream/liveness.rs"]
mod liveness;
#[path = "stream/memory.rs"]
mod memory;
#[path = "stream/resume.rs"]
mod resume;
#[path = "stream/striped.rs"]
mod striped;

const FERRY: &str = env!("CARGO_BIN_EXE_ferry");
const KEY: &str = "00112233445566778899aabbccddeeff";

/// Kills the process (by its pid, through `Child`) when dropped.
struct Guard(Child);
impl Drop for Guard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

impl Guard {
    fn wait_timeout(&mut self, t: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + t;
        while Instant::now() < end {
            if let Ok(Some(s)) = self.0.try_wait() {
                return Some(s);
            }
            thread::sleep(Duration::from_millis(20));
        }
        None
    }

    fn stderr_text(&mut self) -> String {
        let mut s = String::new();
        if let Some(e) = self.0.stderr.as_mut() {
            let _ = e.read_to_string(&mut s);
        }
        s
    }
}

/// Until main.rs wires `send`/`recv`/`pipe`, these tests have nothing to
/// run against: say so and pass, rather than fail the workspace.
fn wired() -> bool {
    let ok = Command::new(FERRY)
        .args(["recv", "--help"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(ok, "this ferry binary has no stream subcommands");
    ok
}

fn ferry(key: &str) -> Command {
    let mut c = Command::new(FERRY);
    c.env("FERRY_KEY", key);
    c
}

/// Start `ferry recv --announce` (port chosen by the OS) with extra args;
/// returns the guard and the port.
fn start_recv(key: &str, args: &[&str]) -> (Guard, u16) {
    recv_announced(ferry(key), args)
}

/// Start `ferry recv --announce` from `c` with extra args.
fn recv_announced(mut c: Command, args: &[&str]) -> (Guard, u16) {
    c.args(["recv", "--listen", "127.0.0.1:0", "--announce"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut g = Guard(c.spawn().expect("spawn recv"));
    let out: ChildStdout = g.0.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line).expect("announce");
    let port: u16 = line
        .trim()
        .strip_prefix("FERRY-PORT ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("bad announce {line:?}"));
    let mut stdin = g.0.stdin.take().expect("stdin");
    stdin.write_all(b"tcp\n").expect("mode");
    (g, port)
}

/// Start `ferry send 127.0.0.1:PORT` with `extra` options, its input a
/// pipe (returned) and its stderr captured when `stderr` is set.
fn start_send(port: u16, extra: &[&str], stderr: bool) -> (Guard, ChildStdin) {
    let mut g = Guard(
        ferry(KEY)
            .arg("send")
            .args(extra)
            .arg(format!("127.0.0.1:{port}"))
            .stdin(Stdio::piped())
            .stderr(if stderr {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .spawn()
            .expect("send"),
    );
    let input = g.0.stdin.take().expect("stdin");
    (g, input)
}

fn write_data(path: &Path, n: usize, text: bool) {
    let mut v = Vec::with_capacity(n);
    let mut x: u64 = 0x9e3779b97f4a7c15;
    while v.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if text {
            let words: [&[u8]; 6] = [
                b"zfs ",
                b"send ",
                b"pool/data@snap ",
                b"\n",
                b"receive ",
                b"ferry ",
            ];
            v.extend_from_slice(words[(x % 6) as usize]);
            v.extend_from_slice((x % 997).to_string().as_bytes());
        } else {
            v.extend_from_slice(&x.to_le_bytes());
        }
    }
    v.truncate(n);
    std::fs::write(path, v).expect("write data");
}

fn same(a: &Path, b: &Path) -> bool {
    std::fs::read(a).expect("read a") == std::fs::read(b).expect("read b")
}

fn transfer(text: bool) {
    let dir = tempfile::tempdir().expect("tmp");
    let src = dir.path().join("src");
    let dst = dir.path().join("dst");
    write_data(&src, 64 << 20, text);
    let (mut r, port) = start_recv(KEY, &[dst.to_str().expect("path")]);
    let out = ferry(KEY)
        .args([
            "send",
            &format!("127.0.0.1:{port}"),
            src.to_str().expect("path"),
            "--json",
        ])
        .output()
        .expect("send");
    assert!(
        out.status.success(),
        "send: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(json["ok"], true);
    assert_eq!(json["bytes"], 64 << 20);
    let st = r.wait_timeout(Duration::from_secs(60)).expect("recv exits");
    assert!(st.success(), "recv: {}", r.stderr_text());
    assert!(same(&src, &dst), "output differs");
    if text {
        let wire = json["wire_bytes"].as_u64().expect("wire");
        eprintln!("text: {wire} bytes on the wire for {} bytes", 64 << 20);
    }
}

#[test]
fn random_data_arrives_byte_identical() {
    if !wired() {
        return;
    }
    transfer(false);
}

#[test]
fn text_data_arrives_byte_identical() {
    if !wired() {
        return;
    }
    transfer(true);
}

#[test]
fn stdin_to_stdout_through_a_shell_pipeline() {
    if !wired() {
        return;
    }
    let dir = tempfile::tempdir().expect("tmp");
    let src = dir.path().join("src");
    let dst = dir.path().join("dst");
    write_data(&src, 5 << 20, true);
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    drop(l);
    let mut r = Guard(
        ferry(KEY)
            .args(["recv", "--listen", &format!("127.0.0.1:{port}")])
            .stdout(std::fs::File::create(&dst).expect("dst"))
            .stderr(Stdio::piped())
            .spawn()
            .expect("recv"),
    );
    thread::sleep(Duration::from_millis(300));
    let st = ferry(KEY)
        .args(["send", &format!("127.0.0.1:{port}")])
        .stdin(std::fs::File::open(&src).expect("src"))
        .status()
        .expect("send");
    assert!(st.success());
    assert!(r
        .wait_timeout(Duration::from_secs(30))
        .expect("exit")
        .success());
    assert!(same(&src, &dst));
}

/// Send nothing with a key recv does not hold: refused, exit 7.
fn send_with_wrong_key(port: u16) {
    let out = ferry("ffffffffffffffffffffffffffffffff")
        .args(["send", &format!("127.0.0.1:{port}")])
        .stdin(Stdio::null())
        .output()
        .expect("send");
    assert_eq!(out.status.code(), Some(7));
    assert!(String::from_utf8_lossy(&out.stderr).contains("wrong key"));
}

/// A sender with the wrong key is refused (exit 7) and recv keeps
/// waiting: FILE is not touched, COMMAND not started, and a sender with
/// the right key that comes next is received. With --timeout and only
/// wrong keys, recv gives up with exit 7.
#[test]
fn wrong_key_is_refused_and_recv_goes_on_waiting() {
    if !wired() {
        return;
    }
    let dir = tempfile::tempdir().expect("tmp");
    let dst = dir.path().join("dst");
    std::fs::write(&dst, b"precious").expect("old dst");
    let (mut r, port) = start_recv(KEY, &[dst.to_str().expect("path")]);
    send_with_wrong_key(port);
    // A stray connection that sends garbage and one that says nothing.
    let mut stray = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stray.write_all(b"GET / HTTP/1.0\r\n\r\n").expect("garbage");
    drop(stray);
    let _silent = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        std::fs::read(&dst).expect("dst"),
        b"precious",
        "FILE touched before auth"
    );
    let src = dir.path().join("src");
    write_data(&src, 3 << 20, true);
    let st = ferry(KEY)
        .args([
            "send",
            &format!("127.0.0.1:{port}"),
            src.to_str().expect("path"),
        ])
        .status()
        .expect("send");
    assert!(st.success());
    let st = r.wait_timeout(Duration::from_secs(20)).expect("recv exits");
    assert_eq!(st.code(), Some(0), "{}", r.stderr_text());
    assert!(std::fs::read(&dst).expect("dst") == std::fs::read(&src).expect("src"));
    assert!(
        r.stderr_text().contains("refused a connection"),
        "{}",
        r.stderr_text()
    );

    // Only wrong keys, and a command that must never start.
    let marker = dir.path().join("started");
    let script = format!("touch {}; cat >/dev/null", marker.display());
    let (mut r, port) = start_recv(KEY, &["--timeout", "2", "--", "sh", "-c", &script]);
    send_with_wrong_key(port);
    let st = r.wait_timeout(Duration::from_secs(20)).expect("recv exits");
    assert_eq!(st.code(), Some(7), "{}", r.stderr_text());
    assert!(
        r.stderr_text().contains("no sender proved the key"),
        "{}",
        r.stderr_text()
    );
    assert!(
        !marker.exists(),
        "COMMAND started before a sender proved the key"
    );
}

#[test]
fn missing_key_is_a_usage_error() {
    if !wired() {
        return;
    }
    let out = Command::new(FERRY)
        .env_remove("FERRY_KEY")
        .args(["send", "127.0.0.1:9"])
        .output()
        .expect("send");
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn killed_sender_makes_the_receiver_fail_with_truncated() {
    if !wired() {
        return;
    }
    let dir = tempfile::tempdir().expect("tmp");
    let dst = dir.path().join("dst");
    let (mut r, port) = start_recv(KEY, &[dst.to_str().expect("path")]);
    let (mut s, mut input) = start_send(port, &[], false);
    input.write_all(&vec![7u8; 8 << 20]).expect("feed");
    input.flush().expect("flush");
    thread::sleep(Duration::from_millis(500));
    s.0.kill().expect("kill sender");
    let st = r.wait_timeout(Duration::from_secs(10)).expect("recv exits");
    assert_eq!(st.code(), Some(4));
    assert!(r.stderr_text().contains("truncated"));
    drop(input);
}

#[test]
fn consumer_exit_stops_the_sender_promptly() {
    if !wired() {
        return;
    }
    // `ferry recv | head -c 100000`: head exits, the sender must stop.
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    drop(l);
    let mut r = Guard(
        Command::new("sh")
            .arg("-c")
            .arg(format!(
                "'{FERRY}' recv --listen 127.0.0.1:{port} | head -c 100000 >/dev/null"
            ))
            .env("FERRY_KEY", KEY)
            .stderr(Stdio::null())
            .spawn()
            .expect("recv"),
    );
    thread::sleep(Duration::from_millis(300));
    let (mut s, mut input) = start_send(port, &[], true);
    // An endless producer.
    let feeder = thread::spawn(move || {
        let block = vec![1u8; 1 << 20];
        while input.write_all(&block).is_ok() {}
    });
    let t = Instant::now();
    let st = s
        .wait_timeout(Duration::from_secs(20))
        .expect("sender must not hang");
    assert_eq!(st.code(), Some(3), "{}", s.stderr_text());
    assert!(t.elapsed() < Duration::from_secs(15));
    assert!(s.stderr_text().contains("consumer"));
    r.wait_timeout(Duration::from_secs(10)).expect("recv exits");
    feeder.join().expect("feeder");
}

#[test]
fn port_in_use_is_a_connection_error() {
    if !wired() {
        return;
    }
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    let out = ferry(KEY)
        .args(["recv", "--listen", &format!("127.0.0.1:{port}")])
        .output()
        .expect("recv");
    assert_eq!(out.status.code(), Some(5));
    assert!(String::from_utf8_lossy(&out.stderr).contains("in use"));
}

/// A stand-in for ssh: drops the host and runs the command locally.
fn fake_rsh(dir: &Path) -> PathBuf {
    let p = dir.join("fake-ssh");
    std::fs::write(&p, "#!/bin/sh\nshift\nexec sh -c \"$1\"\n").expect("script");
    let mut perm = std::fs::metadata(&p).expect("meta").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o755);
    std::fs::set_permissions(&p, perm).expect("chmod");
    p
}

/// `ferry pipe` of `src` through a stand-in ssh (made in `dir`) into
/// `sh -c SCRIPT` on "localhost", with `extra` options.
fn pipe_command(dir: &Path, src: &Path, via_ssh: bool, extra: &[&str], script: &str) -> Command {
    let rsh = fake_rsh(dir);
    let mut c = Command::new(FERRY);
    c.env_remove("FERRY_KEY")
        .args([
            "pipe",
            "-e",
            rsh.to_str().expect("p"),
            "--remote-ferry",
            FERRY,
        ])
        .args([
            "--remote-listen",
            "127.0.0.1",
            "--input",
            src.to_str().expect("p"),
        ])
        .args(extra);
    if via_ssh {
        c.arg("--via-ssh");
    }
    c.args(["localhost", "--", "sh", "-c", script]);
    c
}

fn pipe(via_ssh: bool) {
    let dir = tempfile::tempdir().expect("tmp");
    let src = dir.path().join("src");
    let dst = dir.path().join("dst");
    write_data(&src, 20 << 20, false);
    let cmd = format!("cat > '{}'; exit 7", dst.display());
    let out = pipe_command(dir.path(), &src, via_ssh, &[], &cmd)
        .output()
        .expect("pipe");
    assert_eq!(
        out.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(same(&src, &dst));
}

#[test]
fn pipe_direct_returns_the_command_status() {
    if !wired() {
        return;
    }
    pipe(false);
}

#[test]
fn pipe_via_ssh_returns_the_command_status() {
    if !wired() {
        return;
    }
    pipe(true);
}

#[test]
fn killed_receiver_makes_the_sender_fail_promptly() {
    if !wired() {
        return;
    }
    let dir = tempfile::tempdir().expect("tmp");
    let dst = dir.path().join("dst");
    let (mut r, port) = start_recv(KEY, &[dst.to_str().expect("path")]);
    let (mut s, mut input) = start_send(port, &[], true);
    let feeder = thread::spawn(move || {
        let block = vec![3u8; 1 << 20];
        while input.write_all(&block).is_ok() {}
    });
    thread::sleep(Duration::from_millis(500));
    r.0.kill().expect("kill receiver");
    let st = s
        .wait_timeout(Duration::from_secs(20))
        .expect("sender must not hang");
    assert_eq!(st.code(), Some(5), "{}", s.stderr_text());
    feeder.join().expect("feeder");
}

/// `ferry keygen FILE`: 64 hex digits, mode 0600, never overwritten, and a
/// key that send and recv accept; a key that is too short is refused.
#[test]
fn keygen_writes_a_private_key_that_works() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tmp");
    let k = dir.path().join("k");
    let st = Command::new(FERRY)
        .args(["keygen", k.to_str().expect("path")])
        .status()
        .expect("keygen");
    assert!(st.success());
    let text = std::fs::read_to_string(&k).expect("key");
    assert_eq!(text.trim().len(), 64);
    assert!(text.trim().bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(
        std::fs::metadata(&k).expect("meta").permissions().mode() & 0o777,
        0o600
    );
    let again = Command::new(FERRY)
        .args(["keygen", k.to_str().expect("path")])
        .output()
        .expect("keygen");
    assert_eq!(again.status.code(), Some(1));
    assert_eq!(
        std::fs::read_to_string(&k).expect("key"),
        text,
        "overwritten"
    );
    let out = Command::new(FERRY)
        .args(["recv", "--listen", "127.0.0.1:0", "--key-file"])
        .arg(dir.path().join("nope"))
        .output()
        .expect("recv");
    assert_eq!(out.status.code(), Some(1));
    let short = dir.path().join("short");
    std::fs::write(&short, "abc\n").expect("short key");
    let out = Command::new(FERRY)
        .args([
            "send",
            "127.0.0.1:9",
            "--key-file",
            short.to_str().expect("path"),
        ])
        .stdin(Stdio::null())
        .output()
        .expect("send");
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The generated key carries a stream.
    let out_path = dir.path().join("out");
    let (mut r, port) = recv_announced(
        Command::new(FERRY),
        &[
            "--key-file",
            k.to_str().expect("path"),
            out_path.to_str().expect("path"),
        ],
    );
    let src = dir.path().join("src");
    write_data(&src, 1 << 20, false);
    let st = Command::new(FERRY)
        .args([
            "send",
            &format!("127.0.0.1:{port}"),
            src.to_str().expect("path"),
            "--key-file",
        ])
        .arg(&k)
        .status()
        .expect("send");
    assert!(st.success());
    let st = r.wait_timeout(Duration::from_secs(20)).expect("recv exits");
    assert_eq!(st.code(), Some(0), "{}", r.stderr_text());
    assert!(
        std::fs::read(dir.path().join("out")).expect("out") == std::fs::read(&src).expect("src")
    );
}
