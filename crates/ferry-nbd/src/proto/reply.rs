//! Transmission-phase reply messages: reply headers (simple or structured),
//! the payload length of a simple reply, and [`decode_reply`], which decodes
//! one whole message from a byte slice (the fuzzed entry point).

use super::chunk::{check_chunk_len, parse_chunk_payload, Chunk};
use super::consts::*;
use super::error::{malformed, ProtoError};
use super::request::RequestInfo;
use super::wire::{be16, be32, be64};

/// A reply header (simple reply or structured chunk header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyHeader {
    Simple {
        cookie: u64,
        error: u32,
    },
    Chunk {
        cookie: u64,
        flags: u16,
        kind: u16,
        len: u32,
    },
}

impl ReplyHeader {
    pub fn cookie(&self) -> u64 {
        match *self {
            ReplyHeader::Simple { cookie, .. } | ReplyHeader::Chunk { cookie, .. } => cookie,
        }
    }
}

/// Length of the whole reply header given its first four bytes (the magic).
pub fn reply_header_len(magic: [u8; 4], structured: bool) -> Result<usize, ProtoError> {
    match u32::from_be_bytes(magic) {
        SIMPLE_REPLY_MAGIC => Ok(SIMPLE_HEADER_LEN),
        STRUCTURED_REPLY_MAGIC if structured => Ok(STRUCTURED_HEADER_LEN),
        STRUCTURED_REPLY_MAGIC => Err(malformed(
            "structured reply although structured replies were not negotiated",
        )),
        EXTENDED_REPLY_MAGIC => Err(malformed(
            "extended reply header although extended headers were not negotiated",
        )),
        m => Err(ProtoError::BadMagic {
            what: "reply",
            got: m.into(),
        }),
    }
}

/// Parses a complete reply header (16 or 20 bytes, magic included).
pub fn parse_reply_header(b: &[u8], structured: bool) -> Result<ReplyHeader, ProtoError> {
    if b.len() < 4 {
        return Err(malformed("short reply header"));
    }
    let want = reply_header_len([b[0], b[1], b[2], b[3]], structured)?;
    if b.len() != want {
        return Err(malformed("reply header length mismatch"));
    }
    if want == SIMPLE_HEADER_LEN {
        Ok(ReplyHeader::Simple {
            error: be32(b, 4),
            cookie: be64(b, 8),
        })
    } else {
        Ok(ReplyHeader::Chunk {
            flags: be16(b, 4),
            kind: be16(b, 6),
            cookie: be64(b, 8),
            len: be32(b, 16),
        })
    }
}

/// One decoded reply message from a byte slice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// A simple reply; `data` is the READ payload (empty otherwise).
    Simple {
        cookie: u64,
        error: u32,
        data: &'a [u8],
    },
    /// A structured reply chunk.
    Chunk {
        cookie: u64,
        flags: u16,
        chunk: Chunk<'a>,
    },
}

/// Decodes one reply message at the start of `buf`.
///
/// `lookup` maps a cookie to the request it answers (`None`: unknown cookie,
/// an error). Returns `Ok(None)` if `buf` holds only part of a message, else
/// the message and the number of bytes it used. This is the function the
/// fuzz target drives; the socket reader uses the same header and payload
/// parsers piecewise.
pub fn decode_reply<'a>(
    buf: &'a [u8],
    structured: bool,
    lookup: &dyn Fn(u64) -> Option<RequestInfo>,
) -> Result<Option<(Decoded<'a>, usize)>, ProtoError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let hlen = reply_header_len([buf[0], buf[1], buf[2], buf[3]], structured)?;
    if buf.len() < hlen {
        return Ok(None);
    }
    let header = parse_reply_header(&buf[..hlen], structured)?;
    let cookie = header.cookie();
    let req = lookup(cookie).ok_or(ProtoError::UnknownCookie(cookie))?;
    match header {
        ReplyHeader::Simple { cookie, error } => {
            let dlen = simple_reply_data_len(error, structured, &req)?;
            let end = hlen + dlen as usize;
            if buf.len() < end {
                return Ok(None);
            }
            Ok(Some((
                Decoded::Simple {
                    cookie,
                    error,
                    data: &buf[hlen..end],
                },
                end,
            )))
        }
        ReplyHeader::Chunk {
            cookie,
            flags,
            kind,
            len,
        } => {
            check_chunk_len(kind, len, &req)?;
            let end = hlen + len as usize;
            if buf.len() < end {
                return Ok(None);
            }
            let chunk = parse_chunk_payload(flags, kind, &buf[hlen..end], &req)?;
            Ok(Some((
                Decoded::Chunk {
                    cookie,
                    flags,
                    chunk,
                },
                end,
            )))
        }
    }
}

/// Number of payload bytes following a simple reply to `req`.
pub fn simple_reply_data_len(
    error: u32,
    structured: bool,
    req: &RequestInfo,
) -> Result<u32, ProtoError> {
    match req.cmd {
        CMD_READ if error == 0 => {
            if structured {
                Err(malformed(
                    "simple reply with data to READ although structured replies were negotiated",
                ))
            } else {
                Ok(req.len)
            }
        }
        CMD_BLOCK_STATUS if error == 0 => Err(malformed(
            "successful simple reply to BLOCK_STATUS (a structured reply is required)",
        )),
        _ => Ok(0),
    }
}
