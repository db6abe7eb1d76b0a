//! Small XFS images built in memory: a superblock, AGFs, AGFLs, free-space
//! trees of any shape, and an internal log with chosen records.

use crate::ReadAt;
use std::collections::BTreeMap;

const CHUNK: u64 = 4096;

/// A sparse image in memory: zeros except where written.
#[derive(Clone, Default)]
pub struct Sparse {
    pub size: u64,
    chunks: BTreeMap<u64, Vec<u8>>,
}

impl Sparse {
    pub fn write(&mut self, mut off: u64, mut data: &[u8]) {
        while !data.is_empty() {
            let c = self
                .chunks
                .entry(off / CHUNK)
                .or_insert_with(|| vec![0; CHUNK as usize]);
            let at = (off % CHUNK) as usize;
            let n = data.len().min(CHUNK as usize - at);
            c[at..at + n].copy_from_slice(&data[..n]);
            data = &data[n..];
            off += n as u64;
        }
    }
    pub fn read(&self, mut off: u64, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            let at = (off % CHUNK) as usize;
            let n = (len - out.len()).min(CHUNK as usize - at);
            match self.chunks.get(&(off / CHUNK)) {
                Some(c) => out.extend_from_slice(&c[at..at + n]),
                None => out.resize(out.len() + n, 0),
            }
            off += n as u64;
        }
        out
    }
    pub fn be32(&self, off: u64) -> u32 {
        u32::from_be_bytes(self.read(off, 4).try_into().unwrap())
    }
    pub fn put32(&mut self, off: u64, v: u32) {
        self.write(off, &v.to_be_bytes());
    }
    /// Offsets of the chunks written (for mutations).
    pub fn written(&self) -> Vec<u64> {
        self.chunks.keys().map(|k| k * CHUNK).collect()
    }
}

impl ReadAt for Sparse {
    fn read_exact_at(&self, buf: &mut [u8], off: u64) -> std::io::Result<()> {
        match off.checked_add(buf.len() as u64) {
            Some(e) if e <= self.size => {
                buf.copy_from_slice(&self.read(off, buf.len()));
                Ok(())
            }
            _ => Err(std::io::ErrorKind::UnexpectedEof.into()),
        }
    }
    fn size(&self) -> u64 {
        self.size
    }
}

pub const UUID: [u8; 16] = *b"ferry-xfs-uuid!!";

/// The stored form of an XFS CRC over `b` with its field at `off` zeroed.
pub fn xfs_crc(b: &mut [u8], off: usize) {
    b[off..off + 4].fill(0);
    let c = crc32c::crc32c(b);
    b[off..off + 4].copy_from_slice(&c.to_le_bytes());
}

/// A tree block being built: its number, its first key, its items.
type Entry = (u32, (u32, u32), Vec<(u32, u32)>);

/// One AG's free space, and how its trees are shaped.
#[derive(Clone)]
pub struct AgSpec {
    /// Free extents (agbno, blocks), in block order.
    pub free: Vec<(u32, u32)>,
    /// Free list blocks.
    pub agfl: Vec<u32>,
    /// Records per leaf and pointers per node of both trees.
    pub per_leaf: usize,
    pub per_node: usize,
    /// First block for the trees' blocks.
    pub tree_at: u32,
}

impl AgSpec {
    pub fn new(free: &[(u32, u32)]) -> AgSpec {
        AgSpec {
            free: free.to_vec(),
            agfl: vec![],
            per_leaf: 1000,
            per_node: 1000,
            tree_at: 8,
        }
    }
}

#[derive(Clone)]
pub struct Spec {
    pub v5: bool,
    pub bs: u32,
    pub sect: u32,
    pub agblocks: u32,
    pub dblocks: u64,
    pub ags: Vec<AgSpec>,
    /// Internal log: first block in AG 0 and its length in blocks.
    pub log: Option<(u32, u32)>,
    /// Image bytes beyond the filesystem.
    pub slack: u64,
}

impl Spec {
    /// A v5 (or v4) filesystem of 4 KiB blocks: two AGs of 64 MiB, a log
    /// of 256 blocks at block 32 of AG 0, a few free extents.
    pub fn new(v5: bool) -> Spec {
        Spec {
            v5,
            bs: 4096,
            sect: 512,
            agblocks: 16384,
            dblocks: 2 * 16384,
            ags: vec![
                AgSpec::new(&[(400, 10), (500, 1), (600, 15000)]),
                AgSpec::new(&[(100, 16284)]),
            ],
            log: Some((32, 256)),
            slack: 0,
        }
    }

