//! An rsync user's command lines: rsync's everyday flags taken as typed,
//! include/exclude rules checked against real rsync on the same tree
//! (locally and pushed over a real sshd), `--delete-excluded`,
//! `--max-delete`, `--stats` and `--rsync-exit-codes`.

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::process::Command;

use common::*;

/// A tree with names the rules below pick apart.
fn tree(root: &Path) {
    for d in ["a/b", "a/x", "keep/deep", "x", "logs", "b"] {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    for f in [
        "top.txt",
        "top.log",
        "a/one.txt",
        "a/one.o",
        "a/special.o",
        "a/b/two.txt",
        "a/x/y",
        "x/y",
        "keep/k.bin",
        "keep/deep/k.txt",
        "logs/l.log",
        "b/bee.txt",
        "#hash",
        "sp ace ",
    ] {
        fs::write(root.join(f), f.as_bytes()).unwrap();
    }
}

/// `rsync ARGS SRC DST`: it must succeed when `strict` (else only its
/// copy counts).
fn rsync(args: &[&str], src: &str, dst: &Path, strict: bool) {
    let out = Command::new("rsync")
        .args(args)
        .arg(src)
        .arg(dst)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!strict || out.status.success(), "rsync {args:?}: {err}");
}

/// `ferry sync PRE ARGS SRC DST --json`, which must succeed.
fn ferry_sync(pre: &[&str], args: &[&str], src: &str, dst: &str) -> serde_json::Value {
    let mut v = vec!["sync"];
    v.extend_from_slice(pre);
    v.extend_from_slice(args);
    v.extend([src, dst]);
    ferry_ok(&v)
}

