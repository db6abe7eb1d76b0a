//! One allocation group: its AGF, its AGFL and its free-space B+trees.

use super::sb::Sb;
use super::{be32, be64, corrupt, crc_ok, read_at, uuid_at};
use crate::error::FsError;
use crate::{Ranges, ReadAt};

const AGF_MAGIC: u32 = 0x5841_4746; // "XAGF"
const AGFL_MAGIC: u32 = 0x5841_464c; // "XAFL"
const AGF_CRC_OFF: usize = 216;
const AGFL_CRC_OFF: usize = 32;
/// The v5 AGFL header (magic, seqno, uuid, lsn, crc) before its entries.
const AGFL_HDR_V5: usize = 36;

const BNO_MAGIC: [u32; 2] = [0x4142_5442, 0x4142_3342]; // "ABTB", "AB3B"
const CNT_MAGIC: [u32; 2] = [0x4142_5443, 0x4142_3343]; // "ABTC", "AB3C"
/// Short-form B+tree block header: v4, v5 (with blkno, lsn, uuid, owner, crc).
const HDR_LEN: [usize; 2] = [16, 56];
const BLOCK_CRC_OFF: usize = 52;

const NULL_AGBLOCK: u32 = u32::MAX;
/// No real free-space tree is deeper (XFS computes at most 7 levels for
/// the largest AG of the smallest blocks); a deeper one is corrupt.
const MAX_LEVELS: u32 = 9;

/// Map AG `agno`: its free extents, in bytes from the filesystem's start,
/// go to `out` in ascending order.
pub(super) fn map_ag(r: &dyn ReadAt, sb: &Sb, agno: u32, out: &mut Ranges) -> Result<(), FsError> {
    let ag = Ag::new(r, sb, agno)?;
    let agf = ag.read_agf()?;
    let agfl = ag.read_agfl(&agf)?;

    // The bnobt: the free extents in block order.
    let mut bno = Tally::default();
    let mut prev_end = 0u32;
    let bno_tree = Tree {
        magic: BNO_MAGIC[sb.v5 as usize],
        root: agf.roots[0],
        levels: agf.levels[0],
        by_size: false,
    };
    ag.walk(&bno_tree, |start, len| {
        if start < prev_end {
            return Err(ag.bad(format!(
                "bnobt extent {start}+{len} overlaps or precedes the one before"
            )));
        }
        prev_end = start + len; // checked against the AG length by `walk`
        bno.add(start, len, agf.freeblks)
            .map_err(|why| ag.bad(format!("bnobt: {why}")))?;
        ag.push_free(start, len, &agfl, out)
    })?;

    // The cntbt: the same extents by size.
    let mut cnt = Tally::default();
    let cnt_tree = Tree {
        magic: CNT_MAGIC[sb.v5 as usize],
        root: agf.roots[1],
        levels: agf.levels[1],
        by_size: true,
    };
    ag.walk(&cnt_tree, |start, len| {
        cnt.add(start, len, agf.freeblks)
            .map_err(|why| ag.bad(format!("cntbt: {why}")))
    })?;

    if bno.blocks != u64::from(agf.freeblks) {
        return Err(ag.bad(format!(
            "the bnobt holds {} free blocks, the AGF says {}",
            bno.blocks, agf.freeblks
        )));
    }
    if (cnt.count, cnt.blocks, cnt.hash) != (bno.count, bno.blocks, bno.hash) {
        return Err(ag.bad(format!(
            "the cntbt ({} extents, {} blocks) does not hold the bnobt's ({} extents, {} blocks)",
            cnt.count, cnt.blocks, bno.count, bno.blocks
        )));
    }
    if bno.longest != agf.longest {
        return Err(ag.bad(format!(
            "the longest free extent is {} blocks, the AGF says {}",
            bno.longest, agf.longest
        )));
    }
    Ok(())
}

/// Count, total, longest and an order-independent hash of a set of extents:
/// the bnobt and the cntbt must agree on all four.
#[derive(Default)]
struct Tally {
    count: u64,
    blocks: u64,
    longest: u32,
    hash: u64,
}

impl Tally {
    fn add(&mut self, start: u32, len: u32, freeblks: u32) -> Result<(), String> {
        self.count += 1;
        self.blocks += u64::from(len);
        if self.blocks > u64::from(freeblks) {
            return Err(format!("more than the AGF's {freeblks} free blocks"));
        }
        self.longest = self.longest.max(len);
        self.hash = self
            .hash
            .wrapping_add(mix((u64::from(start) << 32) | u64::from(len)));
        Ok(())
    }
}

