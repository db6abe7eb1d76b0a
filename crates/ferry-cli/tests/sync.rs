//! `ferry sync` driven through the real binary on temp dirs.

mod common;

use std::fs::{self, File};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::Path;

use common::*;

fn tree(root: &Path) {
    fs::create_dir_all(root.join("a/b")).unwrap();
    fs::create_dir_all(root.join("empty")).unwrap();
    fs::write(root.join("top.txt"), b"hello\n").unwrap();
    fs::write(root.join("a/one.bin"), bytes(1, 300_000)).unwrap();
    fs::write(root.join("a/b/two.txt"), b"two").unwrap();
    fs::write(root.join("zero-len"), b"").unwrap();
    fs::set_permissions(root.join("a/b/two.txt"), fs::Permissions::from_mode(0o640)).unwrap();
    std::os::unix::fs::symlink("a/b/two.txt", root.join("link")).unwrap();
    std::os::unix::fs::symlink("/nonexistent/target", root.join("dangling")).unwrap();
    fs::hard_link(root.join("a/one.bin"), root.join("a/one-again.bin")).unwrap();
}

#[test]
fn copies_a_tree_and_rerun_moves_nothing() {
    let d = tempfile::tempdir().unwrap();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    tree(&src);
    let j = ferry_ok(&["sync", &slash(&src), p(&dst)]);
    assert_same_tree(&src, &dst);
    assert_eq!(j["files_failed"], 0);
    assert_eq!(j["bytes_total"], 300_000 + 6 + 3);
    assert!(j["bytes_wire"].as_u64().unwrap() >= 300_000);
    let again = ferry_ok(&["sync", &slash(&src), p(&dst)]);
    assert_eq!(again["files_transferred"], 0);
    assert_eq!(again["bytes_transferred"], 0);
    assert_eq!(again["bytes_written"], 0);
    assert!(again["bytes_wire"].as_u64().unwrap() < 10_000, "{again}");
    for key in [
        "files_total",
        "files_transferred",
        "files_deleted",
        "bytes_total",
        "bytes_transferred",
        "bytes_wire",
        "bytes_written",
        "seconds",
    ] {
        assert!(again.get(key).is_some(), "--json lacks {key}");
    }
}

#[test]
fn trailing_slash_rule() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    tree(&src);
    let with = d.path().join("with");
    let without = d.path().join("without");
    ferry_ok(&["sync", &slash(&src), p(&with)]);
    ferry_ok(&["sync", p(&src), p(&without)]);
    assert!(with.join("top.txt").exists());
    assert!(without.join("src/top.txt").exists());
    assert!(!without.join("top.txt").exists());
}

#[test]
fn file_to_file_and_into_directory() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("f.bin");
    fs::write(&f, bytes(2, 50_000)).unwrap();
    let g = d.path().join("g.bin");
    ferry_ok(&["sync", p(&f), p(&g)]);
    assert_eq!(fs::read(&g).unwrap(), fs::read(&f).unwrap());
    let dir = d.path().join("dir");
    fs::create_dir(&dir).unwrap();
    ferry_ok(&["sync", p(&f), p(&dir)]);
    assert_eq!(fs::read(dir.join("f.bin")).unwrap(), fs::read(&f).unwrap());
}

#[test]
fn changed_files_are_replaced_atomically_and_checksum_sees_same_size_edits() {
    let d = tempfile::tempdir().unwrap();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    tree(&src);
    ferry_ok(&["sync", &slash(&src), p(&dst)]);
    let before_ino = fs::metadata(dst.join("top.txt")).unwrap().ino();
    // Same size, same mtime, other content: only --checksum notices.
    let m = fs::metadata(src.join("top.txt")).unwrap();
    fs::write(src.join("top.txt"), b"HELLO\n").unwrap();
    let mtime = filetime(&m);
    set_mtime(&src.join("top.txt"), mtime);
    let plain = ferry_ok(&["sync", &slash(&src), p(&dst)]);
    assert_eq!(plain["files_transferred"], 0);
    let sum = ferry_ok(&["sync", "--checksum", &slash(&src), p(&dst)]);
    assert_eq!(sum["files_transferred"], 1);
    assert_eq!(fs::read(dst.join("top.txt")).unwrap(), b"HELLO\n");
    assert_ne!(
        fs::metadata(dst.join("top.txt")).unwrap().ino(),
        before_ino,
        "temp + rename gives a new inode"
    );
    assert!(temp_files(&dst).is_empty());
}

