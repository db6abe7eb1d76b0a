//! Wire constants and the pure (I/O-free) encoders and decoders of the NBD
//! protocol, written from `doc/proto.md` of the NBD project.
//!
//! Everything that interprets bytes sent by the server lives here as plain
//! functions over byte slices, so that it can be fuzzed (`fuzz/`,
//! target `nbd_reply_decode`) and unit-tested without a socket. Every length
//! read off the wire is checked against the request it answers or a fixed
//! cap before anything is allocated.

use std::collections::BTreeMap;

// ---- magics ----
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943; // "NBDMAGIC"
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054; // "IHAVEOPT"
pub const CLISERV_MAGIC: u64 = 0x0000_4202_8186_1253; // oldstyle
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;
pub const EXTENDED_REPLY_MAGIC: u32 = 0x6e8a_278c;

// ---- handshake flags ----
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

// ---- options ----
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;

// ---- option replies ----
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_FLAG_ERROR: u32 = 1 << 31;
pub const REP_ERR_UNSUP: u32 = REP_FLAG_ERROR | 1;
pub const REP_ERR_POLICY: u32 = REP_FLAG_ERROR | 2;
pub const REP_ERR_INVALID: u32 = REP_FLAG_ERROR | 3;
pub const REP_ERR_PLATFORM: u32 = REP_FLAG_ERROR | 4;
pub const REP_ERR_TLS_REQD: u32 = REP_FLAG_ERROR | 5;
pub const REP_ERR_UNKNOWN: u32 = REP_FLAG_ERROR | 6;
pub const REP_ERR_SHUTDOWN: u32 = REP_FLAG_ERROR | 7;
pub const REP_ERR_BLOCK_SIZE_REQD: u32 = REP_FLAG_ERROR | 8;
pub const REP_ERR_TOO_BIG: u32 = REP_FLAG_ERROR | 9;
pub const REP_ERR_EXT_HEADER_REQD: u32 = REP_FLAG_ERROR | 10;

// ---- NBD_INFO types ----
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// ---- transmission flags ----
pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const FLAG_READ_ONLY: u16 = 1 << 1;
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const FLAG_SEND_FUA: u16 = 1 << 3;
pub const FLAG_ROTATIONAL: u16 = 1 << 4;
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const FLAG_SEND_DF: u16 = 1 << 7;
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const FLAG_SEND_RESIZE: u16 = 1 << 9;
pub const FLAG_SEND_CACHE: u16 = 1 << 10;
pub const FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

// ---- commands ----
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

// ---- command flags ----
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

// ---- structured replies ----
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR_BIT: u16 = 1 << 15;
pub const REPLY_TYPE_ERROR: u16 = REPLY_TYPE_ERROR_BIT | 1;
pub const REPLY_TYPE_ERROR_OFFSET: u16 = REPLY_TYPE_ERROR_BIT | 2;

// ---- base:allocation ----
pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;
pub const META_BASE_ALLOCATION: &str = "base:allocation";

// ---- errno values ----
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

// ---- sizes and caps ----
/// Bytes of a request header.
pub const REQUEST_HEADER_LEN: usize = 28;
/// Bytes of a simple reply header.
pub const SIMPLE_HEADER_LEN: usize = 16;
/// Bytes of a structured reply chunk header.
pub const STRUCTURED_HEADER_LEN: usize = 20;
/// Bytes of an option reply header.
pub const OPT_REPLY_HEADER_LEN: usize = 20;
/// Largest READ/WRITE payload this client ever asks for (the spec's default
/// maximum payload, 2^25).
pub const MAX_PAYLOAD: u32 = 32 * 1024 * 1024;
/// Largest option reply payload accepted during the handshake.
pub const MAX_OPT_REPLY_PAYLOAD: u32 = 1024 * 1024;
/// Largest BLOCK_STATUS chunk accepted (the spec says servers SHOULD NOT
/// send more than 2^20 descriptors: 4 + 8 * 2^20 bytes).
pub const MAX_BLOCK_STATUS_PAYLOAD: u32 = 4 + 8 * (1 << 20);
/// Largest error chunk accepted (16-bit message length plus fixed fields).
pub const MAX_ERROR_PAYLOAD: u32 = 6 + 65535 + 8;

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

fn malformed(s: impl Into<String>) -> ProtoError {
    ProtoError::Malformed(s.into())
}

