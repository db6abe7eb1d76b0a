//! Delta transfers (`--delta`) through the real binary: only changed bytes
//! cross the transport, the result is exact in both modes, and odd
//! destinations (shorter, longer, empty, a directory) are handled.

mod common;

use std::fs;
use std::os::unix::fs::FileExt;

use common::*;
use proptest::prelude::*;

const MIB: usize = 1 << 20;

fn setup(name: &str, old: &[u8]) -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join(name);
    let dst = d.path().join(format!("{name}.dst"));
    fs::write(&src, old).unwrap();
    ferry_ok(&["sync", p(&src), p(&dst)]);
    (d, src, dst)
}

#[test]
fn scattered_overwrites_send_a_small_fraction() {
    let old = bytes(11, 32 * MIB);
    let (_d, src, dst) = setup("f", &old);
    let mut new = old.clone();
    // 5% in scattered 4-64 KiB chunks.
    let mut x = 7u64;
    let mut changed = 0;
    while changed < new.len() / 20 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let n = 4096 + (x >> 40) as usize % 61_440;
        let off = (x >> 8) as usize % (new.len() - n);
        new[off..off + n].copy_from_slice(&bytes(x, n));
        changed += n;
    }
    fs::write(&src, &new).unwrap();
    for inplace in [false, true] {
        fs::write(&dst, &old).unwrap();
        // Without -c ferry skips a file of the same size and mtime; both
        // files are written within the same clock tick often enough, so the
        // old copy is dated a day earlier and always differs.
        set_mtime(&dst, 1_700_000_000);
        set_mtime(&src, 1_700_086_400);
        let mut args = vec!["sync", "--delta"];
        if inplace {
            args.push("--inplace");
        }
        args.extend([p(&src), p(&dst)]);
        let j = ferry_ok(&args);
        assert!(fs::read(&dst).unwrap() == new, "inplace={inplace}");
        let wire = j["bytes_wire"].as_u64().unwrap();
        assert!(
            wire < new.len() as u64 * 8 / 100,
            "inplace={inplace}: {wire} bytes on the wire"
        );
        assert_eq!(j["files_delta"], 1);
        assert!(j["bytes_matched"].as_u64().unwrap() > new.len() as u64 * 85 / 100);
    }
}

#[test]
fn an_insert_near_the_start_costs_kilobytes() {
    let old = bytes(12, 24 * MIB);
    let (_d, src, dst) = setup("g", &old);
    let mut new = old[..MIB].to_vec();
    new.extend_from_slice(b"7 bytes");
    new.extend_from_slice(&old[MIB..]);
    fs::write(&src, &new).unwrap();
    let j = ferry_ok(&["sync", "--delta", p(&src), p(&dst)]);
    assert!(fs::read(&dst).unwrap() == new);
    let wire = j["bytes_wire"].as_u64().unwrap();
    assert!(wire < new.len() as u64 / 100, "{wire}");
}

#[test]
fn destination_shorter_longer_empty_or_a_directory() {
    let new = bytes(13, 3 * MIB + 123);
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("s");
    fs::write(&src, &new).unwrap();
    let dst = d.path().join("d");
    for old in [
        new[..MIB].to_vec(),
        [new.clone(), bytes(14, MIB)].concat(),
        Vec::new(),
    ] {
        let _ = fs::remove_file(&dst);
        fs::write(&dst, &old).unwrap();
        ferry_ok(&["sync", "--delta", p(&src), p(&dst)]);
        assert!(fs::read(&dst).unwrap() == new);
        // In place too: a longer old copy must be cut.
        fs::write(&dst, &old).unwrap();
        ferry_ok(&["sync", "--delta", "--inplace", p(&src), p(&dst)]);
        assert!(fs::read(&dst).unwrap() == new);
    }
    fs::remove_file(&dst).unwrap();
    fs::create_dir(&dst).unwrap();
    fs::write(dst.join("inside"), b"x").unwrap();
    let out = ferry(&["sync", "--delta", p(&src), p(&dst)]);
    // An existing directory is a place to copy into, as rsync does.
    assert!(out.status.success());
    assert!(fs::read(dst.join("s")).unwrap() == new);
}

#[test]
fn holes_in_the_source_stay_holes_with_delta() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("img");
    let f = fs::File::create(&src).unwrap();
    f.set_len(40 * MIB as u64).unwrap();
    f.write_all_at(&bytes(15, MIB), 0).unwrap();
    drop(f);
    let dst = d.path().join("copy");
    ferry_ok(&["sync", p(&src), p(&dst)]);
    let f = fs::File::options().write(true).open(&src).unwrap();
    f.write_all_at(&bytes(16, 64 * 1024), 30 * MIB as u64)
        .unwrap();
    drop(f);
    let j = ferry_ok(&["sync", "--delta", p(&src), p(&dst)]);
    assert!(fs::read(&src).unwrap() == fs::read(&dst).unwrap());
    assert!(allocated(&dst) < 4 * MIB as u64, "{}", allocated(&dst));
    assert!(j["bytes_wire"].as_u64().unwrap() < 2 * MIB as u64);
}

