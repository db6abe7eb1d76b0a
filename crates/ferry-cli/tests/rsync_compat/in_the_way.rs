//! Entries in the way and rules that name directories: where rsync keeps
//! data, ferry keeps it too (found by a new user's comparison with rsync).

use super::*;

/// `*/`, `/*/` and `**/` exclude directories, never the files beside
/// them, with and without `--delete`, as rsync's do.
#[test]
fn directory_only_excludes_leave_files_alone() {
    if !need("rsync", "directory_only_excludes_leave_files_alone") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    tree(&src);
    for (i, pat) in ["*/", "/*/", "**/"].iter().enumerate() {
        let (r, f) = (
            d.path().join(format!("r{i}")),
            d.path().join(format!("f{i}")),
        );
        for dst in [&r, &f] {
            fs::create_dir_all(dst.join("old")).unwrap();
            fs::write(dst.join("stale.txt"), b"x").unwrap();
        }
        let ex = format!("--exclude={pat}");
        let args = ["-a", "--delete", ex.as_str()];
        rsync(&args, &slash(&src), &r, true);
        ferry_sync(&[], &args, &slash(&src), p(&f));
        let got = listing(&f);
        assert_eq!(got, listing(&r), "{pat}");
        assert!(
            got.contains("top.txt") && !got.contains("stale.txt"),
            "{pat}: {got:?}"
        );
        assert!(
            got.contains("old/"),
            "{pat}: an excluded directory is protected"
        );
    }
}

/// `-b` keeps what is in the way of an entry of another type: a directory
/// where a file now goes (with all it holds), a symlink where a directory
/// goes. Nothing is lost, as with rsync (which keeps the directory's
/// files as NAME~ and fails to remove it).
#[test]
fn backup_keeps_what_is_in_the_way() {
    let d = tempfile::tempdir().unwrap();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    fs::create_dir_all(src.join("l")).unwrap();
    fs::write(src.join("x"), b"data").unwrap();
    fs::create_dir_all(dst.join("x/deep")).unwrap();
    fs::write(dst.join("x/deep/keep"), b"precious").unwrap();
    std::os::unix::fs::symlink("target", dst.join("l")).unwrap();
    for extra in [&["--delete"][..], &["--force"]] {
        let mut args = vec!["-a", "-b"];
        args.extend_from_slice(extra);
        ferry_sync(&[], &args, &slash(&src), p(&dst));
        assert_eq!(fs::read(dst.join("x")).unwrap(), b"data");
        assert_eq!(fs::read(dst.join("x~/deep/keep")).unwrap(), b"precious");
        assert_eq!(fs::read_link(dst.join("l~")).unwrap(), Path::new("target"));
        assert!(dst.join("l").is_dir());
    }
}

/// `--ignore-existing` leaves an existing file or symlink where the
/// source has a directory, as rsync does, and says what it left (exit 2:
/// what was to go in it is not there).
#[test]
fn ignore_existing_never_replaces_a_file_by_a_directory() {
    let d = tempfile::tempdir().unwrap();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    fs::create_dir_all(src.join("x")).unwrap();
    fs::create_dir_all(src.join("l")).unwrap();
    fs::write(src.join("x/w"), b"w").unwrap();
    fs::write(src.join("l/q"), b"q").unwrap();
    fs::create_dir_all(&dst).unwrap();
    fs::write(dst.join("x"), b"data").unwrap();
    std::os::unix::fs::symlink("nowhere", dst.join("l")).unwrap();
    let out = ferry(&["sync", "-a", "--ignore-existing", &slash(&src), p(&dst)]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("left alone (--ignore-existing)"), "{err}");
    assert_eq!(fs::read(dst.join("x")).unwrap(), b"data");
    assert_eq!(fs::read_link(dst.join("l")).unwrap(), Path::new("nowhere"));
}

/// A relative `--backup-dir` lies in the destination, as in rsync: what
/// `--delete` removes goes there, and the backup directory itself is
/// never deleted or backed up into itself, run after run, dry run too.
#[test]
fn a_backup_dir_inside_the_destination_survives_delete() {
    let d = tempfile::tempdir().unwrap();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("a"), b"a").unwrap();
    fs::create_dir_all(dst.join("olddir")).unwrap();
    fs::write(dst.join("olddir/f"), b"o").unwrap();
    fs::write(dst.join("gone"), b"g").unwrap();
    let args = ["-a", "--delete", "--backup-dir=old/BK"];
    ferry_sync(&[], &args, &slash(&src), p(&dst));
    let want: BTreeSet<String> = ["a", "old/", "old/BK/", "old/BK/gone", "old/BK/olddir/"]
        .into_iter()
        .chain(["old/BK/olddir/f"])
        .map(String::from)
        .collect();
    assert_eq!(listing(&dst), want);
    fs::write(dst.join("h"), b"h").unwrap();
    let v = ferry_sync(&["-n"], &args, &slash(&src), p(&dst));
    assert_eq!(v["files_deleted"], 1, "{v}");
    ferry_sync(&[], &args, &slash(&src), p(&dst));
    let mut want = want;
    want.insert("old/BK/h".into());
    assert_eq!(listing(&dst), want);
}

/// A destination `dst/` that is a file is that file, not "nothing there":
/// a dry run and the real run both refuse it without `--force` (exit 1,
/// the file untouched); with `--force` the dry run changes nothing and
/// succeeds, and the real run replaces the file with the directory.
/// (It was a dry run saying yes and a real run failing with "already
/// exists", and `-n --force dst` failing where the real run worked.)
#[test]
fn a_file_where_the_destination_directory_goes() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    tree(&src);
    let dst = d.path().join("dst");
    for to in [p(&dst).to_string(), slash(&dst)] {
        for dry in [true, false] {
            fs::write(&dst, b"file").unwrap();
            let mut args = vec!["sync", "-a"];
            if dry {
                args.push("-n");
            }
            let out = ferry(&[&args[..], &[&slash(&src), &to]].concat());
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{to} dry {dry}: {err}");
            assert!(err.contains("not a directory"), "{err}");
            assert_eq!(fs::read(&dst).unwrap(), b"file");
            args.push("--force");
            let out = ferry(&[&args[..], &[&slash(&src), &to]].concat());
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(0), "{to} dry {dry} --force: {err}");
            if dry {
                assert_eq!(fs::read(&dst).unwrap(), b"file");
            } else {
                assert_eq!(listing(&dst), listing(&src), "{to}");
                fs::remove_dir_all(&dst).unwrap();
            }
        }
    }
}
