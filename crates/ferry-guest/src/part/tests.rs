//! Hand-built tables: the checks one at a time.

use super::*;

const MIB: u64 = 1 << 20;

fn put(img: &mut [u8], off: u64, bytes: &[u8]) {
    let off = off as usize;
    img[off..off + bytes.len()].copy_from_slice(bytes);
}

/// An MBR (or EBR) entry at slot `i` of the sector at `sector_off`.
fn mbr_entry(img: &mut [u8], sector_off: u64, i: u64, status: u8, kind: u8, start: u32, n: u32) {
    let off = sector_off + 446 + 16 * i;
    put(img, off, &[status]);
    put(img, off + 4, &[kind]);
    put(img, off + 8, &start.to_le_bytes());
    put(img, off + 12, &n.to_le_bytes());
    put(img, sector_off + 510, &[0x55, 0xAA]);
}

fn corrupt(r: Result<Table, FsError>) -> String {
    match r {
        Err(FsError::Corrupt { why, .. }) => why,
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

fn summary(t: &Table) -> Vec<(u32, u64, u64, String)> {
    t.parts
        .iter()
        .map(|p| (p.number, p.start / 512, p.len / 512, p.type_name.clone()))
        .collect()
}

#[test]
fn no_signature_is_no_table() {
    let img = vec![0u8; 4096];
    assert_eq!(read_table(&img).unwrap().scheme, Scheme::None);
    let tiny = vec![0u8; 100];
    assert_eq!(read_table(&tiny).unwrap().scheme, Scheme::None);
}

#[test]
fn primaries_sorted_numbered_named() {
    let mut img = vec![0u8; 8 * MIB as usize];
    mbr_entry(&mut img, 0, 0, 0x00, 0x83, 8192, 2048);
    mbr_entry(&mut img, 0, 1, 0x80, 0x82, 2048, 2048);
    mbr_entry(&mut img, 0, 3, 0x00, 0x42, 4096, 4096);
    let t = read_table(&img).unwrap();
    assert_eq!(t.scheme, Scheme::Mbr);
    assert_eq!(
        summary(&t),
        vec![
            (2, 2048, 2048, "Linux swap".to_string()),
            (4, 4096, 4096, "type 0x42".to_string()),
            (1, 8192, 2048, "Linux".to_string()),
        ]
    );
}

#[test]
fn boot_code_or_empty_entries_are_no_table() {
    let mut img = vec![0u8; MIB as usize];
    mbr_entry(&mut img, 0, 0, 0x12, 0x83, 2048, 2048);
    assert_eq!(read_table(&img).unwrap().scheme, Scheme::None);
    let mut img = vec![0u8; MIB as usize];
    put(&mut img, 510, &[0x55, 0xAA]);
    assert_eq!(read_table(&img).unwrap().scheme, Scheme::None);
}

/// An extended partition at 2048 (8 MiB) with logical partitions of
/// `sizes` sectors, each one MiB after its EBR.
fn with_logicals(sizes: &[u32]) -> Vec<u8> {
    let mut img = vec![0u8; 16 * MIB as usize];
    mbr_entry(&mut img, 0, 0, 0, 0x83, 100, 1000);
    mbr_entry(&mut img, 0, 1, 0, 0x05, 2048, 16384);
    let mut link = 0u32;
    for (i, &n) in sizes.iter().enumerate() {
        let ebr = u64::from(2048 + link) * 512;
        mbr_entry(
            &mut img,
            ebr,
            0,
            0,
            if i == 1 { 0x82 } else { 0x83 },
            2048,
            n,
        );
        let next = link + 2048 + n;
        if i + 1 < sizes.len() {
            mbr_entry(&mut img, ebr, 1, 0, 0x05, next, 2048 + sizes[i + 1]);
        }
        link = next;
    }
    img
}

#[test]
fn logical_partitions_follow_the_chain() {
    let img = with_logicals(&[1000, 2000, 500]);
    let t = read_table(&img).unwrap();
    assert_eq!(
        summary(&t),
        vec![
            (1, 100, 1000, "Linux".to_string()),
            (5, 4096, 1000, "Linux".to_string()),
            (6, 7144, 2000, "Linux swap".to_string()),
            (7, 11192, 500, "Linux".to_string()),
        ]
    );
}

#[test]
fn ebr_loops_and_long_chains_are_corrupt() {
    // The third EBR links back to the first.
    let mut img = with_logicals(&[1000, 1000, 1000]);
    let third = (2048 + 2 * 3048u64) * 512;
    mbr_entry(&mut img, third, 1, 0, 0x05, 0, 100);
    assert!(corrupt(read_table(&img)).contains("loops"));
    // An EBR that links to itself.
    let mut img = with_logicals(&[1000]);
    mbr_entry(&mut img, 2048 * 512, 1, 0, 0x05, 0, 100);
    assert!(corrupt(read_table(&img)).contains("loops"));
    // 200 EBRs one sector apart, each with an empty logical entry.
    let mut img = vec![0u8; 16 * MIB as usize];
    mbr_entry(&mut img, 0, 0, 0, 0x0f, 2048, 16384);
    for i in 0..200u32 {
        let ebr = u64::from(2048 + i) * 512;
        mbr_entry(&mut img, ebr, 1, 0, 0x05, i + 1, 1);
    }
    assert!(corrupt(read_table(&img)).contains("more than 128"));
}

#[test]
fn bad_ebrs_are_corrupt() {
    let mut img = with_logicals(&[1000, 1000]);
    let second = (2048 + 3048u64) * 512;
    put(&mut img, second + 510, &[0, 0]);
    assert!(corrupt(read_table(&img)).contains("signature"));
    // A link past the extended partition's end.
    let mut img = with_logicals(&[1000]);
    mbr_entry(&mut img, 2048 * 512, 1, 0, 0x05, 20000, 100);
    assert!(corrupt(read_table(&img)).contains("outside the extended"));
    // A third entry in an EBR.
    let mut img = with_logicals(&[1000]);
    mbr_entry(&mut img, 2048 * 512, 2, 0, 0x83, 3000, 100);
    assert!(corrupt(read_table(&img)).contains("more than two"));
    // A logical partition over its own EBR.
    let mut img = with_logicals(&[1000]);
    mbr_entry(&mut img, 2048 * 512, 0, 0, 0x83, 0, 100);
    assert!(corrupt(read_table(&img)).contains("own sectors"));
    // The EBR past the image's end.
    let mut img = with_logicals(&[1000]);
    img.truncate(512 * 2048);
    assert!(corrupt(read_table(&img)).contains("truncated"));
}

#[test]
fn overlaps_are_corrupt() {
    let mut img = vec![0u8; 8 * MIB as usize];
    mbr_entry(&mut img, 0, 0, 0, 0x83, 2048, 2048);
    mbr_entry(&mut img, 0, 1, 0, 0x83, 4095, 2048);
    assert!(corrupt(read_table(&img)).contains("overlap"));
    // Over the MBR itself.
    let mut img = vec![0u8; 8 * MIB as usize];
    mbr_entry(&mut img, 0, 0, 0, 0x83, 0, 2048);
    assert!(corrupt(read_table(&img)).contains("own sectors"));
    // A primary inside the extended partition.
    let mut img = with_logicals(&[1000]);
    mbr_entry(&mut img, 0, 2, 0, 0x83, 3000, 10);
    assert!(corrupt(read_table(&img)).contains("extended"));
    // A logical over a primary.
    let mut img = with_logicals(&[1000]);
    mbr_entry(&mut img, 2048 * 512, 0, 0, 0x83, 20000 - 2048, 100);
    mbr_entry(&mut img, 0, 2, 0, 0x83, 20050, 100);
    assert!(corrupt(read_table(&img)).contains("partitions 5 and 3 overlap"));
    // Two extended partitions.
    let mut img = with_logicals(&[1000]);
    mbr_entry(&mut img, 0, 2, 0, 0x85, 30000, 100);
    assert!(corrupt(read_table(&img)).contains("two extended"));
}

#[test]
fn truncated_images_keep_the_declared_extent() {
    let mut img = vec![0u8; 4 * MIB as usize];
    mbr_entry(&mut img, 0, 0, 0, 0x83, 2048, 4096);
    mbr_entry(&mut img, 0, 1, 0, 0x83, 8192, 4096);
    let t = read_table(&img).unwrap();
    assert_eq!(summary(&t), vec![(1, 2048, 4096, "Linux".to_string())]);
}

// GPT

const LINUX: [u8; 16] = guid(
    0x0FC63DAF,
    0x8483,
    0x4772,
    [0x8E, 0x79, 0x3D, 0x69, 0xD8, 0x47, 0x7D, 0xE4],
);
const SWAP: [u8; 16] = guid(
    0x0657FD6D,
    0xA4AB,
    0x43C4,
    [0x84, 0xE5, 0x09, 0x33, 0xC8, 0x4B, 0x4F, 0x4F],
);

const fn guid(a: u32, b: u16, c: u16, d: [u8; 8]) -> [u8; 16] {
    let a = a.to_le_bytes();
    let b = b.to_le_bytes();
    let c = c.to_le_bytes();
    [
        a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], d[0], d[1], d[2], d[3], d[4], d[5], d[6],
        d[7],
    ]
}

/// A GPT entry: its index, type, first and last LBA.
type Entry = (usize, [u8; 16], u64, u64);

/// A GPT disk of `sectors` sectors of `ss` bytes with 128 entries, `parts`
/// (entry index, type, first, last).
fn gpt(ss: u64, sectors: u64, parts: &[Entry]) -> Vec<u8> {
    let mut img = vec![0u8; (ss * sectors) as usize];
    mbr_entry(
        &mut img,
        0,
        0,
        0,
        0xEE,
        1,
        u32::try_from(sectors - 1).unwrap_or(u32::MAX),
    );
    let mut array = vec![0u8; 128 * 128];
    for &(i, t, first, last) in parts {
        array[i * 128..i * 128 + 16].copy_from_slice(&t);
        array[i * 128 + 16] = i as u8 + 1;
        array[i * 128 + 32..i * 128 + 40].copy_from_slice(&first.to_le_bytes());
        array[i * 128 + 40..i * 128 + 48].copy_from_slice(&last.to_le_bytes());
    }
    let table = (128 * 128u64).div_ceil(ss);
    let last = sectors - 1;
    for (lba, alt, entries) in [(1, last, 2), (last, 1, last - table)] {
        let mut h = vec![0u8; 92];
        h[0..8].copy_from_slice(b"EFI PART");
        h[8..12].copy_from_slice(&0x10000u32.to_le_bytes());
        h[12..16].copy_from_slice(&92u32.to_le_bytes());
        h[24..32].copy_from_slice(&u64::to_le_bytes(lba));
        h[32..40].copy_from_slice(&u64::to_le_bytes(alt));
        h[40..48].copy_from_slice(&(2 + table).to_le_bytes());
        h[48..56].copy_from_slice(&(last - table - 1).to_le_bytes());
        h[72..80].copy_from_slice(&u64::to_le_bytes(entries));
        h[80..84].copy_from_slice(&128u32.to_le_bytes());
        h[84..88].copy_from_slice(&128u32.to_le_bytes());
        h[88..92].copy_from_slice(&crate::crc32_ieee(&array).to_le_bytes());
        let crc = crate::crc32_ieee(&h);
        h[16..20].copy_from_slice(&crc.to_le_bytes());
        put(&mut img, lba * ss, &h);
        put(&mut img, entries * ss, &array);
    }
    img
}

fn gpt_summary(t: &Table, ss: u64) -> Vec<(u32, u64, u64, String)> {
    t.parts
        .iter()
        .map(|p| (p.number, p.start / ss, p.len / ss, p.type_name.clone()))
        .collect()
}

const UNKNOWN: [u8; 16] = [0xAB; 16];

fn two_parts() -> [Entry; 3] {
    [
        (4, SWAP, 2048, 4095),
        (0, LINUX, 4096, 8191),
        (7, UNKNOWN, 8192, 9000),
    ]
}

fn two_parts_want(ss: u64) -> Vec<(u32, u64, u64, String)> {
    let _ = ss;
    vec![
        (5, 2048, 2048, "Linux swap".to_string()),
        (1, 4096, 4096, "Linux filesystem".to_string()),
        (8, 8192, 809, format!("type {}", gpt::guid_text(&UNKNOWN))),
    ]
}

#[test]
fn gpt_entries_numbered_by_index() {
    let img = gpt(512, 16384, &two_parts());
    let t = read_table(&img).unwrap();
    assert_eq!(t.scheme, Scheme::Gpt);
    assert_eq!(gpt_summary(&t, 512), two_parts_want(512));
    assert_eq!(
        gpt::guid_text(&LINUX),
        "0FC63DAF-8483-4772-8E79-3D69D8477DE4"
    );
    assert_eq!(
        gpt::guid_text(&UNKNOWN),
        "ABABABAB-ABAB-ABAB-ABAB-ABABABABABAB"
    );
}

#[test]
fn gpt_with_4096_byte_sectors() {
    let img = gpt(4096, 16384, &two_parts());
    let t = read_table(&img).unwrap();
    assert_eq!(gpt_summary(&t, 4096), two_parts_want(4096));
    assert_eq!(t.parts[0].start, 2048 * 4096);
}

#[test]
fn gpt_backup_when_the_primary_is_bad() {
    let good = gpt(512, 16384, &two_parts());
    let want = read_table(&good).unwrap();
    // Header CRC.
    let mut img = good.clone();
    img[512 + 40] ^= 1;
    assert_eq!(read_table(&img).unwrap(), want);
    // Entries' CRC.
    let mut img = good.clone();
    img[1024 + 200] ^= 1;
    assert_eq!(read_table(&img).unwrap(), want);
    // No primary header at all.
    let mut img = good.clone();
    img[512..1024].fill(0);
    assert_eq!(read_table(&img).unwrap(), want);
    // And with 4096-byte sectors.
    let good4k = gpt(4096, 16384, &two_parts());
    let mut img = good4k.clone();
    img[4096..8192].fill(0);
    assert_eq!(read_table(&img).unwrap(), read_table(&good4k).unwrap());
    // Both bad.
    let mut img = good.clone();
    img[512 + 40] ^= 1;
    let backup = 16383 * 512;
    img[backup + 40] ^= 1;
    let why = corrupt(read_table(&img));
    assert!(why.contains("primary") && why.contains("backup"), "{why}");
}

#[test]
fn gpt_bad_entries_are_corrupt() {
    let cases: [(&[Entry], &str); 4] = [
        (&[(0, LINUX, 2048, 4095), (1, LINUX, 4000, 5000)], "overlap"),
        (&[(0, LINUX, 2048, 1000)], "usable"),
        (&[(0, LINUX, 2, 1000)], "usable"),
        (&[(0, LINUX, 2048, 16383)], "usable"),
    ];
    for (parts, want) in cases {
        let img = gpt(512, 16384, parts);
        let why = corrupt(read_table(&img));
        assert!(why.contains(want), "{why}");
    }
}

#[test]
fn gpt_header_fields_are_checked() {
    // Re-seal the primary header after changing a field, and break the
    // backup: the primary's own check must reject it.
    let reseal = |f: &dyn Fn(&mut [u8])| {
        let mut img = gpt(512, 16384, &two_parts());
        let backup = 16383 * 512;
        img[backup] ^= 1;
        let h = &mut img[512..604];
        f(h);
        h[16..20].fill(0);
        let crc = crate::crc32_ieee(h);
        h[16..20].copy_from_slice(&crc.to_le_bytes());
        corrupt(read_table(&img))
    };
    let huge = reseal(&|h| h[80..84].copy_from_slice(&u32::MAX.to_le_bytes()));
    assert!(huge.contains("entries"), "{huge}");
    let size = reseal(&|h| h[84..88].copy_from_slice(&100u32.to_le_bytes()));
    assert!(size.contains("entry size"), "{size}");
    let lba = reseal(&|h| h[24..32].copy_from_slice(&5u64.to_le_bytes()));
    assert!(lba.contains("LBA 5"), "{lba}");
    let rev = reseal(&|h| h[8..12].copy_from_slice(&0x20000u32.to_le_bytes()));
    assert!(rev.contains("revision"), "{rev}");
    let usable = reseal(&|h| h[40..48].copy_from_slice(&1u64.to_le_bytes()));
    assert!(usable.contains("own sectors"), "{usable}");
    let far = reseal(&|h| h[72..80].copy_from_slice(&(u64::MAX / 256).to_le_bytes()));
    assert!(far.contains("entries"), "{far}");
}

#[test]
fn gpt_truncated_image() {
    // Cut inside the third partition: the primary is used, the third is
    // listed whole, a partition past the end is left out.
    let mut parts = two_parts().to_vec();
    parts.push((9, LINUX, 12000, 13000));
    let mut img = gpt(512, 16384, &parts);
    img.truncate(8500 * 512);
    let t = read_table(&img).unwrap();
    assert_eq!(gpt_summary(&t, 512), two_parts_want(512));
}
