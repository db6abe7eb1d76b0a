//! The TCP sockets of `send` and `recv`: bind, accept, connect, and the
//! three handles a stream uses (read, write, shutdown).

use std::io::{self};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use crate::*;

/// Bind the receiver's listening socket.
pub fn bind(addr: SocketAddr) -> Result<TcpListener, StreamError> {
    TcpListener::bind(addr).map_err(|e| {
        if e.kind() == io::ErrorKind::AddrInUse {
            StreamError::new(
                ErrorKind::AddrInUse,
                format!("cannot listen on {addr}: address already in use"),
            )
        } else {
            StreamError::new(ErrorKind::Io, format!("cannot listen on {addr}: {e}"))
        }
    })
}

/// Accept one connection.
pub fn accept(l: &TcpListener) -> Result<TcpStream, StreamError> {
    let (s, _) = l
        .accept()
        .map_err(|e| StreamError::new(ErrorKind::Io, format!("accept failed: {e}")))?;
    let _ = s.set_nodelay(true);
    Ok(s)
}

/// Connect to the receiver.
pub fn connect(peer: SocketAddr, timeout: Duration) -> Result<TcpStream, StreamError> {
    let s = TcpStream::connect_timeout(&peer, timeout).map_err(|e| {
        StreamError::new(
            ErrorKind::Unreachable,
            format!("cannot connect to {peer}: {e}"),
        )
    })?;
    let _ = s.set_nodelay(true);
    Ok(s)
}

pub(crate) fn split(s: TcpStream) -> Result<(TcpStream, TcpStream, TcpStream), StreamError> {
    let c = |e: io::Error| StreamError::new(ErrorKind::Io, format!("socket: {e}"));
    let r = s.try_clone().map_err(c)?;
    let ctl = s.try_clone().map_err(c)?;
    Ok((r, s, ctl))
}
