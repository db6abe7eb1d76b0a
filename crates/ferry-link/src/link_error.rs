//! [`LinkError`]: why a link stopped working, and whether a new
//! connection could go past it.

use crate::codec::DecodeError;
use crate::MAGIC;

/// Why a link stopped working.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum LinkError {
    #[error("connection closed by peer")]
    Closed,
    #[error("connection error: {0}")]
    Io(String),
    #[error("protocol error: {0}")]
    Decode(#[from] DecodeError),
    #[error("protocol error: frame of {0} bytes exceeds the limit")]
    FrameTooLarge(u64),
    #[error("peer is not speaking the ferry protocol (it sent {0:?})")]
    BadMagic(String),
    #[error("peer is a ferry of another protocol version (its framing is version {0}, this ferry's {this}): install the same ferry on both sides", this = MAGIC[6])]
    Version(u8),
    #[error("protocol error: corrupt compressed block: {0}")]
    Corrupt(String),
    #[error(
        "protocol error: a frame failed its checksum (the byte stream was corrupted in transit)"
    )]
    Checksum,
    #[error("connection timed out: the peer sent or took nothing for {0} s (--timeout)")]
    TimedOut(u64),
}

impl LinkError {
    /// Whether a new connection could go past this: the link dropped, timed
    /// out, or a frame was damaged in transit. A peer that speaks garbage,
    /// another version or a bad compressed block would do it again.
    pub fn retryable(&self) -> bool {
        match self {
            LinkError::Closed | LinkError::Io(_) | LinkError::TimedOut(_) => true,
            LinkError::Checksum => true,
            LinkError::Decode(_)
            | LinkError::FrameTooLarge(_)
            | LinkError::BadMagic(_)
            | LinkError::Version(_)
            | LinkError::Corrupt(_) => false,
        }
    }
}
