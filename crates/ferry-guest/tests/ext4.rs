//! ext2/3/4 on real images made by mke2fs and changed by debugfs (and the
//! kernel): the free ranges must be exactly what dumpe2fs lists, and never
//! a block a file still uses.

mod ext4_tools;

use std::fs::{self, File};

use ext4_tools::*;
use ferry_guest::ext4::free_ranges;
use ferry_guest::map::FsMap;
use ferry_guest::FsError;
use tempfile::TempDir;

#[test]
fn ext4_with_deleted_files_matches_dumpe2fs() {
    let dir = TempDir::new().unwrap();
    let (content, files) = content(&dir);
    let img = dir.path().join("img");
    mkfs(&img, "64M", "mkfs.ext4", &[], Some(&content));
    let before = map(&img);
    check_against_dumpe2fs(&img, &before);
    let gone: Vec<Vec<u64>> = ["a", "sub/d"]
        .iter()
        .map(|f| file_blocks(&img, f))
        .collect();
    for f in ["a", "sub/d"] {
        run(
            "debugfs",
            &["-w", "-R", &format!("rm /{f}"), path_str(&img)],
        );
    }
    let m = map(&img);
    assert_eq!(m.kind, "ext4");
    assert!(m.in_use.is_none(), "{:?}", m.in_use);
    let d = check_against_dumpe2fs(&img, &m);
    let bs = d.block_size;
    // The deleted files' blocks are free now (their data is still there).
    let freed: u64 = gone.iter().map(|v| v.len() as u64).sum();
    assert!(freed * bs >= 5 << 20);
    assert!(m.free.total() >= before.free.total() + freed * bs);
    for v in &gone {
        for &b in v {
            assert!(m
                .free
                .first_ending_after(b * bs)
                .is_some_and(|r| r.0 <= b * bs));
        }
    }
    for f in files.iter().filter(|f| !["a", "sub/d"].contains(f)) {
        assert_misses(&m, &file_blocks(&img, f), bs, f);
    }
    eprintln!(
        "64 MiB ext4, 2 files deleted: {} of {} bytes free ({} groups)",
        m.free.total(),
        fs::metadata(&img).unwrap().len(),
        d.groups
    );
}

/// mke2fs with `opts`, filled with the content, one file deleted: the map
/// is dumpe2fs's free list, the kept files' blocks are not in it.
fn variant(prog: &str, size: &str, opts: &[&str], kind: &str) -> (FsMap, Dump) {
    let dir = TempDir::new().unwrap();
    let (content, files) = content(&dir);
    let img = dir.path().join("img");
    mkfs(&img, size, prog, opts, Some(&content));
    run("debugfs", &["-w", "-R", "rm /sub/c", path_str(&img)]);
    let m = map(&img);
    assert_eq!(m.kind, kind, "{prog} {opts:?}");
    assert!(m.in_use.is_none(), "{prog} {opts:?}: {:?}", m.in_use);
    let d = check_against_dumpe2fs(&img, &m);
    for f in files.iter().filter(|&&f| f != "sub/c") {
        assert_misses(&m, &file_blocks(&img, f), d.block_size, f);
    }
    assert!(
        m.free.total() > 20 << 20,
        "{prog} {opts:?}: {}",
        m.free.total()
    );
    (m, d)
}

#[test]
fn ext2_and_ext3() {
    variant("mkfs.ext2", "64M", &[], "ext2");
    variant(
        "mkfs.ext2",
        "64M",
        &["-O", "^sparse_super,^resize_inode"],
        "ext2",
    );
    variant("mkfs.ext2", "64M", &["-b", "4096", "-g", "4096"], "ext2");
    variant("mkfs.ext3", "64M", &[], "ext3");
    variant("mkfs.ext3", "64M", &["-O", "meta_bg,^resize_inode"], "ext3");
}

#[test]
fn ext4_layouts() {
    for opts in [
        &["-O", "^flex_bg"][..],
        &["-O", "^64bit"],
        &["-O", "meta_bg,^resize_inode"],
        &["-O", "sparse_super2"],
        &["-E", "desc_size=128"],
        &["-O", "inline_data,quota,project,orphan_file"],
    ] {
        variant("mkfs.ext4", "64M", opts, "ext4");
    }
}

#[test]
fn ext4_block_and_group_sizes() {
    for opts in [
        &["-b", "4096"][..],
        &["-b", "2048", "-g", "2048", "-I", "128"],
        &["-b", "65536"],
        &["-G", "2", "-g", "1024"],
    ] {
        variant("mkfs.ext4", "64M", opts, "ext4");
    }
}

#[test]
fn ext4_checksum_kinds() {
    // crc16 descriptors (uninit_bg), and none at all: BLOCK_UNINIT only
    // with a checksum.
    let (_, d) = variant(
        "mkfs.ext4",
        "64M",
        &["-O", "^metadata_csum,uninit_bg"],
        "ext4",
    );
    assert!(d.uninit_groups > 0);
    let (_, d) = variant(
        "mkfs.ext4",
        "64M",
        &["-O", "^metadata_csum,^uninit_bg"],
        "ext4",
    );
    assert_eq!(d.uninit_groups, 0);
    variant(
        "mkfs.ext4",
        "64M",
        &["-O", "^metadata_csum,uninit_bg,^64bit"],
        "ext4",
    );
    // A checksum seed of its own: the UUID changed after mkfs.
    let dir = TempDir::new().unwrap();
    let img = dir.path().join("img");
    mkfs(
        &img,
        "64M",
        "mkfs.ext4",
        &["-O", "metadata_csum_seed"],
        None,
    );
    run("tune2fs", &["-U", "random", path_str(&img)]);
    check_against_dumpe2fs(&img, &map(&img));
}

