//! XFS free ranges against real images: mkfs.xfs, a loop mount to write and
//! delete files, and xfs_db / xfs_repair as ground truth.

mod xfs_util;

use ferry_guest::{xfs, FsError};
use std::path::Path;
use std::process::Command;
use xfs_util::*;

/// Write `n` files of random sizes up to `max` bytes in `dir`, named
/// `{prefix}{i}`.
fn write_files(dir: &Path, prefix: &str, n: usize, max: u64, rng: &mut Rng) -> Vec<String> {
    (0..n)
        .map(|i| {
            let name = format!("{prefix}{i}");
            let len = 1 + rng.below(max) as usize;
            std::fs::write(dir.join(&name), rng.bytes(len)).unwrap();
            name
        })
        .collect()
}

/// No free range touches a block of a file that is still there.
fn assert_files_not_free(img: &Path, free: &ferry_guest::Ranges, names: &[String]) {
    let geo = Geo::of(img);
    let mut seen = 0;
    for name in names {
        for (ag, bno, len) in file_extents(img, name) {
            let (s, e) = geo.bytes(ag, bno, len);
            assert!(
                !overlaps(free, s, e),
                "{name}'s blocks {ag}/{bno}+{len} reported free"
            );
            seen += 1;
        }
    }
    assert!(seen >= names.len(), "xfs_db bmap found {seen} extents");
}

/// v5 (CRCs), 4 KiB blocks on 4 KiB sectors, a log with a stripe unit
/// and large log buffers, files written, half deleted, more written into the
/// gaps: exactly xfs_db's free extents.
#[test]
fn v5_files_written_and_deleted() {
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("v5.img");
    mkfs(&img, 300, &["-s", "size=4096", "-l", "su=64k"]);
    assert_eq!(sb_field(&img, "sectsize"), 4096);
    assert_eq!(sb_field(&img, "logsunit"), 65536);
    let mut rng = Rng(0x5eed_0001);
    // 256 KiB log buffers: records with 8 header BBs (and extended headers
    // in their CRC), the unmount record padded to the 64 KiB stripe unit.
    let mnt = Mount::with(&img, &tmp.path().join("mnt"), "loop,logbsize=256k");
    let first = write_files(&mnt.dir, "a", 60, 1 << 20, &mut rng);
    tool("sync", &[]);
    for name in first.iter().step_by(2) {
        std::fs::remove_file(mnt.dir.join(name)).unwrap();
    }
    tool("sync", &[]);
    let second = write_files(&mnt.dir, "b", 20, 256 << 10, &mut rng);
    mnt.umount();

    settle_clean(&img);
    let m = check_against_xfs_db(&img);
    let kept: Vec<String> = first
        .iter()
        .skip(1)
        .step_by(2)
        .chain(&second)
        .cloned()
        .collect();
    assert_files_not_free(&img, &m.free, &kept);
    // Some 20 MiB written: the rest of the 300 MiB, less metadata and log.
    let free_mib = m.free.total() >> 20;
    assert!((200..280).contains(&free_mib), "{free_mib} MiB free");

    // The whole-image map finds it bare, with the same free bytes.
    let map = ferry_guest::map_image(&Img::open(&img), &Default::default()).unwrap();
    assert_eq!(map.free, m.free);
}

/// The v4 format (no CRCs), 512-byte blocks, populated by a protofile:
/// mkfs.xfs 6.x still makes it (with a deprecation warning) though the
/// kernel here does not mount it. Without a mount nothing can be deleted,
/// so free space stays in a few extents: multi-level v4 trees are covered
/// by the unit tests on built images (`deep_trees_and_small_blocks`).
#[test]
fn v4_protofile_512_byte_blocks() {
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("v4.img");
    let names = v4_proto_image(&img, 30, 512 << 10, 0x5eed_0002);
    assert_eq!(sb_field(&img, "versionnum") & 0xf, 4);
    assert_eq!(sb_field(&img, "blocksize"), 512);

    let m = check_against_xfs_db(&img);
    assert_files_not_free(&img, &m.free, &names);
}

