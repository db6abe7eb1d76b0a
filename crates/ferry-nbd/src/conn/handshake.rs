//! The fixed-newstyle handshake: greeting, `NBD_OPT_STRUCTURED_REPLY`,
//! `NBD_OPT_SET_META_CONTEXT` (`base:allocation`), then `NBD_OPT_GO` (or
//! `NBD_OPT_EXPORT_NAME` for servers without it), yielding [`ExportInfo`].

use std::io::{self, Read, Write};

use super::info::{ConnectOptions, ExportInfo};
use super::socket::Sock;
use crate::error::{Error, Result};
use crate::proto::*;

fn hs_read(s: &mut Sock, buf: &mut [u8], what: &str) -> Result<()> {
    s.read_exact(buf).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            Error::Handshake(format!("server closed the connection while sending {what}"))
        } else {
            Error::io(format!("NBD handshake: reading {what}"), e)
        }
    })
}

fn hs_write(s: &mut Sock, b: &[u8], what: &str) -> Result<()> {
    s.write_all(b)
        .map_err(|e| Error::io(format!("NBD handshake: sending {what}"), e))
}

fn read_opt_reply(s: &mut Sock, expect_opt: u32) -> Result<OptReply> {
    let mut h = [0u8; OPT_REPLY_HEADER_LEN];
    hs_read(s, &mut h, "option reply header")?;
    let hdr = parse_opt_reply_header(&h)?;
    if hdr.option != expect_opt {
        return Err(ProtoError::Malformed(format!(
            "reply to option {} while {} was sent",
            hdr.option,
            opt_name(expect_opt)
        ))
        .into());
    }
    let mut p = vec![0u8; hdr.len as usize];
    hs_read(s, &mut p, "option reply payload")?;
    Ok(parse_opt_reply(&hdr, &p)?)
}

fn refused(option: u32, export: &str, reply: u32, message: String) -> Error {
    match reply {
        REP_ERR_UNKNOWN => Error::ExportNotFound {
            export: export.to_string(),
            message,
        },
        REP_ERR_TLS_REQD => Error::TlsRequired {
            export: export.to_string(),
        },
        _ => Error::OptionRefused {
            option: opt_name(option),
            export: export.to_string(),
            reply: rep_name(reply),
            message,
        },
    }
}

/// Runs the whole handshake for `export` on a freshly opened socket.
pub(super) fn handshake(s: &mut Sock, export: &str, opts: &ConnectOptions) -> Result<ExportInfo> {
    if export.len() > 4096 {
        return Err(Error::InvalidArgument(
            "export name longer than 4096 bytes".into(),
        ));
    }
    let no_zeroes = greet(s)?;

    let mut info = ExportInfo {
        export: export.to_string(),
        size: 0,
        flags: 0,
        structured: false,
        base_allocation: None,
        block_size: None,
        description: None,
    };

    if opts.structured_replies {
        info.structured = negotiate_structured_replies(s, export)?;
    }

    if info.structured && opts.block_status {
        info.base_allocation = negotiate_base_allocation(s, export)?;
    }

    go(s, export, info, no_zeroes)
}

/// Reads the server's greeting and answers with the client flags; returns
/// whether both sides dropped the 124 zero bytes after the export info.
fn greet(s: &mut Sock) -> Result<bool> {
    let mut g = [0u8; 18];
    hs_read(s, &mut g, "greeting")?;
    let greeting = parse_greeting(&g)?;
    if greeting.handshake_flags & FLAG_FIXED_NEWSTYLE == 0 {
        return Err(Error::Handshake(
            "server does not support fixed newstyle negotiation".into(),
        ));
    }
    let no_zeroes = greeting.handshake_flags & FLAG_NO_ZEROES != 0;
    let mut cflags = FLAG_C_FIXED_NEWSTYLE;
    if no_zeroes {
        cflags |= FLAG_C_NO_ZEROES;
    }
    hs_write(s, &cflags.to_be_bytes(), "client flags")?;
    Ok(no_zeroes)
}

/// `NBD_OPT_STRUCTURED_REPLY`; returns whether the server agreed. A refusal
/// is not fatal unless the server requires TLS.
fn negotiate_structured_replies(s: &mut Sock, export: &str) -> Result<bool> {
    hs_write(
        s,
        &encode_option(OPT_STRUCTURED_REPLY, &[]),
        "NBD_OPT_STRUCTURED_REPLY",
    )?;
    match read_opt_reply(s, OPT_STRUCTURED_REPLY)? {
        OptReply::Ack => Ok(true),
        OptReply::Error { reply, message } => {
            if reply == REP_ERR_TLS_REQD {
                return Err(refused(OPT_STRUCTURED_REPLY, export, reply, message));
            }
            Ok(false)
        }
        other => Err(ProtoError::Malformed(format!(
            "unexpected reply {other:?} to NBD_OPT_STRUCTURED_REPLY"
        ))
        .into()),
    }
}

