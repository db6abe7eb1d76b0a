//! The writable side of an endpoint.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use crate::fsutil;

/// Where a received file's bytes go: a local file (a temp file renamed
/// into place, or a device or file written in place) or an NBD export
/// (written in place).
pub trait Sink: Send + Sync {
    /// Write all of `buf` at `off`.
    fn put_at(&self, buf: &[u8], off: u64) -> io::Result<()>;
    /// Make `[off, off + len)` read as zeros, without writing them where
    /// the sink can (a punched hole, NBD WRITE_ZEROES).
    fn zero_range(&self, off: u64, len: u64) -> io::Result<()>;
    /// Make everything written so far durable (fdatasync, NBD FLUSH).
    fn durable(&self) -> io::Result<()>;
    /// Read back `buf.len()` bytes written at `off` (a resumed transfer
    /// verifies what an interrupted run left before it counts).
    fn read_back_at(&self, buf: &mut [u8], off: u64) -> io::Result<()>;
    /// The local file behind the sink, for what only a file can do
    /// (O_DIRECT writes, read-back verification, setting its length,
    /// metadata and times); `None` for an NBD export.
    fn as_file(&self) -> Option<&File> {
        None
    }
}

impl Sink for File {
    fn put_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        FileExt::write_all_at(self, buf, off)
    }
    fn zero_range(&self, off: u64, len: u64) -> io::Result<()> {
        fsutil::zero_range(self, off, len)
    }
    fn durable(&self) -> io::Result<()> {
        File::sync_data(self)
    }
    fn read_back_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        FileExt::read_exact_at(self, buf, off)
    }
    fn as_file(&self) -> Option<&File> {
        Some(self)
    }
}