/// Every path under `root`, relative, directories with a trailing `/`.
fn listing(root: &Path) -> BTreeSet<String> {
    fn walk(root: &Path, rel: &str, out: &mut BTreeSet<String>) {
        for e in fs::read_dir(root.join(rel)).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            let r = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            if e.file_type().unwrap().is_dir() {
                out.insert(format!("{r}/"));
                walk(root, &r, out);
            } else {
                out.insert(r);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(root, "", &mut out);
    out
}

/// The rule sets tried, as command-line words (a `{rules}` word names the
/// rule file, `{merge}` the merge file).
const CASES: &[&[&str]] = &[
    &["--include", "*/", "--include", "*.txt", "--exclude", "*"],
    &["--exclude", "b/", "--exclude", "/top.log"],
    &["--filter", "+ keep/***", "--filter", "- *"],
    &["--exclude", "x/y"],
    &["--exclude", "/a/*.o"],
    &["--exclude", "*.o", "--include", "special.o"],
    &["--include", "special.o", "--exclude", "*.o"],
    &["--exclude-from", "{rules}"],
    &["--filter", ". {merge}", "--exclude", "logs"],
    &["-f", "- *.log", "-f", "!", "--exclude", "*.bin"],
    &["--exclude", "#hash", "--exclude", "sp ace "],
    &["--exclude", "+ *.txt", "--exclude", "*"],
    &["--exclude", "/a/**.o"],
    &["--include", "*/", "--include", "keep/**", "--exclude", "*"],
];

fn words(case: &[&str], rules: &Path, merge: &Path) -> Vec<String> {
    case.iter()
        .map(|w| w.replace("{rules}", p(rules)).replace("{merge}", p(merge)))
        .collect()
}

fn rule_files(d: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let rules = d.join("rules");
    fs::write(&rules, "# comment\n; another\n\n*.log\n+ special.o\n*.o\n").unwrap();
    let merge = d.join("merge");
    fs::write(&merge, "+ /a/\n+ /a/one.*\n- /a/*\n").unwrap();
    (rules, merge)
}

#[test]
fn include_exclude_rules_select_what_rsync_selects() {
    if !need("rsync", "include_exclude_rules_select_what_rsync_selects") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    tree(&src);
    let (rules, merge) = rule_files(d.path());
    for (i, case) in CASES.iter().enumerate() {
        let w = words(case, &rules, &merge);
        let mut args = vec!["-a"];
        args.extend(w.iter().map(|s| s.as_str()));
        let by_rsync = d.path().join(format!("rsync{i}"));
        rsync(&args, &slash(&src), &by_rsync, true);
        let by_ferry = d.path().join(format!("ferry{i}"));
        ferry_sync(&[], &args, &slash(&src), p(&by_ferry));
        assert_eq!(listing(&by_ferry), listing(&by_rsync), "rules {w:?}");
    }
}

/// The rules reach the remote side in order: a push over ssh with
/// `--delete` keeps what the rules protect, as rsync does.
#[test]
fn rules_cross_ssh_in_order_and_protect_from_delete() {
    if !need("rsync", "rules_cross_ssh_in_order_and_protect_from_delete") {
        return;
    }
    let Some(srv) = SshServer::start("rules_cross_ssh_in_order_and_protect_from_delete") else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    tree(&src);
    let (rules, merge) = rule_files(d.path());
    let bin = ferry_bin();
    let rsh = srv.rsh();
    for (i, case) in CASES.iter().enumerate() {
        let w = words(case, &rules, &merge);
        // Both destinations start with the same extra entries.
        let by_rsync = d.path().join(format!("rsync{i}"));
        let by_ferry = d.path().join(format!("ferry{i}"));
        for dst in [&by_rsync, &by_ferry] {
            fs::create_dir_all(dst.join("a")).unwrap();
            fs::write(dst.join("extra.log"), b"x").unwrap();
            fs::write(dst.join("a/extra.o"), b"x").unwrap();
            fs::write(dst.join("extra.txt"), b"x").unwrap();
        }
        let mut args = vec!["-a", "--delete"];
        args.extend(w.iter().map(|s| s.as_str()));
        rsync(&args, &slash(&src), &by_rsync, true);
        let dst = srv.remote(&by_ferry);
        ferry_sync(
            &["-e", &rsh, "--remote-ferry", p(&bin)],
            &args,
            &slash(&src),
            &dst,
        );
        assert_eq!(listing(&by_ferry), listing(&by_rsync), "rules {w:?}");
    }
}

/// Excluded entries inside a directory that `--delete` removes are kept,
/// and so is their directory, as rsync keeps them.
#[test]
fn delete_keeps_excluded_entries_inside_deleted_directories() {
    if !need(
        "rsync",
        "delete_keeps_excluded_entries_inside_deleted_directories",
    ) {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("keep"), b"k").unwrap();
    let mut got = Vec::new();
    for who in ["rsync", "ferry"] {
        let dst = d.path().join(who);
        fs::create_dir_all(dst.join("old/sub")).unwrap();
        fs::create_dir_all(dst.join("gone/sub")).unwrap();
        for f in ["old/x", "old/keep.tmp", "old/sub/y", "gone/sub/z", "gone/w"] {
            fs::write(dst.join(f), b"x").unwrap();
        }
        let args = ["-a", "--delete", "--exclude", "*.tmp"];
        if who == "rsync" {
            // rsync says it cannot delete the non-empty directory: exit 0
            // all the same on 3.x, or 23 on some; its copy is what counts.
            rsync(&args, &slash(&src), &dst, false);
        } else {
            ferry_sync(&[], &args, &slash(&src), p(&dst));
        }
        got.push(listing(&dst));
    }
    assert_eq!(got[1], got[0]);
    assert!(got[1].contains("old/keep.tmp") && !got[1].contains("gone/"));
}

#[test]
fn delete_excluded_and_max_delete() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("keep"), b"k").unwrap();
    let dst = d.path().join("dst");
    let extras = |dst: &Path| {
        fs::create_dir_all(dst.join("old/sub")).unwrap();
        for f in ["e1", "e2", "e3", "old/sub/e4", "scratch.tmp"] {
            fs::write(dst.join(f), b"x").unwrap();
        }
    };
    extras(&dst);
    // Protected by the exclude; the rest goes.
    let j = ferry_ok(&[
        "sync",
        "--delete",
        "--exclude",
        "*.tmp",
        &slash(&src),
        p(&dst),
    ]);
    assert_eq!(j["files_deleted"], 6, "{j}");
    assert!(dst.join("scratch.tmp").exists());
    // --delete-excluded (implying --delete) removes it too.
    extras(&dst);
    let j = ferry_ok(&[
        "sync",
        "--delete-excluded",
        "--exclude",
        "*.tmp",
        &slash(&src),
        p(&dst),
    ]);
    assert_eq!(j["files_deleted"], 7, "{j}");
    assert!(!dst.join("scratch.tmp").exists());
    assert_eq!(listing(&dst), listing(&src));
    // --max-delete 2: two go, the rest stay, one error line, exit 2.
    extras(&dst);
    let out = ferry(&[
        "sync",
        "--delete",
        "--max-delete",
        "2",
        "--json",
        &slash(&src),
        p(&dst),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["files_deleted"], 2, "{j}");
    let err = String::from_utf8_lossy(&out.stderr);
    // In name order: e1 and e2 go; e3, old/sub/e4 and scratch.tmp are
    // skipped (the directories holding what stays are not counted).
    assert!(err.contains("--max-delete limit of 2: 3 skipped"), "{err}");
    assert!(!dst.join("e1").exists() && !dst.join("e2").exists() && dst.join("e3").exists());
    assert_eq!(
        listing(&dst).len(),
        listing(&src).len() + 5,
        "{:?}",
        listing(&dst)
    );
    // A directory whose contents stay is not removed (nor an error).
    assert!(!err.contains("Directory not empty"), "{err}");
    // --max-delete 0 deletes nothing; with rsync's numbers a partial
    // transfer is 23.
    let out = ferry(&[
        "sync",
        "--delete",
        "--max-delete",
        "0",
        "--rsync-exit-codes",
        &slash(&src),
        p(&dst),
    ]);
    assert_eq!(out.status.code(), Some(23));
    assert_eq!(listing(&dst).len(), listing(&src).len() + 5);
}

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
        ("-i", "-v"),
        ("--no-perms", "cannot turn it off"),
        ("--info=stats2", "progress2"),
        ("--backup-dir=x", "does not take"),
        ("-D", "skips device"),
        ("--filter=P keep", "protect"),
    ] {
        let out = ferry(&["sync", flags, "a", "b"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{flags}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{flags}: {err}");
        assert!(err.contains(word), "{flags}: {err}");
    }
    // A usage error is 1 either way.
    let out = ferry(&["sync", "--rsync-exit-codes", "-x", "a", "b"]);
    assert_eq!(out.status.code(), Some(1));
    // A missing source is ferry's I/O error: 11 in rsync's numbers.
    let out = ferry(&["sync", "--rsync-exit-codes", "/nonexistent/a", "b"]);
    assert_eq!(out.status.code(), Some(11));
}

/// `--files-from`: what rsync copies from the same list, with and without
/// an explicit -r, whatever the source's trailing slash.
#[test]
fn files_from_copies_what_rsync_copies() {
    if !need("rsync", "files_from_copies_what_rsync_copies") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    tree(&src);
    let list = d.path().join("list");
    fs::write(
        &list,
        "a/one.txt\n# not this\n./keep\nx/y\n/a/b/two.txt\n#hash\n",
    )
    .unwrap();
    for (i, flags) in [&["-a"][..], &["-a", "-r"]].iter().enumerate() {
        let ff = format!("--files-from={}", list.display());
        let mut args = flags.to_vec();
        args.push(&ff);
        let by_rsync = d.path().join(format!("rsync{i}"));
        rsync(&args, p(&src), &by_rsync, true);
        let by_ferry = d.path().join(format!("ferry{i}"));
        ferry_sync(&[], &args, p(&src), p(&by_ferry));
        assert_eq!(listing(&by_ferry), listing(&by_rsync), "{flags:?}");
    }
}

/// `-A`: access and default ACLs arrive as they are (numeric ids), also
/// over ssh; without it the copy has none, as with rsync.
#[test]
fn acls_are_copied_with_dash_capital_a() {
    if !need("setfacl", "acls_are_copied_with_dash_capital_a") {
        return;
    }
    let Some(srv) = SshServer::start("acls_are_copied_with_dash_capital_a") else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    fs::create_dir_all(src.join("dir")).unwrap();
    fs::write(src.join("f"), b"acl").unwrap();
    fs::write(src.join("dir/g"), b"plain").unwrap();
    let setfacl = |args: &[&str], path: &Path| {
        let st = Command::new("setfacl")
            .args(args)
            .arg(path)
            .status()
            .unwrap();
        assert!(st.success(), "setfacl {args:?}");
    };
    setfacl(&["-m", "u:65534:rw,g:65534:r"], &src.join("f"));
    setfacl(
        &["-m", "u:65534:rwx", "-d", "-m", "u:65534:rx"],
        &src.join("dir"),
    );
    // Everything getfacl says of each path, but its name.
    let acls = |root: &Path| -> Vec<String> {
        ["f", "dir", "dir/g"]
            .iter()
            .map(|rel| {
                let out = Command::new("getfacl")
                    .args(["-n", "-p"])
                    .arg(root.join(rel))
                    .output()
                    .unwrap();
                let text = String::from_utf8_lossy(&out.stdout);
                text.lines()
                    .filter(|l| !l.starts_with("# file:"))
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .collect()
    };
    let want = acls(&src);
    assert!(want[0].contains("user:65534:rw-") && want[1].contains("default:user:65534:r-x"));
    let local = d.path().join("local");
    ferry_ok(&["sync", "-aA", &slash(&src), p(&local)]);
    assert_eq!(acls(&local), want);
    let pushed = d.path().join("pushed");
    let bin = ferry_bin();
    let rsh = srv.rsh();
    let dst = srv.remote(&pushed);
    ferry_ok(&[
        "sync",
        "-e",
        &rsh,
        "--remote-ferry",
        p(&bin),
        "-aA",
        &slash(&src),
        &dst,
    ]);
    assert_eq!(acls(&pushed), want);
    // Without -A: no ACL beyond the mode.
    let plain = d.path().join("plain");
    ferry_ok(&["sync", "-a", &slash(&src), p(&plain)]);
    assert!(!acls(&plain)[0].contains("65534"), "{}", acls(&plain)[0]);
}

/// `-u`, `--ignore-existing`, `--min-size`, `--max-size`: the files each
/// leaves alone are the ones rsync leaves alone (contents compared).
#[test]
fn update_ignore_existing_and_sizes_leave_what_rsync_leaves() {
    if !need(
        "rsync",
        "update_ignore_existing_and_sizes_leave_what_rsync_leaves",
    ) {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    fs::create_dir(&src).unwrap();
    // name, source size, source mtime, destination mtime (None: absent)
    let files: &[(&str, usize, i64, Option<i64>)] = &[
        ("newer-at-dst", 5, 1000, Some(2000)),
        ("older-at-dst", 5, 3000, Some(1000)),
        ("same-time", 50, 2000, Some(2000)),
        ("big", 5000, 3000, Some(1000)),
        ("new", 5, 1000, None),
    ];
    for &(name, size, mtime, _) in files {
        fs::write(src.join(name), vec![b's'; size]).unwrap();
        set_mtime(&src.join(name), mtime);
    }
    let cases: &[&[&str]] = &[
        &["-u"],
        &["--ignore-existing"],
        &["--min-size=10"],
        &["--max-size=1K"],
        &["-u", "--max-size", "100"],
    ];
    let contents = |root: &Path| -> Vec<(String, Vec<u8>)> {
        let mut v: Vec<_> = fs::read_dir(root)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.file_name().to_string_lossy().into_owned(),
                    fs::read(e.path()).unwrap(),
                )
            })
            .collect();
        v.sort();
        v
    };
    for (i, flags) in cases.iter().enumerate() {
        let mut got = Vec::new();
        for who in ["rsync", "ferry"] {
            let dst = d.path().join(format!("{who}{i}"));
            fs::create_dir(&dst).unwrap();
            for &(name, _, _, at_dst) in files {
                if let Some(t) = at_dst {
                    fs::write(dst.join(name), b"old copy").unwrap();
                    set_mtime(&dst.join(name), t);
                }
            }
            let mut args = vec!["-a"];
            args.extend_from_slice(flags);
            if who == "rsync" {
                rsync(&args, &slash(&src), &dst, true);
            } else {
                ferry_sync(&[], &args, &slash(&src), p(&dst));
            }
            got.push(contents(&dst));
        }
        assert_eq!(got[1], got[0], "{flags:?}");
    }
}

/// `-b` (and `--suffix`): replaced and deleted files are kept as rsync
/// keeps them, older backups replaced, backups never deleted; locally and
/// pushed over ssh.
#[test]
fn backups_are_kept_as_rsync_keeps_them() {
    if !need("rsync", "backups_are_kept_as_rsync_keeps_them") {
        return;
    }
    let Some(srv) = SshServer::start("backups_are_kept_as_rsync_keeps_them") else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    fs::create_dir_all(src.join("sub")).unwrap();
    fs::write(src.join("a"), b"new a").unwrap();
    fs::write(src.join("sub/b"), b"new b").unwrap();
    std::os::unix::fs::symlink("a", src.join("link")).unwrap();
    // Same sizes as the old copies: times far apart make them changed.
    set_mtime(&src.join("a"), 2000);
    set_mtime(&src.join("sub/b"), 2000);
    let contents = |root: &Path| -> Vec<(String, String)> {
        listing(root)
            .into_iter()
            .map(|rel| {
                let p = root.join(&rel);
                let what = match fs::symlink_metadata(&p) {
                    Ok(m) if m.is_symlink() => {
                        format!("-> {}", fs::read_link(&p).unwrap().display())
                    }
                    Ok(m) if m.is_file() => String::from_utf8_lossy(&fs::read(&p).unwrap()).into(),
                    _ => String::new(),
                };
                (rel, what)
            })
            .collect()
    };
    let bin = ferry_bin();
    let rsh = srv.rsh();
    for (i, flags) in [
        &["-a", "-b", "--delete"][..],
        &["-a", "--backup", "--suffix=.bak", "--delete"],
    ]
    .iter()
    .enumerate()
    {
        let mut got = Vec::new();
        for who in ["rsync", "ferry", "ferry-ssh"] {
            let dst = d.path().join(format!("{who}{i}"));
            fs::create_dir_all(dst.join("sub")).unwrap();
            fs::write(dst.join("a"), b"old a").unwrap();
            fs::write(dst.join("a~"), b"older a").unwrap();
            fs::write(dst.join("a.bak"), b"older a").unwrap();
            fs::write(dst.join("sub/b"), b"old b").unwrap();
            fs::write(dst.join("gone"), b"deleted").unwrap();
            fs::write(dst.join("link"), b"a file where the link goes").unwrap();
            match who {
                "rsync" => rsync(flags, &slash(&src), &dst, true),
                "ferry" => {
                    ferry_sync(&[], flags, &slash(&src), p(&dst));
                }
                _ => {
                    let remote = srv.remote(&dst);
                    ferry_sync(
                        &["-e", &rsh, "--remote-ferry", p(&bin)],
                        flags,
                        &slash(&src),
                        &remote,
                    );
                }
            }
            got.push(contents(&dst));
        }
        assert_eq!(got[1], got[0], "{flags:?}");
        assert_eq!(got[2], got[0], "{flags:?} over ssh");
    }
}

/// `--chmod`: every path gets the mode rsync gives it.
#[test]
fn chmod_gives_the_modes_rsync_gives() {
    use std::os::unix::fs::PermissionsExt;
    if !need("rsync", "chmod_gives_the_modes_rsync_gives") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    fs::create_dir_all(src.join("d/e")).unwrap();
    for (f, mode) in [
        ("x", 0o755),
        ("r", 0o600),
        ("d/w", 0o666),
        ("d/e/s", 0o4750),
    ] {
        fs::write(src.join(f), f).unwrap();
        fs::set_permissions(src.join(f), fs::Permissions::from_mode(mode)).unwrap();
    }
    fs::set_permissions(src.join("d"), fs::Permissions::from_mode(0o700)).unwrap();
    let modes = |root: &Path| -> Vec<(String, u32)> {
        listing(root)
            .into_iter()
            .map(|rel| {
                let m = fs::symlink_metadata(root.join(&rel)).unwrap();
                (rel, m.permissions().mode() & 0o7777)
            })
            .collect()
    };
    for (i, spec) in ["D750,F640", "go-w,a+X", "u=rwX,g=rX,o=", "Fu+x,Do+t", "a-s"]
        .iter()
        .enumerate()
    {
        let arg = format!("--chmod={spec}");
        let args = ["-a", arg.as_str()];
        let by_rsync = d.path().join(format!("rsync{i}"));
        rsync(&args, &slash(&src), &by_rsync, true);
        let by_ferry = d.path().join(format!("ferry{i}"));
        ferry_sync(&[], &args, &slash(&src), p(&by_ferry));
        assert_eq!(modes(&by_ferry), modes(&by_rsync), "{spec}");
        // A re-run changes nothing.
        let j = ferry_sync(&[], &args, &slash(&src), p(&by_ferry));
        assert_eq!(j["files_transferred"], 0, "{spec}: {j}");
    }
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

/// `--link-dest`: a second snapshot hard-links what did not change from
/// the first, as rsync's does (the same files linked), locally and over
/// ssh, and sends only what changed.
#[test]
fn link_dest_links_what_rsync_links() {
    use std::os::unix::fs::MetadataExt;
    if !need("rsync", "link_dest_links_what_rsync_links") {
        return;
    }
    let Some(srv) = SshServer::start("link_dest_links_what_rsync_links") else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    tree(&src);
    let bin = ferry_bin();
    let rsh = srv.rsh();
    // Which files of `snap2` are the same inode as in `snap1`.
    let linked = |snap1: &Path, snap2: &Path| -> Vec<String> {
        listing(snap2)
            .into_iter()
            .filter(|rel| {
                let (a, b) = (snap1.join(rel), snap2.join(rel));
                !rel.ends_with('/')
                    && fs::metadata(&a).is_ok_and(|m| m.ino() == fs::metadata(&b).unwrap().ino())
            })
            .collect()
    };
    let mut first = true;
    let mut got = Vec::new();
    for who in ["rsync", "ferry", "ferry-ssh"] {
        let snap1 = d.path().join(format!("{who}-1"));
        let snap2 = d.path().join(format!("{who}-2"));
        let link = format!("--link-dest=../{who}-1");
        let args = ["-a", link.as_str()];
        match who {
            "rsync" => {
                rsync(&["-a"], &slash(&src), &snap1, true);
                if first {
                    // One change and one new file between the snapshots.
                    fs::write(src.join("a/one.txt"), b"changed!").unwrap();
                    fs::write(src.join("added"), b"new").unwrap();
                    first = false;
                }
                rsync(&args, &slash(&src), &snap2, true);
            }
            "ferry" => {
                rsync(&["-a"], &slash(&d.path().join("rsync-1")), &snap1, true);
                let j = ferry_sync(&[], &args, &slash(&src), p(&snap2));
                assert_eq!(j["files_transferred"], 2, "{j}");
            }
            _ => {
                rsync(&["-a"], &slash(&d.path().join("rsync-1")), &snap1, true);
                let pre = ["-e", rsh.as_str(), "--remote-ferry", p(&bin)];
                ferry_sync(&pre, &args, &slash(&src), &srv.remote(&snap2));
            }
        }
        // Link counts differ by design: the names and contents are alike.
        assert_eq!(listing(&snap2), listing(&src), "{who}");
        for rel in listing(&src).iter().filter(|r| !r.ends_with('/')) {
            assert!(
                fs::read(src.join(rel)).unwrap() == fs::read(snap2.join(rel)).unwrap(),
                "{who}: {rel}"
            );
        }
        got.push(linked(&snap1, &snap2));
    }
    assert!(got[0].len() >= 10, "{:?}", got[0]);
    assert_eq!(got[1], got[0]);
    assert_eq!(got[2], got[0]);
}
