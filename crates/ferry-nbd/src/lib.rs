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
//! * [`Pool`]: one export over several connections (multi-conn), reads
//!   and writes spread over them.
//! * [`copy_to_file`] / [`copy_from_file`]: sparse-aware, parallel copies.
//! * [`proto`]: constants and pure decoders of everything the server sends
//!   (fuzzed by `fuzz/fuzz_targets/nbd_reply_decode.rs`).
//!
//! Robustness: every length read off the wire is checked against the
//! request it answers or a fixed cap before anything is allocated; a dead
//! connection (EOF, reset, protocol violation, no byte for
//! [`ConnectOptions::io_timeout`] while requests are in flight) fails every
//! outstanding and later request instead of hanging.
//!
//! Not implemented: TLS (`nbds://` is refused with a clear error), oldstyle
//! negotiation, extended headers (64-bit lengths), `NBD_CMD_CACHE`, resize,
//! `NBD_OPT_LIST`, metadata contexts other than `base:allocation`, FUA on
//! the copy paths (a final FLUSH is used instead).

pub mod ahead;
pub mod client;
pub mod conn;
pub mod copy;
pub mod error;
pub mod pool;
pub mod proto;
mod spare;
pub mod uri;

pub use client::{Client, Extent, DEFAULT_REQUEST_SIZE, MAX_EXTENTS, MAX_QUERIES};
pub use conn::{ConnectOptions, Connection, ExportInfo, Reply, Ticket};
pub use copy::{
    copy_from_file, copy_from_file_with, copy_to_file, copy_to_file_with, is_zero, CopyOptions,
    CopyStats,
};
pub use error::{Error, Result};
pub use pool::Pool;
pub use uri::{Endpoint, NbdUri, DEFAULT_PORT};