    pub fn ag_byte(&self, ag: u32) -> u64 {
        u64::from(ag) * u64::from(self.agblocks) * u64::from(self.bs)
    }

    fn hdr(&self) -> usize {
        if self.v5 {
            56
        } else {
            16
        }
    }

    pub fn build(&self) -> Sparse {
        let mut img = Sparse {
            size: self.dblocks * u64::from(self.bs) + self.slack,
            ..Default::default()
        };
        self.write_sb(&mut img);
        for (ag, a) in self.ags.iter().enumerate() {
            self.write_ag(&mut img, ag as u32, a);
        }
        if self.log.is_some() {
            // As mkfs leaves it: an unmount record (without CRC) at 0, the
            // rest zeroed.
            write_unmount_record(&mut img, self.ring(), 0, 1, false);
        }
        img
    }

    fn write_sb(&self, img: &mut Sparse) {
        let mut b = vec![0u8; self.sect as usize];
        let p32 = |b: &mut [u8], o: usize, v: u32| b[o..o + 4].copy_from_slice(&v.to_be_bytes());
        let p64 = |b: &mut [u8], o: usize, v: u64| b[o..o + 8].copy_from_slice(&v.to_be_bytes());
        let p16 = |b: &mut [u8], o: usize, v: u16| b[o..o + 2].copy_from_slice(&v.to_be_bytes());
        p32(&mut b, 0, 0x5846_5342);
        p32(&mut b, 4, self.bs);
        p64(&mut b, 8, self.dblocks);
        b[32..48].copy_from_slice(&UUID);
        if let Some((start, len)) = self.log {
            p64(&mut b, 48, u64::from(start));
            p32(&mut b, 96, len);
        }
        p32(&mut b, 84, self.agblocks);
        p32(&mut b, 88, self.ags.len() as u32);
        p16(&mut b, 100, if self.v5 { 0xb4a5 } else { 0xb4a4 });
        p16(&mut b, 102, self.sect as u16);
        p16(&mut b, 104, 512);
        p16(&mut b, 106, (self.bs / 512) as u16);
        b[120] = self.bs.trailing_zeros() as u8;
        b[121] = self.sect.trailing_zeros() as u8;
        b[122] = 9;
        b[123] = (self.bs.trailing_zeros() - 9) as u8;
        b[124] = (32 - (self.agblocks - 1).leading_zeros()) as u8;
        p32(&mut b, 200, if self.v5 { 0x18a } else { 0x28a });
        if self.v5 {
            p32(&mut b, 216, 0x1 | 0x2 | 0x8); // ftype, spinodes, bigtime
            xfs_crc(&mut b, 224);
        }
        img.write(0, &b);
    }

    fn write_ag(&self, img: &mut Sparse, ag: u32, a: &AgSpec) {
        let base = self.ag_byte(ag);
        let sect = u64::from(self.sect);
        let len = (self.dblocks - u64::from(ag) * u64::from(self.agblocks))
            .min(u64::from(self.agblocks)) as u32;
        let mut next = a.tree_at;
        let (bno_root, bno_levels) = self.write_tree(img, ag, &a.free, false, a, &mut next);
        let mut by_size = a.free.clone();
        by_size.sort_by_key(|&(s, l)| (l, s));
        let (cnt_root, cnt_levels) = self.write_tree(img, ag, &by_size, true, a, &mut next);

        let agfl_hdr = if self.v5 { 36 } else { 0 };
        let agfl_size = (self.sect as usize - agfl_hdr) / 4;
        let mut agf = vec![0u8; self.sect as usize];
        let p32 = |b: &mut [u8], o: usize, v: u32| b[o..o + 4].copy_from_slice(&v.to_be_bytes());
        p32(&mut agf, 0, 0x5841_4746);
        p32(&mut agf, 4, 1);
        p32(&mut agf, 8, ag);
        p32(&mut agf, 12, len);
        p32(&mut agf, 16, bno_root);
        p32(&mut agf, 20, cnt_root);
        p32(&mut agf, 28, bno_levels);
        p32(&mut agf, 32, cnt_levels);
        let n = a.agfl.len() as u32;
        p32(&mut agf, 40, 0);
        p32(
            &mut agf,
            44,
            if n == 0 { agfl_size as u32 - 1 } else { n - 1 },
        );
        p32(&mut agf, 48, n);
        p32(&mut agf, 52, a.free.iter().map(|e| e.1).sum());
        p32(&mut agf, 56, a.free.iter().map(|e| e.1).max().unwrap_or(0));
        if self.v5 {
            agf[64..80].copy_from_slice(&UUID);
            xfs_crc(&mut agf, 216);
        }
        img.write(base + sect, &agf);

        let mut agfl = vec![0xffu8; self.sect as usize];
        if self.v5 {
            agfl[..36].fill(0);
            p32(&mut agfl, 0, 0x5841_464c);
            p32(&mut agfl, 4, ag);
            agfl[8..24].copy_from_slice(&UUID);
        }
        for (i, &b) in a.agfl.iter().enumerate() {
            p32(&mut agfl, agfl_hdr + 4 * i, b);
        }
        if self.v5 {
            xfs_crc(&mut agfl, 32);
        }
        img.write(base + 3 * sect, &agfl);
    }

