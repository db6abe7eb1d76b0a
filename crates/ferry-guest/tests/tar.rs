//! Members of real archives written by GNU tar, found in place: each
//! member's offset and size agree with `tar -tvR` (which prints the block
//! of each header) and its bytes, read through `ReadAt`, are the original
//! file's.

use ferry_guest::tar::{find_member, list_members, Member, TarError};
use ferry_guest::ReadAt;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::{symlink, FileExt};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;
use tempfile::TempDir;

/// Run a command; panic, saying what is missing or what failed.
fn run(cmd: &mut Command) -> String {
    let out = cmd.env("LC_ALL", "C").output().unwrap_or_else(|e| {
        panic!("cannot run {cmd:?} (these tests need GNU tar and gzip, bzip2, xz, zstd, lz4): {e}")
    });
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn tar(dir: &Path, args: &[&str]) -> String {
    run(Command::new("tar").current_dir(dir).args(args))
}

/// Bytes that differ from file to file and from offset to offset.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// An entry as `tar -tvR` lists it.
#[derive(Debug)]
struct Listed {
    /// The block of its (first) header.
    block: u64,
    /// The first letter of its mode: '-', 'd', 'l', 'h'...
    kind: char,
    size: u64,
    name: String,
}

/// `tar -tvR`: every entry, and the block where the archive ends.
fn listing(dir: &Path, archive: &str) -> (Vec<Listed>, u64) {
    let mut entries = Vec::new();
    let mut end = None;
    for line in tar(dir, &["-tvRf", archive]).lines() {
        let (block, rest) = line
            .strip_prefix("block ")
            .and_then(|l| l.split_once(": "))
            .unwrap_or_else(|| panic!("unexpected tar -tvR line {line:?}"));
        let block: u64 = block.parse().unwrap();
        if rest.starts_with("** ") {
            end = Some(block);
            continue;
        }
        // mode owner size date time name [-> target | link to target]
        let f: Vec<&str> = rest.split_whitespace().collect();
        entries.push(Listed {
            block,
            kind: f[0].chars().next().unwrap(),
            size: f[2].parse().unwrap_or(0),
            name: f[5].to_string(),
        });
    }
    (entries, end.expect("tar -tvR printed no end of archive"))
}

/// A file-backed archive, read with pread.
struct FileImg(fs::File, u64);

impl FileImg {
    fn open(path: &Path) -> Self {
        let f = fs::File::open(path).unwrap();
        let len = f.metadata().unwrap().len();
        FileImg(f, len)
    }
}

impl ReadAt for FileImg {
    fn read_exact_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        FileExt::read_exact_at(&self.0, buf, off)
    }
    fn size(&self) -> u64 {
        self.1
    }
}

fn bytes_of(r: &dyn ReadAt, m: Member) -> Vec<u8> {
    let mut buf = vec![0; m.size as usize];
    m.window(r).read_exact_at(&mut buf, 0).unwrap();
    buf
}

/// A tree of files of awkward sizes, a directory, links and long names.
fn tree(root: &Path, long_names: bool, gnu_long: bool) {
    let files: &[(&str, usize)] = &[
        ("vm.ovf", 300),
        ("disk1.vmdk", 300_123),
        ("empty", 0),
        ("exact", 512),
        ("odd", 513),
        ("sub/dir/inner", 7),
    ];
    for (i, (name, len)) in files.iter().enumerate() {
        let p = root.join(name);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, noise(i as u64, *len)).unwrap();
    }
    symlink("../vm.ovf", root.join("sub/link")).unwrap();
    fs::hard_link(root.join("vm.ovf"), root.join("sub/hard")).unwrap();
    if long_names {
        // 200 characters: ustar splits it into prefix and name.
        let dir = root.join(format!("long/{}/{}", "p".repeat(60), "r".repeat(60)));
        fs::create_dir_all(&dir).unwrap();
        fs::write(
            dir.join(format!("{}.img", "n".repeat(70))),
            noise(100, 5000),
        )
        .unwrap();
    }
    if gnu_long {
        // 300 characters and a component of 150: only GNU and PAX.
        let dir = root.join(format!("long/{}", "q".repeat(140)));
        fs::create_dir_all(&dir).unwrap();
        fs::write(
            dir.join(format!("{}.img", "m".repeat(150))),
            noise(101, 777),
        )
        .unwrap();
    }
}

