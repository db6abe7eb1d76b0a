//! A failing disk: EIO on reads of the source and on writes to the
//! destination, from a real block device, through the real binary.
//!
//! The kernels ferry's CI runs on have no device-mapper (no `dm-error`, no
//! `dm-flakey`), so the failing disk is built from what they do have: a
//! loop device over a file that this test process serves itself through
//! FUSE. Each READ or WRITE the loop driver sends for that file is answered
//! from a backing file, or with EIO where the test says the disk is bad
//! (sector ranges for reads, every write once writes are switched off).
//! That is what `dmsetup` with an `error` target (or `flakey` with
//! `error_writes`) gives, one layer down: ext4 and ferry above the loop
//! device see a block device whose bios fail with an I/O error.
//!
//! The same disk can also lie instead of failing ([`Rot`]): every request
//! succeeds, but a block of data written while the lie is on reads back
//! with one bit flipped, as a disk with bit rot (or a controller that
//! acknowledges what it never stored) does. That is for `--verify`.
//!
//! Needs root (mount, losetup), `/dev/fuse`, and e2fsprogs (`mkfs.ext4`,
//! `filefrag`); without them each test prints SKIPPED, and fails under CI.

mod common;
#[path = "faults/disk.rs"]
mod disk;
#[path = "faults/fuse.rs"]
mod fuse;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;
use disk::{run, FaultyDisk};
use fuse::{Rot, ROT_BYTE, ROT_MASK};

// ---------------------------------------------------------------------------
// Checks shared by the cases.

fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The lines ferry wrote on stderr.
fn lines(err: &str) -> Vec<&str> {
    err.lines().filter(|l| !l.trim().is_empty()).collect()
}

fn no_panic(err: &str) {
    assert!(
        !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
        "ferry panicked:\n{err}"
    );
}

fn says_eio(line: &str) -> bool {
    line.to_lowercase().contains("input/output error")
}

/// The one error line, which names `path` and says "input/output error".
fn one_eio_line<'a>(err: &'a str, path: &str) -> &'a str {
    let l = lines(err);
    assert_eq!(l.len(), 1, "one error line expected:\n{err}");
    assert!(
        l[0].starts_with("ferry: ") && l[0].contains(path) && says_eio(l[0]),
        "the line names {path} and the I/O error:\n{err}"
    );
    l[0]
}

const MIB: u64 = 1 << 20;

/// A source tree on a failing disk: `src/big.bin` (4 MiB) has 64 KiB of bad
/// sectors 1 MiB in (ferry has read and written the first MiB when the
/// error comes); `small.txt` and `sub/mid.bin` are healthy. The disk is
/// mounted read-only, afresh, so nothing of the bad file is cached.
struct BadTree {
    disk: FaultyDisk,
    src: PathBuf,
    bad: PathBuf,
}

fn bad_tree(test: &str) -> Option<BadTree> {
    let mut disk = FaultyDisk::new(test, 64 * MIB)?;
    disk.mkfs_and_mount();
    let src = disk.fs_mnt.join("src");
    fs::create_dir_all(src.join("sub")).unwrap();
    fs::write(src.join("big.bin"), bytes(1, 4 * MIB as usize)).unwrap();
    fs::write(src.join("small.txt"), b"healthy small\n").unwrap();
    // From 256 KiB ferry reads an uncached source with O_DIRECT.
    fs::write(src.join("sub/mid.bin"), bytes(2, 300_000)).unwrap();
    let bad = src.join("big.bin");
    let ranges = disk.device_ranges(&bad, MIB, MIB + (64 << 10));
    disk.umount();
    disk.set(|f| f.bad_reads = ranges);
    disk.mount("ro");
    Some(BadTree { disk, src, bad })
}

