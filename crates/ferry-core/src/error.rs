//! Errors of the engine, each with the exit status class it maps to.

use std::io;
use std::path::{Path, PathBuf};

use ferry_proto::LinkError;

/// What a failure means for the run as a whole; the CLI maps each class to
/// a documented exit code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Bad arguments: nothing was done.
    Usage,
    /// Some entries failed, the rest were transferred.
    Partial,
    /// A fatal local I/O error (missing source, unwritable destination,
    /// disk full).
    Io,
    /// The peer spoke garbage, or an incompatible protocol.
    Protocol,
    /// The link to the peer failed (could not connect, dropped).
    Connection,
    /// Stopped by a signal.
    Interrupted,
}

/// An engine error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}: {}", .path.display(), describe(.source))]
    Io { path: PathBuf, source: io::Error },
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Link(#[from] LinkError),
    #[error("peer reported: {0}")]
    Peer(String),
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("{failed} of {total} entries failed")]
    Partial { failed: u64, total: u64 },
    #[error("interrupted")]
    Interrupted,
}

impl Error {
    pub fn io(path: impl AsRef<Path>, source: io::Error) -> Self {
        Error::Io {
            path: path.as_ref().to_path_buf(),
            source,
        }
    }

    /// The exit class of this error.
    pub fn class(&self) -> Class {
        match self {
            Error::Io { .. } => Class::Io,
            Error::Usage(_) => Class::Usage,
            Error::Link(
                LinkError::Decode(_) | LinkError::BadMagic(_) | LinkError::FrameTooLarge(_),
            ) => Class::Protocol,
            Error::Link(_) => Class::Connection,
            Error::Peer(_) => Class::Io,
            Error::Protocol(_) => Class::Protocol,
            Error::Partial { .. } => Class::Partial,
            Error::Interrupted => Class::Interrupted,
        }
    }
}

/// `io::Error`'s text without the "(os error N)" noise for common cases.
pub fn describe(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::NotFound => "no such file or directory".into(),
        io::ErrorKind::PermissionDenied => "permission denied".into(),
        io::ErrorKind::StorageFull => "no space left on device".into(),
        io::ErrorKind::AlreadyExists => "already exists".into(),
        _ => {
            let s = e.to_string();
            match s.find(" (os error") {
                Some(i) => s[..i].to_string(),
                None => s,
            }
        }
    }
}

/// True for errors after which no further file can succeed either.
pub fn is_fatal_io(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::StorageFull
            | io::ErrorKind::QuotaExceeded
            | io::ErrorKind::ReadOnlyFilesystem
    )
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
