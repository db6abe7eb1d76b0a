//! What a destination entry is ([`Stat`]), whether a file there is up to
//! date ([`quick_check`]), what an entry of another kind in the way
//! becomes ([`file_at`], [`dir_at`], [`symlink_at`], [`clear_for`]), and
//! which metadata to apply ([`meta_for_new`], [`meta_fixes`]).

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};

use ferry_link::{Entry, EntryKind};

use crate::itemize::Attrs;

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
    /// A device node's number.
    pub(crate) rdev: u64,
}

impl Stat {
    /// The plain facts of a raw `lstat`. (The casts: `struct stat`'s
    /// field types differ from one architecture to another.)
    #[allow(clippy::unnecessary_cast)]
    pub(crate) fn of_raw(st: &rustix::fs::Stat) -> Stat {
        use rustix::fs::FileType;
        let kind = match FileType::from_raw_mode(st.st_mode as _) {
            FileType::RegularFile => Kind::File,
            FileType::Directory => Kind::Dir,
            FileType::Symlink => Kind::Symlink,
            FileType::BlockDevice => Kind::BlockDevice,
            FileType::CharacterDevice => Kind::CharDevice,
            FileType::Fifo => Kind::Fifo,
            _ => Kind::Other,
        };
        Stat {
            kind,
            size: st.st_size as u64,
            mode: st.st_mode as u32,
            uid: st.st_uid,
            gid: st.st_gid,
            mtime: st.st_mtime as i64,
            mtime_nsec: st.st_mtime_nsec as u32,
            dev: st.st_dev as u64,
            ino: st.st_ino as u64,
            rdev: st.st_rdev as u64,
        }
    }

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
            rdev: m.rdev(),
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

/// The kind of node a special entry's `mode` names (`None`: not a
/// device, FIFO or socket, which a special entry must be).
pub(crate) fn node_kind(mode: u32) -> Option<Kind> {
    Some(match mode & libc::S_IFMT {
        libc::S_IFCHR => Kind::CharDevice,
        libc::S_IFBLK => Kind::BlockDevice,
        libc::S_IFIFO => Kind::Fifo,
        libc::S_IFSOCK => Kind::Other,
        _ => return None,
    })
}

/// Whether the destination's `old` already is the node `e` describes:
/// the same type and, for a device, the same number (then only its
/// attributes are fixed; otherwise a new node replaces it).
pub(crate) fn same_node(e: &Entry, old: &Stat) -> bool {
    old.mode & libc::S_IFMT == e.mode & libc::S_IFMT
        && (!matches!(old.kind, Kind::CharDevice | Kind::BlockDevice) || old.rdev == e.rdev)
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

/// Which attributes the receiver sets (rsync's `-o -g -p -t`; owner
/// and group only as root).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Keep {
    pub(crate) owner: bool,
    pub(crate) group: bool,
    pub(crate) perms: bool,
    pub(crate) times: bool,
}

impl Keep {
    /// Everything (a root receiver's default).
    #[cfg(test)]
    pub(crate) const ALL: Keep = Keep {
        owner: true,
        group: true,
        perms: true,
        times: true,
    };
    /// Permissions and times, not owners (a user's default).
    #[cfg(test)]
    pub(crate) const USER: Keep = Keep {
        owner: false,
        group: false,
        ..Keep::ALL
    };

    /// The ids to give an entry: `None` leaves one as it is.
    pub(crate) fn ids(&self, e: &Entry) -> (Option<u32>, Option<u32>) {
        (self.owner.then_some(e.uid), self.group.then_some(e.gid))
    }
}

/// Metadata a newly written entry of `kind` gets: owner and group as
/// kept, xattrs (and ACLs) when asked for, permissions
/// always (without `--perms` the entry's mode is already what a new
/// entry gets: see [`mode_without_perms`]), mtime as kept; a symlink gets
/// only owner and mtime, a hard link nothing of its own.
pub(crate) fn meta_for_new(kind: EntryKind, keep: Keep, xattrs: bool) -> MetaSteps {
    let owner = keep.owner || keep.group;
    match kind {
        EntryKind::File | EntryKind::Dir => MetaSteps {
            owner,
            mode: true,
            // Also without any: an inherited default ACL goes.
            xattrs,
            mtime: keep.times,
        },
        EntryKind::Symlink => MetaSteps {
            owner,
            mtime: keep.times,
            ..MetaSteps::default()
        },
        EntryKind::Special => MetaSteps {
            owner,
            mode: true,
            xattrs: false,
            mtime: keep.times,
        },
        EntryKind::HardLink => MetaSteps::default(),
    }
}

/// Metadata to bring an unchanged file `old` in line with `e`: only what
/// differs and is kept (permission bits, not the type), and the xattrs
/// (and ACLs) whenever they are asked for.
pub(crate) fn meta_fixes(e: &Entry, old: &Stat, keep: Keep, xattrs: bool) -> MetaSteps {
    let d = differs(e, old, keep);
    let owner = d.owner || d.group;
    MetaSteps {
        owner,
        // A chown clears set-ID bits: they are set again after it.
        mode: d.perms || (owner && keep.perms && e.mode & 0o6000 != 0),
        // Also without any: those the source lost go.
        xattrs,
        mtime: d.time,
    }
}

/// What to set on a directory at the end of the run, where it is `old`
/// now: as [`meta_fixes`], and its permission bits whenever they are not
/// the entry's (without `--perms` too: the entry holds what the directory
/// must end with, and one made this run was made with owner access first).
pub(crate) fn dir_meta_fixes(e: &Entry, old: &Stat, keep: Keep, xattrs: bool) -> MetaSteps {
    let mut steps = meta_fixes(e, old, keep, xattrs);
    steps.mode |= old.mode & 0o7777 != e.mode & 0o7777;
    steps
}

/// The permission bits an entry gets without `--perms`: an existing
/// entry keeps its own (`old`), a new one gets the source's less the
/// receiver's `umask`, as rsync does. The type bits stay the source's.
pub(crate) fn mode_without_perms(src: u32, old: Option<u32>, umask: u32) -> u32 {
    let perms = match old {
        Some(o) => o & 0o7777,
        None => src & 0o777 & !umask,
    };
    (src & !0o7777) | perms
}

/// What differs between the destination's `old` and the source entry
/// `e`, as `-i` lists it: size (files), and what is kept of modification
/// time, permission bits (not for symlinks), owner and group.
pub(crate) fn differs(e: &Entry, old: &Stat, keep: Keep) -> Attrs {
    let is_link = e.kind() == EntryKind::Symlink;
    Attrs {
        size: e.kind() == EntryKind::File && old.size != e.size,
        time: keep.times && (old.mtime, old.mtime_nsec) != (e.mtime, e.mtime_nsec),
        perms: keep.perms && !is_link && old.mode & 0o7777 != e.mode & 0o7777,
        owner: keep.owner && old.uid != e.uid,
        group: keep.group && old.gid != e.gid,
        ..Attrs::default()
    }
}

/// Whether an earlier copy (`--link-dest`) whose content matches `e`
/// may be linked: a regular file whose kept attributes (time, permissions,
/// owner, group, as `keep` says) are the source's, as rsync requires. A
/// time that differs is not linked even under `--checksum` (the link
/// would give the destination the earlier copy's time).
pub(crate) fn linkable(e: &Entry, old: &Stat, keep: Keep) -> bool {
    let a = differs(e, old, keep);
    old.kind == Kind::File && !a.time && !a.perms && !a.owner && !a.group
}

#[cfg(test)]
mod tests;
