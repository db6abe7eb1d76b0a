//! ferry's link layer: how a session reaches the other side, for sync and
//! streams alike, and how sync's [`Message`]s (defined, with their codec
//! and the block layout, in the `ferry-wire` crate and re-exported here)
//! travel between a sender and a receiver.
//!
//! * [`rsh`]: the remote side as a child process: the one ssh (`-e`)
//!   command line with its shell quoting, spawning it with pipes, and
//!   waiting for it (sync's `serve --stdio` and `pipe`'s `recv`), with
//!   AES-GCM preferred where ssh's ciphers are its defaults and the CPU
//!   has AES (`ssh_cipher`);
//! * [`direct`]: the one direct-TCP bootstrap (the offer of a port and a
//!   key over ssh, connecting, falling back to ssh, the accept loop that
//!   waits for the client that proves the key, the channel handshake);
//! * [`transport`]: sync's message links: an in-process link (channels)
//!   and a byte-stream link (pipes, ssh, TCP through ferry-channel), which
//!   compresses data blocks when that pays and counts `bytes_wire`;
//! * [`stripe`]: one session over several TCP connections (`--streams`):
//!   joining them, and the chunks that stripe the channel over them;
//! * `framing`: the magic and the checked frames on a byte pipe;
//! * [`liveness`]: keepalives and the idle timeout (`--timeout`);
//! * [`bufpool`]: reused data buffers.
//!
//! The crate does no file I/O and knows nothing of the terminal: it
//! returns typed errors, and its callers word them for the user.

pub mod bufpool;
pub mod direct;
mod framing;
mod link_error;
pub mod liveness;
mod ratelimit;
pub mod rsh;
mod ssh_cipher;
pub mod stripe;
pub mod transport;

pub use ferry_wire::{
    announced_version, decode, encode, encoded_len, DecodeError, MAGIC, MAX_FRAME, NO_FILE,
    PROTOCOL_VERSION,
};
pub use ferry_wire::{codec, daemon, layout, msg};
pub use msg::*;
pub use transport::{
    in_process, stream_link, stream_link_flushed, Endpoint, Flushed, LinkError, MsgRx, MsgTx,
    WireCounter,
};
