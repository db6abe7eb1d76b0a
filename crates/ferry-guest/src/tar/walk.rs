//! The walk over an archive's headers.
//!
//! Each step reads the header at `pos`, checks it, and moves `pos` past
//! the header and its data (padded to 512 bytes): at least one block
//! forward, so the walk visits each offset once and ends within
//! `size / 512` steps. Everything read is bounded: the data of GNU long
//! names and PAX headers is read only up to a fixed size, and every
//! entry's data must lie inside the archive.

use super::header::{self, Block, Check, BLOCK};
use super::pax::{self, Pax};
use super::TarError;
use crate::ReadAt;

/// The most a GNU long name ('L') or long link name ('K') may hold.
pub(super) const MAX_LONG_NAME: u64 = 64 << 10;
/// The most a PAX extended header ('x') or global header ('g') may hold.
pub(super) const MAX_PAX: u64 = 1 << 20;

/// What kind of entry a header describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// A regular file ('0', '\0', or '7', contiguous) stored whole.
    Regular,
    /// A regular file stored sparse: an old GNU sparse entry ('S'), or
    /// one whose PAX records say `GNU.sparse.*`.
    Sparse,
    HardLink,
    Symlink,
    CharDevice,
    BlockDevice,
    /// A directory ('5', GNU's dump directory 'D', or a regular-file
    /// entry whose name ends in '/', as old tars wrote directories).
    Directory,
    Fifo,
    VolumeLabel,
    MultiVolume,
    Unknown,
}

impl Kind {
    fn of(flag: u8) -> Kind {
        match flag {
            b'0' | 0 | b'7' => Kind::Regular,
            b'S' => Kind::Sparse,
            b'1' => Kind::HardLink,
            b'2' => Kind::Symlink,
            b'3' => Kind::CharDevice,
            b'4' => Kind::BlockDevice,
            b'5' | b'D' => Kind::Directory,
            b'6' => Kind::Fifo,
            b'V' => Kind::VolumeLabel,
            b'M' => Kind::MultiVolume,
            _ => Kind::Unknown,
        }
    }

    /// What the entry is, for a message: "<name> is a directory".
    pub fn what(self) -> &'static str {
        match self {
            Kind::Regular => "a regular file",
            Kind::Sparse => "a sparse file",
            Kind::HardLink => "a hard link",
            Kind::Symlink => "a symbolic link",
            Kind::CharDevice => "a character device",
            Kind::BlockDevice => "a block device",
            Kind::Directory => "a directory",
            Kind::Fifo => "a FIFO",
            Kind::VolumeLabel => "a volume label",
            Kind::MultiVolume => "the continuation of a file from another volume",
            Kind::Unknown => "an entry of a type ferry does not know",
        }
    }
}

/// One entry of the archive.
#[derive(Clone, Debug)]
pub(super) struct Entry {
    /// Its full name: from PAX records, a GNU long name, or the header.
    pub name: Vec<u8>,
    pub kind: Kind,
    /// The offset of its first data byte.
    pub offset: u64,
    /// The length of its data in the archive.
    pub size: u64,
}

/// What the extended headers read so far say about the next entry.
#[derive(Default)]
struct Pending {
    long_name: Option<Vec<u8>>,
    pax: Pax,
    /// The offset of the first of these extended headers.
    since: Option<u64>,
}

/// Visit every entry of the archive `r`, in order. Fails on the first
/// thing that does not check out.
pub(super) fn walk(r: &dyn ReadAt, mut visit: impl FnMut(Entry)) -> Result<(), TarError> {
    sniff(r)?;
    let end = r.size();
    let mut pos = 0u64;
    let mut pending = Pending::default();
    // `pos` grows by at least one block a step: at most end / 512 steps.
    while pos < end {
        if end - pos < BLOCK {
            return Err(corrupt(format!(
                "truncated: the archive ends {} bytes into the header at offset {pos}",
                end - pos
            )));
        }
        let mut b: Block = [0; BLOCK as usize];
        read(r, &mut b, pos)?;
        match header::check(&b) {
            Check::Zero => break,
            Check::Bad => {
                return Err(corrupt(format!(
                    "the header at offset {pos} has a bad checksum"
                )))
            }
            Check::Valid => {}
        }
        let hsize = header::size(&b).ok_or_else(|| {
            corrupt(format!(
                "the header at offset {pos} has an unreadable size field"
            ))
        })?;
        let data = pos + BLOCK; // end - pos >= BLOCK: no overflow
        let flag = header::typeflag(&b);
        let (data, size) = match flag {
            b'L' | b'K' | b'x' | b'g' => {
                let (what, limit) = match flag {
                    b'L' => ("GNU long name", MAX_LONG_NAME),
                    b'K' => ("GNU long link name", MAX_LONG_NAME),
                    b'x' => ("PAX extended header", MAX_PAX),
                    _ => ("PAX global header", MAX_PAX),
                };
                if hsize > limit {
                    return Err(corrupt(format!(
                        "the {what} at offset {pos} claims {hsize} bytes (at most {limit} are allowed)"
                    )));
                }
                inside(data, hsize, end, || format!("the {what} at offset {pos}"))?;
                match flag {
                    b'L' => {
                        let buf = read_vec(r, data, hsize)?;
                        pending.long_name = Some(header::cstr(&buf).to_vec());
                    }
                    b'x' => {
                        let buf = read_vec(r, data, hsize)?;
                        pax::parse(&buf, &mut pending.pax).map_err(|why| {
                            corrupt(format!("the PAX extended header at offset {pos} has {why}"))
                        })?;
                    }
                    _ => {} // the link name and global records mean nothing here
                }
                pending.since.get_or_insert(pos);
                (data, hsize)
            }
            _ => {
                let mut kind = Kind::of(flag);
                let data = if flag == b'S' {
                    skip_sparse_map(r, &b, data, end, pos)?
                } else {
                    data
                };
                let pending = std::mem::take(&mut pending);
                let name = match pending.pax.name() {
                    Some(n) => n.to_vec(),
                    None => pending.long_name.unwrap_or_else(|| header::name(&b)),
                };
                if kind == Kind::Regular && pending.pax.sparse {
                    kind = Kind::Sparse;
                }
                if kind == Kind::Regular && name.ends_with(b"/") {
                    kind = Kind::Directory;
                }
                // As GNU tar: hard links and directories have no data on
                // the tape, whatever their size field says.
                let size = match flag {
                    b'1' | b'5' => 0,
                    _ => pending.pax.size.unwrap_or(hsize),
                };
                inside(data, size, end, || {
                    let shown = super::shorten(String::from_utf8_lossy(&name).into_owned());
                    format!("the member {shown:?} at offset {pos}")
                })?;
                visit(Entry {
                    name,
                    kind,
                    offset: data,
                    size,
                });
                (data, size)
            }
        };
        pos = size
            .div_ceil(BLOCK)
            .checked_mul(BLOCK)
            .and_then(|padded| data.checked_add(padded))
            .ok_or_else(|| {
                corrupt(format!(
                    "the header at offset {pos} has a size out of range"
                ))
            })?;
    }
    if let Some(at) = pending.since {
        return Err(corrupt(format!(
            "the archive ends after the extended header at offset {at}, before the entry it describes"
        )));
    }
    Ok(())
}

