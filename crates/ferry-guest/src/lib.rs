//! What a disk image's guest uses.
//!
//! `--sparsify` treats the blocks that the guest's filesystems do not use
//! as holes: never read, never sent. This crate finds them. It reads the
//! partition table ([`part`]), recognises ext2/3/4 ([`ext4`]), XFS
//! ([`xfs`]) and Linux swap ([`swap`]) in each partition (or in the whole
//! image), and reads each filesystem's own allocation map. Everything it
//! does not recognise, or whose metadata does not check out, is kept: the
//! result only ever names ranges that are certainly free.
//!
//! [`tar`] finds a member of a tar archive, so that an image inside an OVA
//! is read in place.
//!
//! No I/O of its own: every read goes through [`ReadAt`], so the same code
//! maps a file, a block device, an NBD export or a tar member, and the
//! parsers can be fuzzed on bytes in memory. Every structure read from the
//! image is untrusted: sizes are checked before they are used, and the
//! amount read and held is bounded by the image's real layout.

pub mod error;
pub mod ext4;
mod field;
pub mod map;
pub mod part;
pub mod ranges;
pub mod swap;
pub mod tar;
pub mod xfs;

pub use error::{FsError, GuestError};
pub use map::{map_image, GuestMap, MapOptions, Region, RegionKind};
pub use ranges::Ranges;

use std::io;

/// Positional reads from an image: a file, a block device, an NBD export
/// or a window of one (a tar member).
pub trait ReadAt: Sync {
    /// Read exactly `buf.len()` bytes at `off`; an error if the image ends
    /// first.
    fn read_exact_at(&self, buf: &mut [u8], off: u64) -> io::Result<()>;
    /// The image's size in bytes.
    fn size(&self) -> u64;
}

impl ReadAt for [u8] {
    fn read_exact_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        let end = off
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= self.len() as u64)
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        buf.copy_from_slice(&self[off as usize..end as usize]);
        Ok(())
    }
    fn size(&self) -> u64 {
        self.len() as u64
    }
}

impl ReadAt for Vec<u8> {
    fn read_exact_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        self.as_slice().read_exact_at(buf, off)
    }
    fn size(&self) -> u64 {
        self.len() as u64
    }
}

/// A window of another image: `len` bytes from `base`.
pub struct Window<'a> {
    pub inner: &'a dyn ReadAt,
    pub base: u64,
    pub len: u64,
}

impl ReadAt for Window<'_> {
    fn read_exact_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        let end = off
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= self.len)
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        let _ = end;
        self.inner.read_exact_at(buf, self.base + off)
    }
    fn size(&self) -> u64 {
        self.len
    }
}

/// CRC32C as ext4 and XFS store it: `crc32c` without the final inversion,
/// continued from `seed`.
#[allow(dead_code)] // until the readers use it
pub(crate) fn crc32c_raw(seed: u32, data: &[u8]) -> u32 {
    !crc32c::crc32c_append(!seed, data)
}

/// CRC-32 (IEEE) as GPT stores it.
#[allow(dead_code)] // until the readers use it
pub(crate) fn crc32_ieee(data: &[u8]) -> u32 {
    crc32fast::hash(data)
}