/// The destination's older copy of the tree, plus `stale.txt`, which the
/// source does not have.
fn old_copy(dst: &Path) {
    fs::create_dir_all(dst.join("sub")).unwrap();
    fs::write(dst.join("big.bin"), old_big()).unwrap();
    fs::write(dst.join("small.txt"), b"old small\n").unwrap();
    fs::write(dst.join("sub/mid.bin"), b"old mid").unwrap();
    fs::write(dst.join("stale.txt"), b"only in the destination").unwrap();
    for f in ["big.bin", "small.txt", "sub/mid.bin", "stale.txt"] {
        set_mtime(&dst.join(f), 1_000_000_000);
    }
}

fn old_big() -> Vec<u8> {
    bytes(9, 3 * MIB as usize)
}

/// The bad file fails with one line naming it, the rest are copied, exit 2
/// (partial), the old copy of the bad file stays byte for byte, no temp
/// file is left, whether the error comes while copying or while hashing
/// (`-c`); with `--delete --ignore-errors`, deletion goes ahead but never
/// takes the file that could not be read.
#[test]
fn source_read_error_in_a_tree_fails_that_file_only() {
    let Some(t) = bad_tree("source_read_error_in_a_tree_fails_that_file_only") else {
        return;
    };
    let bad = p(&t.bad);
    for extra in [None, Some("-c"), Some("--buffered-io")] {
        let d = tempfile::tempdir().unwrap();
        let dst = d.path().join("dst");
        old_copy(&dst);
        let mut args = vec!["sync"];
        args.extend(extra);
        let s = slash(&t.src);
        args.extend([s.as_str(), p(&dst)]);
        let before = t.disk.eio_counts().0;
        let out = ferry(&args);
        let err = stderr_of(&out);
        no_panic(&err);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: partial transfer:\n{err}"
        );
        one_eio_line(&err, bad);
        assert!(t.disk.eio_counts().0 > before, "the bad sectors were read");
        assert!(
            fs::read(dst.join("big.bin")).unwrap() == old_big(),
            "{args:?}: the old big.bin changed"
        );
        assert_eq!(fs::read(dst.join("small.txt")).unwrap(), b"healthy small\n");
        assert!(fs::read(dst.join("sub/mid.bin")).unwrap() == bytes(2, 300_000));
        assert!(dst.join("stale.txt").exists());
        assert!(temp_files(&dst).is_empty(), "{:?}", temp_files(&dst));
    }

    let d = tempfile::tempdir().unwrap();
    let dst = d.path().join("dst");
    old_copy(&dst);
    let s = slash(&t.src);
    let out = ferry(&["sync", "--delete", "--ignore-errors", &s, p(&dst)]);
    let err = stderr_of(&out);
    no_panic(&err);
    assert_eq!(out.status.code(), Some(2), "partial transfer:\n{err}");
    one_eio_line(&err, bad);
    assert!(!dst.join("stale.txt").exists(), "--ignore-errors deletes");
    assert!(
        fs::read(dst.join("big.bin")).unwrap() == old_big(),
        "the old big.bin changed"
    );
    assert_eq!(fs::read(dst.join("small.txt")).unwrap(), b"healthy small\n");
    assert!(temp_files(&dst).is_empty(), "{:?}", temp_files(&dst));
}

