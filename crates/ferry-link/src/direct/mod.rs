//! The direct TCP connection that carries a session instead of ssh, for
//! sync (`--direct`) and `ferry pipe` alike, authenticated and encrypted
//! by `ferry-channel` with a key that travels only over ssh.
//!
//! The bootstrap, step by step (the lines over ssh are in [`offer`]; the
//! two [`Dialect`]s differ only in who makes the key and what the lines
//! say):
//!
//! 1. The client starts the remote ferry through ssh ([`crate::rsh`]):
//!    `ferry serve --stdio --direct ...` (sync) or `ferry recv --listen
//!    ADDR:0 --key-stdin --announce ...` (pipe, which first writes the
//!    fresh key it made as a line on ssh's stdin).
//! 2. The server listens on a free port (sync: on the address the ssh
//!    connection arrived at, [`ssh_listen_ip`]; pipe: `--remote-listen`)
//!    and offers it as a line on its stdout (sync: with a fresh key).
//! 3. The client waits for that line (sync: 30 s; pipe: `--timeout`),
//!    connects to the ssh host's name on that port ([`connect`]: every
//!    address, [`CONNECT_WAIT`] each) and tells the server over ssh which
//!    way the data goes ([`Dial`]). When it cannot connect, the session
//!    runs through ssh's own pipes after all.
//! 4. The server takes connections until one proves the key
//!    ([`accept_authenticated`]: each handshake on a thread of its own,
//!    at most [`MAX_PENDING`] at once, the oldest giving way, none longer
//!    than [`HANDSHAKE_TIMEOUT`]), so a stranger that connects and says
//!    nothing cannot lock the client out; the key never leaves ssh, so
//!    nobody else gets in.
//! 5. Both sides run the channel handshake ([`handshake_tcp`], bounded by
//!    [`HANDSHAKE_TIMEOUT`]) and then speak their protocol through the
//!    channel: sync over [`channel_link`], streams over `ferry-stream`'s
//!    own channel frames.

mod accept;
mod offer;

use std::io;
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use ferry_channel::{ChannelError, Join, Psk, Role, Session};

use crate::stripe::Conn;
use crate::transport::{stream_link_flushed, Endpoint, Flushed};

pub use accept::{accept_authenticated, AcceptError, Accepted, MAX_PENDING};
pub use offer::{
    offer, read_answer, read_line, read_line_within, Answer, Dial, DialError, Dialect, Dialled,
    Offer, OfferError, Route,
};

/// How long one channel handshake may take: a peer that connected (or
/// accepted) but says nothing is not the one we wait for.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a client tries each address of the server before it gives up
/// on the direct connection.
pub const CONNECT_WAIT: Duration = Duration::from_secs(5);

/// Connecting to the server failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("cannot resolve {host}: {source}")]
    Resolve { host: String, source: io::Error },
    #[error("direct connection to {host}:{port} failed ({source})")]
    Connect {
        host: String,
        port: u16,
        source: io::Error,
    },
}

impl ConnectError {
    /// Whether trying again could help: a name that did not resolve or a
    /// port that did not answer may well do later.
    pub fn retryable(&self) -> bool {
        true
    }
}

/// Connect to `host` (a name or an address, no user, no brackets) on
/// `port`, trying each of its addresses for [`CONNECT_WAIT`].
pub fn connect(host: &str, port: u16) -> Result<TcpStream, ConnectError> {
    let port = test_port(port);
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|source| ConnectError::Resolve {
            host: host.into(),
            source,
        })?
        .collect();
    connect_any(&addrs, CONNECT_WAIT).map_err(|source| ConnectError::Connect {
        host: host.into(),
        port,
        source,
    })
}

/// Connect to what the server offered: the addresses of `host`, then
/// the address ssh reached the server at (an ssh alias such as `Host box`
/// with a `HostName` in ssh_config does not resolve here, but ssh got
/// there).
pub fn connect_offer(host: &str, offer: &Offer) -> Result<TcpStream, ConnectError> {
    let Some(reached) = offer.addr.filter(|a| !a.is_unspecified()) else {
        return connect(host, offer.port);
    };
    let port = test_port(offer.port);
    let mut addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map(|a| a.collect())
        .unwrap_or_default();
    let via_ssh = SocketAddr::new(reached, port);
    if !addrs.contains(&via_ssh) {
        addrs.push(via_ssh);
    }
    connect_any(&addrs, CONNECT_WAIT).map_err(|source| ConnectError::Connect {
        host: host.into(),
        port,
        source,
    })
}