    /// Write a tree of `recs` (in tree order) from block `next` on; its root
    /// and levels.
    fn write_tree(
        &self,
        img: &mut Sparse,
        ag: u32,
        recs: &[(u32, u32)],
        by_size: bool,
        a: &AgSpec,
        next: &mut u32,
    ) -> (u32, u32) {
        let magic = match (by_size, self.v5) {
            (false, false) => 0x4142_5442,
            (false, true) => 0x4142_3342,
            (true, false) => 0x4142_5443,
            (true, true) => 0x4142_3343,
        };
        // Level 0: leaves of per_leaf records; each entry (block, first key).
        let groups: Vec<Vec<(u32, u32)>> = if recs.is_empty() {
            vec![vec![]]
        } else {
            recs.chunks(a.per_leaf).map(|c| c.to_vec()).collect()
        };
        let mut level: Vec<Entry> = groups
            .into_iter()
            .map(|g| {
                let b = *next;
                *next += 1;
                (b, g.first().copied().unwrap_or((0, 0)), g)
            })
            .collect();
        let mut depth = 0u16;
        loop {
            let blocks: Vec<u32> = level.iter().map(|e| e.0).collect();
            for (i, (blk, _, items)) in level.iter().enumerate() {
                let left = if i == 0 { u32::MAX } else { blocks[i - 1] };
                let right = blocks.get(i + 1).copied().unwrap_or(u32::MAX);
                self.write_block(img, ag, *blk, magic, depth, left, right, items);
            }
            if level.len() == 1 {
                return (level[0].0, u32::from(depth) + 1);
            }
            // The next level up: (key, pointer) items.
            let up: Vec<(u32, u32)> = level.iter().map(|e| (e.0, 0)).collect();
            let keys: Vec<(u32, u32)> = level.iter().map(|e| e.1).collect();
            level = up
                .chunks(a.per_node)
                .zip(keys.chunks(a.per_node))
                .map(|(ptrs, keys)| {
                    let b = *next;
                    *next += 1;
                    // A node's items: its keys, each followed by its
                    // pointer (as (block, MAX)).
                    let packed: Vec<(u32, u32)> = keys
                        .iter()
                        .zip(ptrs)
                        .flat_map(|(k, p)| [*k, (p.0, u32::MAX)])
                        .collect();
                    (b, keys[0], packed)
                })
                .collect();
            depth += 1;
        }
    }

    /// One tree block. A leaf's items are records; a node's alternate
    /// (key) and (pointer, MAX).
    #[allow(clippy::too_many_arguments)]
    fn write_block(
        &self,
        img: &mut Sparse,
        ag: u32,
        agbno: u32,
        magic: u32,
        level: u16,
        left: u32,
        right: u32,
        items: &[(u32, u32)],
    ) {
        let bs = self.bs as usize;
        let hdr = self.hdr();
        let mut b = vec![0u8; bs];
        let p32 = |b: &mut [u8], o: usize, v: u32| b[o..o + 4].copy_from_slice(&v.to_be_bytes());
        p32(&mut b, 0, magic);
        b[4..6].copy_from_slice(&level.to_be_bytes());
        let n = if level == 0 {
            items.len()
        } else {
            items.len() / 2
        };
        b[6..8].copy_from_slice(&(n as u16).to_be_bytes());
        p32(&mut b, 8, left);
        p32(&mut b, 12, right);
        let off = self.ag_byte(ag) + u64::from(agbno) * u64::from(self.bs);
        if level == 0 {
            for (i, &(s, l)) in items.iter().enumerate() {
                p32(&mut b, hdr + 8 * i, s);
                p32(&mut b, hdr + 8 * i + 4, l);
            }
        } else {
            let maxrecs = (bs - hdr) / 12;
            for (i, pair) in items.chunks(2).enumerate() {
                p32(&mut b, hdr + 8 * i, pair[0].0);
                p32(&mut b, hdr + 8 * i + 4, pair[0].1);
                p32(&mut b, hdr + 8 * maxrecs + 4 * i, pair[1].0);
            }
        }
        if self.v5 {
            b[16..24].copy_from_slice(&(off >> 9).to_be_bytes());
            b[32..48].copy_from_slice(&UUID);
            p32(&mut b, 48, ag);
            xfs_crc(&mut b, 52);
        }
        img.write(off, &b);
    }

