//! Hand-built archives that do not check out: each is refused, clearly.

use super::*;

#[test]
fn checksums() {
    let mut a = archive(&[file("a", 5), file("b", 5)]);
    // Signed sums, as some old tars wrote them, are accepted.
    let mut h = hdr("\u{e9}t\u{e9}", b'0', 5);
    let signed: i32 = h
        .iter()
        .enumerate()
        .map(|(i, &c)| {
            if (148..156).contains(&i) {
                32
            } else {
                i32::from(c as i8)
            }
        })
        .sum();
    h[148..156].copy_from_slice(format!("{signed:06o}\0 ").as_bytes());
    assert_eq!(header::check(&h), Check::Valid);
    a[1024..1536].copy_from_slice(&h);
    assert_eq!(find_member(&a, "\u{e9}t\u{e9}").unwrap().offset, 1536);
    // One bit off in a later header.
    a[1024 + 20] ^= 1;
    assert!(corrupt(find_member(&a, "a")).contains("header at offset 1024 has a bad checksum"));
    // A garbled checksum field.
    let mut a = archive(&[file("a", 5)]);
    a[148..156].copy_from_slice(b"12x4567 ");
    assert!(corrupt(find_member(&a, "a")).contains("bad checksum"));
    // The first header bad: a tar (magic) that is corrupt, or not a tar.
    let mut a = archive(&[file("a", 5)]);
    a[0] = b'z';
    assert!(corrupt(find_member(&a, "a")).contains("header at offset 0"));
    a[257..265].fill(b'q');
    assert!(matches!(find_member(&a, "a"), Err(TarError::NotTar(_))));
}

#[test]
fn truncated_archives() {
    let full = archive(&[file("a", 700), file("b", 5)]);
    // Within b's data: b is cut.
    let r = corrupt(find_member(&full[..2048 + 3].to_vec(), "a"));
    assert!(r.contains("truncated") && r.contains("\"b\""), "{r}");
    // Within a header.
    assert!(corrupt(find_member(&full[..1536 + 100].to_vec(), "a")).contains("truncated"));
    // Within a's padding: a is whole and nothing can follow it.
    assert_eq!(find_member(&full[..1300].to_vec(), "a").unwrap().size, 700);
    // At a header boundary, without end blocks: fine (GNU tar warns).
    assert_eq!(find_member(&full[..1536].to_vec(), "a").unwrap().size, 700);
    assert_eq!(find_member(&full[..2560].to_vec(), "b").unwrap().size, 5);
    assert_eq!(find_member(&full[..2053].to_vec(), "b").unwrap().size, 5);
    // A size field that is not a number.
    let mut a = archive(&[file("a", 5)]);
    a[124..136].copy_from_slice(b"0000000x005\0");
    set_checksum((&mut a[..512]).try_into().unwrap());
    assert!(corrupt(find_member(&a, "a")).contains("unreadable size field"));
    // Sizes of 2^88 - 1 (too large for a u64) and 2^64 - 1 bytes.
    let mut a = archive(&[file("a", 5)]);
    a[124] = 0x80;
    a[125..136].fill(0xff);
    set_checksum((&mut a[..512]).try_into().unwrap());
    assert!(corrupt(find_member(&a, "a")).contains("unreadable size field"));
    a[125..128].fill(0);
    set_checksum((&mut a[..512]).try_into().unwrap());
    assert!(corrupt(find_member(&a, "a")).contains("truncated"));
}

#[test]
fn base_256_sizes_of_8_gib_and_more() {
    let big = (8 << 30) + 1;
    let mut h = hdr_with(Some(GNU), "disk1.vmdk", b'0', 0);
    h[124..136].copy_from_slice(&[0x80, 0, 0, 0, 0, 0, 0, 0x02, 0, 0, 0, 0x01]);
    set_checksum(&mut h);
    let after = 512 + (8 << 30) + 512;
    let v = Virtual {
        size: after + 512 + 512 + 1024,
        parts: vec![
            (0, h.to_vec()),
            (after, hdr("disk2.vmdk", b'0', 512).to_vec()),
        ],
        reads: AtomicU64::new(0),
    };
    assert_eq!(
        find_member(&v, "disk1.vmdk").unwrap(),
        Member {
            offset: 512,
            size: big
        }
    );
    assert_eq!(
        find_member(&v, "disk2.vmdk").unwrap(),
        Member {
            offset: after + 512,
            size: 512
        }
    );
    // Two headers and the end block: the data is never read.
    v.reads.store(0, Relaxed);
    list_members(&v, 10).unwrap();
    assert!(
        v.reads.load(Relaxed) <= 4,
        "{} reads",
        v.reads.load(Relaxed)
    );
    // The archive cut inside the big member.
    let cut = Virtual {
        size: 8 << 30,
        parts: v.parts.clone(),
        reads: AtomicU64::new(0),
    };
    assert!(corrupt(find_member(&cut, "disk1.vmdk")).contains("truncated"));
    // A negative base-256 size.
    let mut v = v;
    v.parts[0].1[124] = 0xff;
    set_checksum((&mut v.parts[0].1[..]).try_into().unwrap());
    assert!(corrupt(find_member(&v, "disk1.vmdk")).contains("size field"));
}

