//! `-i`: the itemized lines ferry prints are rsync's for the same change
//! (locally and, with `<`, pushed over ssh), and the `--no-` forms and
//! rsync's selection flags keep what rsync keeps.

use std::os::unix::fs::{symlink, PermissionsExt};

use super::*;

/// Set the modification time of `path` itself (a directory or a symlink
/// too) to `secs`.
fn touch(path: &Path, secs: i64) {
    let ok = Command::new("touch")
        .args(["-h", "-d", &format!("@{secs}")])
        .arg(path)
        .status()
        .unwrap()
        .success();
    assert!(ok, "touch {}", path.display());
}

/// A small tree with every time set, so no change depends on the clock.
fn base(src: &Path) {
    fs::create_dir_all(src.join("d/sub")).unwrap();
    fs::create_dir_all(src.join("gone")).unwrap();
    for (f, body) in [("a", "a"), ("d/b", "bb"), ("d/sub/c", "c"), ("gone/x", "x")] {
        fs::write(src.join(f), body).unwrap();
        set_mtime(&src.join(f), 1_600_000_000);
    }
    symlink("a", src.join("l")).unwrap();
    touch(&src.join("l"), 1_600_000_000);
    for dir in ["d/sub", "d", "gone", ""] {
        touch(&src.join(dir), 1_600_000_100);
    }
}

