//! The superblock: what it says about the layout, checked before use.

use crate::error::FsError;
pub(crate) use crate::field::{le16, le32, le64};

/// Where the primary superblock starts.
pub(crate) const SB_OFFSET: u64 = 1024;
/// Its size on disk.
pub(crate) const SB_SIZE: usize = 1024;
/// `s_magic`, at 0x38 of the superblock.
pub(crate) const MAGIC: u16 = 0xEF53;

// s_state
const STATE_VALID: u16 = 0x1;
const STATE_ERROR: u16 = 0x2;

// s_feature_compat
const COMPAT_HAS_JOURNAL: u32 = 0x4;
const COMPAT_SPARSE_SUPER2: u32 = 0x200;

// s_feature_incompat
const INCOMPAT_FILETYPE: u32 = 0x2;
pub(crate) const INCOMPAT_RECOVER: u32 = 0x4;
const INCOMPAT_JOURNAL_DEV: u32 = 0x8;
const INCOMPAT_META_BG: u32 = 0x10;
const INCOMPAT_EXTENTS: u32 = 0x40;
const INCOMPAT_64BIT: u32 = 0x80;
pub(crate) const INCOMPAT_MMP: u32 = 0x100;
const INCOMPAT_FLEX_BG: u32 = 0x200;
const INCOMPAT_EA_INODE: u32 = 0x400;
const INCOMPAT_DIRDATA: u32 = 0x1000;
const INCOMPAT_CSUM_SEED: u32 = 0x2000;
const INCOMPAT_LARGEDIR: u32 = 0x4000;
const INCOMPAT_INLINE_DATA: u32 = 0x8000;
const INCOMPAT_ENCRYPT: u32 = 0x10000;
const INCOMPAT_CASEFOLD: u32 = 0x20000;
/// What the block bitmaps mean does not depend on these.
const INCOMPAT_READ: u32 = INCOMPAT_FILETYPE
    | INCOMPAT_RECOVER
    | INCOMPAT_META_BG
    | INCOMPAT_EXTENTS
    | INCOMPAT_64BIT
    | INCOMPAT_MMP
    | INCOMPAT_FLEX_BG
    | INCOMPAT_EA_INODE
    | INCOMPAT_DIRDATA
    | INCOMPAT_CSUM_SEED
    | INCOMPAT_LARGEDIR
    | INCOMPAT_INLINE_DATA
    | INCOMPAT_ENCRYPT
    | INCOMPAT_CASEFOLD;

// s_feature_ro_compat
const RO_SPARSE_SUPER: u32 = 0x1;
const RO_LARGE_FILE: u32 = 0x2;
const RO_BTREE_DIR: u32 = 0x4;
const RO_HUGE_FILE: u32 = 0x8;
const RO_GDT_CSUM: u32 = 0x10;
const RO_DIR_NLINK: u32 = 0x20;
const RO_EXTRA_ISIZE: u32 = 0x40;
const RO_HAS_SNAPSHOT: u32 = 0x80;
const RO_QUOTA: u32 = 0x100;
const RO_BIGALLOC: u32 = 0x200;
const RO_METADATA_CSUM: u32 = 0x400;
const RO_READONLY: u32 = 0x1000;
const RO_PROJECT: u32 = 0x2000;
const RO_SHARED_BLOCKS: u32 = 0x4000;
const RO_VERITY: u32 = 0x8000;
const RO_ORPHAN_PRESENT: u32 = 0x10000;
/// Features that leave the block bitmaps as they are (one bit a block,
/// every used block set).
const RO_READ: u32 = RO_SPARSE_SUPER
    | RO_LARGE_FILE
    | RO_BTREE_DIR
    | RO_HUGE_FILE
    | RO_GDT_CSUM
    | RO_DIR_NLINK
    | RO_EXTRA_ISIZE
    | RO_QUOTA
    | RO_METADATA_CSUM
    | RO_READONLY
    | RO_PROJECT
    | RO_SHARED_BLOCKS
    | RO_VERITY
    | RO_ORPHAN_PRESENT;

/// Features ext2 and ext3 have: any other one makes the filesystem ext4.
const INCOMPAT_EXT3: u32 = INCOMPAT_FILETYPE | INCOMPAT_RECOVER | INCOMPAT_META_BG;
const RO_EXT3: u32 = RO_SPARSE_SUPER | RO_LARGE_FILE | RO_BTREE_DIR;

/// More block groups than this is a filesystem of over 100 TiB (4 KiB
/// blocks), or a hostile one: the descriptors are held in memory (about
/// 100 bytes a group at most), so refuse.
pub(crate) const MAX_GROUPS: u64 = 1 << 20;

