//! Hand-built archives: every format detail (and, in `corrupt`, every
//! corruption).

mod corrupt;

use super::header::{self, set_checksum, Block, Check, BLOCK};
use super::*;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

pub(super) const USTAR: &[u8; 8] = b"ustar\x0000";
pub(super) const GNU: &[u8; 8] = b"ustar  \x00";

/// A header of the given magic (or none: v7) with a valid checksum.
pub(super) fn hdr_with(magic: Option<&[u8; 8]>, name: &str, flag: u8, size: u64) -> Block {
    let mut b: Block = [0; 512];
    b[..name.len()].copy_from_slice(name.as_bytes());
    b[100..108].copy_from_slice(b"0000644\0");
    b[108..116].copy_from_slice(b"0000000\0");
    b[116..124].copy_from_slice(b"0000000\0");
    b[124..136].copy_from_slice(format!("{size:011o}\0").as_bytes());
    b[136..148].copy_from_slice(b"14000000000\0");
    b[156] = flag;
    if let Some(m) = magic {
        b[257..265].copy_from_slice(m);
    }
    set_checksum(&mut b);
    b
}

pub(super) fn hdr(name: &str, flag: u8, size: u64) -> Block {
    hdr_with(Some(USTAR), name, flag, size)
}

/// The bytes of a member called `name`: its name repeated, then a counter.
pub(super) fn content(name: &str, len: usize) -> Vec<u8> {
    let name = name.as_bytes();
    (0..len)
        .map(|i| name[i % name.len()] ^ (i as u8) ^ (i >> 8) as u8)
        .collect()
}

