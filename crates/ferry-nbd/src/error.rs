//! Error type of the crate.

use std::io;

/// Errors returned by the NBD client.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The URI could not be parsed or uses an unknown scheme or parameter.
    #[error("invalid NBD URI {uri:?}: {reason}")]
    Uri { uri: String, reason: String },

    /// `nbds://` or `nbds+unix://` was requested.
    #[error("TLS not supported yet (URI scheme {scheme:?}); use nbd:// or nbd+unix:// over a trusted path")]
    TlsNotSupported { scheme: String },

    /// Connecting to the server failed.
    #[error("cannot connect to {target}: {source}")]
    Connect {
        target: String,
        #[source]
        source: io::Error,
    },

    /// An I/O error on the connection (or on a local file during a copy).
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },

    /// The server does not know the export (`NBD_REP_ERR_UNKNOWN`).
    #[error("the NBD server has no export named {export:?}{}", fmt_msg(.message))]
    ExportNotFound { export: String, message: String },

    /// The server requires TLS for this export.
    #[error("the NBD server requires TLS for export {export:?}, and TLS is not supported yet")]
    TlsRequired { export: String },

    /// The server refused an option with an error reply.
    #[error("the NBD server refused {option} for export {export:?}: {reply}{}", fmt_msg(.message))]
    OptionRefused {
        option: &'static str,
        export: String,
        reply: &'static str,
        message: String,
    },

    /// The server speaks a handshake this client does not (oldstyle, not fixed newstyle, ...).
    #[error("NBD handshake failed: {0}")]
    Handshake(String),

    /// The server sent bytes that violate the protocol; the connection was dropped.
    #[error("NBD protocol violation by the server: {0}")]
    Protocol(#[from] crate::proto::ProtoError),

    /// A command failed on the server (simple reply error or error chunk).
    #[error("NBD {command} at offset {offset} length {len} failed: {errno_name} ({errno}){}{}", fmt_msg(.message), fmt_off(.error_offset))]
    Server {
        command: &'static str,
        offset: u64,
        len: u64,
        errno: u32,
        errno_name: &'static str,
        message: String,
        error_offset: Option<u64>,
    },

    /// The connection is gone: the server closed it, it was reset, or it timed out.
    #[error("NBD connection lost: {0}")]
    ConnectionLost(String),

    /// No reply arrived within the configured timeout.
    #[error(
        "NBD server did not answer within {secs} s (request(s) in flight); connection dropped"
    )]
    Timeout { secs: u64 },

    /// The export does not offer what was asked (read-only, no flush, no block status...).
    #[error("operation not supported by this NBD export: {0}")]
    Unsupported(String),

    /// The request lies (partly) beyond the end of the export.
    #[error("request offset {offset} length {len} is beyond the export size {size}")]
    OutOfRange { offset: u64, len: u64, size: u64 },

    /// Invalid argument from the caller.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

fn fmt_msg(m: &str) -> String {
    if m.is_empty() {
        String::new()
    } else {
        format!(": {m}")
    }
}

fn fmt_off(o: &Option<u64>) -> String {
    match o {
        Some(o) => format!(" (error at offset {o})"),
        None => String::new(),
    }
}

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// The NBD errno of a server-side command failure, if this is one.
    pub fn server_errno(&self) -> Option<u32> {
        match self {
            Error::Server { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

/// Result alias of the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
