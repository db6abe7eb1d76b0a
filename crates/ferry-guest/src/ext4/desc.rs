//! Group descriptors and their checksums.

use super::sb::{le16, le32, Csum, Super};

/// bg_flags: the block bitmap is not initialised (not on disk).
pub(crate) const BLOCK_UNINIT: u16 = 0x2;

/// Where `bg_checksum` lies in a descriptor.
const CSUM_OFF: usize = 0x1E;
/// A descriptor at least this long carries `bg_block_bitmap_csum_hi`.
const BITMAP_CSUM_HI_END: u64 = 0x3A;

/// What one group descriptor says, as the group loop needs it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Desc {
    pub block_bitmap: u64,
    pub inode_bitmap: u64,
    pub inode_table: u64,
    pub free: u64,
    pub flags: u16,
    pub bitmap_csum: u32,
}

/// Parse one descriptor (`d`: `sb.desc_size` bytes).
pub(crate) fn parse(sb: &Super, d: &[u8]) -> Desc {
    let hi = |off: usize| {
        if sb.is64 {
            u64::from(le32(d, off)) << 32
        } else {
            0
        }
    };
    let hi16 = |off: usize| {
        if sb.is64 {
            u64::from(le16(d, off)) << 16
        } else {
            0
        }
    };
    let mut bitmap_csum = u32::from(le16(d, 0x18));
    if sb.desc_size >= BITMAP_CSUM_HI_END {
        bitmap_csum |= u32::from(le16(d, 0x38)) << 16;
    }
    Desc {
        block_bitmap: u64::from(le32(d, 0x0)) | hi(0x20),
        inode_bitmap: u64::from(le32(d, 0x4)) | hi(0x24),
        inode_table: u64::from(le32(d, 0x8)) | hi(0x28),
        free: u64::from(le16(d, 0xC)) | hi16(0x2C),
        flags: le16(d, 0x12),
        bitmap_csum,
    }
}

/// CRC-16 as the kernel's `crc16()`: polynomial 0x8005 reflected, no
/// final inversion.
pub(crate) fn crc16(mut crc: u16, data: &[u8]) -> u16 {
    for &b in data {
        crc ^= u16::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xA001
            } else {
                crc >> 1
            };
        }
    }
    crc
}

/// Whether descriptor `d` of group `g` carries its checksum (always true
/// without a checksum feature).
pub(crate) fn csum_ok(sb: &Super, g: u32, d: &[u8]) -> bool {
    let size = (sb.desc_size as usize).min(d.len());
    let (Some(head), Some(tail)) = (d.get(..CSUM_OFF), d.get(CSUM_OFF + 2..size)) else {
        return false;
    };
    let want = le16(d, CSUM_OFF);
    let group = g.to_le_bytes();
    match sb.csum {
        Csum::None => true,
        Csum::Meta { seed } => {
            let mut c = crate::crc32c_raw(seed, &group);
            c = crate::crc32c_raw(c, head);
            c = crate::crc32c_raw(c, &[0, 0]);
            c = crate::crc32c_raw(c, tail);
            (c & 0xFFFF) as u16 == want
        }
        Csum::Gdt => {
            let mut c = crc16(!0, &sb.uuid);
            c = crc16(c, &group);
            c = crc16(c, head);
            if sb.is64 {
                c = crc16(c, tail);
            }
            c == want
        }
    }
}

/// Whether a group's block bitmap (`bits`: blocks_per_group / 8 bytes)
/// matches the checksum its descriptor keeps (metadata_csum only).
pub(crate) fn bitmap_csum_ok(sb: &Super, d: &Desc, bits: &[u8]) -> bool {
    match sb.csum {
        Csum::Meta { seed } => {
            let c = crate::crc32c_raw(seed, bits);
            if sb.desc_size >= BITMAP_CSUM_HI_END {
                c == d.bitmap_csum
            } else {
                c & 0xFFFF == d.bitmap_csum
            }
        }
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ext4::sb::{parse as parse_sb, tests::ext2_sb};

    #[test]
    fn crc16_is_the_kernel_one() {
        // CRC-16/ARC of "123456789" (initial 0) is 0xBB3D.
        assert_eq!(crc16(0, b"123456789"), 0xBB3D);
        // CRC-16/MODBUS (initial 0xFFFF) is 0x4B37.
        assert_eq!(crc16(0xFFFF, b"123456789"), 0x4B37);
    }

    #[test]
    fn parses_32_and_64_byte_descriptors() {
        let mut sb = parse_sb(&ext2_sb(3), 1 << 40).unwrap();
        let mut d = [0u8; 64];
        d[0..4].copy_from_slice(&5u32.to_le_bytes());
        d[4..8].copy_from_slice(&6u32.to_le_bytes());
        d[8..12].copy_from_slice(&7u32.to_le_bytes());
        d[0xC..0xE].copy_from_slice(&100u16.to_le_bytes());
        d[0x12] = 2;
        d[0x20] = 1;
        d[0x2C] = 1;
        let p = parse(&sb, &d[..32]);
        assert_eq!((p.block_bitmap, p.inode_bitmap, p.inode_table), (5, 6, 7));
        assert_eq!((p.free, p.flags), (100, BLOCK_UNINIT));
        sb.is64 = true;
        sb.desc_size = 64;
        let p = parse(&sb, &d);
        assert_eq!(p.block_bitmap, (1 << 32) | 5);
        assert_eq!(p.free, (1 << 16) | 100);
    }

    #[test]
    fn checksums() {
        let mut sb = parse_sb(&ext2_sb(3), 1 << 40).unwrap();
        let mut d = [7u8; 32];
        assert!(csum_ok(&sb, 1, &d));
        sb.csum = Csum::Gdt;
        assert!(!csum_ok(&sb, 1, &d));
        let mut c = crc16(!0, &sb.uuid);
        c = crc16(c, &1u32.to_le_bytes());
        c = crc16(c, &d[..30]);
        d[30..32].copy_from_slice(&c.to_le_bytes());
        assert!(csum_ok(&sb, 1, &d));
        assert!(!csum_ok(&sb, 2, &d));
        sb.csum = Csum::Meta { seed: 42 };
        assert!(!csum_ok(&sb, 1, &d));
        let bits = [0xFFu8; 1024];
        let p = parse(&sb, &d);
        assert!(!bitmap_csum_ok(&sb, &p, &bits));
    }
}
