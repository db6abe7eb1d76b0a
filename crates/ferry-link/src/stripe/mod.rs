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

mod groups;
mod join;
pub mod read;
mod write;

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::Duration;

use ferry_channel::IdleRead;

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

/// The connections of one session, in join order (one, or 2 ..=
/// [`MAX_STREAMS`]).
pub struct Conn {
    socks: Vec<TcpStream>,
}

impl Conn {
    /// A session on one connection.
    pub fn single(s: TcpStream) -> Conn {
        Conn { socks: vec![s] }
    }

    /// A session on these connections, in `index` order.
    pub fn striped(socks: Vec<TcpStream>) -> Conn {
        Conn { socks }
    }

    /// The connection, if there is only one.
    pub fn only(&self) -> Option<&TcpStream> {
        match self.socks.as_slice() {
            [s] => Some(s),
            _ => None,
        }
    }

    /// How many connections.
    pub fn count(&self) -> usize {
        self.socks.len()
    }

    /// The peer's address (connection 0's).
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.socks[0].peer_addr()
    }

    fn clones(&self) -> io::Result<Vec<TcpStream>> {
        self.socks.iter().map(TcpStream::try_clone).collect()
    }

    /// The session's incoming bytes, with an idle timeout (`None`: wait
    /// for ever) that [`ConnRead::set_idle`] can change.
    pub fn reader(&self, idle: Option<Duration>) -> io::Result<ConnRead> {
        Ok(match self.socks.len() {
            1 => ConnRead::One(IdleRead::new(self.socks[0].try_clone()?, idle)),
            _ => ConnRead::Many(StripeReader::new(self.clones()?, idle)),
        })
    }

    /// The session's outgoing bytes.
    pub fn writer(&self) -> io::Result<ConnWrite> {
        Ok(match self.socks.len() {
            1 => ConnWrite::One(self.socks[0].try_clone()?),
            _ => ConnWrite::Many(StripeWriter::new(self.clones()?)),
        })
    }

    /// Another handle on the same connections (to shut them from another
    /// thread).
    pub fn try_clone(&self) -> io::Result<Conn> {
        Ok(Conn {
            socks: self.clones()?,
        })
    }

    /// Shut every connection (`Write`: the end of what this side sends,
    /// after all it wrote; `Both`: unblock everything, on failure).
    pub fn shutdown(&self, how: Shutdown) {
        for s in &self.socks {
            let _ = s.shutdown(how);
        }
    }
}

/// A session's incoming bytes: the connection, or the chunks of all of
/// them in order.
pub enum ConnRead {
    One(IdleRead<TcpStream>),
    Many(StripeReader),
}

impl ConnRead {
    /// How long a silence may last before a read fails with `TimedOut`.
    pub fn set_idle(&mut self, idle: Option<Duration>) {
        match self {
            ConnRead::One(r) => r.set_idle(idle),
            ConnRead::Many(r) => r.set_idle(idle),
        }
    }
}

impl Read for ConnRead {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            ConnRead::One(r) => r.read(buf),
            ConnRead::Many(r) => r.read(buf),
        }
    }
}

/// A session's outgoing bytes.
pub enum ConnWrite {
    One(TcpStream),
    Many(StripeWriter),
}

impl Write for ConnWrite {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            ConnWrite::One(w) => w.write(buf),
            ConnWrite::Many(w) => w.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            ConnWrite::One(w) => w.flush(),
            ConnWrite::Many(w) => w.flush(),
        }
    }
}

#[cfg(test)]
mod tests;