/// Test aid: with the `test-hooks` feature and
/// `FERRY_TEST_DIRECT_UNREACHABLE` set, a port where nothing listens, as
/// behind a firewall.
fn test_port(port: u16) -> u16 {
    #[cfg(feature = "test-hooks")]
    if std::env::var_os("FERRY_TEST_DIRECT_UNREACHABLE").is_some() {
        return 1;
    }
    port
}

/// The address this side was reached at by ssh (`$SSH_CONNECTION`'s
/// third field), if ferry runs under ssh.
pub fn ssh_reached_ip() -> Option<IpAddr> {
    let c = std::env::var("SSH_CONNECTION").ok()?;
    c.split_whitespace().nth(2)?.parse().ok()
}

/// Connect to the first of `addrs` that answers within `wait`, with
/// Nagle's algorithm off; the last address's error if none does.
pub fn connect_any(addrs: &[SocketAddr], wait: Duration) -> io::Result<TcpStream> {
    let mut last = io::Error::other("no address");
    for a in addrs {
        match TcpStream::connect_timeout(a, wait) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// The channel handshake on a connected socket as `role`, each read and
/// write bounded by `wait`; the socket comes back blocking, without
/// timeouts (a session may be quiet for long: a sender walking a large
/// tree, a receiver signing a large old copy). A peer that asks to join a
/// session of several connections is refused here (see
/// [`handshake_tcp_join`]).
pub fn handshake_tcp(
    s: TcpStream,
    psk: &Psk,
    role: Role,
    wait: Duration,
) -> Result<(Session, TcpStream), ChannelError> {
    match handshake_tcp_join(s, psk, role, wait, None)? {
        (session, s, None) => Ok((session, s)),
        (_, _, Some(_)) => Err(ChannelError::Handshake(
            "the peer wants parallel connections, which this side does not take".into(),
        )),
    }
}

/// As [`handshake_tcp`], saying (initiator) or learning (responder) which
/// connection of a session of several this is ([`crate::stripe`]).
pub fn handshake_tcp_join(
    s: TcpStream,
    psk: &Psk,
    role: Role,
    wait: Duration,
    join: Option<&Join>,
) -> Result<(Session, TcpStream, Option<Join>), ChannelError> {
    s.set_nonblocking(false)?;
    let _ = s.set_nodelay(true);
    s.set_read_timeout(Some(wait))?;
    s.set_write_timeout(Some(wait))?;
    let (mut r, mut w) = (s.try_clone()?, s.try_clone()?);
    let (session, peer) =
        ferry_channel::handshake_join(&mut r, &mut w, psk, role, join).map_err(|e| match e {
            // A socket timeout shows as "resource temporarily unavailable".
            ChannelError::Io(io)
                if matches!(
                    io.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                ChannelError::Io(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the peer sent nothing for {} s during the handshake",
                        wait.as_secs_f64().ceil()
                    ),
                ))
            }
            e => e,
        })?;
    s.set_read_timeout(None)?;
    s.set_write_timeout(None)?;
    Ok((session, s, peer))
}

/// A sync link through the channel on `conn` (after the handshake).
pub fn channel_link(session: &Session, conn: &Conn) -> io::Result<(Endpoint, Flushed)> {
    let reader = ferry_channel::ChannelReader::new(conn.reader(None)?, session);
    // Small messages coalesce into one sealed frame; large ones pass.
    let writer = io::BufWriter::with_capacity(
        1 << 20,
        ferry_channel::ChannelWriter::new(conn.writer()?, session),
    );
    Ok(stream_link_flushed(reader, writer))
}

/// A fresh key for one session: as hex text (to hand to the other side
/// over ssh) and ready for the handshake.
pub fn fresh_key() -> Result<(String, Psk), ChannelError> {
    let hex = Psk::generate_hex()?;
    let psk = Psk::new(hex.as_bytes())?;
    Ok((hex, psk))
}

/// The address a server started through ssh listens on: the one the ssh
/// connection arrived at (`$SSH_CONNECTION`), else all of them.
pub fn ssh_listen_ip() -> String {
    std::env::var("SSH_CONNECTION")
        .ok()
        .and_then(|s| s.split_whitespace().nth(2).map(str::to_string))
        .unwrap_or_else(|| "0.0.0.0".into())
}

#[cfg(test)]
mod tests;