/// Changes of every kind -i names, times set again afterwards.
fn change(src: &Path) {
    fs::set_permissions(src.join("a"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::write(src.join("d/b"), "bbbb").unwrap();
    set_mtime(&src.join("d/b"), 1_600_000_500);
    fs::write(src.join("d/sub/c"), "C").unwrap();
    set_mtime(&src.join("d/sub/c"), 1_600_000_600);
    fs::remove_dir_all(src.join("gone")).unwrap();
    fs::remove_file(src.join("l")).unwrap();
    symlink("d", src.join("l")).unwrap();
    touch(&src.join("l"), 1_600_000_000);
    fs::write(src.join("d/new"), "n").unwrap();
    set_mtime(&src.join("d/new"), 1_600_000_000);
    touch(&src.join("d/sub"), 1_600_000_700);
    touch(&src.join("d"), 1_600_000_100);
    touch(&src.join(""), 1_600_000_100);
}

/// The itemized lines of a run, as a set (ferry deletes after the list,
/// rsync during it: the order differs, the lines must not).
fn lines(out: &[u8]) -> BTreeSet<String> {
    String::from_utf8_lossy(out)
        .lines()
        // `YXcstpoguax NAME`: the summary and rsync's notes are not.
        .filter(|l| l.as_bytes().get(11) == Some(&b' ') && !l.starts_with("created "))
        .map(|l| l.to_string())
        .collect()
}

fn rsync_i(args: &[&str], src: &Path, dst: &Path) -> BTreeSet<String> {
    let out = Command::new("rsync")
        .args(args)
        .arg(slash(src))
        .arg(dst)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    lines(&out.stdout)
}

fn ferry_i(args: &[&str], src: &Path, dst: &str) -> BTreeSet<String> {
    let mut v = vec!["sync"];
    v.extend_from_slice(args);
    let s = slash(src);
    v.extend([s.as_str(), dst]);
    let out = ferry(&v);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    lines(&out.stdout)
}

#[test]
fn itemized_changes_read_as_rsyncs() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    base(&src);
    let (r, f) = (d.path().join("r"), d.path().join("f"));
    let first_r = rsync_i(&["-ai"], &src, &r);
    let first_f = ferry_i(&["-ai"], &src, p(&f));
    assert_eq!(first_f, first_r);
    assert!(first_f.contains(">f+++++++++ d/b") && first_f.contains("cd+++++++++ ./"));
    assert!(first_f.contains("cL+++++++++ l -> a"), "{first_f:?}");
    // Nothing changed: nothing listed, by either.
    assert!(ferry_i(&["-ai"], &src, p(&f)).is_empty());
    change(&src);
    let second_r = rsync_i(&["-ai", "--delete"], &src, &r);
    let second_f = ferry_i(&["-ai", "--delete"], &src, p(&f));
    assert_eq!(second_f, second_r);
    for want in [
        ".f...p..... a",
        ">f.st...... d/b",
        ">f..t...... d/sub/c",
        ".d..t...... d/sub/",
        "cLc........ l -> d",
        ">f+++++++++ d/new",
        "*deleting   gone/x",
        "*deleting   gone/",
    ] {
        assert!(second_f.contains(want), "{want} not in {second_f:?}");
    }
    assert_same_tree(&src, &f);
}

#[test]
fn a_push_itemizes_what_it_sent() {
    let Some(srv) = SshServer::start("a_push_itemizes_what_it_sent") else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    base(&src);
    let (r, f) = (d.path().join("r"), d.path().join("f"));
    let rsh = srv.rsh();
    let bin = ferry_bin();
    let push = ["-ai", "--delete", "-e", &rsh, "--remote-ferry", p(&bin)];
    rsync_i(&["-ai"], &src, &r);
    ferry_i(&push, &src, &srv.remote(&f));
    change(&src);
    let by_rsync = rsync_i(&["-ai", "--delete"], &src, &r);
    let by_ferry = ferry_i(&push, &src, &srv.remote(&f));
    // rsync's sending side prints `<` for what it sent.
    let sent: BTreeSet<String> = by_rsync
        .iter()
        .map(|l| match l.strip_prefix('>') {
            Some(rest) => format!("<{rest}"),
            None => l.clone(),
        })
        .collect();
    assert_eq!(by_ferry, sent);
    assert!(by_ferry.contains("<f.st...... d/b"), "{by_ferry:?}");
    // -v over the same push lists the remote receiver's changes too.
    fs::write(src.join("d/b"), "bbbbb").unwrap();
    let out = ferry(&[
        "sync",
        "-v",
        "-e",
        &rsh,
        "--remote-ferry",
        p(&bin),
        &slash(&src),
        &srv.remote(&f),
    ]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("update d/b"));
    assert_same_tree(&src, &f);
}

/// rsync's selection flags keep what they name, the `--no-` forms turn
/// one off, and the trees match rsync's (hard links, permissions, times,
/// symlinks).
#[test]
fn selection_and_no_flags_keep_what_rsync_keeps() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    base(&src);
    fs::hard_link(src.join("a"), src.join("d/hard")).unwrap();
    fs::set_permissions(src.join("d/b"), fs::Permissions::from_mode(0o640)).unwrap();
    let stat = |p: &Path| {
        use std::os::unix::fs::MetadataExt;
        let m = fs::symlink_metadata(p).ok()?;
        Some((m.mode(), m.nlink(), m.mtime(), m.file_type().is_symlink()))
    };
    for (i, flags) in [
        &["-a"][..],
        &["-aH"],
        &["-a", "--no-perms"],
        &["-a", "--no-t"],
        &["-a", "--no-H"],
        &["-rlt"],
        &["-rt"],
        &["-aH", "--no-l"],
    ]
    .iter()
    .enumerate()
    {
        let (r, f) = (
            d.path().join(format!("r{i}")),
            d.path().join(format!("f{i}")),
        );
        // An existing file keeps its permissions without -p, in both.
        for dst in [&r, &f] {
            fs::create_dir_all(dst.join("d")).unwrap();
            fs::write(dst.join("d/b"), "old").unwrap();
            fs::set_permissions(dst.join("d/b"), fs::Permissions::from_mode(0o604)).unwrap();
        }
        rsync(flags, &slash(&src), &r, true);
        let mut args = vec!["sync", "-q"];
        args.extend_from_slice(flags);
        let s = slash(&src);
        args.extend([s.as_str(), p(&f)]);
        let out = ferry(&args);
        assert_eq!(out.status.code(), Some(0), "{flags:?}");
        for rel in ["a", "d/hard", "d/b", "d/sub/c", "l", "d/sub"] {
            let (a, b) = (stat(&r.join(rel)), stat(&f.join(rel)));
            // Times of entries made now differ by the clock.
            let strip = |v: Option<(u32, u64, i64, bool)>| {
                v.map(|(m, n, t, l)| (m, n, if t < 1_700_000_000 { t } else { 0 }, l))
            };
            assert_eq!(strip(b), strip(a), "{flags:?} {rel}");
        }
    }
}