/// README, `--ignore-errors`: "with --delete, delete even after the sender
/// could not read part of the source (by default any such error turns
/// deletion off for the run: one line on stderr, delete_skipped in
/// --json, exit 2)". A file whose data cannot be read is such an error,
/// whether it comes while hashing (`-c`) or while copying.
#[test]
fn source_read_error_turns_delete_off() {
    let Some(t) = bad_tree("source_read_error_turns_delete_off") else {
        return;
    };
    let bad = p(&t.bad);
    for extra in [Some("-c"), None] {
        let d = tempfile::tempdir().unwrap();
        let dst = d.path().join("dst");
        old_copy(&dst);
        let mut args = vec!["sync", "--delete", "--json"];
        args.extend(extra);
        let s = slash(&t.src);
        args.extend([s.as_str(), p(&dst)]);
        let out = ferry(&args);
        let err = stderr_of(&out);
        no_panic(&err);
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("--json object");
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: partial transfer:\n{err}{j}"
        );
        assert!(
            dst.join("stale.txt").exists(),
            "{args:?}: --delete deleted after a read error of the source:\n{err}{j}"
        );
        assert!(
            fs::read(dst.join("big.bin")).unwrap() == old_big(),
            "{args:?}: the old big.bin changed"
        );
        assert!(temp_files(&dst).is_empty(), "{:?}", temp_files(&dst));
        assert_eq!(j["delete_skipped"], true, "{args:?}: {err}{j}");
        assert_eq!(j["files_deleted"], 0, "{args:?}: {j}");
        assert_eq!(j["files_failed"], 1, "{args:?}: {j}");
        assert_eq!(j["exit_code"], 2, "{args:?}: {j}");
        let l = lines(&err);
        assert_eq!(
            l.len(),
            2,
            "{args:?}: the read error and the skipped deletion:\n{err}"
        );
        assert_eq!(
            l.iter().filter(|l| l.contains(bad) && says_eio(l)).count(),
            1,
            "{args:?}: {err}"
        );
        assert_eq!(
            l.iter().filter(|l| l.contains("skipping deletion")).count(),
            1,
            "{args:?}: {err}"
        );
    }
}

/// One file on a failing disk as the whole source: one line naming it, a
/// non-zero documented exit, the old copy byte for byte, no temp file.
#[test]
fn source_read_error_on_a_single_file_keeps_the_old_copy() {
    let Some(mut disk) = FaultyDisk::new(
        "source_read_error_on_a_single_file_keeps_the_old_copy",
        64 * MIB,
    ) else {
        return;
    };
    disk.mkfs_and_mount();
    let src = disk.fs_mnt.join("big.bin");
    fs::write(&src, bytes(1, 4 * MIB as usize)).unwrap();
    let bad = disk.device_ranges(&src, 2 * MIB, 2 * MIB + 4096);
    disk.umount();
    disk.set(|f| f.bad_reads = bad);
    disk.mount("ro");

    let t = tempfile::tempdir().unwrap();
    let dst = t.path().join("big.bin");
    let old = bytes(9, 3 * MIB as usize);
    fs::write(&dst, &old).unwrap();
    set_mtime(&dst, 1_000_000_000);
    for extra in [None, Some("--buffered-io"), Some("--inplace")] {
        let mut args = vec!["sync"];
        args.extend(extra);
        args.extend([p(&src), p(&dst)]);
        let before = disk.eio_counts().0;
        let out = ferry(&args);
        let err = stderr_of(&out);
        no_panic(&err);
        assert_eq!(out.status.code(), Some(2), "{args:?}:\n{err}");
        one_eio_line(&err, p(&src));
        assert!(disk.eio_counts().0 > before, "the bad sector was read");
        assert!(
            temp_files(t.path()).is_empty(),
            "{:?}",
            temp_files(t.path())
        );
        if extra == Some("--inplace") {
            // In place there is no old copy to keep, but what is left
            // must not pass for the source's copy: the next run (size +
            // mtime) would skip it.
            let (s, d) = (fs::metadata(&src).unwrap(), fs::metadata(&dst).unwrap());
            assert!(
                (s.len(), s.mtime(), s.mtime_nsec()) != (d.len(), d.mtime(), d.mtime_nsec()),
                "{args:?}: a half-written file looks up to date"
            );
        } else {
            assert!(
                fs::read(&dst).unwrap() == old,
                "{args:?}: the old copy changed"
            );
        }
    }
}