/// splitmix64's finaliser: spreads each extent over the hash's bits.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// What is read from the AGF.
struct Agf {
    roots: [u32; 2],
    levels: [u32; 2],
    flfirst: u32,
    fllast: u32,
    flcount: u32,
    freeblks: u32,
    longest: u32,
}

/// A free-space tree to walk.
struct Tree {
    magic: u32,
    root: u32,
    levels: u32,
    /// The cntbt: records and keys ordered by (length, start).
    by_size: bool,
}

struct Ag<'a> {
    r: &'a dyn ReadAt,
    sb: &'a Sb,
    agno: u32,
    /// Blocks in this AG.
    len: u32,
    /// The first block after the AG's header sectors.
    first: u32,
    /// The internal log, when it is in this AG: [start, end).
    log: Option<(u32, u32)>,
}

impl<'a> Ag<'a> {
    fn new(r: &'a dyn ReadAt, sb: &'a Sb, agno: u32) -> Result<Ag<'a>, FsError> {
        let len = sb.ag_len(agno);
        // Superblock, AGF, AGI and AGFL: the first four sectors.
        let first = (4 * sb.sectsize).div_ceil(sb.blocksize);
        if len <= first {
            return Err(corrupt(format!("AG {agno} has only {len} blocks")));
        }
        let log = match sb.internal_log() {
            Some((a, start)) if a == agno => Some((start, start + sb.logblocks)),
            _ => None,
        };
        Ok(Ag {
            r,
            sb,
            agno,
            len,
            first,
            log,
        })
    }

    fn bad(&self, why: impl std::fmt::Display) -> FsError {
        corrupt(format!("AG {}: {why}", self.agno))
    }

    /// Sector `n` of the AG's header.
    fn header_sector(&self, n: u32) -> Result<Vec<u8>, FsError> {
        let base = self
            .sb
            .byte_of(self.agno, 0)
            .ok_or_else(|| self.bad("offset overflows"))?;
        let sect = u64::from(self.sb.sectsize);
        read_at(
            self.r,
            base + u64::from(n) * sect,
            self.sb.sectsize as usize,
        )
    }

    fn agfl_size(&self) -> u32 {
        let hdr = if self.sb.v5 { AGFL_HDR_V5 as u32 } else { 0 };
        (self.sb.sectsize - hdr) / 4
    }

    fn read_agf(&self) -> Result<Agf, FsError> {
        let b = self.header_sector(1)?;
        if be32(&b, 0) != AGF_MAGIC {
            return Err(self.bad("no AGF magic"));
        }
        if self.sb.v5 {
            if !crc_ok(&b, AGF_CRC_OFF) {
                return Err(self.bad("AGF CRC mismatch"));
            }
            if uuid_at(&b, 64) != self.sb.meta_uuid {
                return Err(self.bad("AGF UUID is not the filesystem's"));
            }
        }
        if be32(&b, 4) != 1 {
            return Err(self.bad(format!("AGF version {}", be32(&b, 4))));
        }
        if be32(&b, 8) != self.agno {
            return Err(self.bad(format!("AGF sequence number {}", be32(&b, 8))));
        }
        if be32(&b, 12) != self.len {
            return Err(self.bad(format!(
                "AGF length {} blocks, expected {}",
                be32(&b, 12),
                self.len
            )));
        }
        let agf = Agf {
            roots: [be32(&b, 16), be32(&b, 20)],
            levels: [be32(&b, 28), be32(&b, 32)],
            flfirst: be32(&b, 40),
            fllast: be32(&b, 44),
            flcount: be32(&b, 48),
            freeblks: be32(&b, 52),
            longest: be32(&b, 56),
        };
        let size = self.agfl_size();
        if agf.flfirst >= size || agf.fllast >= size || agf.flcount > size {
            return Err(self.bad("AGF free list indexes out of range"));
        }
        if agf.freeblks > self.len || agf.longest > agf.freeblks {
            return Err(self.bad("AGF free block counts out of range"));
        }
        for (root, level) in agf.roots.iter().zip(agf.levels) {
            if !(1..=MAX_LEVELS).contains(&level) {
                return Err(self.bad(format!("free-space tree of {level} levels")));
            }
            if *root < self.first || *root >= self.len {
                return Err(self.bad(format!("free-space tree root {root} out of the AG")));
            }
        }
        Ok(agf)
    }

    /// The blocks on the free list, sorted: held by the filesystem, so used.
    /// When flfirst, fllast and flcount disagree (an AGFL written by a kernel
    /// that sized it differently), every slot that names a block is kept.
    fn read_agfl(&self, agf: &Agf) -> Result<Vec<u32>, FsError> {
        let b = self.header_sector(3)?;
        let mut hdr = 0;
        if self.sb.v5 {
            hdr = AGFL_HDR_V5;
            if be32(&b, 0) != AGFL_MAGIC {
                return Err(self.bad("no AGFL magic"));
            }
            if !crc_ok(&b, AGFL_CRC_OFF) {
                return Err(self.bad("AGFL CRC mismatch"));
            }
            if be32(&b, 4) != self.agno || uuid_at(&b, 8) != self.sb.meta_uuid {
                return Err(self.bad("AGFL is not this AG's"));
            }
        }
        let size = self.agfl_size();
        let slot = |i: u32| be32(&b, hdr + 4 * i as usize);
        let mut blocks = Vec::new();
        let span = if agf.fllast >= agf.flfirst {
            agf.fllast - agf.flfirst + 1
        } else {
            size - agf.flfirst + agf.fllast + 1
        };
        if agf.flcount == 0 {
            // Nothing held.
        } else if span == agf.flcount {
            for k in 0..agf.flcount {
                let bno = slot((agf.flfirst + k) % size);
                if bno < self.first || bno >= self.len {
                    return Err(self.bad(format!("free list block {bno} out of the AG")));
                }
                blocks.push(bno);
            }
        } else {
            blocks.extend(
                (0..size)
                    .map(slot)
                    .filter(|&bno| bno != NULL_AGBLOCK && bno < self.len),
            );
        }
        blocks.sort_unstable();
        blocks.dedup();
        Ok(blocks)
    }

    /// Report a bnobt extent as free, less the free list's blocks.
    fn push_free(
        &self,
        start: u32,
        len: u32,
        agfl: &[u32],
        out: &mut Ranges,
    ) -> Result<(), FsError> {
        let bs = u64::from(self.sb.blocksize);
        let base = self
            .sb
            .byte_of(self.agno, 0)
            .ok_or_else(|| self.bad("offset overflows"))?;
        let end = start + len;
        let mut from = start;
        let i = agfl.partition_point(|&b| b < start);
        for &held in agfl.get(i..).unwrap_or(&[]) {
            if held >= end {
                break;
            }
            out.push(base + u64::from(from) * bs, base + u64::from(held) * bs);
            from = held + 1;
        }
        out.push(base + u64::from(from) * bs, base + u64::from(end) * bs);
        Ok(())
    }

    /// Walk `tree` in key order, checking every block, and hand each leaf
    /// record (start, length) to `rec`. Every block is visited at most once:
    /// the blocks of each level must form the sibling chain in walk order,
    /// which no loop or shared subtree can.
    fn walk(
        &self,
        tree: &Tree,
        mut rec: impl FnMut(u32, u32) -> Result<(), FsError>,
    ) -> Result<(), FsError> {
        let mut chain = Chain::new(tree.levels);
        let root = self.load(tree, tree.root, tree.levels - 1, None, &mut chain)?;
        let mut stack = vec![(root, 0usize)];
        while let Some((node, next)) = stack.last_mut() {
            if node.level == 0 {
                for i in 0..node.numrecs {
                    let (start, len) = node.rec(i);
                    rec(start, len)?;
                }
                stack.pop();
                continue;
            }
            if *next >= node.numrecs {
                stack.pop();
                continue;
            }
            let i = *next;
            *next += 1;
            let key = node.key(i);
            let ptr = node.ptr(i);
            let level = node.level - 1;
            let child = self.load(tree, ptr, level, Some(key), &mut chain)?;
            stack.push((child, 0));
        }
        chain.finish().map_err(|why| self.bad(why))
    }

    /// Read and check one tree block at `level`, reached through `key`.
    fn load(
        &self,
        tree: &Tree,
        agbno: u32,
        level: u32,
        key: Option<(u32, u32)>,
        chain: &mut Chain,
    ) -> Result<Block, FsError> {
        let what = if tree.by_size { "cntbt" } else { "bnobt" };
        if agbno < self.first || agbno >= self.len {
            return Err(self.bad(format!("{what} block {agbno} out of the AG")));
        }
        let off = self
            .sb
            .byte_of(self.agno, agbno)
            .ok_or_else(|| self.bad("offset overflows"))?;
        let b = read_at(self.r, off, self.sb.blocksize as usize)?;
        let bad = |why: String| self.bad(format!("{what} block {agbno}: {why}"));
        if be32(&b, 0) != tree.magic {
            return Err(bad("bad magic".into()));
        }
        let v5 = self.sb.v5 as usize;
        let hdr = HDR_LEN[v5];
        if self.sb.v5 {
            if !crc_ok(&b, BLOCK_CRC_OFF) {
                return Err(bad("CRC mismatch".into()));
            }
            if be64(&b, 16) != off >> 9 {
                return Err(bad(format!("says it is at sector {}", be64(&b, 16))));
            }
            if uuid_at(&b, 32) != self.sb.meta_uuid || be32(&b, 48) != self.agno {
                return Err(bad("not this filesystem's AG's".into()));
            }
        }
        let blevel = u32::from(super::be16(&b, 4));
        if blevel != level {
            return Err(bad(format!("level {blevel}, expected {level}")));
        }
        let numrecs = usize::from(super::be16(&b, 6));
        let room = self.sb.blocksize as usize - hdr;
        let maxrecs = if level == 0 { room / 8 } else { room / 12 };
        let is_root = key.is_none();
        if numrecs > maxrecs || (numrecs == 0 && !(is_root && level == 0)) {
            return Err(bad(format!("{numrecs} records")));
        }
        chain
            .visit(level, agbno, be32(&b, 8), be32(&b, 12))
            .map_err(|why| bad(why.into()))?;
        let block = Block {
            b,
            hdr,
            level,
            numrecs,
            node_maxrecs: room / 12,
        };
        self.check_block(tree, &block, key).map_err(bad)?;
        Ok(block)
    }

    /// Keys and records of a block: in order, inside the AG, and the first
    /// one equal to the key that led here.
    fn check_block(&self, tree: &Tree, blk: &Block, key: Option<(u32, u32)>) -> Result<(), String> {
        // bnobt keys compare by start only; cntbt keys by (length, start).
        let order = |(s, l): (u32, u32)| {
            if tree.by_size {
                (l, s)
            } else {
                (s, 0)
            }
        };
        let mut prev: Option<(u32, u32)> = None;
        for i in 0..blk.numrecs {
            let k = if blk.level == 0 {
                blk.rec(i)
            } else {
                blk.key(i)
            };
            let (start, len) = k;
            if blk.level == 0 {
                if len == 0
                    || start < self.first
                    || u64::from(start) + u64::from(len) > u64::from(self.len)
                {
                    return Err(format!("extent {start}+{len} out of the AG"));
                }
                if let Some((ls, le)) = self.log {
                    if start < le && start + len > ls {
                        return Err(format!("extent {start}+{len} overlaps the log"));
                    }
                }
            } else {
                let ptr = blk.ptr(i);
                if ptr < self.first || ptr >= self.len {
                    return Err(format!("pointer {ptr} out of the AG"));
                }
            }
            if i == 0 {
                if let Some(want) = key {
                    if order(k) != order(want) {
                        return Err("first key is not the parent's key".into());
                    }
                }
            }
            if let Some(p) = prev {
                if order(k) <= order(p) {
                    return Err("keys out of order".into());
                }
            }
            prev = Some(k);
        }
        Ok(())
    }
}

