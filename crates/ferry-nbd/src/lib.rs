//! `ferry-nbd`: a Network Block Device client written from the protocol
//! specification (NetworkBlockDevice/nbd `doc/proto.md`, `doc/uri.md`).
//!
//! * [`Client`]: connect by URI (`nbd://host[:port]/export`,
//!   `nbd+unix:///export?socket=PATH`), query size and flags, read
//!   allocation [`Extent`]s (`base:allocation`), read, write, write zeroes
//!   (fast-zero with fallback), trim, flush.
//! * [`Connection`]: the transmission phase with many requests in flight:
//!   `submit_*` returns a [`Ticket`], a reader thread dispatches replies by
//!   cookie. Share it between threads.
//! * [`copy_to_file`] / [`copy_from_file`]: sparse-aware, parallel copies.
//! * [`proto`]: constants and pure decoders of everything the server sends
//!   (fuzzed by `fuzz/fuzz_targets/nbd_reply_decode.rs`).
//!
//! Not implemented: TLS (`nbds://` is refused with a clear error), oldstyle
//! negotiation, extended headers (64-bit lengths), `NBD_CMD_CACHE`, resize.

pub mod client;
pub mod conn;
pub mod copy;
pub mod error;
pub mod proto;
pub mod uri;

pub use client::{Client, Extent, DEFAULT_REQUEST_SIZE};
pub use conn::{ConnectOptions, Connection, ExportInfo, Reply, Ticket};
pub use copy::{
    copy_from_file, copy_from_file_with, copy_to_file, copy_to_file_with, is_zero, CopyOptions,
    CopyStats,
};
pub use error::{Error, Result};
pub use uri::{Endpoint, NbdUri, DEFAULT_PORT};
