//! MBR: four primary entries, and the chain of extended boot records
//! (EBRs) that holds the logical partitions of an extended one.

use super::{le32, read_at, sort_and_check, Partition, Scheme, Table};
use crate::error::FsError;
use crate::ReadAt;

const KIND: &str = "MBR";
/// MBR sectors are 512 bytes (the LBA unit of its entries).
const SECTOR: u64 = 512;
/// At most this many EBRs are followed: more is taken for a corrupt chain.
const MAX_EBRS: usize = 128;

/// One 16-byte entry of an MBR or an EBR.
#[derive(Clone, Copy)]
struct Entry {
    status: u8,
    kind: u8,
    start: u32,
    sectors: u32,
}

impl Entry {
    fn parse(sector: &[u8; 512], i: usize) -> Entry {
        let off = 446 + 16 * i;
        Entry {
            status: sector.get(off).copied().unwrap_or(0),
            kind: sector.get(off + 4).copied().unwrap_or(0),
            start: le32(sector, off + 8),
            sectors: le32(sector, off + 12),
        }
    }

    fn is_used(self) -> bool {
        self.kind != 0 && self.sectors != 0
    }
}

fn is_extended(kind: u8) -> bool {
    matches!(kind, 0x05 | 0x0F | 0x85)
}

/// The summary's name of an MBR partition type.
fn type_name(kind: u8) -> String {
    match kind {
        0x83 => "Linux".into(),
        0x82 => "Linux swap".into(),
        0x8e => "Linux LVM".into(),
        0xfd => "Linux RAID".into(),
        0x0b | 0x0c => "FAT32".into(),
        0x07 => "NTFS/exFAT".into(),
        0xef => "EFI system".into(),
        _ => format!("type 0x{kind:02x}"),
    }
}

/// Read the MBR whose first sector is `sector0` (signature already
/// checked). `None` when it is not a partition table after all.
///
/// Boot flags: like the Linux kernel, a status byte other than 0x00 or
/// 0x80 in any of the four entries means this sector is not a partition
/// table (a FAT boot sector or boot code ends in 0x55AA as well), and so
/// does a sector with no used entry: there is nothing in it to map either
/// way, and the image is then taken as a whole.
///
/// Entries of type 0 or with no sectors are empty. One extended partition
/// (0x05, 0x0F, 0x85) at most; its container is not listed. Each EBR's
/// first entry is a logical partition (its start relative to that EBR),
/// its second the link to the next EBR (relative to the extended
/// partition's start) or empty at the chain's end; the other two must be
/// empty. Every EBR must lie inside the extended partition, carry the
/// 0x55AA signature and be visited once (a loop is corrupt). A logical
/// partition need not lie inside the extended one (Linux lists it wherever
/// it is), but no partition may overlap another, the extended partition
/// (for primaries), the MBR or an EBR.
pub(super) fn read(r: &dyn ReadAt, sector0: &[u8; 512]) -> Result<Option<Table>, FsError> {
    let entries: Vec<Entry> = (0..4).map(|i| Entry::parse(sector0, i)).collect();
    if entries.iter().any(|e| e.status != 0x00 && e.status != 0x80) {
        return Ok(None);
    }
    if !entries.iter().any(|e| e.is_used()) {
        return Ok(None);
    }
    let mut parts = Vec::new();
    let mut reserved = vec![(0, SECTOR)];
    let mut extended: Option<(u32, Entry)> = None;
    for (number, e) in (1u32..).zip(entries.iter().copied()) {
        if !e.is_used() {
            continue;
        }
        if is_extended(e.kind) {
            if let Some((first, _)) = extended {
                return Err(FsError::corrupt(
                    KIND,
                    format!("two extended partitions ({first} and {number})"),
                ));
            }
            extended = Some((number, e));
            continue;
        }
        parts.push(Partition {
            number,
            start: u64::from(e.start) * SECTOR,
            len: u64::from(e.sectors) * SECTOR,
            type_name: type_name(e.kind),
        });
    }
    if let Some((number, ext)) = extended {
        let start = u64::from(ext.start) * SECTOR;
        let end = start + u64::from(ext.sectors) * SECTOR;
        if let Some(p) = parts
            .iter()
            .find(|p| p.start < end && start < p.start.saturating_add(p.len))
        {
            return Err(FsError::corrupt(
                KIND,
                format!(
                    "partition {} overlaps the extended partition {number}",
                    p.number
                ),
            ));
        }
        if ext.start == 0 {
            return Err(FsError::corrupt(
                KIND,
                "the extended partition starts at sector 0",
            ));
        }
        logical(r, ext, &mut parts, &mut reserved)?;
    }
    sort_and_check(KIND, &mut parts, &reserved)?;
    Ok(Some(Table {
        scheme: Scheme::Mbr,
        parts,
    }))
}

/// Follow the EBR chain of the extended partition `ext`: its logical
/// partitions go into `parts` (numbered 5...), each EBR's sector into
/// `reserved`.
fn logical(
    r: &dyn ReadAt,
    ext: Entry,
    parts: &mut Vec<Partition>,
    reserved: &mut Vec<(u64, u64)>,
) -> Result<(), FsError> {
    let ext_start = u64::from(ext.start);
    let ext_end = ext_start + u64::from(ext.sectors);
    let mut visited: Vec<u64> = Vec::new();
    let mut link = 0u64;
    let mut number = 5u32;
    loop {
        let ebr = ext_start + link;
        if ebr >= ext_end {
            return Err(FsError::corrupt(
                KIND,
                format!(
                    "an extended boot record at sector {ebr} lies outside the extended partition"
                ),
            ));
        }
        if visited.contains(&ebr) {
            return Err(FsError::corrupt(
                KIND,
                format!("the chain of logical partitions loops back to sector {ebr}"),
            ));
        }
        if visited.len() >= MAX_EBRS {
            return Err(FsError::corrupt(
                KIND,
                format!("more than {MAX_EBRS} extended boot records"),
            ));
        }
        visited.push(ebr);
        reserved.push((ebr * SECTOR, (ebr + 1) * SECTOR));
        let mut sector = [0u8; 512];
        read_at(r, &mut sector, ebr * SECTOR, KIND)?;
        if sector[510..512] != [0x55, 0xAA] {
            return Err(FsError::corrupt(
                KIND,
                format!("the extended boot record at sector {ebr} has no 0x55AA signature"),
            ));
        }
        let data = Entry::parse(&sector, 0);
        let next = Entry::parse(&sector, 1);
        if (2..4).any(|i| Entry::parse(&sector, i).kind != 0) {
            return Err(FsError::corrupt(
                KIND,
                format!("the extended boot record at sector {ebr} has more than two entries"),
            ));
        }
        if data.is_used() {
            if is_extended(data.kind) {
                return Err(FsError::corrupt(
                    KIND,
                    format!("the extended boot record at sector {ebr} holds an extended partition as its logical one"),
                ));
            }
            parts.push(Partition {
                number,
                start: (ebr + u64::from(data.start)) * SECTOR,
                len: u64::from(data.sectors) * SECTOR,
                type_name: type_name(data.kind),
            });
            number += 1;
        }
        if !next.is_used() {
            return Ok(());
        }
        if !is_extended(next.kind) {
            return Err(FsError::corrupt(
                KIND,
                format!(
                    "the extended boot record at sector {ebr} links with type 0x{:02x}",
                    next.kind
                ),
            ));
        }
        link = u64::from(next.start);
    }
}
