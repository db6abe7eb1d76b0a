//! What a user trusts ferry with, through the real binary: a killed run
//! never tears a file and leaves nothing behind, a read error never turns
//! into deletions, what ferry reports is on the disk.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

/// Content of file `i` at generation `g`.
fn version(i: u64, g: u64) -> Vec<u8> {
    bytes(i * 1000 + g, (1 << 20) + (i as usize * 4099) % 65536)
}

/// 100 local syncs of a changing tree, each killed with SIGKILL at a
/// different moment: after each, every destination file is one whole
/// version (the old or the new), never a mix; the next run completes,
/// identical to the source, with no temporary file left.
#[test]
fn kill_9_loop_never_tears_a_file_and_the_next_run_completes() {
    const FILES: u64 = 16;
    const RUNS: u64 = 100;
    let d = tempfile::tempdir().unwrap();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    fs::create_dir_all(src.join("sub")).unwrap();
    let path_of = |root: &Path, i: u64| -> PathBuf {
        if i.is_multiple_of(2) {
            root.join(format!("f{i}"))
        } else {
            root.join("sub").join(format!("f{i}"))
        }
    };
    let mut gen = vec![0u64; FILES as usize];
    for i in 0..FILES {
        fs::write(path_of(&src, i), version(i, 0)).unwrap();
    }
    ferry_ok(&["sync", &slash(&src), p(&dst)]);
    let mut killed_mid_run = 0;
    for run in 1..=RUNS {
        // Rewrite a third of the files (a new version, a new mtime).
        let before = gen.clone();
        for i in 0..FILES {
            if (i + run) % 3 == 0 {
                gen[i as usize] = run;
                let f = path_of(&src, i);
                fs::write(&f, version(i, run)).unwrap();
                set_mtime(&f, 1_700_000_000 + run as i64 * 10 + i as i64);
            }
        }
        let mut child = Command::new(ferry_bin())
            .args(["sync", "-q", &slash(&src), p(&dst)])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Anywhere from before the walk to after the last rename.
        std::thread::sleep(Duration::from_micros((run * 7919) % 30_000));
        let _ = child.kill();
        let st = child.wait().unwrap();
        if st.code().is_none() {
            killed_mid_run += 1;
        }
        for i in 0..FILES {
            let got = fs::read(path_of(&dst, i)).unwrap();
            let (old, new) = (before[i as usize], gen[i as usize]);
            assert!(
                got == version(i, old) || got == version(i, new),
                "run {run}: file {i} is neither version {old} nor {new} ({} bytes)",
                got.len()
            );
        }
        let j = ferry_ok(&["sync", &slash(&src), p(&dst)]);
        assert_eq!(j["exit_code"], 0, "run {run}: {j}");
        assert_same_tree(&src, &dst);
        assert!(
            temp_files(&dst).is_empty(),
            "run {run}: {:?}",
            temp_files(&dst)
        );
    }
    // The delays must really have cut runs short, or this proves nothing.
    assert!(
        killed_mid_run >= RUNS / 10,
        "only {killed_mid_run} runs were killed"
    );
    eprintln!("kill -9 loop: {RUNS} runs, {killed_mid_run} killed before they finished");
}

/// A temporary file of a killed run is removed by the next run that
/// writes into its directory; one of a live process is left alone.
#[test]
fn stale_temp_files_are_removed_by_the_next_run() {
    let d = tempfile::tempdir().unwrap();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    fs::create_dir_all(&src).unwrap();
    fs::create_dir_all(&dst).unwrap();
    fs::write(src.join("f"), b"new").unwrap();
    // pid 4294967294 is beyond any pid_max: its process is gone.
    let stale = dst.join(".f.ferry-4294967294-7");
    fs::write(&stale, b"half a file").unwrap();
    let live = dst.join(format!(".g.ferry-{}-1", std::process::id()));
    fs::write(&live, b"someone else's").unwrap();
    ferry_ok(&["sync", &slash(&src), p(&dst)]);
    assert!(!stale.exists(), "stale temp file left");
    assert!(live.exists(), "a live process's temp file was removed");
    assert_eq!(fs::read(dst.join("f")).unwrap(), b"new");
}