/// Refuse, up front and clearly, what is not a tar archive: compressed
/// tars above all.
fn sniff(r: &dyn ReadAt) -> Result<(), TarError> {
    let end = r.size();
    if end == 0 {
        return Err(TarError::NotTar("it is empty"));
    }
    let mut head: Block = [0; BLOCK as usize];
    let n = end.min(BLOCK) as usize;
    let head = head.get_mut(..n).unwrap_or_default();
    read(r, head, 0)?;
    if let Ok(block) = <&Block>::try_from(&*head) {
        // A valid header (or an empty archive's zero block) is a tar,
        // whatever its first bytes look like.
        if header::check(block) != Check::Bad {
            return Ok(());
        }
    }
    if let Some(kind) = compression(head) {
        return Err(TarError::Compressed(kind));
    }
    if head.starts_with(b"PK\x03\x04") {
        return Err(TarError::NotTar("it is a zip archive"));
    }
    match <&Block>::try_from(&*head) {
        Err(_) => Err(TarError::NotTar(
            "it is shorter than one 512-byte tar header",
        )),
        // With the magic of a tar it is a tar: the walk reports its bad
        // checksum as corruption.
        Ok(block) if header::has_magic(block) => Ok(()),
        Ok(_) => Err(TarError::NotTar("its first block is not a tar header")),
    }
}

/// The compressor whose magic number starts `head`, if any.
pub(super) fn compression(head: &[u8]) -> Option<&'static str> {
    const MAGICS: &[(&[u8], &str)] = &[
        (b"\x1f\x8b", "gzip"),
        (b"\xfd7zXZ\x00", "xz"),
        (b"\x28\xb5\x2f\xfd", "zstd"),
        (b"\x04\x22\x4d\x18", "lz4"),
        (b"LZIP", "lzip"),
    ];
    if let Some(&(_, kind)) = MAGICS.iter().find(|(m, _)| head.starts_with(m)) {
        return Some(kind);
    }
    match head {
        [b'B', b'Z', b'h', b'1'..=b'9', ..] => Some("bzip2"),
        _ => None,
    }
}

/// Skip the extension blocks of an old GNU sparse header's map; the
/// offset of the member's data.
fn skip_sparse_map(
    r: &dyn ReadAt,
    b: &Block,
    mut at: u64,
    end: u64,
    pos: u64,
) -> Result<u64, TarError> {
    let mut extended = header::gnu_sparse_extended(b);
    // `at` grows by one block a step and must stay inside the archive.
    while extended {
        if end.saturating_sub(at) < BLOCK {
            return Err(corrupt(format!(
                "truncated: the sparse map of the member at offset {pos} runs past the end of the archive"
            )));
        }
        let mut ext: Block = [0; BLOCK as usize];
        read(r, &mut ext, at)?;
        extended = ext[header::EXT_ISEXTENDED] != 0;
        at += BLOCK;
    }
    Ok(at)
}

/// Check that `size` bytes of data at `data` lie inside the archive.
fn inside(data: u64, size: u64, end: u64, what: impl FnOnce() -> String) -> Result<(), TarError> {
    match data.checked_add(size) {
        Some(e) if e <= end => Ok(()),
        _ => Err(corrupt(format!(
            "truncated: {} has {size} bytes of data at offset {data}, past the archive's end at {end}",
            what()
        ))),
    }
}

/// Read `len` bytes (checked against a small bound by the caller).
fn read_vec(r: &dyn ReadAt, off: u64, len: u64) -> Result<Vec<u8>, TarError> {
    let len = usize::try_from(len).map_err(|_| corrupt("a header's data is too large".into()))?;
    let mut buf = vec![0; len];
    read(r, &mut buf, off)?;
    Ok(buf)
}

/// Read at `off`; running past the end means the archive is truncated.
fn read(r: &dyn ReadAt, buf: &mut [u8], off: u64) -> Result<(), TarError> {
    r.read_exact_at(buf, off).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            corrupt(format!(
                "truncated: reading {} bytes at offset {off} ran past the end",
                buf.len()
            ))
        } else {
            TarError::Io(e)
        }
    })
}

fn corrupt(why: String) -> TarError {
    TarError::Corrupt(why)
}
