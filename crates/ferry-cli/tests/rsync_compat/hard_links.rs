//! `-H` with the options that leave a file as the destination has it
//! (found by a user's comparison with rsync: a later name of a linked file
//! was linked to the stale first name, and a newer file lost).

use super::*;

use std::os::unix::fs::MetadataExt;
use std::time::{Duration, SystemTime};

fn at(p: &Path, secs: u64) {
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
    fs::File::options()
        .write(true)
        .open(p)
        .unwrap()
        .set_modified(t)
        .unwrap();
}

const Y2020: u64 = 1_577_836_800;
const Y2030: u64 = 1_893_456_000;

/// Source `a` and `d/a2` are one file. Each case sets up the destination
/// the same way for rsync and ferry; `same` cases must match rsync name by
/// name (content, link count); the others must not lose or mix data.
#[test]
fn hard_links_with_skip_rules_never_link_to_stale_data() {
    if !need(
        "rsync",
        "hard_links_with_skip_rules_never_link_to_stale_data",
    ) {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("s");
    fs::create_dir_all(src.join("d")).unwrap();
    fs::write(src.join("a"), b"a\n").unwrap();
    fs::hard_link(src.join("a"), src.join("d/a2")).unwrap();
    at(&src.join("a"), Y2020);
    // -u, a newer d/a2 at the destination: it stays (rsync too).
    let newer = |dst: &Path| {
        fs::create_dir_all(dst.join("d")).unwrap();
        fs::write(dst.join("d/a2"), b"NEWER\n").unwrap();
        at(&dst.join("d/a2"), Y2030);
    };
    // --max-size below the file's size: neither name is made.
    let stale = |dst: &Path| {
        fs::create_dir_all(dst).unwrap();
        fs::write(dst.join("a"), b"OLD\n").unwrap();
    };
    // -u, a newer first name and a later name that is already the
    // source's: both stay, and the run succeeds (rsync too).
    let edited = |dst: &Path| {
        fs::create_dir_all(dst.join("d")).unwrap();
        fs::write(dst.join("a"), b"EDITED\n").unwrap();
        at(&dst.join("a"), Y2030);
        fs::write(dst.join("d/a2"), b"a\n").unwrap();
        at(&dst.join("d/a2"), Y2020);
    };
    type Setup<'a> = &'a dyn Fn(&Path);
    let cases: [(&[&str], Setup); 3] = [
        (&["-aHu"], &newer),
        (&["-aH", "--max-size=1"], &stale),
        (&["-aHu"], &edited),
    ];
    for (i, (args, setup)) in cases.iter().enumerate() {
        let (r, f) = (
            d.path().join(format!("r{i}")),
            d.path().join(format!("f{i}")),
        );
        setup(&r);
        setup(&f);
        rsync(args, &slash(&src), &r, true);
        ferry_sync(&[], args, &slash(&src), p(&f));
        assert_eq!(listing(&f), listing(&r), "{args:?}");
        for name in listing(&r).iter().filter(|n| !n.ends_with('/')) {
            let (rm, fm) = (
                fs::metadata(r.join(name)).unwrap(),
                fs::metadata(f.join(name)).unwrap(),
            );
            assert_eq!(
                fs::read(f.join(name)).unwrap(),
                fs::read(r.join(name)).unwrap(),
                "{args:?} {name}"
            );
            assert_eq!(
                (fm.nlink(), fm.mtime()),
                (rm.nlink(), rm.mtime()),
                "{args:?} {name}"
            );
        }
    }
    // --ignore-existing with the first name there (other data): rsync
    // sends d/a2 on its own; ferry cannot link it to what `a` holds, says
    // so and exits 2, and writes nothing wrong.
    let f = d.path().join("f-ie");
    stale(&f);
    let out = ferry(&["sync", "-aH", "--ignore-existing", &slash(&src), p(&f)]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("d/a2: not linked"), "{err}");
    assert_eq!(fs::read(f.join("a")).unwrap(), b"OLD\n");
    assert!(!f.join("d/a2").exists());
}

/// `--link-dest` links an earlier copy exactly when rsync does: not under
/// `-c` when only the content matches (the time differs), and without
/// `-p` even when the permissions differ.
#[test]
fn link_dest_links_what_rsync_links() {
    if !need("rsync", "link_dest_links_what_rsync_links") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let (src, prev) = (d.path().join("s"), d.path().join("p"));
    fs::create_dir_all(&src).unwrap();
    fs::create_dir_all(&prev).unwrap();
    for (name, mode, when) in [("older", 0o644, Y2030), ("mode", 0o600, Y2020)] {
        fs::write(src.join(name), b"same\n").unwrap();
        at(&src.join(name), Y2020);
        fs::write(prev.join(name), b"same\n").unwrap();
        at(&prev.join(name), when);
        fs::set_permissions(
            prev.join(name),
            std::os::unix::fs::PermissionsExt::from_mode(mode),
        )
        .unwrap();
    }
    for args in [
        &["-ac", "--link-dest=../p"][..],
        &["-rt", "--link-dest=../p"],
    ] {
        let tag = args.join(" ");
        let (r, f) = (
            d.path().join(format!("r{}", args[0])),
            d.path().join(format!("f{}", args[0])),
        );
        rsync(args, &slash(&src), &r, true);
        ferry_sync(&[], args, &slash(&src), p(&f));
        for name in ["older", "mode"] {
            let (rm, fm) = (
                fs::metadata(r.join(name)).unwrap(),
                fs::metadata(f.join(name)).unwrap(),
            );
            let facts = |m: &fs::Metadata| (m.nlink(), m.mtime(), m.mode());
            assert_eq!(facts(&fm), facts(&rm), "{tag}: {name}");
        }
    }
}
