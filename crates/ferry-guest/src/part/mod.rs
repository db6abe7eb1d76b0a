//! Partition tables: GPT and MBR (with the logical partitions of extended
//! ones).
//!
//! Only partitions are listed, never the space between them: what no
//! partition names is copied as it is. A table that does not check out
//! (a bad checksum with no good backup, partitions that overlap each other
//! or the table's own sectors, a loop in the chain of logical partitions)
//! is [`FsError::Corrupt`], and the caller then takes the image as a whole.

mod gpt;
mod mbr;

use crate::error::FsError;
pub(crate) use crate::field::{le16, le32, le64};
use crate::ReadAt;

/// The kind of partition table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    Gpt,
    Mbr,
    /// No partition table.
    None,
}

impl Scheme {
    /// "GPT", "MBR" or "none".
    pub fn name(self) -> &'static str {
        match self {
            Scheme::Gpt => "GPT",
            Scheme::Mbr => "MBR",
            Scheme::None => "none",
        }
    }
}

/// One partition that can hold a filesystem (not an extended container).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partition {
    /// As Linux numbers them: GPT entries 1.., MBR primaries 1-4, logical
    /// partitions 5...
    pub number: u32,
    /// Byte offset and length in the image.
    pub start: u64,
    pub len: u64,
    /// For the summary: "Linux filesystem", "Linux swap", "type 0x83", ...
    pub type_name: String,
}

/// A partition table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    pub scheme: Scheme,
    pub parts: Vec<Partition>,
}

/// Read the image's partition table.
///
/// No 0x55AA signature at byte 510: no table. A protective MBR (an entry
/// of type 0xEE): GPT, from the primary header or else the backup one.
/// Otherwise MBR, with the logical partitions of an extended one.
///
/// Partitions are sorted by start. A partition that starts past the end of
/// the image (a truncated image) is left out; one that starts inside it but
/// ends past it is listed with its declared extent, so that reading it
/// fails and it is copied whole.
pub fn read_table(r: &dyn ReadAt) -> Result<Table, FsError> {
    let mut sector = [0u8; 512];
    match r.read_exact_at(&mut sector, 0) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(none()),
        Err(e) => return Err(e.into()),
    }
    if sector[510..512] != [0x55, 0xAA] {
        return Ok(none());
    }
    let protective = (0..4).any(|i| sector[446 + 16 * i + 4] == 0xEE);
    let mut t = if protective {
        gpt::read(r)?
    } else {
        match mbr::read(r, &sector)? {
            Some(t) => t,
            None => return Ok(none()),
        }
    };
    let size = r.size();
    t.parts.retain(|p| p.start < size);
    Ok(t)
}

fn none() -> Table {
    Table {
        scheme: Scheme::None,
        parts: Vec::new(),
    }
}

/// Read `buf.len()` bytes at `off`; the image ending first is
/// [`FsError::Corrupt`] ("truncated"), as a truncated table must not be
/// trusted.
fn read_at(r: &dyn ReadAt, buf: &mut [u8], off: u64, kind: &'static str) -> Result<(), FsError> {
    r.read_exact_at(buf, off).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            FsError::corrupt(
                kind,
                format!(
                    "truncated: {} bytes at {off} past the end of the image",
                    buf.len()
                ),
            )
        } else {
            FsError::Io(e)
        }
    })
}

/// Sort `parts` by start and check that no two of them overlap, and that
/// none covers one of the `reserved` byte ranges (the table's own sectors).
fn sort_and_check(
    kind: &'static str,
    parts: &mut [Partition],
    reserved: &[(u64, u64)],
) -> Result<(), FsError> {
    parts.sort_by_key(|p| (p.start, p.number));
    for w in parts.windows(2) {
        if let [a, b] = w {
            if a.start.saturating_add(a.len) > b.start {
                return Err(FsError::corrupt(
                    kind,
                    format!("partitions {} and {} overlap", a.number, b.number),
                ));
            }
        }
    }
    for p in parts.iter() {
        let end = p.start.saturating_add(p.len);
        for &(s, e) in reserved {
            if p.start < e && s < end {
                return Err(FsError::corrupt(
                    kind,
                    format!(
                        "partition {} covers the partition table's own sectors at byte {s}",
                        p.number
                    ),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
