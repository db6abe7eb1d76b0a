//! [`DecompressError`]: why a block from a peer was refused, shared by
//! the independent-block decoder and the stream decoder.
//!
//! Only the error type lives here; it must not grow decoding logic.

/// Why a block could not be decompressed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum DecompressError {
    #[error("block declares {0} bytes, more than the limit of {1}")]
    TooLarge(usize, usize),
    #[error("corrupt {codec} block: {msg}")]
    Corrupt { codec: &'static str, msg: String },
    #[error("block decompressed to {got} bytes, expected {want}")]
    WrongSize { got: usize, want: usize },
}
