//! Structured reply chunks: the length cap of each chunk type, bounds checks
//! against the request, and the decoder of chunk payloads.

use super::consts::*;
use super::error::{malformed, ProtoError};
use super::names::cmd_name;
use super::request::RequestInfo;
use super::wire::{be16, be32, be64, lossy};

/// Largest payload acceptable for a chunk of `kind` answering `req`, or an
/// error when that chunk type cannot answer that command at all.
pub fn max_chunk_payload(kind: u16, req: &RequestInfo) -> Result<u32, ProtoError> {
    match kind {
        REPLY_TYPE_NONE => Ok(0),
        REPLY_TYPE_OFFSET_DATA if req.cmd == CMD_READ => Ok(req.len.saturating_add(8)),
        REPLY_TYPE_OFFSET_HOLE if req.cmd == CMD_READ => Ok(12),
        REPLY_TYPE_BLOCK_STATUS if req.cmd == CMD_BLOCK_STATUS => Ok(MAX_BLOCK_STATUS_PAYLOAD),
        k if k & REPLY_TYPE_ERROR_BIT != 0 => Ok(MAX_ERROR_PAYLOAD),
        k => Err(malformed(format!(
            "structured reply chunk type {k} is not valid for {}",
            cmd_name(req.cmd)
        ))),
    }
}

/// Checks the length of a chunk against what the chunk type and request allow.
pub fn check_chunk_len(kind: u16, len: u32, req: &RequestInfo) -> Result<(), ProtoError> {
    let max = max_chunk_payload(kind, req)?;
    if len > max {
        return Err(ProtoError::TooLong {
            what: "structured reply chunk",
            len: len.into(),
            limit: max.into(),
        });
    }
    Ok(())
}

/// Checks that `[offset, offset+len)` lies inside the request.
pub fn check_in_request(offset: u64, len: u64, req: &RequestInfo) -> Result<(), ProtoError> {
    let end = offset.checked_add(len);
    let req_end = req.offset.saturating_add(req.len.into());
    match end {
        Some(end) if offset >= req.offset && end <= req_end => Ok(()),
        _ => Err(ProtoError::OutOfBounds {
            offset,
            len,
            req_offset: req.offset,
            req_len: req.len.into(),
        }),
    }
}

/// A decoded structured reply chunk payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Chunk<'a> {
    None,
    OffsetData {
        offset: u64,
        data: &'a [u8],
    },
    OffsetHole {
        offset: u64,
        len: u32,
    },
    /// Descriptors as (length, status flags).
    BlockStatus {
        context: u32,
        descriptors: Vec<(u32, u32)>,
    },
    /// An error chunk (any type with bit 15 set).
    Error {
        kind: u16,
        errno: u32,
        message: String,
        offset: Option<u64>,
    },
}

/// Decodes a chunk payload of `kind` answering `req`. Validates lengths and
/// bounds against the request. `payload.len()` is the header's length.
pub fn parse_chunk_payload<'a>(
    flags: u16,
    kind: u16,
    payload: &'a [u8],
    req: &RequestInfo,
) -> Result<Chunk<'a>, ProtoError> {
    let len = u32::try_from(payload.len()).map_err(|_| malformed("chunk too long"))?;
    check_chunk_len(kind, len, req)?;
    match kind {
        REPLY_TYPE_NONE => {
            if flags & REPLY_FLAG_DONE == 0 {
                return Err(malformed("NBD_REPLY_TYPE_NONE without NBD_REPLY_FLAG_DONE"));
            }
            Ok(Chunk::None)
        }
        REPLY_TYPE_OFFSET_DATA => {
            if payload.len() < 9 {
                return Err(malformed("NBD_REPLY_TYPE_OFFSET_DATA shorter than 9 bytes"));
            }
            let offset = be64(payload, 0);
            let data = &payload[8..];
            check_in_request(offset, data.len() as u64, req)?;
            Ok(Chunk::OffsetData { offset, data })
        }
        REPLY_TYPE_OFFSET_HOLE => {
            if payload.len() != 12 {
                return Err(malformed("NBD_REPLY_TYPE_OFFSET_HOLE not 12 bytes"));
            }
            let offset = be64(payload, 0);
            let hole = be32(payload, 8);
            if hole == 0 {
                return Err(malformed("NBD_REPLY_TYPE_OFFSET_HOLE of size 0"));
            }
            check_in_request(offset, hole.into(), req)?;
            Ok(Chunk::OffsetHole { offset, len: hole })
        }
        REPLY_TYPE_BLOCK_STATUS => parse_block_status(payload, req),
        k if k & REPLY_TYPE_ERROR_BIT != 0 => parse_error_chunk(k, payload, req),
        k => Err(malformed(format!(
            "unknown structured reply chunk type {k}"
        ))),
    }
}

/// Payload of `NBD_REPLY_TYPE_BLOCK_STATUS`: a context id and (length,
/// flags) descriptors; all but the last must end inside the request.
fn parse_block_status<'a>(payload: &[u8], req: &RequestInfo) -> Result<Chunk<'a>, ProtoError> {
    if payload.len() < 12 || (payload.len() - 4) & 7 != 0 {
        return Err(malformed(format!(
            "NBD_REPLY_TYPE_BLOCK_STATUS of bad length {}",
            payload.len()
        )));
    }
    let context = be32(payload, 0);
    let mut descriptors = Vec::with_capacity((payload.len() - 4) / 8);
    let mut sum: u64 = 0;
    let n = (payload.len() - 4) / 8;
    for (i, d) in payload[4..].chunks_exact(8).enumerate() {
        let l = be32(d, 0);
        if l == 0 {
            return Err(malformed("block status descriptor of length 0"));
        }
        // All but the last descriptor must end inside the request.
        if i + 1 < n && sum + u64::from(l) >= u64::from(req.len) {
            return Err(malformed("block status descriptors exceed the request"));
        }
        sum += u64::from(l);
        descriptors.push((l, be32(d, 4)));
    }
    Ok(Chunk::BlockStatus {
        context,
        descriptors,
    })
}

/// Payload of an error chunk (`k`: any type with bit 15 set): errno,
/// message, and for `NBD_REPLY_TYPE_ERROR_OFFSET` an offset in the request.
fn parse_error_chunk<'a>(
    k: u16,
    payload: &[u8],
    req: &RequestInfo,
) -> Result<Chunk<'a>, ProtoError> {
    if payload.len() < 6 {
        return Err(malformed("error chunk shorter than 6 bytes"));
    }
    let errno = be32(payload, 0);
    let mlen = usize::from(be16(payload, 4));
    if mlen > payload.len() - 6 {
        return Err(malformed("error chunk message longer than the chunk"));
    }
    let message = lossy(&payload[6..6 + mlen]);
    let tail = &payload[6 + mlen..];
    let offset = if k == REPLY_TYPE_ERROR_OFFSET {
        if tail.len() != 8 {
            return Err(malformed(
                "NBD_REPLY_TYPE_ERROR_OFFSET without an 8-byte offset",
            ));
        }
        let o = be64(tail, 0);
        check_in_request(o, 0, req)?;
        Some(o)
    } else {
        None
    };
    if errno == 0 {
        return Err(malformed("error chunk with error value 0"));
    }
    Ok(Chunk::Error {
        kind: k,
        errno,
        message,
        offset,
    })
}
