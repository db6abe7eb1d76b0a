//! ext2/3/4 on real images made by mke2fs and changed by debugfs: the free
//! ranges must be exactly what dumpe2fs lists, and never a block a file
//! still uses.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use ferry_guest::ext4::free_ranges;
use ferry_guest::map::FsMap;
use ferry_guest::{FsError, ReadAt};
use proptest::prelude::*;
use tempfile::TempDir;

/// An image file, read in place (images here are sparse and may be big).
struct Img {
    file: File,
    size: u64,
}

impl Img {
    fn open(p: &Path) -> Img {
        let file = File::open(p).unwrap();
        let size = file.metadata().unwrap().len();
        Img { file, size }
    }
}

impl ReadAt for Img {
    fn read_exact_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, off)
    }
    fn size(&self) -> u64 {
        self.size
    }
}

/// Run a tool; a missing tool or a failure fails the test.
fn run(prog: &str, args: &[&str]) -> String {
    let out = Command::new(prog)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{prog} is needed for this test and could not run: {e}"));
    assert!(
        out.status.success(),
        "{prog} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Write `len` bytes of pseudo-random data (a xorshift stream: fast,
/// incompressible enough, different per seed).
fn random_file(p: &Path, len: usize, seed: u64) {
    let mut x = seed | 1;
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    fs::write(p, v).unwrap();
}

/// A directory with a few files of a few MiB: (its path, the files' names
/// relative to it).
fn content(dir: &TempDir) -> (PathBuf, Vec<&'static str>) {
    let d = dir.path().join("content");
    fs::create_dir_all(d.join("sub")).unwrap();
    let files = vec!["a", "b", "sub/c", "sub/d", "e"];
    for (i, f) in files.iter().enumerate() {
        random_file(&d.join(f), (1 + i) << 20, 7 + i as u64);
    }
    (d, files)
}

/// mke2fs `img` of `size` with `opts`, filled from `dir` when given.
fn mkfs(img: &Path, size: &str, prog: &str, opts: &[&str], dir: Option<&Path>) {
    let _ = fs::remove_file(img);
    let mut args = vec!["-q", "-F"];
    args.extend_from_slice(opts);
    if let Some(d) = dir {
        args.extend_from_slice(&["-d", path_str(d)]);
    }
    args.push(path_str(img));
    args.push(size);
    run(prog, &args);
}

/// What dumpe2fs says: the block size, the superblock's free count, and
/// every group's free blocks as inclusive ranges.
struct Dump {
    block_size: u64,
    free_blocks: u64,
    free: Vec<(u64, u64)>,
    uninit_groups: usize,
    groups: usize,
}

fn field(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("dumpe2fs gave no {name}"))
}

fn dumpe2fs(img: &Path) -> Dump {
    let text = run("dumpe2fs", &[path_str(img)]);
    let mut free = Vec::new();
    for l in text.lines() {
        let Some(list) = l.strip_prefix("  Free blocks: ") else {
            continue;
        };
        for part in list.split(", ").filter(|p| !p.is_empty()) {
            let (a, b) = part.split_once('-').unwrap_or((part, part));
            free.push((a.parse().unwrap(), b.parse().unwrap()));
        }
    }
    Dump {
        block_size: field(&text, "Block size:"),
        free_blocks: field(&text, "Free blocks:"),
        free,
        uninit_groups: text.lines().filter(|l| l.contains("BLOCK_UNINIT")).count(),
        groups: text.lines().filter(|l| l.starts_with("Group ")).count(),
    }
}

/// Run several debugfs commands in one opening of `img` (each opening
/// checks the checksums the previous command may have left stale).
fn debugfs_w(img: &Path, cmds: &[&str]) {
    let f = img.with_extension("cmds");
    fs::write(&f, cmds.join("\n") + "\n").unwrap();
    run("debugfs", &["-w", "-f", path_str(&f), path_str(img)]);
}

/// The blocks debugfs says file `f` uses.
fn file_blocks(img: &Path, f: &str) -> Vec<u64> {
    let out = run("debugfs", &["-R", &format!("blocks /{f}"), path_str(img)]);
    let v: Vec<u64> = out.split_whitespace().map(|w| w.parse().unwrap()).collect();
    assert!(!v.is_empty(), "debugfs lists no blocks for {f}");
    v
}

fn map(img: &Path) -> FsMap {
    free_ranges(&Img::open(img)).unwrap_or_else(|e| panic!("{}: {e}", img.display()))
}

/// The map must be exactly dumpe2fs's free list, and add up to its count.
fn check_against_dumpe2fs(img: &Path, m: &FsMap) -> Dump {
    let d = dumpe2fs(img);
    let bs = d.block_size;
    let want: Vec<(u64, u64)> = {
        let mut v: Vec<(u64, u64)> = Vec::new();
        for &(a, b) in &d.free {
            match v.last_mut() {
                Some(l) if l.1 == a * bs => l.1 = (b + 1) * bs,
                _ => v.push((a * bs, (b + 1) * bs)),
            }
        }
        v
    };
    assert_eq!(m.free.as_slice(), want.as_slice(), "{}", img.display());
    assert_eq!(m.free.total(), d.free_blocks * bs, "{}", img.display());
    d
}

fn assert_misses(m: &FsMap, blocks: &[u64], bs: u64, what: &str) {
    for &b in blocks {
        assert!(
            m.free
                .first_ending_after(b * bs)
                .is_none_or(|r| r.0 >= (b + 1) * bs),
            "block {b} of {what} is reported free"
        );
    }
}

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

/// Mount `img` on a loop device at `mnt`; unmounted by [`Mounted::umount`]
/// (or, when a test fails, as it is dropped).
struct Mounted<'a>(&'a Path, bool);

