//! Members of a tar archive (ustar, GNU, PAX, v7), found in place.
//!
//! `ferry sync 'vm.ova#disk1.vmdk' dest` copies one member of an archive
//! without unpacking it: [`find_member`] walks the archive's headers and
//! says where the member's bytes are, and [`Member::window`] makes them an
//! image of their own.
//!
//! Only uncompressed archives can be read in place; compressed ones are
//! refused up front ([`TarError::Compressed`]). Only members stored whole
//! can be returned: a sparse member's bytes are not where a reader of the
//! file expects them ([`TarError::Sparse`]).
//!
//! The archive is untrusted. Every header's checksum is verified, every
//! member's data must lie inside the archive, GNU long names and PAX
//! headers are read only up to a fixed size, and the walk advances at
//! least one block per header.

mod header;
mod pax;
mod walk;

#[cfg(test)]
mod tests;

use crate::{ReadAt, Window};
use walk::{Entry, Kind};

/// Where a member's bytes are in the archive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    /// Offset of the member's first byte in the archive.
    pub offset: u64,
    /// The member's size in bytes; `offset + size` is within the archive.
    pub size: u64,
}

impl Member {
    /// The member's bytes in `archive`, as an image of their own.
    pub fn window<'a>(&self, archive: &'a dyn ReadAt) -> Window<'a> {
        Window {
            inner: archive,
            base: self.offset,
            len: self.size,
        }
    }
}

/// Why a member could not be found.
#[derive(Debug, thiserror::Error)]
pub enum TarError {
    /// Reading the archive failed.
    #[error("reading the archive: {0}")]
    Io(#[from] std::io::Error),
    /// The archive is compressed (gzip, xz, zstd, bzip2, lz4 or lzip):
    /// its members cannot be read in place.
    #[error("the archive is {0}-compressed; ferry reads members of uncompressed tars only (decompress it first)")]
    Compressed(&'static str),
    /// The file is not a tar archive at all.
    #[error("not a tar archive ({0})")]
    NotTar(&'static str),
    /// A header does not check out (bad checksum, unreadable field,
    /// malformed extended header) or the archive is truncated.
    #[error("the tar archive is corrupt: {0}")]
    Corrupt(String),
    /// No member of that name. `have` holds the names of up to ten
    /// members that could be read instead; `more` says there are others.
    #[error("no member {name:?} in the archive{}", listing(.have, *.more))]
    NotFound {
        name: String,
        have: Vec<String>,
        more: bool,
    },
    /// The member is a directory, a link, a device...
    #[error("{name:?} in the archive is {what}, not a regular file")]
    NotRegular { name: String, what: &'static str },
    /// The member is stored sparse (`tar --sparse`).
    #[error("{0:?} is stored as a sparse tar member, which ferry cannot read in place (create the archive without --sparse)")]
    Sparse(String),
}

/// "; it has "a", "b", ..." for [`TarError::NotFound`].
fn listing(have: &[String], more: bool) -> String {
    if have.is_empty() {
        return "; it has no regular files".into();
    }
    let names: Vec<String> = have.iter().map(|h| format!("{h:?}")).collect();
    let more = if more { ", ..." } else { "" };
    format!("; it has {}{more}", names.join(", "))
}

/// How many names [`TarError::NotFound`] lists.
const NOT_FOUND_NAMES: usize = 10;
/// How many characters of a name an error message shows.
const NOT_FOUND_NAME_CHARS: usize = 200;

/// Find member `name` in the tar archive `r`: the offset and size of its
/// data.
///
/// Names compare after stripping leading "./" and "/" and trailing "/"
/// on both sides, so "disk.vmdk" finds "./disk.vmdk". If the name occurs
/// more than once, the last occurrence wins, as when tar extracts the
/// archive. The whole archive is walked (its headers only), so a
/// corruption anywhere is reported rather than a member that a later
/// entry might have replaced.
pub fn find_member(r: &dyn ReadAt, name: &str) -> Result<Member, TarError> {
    let want = normalize(name.as_bytes());
    let mut found: Option<Entry> = None;
    let mut seen = Listing::new(NOT_FOUND_NAMES);
    walk::walk(r, |e| {
        seen.add(&e);
        if !want.is_empty() && normalize(&e.name) == want {
            found = Some(e);
        }
    })?;
    let Some(e) = found else {
        let have = seen
            .items
            .into_iter()
            .filter(|(_, size)| size.is_some())
            .map(|(n, _)| shorten(String::from_utf8_lossy(&n).into_owned()))
            .collect();
        return Err(TarError::NotFound {
            name: name.to_string(),
            have,
            more: seen.more,
        });
    };
    match e.kind {
        Kind::Regular => Ok(Member {
            offset: e.offset,
            size: e.size,
        }),
        Kind::Sparse => Err(TarError::Sparse(name.to_string())),
        kind => Err(TarError::NotRegular {
            name: name.to_string(),
            what: kind.what(),
        }),
    }
}

/// The names and sizes of up to `limit` members of `r` that
/// [`find_member`] can return, in the order of their first occurrence
/// (names without a leading "./"; sizes those of the last occurrence).
pub fn list_members(r: &dyn ReadAt, limit: usize) -> Result<Vec<(String, u64)>, TarError> {
    let mut seen = Listing::new(limit);
    walk::walk(r, |e| seen.add(&e))?;
    Ok(seen
        .items
        .into_iter()
        .filter_map(|(n, size)| Some((String::from_utf8_lossy(&n).into_owned(), size?)))
        .collect())
}

/// The first `limit` distinct names of regular members, each with the
/// size of its last occurrence (`None` if that is not a regular file).
struct Listing {
    limit: usize,
    items: Vec<(Vec<u8>, Option<u64>)>,
    /// A regular member was left out for the limit.
    more: bool,
}

impl Listing {
    fn new(limit: usize) -> Self {
        Listing {
            limit,
            items: Vec::new(),
            more: false,
        }
    }

    fn add(&mut self, e: &Entry) {
        let name = normalize(&e.name);
        let size = (e.kind == Kind::Regular).then_some(e.size);
        if let Some(item) = self.items.iter_mut().find(|(n, _)| n == name) {
            item.1 = size;
        } else if size.is_some() && !name.is_empty() {
            if self.items.len() < self.limit {
                self.items.push((name.to_vec(), size));
            } else {
                self.more = true;
            }
        }
    }
}

/// A member name as compared: without leading "./" and "/" (which tar
/// strips when it extracts) nor trailing "/".
fn normalize(mut name: &[u8]) -> &[u8] {
    loop {
        if let Some(rest) = name.strip_prefix(b"./") {
            name = rest;
        } else if let Some(rest) = name.strip_prefix(b"/") {
            name = rest;
        } else {
            break;
        }
    }
    while let Some(rest) = name.strip_suffix(b"/") {
        name = rest;
    }
    name
}

/// At most [`NOT_FOUND_NAME_CHARS`] characters of a name, for a message.
pub(super) fn shorten(name: String) -> String {
    match name.char_indices().nth(NOT_FOUND_NAME_CHARS) {
        Some((at, _)) => format!("{}...", &name[..at]),
        None => name,
    }
}