fn be16(b: &[u8], at: usize) -> u16 {
    let mut a = [0u8; 2];
    a.copy_from_slice(&b[at..at + 2]);
    u16::from_be_bytes(a)
}
fn be32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_be_bytes(a)
}
fn be64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

/// Name of an NBD errno value.
pub fn errno_name(e: u32) -> &'static str {
    match e {
        0 => "OK",
        EPERM => "EPERM",
        EIO => "EIO",
        ENOMEM => "ENOMEM",
        EINVAL => "EINVAL",
        ENOSPC => "ENOSPC",
        EOVERFLOW => "EOVERFLOW",
        ENOTSUP => "ENOTSUP",
        ESHUTDOWN => "ESHUTDOWN",
        _ => "unknown error",
    }
}

/// Name of a command.
pub fn cmd_name(c: u16) -> &'static str {
    match c {
        CMD_READ => "READ",
        CMD_WRITE => "WRITE",
        CMD_DISC => "DISC",
        CMD_FLUSH => "FLUSH",
        CMD_TRIM => "TRIM",
        CMD_CACHE => "CACHE",
        CMD_WRITE_ZEROES => "WRITE_ZEROES",
        CMD_BLOCK_STATUS => "BLOCK_STATUS",
        _ => "unknown command",
    }
}

/// Name of an option.
pub fn opt_name(o: u32) -> &'static str {
    match o {
        OPT_EXPORT_NAME => "NBD_OPT_EXPORT_NAME",
        OPT_ABORT => "NBD_OPT_ABORT",
        OPT_LIST => "NBD_OPT_LIST",
        OPT_STARTTLS => "NBD_OPT_STARTTLS",
        OPT_INFO => "NBD_OPT_INFO",
        OPT_GO => "NBD_OPT_GO",
        OPT_STRUCTURED_REPLY => "NBD_OPT_STRUCTURED_REPLY",
        OPT_LIST_META_CONTEXT => "NBD_OPT_LIST_META_CONTEXT",
        OPT_SET_META_CONTEXT => "NBD_OPT_SET_META_CONTEXT",
        _ => "unknown option",
    }
}

/// Name of an option reply type.
pub fn rep_name(r: u32) -> &'static str {
    match r {
        REP_ACK => "NBD_REP_ACK",
        REP_SERVER => "NBD_REP_SERVER",
        REP_INFO => "NBD_REP_INFO",
        REP_META_CONTEXT => "NBD_REP_META_CONTEXT",
        REP_ERR_UNSUP => "NBD_REP_ERR_UNSUP (option not supported)",
        REP_ERR_POLICY => "NBD_REP_ERR_POLICY (forbidden by server policy)",
        REP_ERR_INVALID => "NBD_REP_ERR_INVALID (invalid option)",
        REP_ERR_PLATFORM => "NBD_REP_ERR_PLATFORM (not supported on the server's platform)",
        REP_ERR_TLS_REQD => "NBD_REP_ERR_TLS_REQD (TLS required)",
        REP_ERR_UNKNOWN => "NBD_REP_ERR_UNKNOWN (export not available)",
        REP_ERR_SHUTDOWN => "NBD_REP_ERR_SHUTDOWN (server shutting down)",
        REP_ERR_BLOCK_SIZE_REQD => "NBD_REP_ERR_BLOCK_SIZE_REQD (block size negotiation required)",
        REP_ERR_TOO_BIG => "NBD_REP_ERR_TOO_BIG",
        REP_ERR_EXT_HEADER_REQD => "NBD_REP_ERR_EXT_HEADER_REQD (extended headers required)",
        r if r & REP_FLAG_ERROR != 0 => "unknown error reply",
        _ => "unknown reply",
    }
}

// ---------------------------------------------------------------------------
// Client -> server encoders
// ---------------------------------------------------------------------------

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

/// Encodes a handshake option with its data.
pub fn encode_option(option: u32, data: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(16 + data.len());
    b.extend_from_slice(&IHAVEOPT.to_be_bytes());
    b.extend_from_slice(&option.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    b
}

/// Data of `NBD_OPT_GO`/`NBD_OPT_INFO`: export name and information requests.
pub fn encode_go_data(export: &str, info_requests: &[u16]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&(export.len() as u32).to_be_bytes());
    b.extend_from_slice(export.as_bytes());
    b.extend_from_slice(&(info_requests.len() as u16).to_be_bytes());
    for i in info_requests {
        b.extend_from_slice(&i.to_be_bytes());
    }
    b
}

