//! --delete with the rules, --delete-excluded and --max-delete.

use super::*;

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
    let j = ferry_sync(
        &[],
        &["--delete", "--exclude", "*.tmp"],
        &slash(&src),
        p(&dst),
    );
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
    // In rsync's order (directories first, names from the end, contents
    // before their directory): old/sub/e4 and old/sub go; old, scratch.tmp,
    // e3, e2 and e1 are skipped, as rsync skips them.
    assert!(err.contains("--max-delete limit of 2: 5 skipped"), "{err}");
    assert!(!dst.join("old/sub").exists() && dst.join("old").exists());
    assert!(dst.join("e1").exists() && dst.join("e3").exists() && dst.join("scratch.tmp").exists());
    assert_eq!(
        listing(&dst).len(),
        listing(&src).len() + 5,
        "{:?}",
        listing(&dst)
    );
    // A directory whose contents stay is not removed (nor an error).
    assert!(!err.contains("Directory not empty"), "{err}");
    // --max-delete 0 deletes nothing; with rsync's numbers that is 25, the
    // limit stopped deletions.
    let out = ferry(&[
        "sync",
        "--delete",
        "--max-delete",
        "0",
        "--rsync-exit-codes",
        &slash(&src),
        p(&dst),
    ]);
    assert_eq!(out.status.code(), Some(25));
    assert_eq!(listing(&dst).len(), listing(&src).len() + 5);
}
