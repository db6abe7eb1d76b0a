//! `ferry serve --listen`: the real binary as a daemon on 127.0.0.1 and as
//! its clients (`ferry://`), including clients that do not hold the key,
//! say nothing, send garbage inside the channel, or ask for what lies
//! outside the root.

mod common;
#[path = "daemon/hostile.rs"]
mod hostile;
#[path = "daemon/members.rs"]
mod members;
#[path = "daemon/striped.rs"]
mod striped;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

const KEY: &str = "0123456789abcdef0123456789abcdef";

/// A daemon started by a test, killed (by pid) when dropped.
struct Daemon {
    child: Child,
    port: u16,
    log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Daemon {
    fn start(key_file: &Path, args: &[&str]) -> Daemon {
        let mut child = Command::new(ferry_bin())
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--key-file",
                p(key_file),
            ])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the daemon");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let first = lines.next().and_then(|l| l.ok()).unwrap_or_default();
        let port = first
            .rsplit(':')
            .next()
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("no listening line: {first:?}"));
        let log = std::sync::Arc::new(std::sync::Mutex::new(vec![first]));
        let l = log.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                l.lock().unwrap().push(line);
            }
        });
        Daemon { child, port, log }
    }

    fn url(&self, path: &str) -> String {
        format!("ferry://127.0.0.1:{}/{path}", self.port)
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// Wait for the daemon to exit on its own (`--once`).
    fn wait(&mut self, limit: Duration) -> Option<i32> {
        let t = Instant::now();
        while t.elapsed() < limit {
            if let Ok(Some(s)) = self.child.try_wait() {
                return s.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn key_file(dir: &Path, key: &str) -> PathBuf {
    let f = dir.join(format!("key-{}", &key[..4]));
    std::fs::write(&f, key).unwrap();
    f
}

fn tree(root: &Path) {
    std::fs::create_dir_all(root.join("sub/deeper")).unwrap();
    std::fs::write(root.join("a.txt"), b"alpha\n").unwrap();
    std::fs::write(root.join("sub/big.bin"), bytes(7, 3 << 20)).unwrap();
    std::fs::write(root.join("sub/deeper/c"), bytes(8, 1000)).unwrap();
    std::os::unix::fs::symlink("a.txt", root.join("link")).unwrap();
}

/// A scratch directory with a source tree, an empty root and a key file.
fn fixture() -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let (src, root) = (t.path().join("src"), t.path().join("root"));
    tree(&src);
    std::fs::create_dir(&root).unwrap();
    let key = key_file(t.path(), KEY);
    (t, src, root, key)
}

fn run(args: &[&str]) -> std::process::Output {
    ferry(args)
}

/// `ferry sync ferry://.../FROM TO --key-file KEY`.
fn pull(d: &Daemon, from: &str, to: &Path, key: &str) -> std::process::Output {
    run(&["sync", &d.url(from), p(to), "--key-file", key])
}

fn code(o: &std::process::Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn push_and_pull_through_a_daemon() {
    let (t, src, root, key) = fixture();
    let d = Daemon::start(&key, &["--root", p(&root)]);
    let push = ferry_ok(&["sync", &slash(&src), &d.url("vol/"), "--key-file", p(&key)]);
    assert_eq!(push["files_transferred"], 4, "{push}");
    assert_same_tree(&src, &root.join("vol"));
    // A re-run moves nothing; a change moves only itself.
    let again = ferry_ok(&["sync", &slash(&src), &d.url("vol/"), "--key-file", p(&key)]);
    assert_eq!(again["files_transferred"], 0, "{again}");
    std::fs::write(src.join("a.txt"), b"beta\n").unwrap();
    std::fs::remove_file(src.join("sub/deeper/c")).unwrap();
    let changed = ferry_ok(&[
        "sync",
        "--delete",
        &slash(&src),
        &d.url("/vol/"),
        "--key-file",
        p(&key),
    ]);
    assert_eq!(changed["files_transferred"], 1, "{changed}");
    assert_eq!(changed["files_deleted"], 1, "{changed}");
    assert_same_tree(&src, &root.join("vol"));
    // Pull it back: the tree, and one file by name.
    let back = t.path().join("back");
    ferry_ok(&["sync", &d.url("vol/"), p(&back), "--key-file", p(&key)]);
    assert_same_tree(&src, &back);
    let one = t.path().join("one.bin");
    ferry_ok(&[
        "sync",
        &d.url("vol/sub/big.bin"),
        p(&one),
        "--key-file",
        p(&key),
    ]);
    assert!(std::fs::read(&one).unwrap() == bytes(7, 3 << 20));
    // The key may come from the environment, as in a Pod.
    let out = Command::new(ferry_bin())
        .args(["sync", &d.url("vol/a.txt"), p(&t.path().join("env.txt"))])
        .env("FERRY_KEY_FILE", &key)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(d.log().contains("push to \"vol/\""), "{}", d.log());
}

#[test]
fn strangers_and_escapes_are_refused_and_nothing_outside_is_touched() {
    let t = tempfile::tempdir().unwrap();
    let (src, root, outside) = (
        t.path().join("src"),
        t.path().join("root"),
        t.path().join("outside"),
    );
    tree(&src);
    std::fs::create_dir_all(root.join("in")).unwrap();
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("secret"), b"keep me").unwrap();
    std::os::unix::fs::symlink(&outside, root.join("out")).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("in/deep")).unwrap();
    let key = key_file(t.path(), KEY);
    let wrong = key_file(t.path(), "fedcba9876543210fedcba9876543210");
    let d = Daemon::start(&key, &["--root", p(&root)]);
    let s = slash(&src);
    let k = p(&key);

    // The wrong key: exit 7, nothing written.
    let o = run(&["sync", &s, &d.url("x/"), "--key-file", p(&wrong)]);
    assert_eq!(code(&o), 7, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("does not hold this key"),
        "{}",
        stderr(&o)
    );
    assert!(!root.join("x").exists());
    // No key at all: a usage error before any connection.
    let o = Command::new(ferry_bin())
        .args(["sync", &s, &d.url("x/")])
        .env_remove("FERRY_KEY")
        .env_remove("FERRY_KEY_FILE")
        .output()
        .unwrap();
    assert_eq!(code(&o), 1, "{}", stderr(&o));

    // Paths that lead out of the root, pushed to and pulled from.
    for (target, want) in [
        ("../x/", 3),
        ("in/../../x/", 3),
        ("out/", 3),
        ("out/new/", 3),
        ("in/deep/", 3),
        ("in/deep/new", 3),
    ] {
        let o = run(&["sync", &s, &d.url(target), "--key-file", k]);
        assert_eq!(code(&o), want, "push to {target}: {}", stderr(&o));
        let o = pull(&d, target, &t.path().join("pulled"), k);
        assert_ne!(code(&o), 0, "pull of {target}: {}", stderr(&o));
    }
    assert!(!t.path().join("pulled").exists());
    // An absolute path is beneath the root, not at the top of the host.
    let name = format!("ferry-daemon-test-{}", std::process::id());
    ferry_ok(&["sync", &s, &d.url(&format!("/{name}/")), "--key-file", k]);
    assert!(
        !Path::new("/").join(&name).exists(),
        "wrote outside the root"
    );
    assert_same_tree(&src, &root.join(&name));

    // Options that name paths on the daemon's host: refused, exit 1.
    for opt in [
        "--link-dest=/etc",
        "--sig-cache=/tmp/sc",
        "--partial-dir=/tmp/pd",
    ] {
        let o = run(&["sync", opt, &s, &d.url("y/"), "--key-file", k]);
        assert_eq!(code(&o), 1, "{opt}: {}", stderr(&o));
        assert!(stderr(&o).contains("does not take"), "{}", stderr(&o));
    }
    assert_eq!(std::fs::read(outside.join("secret")).unwrap(), b"keep me");
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 1);
    // The daemon still serves.
    ferry_ok(&["sync", &s, &d.url("in/ok/"), "--key-file", k]);
    assert_same_tree(&src, &root.join("in/ok"));
}

/// Speak to the daemon as a hostile client that holds the key: a channel
/// handshake, then `payload` inside the channel; the daemon's answer.
fn hostile(port: u16, payload: &[u8]) -> Vec<u8> {
    let psk = ferry_channel::Psk::new(KEY.as_bytes()).unwrap();
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let (session, s) = ferry_link::direct::handshake_tcp(
        s,
        &psk,
        ferry_channel::Role::Initiator,
        Duration::from_secs(10),
    )
    .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut w = ferry_channel::ChannelWriter::new(s.try_clone().unwrap(), &session);
    let mut r = ferry_channel::ChannelReader::new(s, &session);
    let _ = w.write_all(payload).and_then(|()| w.flush());
    let mut got = Vec::new();
    let _ = r.read_to_end(&mut got);
    got
}

#[test]
fn garbage_silence_and_crowds_do_not_disturb_other_sessions() {
    let (_t, src, root, key) = fixture();
    let d = Daemon::start(&key, &["--root", p(&root), "--max-sessions", "2"]);
    let k = p(&key);
    // Twenty strangers connect and say nothing.
    let silent: Vec<TcpStream> = (0..20)
        .map(|_| TcpStream::connect(("127.0.0.1", d.port)).unwrap())
        .collect();
    let started = Instant::now();
    ferry_ok(&["sync", &slash(&src), &d.url("a/"), "--key-file", k]);
    assert!(started.elapsed() < Duration::from_secs(60));
    assert_same_tree(&src, &root.join("a"));
    drop(silent);

    use ferry_link::daemon::{encode_request, ANSWER_MAGIC, MAX_REQUEST, REQUEST_MAGIC};
    let mut huge = REQUEST_MAGIC.to_vec();
    huge.extend_from_slice(&(MAX_REQUEST as u32 + 1).to_be_bytes());
    let mut lying = REQUEST_MAGIC.to_vec();
    lying.extend_from_slice(&4u32.to_be_bytes());
    lying.extend_from_slice(&[0, 50, 0, 200]);
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let merge = encode_request(&args(&[
        "serve",
        "--stdio",
        "--send",
        "--filter=. /etc/passwd",
        "--",
        "",
    ]))
    .unwrap();
    let listen = encode_request(&args(&["serve", "--listen", "0.0.0.0:1", "--", ""])).unwrap();
    let bogus = encode_request(&args(&[
        "serve",
        "--stdio",
        "--send",
        "--threads=x",
        "--",
        "",
    ]))
    .unwrap();
    for (what, payload) in [
        ("bad magic", b"GET / HTTP/1.0\r\n\r\n".to_vec()),
        ("huge length", huge),
        ("truncated body", lying),
        ("merge filter", merge),
        ("daemon option", listen),
        ("bad value", bogus),
    ] {
        let answer = hostile(d.port, &payload);
        assert!(answer.starts_with(&ANSWER_MAGIC), "{what}: {answer:?}");
        assert_ne!(answer[8], 0, "{what}: accepted");
    }
    // Two sessions hold the slots (authenticated, request not yet sent):
    // a third client is told the daemon is busy (exit 5, retryable). The
    // refused sessions above give their slots back just after answering,
    // which a loaded machine may do late: a holder that is answered
    // (busy) instead of left waiting tries again.
    let psk = ferry_channel::Psk::new(KEY.as_bytes()).unwrap();
    let hold_a_slot = || {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let s = TcpStream::connect(("127.0.0.1", d.port)).unwrap();
            let (session, s) = ferry_link::direct::handshake_tcp(
                s,
                &psk,
                ferry_channel::Role::Initiator,
                Duration::from_secs(10),
            )
            .unwrap();
            s.set_read_timeout(Some(Duration::from_millis(300)))
                .unwrap();
            let mut b = [0u8; 1];
            match (&s).read(&mut b) {
                // Nothing said: the daemon waits for this one's request.
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return (session, s)
                }
                _ => assert!(Instant::now() < deadline, "no slot came free"),
            }
        }
    };
    let holders: Vec<_> = (0..2).map(|_| hold_a_slot()).collect();
    let o = run(&[
        "sync",
        "--retries",
        "0",
        &slash(&src),
        &d.url("b/"),
        "--key-file",
        k,
    ]);
    assert_eq!(code(&o), 5, "{}\ndaemon: {}", stderr(&o), d.log());
    assert!(stderr(&o).contains("busy"), "{}", stderr(&o));
    drop(holders);
    // Slots come back when those sessions end.
    let t0 = Instant::now();
    loop {
        let o = run(&[
            "sync",
            "--retries",
            "0",
            &slash(&src),
            &d.url("b/"),
            "--key-file",
            k,
        ]);
        if o.status.success() {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "{}", stderr(&o));
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_same_tree(&src, &root.join("b"));
    assert!(!root.join("etc").exists());
}

