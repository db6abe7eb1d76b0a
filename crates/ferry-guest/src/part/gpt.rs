//! GPT: the primary header at LBA 1 or else the backup one, and its array
//! of partition entries, both checked against their CRC32.

use super::{le16, le32, le64, sort_and_check, Partition, Scheme, Table};
use crate::error::FsError;
use crate::ReadAt;

const KIND: &str = "GPT";
const SIGNATURE: &[u8; 8] = b"EFI PART";
/// At most this many entries (128 is usual).
const MAX_ENTRIES: u32 = 16384;
/// At most this many bytes of entries are read.
const MAX_ARRAY: u64 = 4 << 20;

/// A GPT header's fields, checked.
struct Header {
    alternate: u64,
    first_usable: u64,
    last_usable: u64,
    entries_lba: u64,
    entries: u32,
    entry_size: u32,
    entries_crc: u32,
}

/// Why a header (or its entries) was not used: a reason, or a read error
/// that must reach the caller.
enum Bad {
    Why(String),
    Io(std::io::Error),
}

impl From<String> for Bad {
    fn from(s: String) -> Self {
        Bad::Why(s)
    }
}

impl From<&str> for Bad {
    fn from(s: &str) -> Self {
        Bad::Why(s.into())
    }
}

fn read_bytes(r: &dyn ReadAt, buf: &mut [u8], off: u64) -> Result<(), Bad> {
    r.read_exact_at(buf, off).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            Bad::Why("truncated: past the end of the image".into())
        } else {
            Bad::Io(e)
        }
    })
}

