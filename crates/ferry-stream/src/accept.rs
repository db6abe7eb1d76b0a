//! Waiting for a sender that proves the key.
//!
//! `recv` listens on a port anyone can reach. A connection that sends
//! garbage, the wrong key or nothing at all must neither end the wait nor
//! hold it up: each accepted connection does its handshake on a thread of
//! its own (at most [`MAX_PENDING`] at once, the oldest giving way to a
//! newcomer, each cut short after [`HANDSHAKE_TIMEOUT`] however it trickles
//! bytes in), failures are reported and dropped, and the first
//! connection that completes the handshake is the stream. Nothing is
//! written and no command is started before that.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, TryRecvError};
use ferry_channel::{Role, Session};

use crate::{channel_err, ErrorKind, Options, StreamError};

/// How long an accepted connection may take to complete the handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// Handshakes under way at once; beyond that the oldest is cut short (a
/// flood of silent connections costs at most this many threads).
pub const MAX_PENDING: usize = 16;

/// How often the listener is polled while handshakes run.
const POLL: Duration = Duration::from_millis(20);

type Attempt = (SocketAddr, Result<(Session, TcpStream), StreamError>);

/// Accept connections on `l` until one completes the handshake with
/// `opts.key`, and return its session and socket (blocking, timeouts
/// cleared). `refused` is told of every connection that failed. With
/// `wait`, give up after that long: a `WrongKey` error if some connection
/// failed the key, else `Unreachable`.
pub fn accept_authenticated(
    opts: &Options,
    l: &TcpListener,
    wait: Option<Duration>,
    refused: &dyn Fn(SocketAddr, &StreamError),
) -> Result<(Session, TcpStream), StreamError> {
    let io_err = |e: io::Error| StreamError::new(ErrorKind::Io, format!("accept failed: {e}"));
    l.set_nonblocking(true).map_err(io_err)?;
    let res = wait_for_one(opts, l, wait, refused);
    let _ = l.set_nonblocking(false);
    res
}

fn wait_for_one(
    opts: &Options,
    l: &TcpListener,
    wait: Option<Duration>,
    refused: &dyn Fn(SocketAddr, &StreamError),
) -> Result<(Session, TcpStream), StreamError> {
    let deadline = wait.map(|w| Instant::now() + w);
    let (tx, rx) = unbounded::<Attempt>();
    // Handshakes under way: when each began, and a handle to cut it short.
    let mut pending: Vec<(Instant, SocketAddr, TcpStream)> = Vec::new();
    let mut wrong_key = false;
    loop {
        // Take every connection waiting in the backlog.
        loop {
            match l.accept() {
                Ok((s, peer)) => {
                    if pending.len() >= MAX_PENDING {
                        // Full: the oldest gives way, so a flood of silent
                        // connections cannot lock the real sender out.
                        let (_, _, oldest) = pending.remove(0);
                        let _ = oldest.shutdown(std::net::Shutdown::Both);
                    }
                    let Ok(handle) = s.try_clone() else { continue };
                    let (tx, key) = (tx.clone(), opts.key.clone());
                    let spawned =
                        thread::Builder::new()
                            .name("ferry-handshake".into())
                            .spawn(move || {
                                let _ = tx.send((peer, handshake(s, &key)));
                            });
                    if spawned.is_ok() {
                        pending.push((Instant::now(), peer, handle));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if transient(&e) => {
                    thread::sleep(POLL);
                    break;
                }
                Err(e) => {
                    return Err(StreamError::new(
                        ErrorKind::Io,
                        format!("accept failed: {e}"),
                    ))
                }
            }
        }
        loop {
            match rx.try_recv() {
                Ok((peer, Ok(won))) => {
                    // The others are cut short (not the winner's handle).
                    for (_, p, h) in &pending {
                        if *p != peer {
                            let _ = h.shutdown(std::net::Shutdown::Both);
                        }
                    }
                    return Ok(won);
                }
                Ok((peer, Err(e))) => {
                    pending.retain(|(_, p, _)| *p != peer);
                    wrong_key |= e.kind == ErrorKind::WrongKey;
                    refused(peer, &e);
                }
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        // However it trickles bytes in, no handshake outlives its time.
        let now = Instant::now();
        for (t, _, h) in &pending {
            if now.duration_since(*t) > HANDSHAKE_TIMEOUT {
                let _ = h.shutdown(std::net::Shutdown::Both);
            }
        }
        if let (Some(d), Some(w)) = (deadline, wait) {
            if now >= d {
                let secs = w.as_secs_f64();
                return Err(if wrong_key {
                    StreamError::new(
                        ErrorKind::WrongKey,
                        format!("no sender proved the key within {secs:.0} s (wrong key)"),
                    )
                } else {
                    StreamError::new(
                        ErrorKind::Unreachable,
                        format!("no sender connected within {secs:.0} s"),
                    )
                });
            }
        }
        thread::sleep(POLL);
    }
}

/// Errors of `accept` that concern one connection or a passing shortage,
/// not the listener: wait and go on.
fn transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
    ) || rustix::io::Errno::from_io_error(e).is_some_and(|n| {
        use rustix::io::Errno;
        [
            Errno::MFILE,
            Errno::NFILE,
            Errno::NOBUFS,
            Errno::NOMEM,
            Errno::PROTO,
            Errno::NETDOWN,
            Errno::NETUNREACH,
            Errno::HOSTUNREACH,
            Errno::TIMEDOUT,
            Errno::PERM,
        ]
        .contains(&n)
    })
}

/// The responder's handshake on one accepted connection, bounded in time.
fn handshake(s: TcpStream, key: &ferry_channel::Psk) -> Result<(Session, TcpStream), StreamError> {
    let io_err = |e: io::Error| StreamError::new(ErrorKind::Io, format!("socket: {e}"));
    s.set_nonblocking(false).map_err(io_err)?;
    let _ = s.set_nodelay(true);
    s.set_read_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(io_err)?;
    s.set_write_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(io_err)?;
    let (mut r, mut w) = (
        s.try_clone().map_err(io_err)?,
        s.try_clone().map_err(io_err)?,
    );
    let session = ferry_channel::handshake(&mut r, &mut w, key, Role::Responder)
        .map_err(|e| channel_err(e, "handshake"))?;
    s.set_read_timeout(None).map_err(io_err)?;
    s.set_write_timeout(None).map_err(io_err)?;
    Ok((session, s))
}
