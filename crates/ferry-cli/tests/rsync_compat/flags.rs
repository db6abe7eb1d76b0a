//! Command lines as typed, --stats, the exit codes, --log-file.

use super::*;

/// Command lines as rsync users type them run as typed.
#[test]
fn rsync_command_lines_run_as_typed() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    tree(&src);
    for (i, flags) in [
        &["-avz"][..],
        &["-a", "-v", "-h", "-P"],
        &["-rlptgo", "-H", "-S", "--numeric-ids"],
        &["-avhP", "--info=progress2"],
        &["-aHz", "--stats"],
    ]
    .iter()
    .enumerate()
    {
        let dst = d.path().join(format!("dst{i}"));
        let mut args = vec!["sync"];
        args.extend_from_slice(flags);
        let s = slash(&src);
        args.extend([s.as_str(), p(&dst)]);
        let out = ferry(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{flags:?}: {err}");
        assert_same_tree(&src, &dst);
        if flags.contains(&"--stats") {
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                text.contains("Number of files: 23 (reg: 14, dir: 9)"),
                "{text}"
            );
            assert!(
                text.contains("Number of regular files transferred: 14"),
                "{text}"
            );
        }
    }
    // `--help` still helps; `-h` alone is rsync's human-readable.
    let out = ferry(&["sync", "--help"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("rsync compatibility") && text.contains("--include"),
        "{text}"
    );
    // What ferry does not take is refused in one line naming the way.
    for (flags, word) in [
        ("--out-format=%n", "-i"),
        ("--append", "changed parts"),
        ("--info=stats2", "progress2"),
        ("-R", "does not take"),
        ("--remove-source-files", "does not take"),
        ("--filter=P keep", "protect"),
    ] {
        let out = ferry(&["sync", flags, "a", "b"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{flags}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{flags}: {err}");
        assert!(err.contains(word), "{flags}: {err}");
    }
    // A usage error is 1 either way.
    let out = ferry(&["sync", "--rsync-exit-codes", "--relative", "a", "b"]);
    assert_eq!(out.status.code(), Some(1));
    // A missing source is ferry's I/O error: 11 in rsync's numbers.
    let out = ferry(&["sync", "--rsync-exit-codes", "/nonexistent/a", "b"]);
    assert_eq!(out.status.code(), Some(11));
}

/// `--log-file`: each change, the summary and the exit code, stamped,
/// appended run after run.
#[test]
fn log_file_records_each_run() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("one"), b"1").unwrap();
    let log = d.path().join("ferry.log");
    let dst = d.path().join("dst");
    let arg = format!("--log-file={}", log.display());
    for _ in 0..2 {
        ferry_sync(&[], &[arg.as_str()], &slash(&src), p(&dst));
    }
    let text = fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let pid_stamp = |l: &str| {
        let b = l.as_bytes();
        l.len() > 22
            && b[4] == b'/'
            && b[7] == b'/'
            && b[10] == b' '
            && b[13] == b':'
            && l[20..].starts_with('[')
    };
    assert!(lines.iter().all(|l| pid_stamp(l)), "{text}");
    assert_eq!(
        lines.iter().filter(|l| l.ends_with("exit 0")).count(),
        2,
        "{text}"
    );
    assert!(lines.iter().any(|l| l.contains("new one")), "{text}");
    assert!(
        lines.iter().any(|l| l.contains("1 file, 1 directory")),
        "{text}"
    );
    // An unwritable log is a usage error before anything moves.
    let out = ferry(&[
        "sync",
        "--log-file=/nonexistent/dir/log",
        &slash(&src),
        p(&d.path().join("x")),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(!d.path().join("x").exists());
}
