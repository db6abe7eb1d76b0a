//! `--sparsify` and tar members, end to end: images made by the real tools
//! (ext4 through `mkfs.ext4 -d` and `debugfs`, partition tables through
//! `sgdisk`/`sfdisk`, swap through `mkswap`, XFS through `mkfs.xfs` and a
//! loop mount), copied by the real binary locally, over a real sshd and
//! from a real NBD server, then checked by `e2fsck -fn` / `xfs_repair -n`,
//! file by file, and block by block where the guest had freed them.

mod common;
#[path = "sparsify/images.rs"]
mod images;

use std::fs;
use std::path::Path;
use std::process::Command;

use common::*;
use images::*;

const TOOLS: &[&str] = &["mkfs.ext4", "debugfs", "e2fsck", "dumpe2fs"];

fn tools(test: &str, more: &[&str]) -> bool {
    TOOLS.iter().chain(more).all(|t| need(t, test))
}

/// The notices of a `--json` summary, one string.
fn notices(v: &serde_json::Value) -> String {
    v["notices"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|n| n.as_str())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

/// An ext4 image of 64 MiB with two files kept and two deleted (their
/// blocks freed, their bytes still there): the image, the deleted files'
/// blocks, and the kept files.
/// Files by name and content.
type Files = Vec<(&'static str, Vec<u8>)>;

fn guest(dir: &Path) -> (std::path::PathBuf, Vec<u64>, Files) {
    let files = vec![
        ("keep1", bytes(1, 3 << 20)),
        ("keep2", bytes(2, (1 << 20) + 123)),
        ("gone1", bytes(3, 8 << 20)),
        ("gone2", bytes(4, 4 << 20)),
    ];
    let img = ext4(dir, "disk.img", 64, &files, &[]);
    let mut freed = blocks(&img, "gone1");
    freed.extend(blocks(&img, "gone2"));
    rm(&img, "gone1");
    rm(&img, "gone2");
    let kept = files
        .into_iter()
        .filter(|f| f.0.starts_with("keep"))
        .collect();
    (img, freed, kept)
}

/// The copy is a clean filesystem with every kept file, and the freed
/// blocks are holes.
fn check_copy(out: &Path, dir: &Path, freed: &[u64], kept: &[(&str, Vec<u8>)]) {
    fsck_clean(out);
    for (name, data) in kept {
        assert!(
            dump(out, dir, name) == *data,
            "{name} differs in {}",
            out.display()
        );
    }
    assert!(
        all_zero(out, 0, freed),
        "freed blocks were copied into {}",
        out.display()
    );
}

#[test]
fn freed_blocks_of_an_ext4_image_are_not_copied() {
    if !tools("freed_blocks_of_an_ext4_image_are_not_copied", &[]) {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (img, freed, kept) = guest(t.path());
    assert!(
        none_zero(&img, 0, &freed),
        "the test needs the deleted bytes on disk"
    );
    let out = t.path().join("out.img");
    let v = ferry_ok(&["sync", "--sparsify", p(&img), p(&out)]);
    check_copy(&out, t.path(), &freed, &kept);
    let n = notices(&v);
    assert!(n.contains("ext4") && n.contains("skipped"), "summary: {n}");
    // What was written: the kept files and the metadata, not the 12 MiB
    // the guest deleted.
    let written = v["bytes_written"].as_u64().unwrap();
    assert!(written < 8 << 20, "wrote {written} bytes");
    assert!(allocated(&out) + (11 << 20) < allocated(&img));
    // Without --sparsify the copy is the image, deleted bytes and all.
    let plain = t.path().join("plain.img");
    ferry_ok(&["sync", p(&img), p(&plain)]);
    assert!(fs::read(&plain).unwrap() == fs::read(&img).unwrap());

    // A re-run moves nothing; after a change in the guest, only the change.
    let v = ferry_ok(&["sync", "--sparsify", p(&img), p(&out)]);
    assert_eq!(v["bytes_written"].as_u64(), Some(0));
    let new = bytes(9, 2 << 20);
    add(&img, t.path(), "new", &new);
    let v = ferry_ok(&["sync", "--sparsify", "--delta", p(&img), p(&out)]);
    check_copy(&out, t.path(), &freed_still_free(&img, &freed), &kept);
    assert!(dump(&out, t.path(), "new") == new);
    // The 2 MiB file, the metadata it changed and the signature: not the
    // 4 MiB kept, nor the 12 MiB freed.
    let wire = v["bytes_wire"].as_u64().unwrap();
    assert!(
        wire < 7 << 19,
        "the re-run after a 2 MiB change moved {wire} bytes"
    );
}

/// The blocks of `freed` that the guest has not used again since.
fn freed_still_free(img: &Path, freed: &[u64]) -> Vec<u64> {
    let used = blocks(img, "new");
    freed
        .iter()
        .copied()
        .filter(|b| !used.contains(b))
        .collect()
}

#[test]
fn sparsify_over_ssh_push_and_pull() {
    let test = "sparsify_over_ssh_push_and_pull";
    if !tools(test, &[]) {
        return;
    }
    let Some(server) = SshServer::start(test) else {
        return;
    };
    let t = tempfile::tempdir().unwrap();
    let (img, freed, kept) = guest(t.path());
    let rsh = server.rsh();
    let bin = ferry_bin();
    let pushed = t.path().join("pushed.img");
    let v = ferry_ok(&[
        "sync",
        "--sparsify",
        "-e",
        &rsh,
        "--remote-ferry",
        p(&bin),
        p(&img),
        &server.remote(&pushed),
    ]);
    check_copy(&pushed, t.path(), &freed, &kept);
    assert!(v["bytes_wire"].as_u64().unwrap() < 8 << 20, "{v}");
    let pulled = t.path().join("pulled.img");
    ferry_ok(&[
        "sync",
        "--sparsify",
        "-e",
        &rsh,
        "--remote-ferry",
        p(&bin),
        &server.remote(&img),
        p(&pulled),
    ]);
    check_copy(&pulled, t.path(), &freed, &kept);
}

/// A GPT disk: an ext4 partition with a deleted file, a swap partition, a
/// partition of unknown type full of data; and the same layout in MBR with
/// the ext4 one as a logical partition.
#[test]
fn partitions_ext4_swap_and_unknown() {
    let test = "partitions_ext4_swap_and_unknown";
    if !tools(test, &["sgdisk", "sfdisk", "mkswap"]) {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (fs_img, freed, kept) = guest(t.path());
    let swap = t.path().join("swap");
    fs::write(&swap, bytes(5, 8 << 20)).unwrap();
    run(Command::new("mkswap").arg("-q").arg(&swap));
    let other = bytes(6, 4 << 20);
    let mib = 1u64 << 20;
    for scheme in ["gpt", "mbr"] {
        let disk = t.path().join(format!("{scheme}.img"));
        fs::File::create(&disk).unwrap().set_len(80 * mib).unwrap();
        // GPT: ext4 at 1 MiB (64 MiB), swap at 65 MiB (8 MiB), other at
        // 73 MiB. MBR: other is primary 1 at 75 MiB; the extended
        // partition 2 holds logical 5 (ext4 at 1 MiB) and logical 6 (swap at
        // 66 MiB, its EBR before it).
        let (swap_at, other_at) = if scheme == "gpt" {
            run(Command::new("sgdisk")
                .args(["-n", "1:2048:133119", "-t", "1:8300"])
                .args(["-n", "2:133120:149503", "-t", "2:8200"])
                .args(["-n", "3:149504:157695", "-t", "3:0700"])
                .arg(&disk));
            (65 * mib, 73 * mib)
        } else {
            sfdisk(
                &disk,
                "label: dos\n\
                 start=153600, size=8192, type=7\n\
                 start=2047, size=151553, type=5\n\
                 start=2048, size=131072, type=83\n\
                 start=135168, size=16384, type=82\n",
            );
            (66 * mib, 75 * mib)
        };
        put(&disk, mib, &fs_img);
        put(&disk, swap_at, &swap);
        write_at(&disk, other_at, &other);
        let out = t.path().join(format!("{scheme}-out.img"));
        let v = ferry_ok(&["sync", "--sparsify", p(&disk), p(&out)]);
        let n = notices(&v);
        assert!(n.contains("ext4") && n.contains("swap"), "{scheme}: {n}");
        assert!(n.contains("copied whole"), "{scheme}: {n}");
        // The table, the unknown partition and the swap header as they were.
        assert!(read_at(&out, 0, mib as usize) == read_at(&disk, 0, mib as usize));
        assert!(
            read_at(&out, other_at, 4 << 20) == other,
            "{scheme}: unknown partition"
        );
        assert!(read_at(&out, swap_at, 4096) == read_at(&swap, 0, 4096));
        assert!(read_at(&out, swap_at + 4096, (8 << 20) - 4096)
            .iter()
            .all(|&b| b == 0));
        if scheme == "mbr" {
            // The EBR of logical 6 (in the gap before it) as it was.
            let gap = read_at(&disk, 65 * mib, mib as usize);
            assert!(gap.iter().any(|&b| b != 0), "the EBR is in the gap");
            assert!(read_at(&out, 65 * mib, mib as usize) == gap);
        }
        if scheme == "gpt" {
            let tail = 79 * mib;
            assert!(read_at(&out, tail, mib as usize) == read_at(&disk, tail, mib as usize));
            run(Command::new("sgdisk").arg("-v").arg(&out));
        }
        // The ext4 partition, cut out: clean, every file, freed blocks holes.
        let part = t.path().join(format!("{scheme}-part1.img"));
        fs::write(&part, read_at(&out, mib, (64 * mib) as usize)).unwrap();
        check_copy(&part, t.path(), &freed, &kept);
    }
}

fn sfdisk(disk: &Path, layout: &str) {
    use std::io::Write;
    let mut c = Command::new("sfdisk")
        .args(["-q", "--no-reread", "--no-tell-kernel"])
        .arg(disk)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    c.stdin
        .take()
        .unwrap()
        .write_all(layout.as_bytes())
        .unwrap();
    assert!(c.wait().unwrap().success(), "sfdisk {layout}");
}

/// Damaged or truncated filesystems are copied whole, byte for byte.
#[test]
fn damaged_filesystems_are_copied_whole() {
    if !tools("damaged_filesystems_are_copied_whole", &[]) {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (img, _, _) = guest(t.path());
    // A bitmap whose checksum no longer matches (metadata_csum is mke2fs's
    // default): one bit of group 0's bitmap flipped.
    let bad = t.path().join("bad.img");
    fs::copy(&img, &bad).unwrap();
    let at = bitmap_block(&bad) * 4096 + 2000;
    let b = read_at(&bad, at, 1)[0];
    write_at(&bad, at, &[b ^ 0x10]);
    // A truncated image: the filesystem says it is longer.
    let short = t.path().join("short.img");
    fs::write(&short, read_at(&img, 0, 40 << 20)).unwrap();
    // A damaged superblock: a block count beyond the image.
    let sb = t.path().join("sb.img");
    fs::copy(&img, &sb).unwrap();
    write_at(&sb, 1024 + 4, &u32::MAX.to_le_bytes());
    for src in [&bad, &short, &sb] {
        let out = t.path().join("whole.img");
        let _ = fs::remove_file(&out);
        let v = ferry_ok(&["sync", "--sparsify", p(src), p(&out)]);
        assert!(
            notices(&v).contains("copied whole"),
            "{}: {v}",
            src.display()
        );
        assert!(
            fs::read(&out).unwrap() == fs::read(src).unwrap(),
            "{}",
            src.display()
        );
    }
}

/// An image attached to a loop device (it may be mounted) is refused
/// unless --force.
#[test]
fn an_image_in_use_is_refused_unless_forced() {
    let test = "an_image_in_use_is_refused_unless_forced";
    if !tools(test, &["losetup"]) {
        return;
    }
    if !is_root() {
        skip(&format!("{test}: attaching a loop device needs root"));
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (img, freed, kept) = guest(t.path());
    let out = t.path().join("out.img");
    let lo = Loop::attach(&img);
    let r = ferry(&["sync", "--sparsify", p(&img), p(&out)]);
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(!r.status.success(), "copied an attached image");
    assert!(err.contains("in use") && err.contains(&lo.0), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(!out.exists());
    // The loop device itself is a block device that is not mounted: fine.
    let dev_out = t.path().join("dev-out.img");
    ferry_ok(&["sync", "--sparsify", &lo.0, p(&dev_out)]);
    check_copy(&dev_out, t.path(), &freed, &kept);
    ferry_ok(&["sync", "--sparsify", "--force", p(&img), p(&out)]);
    check_copy(&out, t.path(), &freed, &kept);
}

/// An image a virtual machine runs on (QEMU holds locks on it; here a
/// writable qemu-nbd, which takes the same locks) is refused unless
/// --force.
#[test]
fn an_image_qemu_holds_is_refused_unless_forced() {
    let test = "an_image_qemu_holds_is_refused_unless_forced";
    if !tools(test, &["qemu-nbd"]) {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (img, freed, kept) = guest(t.path());
    let sock = t.path().join("held.sock");
    let srv = QemuNbd::start(&img, &sock, false);
    let out = t.path().join("out.img");
    let r = ferry(&["sync", "--sparsify", p(&img), p(&out)]);
    let forced = ferry(&["sync", "--sparsify", "--force", p(&img), p(&out)]);
    drop(srv);
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(!r.status.success() && err.contains("lock"), "{err}");
    assert!(
        forced.status.success(),
        "{}",
        String::from_utf8_lossy(&forced.stderr)
    );
    check_copy(&out, t.path(), &freed, &kept);
}

/// A block device as the destination: the blocks the guest does not use
/// are left as they were (here a pattern), unless --discard; either way
/// the filesystem is clean, every file is there and --verify passes.
#[test]
fn a_device_keeps_its_unused_blocks_unless_discard() {
    let test = "a_device_keeps_its_unused_blocks_unless_discard";
    if !tools(test, &["losetup"]) {
        return;
    }
    if !is_root() {
        skip(&format!("{test}: a loop device needs root"));
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (img, freed, kept) = guest(t.path());
    let backing = t.path().join("device.img");
    fs::write(&backing, vec![0xaa_u8; 64 << 20]).unwrap();
    let dev = Loop::attach(&backing);
    let patterned = |b: &u64| read_at(&backing, b * 4096, 4096).iter().all(|&x| x == 0xaa);
    ferry_ok(&["sync", "--sparsify", "--verify", p(&img), &dev.0]);
    let dev_path = Path::new(&dev.0);
    fsck_clean(dev_path);
    for (name, data) in &kept {
        assert!(dump(dev_path, t.path(), name) == *data, "{name}");
    }
    assert!(
        freed.iter().all(patterned),
        "unused blocks were written without --discard"
    );
    ferry_ok(&[
        "sync",
        "--sparsify",
        "--discard",
        "--verify",
        p(&img),
        &dev.0,
    ]);
    fsck_clean(dev_path);
    assert!(
        all_zero(&backing, 0, &freed),
        "--discard left unused blocks"
    );
}

/// A disk image inside a tar (an OVA) read in place, with and without
/// --sparsify, locally and pulled over ssh; clear errors for a missing
/// member and a compressed archive.
#[test]
fn a_tar_member_is_read_in_place() {
    let test = "a_tar_member_is_read_in_place";
    if !tools(test, &["tar", "gzip"]) {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (img, freed, kept) = guest(t.path());
    fs::write(t.path().join("vm.ovf"), b"<Envelope/>").unwrap();
    let tar = t.path().join("vm.ova");
    run(Command::new("tar")
        .arg("-C")
        .arg(t.path())
        .args(["--format=ustar", "-cf"])
        .arg(&tar)
        .args(["vm.ovf", "disk.img"]));
    let dest = t.path().join("dest");
    fs::create_dir(&dest).unwrap();
    let member = format!("{}#disk.img", tar.display());
    ferry_ok(&["sync", &member, &slash(&dest)]);
    assert!(fs::read(dest.join("disk.img")).unwrap() == fs::read(&img).unwrap());
    let out = t.path().join("member-sparse.img");
    ferry_ok(&["sync", "--sparsify", &member, p(&out)]);
    check_copy(&out, t.path(), &freed, &kept);

    let r = ferry(&["sync", &format!("{}#nope.img", tar.display()), p(&dest)]);
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(
        !r.status.success() && err.contains("nope.img") && err.contains("disk.img"),
        "{err}"
    );
    run(Command::new("gzip").arg("-k").arg(&tar));
    let gz = format!("{}.gz#disk.img", tar.display());
    let r = ferry(&["sync", &gz, p(&dest)]);
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(!r.status.success() && err.contains("gzip"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");

    let Some(server) = SshServer::start(test) else {
        return;
    };
    let pulled = t.path().join("pulled.img");
    let remote = format!("{}#disk.img", server.remote(&tar));
    let (rsh, bin) = (server.rsh(), ferry_bin());
    ferry_ok(&[
        "sync",
        "--sparsify",
        "-e",
        &rsh,
        "--remote-ferry",
        p(&bin),
        &remote,
        p(&pulled),
    ]);
    check_copy(&pulled, t.path(), &freed, &kept);
}

/// An NBD export (a real qemu-nbd) mapped through its guest.
#[test]
fn an_nbd_export_is_sparsified() {
    let test = "an_nbd_export_is_sparsified";
    if !tools(test, &["qemu-nbd"]) {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (img, freed, kept) = guest(t.path());
    let sock = t.path().join("nbd.sock");
    let srv = QemuNbd::start(&img, &sock, true);
    let out = t.path().join("out.img");
    let uri = format!("nbd+unix:///?socket={}", sock.display());
    let r = ferry(&["sync", "--sparsify", "--json", &uri, p(&out)]);
    drop(srv);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    check_copy(&out, t.path(), &freed, &kept);
}

/// XFS, populated and half deleted through a loop mount (root).
#[test]
fn freed_blocks_of_an_xfs_image_are_not_copied() {
    let test = "freed_blocks_of_an_xfs_image_are_not_copied";
    if !tools(test, &["mkfs.xfs", "xfs_repair", "mount"]) {
        return;
    }
    if !is_root() {
        skip(&format!("{test}: mounting an XFS image needs root"));
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("xfs.img");
    fs::File::create(&img).unwrap().set_len(320 << 20).unwrap();
    run(Command::new("mkfs.xfs").args(["-q", "-f"]).arg(&img));
    let files: Vec<(String, Vec<u8>)> = (0..8)
        .map(|i| {
            (
                format!("f{i}"),
                bytes(20 + i, (3 << 20) + i as usize * 4096),
            )
        })
        .collect();
    {
        let m = Mount::new(&img, &t.path().join("mnt"), false);
        for (n, d) in &files {
            fs::write(m.0.join(n), d).unwrap();
        }
        run(&mut Command::new("sync"));
        for (n, _) in files.iter().step_by(2) {
            fs::remove_file(m.0.join(n)).unwrap();
        }
    }
    xfs_settle(&img, &t.path().join("mnt"));
    let out = t.path().join("out.img");
    let v = ferry_ok(&["sync", "--sparsify", p(&img), p(&out)]);
    assert!(notices(&v).contains("xfs"), "{v}");
    run(Command::new("xfs_repair").arg("-n").arg(&out));
    let m = Mount::new(&out, &t.path().join("mnt-out"), true);
    for (i, (n, d)) in files.iter().enumerate() {
        let got = fs::read(m.0.join(n));
        if i % 2 == 0 {
            assert!(got.is_err(), "{n} was deleted");
        } else {
            assert!(got.unwrap() == *d, "{n} differs");
        }
    }
    drop(m);
    let written = v["bytes_written"].as_u64().unwrap();
    assert!(
        written < 20 << 20,
        "wrote {written} bytes for 12 MiB of files"
    );
}