impl<'a> Mounted<'a> {
    fn new(img: &Path, mnt: &'a Path) -> Mounted<'a> {
        fs::create_dir_all(mnt).unwrap();
        run("mount", &["-o", "loop", path_str(img), path_str(mnt)]);
        Mounted(mnt, true)
    }

    fn umount(mut self) {
        run("umount", &[path_str(self.0)]);
        self.1 = false;
    }
}

impl Drop for Mounted<'_> {
    fn drop(&mut self) {
        if self.1 {
            let _ = Command::new("umount").arg(self.0).status();
        }
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

/// Overwrite `bytes` at `off` of `img`.
fn patch(img: &Path, off: u64, bytes: &[u8]) {
    File::options()
        .write(true)
        .open(img)
        .unwrap()
        .write_all_at(bytes, off)
        .unwrap();
}

fn read_at(img: &Path, off: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    File::open(img).unwrap().read_exact_at(&mut v, off).unwrap();
    v
}

/// Where dumpe2fs says group `g`'s block bitmap is.
fn bitmap_block(img: &Path, g: usize) -> u64 {
    let text = run("dumpe2fs", &[path_str(img)]);
    let group = text
        .split(&format!("\nGroup {g}: "))
        .nth(1)
        .unwrap_or_else(|| panic!("dumpe2fs lists no group {g}"));
    let at = group
        .lines()
        .find_map(|l| l.trim().strip_prefix("Block bitmap at "))
        .unwrap();
    at.split_whitespace().next().unwrap().parse().unwrap()
}

/// An image made with `opts` and the content, for corrupting.
fn image(dir: &TempDir, prog: &str, opts: &[&str]) -> PathBuf {
    let (content, _) = content(dir);
    let img = dir.path().join("img");
    mkfs(&img, "64M", prog, opts, Some(&content));
    img
}

fn corrupt(img: &Path, what: &str) {
    match free_ranges(&Img::open(img)) {
        Err(FsError::Corrupt { why, .. }) => assert!(why.contains(what), "{why}"),
        other => panic!("expected Corrupt ({what}), got {other:?}"),
    }
}

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

/// A small real image, and the blocks the map is made from: the
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
    #![proptest_config(ProptestConfig::with_cases(300))]

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
    // In use: refused unless forced.
    run(
        "debugfs",
        &["-w", "-R", "feature needs_recovery", path_str(&img)],
    );
    let e = map_image(&Img::open(&img), &MapOptions::default()).unwrap_err();
    assert!(matches!(e, GuestError::InUse { what: "ext4", .. }), "{e}");
    let g = map_image(&Img::open(&img), &MapOptions { force: true }).unwrap();
    assert_eq!(g.free, want);
}