fn filetime(m: &fs::Metadata) -> (i64, i64) {
    (m.mtime(), m.mtime_nsec())
}

fn set_mtime(path: &Path, (s, ns): (i64, i64)) {
    let t = std::time::UNIX_EPOCH + std::time::Duration::new(s as u64, ns as u32);
    File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(t)
        .unwrap();
}

#[test]
fn inplace_keeps_the_inode() {
    let d = tempfile::tempdir().unwrap();
    let (src, dst) = (d.path().join("s.bin"), d.path().join("d.bin"));
    fs::write(&src, bytes(3, 200_000)).unwrap();
    ferry_ok(&["sync", p(&src), p(&dst)]);
    let ino = fs::metadata(&dst).unwrap().ino();
    fs::write(&src, bytes(4, 100_000)).unwrap();
    ferry_ok(&["sync", "--inplace", p(&src), p(&dst)]);
    assert_eq!(fs::metadata(&dst).unwrap().ino(), ino);
    assert_eq!(fs::read(&dst).unwrap(), fs::read(&src).unwrap());
}

#[test]
fn delete_dry_run_and_exclude() {
    let d = tempfile::tempdir().unwrap();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    tree(&src);
    fs::write(src.join("skip.tmp"), b"x").unwrap();
    ferry_ok(&["sync", "--exclude", "*.tmp", &slash(&src), p(&dst)]);
    assert!(!dst.join("skip.tmp").exists());
    fs::write(dst.join("extra"), b"x").unwrap();
    fs::create_dir_all(dst.join("extradir/sub")).unwrap();
    fs::write(dst.join("extradir/sub/f"), b"x").unwrap();
    fs::write(dst.join("keep.tmp"), b"excluded, so protected").unwrap();
    // Dry run: reports, changes nothing.
    let out = ferry(&[
        "sync",
        "-n",
        "--delete",
        "--exclude",
        "*.tmp",
        &slash(&src),
        p(&dst),
    ]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("would delete extra"), "{text}");
    assert!(dst.join("extra").exists());
    let j = ferry_ok(&[
        "sync",
        "--delete",
        "--exclude",
        "*.tmp",
        &slash(&src),
        p(&dst),
    ]);
    assert_eq!(j["files_deleted"], 4, "extra, extradir, sub, f: {j}");
    assert!(!dst.join("extra").exists() && !dst.join("extradir").exists());
    assert!(dst.join("keep.tmp").exists());
}

#[test]
fn sparse_image_stays_sparse_and_zero_blocks_become_holes() {
    let d = tempfile::tempdir().unwrap();
    let (src, dst) = (d.path().join("img"), d.path().join("copy"));
    let f = File::create(&src).unwrap();
    let size = 64u64 << 20;
    f.set_len(size).unwrap();
    f.write_all_at(&bytes(5, 1 << 20), 4 << 20).unwrap();
    f.write_all_at(&vec![0u8; 2 << 20], 20 << 20).unwrap(); // written zeros
    f.write_all_at(&bytes(6, 4096), size - 4096).unwrap();
    f.sync_all().unwrap();
    let j = ferry_ok(&["sync", p(&src), p(&dst)]);
    assert_eq!(fs::read(&src).unwrap(), fs::read(&dst).unwrap());
    assert!(
        allocated(&dst) <= allocated(&src) - (2 << 20),
        "{} vs {}",
        allocated(&dst),
        allocated(&src)
    );
    assert_eq!(j["bytes_written"], (1 << 20) + 4096);
    assert!(j["bytes_wire"].as_u64().unwrap() < (1 << 20) + 64 * 1024);
    // Overwriting in place punches holes where the source now has zeros.
    let f = File::options().write(true).open(&src).unwrap();
    f.write_all_at(&vec![0u8; 1 << 20], 4 << 20).unwrap();
    drop(f);
    ferry_ok(&["sync", "--inplace", p(&src), p(&dst)]);
    assert_eq!(fs::read(&src).unwrap(), fs::read(&dst).unwrap());
    assert!(
        allocated(&dst) <= 64 * 1024,
        "holes punched: {}",
        allocated(&dst)
    );
}

