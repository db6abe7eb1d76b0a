//! What a destination entry is ([`Stat`]), whether a file there is up to
//! date ([`quick_check`]), what an entry of another kind in the way
//! becomes ([`file_at`], [`dir_at`], [`symlink_at`], [`clear_for`]), and
//! which metadata to apply ([`meta_for_new`], [`meta_fixes`]).

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};

use ferry_link::{Entry, EntryKind};

/// The kind of what a destination path holds (a symlink is a symlink,
/// never what it points to).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    File,
    Dir,
    Symlink,
    BlockDevice,
    CharDevice,
    Fifo,
    /// A socket, or anything else.
    Other,
}

/// The facts of a destination entry that the decisions look at: its
/// `lstat`, reduced to plain values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stat {
    pub(crate) kind: Kind,
    pub(crate) size: u64,
    /// Full `st_mode`.
    pub(crate) mode: u32,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) mtime: i64,
    pub(crate) mtime_nsec: u32,
    pub(crate) dev: u64,
    pub(crate) ino: u64,
}

impl Stat {
    /// The plain facts of `m` (from `lstat`).
    pub(crate) fn of(m: &fs::Metadata) -> Stat {
        let t = m.file_type();
        let kind = if t.is_file() {
            Kind::File
        } else if t.is_dir() {
            Kind::Dir
        } else if t.is_symlink() {
            Kind::Symlink
        } else if t.is_block_device() {
            Kind::BlockDevice
        } else if t.is_char_device() {
            Kind::CharDevice
        } else if t.is_fifo() {
            Kind::Fifo
        } else {
            Kind::Other
        };
        Stat {
            kind,
            size: m.len(),
            mode: m.mode(),
            uid: m.uid(),
            gid: m.gid(),
            mtime: m.mtime(),
            mtime_nsec: m.mtime_nsec() as u32,
            dev: m.dev(),
            ino: m.ino(),
        }
    }
}

/// Whether a regular file at the destination already holds the source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum QuickCheck {
    Unchanged,
    Changed,
    /// `--checksum`: unchanged if its contents hash to this digest.
    CompareDigest([u8; 32]),
}

/// Is the regular file `old` the source entry `e`? Sizes must agree;
/// then the mtime (to the nanosecond) decides, or with `--checksum` the
/// contents. A `--checksum` entry without a digest is unchanged only when
/// empty (an empty file has nothing to compare).
pub(crate) fn quick_check(e: &Entry, old: &Stat, checksum: bool) -> QuickCheck {
    if old.size != e.size {
        return QuickCheck::Changed;
    }
    if checksum {
        return match e.digest {
            Some(d) => QuickCheck::CompareDigest(d),
            None if e.size == 0 => QuickCheck::Unchanged,
            None => QuickCheck::Changed,
        };
    }
    if (old.mtime, old.mtime_nsec) == (e.mtime, e.mtime_nsec) {
        QuickCheck::Unchanged
    } else {
        QuickCheck::Changed
    }
}

/// What a file entry finds at its destination path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FileAt {
    /// Nothing, or a symlink or socket that the new file is renamed over.
    Nothing,
    /// A directory: cleared first (see [`clear_for`]).
    Dir,
    /// A block device: written in place, never replaced.
    BlockDevice,
    /// A character device or FIFO: written in order once verified.
    Stream,
    /// A regular file: compared, then updated.
    Regular,
}

impl FileAt {
    /// How the change is listed: something that is written over is an
    /// update, anything else (a replaced symlink too) a new file.
    pub(crate) fn verb(self) -> &'static str {
        match self {
            FileAt::Regular | FileAt::BlockDevice | FileAt::Stream => "update",
            FileAt::Nothing | FileAt::Dir => "new",
        }
    }
}

/// What a file entry finds at a path holding `existing`.
pub(crate) fn file_at(existing: Option<Kind>) -> FileAt {
    match existing {
        Some(Kind::Dir) => FileAt::Dir,
        Some(Kind::BlockDevice) => FileAt::BlockDevice,
        Some(Kind::CharDevice | Kind::Fifo) => FileAt::Stream,
        Some(Kind::File) => FileAt::Regular,
        Some(Kind::Symlink | Kind::Other) | None => FileAt::Nothing,
    }
}