#[test]
fn big_sparse_images_with_uninit_groups() {
    let dir = TempDir::new().unwrap();
    let img = dir.path().join("img");
    for opts in [
        &[][..],
        &["-b", "1024", "-O", "meta_bg,^resize_inode"],
        &["-b", "1024", "-O", "meta_bg,^resize_inode,^64bit"],
        &["-b", "1024", "-O", "^flex_bg"],
    ] {
        mkfs(&img, "2G", "mkfs.ext4", opts, None);
        let m = map(&img);
        let d = check_against_dumpe2fs(&img, &m);
        assert!(
            d.uninit_groups * 2 > d.groups,
            "{opts:?}: {} of {}",
            d.uninit_groups,
            d.groups
        );
        assert!(m.free.total() > 1900 << 20, "{opts:?}");
    }
}

#[test]
fn written_by_the_kernel_after_a_resize() {
    // Grown by resize2fs (new groups BLOCK_UNINIT), then written and
    // partly deleted by the kernel: while mounted the journal needs
    // recovery (in use); after umount the map is dumpe2fs's again.
    let dir = TempDir::new().unwrap();
    let img = dir.path().join("img");
    let mnt = dir.path().join("mnt");
    mkfs(&img, "64M", "mkfs.ext4", &[], None);
    File::options()
        .write(true)
        .open(&img)
        .unwrap()
        .set_len(512 << 20)
        .unwrap();
    run("resize2fs", &[path_str(&img)]);
    check_against_dumpe2fs(&img, &map(&img));
    let mounted = Mounted::new(&img, &mnt);
    for i in 0..6 {
        random_file(&mnt.join(format!("f{i}")), 9 << 20, i);
    }
    fs::remove_file(mnt.join("f1")).unwrap();
    fs::remove_file(mnt.join("f4")).unwrap();
    run("sync", &[]);
    // The kernel may still be writing: the maps may not check out, but if
    // they do the filesystem says it is in use.
    match free_ranges(&Img::open(&img)) {
        Ok(m) => {
            let why = m.in_use.expect("a mounted ext4 is in use");
            assert!(why.contains("recovery"), "{why}");
        }
        Err(FsError::Corrupt { why, .. }) => eprintln!("mounted: {why}"),
        Err(e) => panic!("mounted: {e}"),
    }
    mounted.umount();
    let m = map(&img);
    assert!(m.in_use.is_none(), "{:?}", m.in_use);
    let d = check_against_dumpe2fs(&img, &m);
    for f in ["f0", "f2", "f3", "f5"] {
        assert_misses(&m, &file_blocks(&img, f), d.block_size, f);
    }
}

#[test]
fn grown_offline_past_its_reserved_descriptor_blocks() {
    // No resize_inode: resize2fs has to move the metadata after the
    // descriptor table to grow it.
    let dir = TempDir::new().unwrap();
    let (content, files) = content(&dir);
    let img = dir.path().join("img");
    mkfs(
        &img,
        "64M",
        "mkfs.ext4",
        &["-O", "^resize_inode"],
        Some(&content),
    );
    File::options()
        .write(true)
        .open(&img)
        .unwrap()
        .set_len(3 << 30)
        .unwrap();
    run("resize2fs", &[path_str(&img)]);
    let m = map(&img);
    let d = check_against_dumpe2fs(&img, &m);
    assert!(d.groups > 300);
    for f in &files {
        assert_misses(&m, &file_blocks(&img, f), d.block_size, f);
    }
}

#[test]
fn map_image_takes_a_bare_ext4() {
    use ferry_guest::{map_image, GuestError, MapOptions, RegionKind};
    let dir = TempDir::new().unwrap();
    let img = image(&dir, "mkfs.ext4", &[]);
    let want = map(&img).free;
    let g = map_image(&Img::open(&img), &MapOptions::default()).unwrap();
    assert_eq!(g.free, want);
    assert_eq!(
        g.regions[0].kind,
        RegionKind::Mapped {
            kind: "ext4",
            free: want.total()
        }
    );
    // In use: refused unless forced; forced, copied whole (the maps may
    // miss what the journal holds).
    run(
        "debugfs",
        &["-w", "-R", "feature needs_recovery", path_str(&img)],
    );
    let e = map_image(&Img::open(&img), &MapOptions::default()).unwrap_err();
    assert!(matches!(e, GuestError::InUse { what: "ext4", .. }), "{e}");
    let g = map_image(&Img::open(&img), &MapOptions { force: true }).unwrap();
    assert!(g.free.is_empty());
    assert!(matches!(&g.regions[0].kind, RegionKind::Whole { why } if why.contains("ext4")));
}
