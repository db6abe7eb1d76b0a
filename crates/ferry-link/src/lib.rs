//! ferry's link layer for sync sessions: how [`Message`]s (defined, with
//! their codec and the block layout, in the `ferry-wire` crate and
//! re-exported here) travel between a sender and a receiver.
//!
//! * [`transport`]: the message links: an in-process link (channels) and a
//!   byte-stream link (pipes, ssh, TCP through ferry-channel), which
//!   compresses data blocks when that pays and counts `bytes_wire`;
//! * `framing`: the magic and the checked frames on a byte pipe;
//! * [`liveness`]: keepalives and the idle timeout (`--timeout`);
//! * [`bufpool`]: reused data buffers.
//!
//! The crate does no file I/O and knows nothing of the terminal.

pub mod bufpool;
mod framing;
pub mod liveness;
pub mod transport;

pub use ferry_wire::{
    announced_version, decode, encode, encoded_len, DecodeError, MAGIC, MAX_FRAME, NO_FILE,
    PROTOCOL_VERSION,
};
pub use ferry_wire::{codec, layout, msg};
pub use msg::*;
pub use transport::{
    in_process, stream_link, stream_link_flushed, Endpoint, Flushed, LinkError, MsgRx, MsgTx,
    WireCounter,
};