/// Check every entry `tar -tvR` lists against `find_member`, and the
/// regular ones' bytes against the files under `src`.
fn check_against_tar(dir: &Path, archive: &str, src: &Path) -> usize {
    let (entries, end) = listing(dir, archive);
    let img = FileImg::open(&dir.join(archive));
    let mut regular = BTreeMap::new();
    for (i, e) in entries.iter().enumerate() {
        let next = entries.get(i + 1).map_or(end, |n| n.block) * 512;
        let got = find_member(&img, &e.name);
        match e.kind {
            '-' => {
                let m = got.unwrap_or_else(|err| panic!("{archive}: {}: {err}", e.name));
                assert_eq!(m.size, e.size, "{archive}: {}", e.name);
                // The data follows the header tar names, before the next.
                if e.name.len() <= 100 || !archive.starts_with("gnu") {
                    assert_eq!(m.offset, (e.block + 1) * 512, "{archive}: {}", e.name);
                } else {
                    // GNU tar names the block of the long-name header.
                    assert!(m.offset > (e.block + 1) * 512, "{archive}: {}", e.name);
                }
                assert!(m.offset + m.size <= next, "{archive}: {}", e.name);
                let original = fs::read(src.join(&e.name)).unwrap();
                assert!(
                    bytes_of(&img, m) == original,
                    "{archive}: {}: bytes differ",
                    e.name
                );
                // The name matches with and without "./".
                let bare = e.name.trim_start_matches("./");
                assert_eq!(find_member(&img, bare).unwrap(), m);
                assert_eq!(find_member(&img, &format!("./{bare}")).unwrap(), m);
                regular.insert(bare.to_string(), m.size);
            }
            kind => {
                let what = match kind {
                    'd' => "a directory",
                    'l' => "a symbolic link",
                    'h' => "a hard link",
                    _ => panic!("unexpected entry {e:?}"),
                };
                match got {
                    Err(TarError::NotRegular { what: w, .. }) => assert_eq!(w, what, "{e:?}"),
                    // "./" itself: an empty name matches nothing.
                    Err(TarError::NotFound { .. }) if e.name == "./" => {}
                    other => panic!("{archive}: {e:?}: {other:?}"),
                }
            }
        }
    }
    let listed: BTreeMap<String, u64> = list_members(&img, 1000).unwrap().into_iter().collect();
    assert_eq!(listed, regular, "{archive}: list_members");
    regular.len()
}

#[test]
fn ustar_gnu_pax_and_v7_archives() {
    let tmp = TempDir::new().unwrap();
    let d = tmp.path();
    for (format, long, gnu_long) in [
        ("ustar", true, false),
        ("gnu", true, true),
        ("pax", true, true),
        ("v7", false, false),
    ] {
        let src = d.join(format!("src-{format}"));
        tree(&src, long, gnu_long);
        let archive = format!("{format}.tar");
        let src_arg = src.to_str().unwrap();
        tar(
            d,
            &["--format", format, "-cf", &archive, "-C", src_arg, "."],
        );
        let n = check_against_tar(d, &archive, &src);
        let expected = 6 + usize::from(long) + usize::from(gnu_long);
        assert_eq!(n, expected, "{archive}: regular members");
        // Named members rather than ".": names without "./".
        let archive = format!("{format}-named.tar");
        tar(
            d,
            &[
                "--format",
                format,
                "-cf",
                &archive,
                "-C",
                src_arg,
                "vm.ovf",
                "sub",
                "disk1.vmdk",
            ],
        );
        assert_eq!(check_against_tar(d, &archive, &src), 3, "{archive}");
    }
}