#[test]
fn once_exits_with_the_session_and_writes_the_termination_log() {
    let (t, src, root, key) = fixture();
    let wrong = key_file(t.path(), "fedcba9876543210fedcba9876543210");
    let tlog = t.path().join("termination-log");
    let mut d = Daemon::start(
        &key,
        &[
            "--root",
            p(&root),
            "--once",
            "--write-only",
            "--termination-log",
            p(&tlog),
        ],
    );
    // A client with the wrong key is not the one session.
    let o = run(&["sync", &slash(&src), &d.url("v/"), "--key-file", p(&wrong)]);
    assert_eq!(code(&o), 7);
    assert_eq!(
        d.wait(Duration::from_millis(300)),
        None,
        "exited after a stranger"
    );
    ferry_ok(&["sync", &slash(&src), &d.url("v/"), "--key-file", p(&key)]);
    assert_eq!(d.wait(Duration::from_secs(30)), Some(0), "{}", d.log());
    assert_same_tree(&src, &root.join("v"));
    let line = std::fs::read_to_string(&tlog).unwrap();
    assert!(
        line.contains("push to \"v/\": done: 4 files") && line.contains("exit 0"),
        "{line}"
    );

    // Write-only: a pull is refused, and that refusal is the session.
    let mut d = Daemon::start(&key, &["--root", p(&root), "--once", "--write-only"]);
    let o = pull(&d, "v/", &t.path().join("p"), p(&key));
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert!(stderr(&o).contains("write-only"), "{}", stderr(&o));
    assert_eq!(d.wait(Duration::from_secs(30)), Some(1));

    // A pull from a --once daemon: it exits 0 once the client has all of
    // it (the client's last message must reach it before the client exits).
    for round in 0..3 {
        let mut d = Daemon::start(&key, &["--root", p(&root), "--once", "--read-only"]);
        let to = t.path().join(format!("pulled-{round}"));
        ferry_ok(&["sync", &d.url("v/"), p(&to), "--key-file", p(&key)]);
        assert_same_tree(&src, &to);
        assert_eq!(d.wait(Duration::from_secs(30)), Some(0), "{}", d.log());
    }

    // Read-only refuses a push.
    let d = Daemon::start(&key, &["--root", p(&root), "--read-only"]);
    let o = run(&["sync", &slash(&src), &d.url("w/"), "--key-file", p(&key)]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert!(!root.join("w").exists());
}

#[test]
fn a_device_daemon_serves_one_image() {
    let t = tempfile::tempdir().unwrap();
    let dev = t.path().join("disk.img");
    let img = t.path().join("src.img");
    // A sparse image: data at the start and at 40 MiB, a hole between.
    let f = std::fs::File::create(&img).unwrap();
    f.set_len(64 << 20).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(&bytes(3, 1 << 20), 0).unwrap();
    f.write_all_at(&bytes(4, 1 << 20), 40 << 20).unwrap();
    std::fs::File::create(&dev)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    // Same size: an older mtime makes it differ, as a device's would.
    set_mtime(&dev, 1_000_000);
    let key = key_file(t.path(), KEY);
    let d = Daemon::start(&key, &["--device", p(&dev)]);
    ferry_ok(&["sync", p(&img), &d.url(""), "--key-file", p(&key)]);
    assert!(
        std::fs::read(&dev).unwrap() == std::fs::read(&img).unwrap(),
        "device differs"
    );
    let back = t.path().join("back.img");
    ferry_ok(&["sync", &d.url(""), p(&back), "--key-file", p(&key)]);
    assert!(
        std::fs::read(&back).unwrap() == std::fs::read(&img).unwrap(),
        "pulled image differs"
    );
    // A device daemon has no paths to offer.
    let o = pull(&d, "etc/passwd", &t.path().join("x"), p(&key));
    assert_eq!(code(&o), 1, "{}", stderr(&o));
}

/// `serve --listen --progress=json`: each session says how it stands, a
/// JSON object a second on stderr and one at its end, named by its peer
/// and what it asked.
#[test]
fn a_daemon_reports_each_sessions_progress_as_json() {
    let (t, src, root, key) = fixture();
    std::fs::write(src.join("big"), bytes(5, 24 << 20)).unwrap();
    let d = Daemon::start(&key, &["--root", p(&root), "--progress=json"]);
    ferry_ok(&["sync", &slash(&src), &d.url("in/"), "--key-file", p(&key)]);
    let pulled = t.path().join("pulled");
    let o = pull(&d, "in/big", &pulled, p(&key));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    // The end of a session is printed as it ends; give the log a moment.
    let deadline = Instant::now() + Duration::from_secs(10);
    let objects = loop {
        let objs: Vec<serde_json::Value> = d
            .log()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let ends = objs.iter().filter(|o| o["phase"] == "done").count();
        if ends >= 2 || Instant::now() > deadline {
            break objs;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let end_of = |what: &str| {
        objects
            .iter()
            .find(|o| {
                o["phase"] == "done" && o["session"].as_str().is_some_and(|s| s.contains(what))
            })
            .unwrap_or_else(|| panic!("no end of a {what} in {objects:?}"))
            .clone()
    };
    let push = end_of("push to");
    assert!(push["bytes_done"].as_u64().unwrap() >= 24 << 20, "{push}");
    assert!(
        push["session"].as_str().unwrap().starts_with("127.0.0.1:"),
        "{push}"
    );
    let pull = end_of("pull");
    assert!(pull["bytes_done"].as_u64().unwrap() >= 24 << 20, "{pull}");
}

/// `ferry send [FILE] ferry://HOST:PORT/PATH`: a stream (a file, or stdin)
/// goes into PATH beneath the daemon's root, resumes what an earlier
/// stream left there, and never goes anywhere else; `ferry recv --from`
/// fetches one back.
#[test]
fn streams_go_into_a_file_beneath_the_root() {
    let (t, _src, root, key) = fixture();
    std::fs::create_dir_all(root.join("backups")).unwrap();
    let data = bytes(11, 12 << 20);
    let input = t.path().join("pool.zfs");
    std::fs::write(&input, &data).unwrap();
    let d = Daemon::start(&key, &["--root", p(&root)]);
    let send = |url: &str, extra: &[&str]| {
        let mut a = vec!["send", url, p(&input), "--key-file", p(&key)];
        a.extend_from_slice(extra);
        run(&a)
    };
    let o = send(&d.url("backups/pool.zfs"), &[]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(std::fs::read(root.join("backups/pool.zfs")).unwrap(), data);
    // From stdin.
    let mut child = Command::new(ferry_bin())
        .args(["send", &d.url("backups/piped"), "--key-file", p(&key)])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&data).unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!(std::fs::read(root.join("backups/piped")).unwrap(), data);
    // What an interrupted stream left is offered and kept.
    std::fs::write(root.join("backups/half"), &data[..5 << 20]).unwrap();
    let o = send(&d.url("backups/half"), &["--json"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["bytes_resumed"], 5 << 20, "{j}");
    assert_eq!(std::fs::read(root.join("backups/half")).unwrap(), data);

    // Never outside the root, never through a symlink, never into a FIFO.
    let outside = t.path().join("outside");
    std::fs::write(&outside, b"keep").unwrap();
    std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
    let ok = Command::new("mkfifo")
        .arg(root.join("fifo"))
        .status()
        .unwrap();
    assert!(ok.success());
    for bad in ["../outside", "link", "fifo", "backups/", "missing/x"] {
        let o = send(&d.url(bad), &[]);
        assert_ne!(code(&o), 0, "{bad}: {}", stderr(&o));
        assert_eq!(
            stderr(&o).trim().lines().count(),
            1,
            "{bad}: {}",
            stderr(&o)
        );
    }
    assert_eq!(std::fs::read(&outside).unwrap(), b"keep");
    // A name that is another link of an outside file gets a file of its
    // own; a set-ID file written over loses its bits.
    std::fs::hard_link(&outside, root.join("backups/hl")).unwrap();
    assert_eq!(code(&send(&d.url("backups/hl"), &[])), 0);
    assert_eq!(std::fs::read(&outside).unwrap(), b"keep");
    assert_eq!(std::fs::read(root.join("backups/hl")).unwrap(), data);
    use std::os::unix::fs::PermissionsExt;
    let suid = root.join("backups/tool");
    std::fs::write(&suid, b"old").unwrap();
    std::fs::set_permissions(&suid, std::fs::Permissions::from_mode(0o6755)).unwrap();
    assert_eq!(code(&send(&d.url("backups/tool"), &[])), 0);
    let mode = std::fs::metadata(&suid).unwrap().permissions().mode();
    assert_eq!(mode & 0o7777, 0o755, "{mode:o}");
    // A write-only daemon offers nothing of what a file holds (its size
    // and digest would tell a client that may not read it).
    let w = Daemon::start(&key, &["--root", p(&root), "--write-only"]);
    std::fs::write(root.join("backups/guess"), &data[..1 << 20]).unwrap();
    let o = send(&w.url("backups/guess"), &["--json"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["bytes_resumed"], 0, "{j}");
    assert_eq!(std::fs::read(root.join("backups/guess")).unwrap(), data);
    drop(w);
    // A wrong key is refused (7), and nothing is written.
    let wrong = key_file(t.path(), "ffffffffffffffffffffffffffffffff");
    let o = run(&[
        "send",
        &d.url("backups/w"),
        p(&input),
        "--key-file",
        p(&wrong),
    ]);
    assert_eq!(code(&o), 7, "{}", stderr(&o));
    assert!(!root.join("backups/w").exists());
    // A read-only daemon takes no stream; a device daemon neither.
    let ro = Daemon::start(&key, &["--root", p(&root), "--read-only"]);
    let o = send(&ro.url("backups/ro"), &[]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert!(!root.join("backups/ro").exists());

    // `ferry recv --from ferry://...`: a file of the root as a stream, to
    // stdout or into a file (resumed from what that holds).
    let fetch = |url: &str, extra: &[&str]| {
        let mut a = vec!["recv", "--from", url, "--key-file", p(&key)];
        a.extend_from_slice(extra);
        run(&a)
    };
    let o = fetch(&ro.url("backups/pool.zfs"), &[]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(o.stdout == data, "the stream on stdout differs");
    let local = t.path().join("local.zfs");
    std::fs::write(&local, &data[..3 << 20]).unwrap();
    let o = fetch(&ro.url("backups/pool.zfs"), &[p(&local), "--json"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["bytes_resumed"], 3 << 20, "{j}");
    assert_eq!(std::fs::read(&local).unwrap(), data);
    for bad in ["../outside", "link", "fifo", "backups/", "backups/none"] {
        let o = fetch(&ro.url(bad), &[]);
        assert_ne!(code(&o), 0, "{bad}");
        assert!(o.stdout.is_empty(), "{bad}");
    }
    // A write-only daemon sends nothing.
    let wo = Daemon::start(&key, &["--root", p(&root), "--write-only"]);
    let o = fetch(&wo.url("backups/pool.zfs"), &[]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert!(o.stdout.is_empty());
    let dev = t.path().join("disk.img");
    std::fs::write(&dev, vec![0u8; 1 << 20]).unwrap();
    let dd = Daemon::start(&key, &["--device", p(&dev)]);
    let o = send(&dd.url(""), &[]);
    assert_ne!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(std::fs::read(&dev).unwrap(), vec![0u8; 1 << 20]);
}
