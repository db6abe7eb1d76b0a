//! ext2/3/4 on real images made by mke2fs and changed by debugfs: the free
//! ranges must be exactly what dumpe2fs lists, and never a block a file
//! still uses.

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

/// The blocks debugfs says file `f` uses.
fn file_blocks(img: &Path, f: &str) -> Vec<u64> {
    let out = run("debugfs", &["-R", &format!("blocks /{f}"), path_str(img)]);
    let v: Vec<u64> = out
        .split_whitespace()
        .map(|w| w.parse().unwrap())
        .collect();
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
            m.free.first_ending_after(b * bs).is_none_or(|r| r.0 >= (b + 1) * bs),
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
    let gone: Vec<Vec<u64>> = ["a", "sub/d"].iter().map(|f| file_blocks(&img, f)).collect();
    for f in ["a", "sub/d"] {
        run("debugfs", &["-w", "-R", &format!("rm /{f}"), path_str(&img)]);
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
            assert!(m.free.first_ending_after(b * bs).is_some_and(|r| r.0 <= b * bs));
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