#[test]
fn the_last_occurrence_wins() {
    let tmp = TempDir::new().unwrap();
    let d = tmp.path();
    fs::write(d.join("disk.img"), noise(1, 4000)).unwrap();
    fs::write(d.join("vm.ovf"), noise(2, 10)).unwrap();
    tar(d, &["--format=gnu", "-cf", "a.tar", "disk.img", "vm.ovf"]);
    fs::write(d.join("disk.img"), noise(3, 6000)).unwrap();
    tar(d, &["--format=gnu", "-rf", "a.tar", "disk.img"]);
    let (entries, _) = listing(d, "a.tar");
    let last = entries.iter().rev().find(|e| e.name == "disk.img").unwrap();
    let img = FileImg::open(&d.join("a.tar"));
    let m = find_member(&img, "disk.img").unwrap();
    assert_eq!(
        m,
        Member {
            offset: (last.block + 1) * 512,
            size: 6000
        }
    );
    assert!(bytes_of(&img, m) == noise(3, 6000));
    assert_eq!(
        list_members(&img, 10).unwrap(),
        [("disk.img".to_string(), 6000), ("vm.ovf".to_string(), 10)]
    );
}

#[test]
fn sparse_members_are_refused_and_skipped() {
    let tmp = TempDir::new().unwrap();
    let d = tmp.path();
    // 9 GiB with nine islands of data (more than an old GNU sparse
    // header holds: its map continues in an extension block); 64 MiB
    // with one.
    let big = fs::File::create(d.join("big.img")).unwrap();
    big.set_len(9 << 30).unwrap();
    for i in 0..9u64 {
        big.write_all_at(&noise(i, 100), (i << 30) + 4096).unwrap();
    }
    let small = fs::File::create(d.join("small.img")).unwrap();
    small.set_len(64 << 20).unwrap();
    small.write_all_at(b"data", 1 << 20).unwrap();
    fs::write(d.join("after.txt"), noise(7, 1234)).unwrap();
    let variants: &[&[&str]] = &[
        &["--format=gnu"],
        &["--format=pax", "--sparse-version=0.0"],
        &["--format=pax", "--sparse-version=0.1"],
        &["--format=pax", "--sparse-version=1.0"],
    ];
    for (i, opts) in variants.iter().enumerate() {
        let archive = format!("sparse{i}.tar");
        let mut args = vec!["-S", "-cf", &archive];
        args.extend_from_slice(opts);
        args.extend_from_slice(&["big.img", "small.img", "after.txt"]);
        tar(d, &args);
        let img = FileImg::open(&d.join(&archive));
        if i == 0 {
            let mut h = [0u8; 512];
            img.read_exact_at(&mut h, 0).unwrap();
            assert_eq!(
                (h[156], h[482]),
                (b'S', 1),
                "an extended old GNU sparse header"
            );
        }
        for name in ["big.img", "small.img"] {
            match find_member(&img, name) {
                Err(e @ TarError::Sparse(_)) => assert_eq!(
                    e.to_string(),
                    format!("\"{name}\" is stored as a sparse tar member, which ferry cannot read in place (create the archive without --sparse)")
                ),
                other => panic!("{opts:?} {name}: {other:?}"),
            }
        }
        // The walk steps over the sparse members' maps and data.
        let (entries, _) = listing(d, &archive);
        let after = entries.iter().find(|e| e.name == "after.txt").unwrap();
        let m = find_member(&img, "after.txt").unwrap();
        assert_eq!(
            m,
            Member {
                offset: (after.block + 1) * 512,
                size: 1234
            },
            "{opts:?}"
        );
        assert!(bytes_of(&img, m) == noise(7, 1234));
        assert_eq!(
            list_members(&img, 10).unwrap(),
            [("after.txt".to_string(), 1234)]
        );
    }
}

#[test]
fn compressed_archives_are_refused() {
    let tmp = TempDir::new().unwrap();
    let d = tmp.path();
    fs::write(d.join("disk.img"), noise(1, 100_000)).unwrap();
    for (opt, kind) in [
        ("--gzip", "gzip"),
        ("--bzip2", "bzip2"),
        ("--xz", "xz"),
        ("--zstd", "zstd"),
        ("--use-compress-program=lz4", "lz4"),
    ] {
        let archive = format!("a.tar.{kind}");
        tar(d, &[opt, "-cf", &archive, "disk.img"]);
        let img = FileImg::open(&d.join(&archive));
        match find_member(&img, "disk.img") {
            Err(e @ TarError::Compressed(k)) => {
                assert_eq!(k, kind);
                assert_eq!(
                    e.to_string(),
                    format!("the archive is {kind}-compressed; ferry reads members of uncompressed tars only (decompress it first)")
                );
            }
            other => panic!("{kind}: {other:?}"),
        }
        assert!(matches!(
            list_members(&img, 10),
            Err(TarError::Compressed(_))
        ));
    }
}

