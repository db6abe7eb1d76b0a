//! Linux swap: only its header page is kept.
//!
//! A swap area's header page holds the boot bits, the version, the last
//! page, the bad pages, the UUID and the label, and ends in the magic
//! "SWAPSPACE2". The pages after it hold nothing that outlives the system
//! that used them, so they are all free, unless the area holds a
//! hibernation image (a suspended system waiting to resume): then nothing
//! of it is free.

use crate::error::FsError;
use crate::map::FsMap;
use crate::{Ranges, ReadAt};

const KIND: &str = "swap";
/// The page sizes a swap area is made with, tried in this order.
const PAGE_SIZES: [u64; 4] = [4096, 8192, 16384, 65536];
/// Offsets in the header page.
const VERSION: usize = 1024;
const LAST_PAGE: usize = 1028;
const NR_BADPAGES: usize = 1032;
const BADPAGES: usize = 1536;
/// The signatures a hibernation image writes over "SWAPSPACE2" (swsusp,
/// uswsusp and the kernel's newer one), compared on their first 9 bytes.
const HIBERNATION: [&[u8]; 4] = [b"S1SUSPEND", b"S2SUSPEND", b"ULSUSPEND", b"LINHIB000"];
/// TuxOnIce's signature, at offset 0.
const TUXONICE: &[u8; 8] = b"\xed\xc3\x02\xe9\x98\x56\xe5\x0c";

/// Map the Linux swap area that starts at offset 0 of `r`.
///
/// The magic is looked for at the end of the first page, for page sizes
/// 4096, 8192, 16384 and 65536 (the first that matches). "SWAP-SPACE"
/// (version 0, from before Linux 2.2) is unsupported. A hibernation
/// signature there (or TuxOnIce's at offset 0) means the area holds a
/// suspended system: it is reported in use, with no free range, so that
/// even `--force` copies it whole.
///
/// The version must be 1, little-endian or byte-swapped (a swap area made
/// by a big-endian system: its other fields are then read byte-swapped
/// too, as the kernel does). Free: pages 1 to `last_page` except the bad
/// ones; the header page and anything past the area are kept. An area
/// that claims more pages than `r` holds is corrupt ("truncated").
pub fn free_ranges(r: &dyn ReadAt) -> Result<FsMap, FsError> {
    let size = r.size();
    for ps in PAGE_SIZES {
        if ps > size {
            break;
        }
        let mut magic = [0u8; 10];
        read(r, &mut magic, ps - 10)?;
        if &magic == b"SWAPSPACE2" {
            let mut start = [0u8; 8];
            read(r, &mut start, 0)?;
            if &start == TUXONICE {
                return Ok(hibernated());
            }
            if let Some(other) = foreign_signature(r)? {
                return Err(FsError::corrupt(
                    KIND,
                    format!("a swap signature beside {other}'s: one of them is stale"),
                ));
            }
            return version1(r, ps);
        }
        if &magic == b"SWAP-SPACE" {
            return Err(FsError::unsupported(
                KIND,
                "version 0 swap area (SWAP-SPACE)",
            ));
        }
        if HIBERNATION.iter().any(|sig| magic.starts_with(sig)) {
            return Ok(hibernated());
        }
    }
    Err(FsError::NotThis(KIND))
}

/// Signatures of other contents that a swap signature must not sit beside:
/// (offset, bytes, name). A partition made swap and later formatted with a
/// tool that leaves the old swap page in place must not be taken for free
/// space.
const FOREIGN: &[(u64, &[u8], &str)] = &[
    (0, b"XFSB", "XFS"),
    (1080, &[0x53, 0xEF], "ext2/3/4"),
    (65600, b"_BHRfS_M", "btrfs"),
    (0, b"LUKS\xba\xbe", "LUKS"),
    (512, b"LABELONE", "LVM"),
    (3, b"NTFS    ", "NTFS"),
    (3, b"EXFAT   ", "exFAT"),
    (54, b"FAT1", "FAT"),
    (82, b"FAT32   ", "FAT32"),
    (1024, &[0x10, 0x20, 0xF5, 0xF2], "F2FS"),
    (32769, b"CD001", "ISO 9660"),
    (0, b"hsqs", "squashfs"),
    (4096, &[0xfc, 0x4e, 0x2b, 0xa9], "Linux RAID (md 1.2)"),
    (0, &[0xfc, 0x4e, 0x2b, 0xa9], "Linux RAID (md 1.1)"),
    (131072, &[0x0c, 0xb1, 0xba, 0x00], "ZFS"),
    (512, b"EFI PART", "a GPT partition table"),
];

