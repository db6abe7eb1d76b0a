//! Option haggling (the handshake): encoders of the options the client
//! sends, and decoders of the greeting and of option replies.

use super::consts::*;
use super::error::{malformed, ProtoError};
use super::wire::{be16, be32, be64, lossy};

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
        REP_INFO => Ok(OptReply::Info(parse_info(payload)?)),
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

/// Payload of `NBD_REP_INFO`: a 16-bit information type and its data.
fn parse_info(payload: &[u8]) -> Result<Info, ProtoError> {
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
    Ok(info)
}
