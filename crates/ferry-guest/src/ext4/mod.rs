//! ext2/3/4: the block group bitmaps.
//!
//! The superblock ([`sb`]) gives the layout; every group descriptor
//! ([`desc`]) is read and checked first (its checksum, where its bitmaps
//! and inode table lie), then the groups are walked one at a time: each
//! block bitmap is read (or, for a BLOCK_UNINIT group, built the way the
//! kernel would build it), checked against its checksum, its descriptor's
//! free count and the metadata it must mark used, and its clear bits are
//! the free ranges. Only one bitmap is held at a time.
//!
//! Any disagreement (a checksum, a count, metadata marked free, a
//! structure out of place) makes the whole filesystem Corrupt: it is then
//! copied whole. bigalloc, next3 snapshots, compression, external journal
//! devices and unknown incompatible or read-only features are Unsupported.
//! A journal that needs recovery, a state that is not clean or has errors,
//! or an MMP block that is not clean set `in_use`; the map is still made.

mod bitmap;
mod desc;
mod layout;
mod sb;

use std::io;

use crate::error::FsError;
use crate::map::FsMap;
use crate::{Ranges, ReadAt};

use desc::Desc;
use layout::MetaSet;
use sb::{Csum, Super};

/// `mmp_magic`, and `mmp_seq` of a filesystem nobody has open.
const MMP_MAGIC: u32 = 0x004D_4D50;
const MMP_SEQ_CLEAN: u32 = 0xFF4D_4D50;
const MMP_SEQ_FSCK: u32 = 0xE24D_4D50;

/// Read `buf.len()` bytes at `off`; the image ending first means it is
/// truncated.
fn read(r: &dyn ReadAt, kind: &'static str, buf: &mut [u8], off: u64) -> Result<(), FsError> {
    r.read_exact_at(buf, off).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            FsError::corrupt(kind, format!("truncated: {} bytes at {off}", buf.len()))
        } else {
            FsError::Io(e)
        }
    })
}

/// Map the ext2/3/4 filesystem that starts at offset 0 of `r`: the byte
/// ranges no block group uses.
pub fn free_ranges(r: &dyn ReadAt) -> Result<FsMap, FsError> {
    let mut magic = [0u8; 2];
    match r.read_exact_at(&mut magic, sb::SB_OFFSET + 0x38) {
        Ok(()) if u16::from_le_bytes(magic) == sb::MAGIC => {}
        Ok(()) => return Err(FsError::NotThis("ext2/3/4")),
        // Too small to hold a superblock.
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
            return Err(FsError::NotThis("ext2/3/4"))
        }
        Err(e) => return Err(FsError::Io(e)),
    }
    let mut raw = vec![0u8; sb::SB_SIZE];
    read(r, "ext2/3/4", &mut raw, sb::SB_OFFSET)?;
    if !sb::has_magic(&raw) {
        return Err(FsError::NotThis("ext2/3/4"));
    }
    let sb = sb::parse(&raw, r.size())?;
    let in_use = in_use(r, &sb)?;
    let descs = read_descs(r, &sb)?;
    let meta = meta_set(&sb, &descs)?;
    let mut free = Ranges::new();
    let mut bits = vec![0u8; (sb.blocks_per_group / 8) as usize];
    for (g, d) in (0u64..).zip(&descs) {
        group(r, &sb, g, d, &meta, &mut bits, &mut free)?;
    }
    Ok(FsMap {
        kind: sb.kind,
        free,
        in_use,
    })
}

/// Why the filesystem looks in use: its superblock's flags, and its MMP
/// block when it has one.
fn in_use(r: &dyn ReadAt, sb: &Super) -> Result<Option<String>, FsError> {
    let mut why = sb.in_use_reasons();
    if sb.incompat & sb::INCOMPAT_MMP != 0 {
        let b = sb.mmp_block;
        if b < sb.first_data_block || b >= sb.blocks_count {
            return Err(FsError::corrupt(
                sb.kind,
                format!("MMP block {b} outside the filesystem"),
            ));
        }
        let mut m = [0u8; 8];
        read(r, sb.kind, &mut m, b * sb.block_size)?;
        let magic = sb::le32(&m, 0);
        let seq = sb::le32(&m, 4);
        if magic != MMP_MAGIC {
            return Err(FsError::corrupt(sb.kind, "MMP block without its magic"));
        }
        match seq {
            MMP_SEQ_CLEAN => {}
            MMP_SEQ_FSCK => why.push("e2fsck has it open (MMP)".into()),
            _ => why.push("a host has it mounted (MMP)".into()),
        }
    }
    Ok(if why.is_empty() {
        None
    } else {
        Some(why.join("; "))
    })
}