/// A block device that fails partway as the source of an image copy: one
/// line naming the device, a non-zero documented exit, an existing image
/// unchanged, no image made where there was none, no temp file.
#[test]
fn failing_block_device_source_leaves_the_image_alone() {
    let Some(disk) = FaultyDisk::new(
        "failing_block_device_source_leaves_the_image_alone",
        16 * MIB,
    ) else {
        return;
    };
    let data = bytes(3, 16 * MIB as usize);
    fs::write(&disk.store, &data).unwrap();
    disk.set(|f| f.bad_reads = vec![(6 * MIB, 6 * MIB + (64 << 10))]);

    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("dst.img");
    let old = bytes(4, 16 * MIB as usize);
    fs::write(&img, &old).unwrap();
    set_mtime(&img, 1_000_000_000);
    let fresh = t.path().join("fresh.img");
    for dst in [&img, &fresh] {
        for extra in [None, Some("--buffered-io")] {
            let mut args = vec!["sync"];
            args.extend(extra);
            args.extend([disk.dev.as_str(), p(dst)]);
            let before = disk.eio_counts().0;
            let out = ferry(&args);
            let err = stderr_of(&out);
            no_panic(&err);
            assert_eq!(out.status.code(), Some(2), "{args:?}:\n{err}");
            one_eio_line(&err, &disk.dev);
            assert!(disk.eio_counts().0 > before, "the bad sectors were read");
            assert!(fs::read(&img).unwrap() == old, "{args:?}: dst.img changed");
            assert!(!fresh.exists(), "{args:?}: a half image was left");
            assert!(
                temp_files(t.path()).is_empty(),
                "{:?}",
                temp_files(t.path())
            );
        }
    }
}

/// The destination's disk stops taking writes (the filesystem is still
/// mounted): ferry says so in one line, exits with a documented non-zero
/// code, and neither claims success nor puts anything in place of the old
/// files, which are intact on the disk afterwards.
#[test]
fn failing_destination_disk_is_an_error_and_keeps_the_old_files() {
    let Some(mut disk) = FaultyDisk::new(
        "failing_destination_disk_is_an_error_and_keeps_the_old_files",
        64 * MIB,
    ) else {
        return;
    };
    disk.mkfs_and_mount();
    let dst = disk.fs_mnt.join("dst");
    fs::create_dir(&dst).unwrap();
    let keep = bytes(5, MIB as usize);
    fs::write(dst.join("keep.bin"), &keep).unwrap();
    fs::write(dst.join("f.txt"), b"old f\n").unwrap();
    set_mtime(&dst.join("f.txt"), 1_000_000_000);
    // All of it on the disk, nothing left to write back. No periodic
    // journal commit during the test (commit=300): one that failed would
    // abort the journal at a moment of its own choosing, and the fs would
    // turn read-only halfway through a run.
    disk.umount();
    disk.mount("rw,commit=300");
    disk.set(|f| f.writes_fail = true);

    let t = tempfile::tempdir().unwrap();
    fs::write(t.path().join("new.bin"), bytes(6, 2 * MIB as usize)).unwrap();
    fs::write(t.path().join("f.txt"), b"new f, longer than the old one\n").unwrap();
    // A new file of 2 MiB (written with O_DIRECT: the write fails), the
    // same through the page cache (the error comes at fdatasync), and a
    // small changed file (buffered too). Exit 2 (this entry failed) or 3
    // (unwritable destination): the README's table fits either.
    for (name, extra) in [
        ("new.bin", None),
        ("new.bin", Some("--buffered-io")),
        ("f.txt", None),
    ] {
        let mut args = vec!["sync", "--json"];
        args.extend(extra);
        let (s, d) = (t.path().join(name), dst.join(name));
        args.extend([p(&s), p(&d)]);
        let out = ferry(&args);
        let err = stderr_of(&out);
        no_panic(&err);
        let code = out.status.code();
        assert!(
            matches!(code, Some(2 | 3)),
            "{args:?}: exit {code:?}:\n{err}"
        );
        let l = lines(&err);
        assert_eq!(l.len(), 1, "{args:?}: one error line:\n{err}");
        assert!(
            l[0].contains(p(&dst))
                && (says_eio(l[0]) || l[0].to_lowercase().contains("read-only file system")),
            "{args:?}: the line names the destination and the I/O error:\n{err}"
        );
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("--json object");
        assert_eq!(j["exit_code"].as_i64(), code.map(i64::from), "{j}");
        assert_eq!(
            j["files_transferred"], 0,
            "{args:?}: claims a transfer: {j}"
        );
        assert!(
            !dst.join("new.bin").exists(),
            "{args:?}: a failed new.bin was put in place"
        );
        assert_eq!(fs::read(dst.join("f.txt")).unwrap(), b"old f\n", "{args:?}");
        // A small file's failed write is met by its batch's `syncfs`
        // (small files are written back together, by the `syncfs`), whose
        // journal commit then fails too: ext4 aborts the journal and turns
        // read-only. Here ferry's `syncfs` does it (commit=300 keeps ext4's
        // own commit out of the test); on a disk failing for real, ext4's
        // periodic commit does it within 5 s. The temporary file then
        // lives in memory only, never on the disk (checked below,
        // remounted), and the old copy stays.
        if !(name == "f.txt" && read_only(&dst)) {
            assert!(
                temp_files(&dst).is_empty(),
                "{args:?}: {:?}",
                temp_files(&dst)
            );
        }
    }
    assert!(disk.eio_counts().1 > 0, "the writes failed");
    // What is on the disk itself: the old files, nothing else.
    disk.set(|f| f.writes_fail = false);
    disk.umount();
    disk.mount("ro");
    assert!(fs::read(dst.join("keep.bin")).unwrap() == keep);
    assert_eq!(fs::read(dst.join("f.txt")).unwrap(), b"old f\n");
    let mut names: Vec<_> = fs::read_dir(&dst)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["f.txt", "keep.bin"]);
}