#[test]
fn xattrs_are_copied_with_dash_x() {
    let d = tempfile::tempdir().unwrap();
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    fs::create_dir(&src).unwrap();
    let f = src.join("f");
    fs::write(&f, b"x").unwrap();
    let ok = std::process::Command::new("setfattr")
        .args(["-n", "user.ferry", "-v", "yes", p(&f)])
        .status();
    if !matches!(ok, Ok(s) if s.success()) {
        skip("setfattr (package attr) missing or user xattrs unsupported on this filesystem");
        return;
    }
    ferry_ok(&["sync", "-X", &slash(&src), p(&dst)]);
    let out = std::process::Command::new("getfattr")
        .args(["--only-values", "-n", "user.ferry", p(&dst.join("f"))])
        .output()
        .unwrap();
    assert_eq!(out.stdout, b"yes");
}

#[test]
fn errors_name_the_path_and_exit_with_documented_codes() {
    let d = tempfile::tempdir().unwrap();
    // Missing source: I/O error, exit 3.
    let out = ferry(&["sync", p(&d.path().join("nope")), p(&d.path().join("x"))]);
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("nope") && err.contains("no such file"),
        "{err}"
    );
    // Usage error: exit 1.
    let out = ferry(&["sync", "only-one"]);
    assert_eq!(out.status.code(), Some(1));
    let out = ferry(&["sync", "--no-such-flag", "a", "b"]);
    assert_eq!(out.status.code(), Some(1));
    // A file onto a directory: partial (2), the directory untouched.
    let src = d.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("x"), b"file").unwrap();
    fs::write(src.join("y"), b"fine").unwrap();
    let dst = d.path().join("dst");
    fs::create_dir_all(dst.join("x")).unwrap();
    fs::write(dst.join("x/keep"), b"precious").unwrap();
    let out = ferry(&["sync", &slash(&src), p(&dst)]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("directory is in the way"));
    assert_eq!(fs::read(dst.join("x/keep")).unwrap(), b"precious");
    assert_eq!(fs::read(dst.join("y")).unwrap(), b"fine");
    // Several sources onto an existing file: usage error.
    let out = ferry(&[
        "sync",
        p(&src.join("x")),
        p(&src.join("y")),
        p(&dst.join("y")),
    ]);
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn help_documents_exit_codes_and_the_slash_rule() {
    let out = ferry(&["sync", "--help"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("trailing-slash"));
    let out = ferry(&["--help"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Exit codes") && text.contains("partial transfer"));
}

/// A disk that fills up: clear error, exit 3, the old file intact, no temp
/// file left. Needs root to mount a small tmpfs.
#[test]
fn full_disk_keeps_the_old_file() {
    if !is_root() {
        skip("full_disk_keeps_the_old_file needs root to mount a tmpfs");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let mnt = d.path().join("small");
    fs::create_dir(&mnt).unwrap();
    let st = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4m", "tmpfs", p(&mnt)])
        .status();
    if !matches!(st, Ok(s) if s.success()) {
        skip("full_disk_keeps_the_old_file: cannot mount tmpfs here");
        return;
    }
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(self.0).status();
        }
    }
    let _u = Unmount(&mnt);
    let dst = mnt.join("big.bin");
    fs::write(&dst, b"old contents").unwrap();
    let src = d.path().join("big.bin");
    fs::write(&src, bytes(7, 6 << 20)).unwrap();
    let out = ferry(&["sync", p(&src), p(&dst)]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("no space left"), "{err}");
    assert_eq!(fs::read(&dst).unwrap(), b"old contents");
    assert!(temp_files(&mnt).is_empty(), "{:?}", temp_files(&mnt));
}

/// A loop device over a file, detached (by name) when dropped.
struct LoopDevice(String);

impl LoopDevice {
    fn attach(backing: &Path) -> Option<LoopDevice> {
        let o = std::process::Command::new("losetup")
            .args(["--find", "--show", p(backing)])
            .output()
            .ok()
            .filter(|o| o.status.success())?;
        Some(LoopDevice(
            String::from_utf8_lossy(&o.stdout).trim().to_string(),
        ))
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup")
            .args(["-d", &self.0])
            .status();
    }
}

/// Writing an image onto a block device (a loop device), in place.
#[test]
fn block_device_destination() {
    if !is_root() {
        skip("block_device_destination needs root for losetup");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let backing = d.path().join("backing");
    let bf = File::create(&backing).unwrap();
    bf.set_len(16 << 20).unwrap();
    bf.write_all_at(&vec![0xAAu8; 16 << 20], 0).unwrap();
    drop(bf);
    let Some(g) = LoopDevice::attach(&backing) else {
        skip("block_device_destination: no loop devices here");
        return;
    };
    let dev = g.0.clone();
    let img = d.path().join("img");
    let f = File::create(&img).unwrap();
    f.set_len(8 << 20).unwrap();
    f.write_all_at(&bytes(8, 1 << 20), 1 << 20).unwrap();
    drop(f);
    ferry_ok(&["sync", p(&img), &dev]);
    let mut got = vec![0u8; 8 << 20];
    File::open(&dev)
        .unwrap()
        .read_exact_at(&mut got, 0)
        .unwrap();
    assert!(
        got == fs::read(&img).unwrap(),
        "device holds the image, zeros included"
    );
}

/// `--partial-dir`: a copy onto a block device that is killed keeps its
/// journal there, and the next run re-hashes what the device holds and
/// sends only the rest.
#[test]
fn an_interrupted_copy_onto_a_device_resumes_with_partial_dir() {
    if !is_root() {
        skip("an_interrupted_copy_onto_a_device_resumes_with_partial_dir needs root for losetup");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let backing = d.path().join("backing");
    File::create(&backing).unwrap().set_len(320 << 20).unwrap();
    let g = LoopDevice::attach(&backing).expect("losetup --find --show");
    let dev = g.0.clone();
    let img = d.path().join("img");
    fs::write(&img, bytes(11, 256 << 20)).unwrap();
    let jdir = d.path().join("journals");
    fs::create_dir(&jdir).unwrap();
    // 100 MiB/s: about 2.6 s for the image; killed after 1.8 s, past the
    // first journal appends (every 64 MiB).
    killed_after(
        &[
            "sync",
            "-q",
            "--bwlimit",
            "100M",
            "--partial-dir",
            p(&jdir),
            p(&img),
            &dev,
        ],
        1800,
    );
    let journal = jdir.join(format!("{}.ferry-journal", dev.replace('/', "_")));
    assert!(journal.exists(), "no journal in --partial-dir");
    let j = ferry_ok(&["sync", "--partial-dir", p(&jdir), p(&img), &dev]);
    let resumed = j["bytes_resumed"].as_u64().unwrap();
    assert!(resumed >= 64 << 20, "resumed only {resumed} bytes: {j}");
    assert_eq!(
        j["bytes_written"].as_u64().unwrap() + resumed,
        256 << 20,
        "{j}"
    );
    let mut got = vec![0u8; 256 << 20];
    File::open(&dev)
        .unwrap()
        .read_exact_at(&mut got, 0)
        .unwrap();
    assert!(
        got == fs::read(&img).unwrap(),
        "device differs from the image"
    );
    assert!(!journal.exists(), "journal left after the copy completed");
}

#[test]
fn many_files_in_flight_under_a_low_open_file_limit() {
    // Every file in flight holds a temp file (and, from 256 KiB, its
    // O_DIRECT twin) open. ferry raises the soft limit to the hard one, so
    // a soft limit of 64 must not make 200 such files fail with EMFILE; and
    // under a hard limit of 64 it keeps few enough files open at once.
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    fs::create_dir(&src).unwrap();
    for i in 0..200u64 {
        fs::write(src.join(format!("f{i:03}")), bytes(i, 300_000)).unwrap();
    }
    for (k, limit) in ["ulimit -S -n 64", "ulimit -n 64"].iter().enumerate() {
        let dst = d.path().join(format!("dst{k}"));
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("{limit} && exec \"$0\" sync \"$1/\" \"$2/\""))
            .arg(ferry_bin())
            .arg(&src)
            .arg(&dst)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{limit}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        for i in 0..200u64 {
            let name = format!("f{i:03}");
            assert!(
                fs::read(dst.join(&name)).unwrap() == fs::read(src.join(&name)).unwrap(),
                "{limit}: {name}"
            );
        }
    }
}

/// `--verify` reads every written file back and checks it: a tree with a
/// big file, a sparse one and small ones lands intact locally, in place
/// and as a delta, and says so with exit 0.
#[test]
fn verify_reads_back_and_passes_on_good_storage() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    fs::create_dir_all(src.join("sub")).unwrap();
    fs::write(src.join("big.bin"), bytes(3, 20 << 20)).unwrap();
    fs::write(src.join("sub/small.txt"), b"small").unwrap();
    let sparse = File::create(src.join("sparse.img")).unwrap();
    sparse.set_len(32 << 20).unwrap();
    sparse.write_all_at(&bytes(4, 1 << 20), 9 << 20).unwrap();
    let dst = d.path().join("dst");
    for extra in [
        &[][..],
        &["--inplace"][..],
        &["--delta"][..],
        &["--no-fsync"][..],
    ] {
        let mut args = vec!["sync", "--verify"];
        args.extend_from_slice(extra);
        let src_slash = format!("{}/", p(&src));
        args.extend_from_slice(&[&src_slash, p(&dst)]);
        // Change the big file a little each round, so there is work.
        let mut b = fs::read(src.join("big.bin")).unwrap();
        b[5 << 20] ^= 0xff;
        fs::write(src.join("big.bin"), &b).unwrap();
        let out = ferry(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{extra:?}: {err}");
        for f in ["big.bin", "sub/small.txt", "sparse.img"] {
            assert_eq!(
                fs::read(dst.join(f)).unwrap(),
                fs::read(src.join(f)).unwrap(),
                "{extra:?}: {f}"
            );
        }
    }
}

/// A terabyte of holes around a few pieces: the holes cross as runs (a
/// few bytes on the wire, not one message per 8 MiB), end as holes, are
/// zeroed in place where the old copy had data, and a read-back
/// (`--verify`) skips them rather than reading a terabyte of zeros.
#[test]
fn a_terabyte_of_holes_crosses_as_runs() {
    let d = tempfile::tempdir().unwrap();
    let (src, dst) = (d.path().join("big.img"), d.path().join("copy.img"));
    let size = 1u64 << 40;
    let pieces = vec![
        (0, bytes(11, 5000)),
        (300 << 30, bytes(12, 200_000)),
        (size - 4096, bytes(13, 4096)),
    ];
    sparse_file(&src, size, &pieces);
    let j = ferry_ok(&["sync", "--verify", p(&src), p(&dst)]);
    holds_only(&dst, size, &pieces);
    assert!(allocated(&dst) < 4 << 20, "allocated {}", allocated(&dst));
    // 131,072 segments; one message each would be megabytes.
    let wire = j["bytes_wire"].as_u64().unwrap();
    assert!(wire < 209_096 + 65_536, "{wire} bytes on the wire: {j}");
    // In place over an old copy with data where the source has holes:
    // zeroed (punched), the pieces rewritten.
    let f = File::options().write(true).open(&dst).unwrap();
    f.write_all_at(&bytes(14, 1 << 20), 500 << 30).unwrap();
    f.write_all_at(&bytes(15, 4096), 300 << 30).unwrap();
    drop(f);
    set_mtime(&src, (1_700_000_000, 0));
    ferry_ok(&["sync", "--inplace", "--whole-file", p(&src), p(&dst)]);
    holds_only(&dst, size, &pieces);
    assert!(allocated(&dst) < 4 << 20, "allocated {}", allocated(&dst));
}