/// A bnobt of two levels (1 KiB blocks, hundreds of one-block holes), with
/// the reverse-mapping btree on: still exactly xfs_db's free extents.
#[test]
fn v5_two_level_bnobt_with_rmapbt() {
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("frag.img");
    fragmented_image(&img);
    assert!(agf_field(&img, 0, "bnolevel") >= 2, "bnobt not two levels");
    assert!(agf_field(&img, 0, "cntlevel") >= 2, "cntbt not two levels");
    let m = check_against_xfs_db(&img);
    assert!(
        // About 300 (the kernel places the files a little differently
        // from run to run): more than two 1 KiB leaves hold (121 each).
        m.free.as_slice().len() > 242,
        "{} ranges",
        m.free.as_slice().len()
    );
    let kept: Vec<String> = (1..600).step_by(2).map(|i| format!("s{i}")).collect();
    assert_files_not_free(&img, &m.free, &kept);
}

/// An external log: nothing of it on this device, so whether it needs
/// recovery cannot be told: in use (copied whole even with --force); the
/// maps themselves still match xfs_db's.
#[test]
fn external_log() {
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("data.img");
    let log = tmp.path().join("log.img");
    std::fs::File::create(&log)
        .unwrap()
        .set_len(80 << 20)
        .unwrap();
    mkfs(
        &img,
        300,
        &["-l", &format!("logdev={},size=64m", log.display())],
    );
    assert_eq!(sb_field(&img, "logstart"), 0);
    let logdev = Loop::new(&log);
    let mnt = Mount::with(
        &img,
        &tmp.path().join("mnt"),
        &format!("loop,logdev={}", logdev.0),
    );
    let mut rng = Rng(0x5eed_0006);
    let names = write_files(&mnt.dir, "e", 20, 1 << 20, &mut rng);
    mnt.umount();
    drop(logdev);
    let m = check_against_xfs_db(&img);
    assert_files_not_free(&img, &m.free, &names);
    let opts = ferry_guest::MapOptions { force: true };
    let map = ferry_guest::map_image(&Img::open(&img), &opts).unwrap();
    assert!(
        map.free.is_empty(),
        "an external log's filesystem is copied whole"
    );
    assert!(ferry_guest::map_image(&Img::open(&img), &Default::default()).is_err());
}

/// The log says whether the filesystem is in use, as xfs_repair sees it:
/// a copy taken while mounted, or frozen, needs recovery; the image after
/// umount does not.
#[test]
fn in_use_follows_the_log() {
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("live.img");
    mkfs(&img, 300, &[]);
    // Fresh from mkfs: its log holds mkfs's unmount record only.
    settle_clean(&img);
    assert_eq!(xfs::free_ranges(&Img::open(&img)).unwrap().in_use, None);

    let mnt = Mount::new(&img, &tmp.path().join("mnt"));
    let mut rng = Rng(0x5eed_0004);
    write_files(&mnt.dir, "f", 20, 200 << 10, &mut rng);
    tool("sync", &[]);
    let live = tmp.path().join("copy-mounted.img");
    tool(
        "cp",
        &[
            "--sparse=always",
            img.to_str().unwrap(),
            live.to_str().unwrap(),
        ],
    );
    let mnt_dir = mnt.dir.to_str().unwrap().to_string();
    tool("xfs_freeze", &["-f", &mnt_dir]);
    let frozen = tmp.path().join("copy-frozen.img");
    let copied = Command::new("cp")
        .args([
            "--sparse=always",
            img.to_str().unwrap(),
            frozen.to_str().unwrap(),
        ])
        .status();
    tool("xfs_freeze", &["-u", &mnt_dir]);
    assert!(copied.unwrap().success());
    mnt.umount();

    for copy in [&live, &frozen] {
        let dirty = repair_says_dirty(copy);
        let m = xfs::free_ranges(&Img::open(copy)).expect("mapped, in use");
        assert_eq!(m.in_use.is_some(), dirty, "{copy:?}: {:?}", m.in_use);
    }
    assert!(
        repair_says_dirty(&live),
        "a copy of a mounted XFS needs recovery"
    );
    let m = xfs::free_ranges(&Img::open(&live)).unwrap();
    assert!(m.in_use.unwrap().contains("log is not clean"));

    settle_clean(&img);
    check_against_xfs_db(&img);
}

fn expect_corrupt(img: &Img, what: &str) -> String {
    match xfs::free_ranges(img) {
        Err(FsError::Corrupt { kind, why }) => {
            assert_eq!(kind, "xfs");
            why
        }
        other => panic!("{what}: expected Corrupt, got {other:?}"),
    }
}