/// Whether "EFI PART" is at byte `off`.
fn signature_at(r: &dyn ReadAt, off: u64) -> Result<bool, FsError> {
    let mut sig = [0u8; 8];
    match r.read_exact_at(&mut sig, off) {
        Ok(()) => Ok(&sig == SIGNATURE),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Read the GPT of an image whose MBR is protective.
///
/// The sector size is 512, or 4096 when the primary header is found there
/// only; with no primary header at either, backups are looked for with
/// both. The primary header and its entries are used when both check out,
/// otherwise the backup header (at the primary's alternate LBA, or the
/// image's last sector) and its entries. Neither: corrupt.
pub(super) fn read(r: &dyn ReadAt) -> Result<Table, FsError> {
    let sizes: &[u64] = if signature_at(r, 512)? {
        &[512]
    } else if signature_at(r, 4096)? {
        &[4096]
    } else {
        &[512, 4096]
    };
    let mut why = Vec::new();
    for &ss in sizes {
        let mut backups = Vec::new();
        match table_at(r, ss, 1) {
            Ok(t) => return Ok(t),
            Err((Bad::Io(e), _)) => return Err(e.into()),
            Err((Bad::Why(w), alternate)) => {
                why.push(format!("primary header ({ss}-byte sectors): {w}"));
                backups.extend(alternate);
            }
        }
        if let Some(last) = (r.size() / ss).checked_sub(1) {
            backups.push(last);
        }
        backups.dedup();
        for lba in backups.into_iter().filter(|&l| l > 1) {
            match table_at(r, ss, lba) {
                Ok(t) => return Ok(t),
                Err((Bad::Io(e), _)) => return Err(e.into()),
                Err((Bad::Why(w), _)) => why.push(format!("backup header at LBA {lba}: {w}")),
            }
        }
    }
    Err(FsError::corrupt(KIND, why.join("; ")))
}

/// The table of the header at `lba`. On failure, also the header's
/// alternate LBA when its signature was there (a place to look for the
/// backup, to be checked like any other).
fn table_at(r: &dyn ReadAt, ss: u64, lba: u64) -> Result<Table, (Bad, Option<u64>)> {
    let mut sector = vec![0u8; ss as usize];
    let off = lba
        .checked_mul(ss)
        .ok_or_else(|| (Bad::from("LBA out of range"), None))?;
    read_bytes(r, &mut sector, off).map_err(|b| (b, None))?;
    let alternate = (sector.get(0..8) == Some(&SIGNATURE[..])).then(|| le64(&sector, 32));
    let h = header(&sector, ss, lba).map_err(|w| (Bad::Why(w), alternate))?;
    entries(r, ss, &h).map_err(|b| (b, alternate))
}

/// Check the header in `sector`, read at `lba`.
fn header(sector: &[u8], ss: u64, lba: u64) -> Result<Header, String> {
    if sector.get(0..8) != Some(&SIGNATURE[..]) {
        return Err("no \"EFI PART\" signature".into());
    }
    let revision = le32(sector, 8);
    if revision >> 16 != 1 {
        return Err(format!("revision 0x{revision:08x}"));
    }
    let hsize = le32(sector, 12);
    if !(92..=ss).contains(&u64::from(hsize)) {
        return Err(format!("header size {hsize}"));
    }
    let mut copy = sector.get(..hsize as usize).unwrap_or_default().to_vec();
    if let Some(crc) = copy.get_mut(16..20) {
        crc.fill(0);
    }
    let crc = le32(sector, 16);
    if crate::crc32_ieee(&copy) != crc {
        return Err("header CRC32 does not match".into());
    }
    let my_lba = le64(sector, 24);
    if my_lba != lba {
        return Err(format!("header says it is at LBA {my_lba}, read at {lba}"));
    }
    let h = Header {
        alternate: le64(sector, 32),
        first_usable: le64(sector, 40),
        last_usable: le64(sector, 48),
        entries_lba: le64(sector, 72),
        entries: le32(sector, 80),
        entry_size: le32(sector, 84),
        entries_crc: le32(sector, 88),
    };
    if h.entry_size < 128 || !h.entry_size.is_multiple_of(8) || h.entry_size > 4096 {
        return Err(format!("entry size {}", h.entry_size));
    }
    if h.entries > MAX_ENTRIES {
        return Err(format!(
            "{} entries (at most {MAX_ENTRIES} read)",
            h.entries
        ));
    }
    let bytes = u64::from(h.entries) * u64::from(h.entry_size);
    if bytes > MAX_ARRAY {
        return Err(format!(
            "{bytes} bytes of entries (at most {MAX_ARRAY} read)"
        ));
    }
    // Partitions lie in the usable range; the table's own sectors (the
    // protective MBR, both headers, this array) must lie outside it, so
    // that no partition's filesystem can declare them free.
    let usable = h.first_usable..=h.last_usable;
    if h.first_usable > h.last_usable || h.first_usable == 0 {
        return Err(format!(
            "usable LBAs {}..={}",
            h.first_usable, h.last_usable
        ));
    }
    let array_end = h
        .entries_lba
        .checked_add(bytes.div_ceil(ss))
        .ok_or("entries' LBA out of range")?;
    // The other header's array, where tools put it: just before the backup
    // header, or from LBA 2 after the primary one.
    let n = bytes.div_ceil(ss);
    let (other_start, other_end) = if lba < h.alternate {
        (h.alternate.saturating_sub(n), h.alternate)
    } else {
        (2, 2u64.saturating_add(n))
    };
    let overlaps = |s: u64, e: u64| s <= h.last_usable && h.first_usable < e;
    if usable.contains(&lba)
        || usable.contains(&h.alternate)
        || overlaps(h.entries_lba, array_end)
        || overlaps(other_start, other_end)
    {
        return Err("the table's own sectors lie in the usable range".into());
    }
    Ok(h)
}

/// Read and check the entries of header `h`.
fn entries(r: &dyn ReadAt, ss: u64, h: &Header) -> Result<Table, Bad> {
    let bytes = u64::from(h.entries) * u64::from(h.entry_size);
    let off = h
        .entries_lba
        .checked_mul(ss)
        .ok_or("entries' LBA out of range")?;
    if off.checked_add(bytes).is_none_or(|end| end > r.size()) {
        return Err("truncated: the entries lie past the end of the image".into());
    }
    let mut array = vec![0u8; bytes as usize];
    read_bytes(r, &mut array, off)?;
    if crate::crc32_ieee(&array) != h.entries_crc {
        return Err("entries' CRC32 does not match".into());
    }
    let mut parts = Vec::new();
    for (number, e) in (1u32..).zip(array.chunks_exact(h.entry_size as usize)) {
        let guid = e.get(0..16).unwrap_or_default();
        if guid.iter().all(|&b| b == 0) {
            continue;
        }
        let first = le64(e, 32);
        let last = le64(e, 40);
        if last < first || first < h.first_usable || last > h.last_usable {
            return Err(Bad::Why(format!(
                "partition {number}'s LBAs {first}..={last} are not inside the usable {}..={}",
                h.first_usable, h.last_usable
            )));
        }
        let extent = (last - first)
            .checked_add(1)
            .and_then(|n| n.checked_mul(ss))
            .zip(first.checked_mul(ss))
            .filter(|&(len, start)| start.checked_add(len).is_some());
        let Some((len, start)) = extent else {
            return Err(Bad::Why(format!("partition {number}'s LBAs out of range")));
        };
        parts.push(Partition {
            number,
            start,
            len,
            type_name: type_name(guid),
        });
    }
    sort_and_check(KIND, &mut parts, &[]).map_err(|e| Bad::Why(e.to_string()))?;
    Ok(Table {
        scheme: Scheme::Gpt,
        parts,
    })
}

/// A GUID as text: the first three fields little-endian, as GPT stores
/// them.
pub(super) fn guid_text(g: &[u8]) -> String {
    let tail: String = g
        .get(10..16)
        .unwrap_or_default()
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect();
    format!(
        "{:08X}-{:04X}-{:04X}-{:02X}{:02X}-{tail}",
        le32(g, 0),
        le16(g, 4),
        le16(g, 6),
        g.get(8).copied().unwrap_or(0),
        g.get(9).copied().unwrap_or(0),
    )
}

/// The summary's name of a GPT partition type.
fn type_name(guid: &[u8]) -> String {
    let text = guid_text(guid);
    let name = match text.as_str() {
        "0FC63DAF-8483-4772-8E79-3D69D8477DE4" => "Linux filesystem",
        "0657FD6D-A4AB-43C4-84E5-0933C84B4F4F" => "Linux swap",
        "C12A7328-F81F-11D2-BA4B-00A0C93EC93B" => "EFI system",
        "EBD0A0A2-B9E5-4433-87C0-68B6B72699C7" => "Microsoft basic data",
        "E6D6D379-F507-44C2-A23C-238F2A3DF928" => "Linux LVM",
        "21686148-6449-6E6F-744E-656564454649" => "BIOS boot",
        "A19D880F-05FC-4D3B-A006-743F0F84911E" => "Linux RAID",
        "4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709" => "Linux root (x86-64)",
        "B921B045-1DF0-41C3-AF44-4C6F280D3FAE" => "Linux root (ARM-64)",
        "933AC7E1-2EB4-4F13-B844-0E14E2AEF915" => "Linux home",
        _ => return format!("type {text}"),
    };
    name.into()
}
