//! ext2/3/4 images that must not be mapped: corrupted ones (Corrupt,
//! NotThis, Unsupported), ones in use, and mutated ones (no panic).

mod ext4_tools;

use std::fs::{self, File};
use std::path::Path;
use std::sync::OnceLock;

use ext4_tools::*;
use ferry_guest::ext4::free_ranges;
use ferry_guest::FsError;
use proptest::prelude::*;
use tempfile::TempDir;

/// Clear the bitmap bit of a block file `f` uses (1 KiB blocks): the
/// group it is in.
fn free_a_used_block(img: &Path, f: &str) -> u64 {
    let b = file_blocks(img, f)[100];
    let g = (b - 1) / 8192;
    let bit = (b - 1) % 8192;
    let off = bitmap_block(img, g as usize) * 1024 + bit / 8;
    let byte = read_at(img, off, 1)[0];
    assert!(byte & (1 << (bit % 8)) != 0);
    patch(img, off, &[byte & !(1 << (bit % 8))]);
    g
}

#[test]
fn a_flipped_bitmap_bit_is_caught() {
    // metadata_csum: by the bitmap's checksum.
    let dir = TempDir::new().unwrap();
    let img = image(&dir, "mkfs.ext4", &[]);
    free_a_used_block(&img, "e");
    corrupt(&img, "block bitmap checksum mismatch");

    // No checksums (ext2): by the group's free count.
    let dir = TempDir::new().unwrap();
    let img = image(&dir, "mkfs.ext2", &[]);
    let g = free_a_used_block(&img, "e");
    corrupt(
        &img,
        &format!("bitmap of group {g} disagrees with its free count"),
    );
}

#[test]
fn a_wrong_free_count_is_caught() {
    let dir = TempDir::new().unwrap();
    let img = image(&dir, "mkfs.ext2", &[]);
    run(
        "debugfs",
        &["-w", "-R", "set_bg 2 free_blocks_count 100", path_str(&img)],
    );
    corrupt(&img, "bitmap of group 2 disagrees with its free count");
}

