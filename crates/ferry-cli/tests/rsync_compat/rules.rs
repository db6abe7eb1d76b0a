//! Include and exclude rules and --files-from, against real rsync on the
//! same tree, locally and over ssh.

use super::*;

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

/// `--files-from` naming a path that is not there (and `skip.me`, there
/// but excluded by the user's own rule for ferry), from `from`, compared
/// with rsync given `rsync_pre`:
/// rsync exits 23; ferry (given `ferry_pre`) must too, with `--delete`
/// deleting nothing and the rest copied. Returns ferry's stderr.
fn files_from_with_a_missing_path(
    d: &Path,
    from: &str,
    rsync_pre: &[&str],
    ferry_pre: &[&str],
) -> String {
    let list = d.join("list");
    fs::write(&list, "a/one.txt\nno/such\ntop.txt\nskip.me\n").unwrap();
    let ff = format!("--files-from={}", list.display());
    let by_rsync = d.join("rsync");
    let out = Command::new("rsync")
        .args(rsync_pre)
        .args(["-a", &ff, from, p(&by_rsync)])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(23));
    let by_ferry = d.join("ferry");
    fs::create_dir(&by_ferry).unwrap();
    fs::write(by_ferry.join("old"), b"keep").unwrap();
    let rest = [
        "-a",
        "-r",
        "--delete",
        "--rsync-exit-codes",
        "--exclude=skip.me",
        &ff,
        from,
        p(&by_ferry),
    ];
    let out = ferry(&[&["sync"], ferry_pre, &rest[..]].concat());
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(23), "{err}");
    assert!(!err.contains("skip.me"), "{err}");
    assert_eq!(fs::read(by_ferry.join("old")).unwrap(), b"keep");
    let mut want = listing(&by_rsync);
    want.insert("old".into());
    want.remove("skip.me");
    assert_eq!(listing(&by_ferry), want);
    err
}

/// A path `--files-from` lists that is not there is an error line, as
/// rsync's: the rest is copied, the exit says partial (rsync's 23) and
/// `--delete` deletes nothing. Silence would leave a backup script
/// believing a file it names was kept.
#[test]
fn files_from_names_what_it_cannot_find() {
    if !need("rsync", "files_from_names_what_it_cannot_find") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    tree(&src);
    fs::write(src.join("skip.me"), b"x").unwrap();
    let err = files_from_with_a_missing_path(d.path(), p(&src), &[], &[]);
    assert!(
        err.contains("no/such: listed by --files-from: no such file"),
        "{err}"
    );
}

/// The same on a pull over a real sshd: the remote sender is not told the
/// list, so the local receiver checks the sender's list against it.
#[test]
fn files_from_on_a_pull_names_what_the_sender_lacks() {
    let name = "files_from_on_a_pull_names_what_the_sender_lacks";
    if !need("rsync", name) {
        return;
    }
    let Some(srv) = SshServer::start(name) else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    tree(&src);
    fs::write(src.join("skip.me"), b"x").unwrap();
    let (rsh, bin) = (srv.rsh(), ferry_bin());
    let from = srv.remote(&src);
    let ferry_pre = ["-e", &rsh, "--remote-ferry", p(&bin)];
    let err = files_from_with_a_missing_path(d.path(), &from, &["-e", &rsh], &ferry_pre);
    assert!(err.contains("no/such: listed by --files-from"), "{err}");
}