/// Damage to a real image is noticed: a bit flipped in an AGF or a bnobt
/// block (v5: the CRC), a missing magic, a truncated image, counts that
/// disagree, and bnobt pointers that loop.
#[test]
fn corruption_is_noticed() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("frag.img");
    fragmented_image(&path);
    let geo = Geo::of(&path);
    let bs = geo.blocksize;
    let sect = sb_field(&path, "sectsize");
    let root = agf_field(&path, 0, "bnoroot");
    let root_off = root * bs;
    assert!(agf_field(&path, 0, "bnolevel") == 2);
    let clean = Img::open(&path);
    xfs::free_ranges(&clean).expect("the clean image maps");

    // A flipped bit in AG 1's AGF, in the bnobt root.
    let mut img = Img::open(&path);
    let agf1 = geo.agblocks * bs + sect;
    img.put(agf1 + 52, &[clean.get(agf1 + 52, 1)[0] ^ 0x10]);
    assert!(expect_corrupt(&img, "AGF bit").contains("AGF CRC"));
    let mut img = Img::open(&path);
    img.put(root_off + 100, &[clean.get(root_off + 100, 1)[0] ^ 1]);
    assert!(expect_corrupt(&img, "bnobt bit").contains("CRC mismatch"));

    // No magic: not XFS.
    let mut img = Img::open(&path);
    img.put(0, &[0, 0, 0, 0]);
    assert!(matches!(
        xfs::free_ranges(&img),
        Err(FsError::NotThis("xfs"))
    ));

    // Truncated by one block.
    let mut img = Img::open(&path);
    img.truncate(geo.dblocks * bs - bs);
    assert!(expect_corrupt(&img, "truncated").contains("truncated"));

    // agf_freeblks one short, CRC recomputed: the trees disagree with it.
    let mut img = Img::open(&path);
    let agf0 = sect;
    let freeblks = agf_field(&path, 0, "freeblks") as u32;
    img.put_be32(agf0 + 52, freeblks - 1);
    img.fix_crc(agf0, sect as usize, 216);
    assert!(expect_corrupt(&img, "freeblks").contains("more than the AGF's"));

    // The cntbt's largest extent (its last record) moved back one block:
    // same count, same total, still in order, but not the bnobt's extents.
    let mut img = Img::open(&path);
    let be32 = |off: u64| u32::from_be_bytes(clean.get(off, 4).try_into().unwrap());
    let be16 = |off: u64| u16::from_be_bytes(clean.get(off, 2).try_into().unwrap());
    let cnt = agf_field(&path, 0, "cntroot") * bs;
    let n = u64::from(be16(cnt + 6));
    let leaf = u64::from(be32(cnt + 56 + ((bs - 56) / 12) * 8 + 4 * (n - 1))) * bs;
    let last = leaf + 56 + 8 * (u64::from(be16(leaf + 6)) - 1);
    img.put_be32(last, be32(last) - 1);
    img.fix_crc(leaf, bs as usize, 52);
    assert!(expect_corrupt(&img, "cntbt record").contains("does not hold the bnobt's"));

    // The bnobt root's pointers: where its children are.
    let maxrecs = (bs - 56) / 12;
    let ptr_off = |i: u64| root_off + 56 + maxrecs * 8 + 4 * i;
    let ptr = |i: u64| u32::from_be_bytes(clean.get(ptr_off(i), 4).try_into().unwrap());
    let (p0, p1) = (ptr(0), ptr(1));

    // The root points at itself.
    let mut img = Img::open(&path);
    img.put_be32(ptr_off(0), root as u32);
    img.fix_crc(root_off, bs as usize, 52);
    assert!(expect_corrupt(&img, "root points at itself").contains("level 1, expected 0"));

    // Both pointers lead to the same leaf.
    let mut img = Img::open(&path);
    img.put_be32(ptr_off(1), p0);
    img.fix_crc(root_off, bs as usize, 52);
    assert!(expect_corrupt(&img, "shared leaf").contains("sibling pointers"));

    // The second leaf's right sibling goes back to the first: a loop for a
    // reader that follows siblings; the walk must see it does not fit.
    let mut img = Img::open(&path);
    let leaf1 = u64::from(p1) * bs;
    img.put_be32(leaf1 + 12, p0);
    img.fix_crc(leaf1, bs as usize, 52);
    let why = expect_corrupt(&img, "sibling loop");
    // When the second leaf is the last of its level (the layout depends on
    // how the kernel placed the files), the loop shows as a level that ends
    // with a right sibling; otherwise as pointers that do not chain.
    assert!(
        why.contains("sibling pointers") || why.contains("ends with a right sibling"),
        "sibling loop: {why}"
    );
}