/// How the group descriptors (and bitmaps) are checksummed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Csum {
    /// Neither: BLOCK_UNINIT is then ignored, as the kernel ignores it.
    None,
    /// GDT_CSUM (uninit_bg): a crc16 of each descriptor.
    Gdt,
    /// metadata_csum: crc32c, seeded with the filesystem's seed.
    Meta { seed: u32 },
}

/// The superblock's fields that the group loop uses, checked.
#[derive(Clone, Debug)]
pub(crate) struct Super {
    /// "ext2", "ext3" or "ext4".
    pub kind: &'static str,
    pub block_size: u64,
    pub blocks_count: u64,
    pub first_data_block: u64,
    pub blocks_per_group: u64,
    pub groups: u64,
    /// Blocks of one group's inode table.
    pub itable_blocks: u64,
    pub desc_size: u64,
    pub desc_per_block: u64,
    /// Blocks the whole descriptor table takes.
    pub desc_blocks: u64,
    pub reserved_gdt: u64,
    pub meta_bg: bool,
    pub first_meta_bg: u64,
    pub flex_bg: bool,
    pub is64: bool,
    pub sparse_super: bool,
    /// With sparse_super2: the (at most two) groups with a backup.
    pub backup_bgs: Option<[u32; 2]>,
    pub csum: Csum,
    pub uuid: [u8; 16],
    pub state: u16,
    pub incompat: u32,
    pub mmp_block: u64,
}

/// Whether the 1024 superblock bytes carry the ext2/3/4 magic.
pub(crate) fn has_magic(sb: &[u8]) -> bool {
    le16(sb, 0x38) == MAGIC
}

/// Which of ext2/3/4 the features make it.
fn kind_of(compat: u32, incompat: u32, ro: u32) -> &'static str {
    if incompat & !INCOMPAT_EXT3 != 0 || ro & !RO_EXT3 != 0 {
        "ext4"
    } else if compat & COMPAT_HAS_JOURNAL != 0 {
        "ext3"
    } else {
        "ext2"
    }
}

