//! Where things are: groups, superblock backups, descriptor blocks, and the
//! blocks every group's metadata takes.

use super::sb::Super;

/// Whether `n` is a power of `base` (1 counts: `base`^0).
fn is_power_of(mut n: u64, base: u64) -> bool {
    if n == 0 {
        return false;
    }
    while n.is_multiple_of(base) {
        n /= base;
    }
    n == 1
}

/// Whether group `g` holds a superblock backup (group 0: the primary).
pub(crate) fn has_super(sb: &Super, g: u64) -> bool {
    if g == 0 {
        return true;
    }
    if let Some(b) = sb.backup_bgs {
        return g == u64::from(b[0]) || g == u64::from(b[1]);
    }
    if g == 1 || !sb.sparse_super {
        return true;
    }
    g % 2 == 1 && (is_power_of(g, 3) || is_power_of(g, 5) || is_power_of(g, 7))
}

/// The first block of group `g` (`g` < `sb.groups`, so this cannot
/// overflow: the blocks fit in the image).
pub(crate) fn group_start(sb: &Super, g: u64) -> u64 {
    sb.first_data_block + g * sb.blocks_per_group
}

/// One past the last block of group `g` (the last group may be short).
pub(crate) fn group_end(sb: &Super, g: u64) -> u64 {
    (group_start(sb, g) + sb.blocks_per_group).min(sb.blocks_count)
}

/// The block that holds the descriptors of meta-group `m` (descriptors
/// `m * desc_per_block ..`): after the primary superblock without
/// meta_bg (and for `m < s_first_meta_bg`), else in the first group of
/// the meta-group, after its superblock backup if it has one.
pub(crate) fn desc_block(sb: &Super, m: u64) -> Option<u64> {
    if !sb.meta_bg || m < sb.first_meta_bg {
        return Some(sb.first_data_block + 1 + m);
    }
    let g = m.checked_mul(sb.desc_per_block)?;
    if g >= sb.groups {
        return None;
    }
    Some(group_start(sb, g) + u64::from(has_super(sb, g)))
}

/// The blocks of group `g` that its superblock backup, its copy of the
/// descriptor table and the reserved GDT blocks take (with meta_bg: its
/// descriptor block), as up to two ranges `[start, end)` of block numbers.
/// They may reach past the group's end: the caller checks.
pub(crate) fn base_meta(sb: &Super, g: u64) -> [(u64, u64); 2] {
    let start = group_start(sb, g);
    let sup = has_super(sb, g);
    let mut out = [(0, 0); 2];
    if sup {
        out[0] = (start, start + 1);
    }
    let m = g / sb.desc_per_block;
    if !sb.meta_bg || m < sb.first_meta_bg {
        if sup {
            let old = if sb.meta_bg {
                sb.first_meta_bg
            } else {
                sb.desc_blocks
            };
            // The kernel counts the reserved blocks with meta_bg too.
            out[1] = (start + 1, start + 1 + old + sb.reserved_gdt);
        }
    } else {
        let i = g % sb.desc_per_block;
        if i == 0 || i == 1 || i + 1 == sb.desc_per_block {
            let b = start + u64::from(sup);
            out[1] = (b, b + 1);
        }
    }
    out
}

/// The blocks every group's bitmaps and inode table take, sorted and
/// merged: they must all be marked used, wherever they lie.
#[derive(Debug, Default)]
pub(crate) struct MetaSet {
    ranges: Vec<(u64, u64)>,
}

impl MetaSet {
    /// From the ranges of all groups, in any order. `None` when two
    /// overlap: two groups' metadata in the same block.
    pub(crate) fn new(mut ranges: Vec<(u64, u64)>) -> Option<MetaSet> {
        ranges.sort_unstable();
        let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
        for (s, e) in ranges {
            match out.last_mut() {
                Some(l) if l.1 > s => return None,
                Some(l) if l.1 == s => l.1 = e,
                _ => out.push((s, e)),
            }
        }
        Some(MetaSet { ranges: out })
    }

    /// The parts of the set inside `[start, end)`.
    pub(crate) fn within(&self, start: u64, end: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        let i = self.ranges.partition_point(|r| r.1 <= start);
        self.ranges[i..]
            .iter()
            .take_while(move |r| r.0 < end)
            .map(move |r| (r.0.max(start), r.1.min(end)))
    }

    /// Whether any of `[start, end)` is in the set.
    pub(crate) fn overlaps(&self, start: u64, end: u64) -> bool {
        start < end && self.within(start, end).next().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ext4::sb::{parse, tests::ext2_sb};

    fn sb(groups: u32) -> Super {
        parse(&ext2_sb(groups), 1 << 40).unwrap()
    }

    #[test]
    fn sparse_super_backups() {
        let s = sb(100);
        let with: Vec<u64> = (0..100).filter(|&g| has_super(&s, g)).collect();
        assert_eq!(with, [0, 1, 3, 5, 7, 9, 25, 27, 49, 81]);
        let mut s2 = s.clone();
        s2.sparse_super = false;
        assert!((0..100).all(|g| has_super(&s2, g)));
        s2.backup_bgs = Some([1, 77]);
        let with: Vec<u64> = (0..100).filter(|&g| has_super(&s2, g)).collect();
        assert_eq!(with, [0, 1, 77]);
    }

    #[test]
    fn groups_and_descriptors() {
        let mut s = sb(100);
        assert_eq!(group_start(&s, 0), 1);
        assert_eq!(group_end(&s, 99), 8192 * 100 + 1);
        assert_eq!(desc_block(&s, 0), Some(2));
        assert_eq!(base_meta(&s, 0), [(1, 2), (2, 2 + 4)]);
        assert_eq!(base_meta(&s, 2), [(0, 0), (0, 0)]);
        assert_eq!(base_meta(&s, 3)[1], (3 * 8192 + 2, 3 * 8192 + 6));
        // meta_bg: 32 descriptors a block.
        s.meta_bg = true;
        s.first_meta_bg = 1;
        assert_eq!(desc_block(&s, 0), Some(2));
        assert_eq!(desc_block(&s, 1), Some(32 * 8192 + 1));
        assert_eq!(desc_block(&s, 3), Some(96 * 8192 + 1));
        assert_eq!(desc_block(&s, 4), None);
        assert_eq!(base_meta(&s, 0), [(1, 2), (2, 3)]);
        // Group 33 has no backup superblock: its descriptor block first.
        assert_eq!(base_meta(&s, 33), [(0, 0), (33 * 8192 + 1, 33 * 8192 + 2)]);
        assert_eq!(base_meta(&s, 34), [(0, 0), (0, 0)]);
        assert_eq!(base_meta(&s, 63)[1], (63 * 8192 + 1, 63 * 8192 + 2));
        // Group 81 (3^4) keeps its superblock backup, but no descriptors.
        assert_eq!(base_meta(&s, 81), [(81 * 8192 + 1, 81 * 8192 + 2), (0, 0)]);
    }

    #[test]
    fn meta_set() {
        let m = MetaSet::new(vec![(10, 12), (5, 6), (6, 8), (20, 30)]).unwrap();
        assert_eq!(
            m.within(0, 100).collect::<Vec<_>>(),
            [(5, 8), (10, 12), (20, 30)]
        );
        assert_eq!(
            m.within(7, 25).collect::<Vec<_>>(),
            [(7, 8), (10, 12), (20, 25)]
        );
        assert!(!m.overlaps(8, 10));
        assert!(m.overlaps(9, 11));
        assert!(MetaSet::new(vec![(1, 5), (4, 6)]).is_none());
    }
}
