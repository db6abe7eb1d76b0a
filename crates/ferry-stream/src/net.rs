//! The TCP sockets of `send` and `recv`: bind, connect (through
//! `ferry_link::direct`, as sync's `--direct` does; `accept` has the wait
//! for a sender that proves the key), and the three handles a stream uses
//! (read, write, shutdown) on the one connection or the several of a
//! striped session (`ferry_link::stripe`).

use std::io::{self};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use ferry_link::stripe::{Conn, ConnRead, ConnWrite};

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

/// A session's read half (with the idle timeout), write half, and a
/// function that shuts its connections.
pub(crate) type Halves = (ConnRead, ConnWrite, Box<dyn Fn() + Send>);

/// The [`Halves`] of `conn`, the function shutting it `how`.
pub(crate) fn halves(opts: &Options, conn: &Conn, how: Shutdown) -> Result<Halves, StreamError> {
    let c = |e: io::Error| StreamError::new(ErrorKind::Io, format!("socket: {e}"));
    let r = conn.reader(opts.idle).map_err(c)?;
    let w = conn.writer().map_err(c)?;
    let ctl = conn.try_clone().map_err(c)?;
    opts.stats
        .connections
        .store(conn.count() as u64, std::sync::atomic::Ordering::Relaxed);
    Ok((r, w, Box::new(move || ctl.shutdown(how))))
}
