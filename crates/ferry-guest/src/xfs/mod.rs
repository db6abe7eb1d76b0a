//! XFS: the free-space B+trees of each allocation group.
//!
//! The superblock (sector 0) gives the geometry. Each allocation group (AG)
//! starts with four sectors: a copy of the superblock, the AGF (free space
//! header), the AGI (inodes) and the AGFL (a small list of blocks held back
//! for the free-space trees themselves). The AGF roots two B+trees of the
//! same free extents: by block number (bnobt) and by size (cntbt). The free
//! ranges come from the bnobt leaves, in order; the cntbt must hold the same
//! extents (count, total and a hash of the set are compared). AGFL blocks
//! are not in the bnobt and are kept (they are the filesystem's); so are
//! the internal log's, which mkfs allocates like any other extent.
//!
//! Whether the filesystem is in use: XFS keeps no "mounted" flag. What it
//! exposes is its log: a filesystem unmounted cleanly ends its log with an
//! unmount record; one that is mounted, frozen or crashed does not. `log`
//! finds the head of an internal log as XFS does and checks for that
//! record. An external log is not on this device and is not checked: that
//! is left to the caller (is the device mounted). The superblock's
//! `sb_inprogress` (mkfs unfinished) and v5 log-incompatible feature bits
//! (set only while a log holds such records) also mean in use.
//!
//! Not read: a realtime subvolume (its own bitmap), and features newer than
//! the ones listed in [`sb`]: both are reported `Unsupported`.

mod ag;
mod log;
mod sb;

#[cfg(test)]
mod tests;

use crate::error::FsError;
use crate::field::{be16, be32, be64};
use crate::map::FsMap;
use crate::{Ranges, ReadAt};

pub(crate) const KIND: &str = "xfs";

fn corrupt(why: impl Into<String>) -> FsError {
    FsError::corrupt(KIND, why)
}

/// `len` bytes at `off`; the image ending first is corruption (truncated).
fn read_at(r: &dyn ReadAt, off: u64, len: usize) -> Result<Vec<u8>, FsError> {
    let mut buf = vec![0u8; len];
    r.read_exact_at(&mut buf, off).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            corrupt(format!("truncated: {len} bytes at {off} are past the end"))
        } else {
            FsError::Io(e)
        }
    })?;
    Ok(buf)
}

/// Big-endian fields of an on-disk structure. Out of range reads give 0:
/// every buffer is at least as long as the structure read from it, so they
/// never happen, but they must not panic either.
fn byte(b: &[u8], off: usize) -> u8 {
    b.get(off).copied().unwrap_or(0)
}

fn uuid_at(b: &[u8], off: usize) -> [u8; 16] {
    let mut u = [0u8; 16];
    if let Some(s) = b.get(off..off + 16) {
        u.copy_from_slice(s);
    }
    u
}

/// Whether the little-endian CRC32C stored at `crc_off` of `buf` is the
/// one XFS computes: CRC32C (seed !0, final inversion) of the buffer with
/// the CRC field taken as zero.
fn crc_ok(buf: &[u8], crc_off: usize) -> bool {
    let Some(stored) = buf.get(crc_off..crc_off + 4) else {
        return false;
    };
    let stored = u32::from_le_bytes([stored[0], stored[1], stored[2], stored[3]]);
    let (head, rest) = buf.split_at(crc_off);
    let mut crc = crate::crc32c_raw(!0, head);
    crc = crate::crc32c_raw(crc, &[0u8; 4]);
    crc = crate::crc32c_raw(crc, rest.get(4..).unwrap_or(&[]));
    !crc == stored
}

/// Map the XFS filesystem that starts at offset 0 of `r`.
///
/// `NotThis` without the superblock's magic; `Unsupported` for a realtime
/// subvolume or a feature not listed in `sb`; `Corrupt` when the superblock,
/// an AGF, an AGFL or a free-space B+tree block does not check out. The free
/// ranges are the extents of every AG's bnobt, less the AGFL, in bytes from
/// the start of the filesystem; the space past the filesystem's last block
/// is never reported free. When the filesystem looks in use and its maps
/// do not check out, `in_use` says both and nothing is named free.
pub fn free_ranges(r: &dyn ReadAt) -> Result<FsMap, FsError> {
    let sb = sb::Sb::read(r)?;
    let mut in_use = sb.in_use();
    if in_use.is_none() {
        in_use = log::state(r, &sb)?;
    }
    let mut free = Ranges::new();
    let mapped = (0..sb.agcount).try_for_each(|agno| ag::map_ag(r, &sb, agno, &mut free));
    match (mapped, in_use) {
        (Ok(()), in_use) => Ok(FsMap {
            kind: KIND,
            free,
            in_use,
        }),
        // A filesystem in use can be caught between writes: say it is in
        // use (the caller asks for --force) and name nothing free.
        (Err(FsError::Corrupt { why, .. }), Some(reason)) => Ok(FsMap {
            kind: KIND,
            free: Ranges::new(),
            in_use: Some(format!(
                "{reason}; its free-space maps do not check out ({why})"
            )),
        }),
        (Err(e), _) => Err(e),
    }
}
