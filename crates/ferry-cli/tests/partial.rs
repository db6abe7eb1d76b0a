//! Partial files as a hostile or unlucky destination leaves them: a
//! journal crafted to the letter of docs/PROTOCOL.md, partial files with
//! stale bytes, hard links and reserved names. Whatever is there, the
//! result is the source, and nothing outside the destination is written.

mod common;

use std::fs;
use std::path::Path;

use common::*;
use ferry_core::journal::{header, record, Identity};

const MIB: usize = 1 << 20;

/// A journal for `name` (the destination's file name) of a source listed
/// with `size` and `mtime`, naming `segs` with unknown (zero) digests.
fn journal(name: &str, size: u64, mtime: i64, segs: impl IntoIterator<Item = u64>) -> Vec<u8> {
    journal_with(name, size, mtime, segs.into_iter().map(|s| (s, [0; 32])))
}

/// As [`journal`], with the digest recorded for each segment.
fn journal_with(
    name: &str,
    size: u64,
    mtime: i64,
    segs: impl IntoIterator<Item = (u64, [u8; 32])>,
) -> Vec<u8> {
    let id = Identity {
        size,
        mtime,
        mtime_nsec: 0,
        name: name.as_bytes().to_vec(),
    };
    let (mut b, check) = header(&id).expect("header");
    for (s, d) in segs {
        b.extend_from_slice(&record(&check, s, &d));
    }
    b
}

/// `src/big` of `n` MiB of random bytes but a 1 MiB run of zeros at
/// 9 MiB, mtime 1,600,000,000; returns its bytes.
fn source(root: &Path, n: usize) -> Vec<u8> {
    fs::create_dir_all(root.join("src")).unwrap();
    fs::create_dir_all(root.join("dst")).unwrap();
    let mut data = bytes(5, n * MIB);
    data[9 * MIB..10 * MIB].fill(0);
    fs::write(root.join("src/big"), &data).unwrap();
    set_mtime(&root.join("src/big"), 1_600_000_000);
    data
}

#[test]
fn a_partial_file_with_every_segment_journaled_completes() {
    let d = tempfile::tempdir().unwrap();
    let data = source(d.path(), 64);
    fs::write(d.path().join("dst/.big.ferry-partial"), &data).unwrap();
    fs::write(
        d.path().join("dst/.big.ferry-journal"),
        journal("big", data.len() as u64, 1_600_000_000, 0..8),
    )
    .unwrap();
    let j = ferry_ok(&["sync", p(&d.path().join("src/")), p(&d.path().join("dst"))]);
    assert_eq!(j["bytes_resumed"], 64 << 20, "{j}");
    assert_eq!(j["bytes_written"], 0, "{j}");
    assert_eq!(j["reconnects"], 0, "{j}");
    assert!(fs::read(d.path().join("dst/big")).unwrap() == data);
    assert!(temp_files(&d.path().join("dst")).is_empty());
}

/// Segments 0-4 of "big", segment 1 with a digest that is not the source's.
fn stale_journal(size: u64) -> Vec<u8> {
    let segs = (0..5).map(|s| (s, if s == 1 { [9; 32] } else { [0; 32] }));
    journal_with("big", size, 1_600_000_000, segs)
}