/// `NBD_OPT_SET_META_CONTEXT` for `base:allocation`; returns the context id
/// if the server selected it (`None`: no block status, all data).
fn negotiate_base_allocation(s: &mut Sock, export: &str) -> Result<Option<u32>> {
    let data = encode_meta_context_data(export, &[META_BASE_ALLOCATION]);
    hs_write(
        s,
        &encode_option(OPT_SET_META_CONTEXT, &data),
        "NBD_OPT_SET_META_CONTEXT",
    )?;
    let mut id = None;
    // A bounded number of replies: one per selected context then ACK.
    for _ in 0..1024 {
        match read_opt_reply(s, OPT_SET_META_CONTEXT)? {
            OptReply::MetaContext { id: i, name } => {
                if name == META_BASE_ALLOCATION {
                    id = Some(i);
                }
            }
            OptReply::Ack => return Ok(id),
            OptReply::Error { reply, message } => {
                if reply == REP_ERR_UNKNOWN || reply == REP_ERR_TLS_REQD {
                    return Err(refused(OPT_SET_META_CONTEXT, export, reply, message));
                }
                // No block status; fall back to "all data".
                return Ok(None);
            }
            other => {
                return Err(ProtoError::Malformed(format!(
                    "unexpected reply {other:?} to NBD_OPT_SET_META_CONTEXT"
                ))
                .into())
            }
        }
    }
    Ok(None)
}

/// `NBD_OPT_GO`, ending the handshake: fills in size, flags and what else
/// the server volunteers; falls back to `NBD_OPT_EXPORT_NAME` if the
/// server does not know `NBD_OPT_GO`.
fn go(s: &mut Sock, export: &str, mut info: ExportInfo, no_zeroes: bool) -> Result<ExportInfo> {
    // NBD_OPT_GO. We do not request NBD_INFO_BLOCK_SIZE (which would bind us
    // to the server's minimum block size for every request) but honour the
    // maximum payload if the server volunteers it.
    let data = encode_go_data(export, &[]);
    hs_write(s, &encode_option(OPT_GO, &data), "NBD_OPT_GO")?;
    let mut got_export = false;
    for _ in 0..1024 {
        match read_opt_reply(s, OPT_GO)? {
            OptReply::Info(Info::Export { size, flags }) => {
                info.size = size;
                info.flags = flags;
                got_export = true;
            }
            OptReply::Info(Info::BlockSize {
                min,
                preferred,
                max,
            }) => {
                info.block_size = Some((min, preferred, max));
            }
            OptReply::Info(Info::Description(d)) => info.description = Some(d),
            OptReply::Info(_) => {}
            OptReply::Ack => {
                if !got_export {
                    return Err(ProtoError::Malformed(
                        "NBD_OPT_GO succeeded without NBD_INFO_EXPORT".into(),
                    )
                    .into());
                }
                return Ok(info);
            }
            OptReply::Error { reply, .. } if reply == REP_ERR_UNSUP => {
                return export_name_fallback(s, info, no_zeroes);
            }
            OptReply::Error { reply, message } => {
                return Err(refused(OPT_GO, export, reply, message));
            }
            other => {
                return Err(ProtoError::Malformed(format!(
                    "unexpected reply {other:?} to NBD_OPT_GO"
                ))
                .into())
            }
        }
    }
    Err(ProtoError::Malformed("too many replies to NBD_OPT_GO".into()).into())
}

fn export_name_fallback(s: &mut Sock, mut info: ExportInfo, no_zeroes: bool) -> Result<ExportInfo> {
    let export = info.export.clone();
    hs_write(
        s,
        &encode_option(OPT_EXPORT_NAME, export.as_bytes()),
        "NBD_OPT_EXPORT_NAME",
    )?;
    let mut b = [0u8; 10 + 124];
    let n = if no_zeroes { 10 } else { 134 };
    s.read_exact(&mut b[..n]).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            // The only way a server can refuse NBD_OPT_EXPORT_NAME.
            Error::ExportNotFound {
                export: export.clone(),
                message: "server closed the connection after NBD_OPT_EXPORT_NAME".into(),
            }
        } else {
            Error::io("NBD handshake: reading export info", e)
        }
    })?;
    info.size = u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
    info.flags = u16::from_be_bytes([b[8], b[9]]);
    Ok(info)
}
