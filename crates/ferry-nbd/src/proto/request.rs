//! Transmission-phase requests: the request header encoder and
//! [`RequestInfo`], what the client remembers about a request in flight to
//! check the reply against it.

use super::consts::{REQUEST_HEADER_LEN, REQUEST_MAGIC};

/// Encodes a transmission-phase request header.
pub fn encode_request(flags: u16, cmd: u16, cookie: u64, offset: u64, len: u32) -> [u8; 28] {
    let mut b = [0u8; REQUEST_HEADER_LEN];
    b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&cmd.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b[16..24].copy_from_slice(&offset.to_be_bytes());
    b[24..28].copy_from_slice(&len.to_be_bytes());
    b
}

/// What the client remembers about a request in flight; needed to check the
/// reply against it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestInfo {
    pub cmd: u16,
    pub offset: u64,
    pub len: u32,
}