/// How an entry of another kind in the way is removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Clear {
    /// A directory and all it holds (`--delete` or `--force`).
    Tree,
    /// A directory, only if empty: otherwise an error that names the
    /// options that would replace it.
    EmptyDir,
    /// A single non-directory.
    File,
}

/// How to remove what is in the way of a new entry of another kind.
pub(crate) fn clear_for(existing_is_dir: bool, delete: bool, force: bool) -> Clear {
    match (existing_is_dir, delete || force) {
        (false, _) => Clear::File,
        (true, true) => Clear::Tree,
        (true, false) => Clear::EmptyDir,
    }
}

/// What a directory entry does at its destination path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DirAt {
    /// A directory is there.
    Keep,
    Create,
    /// Something else is there (a symlink to a directory too): cleared, then
    /// the directory is created.
    ClearThenCreate,
}

pub(crate) fn dir_at(existing: Option<Kind>) -> DirAt {
    match existing {
        Some(Kind::Dir) => DirAt::Keep,
        Some(_) => DirAt::ClearThenCreate,
        None => DirAt::Create,
    }
}

/// What a symlink entry does at its destination path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SymlinkAt {
    /// The same symlink is there: only its metadata is brought in line.
    Keep,
    /// A new symlink is renamed over whatever non-directory is there.
    Create,
    /// A directory is in the way: cleared first.
    ClearThenCreate,
}

/// `current` is the target of the symlink there (read only when a symlink
/// is there), `want` the source's target.
pub(crate) fn symlink_at(existing: Option<Kind>, current: Option<&[u8]>, want: &[u8]) -> SymlinkAt {
    match existing {
        Some(Kind::Symlink) if current == Some(want) => SymlinkAt::Keep,
        Some(Kind::Dir) => SymlinkAt::ClearThenCreate,
        _ => SymlinkAt::Create,
    }
}

/// The hard link already names the same inode as its target.
pub(crate) fn already_linked(link: &Stat, target: &Stat) -> bool {
    link.dev == target.dev && link.ino == target.ino
}

/// Which metadata steps to take, in the order owner, permissions,
/// extended attributes, mtime.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct MetaSteps {
    pub(crate) owner: bool,
    pub(crate) mode: bool,
    pub(crate) xattrs: bool,
    pub(crate) mtime: bool,
}

/// Metadata a newly written entry of `kind` gets: owner with `--owner`,
/// xattrs with `--xattrs` when the source has any, permissions and mtime
/// always; a symlink gets only owner and mtime, a hard link nothing of its
/// own.
pub(crate) fn meta_for_new(
    kind: EntryKind,
    owner: bool,
    xattrs: bool,
    has_xattrs: bool,
) -> MetaSteps {
    match kind {
        EntryKind::File | EntryKind::Dir => MetaSteps {
            owner,
            mode: true,
            xattrs: xattrs && has_xattrs,
            mtime: true,
        },
        EntryKind::Symlink => MetaSteps {
            owner,
            mtime: true,
            ..MetaSteps::default()
        },
        EntryKind::HardLink => MetaSteps::default(),
    }
}

/// Metadata to bring an unchanged file `old` in line with `e`: only what
/// differs (permission bits, not the type; owner only with `--owner`),
/// and the xattrs with `--xattrs` whenever the source has any.
pub(crate) fn meta_fixes(e: &Entry, old: &Stat, owner: bool, xattrs: bool) -> MetaSteps {
    MetaSteps {
        owner: owner && (old.uid != e.uid || old.gid != e.gid),
        mode: old.mode & 0o7777 != e.mode & 0o7777,
        xattrs: xattrs && !e.xattrs.is_empty(),
        mtime: (old.mtime, old.mtime_nsec) != (e.mtime, e.mtime_nsec),
    }
}

#[cfg(test)]
mod tests;
