//! [`ConnectOptions`], what the caller asks of a connection, and
//! [`ExportInfo`], what the handshake established.

use std::time::Duration;

use crate::proto::*;

/// Knobs of a connection.
#[derive(Clone, Debug)]
pub struct ConnectOptions {
    /// How long to wait for the TCP/unix connect and for each handshake reply.
    pub connect_timeout: Duration,
    /// How long requests may be in flight with no byte arriving from the
    /// server before the connection is declared dead.
    pub io_timeout: Duration,
    /// Most requests in flight on this connection (submitters block beyond).
    pub max_in_flight: usize,
    /// Negotiate structured replies (and with them `base:allocation`).
    pub structured_replies: bool,
    /// Negotiate the `base:allocation` metadata context.
    pub block_status: bool,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            connect_timeout: Duration::from_secs(30),
            io_timeout: Duration::from_secs(120),
            max_in_flight: 64,
            structured_replies: true,
            block_status: true,
        }
    }
}

/// What the handshake established.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportInfo {
    /// Export name as requested.
    pub export: String,
    /// Export size in bytes.
    pub size: u64,
    /// Transmission flags (`NBD_FLAG_*`).
    pub flags: u16,
    /// Structured replies were negotiated.
    pub structured: bool,
    /// Id of the `base:allocation` context, if negotiated.
    pub base_allocation: Option<u32>,
    /// Block size constraints (min, preferred, max payload) if the server sent them.
    pub block_size: Option<(u32, u32, u32)>,
    /// Export description if the server sent one.
    pub description: Option<String>,
}

impl ExportInfo {
    fn has(&self, f: u16) -> bool {
        self.flags & f != 0
    }
    pub fn read_only(&self) -> bool {
        self.has(FLAG_READ_ONLY)
    }
    pub fn can_flush(&self) -> bool {
        self.has(FLAG_SEND_FLUSH)
    }
    pub fn can_fua(&self) -> bool {
        self.has(FLAG_SEND_FUA)
    }
    pub fn can_trim(&self) -> bool {
        self.has(FLAG_SEND_TRIM)
    }
    pub fn can_zero(&self) -> bool {
        self.has(FLAG_SEND_WRITE_ZEROES)
    }
    pub fn can_fast_zero(&self) -> bool {
        self.has(FLAG_SEND_FAST_ZERO) && self.can_zero()
    }
    pub fn can_multi_conn(&self) -> bool {
        self.has(FLAG_CAN_MULTI_CONN)
    }
    pub fn has_block_status(&self) -> bool {
        self.base_allocation.is_some()
    }
    /// Largest READ/WRITE payload to use with this server.
    pub fn max_payload(&self) -> u32 {
        match self.block_size {
            Some((_, _, max)) if max >= 512 => max.min(MAX_PAYLOAD),
            _ => MAX_PAYLOAD,
        }
    }
}
