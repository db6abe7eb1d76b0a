//! What the receiver is told about a block: [`Packed`] and its one-byte
//! wire id, the stream ids [`WIRE_STREAM`] / [`WIRE_STREAM_START`], and
//! the stream window [`STREAM_WINDOW_LOG`] both ends agree on.
//!
//! These values are the wire format: changing any of them breaks peers.
//! This module must not encode or decode bytes itself.

use crate::codec::Codec;

/// How one block was packed by [`Compressor::compress`].
///
/// [`Compressor::compress`]: crate::Compressor::compress
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packed {
    /// The codec (and level) used; [`Codec::None`]: stored raw.
    pub codec: Codec,
    /// `Some(start)` for a block of the compressor's zstd stream; `start`
    /// is true for the first block of a (new) stream.
    pub stream: Option<bool>,
}

impl Packed {
    /// One-byte id on the wire: [`Codec::id`] for independent blocks,
    /// [`WIRE_STREAM`] / [`WIRE_STREAM_START`] for stream blocks.
    pub fn wire_id(self) -> u8 {
        match self.stream {
            None => self.codec.id(),
            Some(false) => WIRE_STREAM,
            Some(true) => WIRE_STREAM_START,
        }
    }
}

/// Wire id of a zstd stream block that continues the stream.
pub const WIRE_STREAM: u8 = 3;
/// Wire id of the first block of a zstd stream (the decoder starts afresh).
pub const WIRE_STREAM_START: u8 = 4;
/// log2 of a stream's window: blocks may refer up to 8 MiB back. The
/// decoder refuses streams that need more.
pub const STREAM_WINDOW_LOG: u32 = 23;