/// Each file's data is durable before its rename (small files in batches:
/// write-back waited for, then one `syncfs`; see the receiver's
/// `commit` module), and the changed directories are fsync'd after;
/// --no-fsync does none of it. Read from strace's log, in order.
#[test]
fn files_are_synced_before_rename_and_directories_after() {
    if !which("strace") {
        skip("files_are_synced_before_rename_and_directories_after: strace not installed");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    fs::create_dir_all(src.join("a")).unwrap();
    for i in 0..5 {
        fs::write(src.join(format!("a/f{i}")), bytes(i, 100_000)).unwrap();
    }
    // One big file: written with O_DIRECT, committed the same way.
    fs::write(src.join("big"), bytes(9, 9 << 20)).unwrap();
    let trace = |extra: &[&str], dst: &Path| -> Vec<String> {
        let log = d.path().join("strace.log");
        let mut args = vec![
            "-f",
            "-qq",
            "-e",
            "trace=fdatasync,fsync,syncfs,sync_file_range,rename,renameat,renameat2",
            "-o",
        ];
        args.push(p(&log));
        let bin = ferry_bin();
        args.push(p(&bin));
        args.extend(["sync", "-q"]);
        args.extend(extra);
        let s = slash(&src);
        args.push(&s);
        args.push(p(dst));
        let st = Command::new("strace").args(&args).status().unwrap();
        assert!(st.success());
        // "pid  call(args) = rc" (or "... <unfinished ...>", resumed on a
        // "<... call resumed>" line, skipped): the calls, in the order made.
        let traced = [
            "fdatasync",
            "fsync",
            "syncfs",
            "sync_file_range",
            "rename",
            "renameat",
            "renameat2",
        ];
        fs::read_to_string(&log)
            .unwrap()
            .lines()
            .filter_map(|l| {
                let call = l.split_whitespace().nth(1)?.split('(').next()?;
                traced.contains(&call).then(|| call.to_string())
            })
            .collect()
    };
    let calls = trace(&[], &d.path().join("dst"));
    let renames: Vec<usize> = (0..calls.len())
        .filter(|&i| calls[i].starts_with("rename"))
        .collect();
    assert_eq!(renames.len(), 6, "one rename per file: {calls:?}");
    // One batch: every file's write-back waited for, then the syncfs,
    // then the renames, each after its own descriptor was asked again.
    let first_rename = renames[0];
    let syncfs = calls[..first_rename].iter().rposition(|c| c == "syncfs");
    assert!(syncfs.is_some(), "no syncfs before the renames: {calls:?}");
    let waits = calls[..syncfs.unwrap()]
        .iter()
        .filter(|c| *c == "sync_file_range")
        .count();
    assert!(
        waits >= 12,
        "{waits} write-back calls before the syncfs: {calls:?}"
    );
    let rechecks = calls[syncfs.unwrap()..]
        .iter()
        .filter(|c| *c == "sync_file_range")
        .count();
    assert_eq!(
        rechecks, 6,
        "each file asked again after the syncfs: {calls:?}"
    );
    let last_rename = *renames.last().unwrap();
    let dir_syncs = calls[last_rename..]
        .iter()
        .filter(|c| *c == "fsync")
        .count();
    assert!(
        dir_syncs >= 2,
        "{dir_syncs} fsync calls after the renames for 2 changed directories: {calls:?}"
    );
    let calls = trace(&["--no-fsync"], &d.path().join("dst2"));
    assert!(
        calls.iter().all(|c| c.starts_with("rename")),
        "--no-fsync still syncs: {calls:?}"
    );
}

/// Run ferry as the unprivileged user `nobody` (root ignores file
/// permissions, so read errors cannot be staged as root).
fn as_nobody(args: &[&str]) -> std::process::Output {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(ferry_bin())
        .args(args)
        .output()
        .unwrap()
}

/// A source directory that cannot be read must not make --delete remove
/// the destination's copy of it (rsync: "IO error encountered -- skipping
/// file deletion"); --ignore-errors deletes anyway.
#[test]
fn a_read_error_turns_delete_off() {
    if !is_root() || !which("setpriv") {
        skip("a_read_error_turns_delete_off needs root and setpriv to act as nobody");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    fs::create_dir_all(src.join("locked")).unwrap();
    fs::write(src.join("locked/data"), b"x").unwrap();
    fs::write(src.join("ok"), b"ok").unwrap();
    fs::create_dir_all(dst.join("locked")).unwrap();
    fs::write(dst.join("locked/data"), b"precious").unwrap();
    fs::write(dst.join("extra"), b"extra").unwrap();
    for p in [d.path(), &src, &dst, &dst.join("locked")] {
        std::os::unix::fs::chown(p, Some(65534), Some(65534)).unwrap();
    }
    for f in [src.join("ok"), dst.join("locked/data"), dst.join("extra")] {
        std::os::unix::fs::chown(&f, Some(65534), Some(65534)).unwrap();
    }
    // Root owns src/locked, mode 0700: nobody cannot list it.
    fs::set_permissions(src.join("locked"), fs::Permissions::from_mode(0o700)).unwrap();
    let out = as_nobody(&["sync", "--delete", "--json", &slash(&src), p(&dst)]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("skipping deletion"), "{err}");
    assert!(
        err.contains("list directory") && err.contains("permission denied"),
        "{err}"
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["delete_skipped"], true, "{j}");
    assert_eq!(fs::read(dst.join("locked/data")).unwrap(), b"precious");
    assert!(dst.join("extra").exists());
    assert_eq!(fs::read(dst.join("ok")).unwrap(), b"ok");
    // With --ignore-errors the user asked for it.
    let out = as_nobody(&["sync", "--delete", "--ignore-errors", &slash(&src), p(&dst)]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!dst.join("extra").exists());
}

/// A destination directory the user may not write into: each entry that
/// failed is one line with the operation and the OS's reason, and the
/// counts agree with the lines.
#[test]
fn unwritable_destination_lines_name_the_cause() {
    if !is_root() || !which("setpriv") {
        skip("unwritable_destination_lines_name_the_cause needs root and setpriv to act as nobody");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    fs::create_dir_all(src.join("sub")).unwrap();
    for f in ["a", "b", "sub/c"] {
        fs::write(src.join(f), f).unwrap();
    }
    fs::create_dir_all(&dst).unwrap();
    std::os::unix::fs::chown(d.path(), Some(65534), Some(65534)).unwrap();
    for e in walk(&src) {
        std::os::unix::fs::chown(&e, Some(65534), Some(65534)).unwrap();
    }
    std::os::unix::fs::chown(&src, Some(65534), Some(65534)).unwrap();
    // dst stays root's, mode 0755: nobody cannot create anything in it.
    let out = as_nobody(&["sync", "--json", &slash(&src), p(&dst)]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(
        j["files_failed"].as_u64().unwrap() as usize,
        lines.len(),
        "{err}"
    );
    assert!(
        lines
            .iter()
            .all(|l| l.contains("permission denied") || l.contains("skipped")),
        "{err}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("create directory") && l.contains("permission denied")),
        "{err}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("create temporary file for") && l.contains("permission denied")),
        "{err}"
    );
    assert!(!err.contains("parent is not a directory"), "{err}");
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).unwrap().flatten() {
        out.push(e.path());
        if e.file_type().unwrap().is_dir() {
            out.extend(walk(&e.path()));
        }
    }
    out
}

/// A small file finished early is committed within its batch's 2 s, not
/// held until a slow big file behind it is done: a Ctrl-C then keeps it.
#[test]
fn a_finished_small_file_does_not_wait_for_the_run_to_end() {
    let d = tempfile::tempdir().unwrap();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("a"), bytes(1, 10_000)).unwrap();
    // 40 MiB at 8 MB/s: about 5 s.
    fs::write(src.join("b"), bytes(2, 40 << 20)).unwrap();
    let mut child = Command::new(ferry_bin())
        .args(["sync", "-q", "--bwlimit", "8M", &slash(&src), p(&dst)])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    let mut seen = None;
    while t.elapsed() < Duration::from_secs(30) {
        if seen.is_none() && dst.join("a").exists() {
            seen = Some(t.elapsed());
        }
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let ended = t.elapsed();
    assert!(child.wait().unwrap().success());
    let seen = seen.expect("a never appeared while the run went on");
    assert!(
        seen + Duration::from_secs(1) < ended,
        "a appeared at {seen:?}, the run ended at {ended:?}"
    );
    assert_eq!(fs::read(dst.join("a")).unwrap(), bytes(1, 10_000));
    assert_eq!(fs::read(dst.join("b")).unwrap(), bytes(2, 40 << 20));
}

/// Run `ferry sync -a --json src/ dst/` with the walk or a worker paused
/// before it opens the entry `name` below the source's top; meanwhile,
/// `swap` changes the tree as a local user racing the run could.
fn sync_with_swap(src: &Path, dst: &Path, name: &str, swap: impl FnOnce()) -> std::process::Output {
    let go = dst.with_extension(format!("go-{name}"));
    let paused = go.with_extension(format!("go-{name}.paused"));
    let child = Command::new(ferry_bin())
        .args(["sync", "-a", "--json", &slash(src), &slash(dst)])
        .env("FERRY_TEST_PAUSE_OPEN", format!("{name}:{}", go.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while !paused.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "never paused at {name}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    swap();
    fs::write(&go, b"").unwrap();
    child.wait_with_output().unwrap()
}

/// The sender runs as root over a tree a local user can write in (a backup
/// of /home, a daemon's module): the user swaps a directory for a symlink
/// to a secret place just as the walk enters it, or just before a worker
/// opens a file in it. Nothing of the secret place is listed, opened or
/// sent; the run reports the directory and the file and exits non-zero;
/// the next run is whole again.
#[test]
fn a_directory_swapped_for_a_symlink_during_a_run_leaks_nothing() {
    let d = tempfile::tempdir().unwrap();
    let (src, secret) = (d.path().join("src"), d.path().join("secret"));
    fs::create_dir_all(src.join("pub")).unwrap();
    fs::create_dir_all(&secret).unwrap();
    fs::write(src.join("pub/note"), b"public").unwrap();
    fs::write(secret.join("shadow"), b"secret").unwrap();
    fs::write(secret.join("note"), b"secret note").unwrap();
    let leaked = |dst: &Path| {
        walk(dst).into_iter().any(|p| {
            fs::read(&p).is_ok_and(|c| c.starts_with(b"secret"))
                || p.file_name().is_some_and(|n| n == "shadow")
        })
    };
    let swap = || {
        fs::rename(src.join("pub"), d.path().join("pub.kept")).unwrap();
        std::os::unix::fs::symlink(&secret, src.join("pub")).unwrap();
    };
    let unswap = || {
        fs::remove_file(src.join("pub")).unwrap();
        fs::rename(d.path().join("pub.kept"), src.join("pub")).unwrap();
    };
    // The directory, between the walk's lstat and its open.
    let dst = d.path().join("dst1");
    let out = sync_with_swap(&src, &dst, "pub", swap);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("list directory") && err.contains("vanished or replaced"),
        "{err}"
    );
    assert!(!leaked(&dst), "{:?}", walk(&dst));
    unswap();
    // The file, between the walk and the worker's open; where the symlink
    // leads, a FIFO whose writer waits for someone to open it: opening it
    // alone would let the writer go on.
    let fifo = secret.join("note");
    fs::remove_file(&fifo).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    let opened = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (fifo, opened) = (fifo.clone(), opened.clone());
        std::thread::spawn(move || {
            let f = fs::OpenOptions::new().write(true).open(&fifo);
            opened.store(true, std::sync::atomic::Ordering::SeqCst);
            drop(f);
        })
    };
    let dst = d.path().join("dst2");
    let out = sync_with_swap(&src, &dst, "note", swap);
    std::thread::sleep(Duration::from_millis(100));
    let was_opened = opened.load(std::sync::atomic::Ordering::SeqCst);
    // Let the writer go.
    let reader = {
        use std::os::unix::fs::OpenOptionsExt;
        fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .unwrap()
    };
    writer.join().unwrap();
    drop(reader);
    assert!(!was_opened, "the FIFO behind the symlink was opened");
    let err = String::from_utf8_lossy(&out.stderr);
    // As rsync's "file has vanished": exit 24.
    assert_eq!(out.status.code(), Some(24), "{err}");
    assert!(err.contains("pub/note: file vanished"), "{err}");
    assert!(!leaked(&dst), "{:?}", walk(&dst));
    unswap();
    let out = ferry(&["sync", "-a", &slash(&src), &slash(&dst)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_same_tree(&src, &dst);
}

/// A tree a user made 2,100 directories deep (beyond what a path can name
/// from the top): the walk goes 2,048 deep, reports the rest and exits 2,
/// rather than exhausting its stack (which would take a daemon's other
/// sessions down with it).
#[test]
fn a_tree_deeper_than_a_path_is_reported_not_a_crash() {
    use rustix::fs::{mkdirat, openat, Mode, OFlags};
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    fs::create_dir(&src).unwrap();
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let mut dir = openat(rustix::fs::CWD, &src, flags, Mode::empty()).unwrap();
    for _ in 0..2100 {
        mkdirat(&dir, "a", Mode::from_raw_mode(0o755)).unwrap();
        dir = openat(&dir, "a", flags, Mode::empty()).unwrap();
    }
    drop(dir);
    let dst = d.path().join("dst");
    let out = ferry(&["sync", "-a", &slash(&src), p(&dst)]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("nested more than 2048 directories deep"),
        "{err}"
    );
    // The levels a path can name are there.
    let deep = dst.join(["a"; 1000].join("/"));
    assert!(deep.is_dir(), "{err}");
}
