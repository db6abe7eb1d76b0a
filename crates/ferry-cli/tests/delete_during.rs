//! `--delete` during the list, driven through the real binary: a
//! directory's extras go once the list has left it, while files of that
//! directory may still be arriving; with several sources, whose
//! directories merge, nothing goes before the whole list is in.

mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;

use common::*;

/// A tree whose first directory holds a file big enough to be received
/// into a partial file, with many small files after it: the extras of
/// every directory go, the stale partial file of a name the source lacks
/// goes, what is arriving stays, and the copy is the source.
#[test]
fn extras_go_while_the_files_beside_them_arrive() {
    let d = tempfile::tempdir().unwrap();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    fs::create_dir_all(src.join("a")).unwrap();
    fs::write(src.join("a/big"), bytes(1, 48 << 20)).unwrap();
    fs::write(src.join("a/small"), b"small").unwrap();
    for dir in 0..20 {
        let sub = src.join(format!("b/{dir:02}"));
        fs::create_dir_all(&sub).unwrap();
        for f in 0..20 {
            fs::write(sub.join(format!("f{f}")), bytes(dir * 100 + f, 3000)).unwrap();
        }
    }
    fs::create_dir_all(dst.join("a")).unwrap();
    fs::write(dst.join("a/extra"), b"extra").unwrap();
    fs::write(dst.join("a/.gone.ferry-partial"), b"stale").unwrap();
    fs::write(dst.join("a/.gone.ferry-journal"), b"stale").unwrap();
    fs::create_dir_all(dst.join("b/07/deep/er")).unwrap();
    fs::write(dst.join("b/07/deep/er/x"), b"x").unwrap();
    fs::write(dst.join("b/07/extra"), b"x").unwrap();
    fs::create_dir_all(dst.join("gone-dir")).unwrap();
    fs::write(dst.join("top-extra"), b"x").unwrap();
    let j = ferry_ok(&["sync", "--delete", &slash(&src), p(&dst)]);
    assert_same_tree(&src, &dst);
    // a/extra, the two stale files, b/07/extra, x, er, deep, gone-dir,
    // top-extra.
    assert_eq!(j["files_deleted"], 9, "{j}");
    assert_eq!(j["delete_skipped"], false, "{j}");
    assert!(temp_files(&dst).is_empty(), "{:?}", temp_files(&dst));
    // A re-run has nothing to delete or send.
    let again = ferry_ok(&["sync", "--delete", &slash(&src), p(&dst)]);
    assert_eq!(again["files_deleted"], 0, "{again}");
    assert_eq!(again["files_transferred"], 0, "{again}");
    // The partial state of a listed file that is up to date is held back
    // while the list streams, and goes at the end.
    fs::write(dst.join("a/.small.ferry-partial"), b"stale").unwrap();
    fs::write(dst.join("a/.small.ferry-journal"), b"stale").unwrap();
    let late = ferry_ok(&["sync", "--delete", &slash(&src), p(&dst)]);
    assert_eq!(late["files_deleted"], 2, "{late}");
    assert_same_tree(&src, &dst);
}

/// `ferry sync a/ b/ dst/`: both sources bring `d/`; `b` alone has `d/y`,
/// which the destination already holds as `b` has it. It is kept as it
/// is (not deleted when the list leaves `a`'s `d/` and sent again), and
/// only what neither source has goes.
#[test]
fn several_sources_merge_before_anything_is_deleted() {
    let d = tempfile::tempdir().unwrap();
    let (a, b, dst) = (d.path().join("a"), d.path().join("b"), d.path().join("dst"));
    for dir in [&a, &b, &dst] {
        fs::create_dir_all(dir.join("d")).unwrap();
    }
    fs::write(a.join("d/x"), b"x from a").unwrap();
    fs::write(b.join("d/y"), b"y from b").unwrap();
    fs::write(b.join("late"), b"late").unwrap();
    set_mtime(&b.join("d/y"), 1_600_000_000);
    fs::write(dst.join("d/y"), b"y from b").unwrap();
    set_mtime(&dst.join("d/y"), 1_600_000_000);
    fs::write(dst.join("d/z"), b"neither").unwrap();
    let before = fs::metadata(dst.join("d/y")).unwrap().ino();
    let j = ferry_ok(&["sync", "--delete", &slash(&a), &slash(&b), p(&dst)]);
    assert_eq!(
        fs::metadata(dst.join("d/y")).unwrap().ino(),
        before,
        "d/y replaced: {j}"
    );
    assert_eq!(fs::read(dst.join("d/y")).unwrap(), b"y from b");
    assert_eq!(fs::read(dst.join("d/x")).unwrap(), b"x from a");
    assert_eq!(fs::read(dst.join("late")).unwrap(), b"late");
    assert!(!dst.join("d/z").exists(), "{j}");
    assert_eq!(j["files_deleted"], 1, "{j}");
}
