//! What the copy keeps and what it leaves: -A, -u, --ignore-existing,
//! --min-size/--max-size, --backup, --chmod, --link-dest; each compared
//! with rsync's result.

use super::*;

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
    // Clauses without who leave out the umask's bits (the test runs
    // rsync and ferry under the same umask).
    let specs = [
        "D750,F640",
        "go-w,a+X",
        "u=rwX,g=rX,o=",
        "Fu+x,Do+t",
        "a-s",
        "+w",
        "=rw",
        "D=rwx,F-x",
    ];
    for (i, spec) in specs.iter().enumerate() {
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