#[test]
fn metadata_marked_free_is_caught() {
    // ext2, group 1: the first block of its inode table cleared in the
    // bitmap, and the free count raised to match.
    let dir = TempDir::new().unwrap();
    let img = image(&dir, "mkfs.ext2", &[]);
    let text = run("dumpe2fs", &[path_str(&img)]);
    let g1 = text.split("\nGroup 1:").nth(1).unwrap();
    let field = |name: &str| -> u64 {
        let l = g1
            .lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .unwrap();
        l.split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let itable = field("Inode table at ");
    let free: u64 = g1
        .lines()
        .find(|l| l.contains(" free blocks, "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap();
    let off = bitmap_block(&img, 1) * 1024;
    let bit = (itable - (8192 + 1)) as usize;
    let byte = read_at(&img, off + (bit / 8) as u64, 1)[0];
    patch(&img, off + (bit / 8) as u64, &[byte & !(1 << (bit % 8))]);
    let cmd = format!("set_bg 1 free_blocks_count {}", free + 1);
    run("debugfs", &["-w", "-R", &cmd, path_str(&img)]);
    corrupt(&img, "metadata blocks are free");
}

#[test]
fn a_descriptor_checksum_is_checked() {
    for opts in [&[][..], &["-O", "^metadata_csum,uninit_bg"]] {
        let dir = TempDir::new().unwrap();
        let img = image(&dir, "mkfs.ext4", opts);
        // The descriptor table starts at block 2 (1 KiB blocks): group 3's
        // free inode count.
        let off = 2 * 1024 + 3 * 64 + 0xE;
        let b = read_at(&img, off, 1)[0];
        patch(&img, off, &[b ^ 4]);
        corrupt(&img, "descriptor of group 3: checksum mismatch");
    }
}

#[test]
fn block_uninit_on_a_group_with_data_is_caught() {
    let dir = TempDir::new().unwrap();
    let img = image(&dir, "mkfs.ext4", &[]);
    let before = map(&img);
    check_against_dumpe2fs(&img, &before);
    // Group 1 holds file data (the map says so: not all of it is free).
    debugfs_w(&img, &["set_bg 1 flags 3", "set_bg 1 checksum calc"]);
    corrupt(&img, "bitmap of group 1 disagrees with its free count");
}

#[test]
fn no_magic_is_not_ext() {
    let dir = TempDir::new().unwrap();
    let img = image(&dir, "mkfs.ext4", &[]);
    patch(&img, 1024 + 0x38, &[0, 0]);
    assert!(matches!(
        free_ranges(&Img::open(&img)),
        Err(FsError::NotThis(_))
    ));
    assert!(matches!(
        free_ranges(&vec![0u8; 100]),
        Err(FsError::NotThis(_))
    ));
}

#[test]
fn a_truncated_image_is_corrupt() {
    let dir = TempDir::new().unwrap();
    let img = image(&dir, "mkfs.ext4", &[]);
    File::options()
        .write(true)
        .open(&img)
        .unwrap()
        .set_len(60 << 20)
        .unwrap();
    corrupt(&img, "truncated");
    File::options()
        .write(true)
        .open(&img)
        .unwrap()
        .set_len(1500)
        .unwrap();
    corrupt(&img, "truncated");
}

#[test]
fn features_ferry_does_not_read() {
    let dir = TempDir::new().unwrap();
    let img = dir.path().join("img");
    mkfs(&img, "64M", "mkfs.ext4", &["-O", "bigalloc"], None);
    assert!(matches!(
        free_ranges(&Img::open(&img)),
        Err(FsError::Unsupported { .. })
    ));
    // An incompat bit nobody knows (ext2: no superblock checksum).
    mkfs(&img, "64M", "mkfs.ext2", &[], None);
    let inc = read_at(&img, 1024 + 0x60, 4);
    let v = u32::from_le_bytes(inc.try_into().unwrap()) | 0x0100_0000;
    patch(&img, 1024 + 0x60, &v.to_le_bytes());
    match free_ranges(&Img::open(&img)) {
        Err(FsError::Unsupported { why, .. }) => assert!(why.contains("0x1000000"), "{why}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn in_use_flags() {
    let dir = TempDir::new().unwrap();
    let img = image(&dir, "mkfs.ext4", &[]);
    run(
        "debugfs",
        &["-w", "-R", "feature needs_recovery", path_str(&img)],
    );
    let m = map(&img);
    assert!(m.in_use.as_deref().unwrap().contains("recovery"));
    // Still mapped, and right.
    check_against_dumpe2fs(&img, &m);

    let dir = TempDir::new().unwrap();
    let img = image(&dir, "mkfs.ext2", &[]);
    run("debugfs", &["-w", "-R", "ssv state 0", path_str(&img)]);
    assert!(map(&img).in_use.unwrap().contains("not clean"));
    run("debugfs", &["-w", "-R", "ssv state 3", path_str(&img)]);
    assert!(map(&img).in_use.unwrap().contains("errors"));
}

#[test]
fn mmp() {
    let dir = TempDir::new().unwrap();
    let img = image(&dir, "mkfs.ext4", &["-O", "mmp"]);
    let m = map(&img);
    assert!(m.in_use.is_none(), "{:?}", m.in_use);
    check_against_dumpe2fs(&img, &m);
    // debugfs puts the clean sequence back as it closes: write it here.
    let out = run("debugfs", &["-R", "dump_mmp", path_str(&img)]);
    let block: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("block_number: "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let bs = dumpe2fs(&img).block_size;
    patch(&img, block * bs + 4, &0x1234_5678u32.to_le_bytes());
    assert!(map(&img).in_use.unwrap().contains("mounted (MMP)"));
    patch(&img, block * bs + 4, &0xE24D_4D50u32.to_le_bytes());
    assert!(map(&img).in_use.unwrap().contains("e2fsck"));
    patch(&img, block * bs, &[0; 4]);
    corrupt(&img, "MMP");
}

/// superblock, the descriptors and the block bitmaps.
struct Small {
    bytes: Vec<u8>,
    hot: Vec<u64>,
}

/// Small real images (4 MiB, 1 KiB blocks, 4 groups, a few files, one
/// deleted), made once: ext2, ext4 with crc16 descriptors, ext4 with
/// metadata_csum.
fn small_images() -> &'static [Small] {
    static IMAGES: OnceLock<Vec<Small>> = OnceLock::new();
    IMAGES.get_or_init(|| {
        let dir = TempDir::new().unwrap();
        let content = dir.path().join("content");
        fs::create_dir_all(&content).unwrap();
        for i in 0..4u64 {
            random_file(
                &content.join(format!("f{i}")),
                100_000 * (i as usize + 1),
                i,
            );
        }
        let img = dir.path().join("img");
        let mut out = Vec::new();
        for (prog, o) in [
            ("mkfs.ext2", &[][..]),
            ("mkfs.ext4", &["-O", "^metadata_csum,uninit_bg"]),
            ("mkfs.ext4", &[]),
        ] {
            let mut opts = vec!["-b", "1024", "-N", "64", "-g", "1024"];
            opts.extend_from_slice(o);
            mkfs(&img, "4M", prog, &opts, Some(&content));
            run("debugfs", &["-w", "-R", "rm /f1", path_str(&img)]);
            let m = map(&img);
            check_against_dumpe2fs(&img, &m);
            let mut hot = vec![1, 2];
            hot.extend((0..4).map(|g| bitmap_block(&img, g)));
            out.push(Small {
                bytes: fs::read(&img).unwrap(),
                hot,
            });
        }
        out
    })
}

/// Whatever it returns, the map names only whole blocks inside the
/// image, never the superblock.
fn sane(img: &[u8]) {
    if let Ok(m) = free_ranges(&img.to_vec()) {
        for &(s, e) in m.free.as_slice() {
            assert!(s < e && e <= img.len() as u64 && s % 1024 == 0 && e % 1024 == 0);
        }
        assert!(m.free.first_ending_after(1024).is_none_or(|r| r.0 >= 2048));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn mutated_real_images_never_panic(
        which in 0usize..3,
        hot in prop::collection::vec((0usize..6, 0u64..1024, any::<u8>()), 0..6),
        near in prop::collection::vec((0usize..70_000, any::<u8>()), 0..4),
        far in prop::collection::vec((0usize..4 << 20, any::<u8>()), 0..3),
    ) {
        let small = &small_images()[which];
        let mut img = small.bytes.clone();
        // In the blocks the map is made from, near them (the inode
        // tables, the reserved descriptor blocks), and anywhere.
        for (blk, off, b) in hot {
            img[(small.hot[blk] * 1024 + off) as usize] = b;
        }
        for (off, b) in near.into_iter().chain(far) {
            img[off] = b;
        }
        sane(&img);
    }

    #[test]
    fn truncated_real_images_never_panic(which in 0usize..3, len in 0usize..4 << 20) {
        let img = &small_images()[which].bytes[..len];
        prop_assert!(free_ranges(&img.to_vec()).is_err());
    }

    #[test]
    fn random_bytes_with_the_magic_never_panic(
        mut bytes in prop::collection::vec(any::<u8>(), 2048..80_000),
        log in 0u32..3,
    ) {
        bytes[1024 + 0x38] = 0x53;
        bytes[1024 + 0x39] = 0xEF;
        // Some fields made plausible, so that parsing goes further.
        bytes[1024 + 0x18..1024 + 0x1C].copy_from_slice(&log.to_le_bytes());
        bytes[1024 + 0x1C..1024 + 0x20].copy_from_slice(&log.to_le_bytes());
        bytes[1024 + 0x14..1024 + 0x18].copy_from_slice(&u32::from(log == 0).to_le_bytes());
        sane(&bytes);
    }
}
