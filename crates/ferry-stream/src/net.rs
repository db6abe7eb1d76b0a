//! The TCP sockets of `send` and `recv`: bind, connect (through
//! `ferry_link::direct`, as sync's `--direct` does; `accept` has the wait
//! for a sender that proves the key), and the three handles a stream uses
//! (read, write, shutdown).

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

/// Connect to the receiver.
pub fn connect(peer: SocketAddr, timeout: Duration) -> Result<TcpStream, StreamError> {
    ferry_link::direct::connect_any(&[peer], timeout).map_err(|e| {
        StreamError::new(
            ErrorKind::Unreachable,
            format!("cannot connect to {peer}: {e}"),
        )
    })
}

pub(crate) fn split(s: TcpStream) -> Result<(TcpStream, TcpStream, TcpStream), StreamError> {
    let c = |e: io::Error| StreamError::new(ErrorKind::Io, format!("socket: {e}"));
    let r = s.try_clone().map_err(c)?;
    let ctl = s.try_clone().map_err(c)?;
    Ok((r, s, ctl))
}
