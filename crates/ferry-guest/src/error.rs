//! Errors: what went wrong reading an image, and why a filesystem was not
//! mapped.

use std::io;

/// Why a filesystem (or a partition table) was not mapped.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// Not this kind of filesystem (no magic number): try the next kind.
    #[error("not {0}")]
    NotThis(&'static str),
    /// This kind, but its metadata does not check out (bad checksum, counts
    /// that disagree, a field out of range, a structure past the end): the
    /// region is copied whole.
    #[error("{kind}: {why}")]
    Corrupt { kind: &'static str, why: String },
    /// This kind, but a feature ferry does not read: copied whole.
    #[error("{kind}: {why}")]
    Unsupported { kind: &'static str, why: String },
    /// Reading the image failed.
    #[error("reading the image: {0}")]
    Io(#[from] io::Error),
}

impl FsError {
    pub fn corrupt(kind: &'static str, why: impl Into<String>) -> Self {
        FsError::Corrupt {
            kind,
            why: why.into(),
        }
    }
    pub fn unsupported(kind: &'static str, why: impl Into<String>) -> Self {
        FsError::Unsupported {
            kind,
            why: why.into(),
        }
    }
}

/// Why an image could not be mapped at all.
#[derive(Debug, thiserror::Error)]
pub enum GuestError {
    /// A filesystem looks in use; `--force` maps it anyway.
    #[error("{what} at offset {offset} looks in use ({why}); its maps may change under the copy (--force copies it anyway)")]
    InUse {
        what: &'static str,
        offset: u64,
        why: String,
    },
    /// Reading the image failed.
    #[error("reading the image: {0}")]
    Io(#[from] io::Error),
}

impl GuestError {
    /// Whether trying again can help (a read error may be transient).
    pub fn retryable(&self) -> bool {
        matches!(self, GuestError::Io(_))
    }
}
