//! Waiting for a sender that proves the key.
//!
//! `recv` listens on a port anyone can reach. The wait is
//! `ferry_link::direct`'s accept loop, the one sync's `--direct` server
//! uses too: a connection that sends garbage, the wrong key or nothing at
//! all neither ends the wait nor holds it up (at most [`MAX_PENDING`]
//! handshakes at once, the oldest giving way to a newcomer, each cut short
//! after [`HANDSHAKE_TIMEOUT`]); failures are reported and dropped, and the
//! first connection that completes the handshake is the stream. Nothing is
//! written and no command is started before that.

use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use ferry_channel::Session;
use ferry_link::direct::{self, AcceptError, Accepted};
use ferry_link::stripe::Conn;

pub use ferry_link::direct::{HANDSHAKE_TIMEOUT, MAX_PENDING};

use crate::{channel_err, ErrorKind, Options, StreamError};

/// Accept connections on `l` until one completes the handshake with
/// `opts.key` (or all the connections of a striped session have), and
/// return its session and connections (blocking, timeouts cleared). `refused` is told of every connection that failed. With
/// `wait`, give up after that long: a `WrongKey` error if some connection
/// failed the key, else `Unreachable`.
pub fn accept_authenticated(
    opts: &Options,
    l: &TcpListener,
    wait: Option<Duration>,
    refused: &dyn Fn(SocketAddr, &StreamError),
) -> Result<(Session, Conn), StreamError> {
    let mut told = |peer, e| refused(peer, &channel_err(e, "handshake"));
    match direct::accept_authenticated(l, &opts.key, wait, &mut told, &|| false) {
        Ok(Accepted::Peer(session, conn)) => Ok((session, conn)),
        // Without `stop`, only a failure ends the wait.
        Ok(Accepted::Stopped) => Err(StreamError::new(ErrorKind::Io, "accept stopped")),
        Err(AcceptError::Listener(e)) => Err(StreamError::new(
            ErrorKind::Io,
            format!("accept failed: {e}"),
        )),
        Err(AcceptError::NoPeer { waited, wrong_key }) => {
            let secs = waited.as_secs_f64();
            Err(if wrong_key {
                StreamError::new(
                    ErrorKind::WrongKey,
                    format!("no sender proved the key within {secs:.0} s (wrong key)"),
                )
            } else {
                StreamError::new(
                    ErrorKind::Unreachable,
                    format!("no sender connected within {secs:.0} s"),
                )
            })
        }
    }
}
