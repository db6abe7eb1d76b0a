//! One session over several TCP connections, for links where one TCP flow
//! cannot fill the pipe (a long round trip, loss): `--streams N`.
//!
//! **Joining.** The client opens `count` connections to the same address
//! and runs the channel handshake on each, saying in it which session
//! (a random token) and which connection of how many it is
//! (`ferry_channel::Join`). The server groups the connections that proved
//! the key by token ([`Groups`], used by the accept loop of
//! [`crate::direct`]) and starts the session once all `count` are in,
//! with one byte ([`START`]) on each; the client waits for that byte on
//! every connection before it sends anything more.
//! Connection 0's handshake keys the session's channel; the others'
//! handshakes only prove the key (their keys are dropped), so a stranger
//! cannot add a connection to a session.
//!
//! **Striping.** The channel's byte stream (sealed frames, in each
//! direction) is cut into chunks, each sent whole on one connection:
//!
//! ```text
//! seq   8  u64 big-endian: 0, 1, 2, ... in this direction, over all
//!          the connections together
//! len   4  u32 big-endian: 1 ..= MAX_CHUNK
//! data  len
//! ```
//!
//! The writer ([`StripeWriter`]) has a thread per connection and puts
//! each chunk on the next connection whose queue has room (round robin),
//! so a connection that slows down (loss, a full window) gets less. The
//! reader ([`StripeReader`]) drains every connection into a queue of
//! chunks (so every TCP window stays open) and hands the chunks on in
//! `seq` order; the queues hold at most [`read::WINDOW`] bytes in all,
//! past which only a connection that may bring the chunk that is due is
//! read, whatever the peer sends. A chunk header with a `seq` already
//! passed, a `len` out of range, a connection that ends inside a chunk,
//! or connections that can no longer bring the chunk that is due fail the
//! read; a changed or moved byte fails the channel's authentication
//! above. Each direction ends when every connection ends
//! (`shutdown(Write)` on each) at a chunk boundary.
//!
//! A session of one connection uses the connection as it is (no chunk
//! headers).

mod conn;
mod groups;
mod join;
pub mod read;
mod write;

use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::Duration;

pub use conn::{Conn, ConnRead, ConnWrite, Stripe};
pub use groups::{Groups, Joined, MAX_HELD};
pub use join::join_client;
pub use read::StripeReader;
pub use write::StripeWriter;

/// Largest chunk a reader accepts.
pub const MAX_CHUNK: usize = 1 << 20;
/// Largest chunk a writer sends: a channel frame (up to 1 MiB) goes out
/// over several connections at once.
pub const CHUNK: usize = 256 << 10;
/// Bytes of a chunk header.
pub const HEADER: usize = 12;
/// The byte the accepting side sends on each connection of a striped
/// session once all have joined: the session starts.
pub const START: u8 = 1;
/// Most connections of one session (the handshake's limit).
pub const MAX_STREAMS: u8 = ferry_channel::MAX_CONNECTIONS;

/// How many connections a client opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Streams {
    /// Chosen from the round trip of the first connection ([`auto_count`]).
    Auto,
    /// This many (1 ..= [`MAX_STREAMS`]).
    Fixed(u8),
}

impl std::str::FromStr for Streams {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "auto" {
            return Ok(Streams::Auto);
        }
        match s.parse::<u8>() {
            Ok(n) if (1..=MAX_STREAMS).contains(&n) => Ok(Streams::Fixed(n)),
            _ => Err(format!("expected `auto` or 1 to {MAX_STREAMS}")),
        }
    }
}

/// The number of connections for a link whose round trip is `rtt`: one
/// where a single TCP flow fills any link this machine can drive (a LAN,
/// loopback), more as the round trip grows, since one flow's rate is at
/// most its window over the round trip (Linux lets a send buffer grow to
/// 4 MiB by default: about 330 Mbit/s at 100 ms) and a lost packet halves
/// it for many round trips. Unknown: one.
pub fn auto_count(rtt: Option<Duration>) -> u8 {
    match rtt {
        Some(r) if r >= Duration::from_millis(20) => 8,
        Some(r) if r >= Duration::from_millis(5) => 4,
        _ => 1,
    }
}

/// The kernel's smoothed round-trip estimate of a connected socket
/// (`TCP_INFO`; right after `connect`, the SYN's round trip).
pub fn tcp_rtt(s: &TcpStream) -> Option<Duration> {
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` is a properly sized, writable tcp_info and `len` says
    // its size; the kernel writes at most that much.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    (rc == 0 && info.tcpi_rtt > 0).then(|| Duration::from_micros(info.tcpi_rtt.into()))
}

#[cfg(test)]
mod tests;