/// Every group descriptor, checked: its checksum, and its bitmaps and
/// inode table inside the filesystem (inside its own group without
/// flex_bg, as the kernel requires).
fn read_descs(r: &dyn ReadAt, sb: &Super) -> Result<Vec<Desc>, FsError> {
    let bad = |why: String| FsError::corrupt(sb.kind, why);
    let bs = sb.block_size as usize;
    let ds = sb.desc_size as usize;
    let mut block = vec![0u8; bs];
    let mut cached: Option<u64> = None;
    // Grown as descriptors are read: a truncated table fails early.
    let mut out = Vec::new();
    for g in 0..sb.groups {
        let m = g / sb.desc_per_block;
        let blk = layout::desc_block(sb, m)
            .filter(|&b| b < sb.blocks_count)
            .ok_or_else(|| bad(format!("descriptors of group {g} outside the filesystem")))?;
        if cached != Some(blk) {
            read(r, sb.kind, &mut block, blk * sb.block_size)?;
            cached = Some(blk);
        }
        let i = (g % sb.desc_per_block) as usize * ds;
        let raw = block
            .get(i..i + ds)
            .ok_or_else(|| bad(format!("descriptor of group {g} past its block")))?;
        // groups <= MAX_GROUPS < 2^32
        if !desc::csum_ok(sb, g as u32, raw) {
            return Err(bad(format!("descriptor of group {g}: checksum mismatch")));
        }
        let d = desc::parse(sb, raw);
        let (lo, hi) = if sb.flex_bg {
            (sb.first_data_block, sb.blocks_count)
        } else {
            (layout::group_start(sb, g), layout::group_end(sb, g))
        };
        let inside = |s: u64, len: u64| s >= lo && s.checked_add(len).is_some_and(|e| e <= hi);
        if !inside(d.block_bitmap, 1)
            || !inside(d.inode_bitmap, 1)
            || !inside(d.inode_table, sb.itable_blocks)
        {
            return Err(bad(format!(
                "group {g}: bitmaps or inode table outside {}",
                if sb.flex_bg {
                    "the filesystem"
                } else {
                    "the group"
                }
            )));
        }
        out.push(d);
    }
    Ok(out)
}

/// The blocks all groups' bitmaps and inode tables take.
fn meta_set(sb: &Super, descs: &[Desc]) -> Result<MetaSet, FsError> {
    let mut v = Vec::with_capacity(descs.len().saturating_mul(3));
    for d in descs {
        // Checked in read_descs: these do not overflow.
        v.push((d.block_bitmap, d.block_bitmap + 1));
        v.push((d.inode_bitmap, d.inode_bitmap + 1));
        v.push((d.inode_table, d.inode_table + sb.itable_blocks));
    }
    MetaSet::new(v)
        .ok_or_else(|| FsError::corrupt(sb.kind, "two groups' bitmaps or inode tables overlap"))
}