/// Data of `NBD_OPT_SET_META_CONTEXT`/`NBD_OPT_LIST_META_CONTEXT`.
pub fn encode_meta_context_data(export: &str, queries: &[&str]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&(export.len() as u32).to_be_bytes());
    b.extend_from_slice(export.as_bytes());
    b.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        b.extend_from_slice(&(q.len() as u32).to_be_bytes());
        b.extend_from_slice(q.as_bytes());
    }
    b
}

// ---------------------------------------------------------------------------
// Handshake decoders
// ---------------------------------------------------------------------------

/// What the server sends first in newstyle negotiation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Greeting {
    pub handshake_flags: u16,
}

/// Parses the first 18 bytes sent by the server.
pub fn parse_greeting(b: &[u8; 18]) -> Result<Greeting, ProtoError> {
    let m = be64(b, 0);
    if m != NBDMAGIC {
        return Err(ProtoError::BadMagic {
            what: "server greeting (not an NBD server?)",
            got: m,
        });
    }
    let m2 = be64(b, 8);
    if m2 == CLISERV_MAGIC {
        return Err(malformed(
            "server uses oldstyle negotiation, which this client does not support",
        ));
    }
    if m2 != IHAVEOPT {
        return Err(ProtoError::BadMagic {
            what: "server greeting",
            got: m2,
        });
    }
    Ok(Greeting {
        handshake_flags: be16(b, 16),
    })
}

/// Header of an option reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptReplyHeader {
    pub option: u32,
    pub reply: u32,
    pub len: u32,
}

/// Parses an option reply header; refuses payloads over [`MAX_OPT_REPLY_PAYLOAD`].
pub fn parse_opt_reply_header(
    b: &[u8; OPT_REPLY_HEADER_LEN],
) -> Result<OptReplyHeader, ProtoError> {
    let m = be64(b, 0);
    if m != OPT_REPLY_MAGIC {
        return Err(ProtoError::BadMagic {
            what: "option reply",
            got: m,
        });
    }
    let h = OptReplyHeader {
        option: be32(b, 8),
        reply: be32(b, 12),
        len: be32(b, 16),
    };
    if h.len > MAX_OPT_REPLY_PAYLOAD {
        return Err(ProtoError::TooLong {
            what: "option reply payload",
            len: h.len.into(),
            limit: MAX_OPT_REPLY_PAYLOAD.into(),
        });
    }
    Ok(h)
}

/// An `NBD_REP_INFO` item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Info {
    Export { size: u64, flags: u16 },
    Name(String),
    Description(String),
    BlockSize { min: u32, preferred: u32, max: u32 },
    Unknown(u16),
}

/// A decoded option reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OptReply {
    Ack,
    Server { name: String, details: String },
    Info(Info),
    MetaContext { id: u32, name: String },
    Error { reply: u32, message: String },
    Unknown { reply: u32 },
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Decodes an option reply payload (`payload.len()` must equal `h.len`).
pub fn parse_opt_reply(h: &OptReplyHeader, payload: &[u8]) -> Result<OptReply, ProtoError> {
    if payload.len() as u64 != u64::from(h.len) {
        return Err(malformed("option reply payload length mismatch"));
    }
    if h.reply & REP_FLAG_ERROR != 0 {
        return Ok(OptReply::Error {
            reply: h.reply,
            message: lossy(payload),
        });
    }
    match h.reply {
        REP_ACK => {
            if !payload.is_empty() {
                return Err(malformed("NBD_REP_ACK with a payload"));
            }
            Ok(OptReply::Ack)
        }
        REP_SERVER => {
            if payload.len() < 4 {
                return Err(malformed("NBD_REP_SERVER shorter than 4 bytes"));
            }
            let n = be32(payload, 0) as usize;
            if n > payload.len() - 4 {
                return Err(malformed("NBD_REP_SERVER name longer than the reply"));
            }
            Ok(OptReply::Server {
                name: lossy(&payload[4..4 + n]),
                details: lossy(&payload[4 + n..]),
            })
        }
        REP_INFO => {
            if payload.len() < 2 {
                return Err(malformed("NBD_REP_INFO shorter than 2 bytes"));
            }
            let t = be16(payload, 0);
            let rest = &payload[2..];
            let info = match t {
                INFO_EXPORT => {
                    if rest.len() != 10 {
                        return Err(malformed(format!(
                            "NBD_INFO_EXPORT of length {} (expected 12)",
                            payload.len()
                        )));
                    }
                    Info::Export {
                        size: be64(rest, 0),
                        flags: be16(rest, 8),
                    }
                }
                INFO_NAME => Info::Name(lossy(rest)),
                INFO_DESCRIPTION => Info::Description(lossy(rest)),
                INFO_BLOCK_SIZE => {
                    if rest.len() != 12 {
                        return Err(malformed(format!(
                            "NBD_INFO_BLOCK_SIZE of length {} (expected 14)",
                            payload.len()
                        )));
                    }
                    Info::BlockSize {
                        min: be32(rest, 0),
                        preferred: be32(rest, 4),
                        max: be32(rest, 8),
                    }
                }
                t => Info::Unknown(t),
            };
            Ok(OptReply::Info(info))
        }
        REP_META_CONTEXT => {
            if payload.len() < 4 {
                return Err(malformed("NBD_REP_META_CONTEXT shorter than 4 bytes"));
            }
            Ok(OptReply::MetaContext {
                id: be32(payload, 0),
                name: lossy(&payload[4..]),
            })
        }
        r => Ok(OptReply::Unknown { reply: r }),
    }
}

