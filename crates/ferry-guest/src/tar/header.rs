//! One 512-byte tar header: its checksum, numbers and name.
//!
//! Field offsets are those of POSIX ustar; the old GNU format shares the
//! first 345 bytes and puts times and a sparse map where ustar has its
//! name prefix.

/// Every header and every data area is a whole number of these.
pub(super) const BLOCK: u64 = 512;

/// A header block.
pub(super) type Block = [u8; BLOCK as usize];

const NAME: std::ops::Range<usize> = 0..100;
const SIZE: std::ops::Range<usize> = 124..136;
const CHKSUM: std::ops::Range<usize> = 148..156;
const TYPEFLAG: usize = 156;
const MAGIC: std::ops::Range<usize> = 257..263;
const PREFIX: std::ops::Range<usize> = 345..500;
/// Old GNU sparse header ('S'): whether sparse-map extension blocks follow.
const GNU_ISEXTENDED: usize = 482;
/// In a sparse-map extension block: whether another one follows.
pub(super) const EXT_ISEXTENDED: usize = 504;

/// What a block is, by its checksum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Check {
    /// All zero apart from the checksum field: the end of the archive.
    Zero,
    /// The stored checksum matches the unsigned or the signed sum.
    Valid,
    /// Not a header.
    Bad,
}

/// Check a block's checksum the way GNU tar does: the sum of its bytes
/// with the checksum field counted as spaces, as unsigned bytes or (as
/// some old tars computed it) as signed ones.
pub(super) fn check(b: &Block) -> Check {
    let mut unsigned: u32 = 0;
    let mut signed: i32 = 0;
    for (i, &byte) in b.iter().enumerate() {
        let byte = if CHKSUM.contains(&i) { b' ' } else { byte };
        unsigned += u32::from(byte); // at most 512 * 255: no overflow
        signed += i32::from(byte as i8);
    }
    if unsigned == 8 * u32::from(b' ') {
        return Check::Zero;
    }
    match octal(&b[CHKSUM]) {
        Some(stored) if stored == u64::from(unsigned) => Check::Valid,
        Some(stored) if i64::try_from(stored).ok() == Some(i64::from(signed)) => Check::Valid,
        _ => Check::Bad,
    }
}

/// An octal field as GNU tar reads one: leading spaces, octal digits,
/// then the end of the field, a NUL or a space. No digits at all reads as
/// 0 only if the field is blank (NULs and spaces). `None` if malformed or
/// too large.
pub(super) fn octal(field: &[u8]) -> Option<u64> {
    let start = field.iter().position(|&c| c != b' ').unwrap_or(field.len());
    let digits = field
        .get(start..)?
        .iter()
        .take_while(|c| (b'0'..=b'7').contains(c))
        .count();
    let end = start + digits;
    match field.get(end) {
        None | Some(0) | Some(b' ') => {}
        Some(_) => return None,
    }
    if digits == 0 && !field.iter().all(|&c| c == 0 || c == b' ') {
        return None;
    }
    field.get(start..end)?.iter().try_fold(0u64, |v, &c| {
        v.checked_mul(8)?.checked_add(u64::from(c - b'0'))
    })
}

/// A numeric field: octal, or GNU's base-256 (the first byte's high bit
/// set; the rest of that byte and the following bytes are a big-endian
/// two's-complement number), which GNU tar and others write for members
/// of 8 GiB and more. Negative numbers are refused.
pub(super) fn number(field: &[u8]) -> Option<u64> {
    let (&first, rest) = field.split_first()?;
    if first & 0x80 == 0 {
        return octal(field);
    }
    if first & 0x40 != 0 {
        return None; // negative
    }
    rest.iter().try_fold(u64::from(first & 0x3f), |v, &c| {
        v.checked_mul(256)?.checked_add(u64::from(c))
    })
}

/// The bytes of a NUL-terminated field, up to its first NUL.
pub(super) fn cstr(field: &[u8]) -> &[u8] {
    let end = field.iter().position(|&c| c == 0).unwrap_or(field.len());
    field.get(..end).unwrap_or(field)
}

/// The header's type flag.
pub(super) fn typeflag(b: &Block) -> u8 {
    b[TYPEFLAG]
}

/// The header's size field; `None` if it is not a number.
pub(super) fn size(b: &Block) -> Option<u64> {
    number(&b[SIZE])
}

/// Whether the header carries the POSIX magic "ustar\0" (ustar and pax;
/// the old GNU format has "ustar  \0", v7 none).
pub(super) fn is_posix(b: &Block) -> bool {
    &b[MAGIC] == b"ustar\0"
}

/// Whether the header carries any ustar or GNU magic.
pub(super) fn has_magic(b: &Block) -> bool {
    b[MAGIC].starts_with(b"ustar")
}

/// The member's name in the header: a POSIX header's prefix, "/", then
/// its name field; only the name field otherwise (where the old GNU
/// format keeps times, not a prefix).
pub(super) fn name(b: &Block) -> Vec<u8> {
    let name = cstr(&b[NAME]);
    let prefix = if is_posix(b) { cstr(&b[PREFIX]) } else { &[] };
    let mut out = Vec::with_capacity(prefix.len() + 1 + name.len());
    if !prefix.is_empty() {
        out.extend_from_slice(prefix);
        out.push(b'/');
    }
    out.extend_from_slice(name);
    out
}

/// Whether an old GNU sparse header ('S') is followed by extension
/// blocks of its sparse map.
pub(super) fn gnu_sparse_extended(b: &Block) -> bool {
    b[GNU_ISEXTENDED] != 0
}

/// Store the checksum of a header built or changed by hand (for tests).
#[cfg(test)]
pub(super) fn set_checksum(b: &mut Block) {
    b[CHKSUM].fill(b' ');
    let sum: u32 = b.iter().map(|&c| u32::from(c)).sum();
    let text = format!("{sum:06o}\0 ");
    b[CHKSUM].copy_from_slice(text.as_bytes());
}
