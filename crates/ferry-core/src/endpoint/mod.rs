//! What a sync reads from and writes to, behind two traits: a [`Source`]
//! says where its data is and reads it at an offset; a [`Sink`] writes at
//! an offset, makes ranges read as zeros, and makes what it was given
//! durable. A local regular file, a block device and an NBD export are
//! each one implementation of both, so the sender and the receiver never
//! ask which kind they hold: the only questions left are the ones the
//! kinds really answer differently (a local file is written to a temp file
//! and renamed; a device or an export is written in place and cannot tell
//! its modification time).
//!
//! [`Kind::of`] is the one place that tells a path argument from an NBD
//! URI.

mod guest;
mod nbd;
mod nbdmap;
mod sink;
mod source;

use std::io;

pub use guest::{
    looks_mounted, open_archive, open_member, sparsify, split_member, MemberSource, Sparsified,
};
pub use nbd::{NbdExport, NBD_CONNECTIONS};
pub use sink::Sink;
pub use source::Source;

use crate::error::{Error, Result};

/// What a command-line source or destination argument names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A local path: a tree, a file or a device.
    Path,
    /// An NBD export: `nbd://…`, `nbd+unix://…` (and the TLS forms, which
    /// the client refuses with a clear error).
    Nbd,
}

impl Kind {
    /// The kind of endpoint `arg` names. A path that merely contains
    /// `nbd://` further on is a path.
    pub fn of(arg: &str) -> Kind {
        let nbd = ["nbd://", "nbd+unix://", "nbds://", "nbds+unix://"]
            .iter()
            .any(|p| arg.starts_with(p));
        if nbd {
            Kind::Nbd
        } else {
            Kind::Path
        }
    }
}

/// Whether a source argument is a directory (`None`: it does not exist).
/// An NBD export and a tar member are files; a symlink is not, unless a
/// trailing `/` follows it (it is sent as the symlink it is, as rsync's
/// `-l` sends it).
pub fn is_dir(arg: &str) -> Option<bool> {
    let stat = if arg.ends_with('/') {
        std::fs::metadata
    } else {
        std::fs::symlink_metadata
    };
    match Kind::of(arg) {
        Kind::Nbd => Some(false),
        Kind::Path => match stat(arg) {
            Ok(m) => Some(m.is_dir()),
            Err(_) => split_member(arg).map(|_| false),
        },
    }
}

/// The name a source has of its own in a destination directory, whatever
/// the trailing-slash rule says: an NBD export's name (`nbd-export.img`
/// for the default export), a tar member's own file name (`disk.img` for
/// `vm.ova#dir/disk.img`). `None` for a path, which the plan names.
pub fn own_name(arg: &str) -> Option<Vec<u8>> {
    if Kind::of(arg) == Kind::Nbd {
        return Some(nbd::export_file_name(arg));
    }
    let (_, member) = split_member(arg)?;
    let base = member
        .rsplit('/')
        .find(|c| !c.is_empty() && *c != "." && *c != "..")?;
    Some(base.as_bytes().to_vec())
}

/// Some local source must exist (itself, or the link at its path) before
/// anything starts, and the archive of every member; an NBD export is
/// checked when it is opened.
pub fn check_sources_exist(sources: &[String]) -> Result<()> {
    let (mut any, mut missing) = (false, None);
    for s in sources.iter().filter(|s| Kind::of(s) == Kind::Path) {
        if let Some((archive, member)) = split_member(s) {
            // A missing member or a compressed archive: said now, once.
            let f = open_archive(std::path::Path::new(archive))?;
            open_member(
                std::sync::Arc::new(f),
                std::path::Path::new(archive),
                member,
            )?;
            continue;
        }
        let found = std::fs::symlink_metadata(s.trim_end_matches('/'))
            .or_else(|_| std::fs::symlink_metadata(s));
        match found {
            Ok(_) => any = true,
            Err(e) => missing = missing.or(Some(Error::io(s, e))),
        }
    }
    // Of several sources, those missing are the walk's error lines (the
    // others are sent, as rsync sends them); with none there, nothing is.
    match missing {
        Some(e) if !any => Err(e),
        _ => Ok(()),
    }
}

/// An error of an NBD endpoint, as the I/O error the engine reports.
pub(crate) fn nbd_io(e: ferry_nbd::Error) -> io::Error {
    io::Error::other(format!("NBD: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_names() {
        assert_eq!(Kind::of("nbd+unix:///?socket=/tmp/s"), Kind::Nbd);
        assert_eq!(Kind::of("nbds://h/x"), Kind::Nbd);
        assert_eq!(Kind::of("/tmp/nbd://x"), Kind::Path);
        assert_eq!(Kind::of("host:nbd://x"), Kind::Path);
        assert_eq!(
            own_name("nbd+unix:///?socket=/tmp/s").as_deref(),
            Some(&b"nbd-export.img"[..])
        );
        assert_eq!(
            own_name("nbd://host:10809/disk.raw").as_deref(),
            Some(&b"disk.raw"[..])
        );
        assert_eq!(
            own_name("nbd://h/a/..?x").as_deref(),
            Some(&b"nbd-export.img"[..])
        );
        assert_eq!(own_name("dir/disk.raw"), None);
        assert_eq!(is_dir("nbd://h/x"), Some(false));
    }
}
