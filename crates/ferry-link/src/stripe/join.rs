//! The client's side of joining: the other connections of a session.

use std::net::TcpStream;
use std::thread;
use std::time::Duration;

use ferry_channel::{ChannelError, Join, Psk, Role, Session};

use super::{auto_count, tcp_rtt, Conn, Streams};
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
    for index in 1..count {
        let (psk, j) = (psk.clone(), Join { index, ..join });
        let t = thread::Builder::new()
            .name("ferry-join".into())
            .spawn(move || {
                let s = connect_any(&[peer], CONNECT_WAIT)?;
                handshake_tcp_join(s, &psk, Role::Initiator, wait, Some(&j)).map(|(_, s, _)| s)
            })?;
        others.push(t);
    }
    let first = handshake_tcp_join(first, psk, Role::Initiator, wait, Some(&join));
    let mut socks = Vec::with_capacity(count.into());
    let mut failed = None;
    match first {
        Ok((session, s, _)) => socks.push((session, s)),
        Err(e) => failed = Some(e),
    }
    let mut rest = Vec::new();
    for t in others {
        match t.join() {
            Ok(Ok(s)) => rest.push(s),
            Ok(Err(e)) => {
                failed.get_or_insert(e);
            }
            Err(_) => {
                failed.get_or_insert(ChannelError::Io(std::io::Error::other(
                    "a connecting thread failed",
                )));
            }
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }
    let Some((session, s0)) = socks.pop() else {
        return Err(ChannelError::Handshake("no first connection".into()));
    };
    let mut all = vec![s0];
    all.extend(rest);
    Ok((session, Conn::striped(all)))
}