/// Check group `g`'s bitmap (`bits`: room for one) and push its free
/// ranges.
fn group(
    r: &dyn ReadAt,
    sb: &Super,
    g: u64,
    d: &Desc,
    meta: &MetaSet,
    bits: &mut [u8],
    free: &mut Ranges,
) -> Result<(), FsError> {
    let bad = |why: String| FsError::corrupt(sb.kind, format!("group {g}: {why}"));
    let start = layout::group_start(sb, g);
    let end = layout::group_end(sb, g);
    let n = end - start;
    let base = layout::base_meta(sb, g);
    for &(s, e) in &base {
        if s < e && (s < start || e > end) {
            return Err(bad(
                "superblock backup or descriptors past the group's end".into()
            ));
        }
        if meta.overlaps(s, e) {
            return Err(bad(
                "bitmaps or inode table on its superblock or descriptors".into(),
            ));
        }
    }
    let uninit = sb.csum != Csum::None && d.flags & desc::BLOCK_UNINIT != 0;
    if uninit {
        // Not on disk: as the kernel builds it, with every group's
        // metadata that lies here marked too.
        bits.fill(0);
        for &(s, e) in &base {
            bitmap::set_range(bits, s.saturating_sub(start), e.saturating_sub(start));
        }
        for (s, e) in meta.within(start, end) {
            bitmap::set_range(bits, s - start, e - start);
        }
    } else {
        read(r, sb.kind, bits, d.block_bitmap * sb.block_size)?;
        if !desc::bitmap_csum_ok(sb, d, bits) {
            return Err(bad("block bitmap checksum mismatch".into()));
        }
        let marked = |&(s, e): &(u64, u64)| bitmap::all_set(bits, s - start, e - start);
        if !base.iter().filter(|r| r.0 < r.1).all(marked)
            || !meta.within(start, end).all(|r| marked(&r))
        {
            return Err(bad("its bitmap says metadata blocks are free".into()));
        }
    }
    let clear = bitmap::count_clear(bits, n);
    if clear != d.free {
        return Err(FsError::corrupt(
            sb.kind,
            format!(
                "bitmap of group {g} disagrees with its free count ({clear} clear bits, {} free{})",
                d.free,
                if uninit { ", BLOCK_UNINIT" } else { "" }
            ),
        ));
    }
    let bs = sb.block_size;
    bitmap::free_runs(bits, n, |s, e| {
        free.push((start + s) * bs, (start + e) * bs)
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put32(b: &mut [u8], off: usize, v: u32) {
        b[off..off + 4].copy_from_slice(&v.to_le_bytes());
    }

    /// A hand-made ext2: 1 KiB blocks, one group of 8192 blocks; the
    /// descriptors in block 2, block bitmap 3, inode bitmap 4, inode table
    /// 5..21; blocks 1..=20 (bits 0..20) and 100..200 in use.
    fn ext2() -> Vec<u8> {
        let mut img = vec![0u8; 8193 * 1024];
        img[1024..2048].copy_from_slice(&sb::tests::ext2_sb(1));
        let d = 2 * 1024;
        put32(&mut img, d, 3);
        put32(&mut img, d + 4, 4);
        put32(&mut img, d + 8, 5);
        let free = 8192 - 20 - 100;
        img[d + 0xC..d + 0xE].copy_from_slice(&(free as u16).to_le_bytes());
        let bb = 3 * 1024;
        bitmap::set_range(&mut img[bb..bb + 1024], 0, 20);
        bitmap::set_range(&mut img[bb..bb + 1024], 99, 199);
        img
    }

    fn corrupt(img: &[u8], what: &str) {
        match free_ranges(&img.to_vec()) {
            Err(FsError::Corrupt { why, .. }) => assert!(why.contains(what), "{why}"),
            other => panic!("expected Corrupt ({what}), got {other:?}"),
        }
    }

    #[test]
    fn a_hand_made_ext2() {
        let m = free_ranges(&ext2()).unwrap();
        assert_eq!(m.kind, "ext2");
        assert!(m.in_use.is_none());
        let k = 1024;
        assert_eq!(m.free.as_slice(), [(21 * k, 100 * k), (200 * k, 8193 * k)]);
    }

    #[test]
    fn metadata_out_of_place() {
        let d = 2 * 1024;
        for (off, v, why) in [
            // Outside the group (no flex_bg), outside the filesystem.
            (d, 9000, "outside the group"),
            (d + 8, 8190, "outside the group"),
            (d + 4, u32::MAX, "outside the group"),
            // On the descriptors.
            (d + 4, 2, "on its superblock or descriptors"),
            // On another one.
            (d + 4, 6, "overlap"),
            (d, 0, "outside the group"),
        ] {
            let mut img = ext2();
            put32(&mut img, off, v);
            corrupt(&img, why);
        }
    }

    #[test]
    fn block_uninit_needs_a_checksum_feature() {
        // Without one, the flag is ignored: the bitmap is read.
        let mut img = ext2();
        img[2 * 1024 + 0x12] = desc::BLOCK_UNINIT as u8;
        let m = free_ranges(&img).unwrap();
        assert_eq!(m.free.as_slice()[0], (21 * 1024, 100 * 1024));
    }

    #[test]
    fn counts_must_agree() {
        let mut img = ext2();
        img[2 * 1024 + 0xC] ^= 1;
        corrupt(&img, "bitmap of group 0 disagrees with its free count");
    }

    #[test]
    fn padding_past_the_last_block_is_ignored() {
        // The group is cut short: 8000 blocks; bits past them set or not,
        // only the blocks count.
        let mut img = ext2();
        put32(&mut img, 1024 + 0x4, 8001);
        let free = 8000 - 20 - 100;
        img[2 * 1024 + 0xC..2 * 1024 + 0xE].copy_from_slice(&(free as u16).to_le_bytes());
        let m = free_ranges(&img).unwrap();
        assert_eq!(m.free.as_slice()[1], (200 * 1024, 8001 * 1024));
    }

    /// An image whose every read fails.
    struct Broken;

    impl ReadAt for Broken {
        fn read_exact_at(&self, _: &mut [u8], _: u64) -> io::Result<()> {
            Err(io::Error::other("the disk is on fire"))
        }
        fn size(&self) -> u64 {
            1 << 30
        }
    }

    #[test]
    fn read_errors_are_io_errors() {
        assert!(matches!(free_ranges(&Broken), Err(FsError::Io(_))));
        assert!(matches!(
            free_ranges(&vec![0u8; 1081]),
            Err(FsError::NotThis(_))
        ));
    }

    #[test]
    fn mmp_block_outside() {
        let mut img = ext2();
        put32(&mut img, 1024 + 0x60, sb::INCOMPAT_MMP);
        put32(&mut img, 1024 + 0x168, 9999);
        corrupt(&img, "MMP block 9999 outside");
    }
}