/// The first other content whose signature the area also carries.
fn foreign_signature(r: &dyn ReadAt) -> Result<Option<&'static str>, FsError> {
    for &(off, sig, name) in FOREIGN {
        let mut buf = [0u8; 8];
        let buf = &mut buf[..sig.len()];
        match r.read_exact_at(buf, off) {
            Ok(()) if buf == sig => return Ok(Some(name)),
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {}
            Err(e) => return Err(FsError::Io(e)),
        }
    }
    Ok(None)
}

fn hibernated() -> FsMap {
    FsMap {
        kind: KIND,
        free: Ranges::new(),
        in_use: Some("holds a hibernation image".into()),
    }
}

fn read(r: &dyn ReadAt, buf: &mut [u8], off: u64) -> Result<(), FsError> {
    r.read_exact_at(buf, off).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            FsError::corrupt(KIND, "truncated")
        } else {
            FsError::Io(e)
        }
    })
}

/// A version 1 swap area with pages of `ps` bytes.
fn version1(r: &dyn ReadAt, ps: u64) -> Result<FsMap, FsError> {
    let mut page = vec![0u8; ps as usize];
    read(r, &mut page, 0)?;
    let raw = |off: usize| -> u32 {
        let mut a = [0u8; 4];
        if let Some(s) = page.get(off..off + 4) {
            a.copy_from_slice(s);
        }
        u32::from_le_bytes(a)
    };
    let swapped = match raw(VERSION) {
        1 => false,
        0x0100_0000 => true,
        v => {
            return Err(FsError::unsupported(
                KIND,
                format!("swap header version {v}"),
            ))
        }
    };
    let field = |off: usize| -> u32 {
        let v = raw(off);
        if swapped {
            v.swap_bytes()
        } else {
            v
        }
    };
    let last_page = u64::from(field(LAST_PAGE));
    let end = last_page
        .checked_add(1)
        .and_then(|n| n.checked_mul(ps))
        .ok_or_else(|| FsError::corrupt(KIND, "last page out of range"))?;
    if end > r.size() {
        return Err(FsError::corrupt(
            KIND,
            format!(
                "truncated: the swap area has {} pages of {ps} bytes, the region {} bytes",
                last_page + 1,
                r.size()
            ),
        ));
    }
    // The region may be longer than the image (a partition cut short by a
    // truncated image): the area's last byte must be there too.
    read(r, &mut [0u8], end - 1)?;
    // As the kernel: at most as many bad pages as fit between the list's
    // start and the magic, each of them in 1..=last_page.
    let nr_bad = u64::from(field(NR_BADPAGES));
    let max_bad = (ps - 10 - BADPAGES as u64) / 4;
    if nr_bad > max_bad {
        return Err(FsError::corrupt(KIND, format!("{nr_bad} bad pages")));
    }
    let mut bad = Vec::with_capacity(nr_bad as usize);
    for i in 0..nr_bad as usize {
        let page = u64::from(field(BADPAGES + 4 * i));
        if page == 0 || page > last_page {
            return Err(FsError::corrupt(
                KIND,
                format!("bad page {page} outside the swap area"),
            ));
        }
        bad.push(page);
    }
    bad.sort_unstable();
    // Bad pages are not used by the swap area either, but kept: nothing
    // to gain.
    let mut free = Ranges::new();
    let mut from = ps;
    for page in bad {
        free.push(from, page * ps);
        from = from.max((page + 1) * ps);
    }
    free.push(from, end);
    Ok(FsMap {
        kind: KIND,
        free,
        in_use: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A swap area of `pages` pages of `ps` bytes in an image of `size`.
    fn swap(ps: usize, pages: u32, size: usize, bad: &[u32]) -> Vec<u8> {
        let mut img = vec![0u8; size];
        img[ps - 10..ps].copy_from_slice(b"SWAPSPACE2");
        img[VERSION..VERSION + 4].copy_from_slice(&1u32.to_le_bytes());
        img[LAST_PAGE..LAST_PAGE + 4].copy_from_slice(&(pages - 1).to_le_bytes());
        img[NR_BADPAGES..NR_BADPAGES + 4].copy_from_slice(&(bad.len() as u32).to_le_bytes());
        for (i, b) in bad.iter().enumerate() {
            img[BADPAGES + 4 * i..BADPAGES + 4 * i + 4].copy_from_slice(&b.to_le_bytes());
        }
        img
    }

    fn why(r: Result<FsMap, FsError>) -> String {
        match r {
            Err(FsError::Corrupt { why, .. }) | Err(FsError::Unsupported { why, .. }) => why,
            other => panic!("expected Corrupt or Unsupported, got {other:?}"),
        }
    }

    #[test]
    fn pages_after_the_header_are_free() {
        // 100 pages in a region of 120: the 20 past the area are kept.
        let img = swap(4096, 100, 120 * 4096, &[]);
        let m = free_ranges(&img).unwrap();
        assert_eq!(m.kind, "swap");
        assert_eq!(m.in_use, None);
        assert_eq!(m.free.as_slice(), &[(4096, 100 * 4096)]);
        let img = swap(16384, 10, 10 * 16384, &[]);
        let m = free_ranges(&img).unwrap();
        assert_eq!(m.free.as_slice(), &[(16384, 10 * 16384)]);
        let img = swap(65536, 3, 3 * 65536, &[]);
        let m = free_ranges(&img).unwrap();
        assert_eq!(m.free.as_slice(), &[(65536, 3 * 65536)]);
    }

    #[test]
    fn bad_pages_are_kept() {
        let img = swap(4096, 10, 10 * 4096, &[7, 3, 3, 9]);
        let m = free_ranges(&img).unwrap();
        assert_eq!(
            m.free.as_slice(),
            &[(4096, 3 * 4096), (4 * 4096, 7 * 4096), (8 * 4096, 9 * 4096)]
        );
        let img = swap(4096, 10, 10 * 4096, &[10]);
        assert!(why(free_ranges(&img)).contains("bad page 10"));
        let img = swap(4096, 10, 10 * 4096, &[0]);
        assert!(why(free_ranges(&img)).contains("bad page 0"));
        let mut img = swap(4096, 10, 10 * 4096, &[]);
        img[NR_BADPAGES..NR_BADPAGES + 4].copy_from_slice(&1000u32.to_le_bytes());
        assert!(why(free_ranges(&img)).contains("1000 bad pages"));
    }

    #[test]
    fn byte_swapped_headers_are_read() {
        let mut img = swap(4096, 10, 10 * 4096, &[]);
        img[VERSION..VERSION + 4].copy_from_slice(&1u32.to_be_bytes());
        img[LAST_PAGE..LAST_PAGE + 4].copy_from_slice(&5u32.to_be_bytes());
        let m = free_ranges(&img).unwrap();
        assert_eq!(m.free.as_slice(), &[(4096, 6 * 4096)]);
        img[VERSION..VERSION + 4].copy_from_slice(&2u32.to_le_bytes());
        assert!(why(free_ranges(&img)).contains("version 2"));
    }

    #[test]
    fn truncated_areas_are_corrupt() {
        let img = swap(4096, 100, 99 * 4096, &[]);
        assert!(why(free_ranges(&img)).contains("truncated"));
        let mut img = swap(4096, 1, 4096, &[]);
        img[LAST_PAGE..LAST_PAGE + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(why(free_ranges(&img)).contains("truncated"));
    }

    #[test]
    fn hibernation_images_are_kept_whole() {
        for sig in [
            &b"S1SUSPEND\0"[..],
            b"S2SUSPEND\0",
            b"ULSUSPEND\0",
            b"LINHIB0001",
        ] {
            let mut img = swap(8192, 100, 100 * 8192, &[]);
            img[8192 - 10..8192].copy_from_slice(sig);
            let m = free_ranges(&img).unwrap();
            assert_eq!(m.in_use.as_deref(), Some("holds a hibernation image"));
            assert!(m.free.is_empty());
        }
        let mut img = swap(4096, 100, 100 * 4096, &[]);
        img[..8].copy_from_slice(TUXONICE);
        let m = free_ranges(&img).unwrap();
        assert!(m.in_use.is_some() && m.free.is_empty());
    }

    #[test]
    fn other_regions_are_not_swap() {
        assert!(matches!(
            free_ranges(&vec![0u8; 1 << 20]),
            Err(FsError::NotThis(_))
        ));
        assert!(matches!(
            free_ranges(&vec![0u8; 100]),
            Err(FsError::NotThis(_))
        ));
        let mut img = vec![0u8; 8192];
        img[4086..4096].copy_from_slice(b"SWAP-SPACE");
        assert!(why(free_ranges(&img)).contains("version 0"));
    }

    #[test]
    fn a_stale_swap_page_under_another_filesystem_is_not_free() {
        let clean = swap(4096, 63, 64 * 4096, &[]);
        assert!(free_ranges(&clean).is_ok());
        for (off, sig, name) in FOREIGN {
            let mut img = clean.clone();
            let at = *off as usize;
            img[at..at + sig.len()].copy_from_slice(sig);
            let w = why(free_ranges(&img));
            assert!(w.contains(name), "{name}: {w}");
        }
    }
}
