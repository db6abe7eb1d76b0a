//! Shared by the ext2/3/4 tests: images made by mke2fs, changed by
//! debugfs, and what dumpe2fs says of them.

#![allow(dead_code)] // each test file uses some of these

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use ferry_guest::ext4::free_ranges;
use ferry_guest::map::FsMap;
use ferry_guest::{FsError, ReadAt};
use tempfile::TempDir;

/// An image file, read in place (images here are sparse and may be big).
pub struct Img {
    pub file: File,
    pub size: u64,
}

impl Img {
    pub fn open(p: &Path) -> Img {
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
pub fn run(prog: &str, args: &[&str]) -> String {
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

pub fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Write `len` bytes of pseudo-random data (a xorshift stream: fast,
/// incompressible enough, different per seed).
pub fn random_file(p: &Path, len: usize, seed: u64) {
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
pub fn content(dir: &TempDir) -> (PathBuf, Vec<&'static str>) {
    let d = dir.path().join("content");
    fs::create_dir_all(d.join("sub")).unwrap();
    let files = vec!["a", "b", "sub/c", "sub/d", "e"];
    for (i, f) in files.iter().enumerate() {
        random_file(&d.join(f), (1 + i) << 20, 7 + i as u64);
    }
    (d, files)
}

/// mke2fs `img` of `size` with `opts`, filled from `dir` when given.
pub fn mkfs(img: &Path, size: &str, prog: &str, opts: &[&str], dir: Option<&Path>) {
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
pub struct Dump {
    pub block_size: u64,
    pub free_blocks: u64,
    pub free: Vec<(u64, u64)>,
    pub uninit_groups: usize,
    pub groups: usize,
}

pub fn field(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("dumpe2fs gave no {name}"))
}

pub fn dumpe2fs(img: &Path) -> Dump {
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
pub fn debugfs_w(img: &Path, cmds: &[&str]) {
    let f = img.with_extension("cmds");
    fs::write(&f, cmds.join("\n") + "\n").unwrap();
    run("debugfs", &["-w", "-f", path_str(&f), path_str(img)]);
}

/// The blocks debugfs says file `f` uses.
pub fn file_blocks(img: &Path, f: &str) -> Vec<u64> {
    let out = run("debugfs", &["-R", &format!("blocks /{f}"), path_str(img)]);
    let v: Vec<u64> = out.split_whitespace().map(|w| w.parse().unwrap()).collect();
    assert!(!v.is_empty(), "debugfs lists no blocks for {f}");
    v
}

pub fn map(img: &Path) -> FsMap {
    free_ranges(&Img::open(img)).unwrap_or_else(|e| panic!("{}: {e}", img.display()))
}

/// The map must be exactly dumpe2fs's free list, and add up to its count.
pub fn check_against_dumpe2fs(img: &Path, m: &FsMap) -> Dump {
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

pub fn assert_misses(m: &FsMap, blocks: &[u64], bs: u64, what: &str) {
    for &b in blocks {
        assert!(
            m.free
                .first_ending_after(b * bs)
                .is_none_or(|r| r.0 >= (b + 1) * bs),
            "block {b} of {what} is reported free"
        );
    }
}

/// Mount `img` on a loop device at `mnt`; unmounted by [`Mounted::umount`]
/// (or, when a test fails, as it is dropped).
pub struct Mounted<'a>(&'a Path, bool);

impl<'a> Mounted<'a> {
    pub fn new(img: &Path, mnt: &'a Path) -> Mounted<'a> {
        fs::create_dir_all(mnt).unwrap();
        run("mount", &["-o", "loop", path_str(img), path_str(mnt)]);
        Mounted(mnt, true)
    }

    pub fn umount(mut self) {
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

/// Overwrite `bytes` at `off` of `img`.
pub fn patch(img: &Path, off: u64, bytes: &[u8]) {
    File::options()
        .write(true)
        .open(img)
        .unwrap()
        .write_all_at(bytes, off)
        .unwrap();
}

pub fn read_at(img: &Path, off: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    File::open(img).unwrap().read_exact_at(&mut v, off).unwrap();
    v
}

/// Where dumpe2fs says group `g`'s block bitmap is.
pub fn bitmap_block(img: &Path, g: usize) -> u64 {
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
pub fn image(dir: &TempDir, prog: &str, opts: &[&str]) -> PathBuf {
    let (content, _) = content(dir);
    let img = dir.path().join("img");
    mkfs(&img, "64M", prog, opts, Some(&content));
    img
}

pub fn corrupt(img: &Path, what: &str) {
    match free_ranges(&Img::open(img)) {
        Err(FsError::Corrupt { why, .. }) => assert!(why.contains(what), "{why}"),
        other => panic!("expected Corrupt ({what}), got {other:?}"),
    }
}
