//! Human-readable names of errno values, commands, options and option
//! replies, for error messages.

use super::consts::*;

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