/// Whether the filesystem `dir` is on refuses to be written.
fn read_only(dir: &Path) -> bool {
    let probe = dir.join(".probe");
    match fs::write(&probe, b"") {
        Ok(()) => {
            fs::remove_file(&probe).unwrap();
            false
        }
        Err(e) => e.kind() == std::io::ErrorKind::ReadOnlyFilesystem,
    }
}

/// The file's bytes as they are on the disk now: read with `O_DIRECT`,
/// past any page cache, so every read reaches the (lying) disk.
fn read_from_disk(file: &Path) -> Vec<u8> {
    let out = run(Command::new("dd")
        .arg(format!("if={}", file.display()))
        .args(["iflag=direct", "bs=1M", "status=none"]));
    assert!(
        out.status.success(),
        "dd {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// README, `--verify`: "read it back from the disk past the page cache and
/// check it against the sender's segment digests again; a file that reads
/// back different keeps its old version and the run exits 2".
///
/// The destination's disk rots: every write and flush succeeds, but one
/// 4 KiB block of the new file (in its second 8 MiB segment, so checking
/// only the first would not do) reads back with a bit flipped. With
/// `--verify` (`O_DIRECT` writes and `--buffered-io`), that file fails in
/// one line naming it and the range that differs, the old copy stays, no
/// temp file is left, the healthy file beside it is copied, exit 2; the
/// disk was really read (the flipped bit was served). The control: the
/// same runs without `--verify` believe the disk, exit 0, and never read
/// the file back, although it reads back wrong.
#[test]
fn verify_catches_a_disk_that_returns_other_bytes_than_were_written() {
    let Some(mut disk) = FaultyDisk::new(
        "verify_catches_a_disk_that_returns_other_bytes_than_were_written",
        64 * MIB,
    ) else {
        return;
    };
    disk.mkfs_and_mount();
    let size = 9 * MIB as usize + 4321;
    let data = bytes(7, size);
    // File offset of the block that rots, and of its bad bit.
    let rotten = 8 * MIB + (512 << 10);
    let bad_byte = rotten + ROT_BYTE;
    let block = &data[rotten as usize..rotten as usize + 4096];
    let s = tempfile::tempdir().unwrap();
    let src = s.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("big.bin"), &data).unwrap();
    fs::write(src.join("small.txt"), b"new small\n").unwrap();

    let old = bytes(9, 3 * MIB as usize);
    let cases = [
        (true, None),
        (true, Some("--buffered-io")),
        (false, None),
        (false, Some("--buffered-io")),
    ];
    let dsts: Vec<PathBuf> = (0..cases.len())
        .map(|i| disk.fs_mnt.join(format!("dst{i}")))
        .collect();
    for dst in &dsts {
        fs::create_dir(dst).unwrap();
        fs::write(dst.join("big.bin"), &old).unwrap();
        fs::write(dst.join("small.txt"), b"old small\n").unwrap();
        set_mtime(&dst.join("big.bin"), 1_000_000_000);
        set_mtime(&dst.join("small.txt"), 1_000_000_000);
    }
    // All of it on the disk, nothing cached or left to write back.
    disk.umount();
    disk.mount("rw");

    for ((verify, extra), dst) in cases.into_iter().zip(&dsts) {
        let mut args = vec!["sync"];
        args.extend(verify.then_some("--verify"));
        args.extend(extra);
        let s = slash(&src);
        args.extend([s.as_str(), p(dst)]);
        disk.set(|f| f.rot = Some(Rot::new(block)));
        let out = ferry(&args);
        let err = stderr_of(&out);
        no_panic(&err);
        let (places, flipped) = disk.rot_counts();
        assert!(places >= 1, "{args:?}: the new data never reached the disk");
        let big = dst.join("big.bin");
        if verify {
            assert_eq!(out.status.code(), Some(2), "{args:?}:\n{err}");
            assert!(
                flipped >= 1,
                "{args:?}: nothing was read back from the disk"
            );
            let l = lines(&err);
            assert_eq!(l.len(), 1, "{args:?}: one error line expected:\n{err}");
            assert!(
                l[0].starts_with("ferry: ") && l[0].contains("--verify") && l[0].contains(p(&big)),
                "{args:?}: the line names --verify and {}:\n{err}",
                big.display()
            );
            // "bytes A..B differ from the source": the range holds the bad bit.
            let range = l[0]
                .split("--verify: read back from the disk, bytes ")
                .nth(1)
                .and_then(|r| r.split_once(" differ from the source"))
                .and_then(|(r, _)| r.split_once(".."))
                .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)))
                .unwrap_or_else(|| panic!("{args:?}: no range in:\n{err}"));
            assert!(
                range.0 <= bad_byte && bad_byte < range.1 && range.1 <= size as u64,
                "{args:?}: byte {bad_byte} is bad, not in {range:?}:\n{err}"
            );
            assert!(
                fs::read(&big).unwrap() == old,
                "{args:?}: the old copy changed"
            );
        } else {
            assert_eq!(out.status.code(), Some(0), "{args:?}:\n{err}");
            assert!(
                !err.contains("--verify"),
                "{args:?}: --verify is off:\n{err}"
            );
            assert_eq!(flipped, 0, "{args:?}: read back without --verify");
            // The disk lies, and ferry believed it: what it put in place
            // reads back with one bit flipped.
            let mut want = data.clone();
            want[bad_byte as usize] ^= ROT_MASK;
            assert!(
                read_from_disk(&big) == want,
                "{args:?}: the disk does not lie as it should"
            );
            assert!(disk.rot_counts().1 >= 1);
        }
        assert_eq!(fs::read(dst.join("small.txt")).unwrap(), b"new small\n");
        assert!(
            temp_files(dst).is_empty(),
            "{args:?}: {:?}",
            temp_files(dst)
        );
        disk.set(|f| f.rot = None);
    }

    // What is on the disk itself, read afresh: the old copy where --verify
    // failed, the (correctly stored) new one where ferry believed the disk.
    disk.umount();
    disk.mount("ro");
    for ((verify, _), dst) in cases.into_iter().zip(&dsts) {
        let big = fs::read(dst.join("big.bin")).unwrap();
        if verify {
            assert!(big == old, "{}: the old copy changed", dst.display());
        } else {
            assert!(big == data, "{}", dst.display());
        }
        assert_eq!(fs::read(dst.join("small.txt")).unwrap(), b"new small\n");
        let mut names: Vec<_> = fs::read_dir(dst)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["big.bin", "small.txt"], "{}", dst.display());
    }
}