/// A GNU header with a base-256 size, as GNU tar writes for 8 GiB and more.
fn gnu_header(name: &str, size: u64) -> [u8; 512] {
    let mut b = [0u8; 512];
    b[..name.len()].copy_from_slice(name.as_bytes());
    b[100..108].copy_from_slice(b"0000644\0");
    b[108..116].copy_from_slice(b"0000000\0");
    b[116..124].copy_from_slice(b"0000000\0");
    b[124] = 0x80;
    b[128..136].copy_from_slice(&size.to_be_bytes());
    b[136..148].copy_from_slice(b"14000000000\0");
    b[156] = b'0';
    b[257..265].copy_from_slice(b"ustar  \0");
    b[148..156].fill(b' ');
    let sum: u32 = b.iter().map(|&c| u32::from(c)).sum();
    b[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    b
}

#[test]
fn a_member_of_8_gib_and_more_as_gnu_tar_reads_it() {
    // Written by hand (tar would write 8 GiB), sparse on disk; GNU tar
    // itself says where its members are.
    let tmp = TempDir::new().unwrap();
    let d = tmp.path();
    let big: u64 = (8 << 30) + 1;
    let second = 512 + big.div_ceil(512) * 512;
    let f = fs::File::create(d.join("big.tar")).unwrap();
    f.write_all_at(&gnu_header("disk1.vmdk", big), 0).unwrap();
    f.write_all_at(b"first", 512).unwrap();
    f.write_all_at(b"last!", 512 + big - 5).unwrap();
    f.write_all_at(&gnu_header("vm.ovf", 11), second).unwrap();
    f.write_all_at(b"hello world", second + 512).unwrap();
    f.set_len(second + 1024 + 1024).unwrap();
    let (entries, _) = listing(d, "big.tar");
    assert_eq!(
        (entries[0].name.as_str(), entries[0].size),
        ("disk1.vmdk", big)
    );
    assert_eq!(
        (entries[1].name.as_str(), entries[1].block * 512),
        ("vm.ovf", second)
    );

    let img = FileImg::open(&d.join("big.tar"));
    let m = find_member(&img, "disk1.vmdk").unwrap();
    assert_eq!(
        m,
        Member {
            offset: 512,
            size: big
        }
    );
    let (w, mut buf) = (m.window(&img), [0u8; 5]);
    w.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"first");
    w.read_exact_at(&mut buf, big - 5).unwrap();
    assert_eq!(&buf, b"last!");
    let m = find_member(&img, "vm.ovf").unwrap();
    assert_eq!(bytes_of(&img, m), b"hello world");
    // Cut inside the big member: refused, not read past.
    f.set_len(1 << 30).unwrap();
    let img = FileImg::open(&d.join("big.tar"));
    match find_member(&img, "disk1.vmdk") {
        Err(TarError::Corrupt(why)) => assert!(why.starts_with("truncated"), "{why}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_missing_member_names_what_the_archive_has() {
    let tmp = TempDir::new().unwrap();
    let d = tmp.path();
    fs::write(d.join("vm.ovf"), "x").unwrap();
    fs::write(d.join("disk1.vmdk"), "y").unwrap();
    fs::create_dir(d.join("dir")).unwrap();
    tar(d, &["-cf", "vm.ova", "vm.ovf", "dir", "disk1.vmdk"]);
    let img = FileImg::open(&d.join("vm.ova"));
    let e = find_member(&img, "disk2.vmdk").unwrap_err();
    assert_eq!(
        e.to_string(),
        "no member \"disk2.vmdk\" in the archive; it has \"vm.ovf\", \"disk1.vmdk\""
    );
}

/// An archive of each kind GNU tar writes, for the fuzzing below.
fn small_archives() -> &'static [(Vec<u8>, Vec<String>)] {
    static ARCHIVES: OnceLock<Vec<(Vec<u8>, Vec<String>)>> = OnceLock::new();
    ARCHIVES.get_or_init(|| {
        let tmp = TempDir::new().unwrap();
        let d = tmp.path();
        let long = format!("{}/{}", "a".repeat(110), "b".repeat(120));
        fs::create_dir(d.join("a".repeat(110))).unwrap();
        fs::write(d.join(&long), noise(1, 700)).unwrap();
        fs::write(d.join("x"), noise(2, 30)).unwrap();
        symlink("x", d.join("l")).unwrap();
        let sp = fs::File::create(d.join("sp")).unwrap();
        sp.set_len(1 << 20).unwrap();
        sp.write_all_at(b"data", 4096).unwrap();
        let names = vec![long.clone(), "x".into(), "l".into(), "sp".into()];
        ["gnu", "pax"]
            .iter()
            .map(|format| {
                let a = format!("{format}.tar");
                tar(
                    d,
                    &["-S", "--format", format, "-cf", &a, &long, "x", "l", "sp"],
                );
                // Without the padding to 10 KiB: fewer blocks of zeros.
                let mut bytes = fs::read(d.join(&a)).unwrap();
                let (_, end) = listing(d, &a);
                bytes.truncate((end as usize + 2) * 512);
                (bytes, names.clone())
            })
            .collect()
    })
}

/// Counts reads, to show the walk is bounded.
struct Counted<'a>(&'a [u8], AtomicU64);

