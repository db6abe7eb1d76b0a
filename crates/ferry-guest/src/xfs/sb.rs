//! The superblock: geometry, features, and what it says about its state.
//!
//! Features read (anything else is `Unsupported`):
//! - v4: every `sb_versionnum` bit but SHARED; `sb_features2` LAZYSBCOUNT,
//!   ATTR2, PROJID32 and FTYPE.
//! - v5 read-only-compatible: FINOBT, RMAPBT, REFLINK, INOBTCNT (none of
//!   them changes the free-space trees or the AGF's layout of them).
//! - v5 incompatible: FTYPE, SPINODES, META_UUID, BIGTIME, NREXT64,
//!   EXCHRANGE, PARENT (inode and directory formats only). NEEDSREPAIR is
//!   corruption (xfs_repair must run first). METADIR, ZONED and anything
//!   newer are not read.
//! - v5 log-incompatible bits are set by the kernel while it uses them and
//!   cleared when the log is cleaned: any one set means in use.

use super::{be16, be32, be64, byte, corrupt, crc_ok, read_at, uuid_at, KIND};
use crate::error::FsError;
use crate::ReadAt;

const SB_MAGIC: u32 = 0x5846_5342; // "XFSB"

const VERSION_NUMBITS: u16 = 0x000f;
const VERSION_SHAREDBIT: u16 = 0x0200;
const VERSION_LOGV2BIT: u16 = 0x0400;
const VERSION_MOREBITSBIT: u16 = 0x8000;

const V2_OKBITS: u32 = 0x0000_0002 | 0x0000_0008 | 0x0000_0080 | 0x0000_0200;

const RO_COMPAT_KNOWN: u32 = 0x0f;
const INCOMPAT_NEEDSREPAIR: u32 = 1 << 4;
/// FTYPE, SPINODES, META_UUID, BIGTIME, NREXT64, EXCHRANGE, PARENT.
const INCOMPAT_KNOWN: u32 = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80;
const INCOMPAT_META_UUID: u32 = 1 << 2;

/// Where the v5 superblock keeps its CRC.
const SB_CRC_OFF: usize = 224;

/// What the AGs and the log need from the superblock.
#[derive(Debug)]
pub(super) struct Sb {
    pub v5: bool,
    pub blocksize: u32,
    pub blocklog: u32,
    pub sectsize: u32,
    pub dblocks: u64,
    pub agblocks: u32,
    pub agcount: u32,
    pub agblklog: u32,
    /// The filesystem's UUID, as the log headers carry it.
    pub uuid: [u8; 16],
    /// The UUID stamped in v5 metadata blocks.
    pub meta_uuid: [u8; 16],
    /// First block of an internal log (an `XFS_FSB` number), 0 if external.
    pub logstart: u64,
    pub logblocks: u32,
    pub logv2: bool,
    inprogress: u8,
    log_incompat: u32,
}

impl Sb {
    /// Read and check the superblock at offset 0.
    pub fn read(r: &dyn ReadAt) -> Result<Sb, FsError> {
        if r.size() < 4 || be32(&read_at(r, 0, 4)?, 0) != SB_MAGIC {
            return Err(FsError::NotThis(KIND));
        }
        let b = read_at(r, 0, 512)?;
        let sectsize = u32::from(be16(&b, 102));
        let sectlog = u32::from(byte(&b, 121));
        if !(9..=15).contains(&sectlog) || sectsize != 1 << sectlog {
            return Err(corrupt(format!(
                "sector size {sectsize} (log {sectlog}) is not a power of two of 512..32768"
            )));
        }
        // The whole sector: the v5 CRC covers it.
        let b = if sectsize > 512 {
            read_at(r, 0, sectsize as usize)?
        } else {
            b
        };
        let versionnum = be16(&b, 100);
        let version = versionnum & VERSION_NUMBITS;
        let v5 = match version {
            5 => true,
            4 => false,
            v => {
                return Err(FsError::unsupported(
                    KIND,
                    format!("version {v} superblock"),
                ))
            }
        };
        if v5 && !crc_ok(&b, SB_CRC_OFF) {
            return Err(corrupt("superblock CRC mismatch"));
        }
        let blocksize = be32(&b, 4);
        let blocklog = u32::from(byte(&b, 120));
        let min_blocklog = if v5 { 10 } else { 9 };
        if !(min_blocklog..=16).contains(&blocklog) || blocksize != 1 << blocklog {
            return Err(corrupt(format!(
                "block size {blocksize} (log {blocklog}) out of range"
            )));
        }
        if sectsize > blocksize {
            return Err(corrupt("sector size larger than the block size"));
        }
        if versionnum & VERSION_SHAREDBIT != 0 || byte(&b, 179) != 0 {
            return Err(FsError::unsupported(KIND, "shared superblock"));
        }
        if !v5 && versionnum & VERSION_MOREBITSBIT != 0 {
            // Some old kernels wrote features2 to the wrong place: XFS merges
            // both copies.
            let f2 = be32(&b, 200) | be32(&b, 204);
            if f2 & !V2_OKBITS != 0 {
                return Err(FsError::unsupported(
                    KIND,
                    format!("unknown v4 features2 0x{:x}", f2 & !V2_OKBITS),
                ));
            }
        }
        let mut log_incompat = 0;
        let mut meta_uuid = uuid_at(&b, 32);
        if v5 {
            let ro = be32(&b, 212);
            let inc = be32(&b, 216);
            log_incompat = be32(&b, 220);
            if ro & !RO_COMPAT_KNOWN != 0 {
                return Err(FsError::unsupported(
                    KIND,
                    format!(
                        "read-only-compatible features 0x{:x}",
                        ro & !RO_COMPAT_KNOWN
                    ),
                ));
            }
            if inc & INCOMPAT_NEEDSREPAIR != 0 {
                return Err(corrupt("marked as needing xfs_repair"));
            }
            if inc & !INCOMPAT_KNOWN != 0 {
                return Err(FsError::unsupported(
                    KIND,
                    format!("incompatible features 0x{:x}", inc & !INCOMPAT_KNOWN),
                ));
            }
            if inc & INCOMPAT_META_UUID != 0 {
                meta_uuid = uuid_at(&b, 248);
            }
        }
        // A realtime subvolume has its own allocation bitmap: not read.
        if be64(&b, 16) != 0 || be64(&b, 24) != 0 || be32(&b, 92) != 0 {
            return Err(FsError::unsupported(KIND, "realtime subvolume"));
        }
        let dblocks = be64(&b, 8);
        let agblocks = be32(&b, 84);
        let agcount = be32(&b, 88);
        let agblklog = u32::from(byte(&b, 124));
        check_geometry(dblocks, agblocks, agcount, agblklog, blocklog)?;
        let fs_bytes = dblocks
            .checked_mul(u64::from(blocksize))
            .ok_or_else(|| corrupt("filesystem size overflows"))?;
        if fs_bytes > r.size() {
            return Err(corrupt(format!(
                "truncated: the filesystem is {fs_bytes} bytes, the image {}",
                r.size()
            )));
        }
        let sb = Sb {
            v5,
            blocksize,
            blocklog,
            sectsize,
            dblocks,
            agblocks,
            agcount,
            agblklog,
            uuid: uuid_at(&b, 32),
            meta_uuid,
            logstart: be64(&b, 48),
            logblocks: be32(&b, 96),
            logv2: v5 || versionnum & VERSION_LOGV2BIT != 0,
            inprogress: byte(&b, 126),
            log_incompat,
        };
        sb.check_log()?;
        Ok(sb)
    }