#[test]
fn gnu_long_names_are_bounded() {
    let data = vec![b'n'; (64 << 10) + 1];
    let a = archive(&[
        (
            hdr_with(Some(GNU), "././@LongLink", b'L', data.len() as u64),
            data,
        ),
        file("x", 1),
    ]);
    assert!(corrupt(find_member(&a, "x")).contains("GNU long name at offset 0 claims 65537 bytes"));
    // Absurd: 2^60 bytes in base-256, in a small archive.
    let mut h = hdr_with(Some(GNU), "././@LongLink", b'L', 0);
    h[124..136].copy_from_slice(&[0x80, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0, 0]);
    set_checksum(&mut h);
    let a = archive(&[(h, vec![]), file("x", 1)]);
    assert!(corrupt(find_member(&a, "x")).contains("claims 1152921504606846976 bytes"));
    // Within the bound but past the end.
    let mut a = archive(&[(
        hdr_with(Some(GNU), "././@LongLink", b'L', 4000),
        vec![b'n'; 4000],
    )]);
    a.truncate(2048);
    assert!(corrupt(find_member(&a, "x")).contains("truncated"));
}

#[test]
fn an_extended_header_needs_an_entry_after_it() {
    let a = archive(&[file("a", 1), pax(&[("path", "b")])]);
    assert!(corrupt(find_member(&a, "a")).contains("extended header at offset 1024"));
    let a = archive(&[file("a", 1), pax(&[("path", "b")])]);
    assert!(corrupt(find_member(&a[..2048].to_vec(), "a")).contains("before the entry"));
}

#[test]
fn pax_headers_with_bad_records_are_corrupt() {
    for bad in [
        &b"path=x\n"[..],
        b"30 path=x\n",
        b"9 path=xy\n",
        b"12 size=12x\n",
        b"7 path\n",
    ] {
        let a = archive(&[
            (hdr("PaxHeaders/x", b'x', bad.len() as u64), bad.to_vec()),
            file("x", 1),
        ]);
        let why = corrupt(find_member(&a, "x"));
        assert!(
            why.starts_with("the PAX extended header at offset 0 has a"),
            "{why}"
        );
    }
    // Bounded: 1 MiB at most, without reading it.
    let mut h = hdr("PaxHeaders/x", b'x', 0);
    h[124..136].copy_from_slice(b"00004000001\0");
    set_checksum(&mut h);
    assert!(corrupt(find_member(&archive(&[(h, vec![])]), "x")).contains("at most 1048576"));
    // Global headers are bounded too, and otherwise ignored.
    let mut g = pax(&[("path", "ignored")]);
    g.0[156] = b'g';
    set_checksum(&mut g.0);
    let a = archive(&[g, file("x", 1)]);
    assert_eq!(find_member(&a, "x").unwrap().size, 1);
}

#[test]
fn compressed_and_other_files() {
    for (magic, kind) in [
        (&b"\x1f\x8b\x08\x00"[..], "gzip"),
        (b"\xfd7zXZ\x00\x00", "xz"),
        (b"\x28\xb5\x2f\xfd", "zstd"),
        (b"BZh91AY&SY", "bzip2"),
        (b"\x04\x22\x4d\x18", "lz4"),
        (b"LZIP\x01", "lzip"),
    ] {
        for len in [magic.len(), 600, 100_000] {
            let mut f = magic.to_vec();
            f.resize(len, 0x5a);
            match find_member(&f, "x") {
                Err(e @ TarError::Compressed(k)) => {
                    assert_eq!(k, kind);
                    assert!(e.to_string().contains("decompress it first"));
                }
                other => panic!("{kind}: {other:?}"),
            }
        }
    }
    // A tar whose first member's name looks like a magic number is a tar.
    let a = archive(&[file("BZh9-not-bzip2", 4)]);
    assert_eq!(find_member(&a, "BZh9-not-bzip2").unwrap().size, 4);
    let not = |f: &[u8]| matches!(find_member(&f.to_vec(), "x"), Err(TarError::NotTar(_)));
    assert!(not(b""));
    assert!(not(b"hello"));
    assert!(not(b"PK\x03\x04 zip"));
    assert!(not(&[0x55; 4096]));
}

#[test]
fn messages_show_at_most_200_characters_of_a_name() {
    let long = "n".repeat(5000);
    let mut a = archive(&[
        pax(&[("path", &long)]),
        (hdr("x", b'0', 4000), vec![1; 4000]),
    ]);
    a.truncate(512 + 5120 + 512 + 100); // inside the member's data
    let why = corrupt(find_member(&a, "x"));
    assert!(
        why.contains(&format!("\"{}...\"", "n".repeat(200))),
        "{why}"
    );
    assert!(why.len() < 400, "{why}");
}
