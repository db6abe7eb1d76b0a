//! What a sender reads: anything that can say where its data is and read
//! it at an offset. Regular files and block devices (data extents from
//! `SEEK_DATA`/`SEEK_HOLE`) and NBD exports (extents from
//! `NBD_CMD_BLOCK_STATUS`, where holes and zero ranges are both zeros).

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};

use crate::fsutil;

/// A readable source of one file's bytes.
pub trait ExtentReader: Send + Sync {
    /// The next data extent at or after `pos` and before `end`, or `None`
    /// when only zeros remain.
    fn next_data(&self, pos: u64, end: u64) -> io::Result<Option<(u64, u64)>>;
    /// Read exactly `buf.len()` bytes at `off`.
    fn read_exact_at(&self, buf: &mut [u8], off: u64) -> io::Result<()>;
    /// Size and modification time now, to detect a source that changed
    /// while it was read; `None` when the source cannot tell (devices,
    /// NBD exports).
    fn stamp(&self) -> io::Result<Option<(u64, (i64, u32))>>;
}

impl ExtentReader for File {
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

/// True for `nbd://…`, `nbd+unix://…` (and the TLS forms, which the client
/// refuses with a clear error).
pub fn is_nbd_uri(s: &str) -> bool {
    ["nbd://", "nbd+unix://", "nbds://", "nbds+unix://"]
        .iter()
        .any(|p| s.starts_with(p))
}

/// The name an NBD export gets in a destination directory: its export name,
/// or `nbd-export.img` for the default export.
pub fn nbd_name(uri: &str) -> Vec<u8> {
    let after = uri.split_once("://").map(|x| x.1).unwrap_or("");
    let path = after.split(['?', '#']).next().unwrap_or("");
    let export = path.split_once('/').map(|x| x.1).unwrap_or("");
    let name = export.rsplit('/').next().unwrap_or("");
    if name.is_empty() || name == "." || name == ".." {
        b"nbd-export.img".to_vec()
    } else {
        name.as_bytes().to_vec()
    }
}

/// An NBD export as a source.
pub struct NbdSource(pub ferry_nbd::Client);

fn nbd_err(e: ferry_nbd::Error) -> io::Error {
    io::Error::other(format!("NBD: {e}"))
}

impl NbdSource {
    pub fn connect(uri: &str) -> io::Result<Self> {
        ferry_nbd::Client::connect(uri)
            .map(NbdSource)
            .map_err(nbd_err)
    }
    pub fn size(&self) -> u64 {
        self.0.size()
    }
}

impl ExtentReader for NbdSource {
    fn next_data(&self, mut pos: u64, end: u64) -> io::Result<Option<(u64, u64)>> {
        while pos < end {
            let exts = self.0.extents(pos, end - pos).map_err(nbd_err)?;
            if exts.is_empty() {
                return Ok(Some((pos, end)));
            }
            let mut start = None;
            for x in &exts {
                let data = !(x.hole || x.zero);
                match (start, data) {
                    (None, true) => start = Some(x.offset.max(pos)),
                    (Some(s), false) => return Ok(Some((s, x.offset))),
                    _ => {}
                }
            }
            let last = exts
                .last()
                .map(|x| x.offset + x.len)
                .unwrap_or(end)
                .min(end);
            if let Some(s) = start {
                return Ok(Some((s, last)));
            }
            if last <= pos {
                return Ok(Some((pos, end)));
            }
            pos = last;
        }
        Ok(None)
    }
    fn read_exact_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        self.0.read_at(off, buf).map_err(nbd_err)
    }
    fn stamp(&self) -> io::Result<Option<(u64, (i64, u32))>> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn nbd_names() {
        assert!(super::is_nbd_uri("nbd+unix:///?socket=/tmp/s"));
        assert!(!super::is_nbd_uri("/tmp/nbd://x"));
        assert_eq!(
            super::nbd_name("nbd+unix:///?socket=/tmp/s"),
            b"nbd-export.img"
        );
        assert_eq!(super::nbd_name("nbd://host:10809/disk.raw"), b"disk.raw");
    }
}
