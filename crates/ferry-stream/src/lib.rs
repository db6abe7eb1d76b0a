//! The engine of `ferry send`, `ferry recv` and `ferry pipe`: one byte
//! stream (a `zfs send`, a tar, any pipe) moved to another host at line
//! rate, authenticated and encrypted.
//!
//! ```text
//! sender:   reader thread -> ring (--buffer) -> compressor workers -> net writer
//!                                                  (reordered by seq)      |
//!                                                         ferry-channel (AEAD frames)
//!                                                                          v
//! receiver: net reader (decrypt + decompress) -> ring (--buffer) -> writer thread
//! ```
//!
//! The connection itself is `ferry-link`'s, as for sync's `--direct`:
//! [`connect`] and the wait for a sender that proves the key ([`accept`])
//! are `ferry_link::direct`'s; `ferry pipe` starts its remote `recv` with
//! `ferry_link::rsh` and sets it up with the same bootstrap.
//!
//! The engine prints nothing; it reports through [`Stats`] (atomics the CLI
//! polls) and returns a [`Summary`] or a [`StreamError`] whose
//! [`ErrorKind`] tells the CLI which exit code to use.
//!
//! # Messages (payloads of channel frames)
//!
//! Sender to receiver:
//!
//! ```text
//! 0x04 START  offset u64 LE: the blocks continue the stream from there
//!             (first message; see [`resume`])
//! 0x01 BLOCK  codec u8 | level-or-stream u8 | raw_len u32 LE | payload
//!             codec 0 raw, 1 lz4, 2 zstd frame (then: level i8);
//!             3 / 4 a block of compressor <stream>'s zstd stream,
//!             continuing / starting it (then: stream u8, < 64); stream
//!             blocks are decoded in wire order, one decoder per stream
//! 0x02 END    total u64 LE | blake3(plaintext) 32
//! 0x03 ABORT  reason (UTF-8): the producer failed; the receiver exits non-zero
//! ```
//!
//! then the channel's authenticated end frame. Receiver to sender:
//!
//! ```text
//! 0x12 OFFER  have u64 LE | blake3 of the output's first `have` bytes 32
//!             (first message)
//! 0x10 ACK    total u64 LE | blake3 32 | status i32 LE (i32::MIN: no command)
//! 0x11 FAIL   kind u8 (see [`ErrorKind::code`]) | status i32 LE | message (UTF-8)
//! ```
//!
//! END's total and digest cover the whole stream, a resumed prefix
//! included. ACK is sent only after the output was flushed and closed (and, for
//! `pipe`, the command exited), so a sender that got it knows the data
//! arrived whole. Both sides compare byte count and digest.
//!
//! Both sides send the channel's keepalive frames after [`KEEPALIVE`]
//! with nothing to say (the sender while its producer is slow, the
//! receiver until its verdict), and with [`Options::idle`] read through
//! [`IdleRead`], so a silent peer is dead after `--timeout` and a busy one
//! is not. docs/PROTOCOL.md has the bytes.

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::thread;
use std::time::Duration;

use crossbeam_channel::Receiver;
use ferry_channel::{IdleRead, Role, Session};

pub use ferry_compress::{Codec, Mode};
pub use output::FileOut;

pub mod accept;
mod error;
mod net;
mod options;
mod output;
mod recv;
mod recv_stages;
mod resume;
mod send;
mod send_stages;

pub use error::{ErrorKind, StreamError};
pub use net::{bind, connect};
pub use options::{cpu_time, Options, Stats, Summary};
pub use recv::{opened, recv, recv_conn, recv_on, recv_over, Opener, RecvHooks};
pub use resume::{hash_prefix, skip_prefix, Offer};
pub use send::{send, send_file, send_file_conn, send_file_on, send_file_over, send_over};

use error::channel_err;
use net::halves;
use recv::{Chunk, RecvEv};
use recv_stages::{net_reader, write_output};
use send::{Job, JobKind, SendEv};
use send_stages::{compress_worker, net_writer, read_control, read_input};

/// Largest block size (so a block plus its header fits a channel frame).
pub const MAX_BLOCK: usize = 1 << 20;
/// Smallest block size accepted.
pub const MIN_BLOCK: usize = 4 << 10;
const HEAD: usize = 7;
/// Most compressor streams a receiver decodes (one per sending worker;
/// workers beyond this compress independent blocks).
const MAX_STREAMS: usize = 64;
/// A side with nothing to send for this long sends a keepalive frame.
pub const KEEPALIVE: Duration = Duration::from_secs(1);

mod msg {
    pub const BLOCK: u8 = 0x01;
    pub const END: u8 = 0x02;
    pub const ABORT: u8 = 0x03;
    pub const START: u8 = 0x04;
    pub const ACK: u8 = 0x10;
    pub const FAIL: u8 = 0x11;
    pub const OFFER: u8 = 0x12;
}

/// The handshake over a fresh pipe, each of its reads waiting at most
/// [`Options::handshake_wait`]; the reader comes back with the stream's
/// idle timeout armed.
fn handshake<NR: Read + AsFd, NW: Write>(
    opts: &Options,
    net_r: NR,
    net_w: &mut NW,
    role: Role,
) -> Result<(Session, IdleRead<NR>), StreamError> {
    let mut net_r = IdleRead::new(net_r, opts.handshake_wait());
    let session = ferry_channel::handshake(&mut net_r, net_w, &opts.key, role)
        .map_err(|e| channel_err(e, "handshake"))?;
    net_r.set_idle(opts.idle);
    Ok((session, net_r))
}

/// Starts a thread of the pipeline.
fn spawn(name: impl Into<String>, f: impl FnOnce() + Send + 'static) -> Result<(), StreamError> {
    thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map(drop)
        .map_err(|e| StreamError::new(ErrorKind::Io, format!("spawn: {e}")))
}

/// The pipeline's next event; its threads all gone without one is a bug.
fn next_event<E>(rx: &Receiver<E>) -> Result<E, StreamError> {
    rx.recv()
        .map_err(|_| StreamError::new(ErrorKind::Io, "internal: all workers ended"))
}
