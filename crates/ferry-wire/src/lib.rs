//! ferry's wire core: what two ferry endpoints say to each other, as
//! values and as bytes, and nothing else.
//!
//! * [`msg`]: the message types (file list entries, data/zero/copy ops,
//!   segment digests, requests, reports, `Fatal` with its class);
//! * [`codec`]: the hand-written, bounded binary encoding of every message
//!   (specified in `docs/PROTOCOL.md`); the decoder never panics and never
//!   allocates more than the frame it was given;
//! * [`daemon`]: the preamble of a session with `ferry serve --listen`;
//! * [`layout`]: how a file of a given size is cut into segments (the unit
//!   of parallel work) and grid blocks (the unit of zero detection, hashing
//!   and delta matching), and how segment digests are computed.
//!
//! It does no I/O, starts no threads and reads no clock, like rustls's
//! core: the link layer (`ferry-link`: framing, transports, keepalives)
//! and the engine (`ferry-core`) drive it. It must not grow any of those.

mod blockhash;
pub mod codec;
pub mod daemon;
pub mod layout;
pub mod msg;

pub use codec::{decode, encode, encoded_len, DecodeError, MAX_FRAME};
pub use msg::*;

/// The `file` of a [`Message::FileFailed`] that concerns no requested file
/// (a source entry the sender could not list or read).
pub const NO_FILE: u32 = u32::MAX;

/// Protocol version spoken by this build. Peers must agree exactly on the
/// major version; see `docs/PROTOCOL.md`.
pub const PROTOCOL_VERSION: u32 = 13;
/// The version this process announces in `Hello`: [`PROTOCOL_VERSION`].
/// With the `test-hooks` feature (test builds only), the environment
/// variable `FERRY_TEST_PROTOCOL_VERSION` may say otherwise, to exercise
/// version mismatches with real peers.
pub fn announced_version() -> u32 {
    #[cfg(feature = "test-hooks")]
    if let Some(v) = std::env::var("FERRY_TEST_PROTOCOL_VERSION")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return v;
    }
    PROTOCOL_VERSION
}

/// Magic bytes at the start of a stream link, before the first frame.
/// Its 7th byte is the framing's version: 4 since an empty frame is a
/// keepalive (protocol version 4); 3 since frames carry a checked header
/// and a check; 1 before.
pub const MAGIC: &[u8; 8] = b"FERRY\x00\x04\n";