/// A tree block read and checked.
struct Block {
    b: Vec<u8>,
    hdr: usize,
    level: u32,
    numrecs: usize,
    node_maxrecs: usize,
}

impl Block {
    /// Leaf record `i`: (start, length).
    fn rec(&self, i: usize) -> (u32, u32) {
        let o = self.hdr + 8 * i;
        (be32(&self.b, o), be32(&self.b, o + 4))
    }
    /// Node key `i`: (start, length) of the lowest record below it.
    fn key(&self, i: usize) -> (u32, u32) {
        self.rec(i)
    }
    /// Node pointer `i`: a block of the AG.
    fn ptr(&self, i: usize) -> u32 {
        be32(&self.b, self.hdr + 8 * self.node_maxrecs + 4 * i)
    }
}

/// The sibling chain of each level, as the walk meets its blocks.
struct Chain {
    /// Per level: the last block visited and its right sibling.
    last: Vec<Option<(u32, u32)>>,
}

impl Chain {
    fn new(levels: u32) -> Chain {
        Chain {
            last: vec![None; levels as usize],
        }
    }

    fn visit(&mut self, level: u32, agbno: u32, left: u32, right: u32) -> Result<(), &'static str> {
        let slot = self
            .last
            .get_mut(level as usize)
            .ok_or("level out of range")?;
        match *slot {
            None if left != NULL_AGBLOCK => {
                return Err("first block of its level has a left sibling")
            }
            Some((prev, prev_right)) if prev_right != agbno || left != prev => {
                return Err("sibling pointers do not follow the tree")
            }
            _ => {}
        }
        *slot = Some((agbno, right));
        Ok(())
    }

    fn finish(&self) -> Result<(), &'static str> {
        for l in &self.last {
            match l {
                Some((_, NULL_AGBLOCK)) => {}
                _ => return Err("a level of the tree ends with a right sibling"),
            }
        }
        Ok(())
    }
}