/// Parse and check the superblock (`sb`: its 1024 bytes) of a filesystem
/// on an image of `image_size` bytes. The magic must already match.
pub(crate) fn parse(sb: &[u8], image_size: u64) -> Result<Super, FsError> {
    if sb.len() < SB_SIZE {
        return Err(FsError::corrupt("ext2/3/4", "truncated superblock"));
    }
    let compat = le32(sb, 0x5C);
    let incompat = le32(sb, 0x60);
    let ro = le32(sb, 0x64);
    let kind = kind_of(compat, incompat, ro);
    let bad = |why: String| FsError::corrupt(kind, why);

    if incompat & INCOMPAT_JOURNAL_DEV != 0 {
        return Err(FsError::unsupported(kind, "an external journal device"));
    }
    if ro & RO_BIGALLOC != 0 {
        return Err(FsError::unsupported(kind, "bigalloc (clusters)"));
    }
    if ro & RO_HAS_SNAPSHOT != 0 {
        return Err(FsError::unsupported(kind, "snapshots (next3)"));
    }
    if incompat & !INCOMPAT_READ != 0 {
        return Err(FsError::unsupported(
            kind,
            format!("incompatible features {:#x}", incompat & !INCOMPAT_READ),
        ));
    }
    if ro & !RO_READ != 0 {
        return Err(FsError::unsupported(
            kind,
            format!("read-only features {:#x}", ro & !RO_READ),
        ));
    }

    // metadata_csum: the superblock checksums itself first of all.
    let csum = if ro & RO_METADATA_CSUM != 0 {
        let ty = sb[0x175];
        if ty != 1 {
            return Err(bad(format!("checksum type {ty}, not crc32c")));
        }
        let want = le32(sb, 0x3FC);
        let got = crate::crc32c_raw(!0, &sb[..0x3FC]);
        if want != got {
            return Err(bad("superblock checksum mismatch".into()));
        }
        let seed = if incompat & INCOMPAT_CSUM_SEED != 0 {
            le32(sb, 0x270)
        } else {
            crate::crc32c_raw(!0, &sb[0x68..0x78])
        };
        Csum::Meta { seed }
    } else if ro & RO_GDT_CSUM != 0 {
        Csum::Gdt
    } else {
        Csum::None
    };

    let log = le32(sb, 0x18);
    if log > 6 {
        return Err(bad(format!("block size 2^{} KiB", log)));
    }
    let block_size = 1024u64 << log;
    if le32(sb, 0x1C) != log {
        return Err(bad(
            "cluster size differs from the block size without bigalloc".into(),
        ));
    }
    let is64 = incompat & INCOMPAT_64BIT != 0;
    let mut blocks_count = u64::from(le32(sb, 0x4));
    if is64 {
        blocks_count |= u64::from(le32(sb, 0x150)) << 32;
    }
    let first_data_block = u64::from(le32(sb, 0x14));
    let want_first = u64::from(block_size == 1024);
    if first_data_block != want_first {
        return Err(bad(format!(
            "first data block {first_data_block} with {block_size}-byte blocks"
        )));
    }
    if blocks_count <= first_data_block {
        return Err(bad(format!("{blocks_count} blocks")));
    }
    match blocks_count.checked_mul(block_size) {
        Some(n) if n <= image_size => {}
        _ => {
            return Err(bad(format!(
                "truncated: {blocks_count} blocks of {block_size} bytes, the image holds {image_size} bytes"
            )))
        }
    }
    let blocks_per_group = u64::from(le32(sb, 0x20));
    if blocks_per_group == 0 || blocks_per_group % 8 != 0 || blocks_per_group > 8 * block_size {
        return Err(bad(format!("{blocks_per_group} blocks per group")));
    }
    if u64::from(le32(sb, 0x24)) != blocks_per_group {
        return Err(bad("clusters per group differ from blocks per group".into()));
    }
    let groups = (blocks_count - first_data_block).div_ceil(blocks_per_group);
    if groups > MAX_GROUPS {
        return Err(FsError::unsupported(
            kind,
            format!("{groups} block groups, more than ferry reads ({MAX_GROUPS})"),
        ));
    }

    let rev = le32(sb, 0x4C);
    let inode_size = if rev == 0 {
        128
    } else {
        u64::from(le16(sb, 0x58))
    };
    if inode_size < 128 || inode_size > block_size || !inode_size.is_power_of_two() {
        return Err(bad(format!("inode size {inode_size}")));
    }
    let inodes_per_group = u64::from(le32(sb, 0x28));
    if inodes_per_group == 0
        || inodes_per_group > 8 * block_size
        || inodes_per_group < block_size / inode_size
    {
        return Err(bad(format!("{inodes_per_group} inodes per group")));
    }
    if u64::from(le32(sb, 0x0)) != groups * inodes_per_group {
        return Err(bad(format!(
            "{} inodes, but {groups} groups of {inodes_per_group}",
            le32(sb, 0x0)
        )));
    }
    let itable_blocks = (inodes_per_group * inode_size).div_ceil(block_size);

    let desc_size = if is64 {
        let d = u64::from(le16(sb, 0xFE));
        if !(64..=1024).contains(&d) || !d.is_power_of_two() {
            return Err(bad(format!("descriptor size {d}")));
        }
        d
    } else {
        32
    };
    let desc_per_block = block_size / desc_size;
    let desc_blocks = groups.div_ceil(desc_per_block);
    let reserved_gdt = u64::from(le16(sb, 0xCE));
    if reserved_gdt > block_size / 4 {
        return Err(bad(format!("{reserved_gdt} reserved GDT blocks")));
    }
    let meta_bg = incompat & INCOMPAT_META_BG != 0;
    let first_meta_bg = u64::from(le32(sb, 0x104));
    if meta_bg && first_meta_bg > desc_blocks {
        return Err(bad(format!(
            "first meta_bg {first_meta_bg} of {desc_blocks}"
        )));
    }
    let backup_bgs = if compat & COMPAT_SPARSE_SUPER2 != 0 {
        Some([le32(sb, 0x24C), le32(sb, 0x250)])
    } else {
        None
    };
    let mut uuid = [0u8; 16];
    uuid.copy_from_slice(&sb[0x68..0x78]);

    Ok(Super {
        kind,
        block_size,
        blocks_count,
        first_data_block,
        blocks_per_group,
        groups,
        itable_blocks,
        desc_size,
        desc_per_block,
        desc_blocks,
        reserved_gdt,
        meta_bg,
        first_meta_bg,
        flex_bg: incompat & INCOMPAT_FLEX_BG != 0,
        is64,
        sparse_super: ro & RO_SPARSE_SUPER != 0,
        backup_bgs,
        csum,
        uuid,
        state: le16(sb, 0x3A),
        incompat,
        mmp_block: le64(sb, 0x168),
    })
}

