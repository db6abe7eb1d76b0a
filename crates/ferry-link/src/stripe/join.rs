//! The client's side of joining: the other connections of a session.

use std::io::{self, Read};
use std::net::TcpStream;
use std::thread;
use std::time::Duration;

use ferry_channel::{ChannelError, Join, Psk, Role, Session};

use super::{auto_count, tcp_rtt, Conn, Streams, START};
use crate::direct::{connect_any, handshake_tcp_join, CONNECT_WAIT};

/// The session on `first` (connected, not yet through the handshake) and
/// as many more connections to the same address as `streams` says, each
/// through the handshake with `psk` (each bounded by `wait`). Any
/// connection failing fails the whole: the server would wait for it.
pub fn join_client(
    first: TcpStream,
    psk: &Psk,
    streams: Streams,
    wait: Duration,
) -> Result<(Session, Conn), ChannelError> {
    let count = match streams {
        Streams::Fixed(n) => n,
        Streams::Auto => auto_count(tcp_rtt(&first)),
    };
    if count <= 1 {
        let (session, s, _) = handshake_tcp_join(first, psk, Role::Initiator, wait, None)?;
        return Ok((session, Conn::single(s)));
    }
    let join = Join::fresh(count)?;
    let peer = first.peer_addr()?;
    let mut others = Vec::new();
    let mut failed = None;
    for index in 1..count {
        let (psk, j) = (psk.clone(), Join { index, ..join });
        let spawned = thread::Builder::new()
            .name("ferry-join".into())
            .spawn(move || {
                let s = connect_any(&[peer], CONNECT_WAIT)?;
                handshake_tcp_join(s, &psk, Role::Initiator, wait, Some(&j)).map(|(_, s, _)| s)
            });
        match spawned {
            Ok(t) => others.push(t),
            Err(e) => {
                failed.get_or_insert(ChannelError::Io(e));
            }
        }
    }
    let first = handshake_tcp_join(first, psk, Role::Initiator, wait, Some(&join));
    let mut rest = Vec::new();
    for (k, t) in others.into_iter().enumerate() {
        match t.join() {
            Ok(Ok(s)) => rest.push(s),
            // The key is the same as on connection 0: a "wrong key" here is
            // a server that closed this connection (it refused the join,
            // or had too many handshakes under way).
            Ok(Err(ChannelError::WrongKey)) if first.is_ok() => {
                failed.get_or_insert(ChannelError::Io(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    format!(
                        "the server closed connection {} of {count} in its handshake",
                        k + 1
                    ),
                )));
            }
            Ok(Err(e)) => {
                failed.get_or_insert(e);
            }
            Err(_) => {
                failed.get_or_insert(ChannelError::Io(io::Error::other(
                    "a connecting thread failed",
                )));
            }
        }
    }
    let (session, s0) = match (first, failed) {
        (Err(e), _) | (Ok(_), Some(e)) => return Err(e),
        (Ok((session, s0, _)), None) => (session, s0),
    };
    let mut all = vec![s0];
    all.extend(rest);
    for (k, s) in all.iter().enumerate() {
        started(s, k, wait)?;
    }
    Ok((session, Conn::striped(all)?))
}

/// Wait (at most `wait`) for the server's start on connection `k`.
fn started(mut s: &TcpStream, k: usize, wait: Duration) -> Result<(), ChannelError> {
    s.set_read_timeout(Some(wait))?;
    let mut b = [0u8; 1];
    let got = s.read(&mut b);
    s.set_read_timeout(None)?;
    match got {
        Ok(1) if b[0] == START => Ok(()),
        Ok(0) => Err(ChannelError::Io(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            format!("the server closed connection {k} before the session started"),
        ))),
        Ok(_) => Err(ChannelError::Handshake(format!(
            "connection {k}: {:#04x} where the session's start was due",
            b[0]
        ))),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            Err(ChannelError::Io(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the server did not start the session within {} s (connection {k})",
                    wait.as_secs()
                ),
            )))
        }
        Err(e) => Err(ChannelError::Io(e)),
    }
}