// ---------------------------------------------------------------------------
// Transmission-phase reply decoders
// ---------------------------------------------------------------------------

/// What the client remembers about a request in flight; needed to check the
/// reply against it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestInfo {
    pub cmd: u16,
    pub offset: u64,
    pub len: u32,
}

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
        REPLY_TYPE_BLOCK_STATUS => {
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
        k if k & REPLY_TYPE_ERROR_BIT != 0 => {
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
        k => Err(malformed(format!(
            "unknown structured reply chunk type {k}"
        ))),
    }
}

/// Tracks which bytes of a READ have been answered by content chunks, to
/// reject overlap and detect a reply that claims success without covering
/// the whole request.
#[derive(Clone, Debug)]
pub struct ReadCoverage {
    req_offset: u64,
    req_len: u64,
    /// start -> end of the ranges seen so far.
    ranges: BTreeMap<u64, u64>,
    covered: u64,
}

impl ReadCoverage {
    pub fn new(req: &RequestInfo) -> Self {
        ReadCoverage {
            req_offset: req.offset,
            req_len: req.len.into(),
            ranges: BTreeMap::new(),
            covered: 0,
        }
    }

    /// Records `[offset, offset+len)`; fails if outside the request or if it
    /// overlaps an earlier chunk.
    pub fn add(&mut self, offset: u64, len: u64) -> Result<(), ProtoError> {
        let req = RequestInfo {
            cmd: CMD_READ,
            offset: self.req_offset,
            len: self.req_len as u32,
        };
        check_in_request(offset, len, &req)?;
        if len == 0 {
            return Ok(());
        }
        let end = offset + len;
        if let Some((_, &pend)) = self.ranges.range(..=offset).next_back() {
            if pend > offset {
                return Err(ProtoError::Overlap { offset, len });
            }
        }
        if let Some((&nstart, _)) = self.ranges.range(offset..).next() {
            if nstart < end {
                return Err(ProtoError::Overlap { offset, len });
            }
        }
        self.ranges.insert(offset, end);
        self.covered += len;
        Ok(())
    }