impl Super {
    /// Why the superblock alone says the filesystem is in use, if it does
    /// (the MMP block is read separately).
    pub(crate) fn in_use_reasons(&self) -> Vec<String> {
        let mut why = Vec::new();
        if self.incompat & INCOMPAT_RECOVER != 0 {
            why.push("its journal needs recovery (mounted, or not cleanly unmounted)".to_string());
        }
        if self.state & STATE_VALID == 0 {
            why.push("its state is not clean".to_string());
        }
        if self.state & STATE_ERROR != 0 {
            why.push("its state records errors".to_string());
        }
        why
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A minimal ext2 superblock: 1 KiB blocks, `groups` groups of 8192
    /// blocks, 128 inodes each; the last group full.
    pub(crate) fn ext2_sb(groups: u32) -> Vec<u8> {
        let mut sb = vec![0u8; SB_SIZE];
        let put = |sb: &mut Vec<u8>, off: usize, v: u32| {
            sb[off..off + 4].copy_from_slice(&v.to_le_bytes());
        };
        put(&mut sb, 0x0, 128 * groups);
        put(&mut sb, 0x4, 8192 * groups + 1);
        put(&mut sb, 0x14, 1);
        put(&mut sb, 0x18, 0);
        put(&mut sb, 0x1C, 0);
        put(&mut sb, 0x20, 8192);
        put(&mut sb, 0x24, 8192);
        put(&mut sb, 0x28, 128);
        sb[0x38..0x3A].copy_from_slice(&MAGIC.to_le_bytes());
        sb[0x3A..0x3C].copy_from_slice(&1u16.to_le_bytes());
        put(&mut sb, 0x4C, 1);
        sb[0x58..0x5A].copy_from_slice(&128u16.to_le_bytes());
        put(&mut sb, 0x64, RO_SPARSE_SUPER);
        sb
    }

    fn put32(sb: &mut [u8], off: usize, v: u32) {
        sb[off..off + 4].copy_from_slice(&v.to_le_bytes());
    }

    #[test]
    fn parses_a_plain_ext2() {
        let sb = ext2_sb(3);
        let s = parse(&sb, 8192 * 3 * 1024 + 1024).unwrap();
        assert_eq!(s.kind, "ext2");
        assert_eq!(s.groups, 3);
        assert_eq!(s.block_size, 1024);
        assert_eq!(s.itable_blocks, 16);
        assert_eq!(s.desc_blocks, 1);
        assert_eq!(s.csum, Csum::None);
        assert!(s.in_use_reasons().is_empty());
    }

    #[test]
    fn kinds() {
        assert_eq!(kind_of(0, INCOMPAT_FILETYPE, RO_SPARSE_SUPER), "ext2");
        assert_eq!(kind_of(COMPAT_HAS_JOURNAL, INCOMPAT_FILETYPE, 0), "ext3");
        assert_eq!(kind_of(COMPAT_HAS_JOURNAL, INCOMPAT_EXTENTS, 0), "ext4");
        assert_eq!(kind_of(0, 0, RO_METADATA_CSUM), "ext4");
    }

    #[test]
    fn a_short_image_is_truncated() {
        let sb = ext2_sb(3);
        let e = parse(&sb, 8192 * 3 * 1024).unwrap_err();
        assert!(e.to_string().contains("truncated"), "{e}");
    }

    #[test]
    fn refuses_odd_fields() {
        let cases: [(usize, u32, &str); 9] = [
            (0x18, 7, "block size"),
            (0x14, 0, "first data block"),
            (0x20, 0, "blocks per group"),
            (0x20, 8191, "blocks per group"),
            (0x20, 8 * 1024 + 8, "blocks per group"),
            (0x28, 0, "inodes per group"),
            (0x0, 7, "inodes"),
            (0x60, 0x1, "incompatible"),
            (0x64, 0x200, "bigalloc"),
        ];
        for (off, v, what) in cases {
            let mut sb = ext2_sb(3);
            put32(&mut sb, off, v);
            let e = parse(&sb, 1 << 30).unwrap_err();
            assert!(e.to_string().contains(what), "{off:#x}={v}: {e}");
        }
    }

    #[test]
    fn metadata_csum_checks_the_superblock() {
        let mut sb = ext2_sb(3);
        put32(&mut sb, 0x64, RO_SPARSE_SUPER | RO_METADATA_CSUM);
        sb[0x175] = 1;
        let c = crate::crc32c_raw(!0, &sb[..0x3FC]);
        put32(&mut sb, 0x3FC, c);
        let s = parse(&sb, 1 << 30).unwrap();
        assert_eq!(s.kind, "ext4");
        assert!(matches!(s.csum, Csum::Meta { .. }));
        sb[0x100] ^= 1;
        let e = parse(&sb, 1 << 30).unwrap_err();
        assert!(e.to_string().contains("checksum"), "{e}");
    }

    #[test]
    fn in_use_reasons() {
        let mut sb = ext2_sb(3);
        put32(&mut sb, 0x60, INCOMPAT_RECOVER);
        sb[0x3A] = 2;
        let s = parse(&sb, 1 << 30).unwrap();
        assert_eq!(s.in_use_reasons().len(), 3);
    }
}