/// `-x`: a filesystem mounted inside the source is copied as an empty
/// directory, as rsync copies it.
#[test]
fn one_file_system_stops_at_a_mount_point() {
    if !is_root() {
        skip("one_file_system_stops_at_a_mount_point: mounting needs root");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    base(&src);
    let mnt = src.join("d/mnt");
    fs::create_dir(&mnt).unwrap();
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&mnt)
        .status()
        .unwrap()
        .success();
    assert!(ok, "mount tmpfs");
    // Unmounted whatever happens below.
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _guard = Unmount(mnt.clone());
    fs::write(mnt.join("inside"), "on another filesystem").unwrap();
    let (r, f) = (d.path().join("r"), d.path().join("f"));
    rsync(&["-ax"], &slash(&src), &r, true);
    let out = ferry(&["sync", "-ax", &slash(&src), p(&f)]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(listing(&f), listing(&r));
    assert!(f.join("d/mnt").is_dir() && !f.join("d/mnt/inside").exists());
    // Without -x, it is copied.
    let all = d.path().join("all");
    let out = ferry(&["sync", "-a", &slash(&src), p(&all)]);
    assert_eq!(out.status.code(), Some(0));
    assert!(all.join("d/mnt/inside").is_file());
}

/// `-D` (part of `-a`): FIFOs, sockets and, as root, device nodes are
/// made as rsync makes them, locally and pushed over ssh; `--no-D` and a
/// plain run skip them.
#[test]
fn devices_and_specials_as_rsync_makes_them() {
    let Some(srv) = SshServer::start("devices_and_specials_as_rsync_makes_them") else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    base(&src);
    let ok = Command::new("mkfifo")
        .args(["-m", "640"])
        .arg(src.join("d/fifo"))
        .status()
        .unwrap();
    assert!(ok.success());
    std::os::unix::net::UnixListener::bind(src.join("sock")).unwrap();
    if is_root() {
        let ok = Command::new("mknod")
            .arg(src.join("d/null"))
            .args(["c", "1", "3"])
            .status()
            .unwrap();
        assert!(ok.success());
    }
    let kinds = |root: &Path| {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let mut v = Vec::new();
        for rel in ["d/fifo", "sock", "d/null"] {
            let m = fs::symlink_metadata(root.join(rel)).ok();
            v.push(m.map(|m| {
                let t = m.file_type();
                (
                    t.is_fifo(),
                    t.is_socket(),
                    t.is_char_device(),
                    m.rdev(),
                    m.mode() & 0o7777,
                )
            }));
        }
        v
    };
    let r = d.path().join("r");
    rsync(&["-a"], &slash(&src), &r, true);
    let f = d.path().join("f");
    let i = ferry_i(&["-ai"], &src, p(&f));
    assert_eq!(kinds(&f), kinds(&r));
    assert!(
        i.contains("cS+++++++++ d/fifo") && i.contains("cS+++++++++ sock"),
        "{i:?}"
    );
    // Again: nothing to do.
    assert!(ferry_i(&["-ai"], &src, p(&f)).is_empty());
    let pushed = d.path().join("pushed");
    let bin = ferry_bin();
    ferry_i(
        &["-a", "-e", &srv.rsh(), "--remote-ferry", p(&bin)],
        &src,
        &srv.remote(&pushed),
    );
    assert_eq!(kinds(&pushed), kinds(&r));
    for flags in [&["-a", "--no-D"][..], &[]] {
        let g = d.path().join(format!("g{}", flags.len()));
        let mut args = flags.to_vec();
        args.push("-q");
        ferry_i(&args, &src, p(&g));
        assert_eq!(kinds(&g), [None, None, None], "{flags:?}");
    }
}