    /// True once every byte of the request has been answered.
    pub fn complete(&self) -> bool {
        self.covered == self.req_len
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

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(flags: u16, kind: u16, cookie: u64, payload: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
        b.extend_from_slice(&flags.to_be_bytes());
        b.extend_from_slice(&kind.to_be_bytes());
        b.extend_from_slice(&cookie.to_be_bytes());
        b.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        b.extend_from_slice(payload);
        b
    }

    const READ: RequestInfo = RequestInfo {
        cmd: CMD_READ,
        offset: 4096,
        len: 1024,
    };

    fn lk(c: u64) -> Option<RequestInfo> {
        (c == 7).then_some(READ)
    }

    #[test]
    fn decodes_data_and_hole_chunks() {
        let mut p = 4096u64.to_be_bytes().to_vec();
        p.extend_from_slice(&[1u8; 512]);
        let b = chunk(0, REPLY_TYPE_OFFSET_DATA, 7, &p);
        let (d, n) = decode_reply(&b, true, &lk).unwrap().unwrap();
        assert_eq!(n, b.len());
        match d {
            Decoded::Chunk {
                chunk: Chunk::OffsetData { offset, data },
                ..
            } => {
                assert_eq!(offset, 4096);
                assert_eq!(data.len(), 512);
            }
            d => panic!("{d:?}"),
        }
        let mut p = 4608u64.to_be_bytes().to_vec();
        p.extend_from_slice(&512u32.to_be_bytes());
        let b = chunk(REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_HOLE, 7, &p);
        assert!(matches!(
            decode_reply(&b, true, &lk).unwrap().unwrap().0,
            Decoded::Chunk {
                chunk: Chunk::OffsetHole {
                    offset: 4608,
                    len: 512
                },
                ..
            }
        ));
        // partial input
        assert_eq!(decode_reply(&b[..b.len() - 1], true, &lk).unwrap(), None);
    }

    #[test]
    fn rejects_bad_replies() {
        // unknown cookie
        let b = chunk(REPLY_FLAG_DONE, REPLY_TYPE_NONE, 8, &[]);
        assert_eq!(
            decode_reply(&b, true, &lk).unwrap_err(),
            ProtoError::UnknownCookie(8)
        );
        // wrong magic
        let mut w = b.clone();
        w[0] = 0;
        assert!(matches!(
            decode_reply(&w, true, &lk),
            Err(ProtoError::BadMagic { .. })
        ));
        // data chunk beyond request
        let mut p = 5000u64.to_be_bytes().to_vec();
        p.extend_from_slice(&[0u8; 200]);
        let b = chunk(0, REPLY_TYPE_OFFSET_DATA, 7, &p);
        assert!(matches!(
            decode_reply(&b, true, &lk),
            Err(ProtoError::OutOfBounds { .. })
        ));
        // data chunk longer than the request: refused from the header alone
        let mut h = chunk(0, REPLY_TYPE_OFFSET_DATA, 7, &[]);
        h[16..20].copy_from_slice(&(u32::MAX).to_be_bytes());
        assert!(matches!(
            decode_reply(&h, true, &lk),
            Err(ProtoError::TooLong { .. })
        ));
        // structured reply without negotiation
        let b = chunk(REPLY_FLAG_DONE, REPLY_TYPE_NONE, 7, &[]);
        assert!(decode_reply(&b, false, &lk).is_err());
        // NONE without DONE
        let b = chunk(0, REPLY_TYPE_NONE, 7, &[]);
        assert!(decode_reply(&b, true, &lk).is_err());
        // block status chunk to a READ
        let b = chunk(REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, 7, &[0; 12]);
        assert!(decode_reply(&b, true, &lk).is_err());
        // error message overrunning the chunk
        let mut p = EIO.to_be_bytes().to_vec();
        p.extend_from_slice(&100u16.to_be_bytes());
        p.extend_from_slice(b"short");
        let b = chunk(REPLY_FLAG_DONE, REPLY_TYPE_ERROR, 7, &p);
        assert!(decode_reply(&b, true, &lk).is_err());
    }

    #[test]
    fn decodes_errors() {
        let mut p = EIO.to_be_bytes().to_vec();
        p.extend_from_slice(&4u16.to_be_bytes());
        p.extend_from_slice(b"oops");
        p.extend_from_slice(&4100u64.to_be_bytes());
        let b = chunk(REPLY_FLAG_DONE, REPLY_TYPE_ERROR_OFFSET, 7, &p);
        match decode_reply(&b, true, &lk).unwrap().unwrap().0 {
            Decoded::Chunk {
                chunk:
                    Chunk::Error {
                        errno,
                        message,
                        offset,
                        ..
                    },
                ..
            } => {
                assert_eq!(errno, EIO);
                assert_eq!(message, "oops");
                assert_eq!(offset, Some(4100));
            }
            d => panic!("{d:?}"),
        }
        // simple reply error to READ: no payload follows
        let mut s = SIMPLE_REPLY_MAGIC.to_be_bytes().to_vec();
        s.extend_from_slice(&EINVAL.to_be_bytes());
        s.extend_from_slice(&7u64.to_be_bytes());
        let (d, n) = decode_reply(&s, true, &lk).unwrap().unwrap();
        assert_eq!(n, 16);
        assert!(matches!(d, Decoded::Simple { error: EINVAL, .. }));
        // simple successful READ without structured replies: data follows
        let mut s = SIMPLE_REPLY_MAGIC.to_be_bytes().to_vec();
        s.extend_from_slice(&0u32.to_be_bytes());
        s.extend_from_slice(&7u64.to_be_bytes());
        assert_eq!(decode_reply(&s, false, &lk).unwrap(), None);
        s.extend_from_slice(&[9u8; 1024]);
        let (d, n) = decode_reply(&s, false, &lk).unwrap().unwrap();
        assert_eq!(n, 16 + 1024);
        assert!(matches!(d, Decoded::Simple { data, .. } if data.len() == 1024));
    }

    #[test]
    fn coverage_detects_overlap_and_gaps() {
        let mut c = ReadCoverage::new(&READ);
        c.add(4096, 100).unwrap();
        c.add(4196 + 100, 100).unwrap();
        assert!(c.add(4150, 10).is_err());
        assert!(c.add(4196 + 50, 60).is_err());
        assert!(c.add(4000, 10).is_err());
        assert!(!c.complete());
        c.add(4196, 100).unwrap();
        c.add(4396, 1024 - 300).unwrap();
        assert!(c.complete());
    }

    #[test]
    fn option_replies() {
        let mut h = [0u8; 20];
        h[0..8].copy_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
        h[8..12].copy_from_slice(&OPT_GO.to_be_bytes());
        h[12..16].copy_from_slice(&REP_INFO.to_be_bytes());
        h[16..20].copy_from_slice(&12u32.to_be_bytes());
        let hdr = parse_opt_reply_header(&h).unwrap();
        let mut p = INFO_EXPORT.to_be_bytes().to_vec();
        p.extend_from_slice(&(1u64 << 30).to_be_bytes());
        p.extend_from_slice(&(FLAG_HAS_FLAGS | FLAG_READ_ONLY).to_be_bytes());
        assert_eq!(
            parse_opt_reply(&hdr, &p).unwrap(),
            OptReply::Info(Info::Export {
                size: 1 << 30,
                flags: 3
            })
        );
        h[16..20].copy_from_slice(&(MAX_OPT_REPLY_PAYLOAD + 1).to_be_bytes());
        assert!(parse_opt_reply_header(&h).is_err());
    }

    #[test]
    fn block_status_descriptors() {
        let req = RequestInfo {
            cmd: CMD_BLOCK_STATUS,
            offset: 0,
            len: 1 << 20,
        };
        let mut p = 1u32.to_be_bytes().to_vec();
        for (l, f) in [(65536u32, 0u32), (1 << 20, 3)] {
            p.extend_from_slice(&l.to_be_bytes());
            p.extend_from_slice(&f.to_be_bytes());
        }
        // the last extent may run past the request
        match parse_chunk_payload(REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, &p, &req).unwrap() {
            Chunk::BlockStatus {
                context,
                descriptors,
            } => {
                assert_eq!(context, 1);
                assert_eq!(descriptors, vec![(65536, 0), (1 << 20, 3)]);
            }
            c => panic!("{c:?}"),
        }
        // but not a middle one
        let mut p2 = 1u32.to_be_bytes().to_vec();
        for (l, f) in [(1u32 << 20, 0u32), (4096, 3)] {
            p2.extend_from_slice(&l.to_be_bytes());
            p2.extend_from_slice(&f.to_be_bytes());
        }
        assert!(parse_chunk_payload(REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, &p2, &req).is_err());
    }

    mod prop {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(proptest::test_runner::Config { failure_persistence: None, ..proptest::test_runner::Config::default() })]
            #[test]
            fn decode_never_panics(buf in proptest::collection::vec(any::<u8>(), 0..256),
                                   structured in any::<bool>(),
                                   cmd in 0u16..8, off in any::<u64>(), len in any::<u32>()) {
                let req = RequestInfo { cmd, offset: off, len };
                let lk = |_c: u64| Some(req);
                let mut rest: &[u8] = &buf;
                while let Ok(Some((_, n))) = decode_reply(rest, structured, &lk) {
                    prop_assert!(n > 0 && n <= rest.len());
                    rest = &rest[n..];
                }
            }
        }
    }
}
