//! [`ProtoError`]: a protocol violation found in bytes the server sent.

/// A protocol violation detected in bytes sent by the server.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    #[error("bad magic {got:#x} in {what}")]
    BadMagic { what: &'static str, got: u64 },
    #[error("reply for unknown cookie {0:#x}")]
    UnknownCookie(u64),
    #[error("{0}")]
    Malformed(String),
    #[error("{what}: length {len} exceeds the limit {limit}")]
    TooLong {
        what: &'static str,
        len: u64,
        limit: u64,
    },
    #[error("chunk [{offset}, +{len}) lies outside the request [{req_offset}, +{req_len})")]
    OutOfBounds {
        offset: u64,
        len: u64,
        req_offset: u64,
        req_len: u64,
    },
    #[error("chunk [{offset}, +{len}) overlaps an earlier chunk of the same reply")]
    Overlap { offset: u64, len: u64 },
}

pub(super) fn malformed(s: impl Into<String>) -> ProtoError {
    ProtoError::Malformed(s.into())
}