/// Headers each followed by their data, padded; then the end blocks.
pub(super) fn archive(entries: &[(Block, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (h, data) in entries {
        out.extend_from_slice(h);
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.resize(out.len() + 1024, 0);
    out
}

pub(super) fn file(name: &str, len: usize) -> (Block, Vec<u8>) {
    (hdr(name, b'0', len as u64), content(name, len))
}

/// A PAX extended header holding `records`.
pub(super) fn pax(records: &[(&str, &str)]) -> (Block, Vec<u8>) {
    let mut data = Vec::new();
    for (k, v) in records {
        let kv = format!("{k}={v}");
        let mut len = kv.len() + 3;
        while format!("{len} {kv}\n").len() != len {
            len = format!("{len} {kv}\n").len();
        }
        data.extend_from_slice(format!("{len} {kv}\n").as_bytes());
    }
    (hdr("PaxHeaders/x", b'x', data.len() as u64), data)
}

pub(super) fn read_member(a: &dyn ReadAt, m: Member) -> Vec<u8> {
    let mut buf = vec![0; m.size as usize];
    m.window(a).read_exact_at(&mut buf, 0).unwrap();
    buf
}

pub(super) fn corrupt(r: Result<Member, TarError>) -> String {
    match r {
        Err(TarError::Corrupt(why)) => why,
        other => panic!("not Corrupt: {other:?}"),
    }
}

/// An image of `size` bytes, zero but for a few parts: an archive with a
/// member of many GiB, in memory.
pub(super) struct Virtual {
    pub size: u64,
    pub parts: Vec<(u64, Vec<u8>)>,
    pub reads: AtomicU64,
}

impl ReadAt for Virtual {
    fn read_exact_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        self.reads.fetch_add(1, Relaxed);
        let end = off
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= self.size);
        end.ok_or(io::ErrorKind::UnexpectedEof)?;
        buf.fill(0);
        for (at, bytes) in &self.parts {
            for (i, &b) in bytes.iter().enumerate() {
                let p = at + i as u64;
                if p >= off && p < off + buf.len() as u64 {
                    buf[(p - off) as usize] = b;
                }
            }
        }
        Ok(())
    }
    fn size(&self) -> u64 {
        self.size
    }
}

#[test]
fn numbers() {
    assert_eq!(header::octal(b"00000000017\0"), Some(15));
    assert_eq!(header::octal(b"   17 \0\0\0\0\0\0"), Some(15));
    assert_eq!(header::octal(b"17"), Some(15));
    assert_eq!(header::octal(b"\0\0\0\0"), Some(0));
    assert_eq!(header::octal(b"    "), Some(0));
    assert_eq!(header::octal(b"18\0"), None);
    assert_eq!(header::octal(b"1x"), None);
    assert_eq!(header::octal(b"\0\x01"), None);
    assert_eq!(header::octal(b"7777777777777777777777777"), None);
    let mut b256 = [0u8; 12];
    b256[0] = 0x80;
    b256[7] = 0x02;
    b256[11] = 0x01;
    assert_eq!(header::number(&b256), Some((2 << 32) + 1));
    b256[0] = 0xff; // negative
    assert_eq!(header::number(&b256), None);
    let mut huge = [0xffu8; 12];
    huge[0] = 0x80;
    assert_eq!(header::number(&huge), None);
}

#[test]
fn finds_members_of_each_format() {
    for magic in [Some(USTAR), Some(GNU), None] {
        let a = archive(&[
            (hdr_with(magic, "a", b'0', 5), content("a", 5)),
            (hdr_with(magic, "./b.img", 0, 1300), content("b", 1300)),
            (hdr_with(magic, "c", b'7', 512), content("c", 512)),
            (hdr_with(magic, "e", b'0', 0), vec![]),
        ]);
        let b = find_member(&a, "b.img").unwrap();
        assert_eq!(
            b,
            Member {
                offset: 1536,
                size: 1300
            }
        );
        assert_eq!(read_member(&a, b), content("b", 1300));
        assert_eq!(
            read_member(&a, find_member(&a, "./a").unwrap()),
            content("a", 5)
        );
        assert_eq!(
            read_member(&a, find_member(&a, "c").unwrap()),
            content("c", 512)
        );
        assert_eq!(
            find_member(&a, "e").unwrap(),
            Member {
                offset: 4608,
                size: 0
            }
        );
        let list = list_members(&a, 10).unwrap();
        assert_eq!(
            list,
            [
                ("a".into(), 5),
                ("b.img".into(), 1300),
                ("c".into(), 512),
                ("e".into(), 0)
            ]
        );
        assert_eq!(list_members(&a, 2).unwrap().len(), 2);
    }
}

#[test]
fn the_ustar_prefix_joins_the_name_but_not_in_gnu_headers() {
    let mut h = hdr("disk.vmdk", b'0', 3);
    h[345..352].copy_from_slice(b"vm/sub1");
    set_checksum(&mut h);
    let mut g = hdr_with(Some(GNU), "other", b'0', 3);
    g[345..352].copy_from_slice(b"1234567"); // GNU: atime, not a prefix
    set_checksum(&mut g);
    let a = archive(&[(h, b"abc".to_vec()), (g, b"def".to_vec())]);
    assert_eq!(
        read_member(&a, find_member(&a, "vm/sub1/disk.vmdk").unwrap()),
        b"abc"
    );
    assert!(matches!(
        find_member(&a, "disk.vmdk"),
        Err(TarError::NotFound { .. })
    ));
    assert_eq!(read_member(&a, find_member(&a, "other").unwrap()), b"def");
}

#[test]
fn what_is_not_a_regular_file() {
    let a = archive(&[
        (hdr("dir/", b'5', 0), vec![]),
        (hdr("link", b'2', 0), vec![]),
        (hdr("hard", b'1', 0), vec![]),
        (hdr("fifo", b'6', 0), vec![]),
        (hdr_with(None, "olddir/", b'0', 0), vec![]),
        (hdr("odd", b'Z', 0), vec![]),
    ]);
    for (name, what) in [
        ("dir", "a directory"),
        ("dir/", "a directory"),
        ("link", "a symbolic link"),
        ("hard", "a hard link"),
        ("fifo", "a FIFO"),
        ("olddir", "a directory"),
        ("odd", "an entry of a type ferry does not know"),
    ] {
        match find_member(&a, name) {
            Err(TarError::NotRegular { name: n, what: w }) => {
                assert_eq!((n.as_str(), w), (name, what))
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    assert_eq!(list_members(&a, 10).unwrap(), []);
}

#[test]
fn a_hard_link_has_no_data_whatever_its_size_field() {
    // GNU tar reads no data after a hard link ('1') or directory ('5').
    let a = archive(&[
        (hdr("hard", b'1', 4096), vec![]),
        (hdr("dir", b'5', 4096), vec![]),
        file("f", 7),
    ]);
    assert_eq!(
        find_member(&a, "f").unwrap(),
        Member {
            offset: 1536,
            size: 7
        }
    );
}

#[test]
fn the_last_occurrence_wins() {
    let a = archive(&[file("x", 10), file("y", 3), file("./x", 20)]);
    let m = find_member(&a, "x").unwrap();
    assert_eq!((m.size, read_member(&a, m)), (20, content("./x", 20)));
    assert_eq!(
        list_members(&a, 10).unwrap(),
        [("x".into(), 20), ("y".into(), 3)]
    );
    let a = archive(&[file("x", 10), (hdr("x/", b'5', 0), vec![])]);
    assert!(matches!(
        find_member(&a, "x"),
        Err(TarError::NotRegular { .. })
    ));
    assert_eq!(list_members(&a, 10).unwrap(), []);
}

#[test]
fn gnu_long_names() {
    let long = "vm/".repeat(60) + "disk.vmdk";
    let mut name = long.clone().into_bytes();
    name.push(0);
    let a = archive(&[
        (
            hdr_with(Some(GNU), "././@LongLink", b'L', name.len() as u64),
            name,
        ),
        (hdr_with(Some(GNU), &long[..100], b'0', 9), content("l", 9)),
        file("short", 1),
    ]);
    let m = find_member(&a, &long).unwrap();
    assert_eq!((m.offset, read_member(&a, m)), (1536, content("l", 9)));
    // The long name applies to one entry only.
    assert_eq!(find_member(&a, "short").unwrap().size, 1);
    assert!(matches!(
        find_member(&a, &long[..100]),
        Err(TarError::NotFound { .. })
    ));
}

#[test]
fn pax_overrides_path_and_size() {
    let long = "d/".repeat(300) + "disk.raw";
    let a = archive(&[
        pax(&[("mtime", "1.5"), ("path", &long)]),
        (hdr("short-name", b'0', 30), content("p", 30)),
        pax(&[("size", "700")]),
        (hdr("sized", b'0', 0), content("s", 700)),
        file("after", 2),
    ]);
    assert_eq!(
        read_member(&a, find_member(&a, &long).unwrap()),
        content("p", 30)
    );
    assert!(matches!(
        find_member(&a, "short-name"),
        Err(TarError::NotFound { .. })
    ));
    assert_eq!(
        read_member(&a, find_member(&a, "sized").unwrap()),
        content("s", 700)
    );
    assert_eq!(find_member(&a, "after").unwrap().size, 2);
}

#[test]
fn sparse_members() {
    // PAX sparse 1.0: the name is GNU.sparse.name.
    let a = archive(&[
        pax(&[
            ("GNU.sparse.major", "1"),
            ("GNU.sparse.minor", "0"),
            ("GNU.sparse.name", "d/sp"),
        ]),
        (hdr("d/GNUSparseFile.1/sp", b'0', 1024), vec![7; 1024]),
        pax(&[("GNU.sparse.size", "99999"), ("GNU.sparse.numblocks", "0")]),
        (hdr("old", b'0', 0), vec![]),
        file("next", 3),
    ]);
    for name in ["d/sp", "old"] {
        match find_member(&a, name) {
            Err(e @ TarError::Sparse(_)) => assert!(e.to_string().contains("sparse tar member")),
            other => panic!("{name}: {other:?}"),
        }
    }
    assert_eq!(find_member(&a, "next").unwrap().offset, 512 * 9);
    assert_eq!(list_members(&a, 10).unwrap(), [("next".into(), 3)]);

    // Old GNU 'S' with two extension blocks of sparse map before its data.
    let mut s = hdr_with(Some(GNU), "sp", b'S', 1000);
    s[482] = 1;
    set_checksum(&mut s);
    let mut ext = vec![0u8; 1024];
    ext[504] = 1;
    ext.extend(vec![9u8; 1000]);
    let a = archive(&[(s, ext), file("next", 3)]);
    assert!(matches!(find_member(&a, "sp"), Err(TarError::Sparse(_))));
    let next = find_member(&a, "next").unwrap();
    assert_eq!(
        (next.offset, read_member(&a, next)),
        (512 * 6, content("next", 3))
    );
    // Extension blocks that run off the end.
    let mut s = hdr_with(Some(GNU), "sp", b'S', 0);
    s[482] = 1;
    set_checksum(&mut s);
    let a = [s.to_vec(), vec![1u8; 512 * 3]].concat();
    assert!(corrupt(find_member(&a, "sp")).contains("sparse map"));
}

#[test]
fn empty_archives_and_end_blocks() {
    let empty = vec![0u8; 10240];
    match find_member(&empty, "x") {
        Err(e @ TarError::NotFound { .. }) => {
            assert_eq!(
                e.to_string(),
                "no member \"x\" in the archive; it has no regular files"
            )
        }
        other => panic!("{other:?}"),
    }
    // The first zero block ends the archive (as GNU tar): what follows it
    // is not read.
    let mut a = archive(&[file("a", 1)]);
    a.truncate(1536);
    a.extend_from_slice(&archive(&[file("b", 1)]));
    assert_eq!(list_members(&a, 10).unwrap(), [("a".into(), 1)]);
}

#[test]
fn not_found_lists_what_there_is() {
    let entries: Vec<_> = (0..12).map(|i| file(&format!("./f{i}"), i)).collect();
    let a = archive(&entries);
    let e = find_member(&a, "disk.vmdk").unwrap_err();
    match &e {
        TarError::NotFound { have, more, .. } => {
            assert_eq!(have.len(), 10);
            assert_eq!(have[0], "f0");
            assert!(more);
        }
        other => panic!("{other:?}"),
    }
    assert!(e
        .to_string()
        .starts_with("no member \"disk.vmdk\" in the archive; it has \"f0\", \"f1\", "));
    assert!(e.to_string().ends_with("\"f9\", ..."));
    // Names are quoted with escapes: an archive cannot write to the terminal.
    let a = archive(&[file("evil\x1b[2J", 1)]);
    let msg = find_member(&a, "x").unwrap_err().to_string();
    assert!(!msg.contains('\x1b') && msg.contains("\\u{1b}"), "{msg}");
    // An empty name matches nothing (not even "./").
    let a = archive(&[(hdr("./", b'5', 0), vec![]), file("a", 1)]);
    assert!(matches!(
        find_member(&a, "./"),
        Err(TarError::NotFound { .. })
    ));
}

#[test]
fn every_block_is_read_at_most_once() {
    // Many empty members: the walk advances a block a step.
    let entries: Vec<_> = (0..200).map(|i| file(&format!("f{i}"), 0)).collect();
    let a = archive(&entries);
    let v = Virtual {
        size: a.len() as u64,
        parts: vec![(0, a)],
        reads: AtomicU64::new(0),
    };
    assert_eq!(
        find_member(&v, "f199").unwrap(),
        Member {
            offset: 512 * 200,
            size: 0
        }
    );
    assert!(
        v.reads.load(Relaxed) <= 202,
        "{} reads",
        v.reads.load(Relaxed)
    );
}

#[test]
fn errors_read_well() {
    let e = TarError::NotRegular {
        name: "vm.ovf".into(),
        what: "a directory",
    };
    assert_eq!(
        e.to_string(),
        "\"vm.ovf\" in the archive is a directory, not a regular file"
    );
    let e = TarError::Compressed("gzip");
    assert_eq!(
        e.to_string(),
        "the archive is gzip-compressed; ferry reads members of uncompressed tars only (decompress it first)"
    );
    let e = TarError::NotTar("it is empty");
    assert_eq!(e.to_string(), "not a tar archive (it is empty)");
    let _ = BLOCK;
}

#[test]
fn link_names_labels_and_continuations() {
    let target = b"t".repeat(300);
    let a = archive(&[
        (hdr_with(Some(GNU), "backup of monday", b'V', 0), vec![]),
        (hdr_with(Some(GNU), "././@LongLink", b'K', 300), target),
        (hdr("link", b'2', 0), vec![]),
        (hdr_with(Some(GNU), "rest", b'M', 700), content("m", 700)),
        file("disk", 3),
    ]);
    let what = |name| match find_member(&a, name) {
        Err(TarError::NotRegular { what, .. }) => what,
        other => panic!("{name}: {other:?}"),
    };
    assert_eq!(what("link"), "a symbolic link");
    assert_eq!(what("backup of monday"), "a volume label");
    assert_eq!(
        what("rest"),
        "the continuation of a file from another volume"
    );
    assert_eq!(find_member(&a, "disk").unwrap().offset, 512 * 8);
}