    /// Byte offset of block `agbno` of AG `ag`.
    pub fn block(&self, ag: u32, agbno: u32) -> u64 {
        self.ag_byte(ag) + u64::from(agbno) * u64::from(self.bs)
    }

    /// The internal log.
    pub fn ring(&self) -> Ring {
        let (start, len) = self.log.unwrap();
        Ring {
            base: u64::from(start) * u64::from(self.bs),
            n: u64::from(len) * u64::from(self.bs) / 512,
        }
    }

    /// Edit `len` bytes at `off`, then restore the CRC at `crc_off` (v5).
    pub fn edit(
        &self,
        img: &mut Sparse,
        off: u64,
        len: usize,
        crc_off: usize,
        f: impl FnOnce(&mut Vec<u8>),
    ) {
        let mut b = img.read(off, len);
        f(&mut b);
        if self.v5 {
            xfs_crc(&mut b, crc_off);
        }
        img.write(off, &b);
    }
}

/// The log to write records in: at byte `base`, `n` BBs long.
#[derive(Clone, Copy)]
pub struct Ring {
    pub base: u64,
    pub n: u64,
}

/// An unmount record (one operation, UNMOUNT) at BB `bb` of the log, in
/// cycle `cycle`: a header BB and a data BB. `crc`: with its CRC (as the
/// kernel writes it) or with none (as mkfs does).
pub fn write_unmount_record(img: &mut Sparse, log: Ring, bb: u64, cycle: u32, crc: bool) {
    write_record(img, log, bb, cycle, 1, 0x20, crc);
}

/// A one-BB log record with `ops` operations, the first flagged `flags`.
/// A data BB that wraps to the ring's start is stamped with the next
/// cycle, before the CRC, as the kernel does.
pub fn write_record(
    img: &mut Sparse,
    log: Ring,
    bb: u64,
    cycle: u32,
    ops: u32,
    flags: u8,
    crc: bool,
) {
    let mut data = vec![0u8; 512];
    data[0..4].copy_from_slice(&1u32.to_be_bytes()); // tid
    data[4..8].copy_from_slice(&8u32.to_be_bytes()); // len
    data[8] = 0xaa; // XFS_LOG
    data[9] = flags;
    data[12..14].copy_from_slice(&0x6e55u16.to_be_bytes());
    let mut h = vec![0u8; 512];
    let p32 = |b: &mut [u8], o: usize, v: u32| b[o..o + 4].copy_from_slice(&v.to_be_bytes());
    p32(&mut h, 0, 0xfeed_babe);
    p32(&mut h, 4, cycle);
    p32(&mut h, 8, 2);
    p32(&mut h, 12, 512);
    h[16..24].copy_from_slice(&((u64::from(cycle) << 32) | bb).to_be_bytes());
    h[24..32].copy_from_slice(&((u64::from(cycle) << 32) | bb).to_be_bytes());
    p32(&mut h, 36, u32::MAX);
    p32(&mut h, 40, ops);
    // The data BB's first word moves to the header; the cycle replaces it.
    h[44..48].copy_from_slice(&data[0..4]);
    let data_bb = (bb + 1) % log.n;
    let data_cycle = if data_bb < bb { cycle + 1 } else { cycle };
    data[0..4].copy_from_slice(&data_cycle.to_be_bytes());
    p32(&mut h, 300, 1);
    h[304..320].copy_from_slice(&UUID);
    p32(&mut h, 320, 32768);
    if crc {
        let mut c = crate::crc32c_raw(!0, &h[..328]);
        c = crate::crc32c_raw(c, &data);
        h[32..36].copy_from_slice(&(!c).to_le_bytes());
    }
    img.write(log.base + bb * 512, &h);
    img.write(log.base + data_bb * 512, &data);
}

/// Stamp BBs `from..to` of the log at `log` with `cycle`, as written data.
pub fn stamp(img: &mut Sparse, log: Ring, from: u64, to: u64, cycle: u32) {
    for bb in from..to {
        img.put32(log.base + bb * 512, cycle);
    }
}
