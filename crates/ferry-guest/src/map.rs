//! The whole image: its partition table, then each partition's filesystem.

use crate::error::{FsError, GuestError};
use crate::part::{self, Scheme};
use crate::{ext4, swap, xfs, Ranges, ReadAt, Window};

/// What one filesystem reader found.
#[derive(Debug)]
pub struct FsMap {
    /// "ext2", "ext3", "ext4", "xfs" or "swap".
    pub kind: &'static str,
    /// Byte ranges (relative to the filesystem's start) that the
    /// filesystem certainly does not use.
    pub free: Ranges,
    /// Set when the filesystem says it is mounted, in use or needs
    /// recovery: why. Its maps may change under the copy.
    pub in_use: Option<String>,
}

/// How to map.
#[derive(Clone, Copy, Debug, Default)]
pub struct MapOptions {
    /// Map filesystems that look in use as well.
    pub force: bool,
}

/// What happened to one region of the image (a partition, or the whole
/// image when it has no partition table).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegionKind {
    /// A filesystem ferry read: `free` bytes of it are skipped.
    Mapped { kind: &'static str, free: u64 },
    /// Copied whole (with zero detection): not a filesystem ferry knows, or
    /// one whose metadata did not check out.
    Whole { why: String },
}

/// One region of the image and what was done with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Region {
    pub start: u64,
    pub len: u64,
    /// "the image", "partition 2", ...
    pub what: String,
    pub kind: RegionKind,
}

/// The guest's map of an image.
#[derive(Debug, Default)]
pub struct GuestMap {
    /// The table's scheme: "GPT", "MBR" or "none".
    pub scheme: &'static str,
    /// Byte ranges of the image that no filesystem uses: treated as holes.
    pub free: Ranges,
    pub regions: Vec<Region>,
    /// Why the partition table was not used, when it was not.
    pub table_note: Option<String>,
}

impl GuestMap {
    /// One line per region, for the summary.
    pub fn summary_lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(n) = &self.table_note {
            out.push(format!("partition table not used: {n}"));
        }
        for r in &self.regions {
            let line = match &r.kind {
                RegionKind::Mapped { kind, free } => format!(
                    "{}: {kind}, {} of {} unused, skipped",
                    r.what,
                    mib(*free),
                    mib(r.len)
                ),
                RegionKind::Whole { why } => {
                    format!("{}: copied whole ({why})", r.what)
                }
            };
            out.push(line);
        }
        out
    }
}

/// Sizes in the summary: MiB with one decimal, whatever the size (a
/// terabyte image reads as 1048576.0 MiB, still exact enough to compare).
fn mib(n: u64) -> String {
    format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64)
}

type Reader = fn(&dyn ReadAt) -> Result<FsMap, FsError>;

/// The filesystem readers, in the order they are tried.
const READERS: [Reader; 3] = [ext4::free_ranges, xfs::free_ranges, swap::free_ranges];

/// Which filesystem, if any, the region holds.
fn probe(r: &dyn ReadAt) -> Result<Option<FsMap>, FsError> {
    for read in READERS {
        match read(r) {
            Ok(m) => return Ok(Some(m)),
            Err(FsError::NotThis(_)) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// Map one region: its filesystem's free ranges (absolute) go into `free`.
fn map_region(
    img: &dyn ReadAt,
    start: u64,
    len: u64,
    what: String,
    opts: &MapOptions,
    free: &mut Ranges,
) -> Result<Region, GuestError> {
    let win = Window {
        inner: img,
        base: start,
        len,
    };
    let kind = match probe(&win) {
        Ok(Some(m)) => match m.in_use {
            // Maps known to be out of date (a journal or log to replay, a
            // mounted filesystem, a hibernation image) are never used: the
            // copy's free blocks would hold what only the log knows.
            Some(why) if !opts.force => {
                return Err(GuestError::InUse {
                    what: m.kind,
                    offset: start,
                    why,
                });
            }
            Some(why) => RegionKind::Whole {
                why: format!("{}: {why}", m.kind),
            },
            None => {
                let mut f = m.free;
                f.clip(0, len);
                for &(s, e) in f.as_slice() {
                    free.push(start + s, start + e);
                }
                RegionKind::Mapped {
                    kind: m.kind,
                    free: f.total(),
                }
            }
        },
        Ok(None) => RegionKind::Whole {
            why: "no filesystem ferry reads".into(),
        },
        Err(FsError::Io(e)) if e.kind() != std::io::ErrorKind::UnexpectedEof => {
            return Err(GuestError::Io(e))
        }
        Err(e) => RegionKind::Whole { why: e.to_string() },
    };
    Ok(Region {
        start,
        len,
        what,
        kind,
    })
}

/// Map `img`: read its partition table (or take it as one filesystem), and
/// each filesystem's allocation map. Only what is certainly unused ends up
/// in [`GuestMap::free`].
pub fn map_image(img: &dyn ReadAt, opts: &MapOptions) -> Result<GuestMap, GuestError> {
    let size = img.size();
    let mut map = GuestMap {
        scheme: "none",
        ..Default::default()
    };
    // A filesystem at offset 0, and a partition table, each looked for on
    // its own: a disk formatted whole and partitioned later keeps the old
    // superblock beside the new table (sfdisk does not wipe it), and Linux
    // goes by the table.
    let bare = match probe(img) {
        Ok(Some(m)) => Some(m.kind),
        Ok(None) => None,
        Err(FsError::Io(e)) if e.kind() != std::io::ErrorKind::UnexpectedEof => {
            return Err(GuestError::Io(e))
        }
        Err(_) => None,
    };
    let table = match part::read_table(img) {
        Ok(t) if !matches!(t.scheme, Scheme::None) && !t.parts.is_empty() => Some(t),
        Ok(_) => None,
        Err(FsError::Io(e)) if e.kind() != std::io::ErrorKind::UnexpectedEof => {
            return Err(GuestError::Io(e))
        }
        Err(e) => {
            map.table_note = Some(e.to_string());
            None
        }
    };
    match (table, bare) {
        (Some(t), None) => {
            map.scheme = t.scheme.name();
            for p in &t.parts {
                let what = format!("partition {} ({})", p.number, p.type_name);
                let region = map_region(img, p.start, p.len, what, opts, &mut map.free)?;
                map.regions.push(region);
            }
        }
        (Some(t), Some(kind)) => {
            // Which of the two is stale cannot be told: nothing is skipped.
            map.scheme = t.scheme.name();
            map.regions.push(Region {
                start: 0,
                len: size,
                what: "the image".into(),
                kind: RegionKind::Whole {
                    why: format!(
                        "both a {} partition table and {kind} at offset 0: one of them is stale",
                        t.scheme.name()
                    ),
                },
            });
        }
        (None, Some(kind)) if map.table_note.is_some() => {
            // A damaged table beside a filesystem: trust neither.
            map.regions.push(Region {
                start: 0,
                len: size,
                what: "the image".into(),
                kind: RegionKind::Whole {
                    why: format!("{kind} at offset 0 beside a damaged partition table"),
                },
            });
        }
        (None, _) => {
            let region = map_region(img, 0, size, "the image".into(), opts, &mut map.free)?;
            map.regions.push(region);
        }
    }
    Ok(map)
}