    /// Why the superblock itself says the filesystem is in use, if it does.
    pub fn in_use(&self) -> Option<String> {
        if self.inprogress != 0 {
            return Some("mkfs has not finished (sb_inprogress is set)".into());
        }
        if self.log_incompat != 0 {
            return Some(format!(
                "log-incompatible features 0x{:x} are in use: mounted, or its log needs recovery",
                self.log_incompat
            ));
        }
        None
    }

    /// Blocks in AG `agno` (the last one may be short).
    pub fn ag_len(&self, agno: u32) -> u32 {
        let start = u64::from(agno) * u64::from(self.agblocks);
        let left = self.dblocks.saturating_sub(start);
        left.min(u64::from(self.agblocks)) as u32
    }

    /// Byte offset of block `agbno` of AG `agno`; `None` past the
    /// filesystem (never, for block numbers checked against `ag_len`).
    pub fn byte_of(&self, agno: u32, agbno: u32) -> Option<u64> {
        u64::from(agno)
            .checked_mul(u64::from(self.agblocks))?
            .checked_add(u64::from(agbno))?
            .checked_mul(u64::from(self.blocksize))
    }

    /// The internal log as (AG, first block), `None` when it is external.
    pub fn internal_log(&self) -> Option<(u32, u32)> {
        if self.logstart == 0 {
            return None;
        }
        let mask = (1u64 << self.agblklog) - 1;
        let agno = self.logstart >> self.agblklog;
        Some((agno as u32, (self.logstart & mask) as u32))
    }

    /// An internal log must lie inside one AG.
    fn check_log(&self) -> Result<(), FsError> {
        if self.logstart == 0 {
            return Ok(());
        }
        let agno = self.logstart >> self.agblklog;
        let agbno = self.logstart & ((1u64 << self.agblklog) - 1);
        if agno >= u64::from(self.agcount)
            || self.logblocks == 0
            || agbno + u64::from(self.logblocks) > u64::from(self.ag_len(agno as u32))
        {
            return Err(corrupt(format!(
                "internal log at block {} ({} blocks) is not inside an AG",
                self.logstart, self.logblocks
            )));
        }
        Ok(())
    }
}

/// The AG geometry must be the one XFS would accept.
fn check_geometry(
    dblocks: u64,
    agblocks: u32,
    agcount: u32,
    agblklog: u32,
    blocklog: u32,
) -> Result<(), FsError> {
    const MIN_AG_BLOCKS: u32 = 64;
    const MAX_AG_BYTES: u64 = 1 << 40;
    if agblocks < MIN_AG_BLOCKS || u64::from(agblocks) << blocklog > MAX_AG_BYTES {
        return Err(corrupt(format!("AG size {agblocks} blocks out of range")));
    }
    // agblklog is the log2 of agblocks rounded up.
    let want_log = 32 - (agblocks - 1).leading_zeros();
    if agblklog != want_log {
        return Err(corrupt(format!(
            "agblklog {agblklog} does not match {agblocks} blocks per AG"
        )));
    }
    if agcount == 0 || dblocks == 0 {
        return Err(corrupt("no AGs"));
    }
    let max = u64::from(agcount) * u64::from(agblocks);
    let min = u64::from(agcount - 1) * u64::from(agblocks) + u64::from(MIN_AG_BLOCKS);
    if dblocks > max || dblocks < min {
        return Err(corrupt(format!(
            "{dblocks} blocks do not make {agcount} AGs of {agblocks}"
        )));
    }
    Ok(())
}
