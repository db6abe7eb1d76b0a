//! The readable side of an endpoint.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};

use crate::fsutil;

/// A readable source of one file's bytes: a regular file or a block device
/// (data extents from `SEEK_DATA`/`SEEK_HOLE`), an NBD export (extents
/// from `NBD_CMD_BLOCK_STATUS`, where ranges flagged `NBD_STATE_ZERO` are
/// zeros), or the O_DIRECT reader over a file.
pub trait Source: Send + Sync {
    /// The next data extent at or after `pos` and before `end`, or `None`
    /// when only zeros remain.
    fn next_data(&self, pos: u64, end: u64) -> io::Result<Option<(u64, u64)>>;
    /// Read exactly `buf.len()` bytes at `off`.
    fn read_exact_at(&self, buf: &mut [u8], off: u64) -> io::Result<()>;
    /// Size and modification time now, to detect a source that changed
    /// while it was read; `None` when the source cannot tell (devices,
    /// NBD exports).
    fn stamp(&self) -> io::Result<Option<(u64, (i64, u32))>>;
    /// The ranges (all zeros to [`Source::read_exact_at`]) that the
    /// source's guest does not use (`--sparsify`): sent as `Unused`, which
    /// a destination written in place may leave as it is.
    fn unused(&self) -> Option<&ferry_guest::Ranges> {
        None
    }
}

impl Source for File {
    fn next_data(&self, pos: u64, end: u64) -> io::Result<Option<(u64, u64)>> {
        fsutil::next_data(self, pos, end)
    }
    fn read_exact_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        fsutil::read_exact_at(self, buf, off)
    }
    fn stamp(&self) -> io::Result<Option<(u64, (i64, u32))>> {
        let m = self.metadata()?;
        if m.file_type().is_block_device() {
            return Ok(None);
        }
        Ok(Some((m.len(), (m.mtime(), m.mtime_nsec() as u32))))
    }
}
