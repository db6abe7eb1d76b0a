//! How source and destination paths are read, compared with rsync: `dir/.`,
//! a symlink named as the source or the destination, a missing source
//! among several.

use super::*;
use std::os::unix::fs::symlink;

/// `src/.` is `src`'s contents, as `src/` is; with `--delete` the
/// destination's extras go, as with rsync.
#[test]
fn a_source_ending_in_dot_is_its_contents() {
    if !need("rsync", "a_source_ending_in_dot_is_its_contents") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    tree(&src);
    let dot = format!("{}/.", src.display());
    let (r, f) = (d.path().join("r"), d.path().join("f"));
    for dst in [&r, &f] {
        fs::create_dir_all(dst).unwrap();
        fs::write(dst.join("zz"), b"extra").unwrap();
    }
    rsync(&["-a", "--delete"], &dot, &r, true);
    ferry_sync(&[], &["-a", "--delete"], &dot, p(&f));
    assert_eq!(listing(&f), listing(&r));
    assert!(f.join("top.txt").exists() && !f.join("zz").exists());
}

/// A symlink named as the only source is sent as the symlink (the
/// destination becomes it); a symlink to a directory named as the
/// destination is written through, as rsync does both.
#[test]
fn symlinks_named_on_the_command_line() {
    if !need("rsync", "symlinks_named_on_the_command_line") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    fs::create_dir(d.path().join("real")).unwrap();
    symlink("real", d.path().join("sl")).unwrap();
    symlink("nowhere", d.path().join("dangling")).unwrap();
    for name in ["sl", "dangling"] {
        let src = d.path().join(name);
        let (r, f) = (
            d.path().join(format!("r-{name}")),
            d.path().join(format!("f-{name}")),
        );
        rsync(&["-a"], p(&src), &r, true);
        ferry_sync(&[], &["-a"], p(&src), p(&f));
        assert_eq!(
            fs::read_link(&f).unwrap(),
            fs::read_link(&r).unwrap(),
            "{name}"
        );
    }
    let src = d.path().join("src");
    tree(&src);
    for who in ["r", "f"] {
        let target = d.path().join(format!("into-{who}"));
        fs::create_dir(&target).unwrap();
        let link = d.path().join(format!("link-{who}"));
        symlink(&target, &link).unwrap();
        if who == "r" {
            rsync(&["-a"], &slash(&src), &link, true);
        } else {
            ferry_sync(&[], &["-a"], &slash(&src), p(&link));
        }
        assert!(fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
    }
    let (r, f) = (d.path().join("into-r"), d.path().join("into-f"));
    assert_eq!(listing(&f), listing(&r));
    assert_same_tree(&src, &f);
}

/// One missing source of several is one error line: the others are sent
/// (exit 2, rsync's 23 with `--rsync-exit-codes`) and `--delete` is off,
/// since what is missing may only be unreadable. With no source there,
/// nothing starts.
#[test]
fn a_missing_source_among_several_spares_the_others() {
    let d = tempfile::tempdir().unwrap();
    let b = d.path().join("b");
    fs::create_dir(&b).unwrap();
    fs::write(b.join("bb"), b"b").unwrap();
    let dst = d.path().join("dst");
    fs::create_dir(&dst).unwrap();
    fs::write(dst.join("old"), b"keep me").unwrap();
    let nosuch = d.path().join("nosuch");
    let dst_s = slash(&dst);
    for (codes, want) in [(&[][..], 2), (&["--rsync-exit-codes"][..], 23)] {
        let mut args = vec!["sync", "-a", "--delete"];
        args.extend_from_slice(codes);
        args.extend([p(&nosuch), p(&b), dst_s.as_str()]);
        let out = ferry(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(want), "{err}");
        assert!(err.contains("nosuch: stat: no such file"), "{err}");
        assert!(err.contains("skipping deletion"), "{err}");
        assert_eq!(fs::read(dst.join("b/bb")).unwrap(), b"b");
        assert_eq!(fs::read(dst.join("old")).unwrap(), b"keep me");
    }
    let other = d.path().join("nosuch2");
    let out = ferry(&[
        "sync",
        "-a",
        p(&nosuch),
        p(&other),
        p(&d.path().join("new")),
    ]);
    assert_eq!(out.status.code(), Some(3));
    assert!(!d.path().join("new").exists());
}
