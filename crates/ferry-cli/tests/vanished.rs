//! Staging while an application writes: a file that changes while ferry
//! reads it is a warning (exit 24, rsync's number), not a failure; the
//! destination keeps its old copy, everything else is synced, and the next
//! run, once the writer has stopped, completes with exit 0. Locally and
//! pushed to a daemon (the `FileChanged` message on the wire).

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;

/// Appends to `path` every millisecond until stopped.
struct Writer {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Writer {
    fn start(path: &Path) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                f.write_all(&[b'x'; 512]).unwrap();
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        Writer {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn source(src: &Path) {
    std::fs::create_dir_all(src.join("data")).unwrap();
    for i in 0..20 {
        std::fs::write(src.join(format!("data/f{i}")), bytes(i, 3000)).unwrap();
    }
    std::fs::write(src.join("app.log"), bytes(99, 48 << 20)).unwrap();
}

/// The run while the log grows: exit 24, the log's old copy kept, the
/// changed small files synced; then, the writer stopped, exit 0.
fn stage_while_writing(src: &Path, dst: &Path, sync: &dyn Fn(&[&str]) -> std::process::Output) {
    source(src);
    let first = sync(&[]);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let old_log = std::fs::read(dst.join("app.log")).unwrap();
    std::fs::write(src.join("data/f3"), b"changed").unwrap();
    let w = Writer::start(&src.join("app.log"));
    std::thread::sleep(Duration::from_millis(20));
    let during = sync(&[]);
    let err = String::from_utf8_lossy(&during.stderr);
    assert_eq!(during.status.code(), Some(24), "{err}");
    assert!(
        err.contains("app.log: file changed while being read"),
        "{err}"
    );
    assert!(
        std::fs::read(dst.join("app.log")).unwrap() == old_log,
        "the old copy was not kept"
    );
    assert_eq!(std::fs::read(dst.join("data/f3")).unwrap(), b"changed");
    let json: serde_json::Value = serde_json::from_slice(&during.stdout).unwrap();
    assert_eq!(json["files_vanished"], 1, "{json}");
    assert_eq!(json["files_failed"], 0, "{json}");
    assert_eq!(json["exit_code"], 24, "{json}");
    drop(w);
    let after = sync(&[]);
    assert!(
        after.status.success(),
        "{}",
        String::from_utf8_lossy(&after.stderr)
    );
    assert_same_tree(src, dst);
}

#[test]
fn a_file_written_during_a_local_run_is_a_warning() {
    let t = tempfile::tempdir().unwrap();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    let sync = |extra: &[&str]| {
        let mut a = vec!["sync", "--json"];
        a.extend_from_slice(extra);
        let (s, d) = (slash(&src), slash(&dst));
        a.push(&s);
        a.push(&d);
        ferry(&a)
    };
    stage_while_writing(&src, &dst, &sync);
    // rsync's scripts read the same number.
    let w = Writer::start(&src.join("app.log"));
    std::thread::sleep(Duration::from_millis(20));
    let o = sync(&["--rsync-exit-codes"]);
    assert_eq!(
        o.status.code(),
        Some(24),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    drop(w);
}

#[test]
fn a_file_written_during_a_push_to_a_daemon_is_a_warning() {
    let t = tempfile::tempdir().unwrap();
    let (src, root) = (t.path().join("src"), t.path().join("root"));
    std::fs::create_dir(&root).unwrap();
    let key = t.path().join("key");
    std::fs::write(&key, "0123456789abcdef0123456789abcdef").unwrap();
    let mut daemon = Command::new(ferry_bin())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--root",
            p(&root),
            "--key-file",
            p(&key),
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let mut err = std::io::BufReader::new(daemon.stderr.take().unwrap());
    std::io::BufRead::read_line(&mut err, &mut line).unwrap();
    let port = line.trim().rsplit(':').next().unwrap().to_string();
    // Keep reading its log so it never blocks on a full pipe.
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    let url = format!("ferry://127.0.0.1:{port}/vol/");
    let sync = |extra: &[&str]| {
        let mut a = vec!["sync", "--json", "--key-file", p(&key)];
        a.extend_from_slice(extra);
        let s = slash(&src);
        a.push(&s);
        a.push(&url);
        ferry(&a)
    };
    stage_while_writing(&src, &root.join("vol"), &sync);
    let _ = daemon.kill();
    let _ = daemon.wait();
}