#[test]
fn stale_bytes_where_the_source_has_zeros_are_overwritten() {
    // Segment 1 of the partial file holds 0xFF where the source has a
    // run of zeros, and its journal another digest: offered, found
    // different by the sender, sent again, and its zeros must be written
    // over what the partial file held.
    let d = tempfile::tempdir().unwrap();
    let data = source(d.path(), 40);
    let mut stale = data.clone();
    stale[9 * MIB..10 * MIB].fill(0xFF);
    fs::write(d.path().join("dst/.big.ferry-partial"), &stale).unwrap();
    fs::write(
        d.path().join("dst/.big.ferry-journal"),
        stale_journal(data.len() as u64),
    )
    .unwrap();
    for remote in [false, true] {
        let dst = if remote {
            // Over a byte-stream link as well (digests on the wire).
            let rsh = d.path().join("rsh");
            fs::write(&rsh, "#!/bin/sh\nshift\nexec sh -c \"$*\"\n").unwrap();
            fs::set_permissions(&rsh, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
            let _ = fs::remove_file(d.path().join("dst/big"));
            fs::write(d.path().join("dst/.big.ferry-partial"), &stale).unwrap();
            fs::write(
                d.path().join("dst/.big.ferry-journal"),
                stale_journal(data.len() as u64),
            )
            .unwrap();
            let j = ferry_ok(&[
                "sync",
                "-e",
                p(&rsh),
                "--remote-ferry",
                p(&ferry_bin()),
                p(&d.path().join("src/")),
                &format!("h:{}", p(&d.path().join("dst"))),
            ]);
            assert_eq!(j["bytes_resumed"], 32 << 20, "{j}");
            d.path().join("dst/big")
        } else {
            let j = ferry_ok(&["sync", p(&d.path().join("src/")), p(&d.path().join("dst"))]);
            assert_eq!(j["bytes_resumed"], 32 << 20, "segment 1 is not kept: {j}");
            d.path().join("dst/big")
        };
        assert!(
            fs::read(&dst).unwrap() == data,
            "stale bytes survived (remote: {remote})"
        );
    }
}

#[test]
fn a_kept_segment_that_reads_back_different_sends_the_file_again() {
    // The journal says nothing of the digests (a local run): the sender
    // confirms each segment, and the one that reads back different here
    // fails the partial file, which is then sent whole.
    let d = tempfile::tempdir().unwrap();
    let data = source(d.path(), 40);
    let mut stale = data.clone();
    stale[20 * MIB] ^= 1;
    fs::write(d.path().join("dst/.big.ferry-partial"), &stale).unwrap();
    fs::write(
        d.path().join("dst/.big.ferry-journal"),
        journal("big", data.len() as u64, 1_600_000_000, 0..5),
    )
    .unwrap();
    let j = ferry_ok(&["sync", p(&d.path().join("src/")), p(&d.path().join("dst"))]);
    assert!(fs::read(d.path().join("dst/big")).unwrap() == data, "{j}");
    assert_eq!(j["files_failed"], 0, "{j}");
    assert!(temp_files(&d.path().join("dst")).is_empty());
}

#[test]
fn a_partial_file_that_is_a_hard_link_is_never_written_through() {
    let d = tempfile::tempdir().unwrap();
    let data = source(d.path(), 40);
    let victim = d.path().join("victim");
    fs::write(&victim, &data[..8 * MIB]).unwrap();
    fs::hard_link(&victim, d.path().join("dst/.big.ferry-partial")).unwrap();
    fs::write(
        d.path().join("dst/.big.ferry-journal"),
        journal("big", data.len() as u64, 1_600_000_000, [0]),
    )
    .unwrap();
    ferry_ok(&["sync", p(&d.path().join("src/")), p(&d.path().join("dst"))]);
    assert!(fs::read(d.path().join("dst/big")).unwrap() == data);
    assert!(
        fs::read(&victim).unwrap() == data[..8 * MIB],
        "a file linked at the partial name was changed"
    );
}

#[test]
fn reserved_names_are_neither_sent_nor_taken_for_partial_files() {
    let d = tempfile::tempdir().unwrap();
    let data = source(d.path(), 40);
    fs::write(d.path().join("src/.big.ferry-partial"), b"my notes\n").unwrap();
    fs::write(d.path().join("src/.big.ferry-journal"), b"other\n").unwrap();
    let j = ferry_ok(&["sync", p(&d.path().join("src/")), p(&d.path().join("dst"))]);
    assert_eq!(j["files_total"], 1, "reserved names were listed: {j}");
    assert!(fs::read(d.path().join("dst/big")).unwrap() == data);
    assert!(!d.path().join("dst/.big.ferry-partial").exists());
}