impl ReadAt for Counted<'_> {
    fn read_exact_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        self.1.fetch_add(1, Relaxed);
        self.0.read_exact_at(buf, off)
    }
    fn size(&self) -> u64 {
        self.0.len() as u64
    }
}

/// Store the checksum of every block that was a header, so mutations
/// reach the fields behind it.
fn fix_checksums(bytes: &mut [u8], original: &[u8]) {
    for (block, orig) in bytes.chunks_mut(512).zip(original.chunks(512)) {
        let was_header = orig.len() == 512 && orig[257..262] == *b"ustar";
        if was_header && block.len() == 512 {
            block[148..156].fill(b' ');
            let sum: u32 = block.iter().map(|&c| u32::from(c)).sum();
            block[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    /// Random mutations of real archives never panic, never loop, and
    /// never name bytes outside the archive.
    #[test]
    fn mutated_archives_never_panic_or_loop(
        which in 0usize..2,
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..12),
        fix in any::<bool>(),
        cut in prop::option::of(any::<prop::sample::Index>()),
    ) {
        let (original, names) = &small_archives()[which];
        let mut bytes = original.clone();
        for (at, value) in &flips {
            let i = at.index(bytes.len());
            bytes[i] = *value;
        }
        if fix {
            fix_checksums(&mut bytes, original);
        }
        if let Some(cut) = cut {
            bytes.truncate(cut.index(bytes.len() + 1));
        }
        let r = Counted(&bytes, AtomicU64::new(0));
        let blocks = bytes.len() as u64 / 512 + 2;
        for name in names.iter().map(String::as_str).chain(["nothing"]) {
            r.1.store(0, Relaxed);
            if let Ok(m) = find_member(&r, name) {
                prop_assert!(m.offset.checked_add(m.size).is_some_and(|e| e <= bytes.len() as u64));
            }
            prop_assert!(r.1.load(Relaxed) <= blocks, "{} reads of {} blocks", r.1.load(Relaxed), blocks);
        }
        if let Ok(list) = list_members(&r, 100) {
            prop_assert!(list.len() <= 4);
        }
    }
}

#[test]
fn the_unmutated_archives_read_back() {
    // The fuzzing above starts from archives that do read.
    for (bytes, names) in small_archives() {
        let m = find_member(bytes, &names[0]).unwrap();
        assert!(bytes_of(bytes, m) == noise(1, 700));
        assert!(matches!(
            find_member(bytes, "l"),
            Err(TarError::NotRegular { .. })
        ));
        assert!(matches!(find_member(bytes, "sp"), Err(TarError::Sparse(_))));
        assert_eq!(list_members(bytes, 10).unwrap().len(), 2);
    }
}