#[test]
fn signature_cache_is_written_and_used() {
    let old = bytes(17, 16 * MIB);
    let d = tempfile::tempdir().unwrap();
    let cache = d.path().join("cache");
    let src = d.path().join("s");
    let dst = d.path().join("d");
    fs::write(&src, &old).unwrap();
    ferry_ok(&["sync", "--sig-cache", p(&cache), p(&src), p(&dst)]);
    assert_eq!(
        fs::read_dir(&cache).unwrap().count(),
        1,
        "signature of the written file cached"
    );
    let mut new = old.clone();
    new[5 * MIB..5 * MIB + 100].fill(9);
    fs::write(&src, &new).unwrap();
    let j = ferry_ok(&[
        "sync",
        "--delta",
        "--sig-cache",
        p(&cache),
        p(&src),
        p(&dst),
    ]);
    assert!(fs::read(&dst).unwrap() == new);
    assert_eq!(j["files_delta"], 1);
    // A stale cache (destination changed behind ferry's back) is not trusted.
    let other = bytes(18, 16 * MIB);
    fs::write(&dst, &other).unwrap();
    new[9 * MIB] ^= 1;
    fs::write(&src, &new).unwrap();
    ferry_ok(&[
        "sync",
        "--delta",
        "--sig-cache",
        p(&cache),
        p(&src),
        p(&dst),
    ]);
    assert!(fs::read(&dst).unwrap() == new);
}

proptest! {
    #![proptest_config(prop_config(16))]

    /// Random edits (overwrite, insert, delete, truncate, extend, zero a
    /// range) always reproduce the source exactly, in both modes.
    #[test]
    fn random_edits_reproduce_the_source(
        size in 0usize..600_000,
        edits in prop::collection::vec((0u8..6, any::<u32>(), 1usize..70_000), 1..6),
        inplace in any::<bool>(),
    ) {
        let old = bytes(size as u64 + 1, size);
        let mut new = old.clone();
        for (kind, at, n) in edits {
            let at = if new.is_empty() { 0 } else { at as usize % new.len() };
            match kind {
                0 => { let end = (at + n).min(new.len()); let fill = bytes(at as u64, end - at); new[at..end].copy_from_slice(&fill); }
                1 => { let ins = bytes(n as u64, n % 5000 + 1); new.splice(at..at, ins); }
                2 => { let end = (at + n).min(new.len()); new.drain(at..end); }
                3 => new.truncate(at),
                4 => new.extend_from_slice(&bytes(n as u64 ^ 3, n)),
                _ => { let end = (at + n).min(new.len()); new[at..end].fill(0); }
            }
        }
        let d = tempfile::tempdir().unwrap();
        let (src, dst) = (d.path().join("s"), d.path().join("d"));
        fs::write(&src, &new).unwrap();
        fs::write(&dst, &old).unwrap();
        let mut args = vec!["sync", "--delta", "--checksum"];
        if inplace { args.push("--inplace"); }
        args.extend([p(&src), p(&dst)]);
        ferry_ok(&args);
        prop_assert!(fs::read(&dst).unwrap() == new);
    }
}

proptest! {
    #![proptest_config(prop_config(8))]

    /// Files of several 8 MiB segments, where the sender sends segments that
    /// stayed in place before the signature is complete and leaves the rest
    /// to the matcher: scattered overwrites, zeroed ranges, an insert or a
    /// delete (everything after shifts), a cut or an extension, in both
    /// modes, always reproduce the source exactly.
    #[test]
    fn segments_sent_early_and_late_reproduce_the_source(
        size in (9 * MIB)..(30 * MIB),
        overwrites in prop::collection::vec((any::<u32>(), 1usize..70_000), 0..40),
        shift in prop::option::of((0u8..4, any::<u32>(), 1usize..3 * MIB)),
        inplace in any::<bool>(),
    ) {
        let old = bytes(size as u64, size);
        let mut new = old.clone();
        for (at, n) in overwrites {
            let at = at as usize % new.len();
            let end = (at + n).min(new.len());
            if n % 3 == 0 {
                new[at..end].fill(0);
            } else {
                let fill = bytes(at as u64 ^ 5, end - at);
                new[at..end].copy_from_slice(&fill);
            }
        }
        if let Some((kind, at, n)) = shift {
            let at = at as usize % new.len();
            match kind {
                0 => { let ins = bytes(n as u64, n % 9000 + 1); new.splice(at..at, ins); }
                1 => { let end = (at + n).min(new.len()); new.drain(at..end); }
                2 => new.truncate(at),
                _ => new.extend_from_slice(&bytes(n as u64 ^ 9, n)),
            }
        }
        let d = tempfile::tempdir().unwrap();
        let (src, dst) = (d.path().join("s"), d.path().join("d"));
        fs::write(&src, &new).unwrap();
        fs::write(&dst, &old).unwrap();
        // Without -c ferry skips a file of the same size and mtime; both
        // files are written within the same clock tick often enough, so the
        // old copy is dated a day earlier and always differs.
        set_mtime(&dst, 1_700_000_000);
        set_mtime(&src, 1_700_086_400);
        let mut args = vec!["sync", "--delta"];
        if inplace { args.push("--inplace"); }
        args.extend([p(&src), p(&dst)]);
        let j = ferry_ok(&args);
        prop_assert!(fs::read(&dst).unwrap() == new, "{}", j);
        prop_assert_eq!(&j["files_delta"], 1);
    }
}
