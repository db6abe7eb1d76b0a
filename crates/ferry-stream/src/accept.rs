//! Waiting for a sender that proves the key.
//!
//! `recv` listens on a port anyone can reach. A connection that sends
//! garbage, the wrong key or nothing at all must neither end the wait nor
//! hold it up: each accepted connection does its handshake on a thread of
//! its own (at most [`MAX_PENDING`] at once, each with
//! [`HANDSHAKE_TIMEOUT`]), failures are reported and dropped, and the first
//! connection that completes the handshake is the stream. Nothing is
//! written and no command is started before that.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, TryRecvError};
use ferry_channel::{Role, Session};

use crate::{channel_err, ErrorKind, Options, StreamError};

/// How long an accepted connection may take to complete the handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// Handshakes under way at once; a connection beyond that is closed at
/// once (a flood of silent connections costs at most this many threads).
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
    let pending = Arc::new(AtomicUsize::new(0));
    let mut wrong_key = false;
    loop {
        match l.accept() {
            Ok((s, peer)) if pending.load(Ordering::SeqCst) < MAX_PENDING => {
                pending.fetch_add(1, Ordering::SeqCst);
                let (tx, done, key) = (tx.clone(), pending.clone(), opts.key.clone());
                let spawned =
                    thread::Builder::new()
                        .name("ferry-handshake".into())
                        .spawn(move || {
                            let _ = tx.send((peer, handshake(s, &key)));
                            done.fetch_sub(1, Ordering::SeqCst);
                        });
                if spawned.is_err() {
                    pending.fetch_sub(1, Ordering::SeqCst);
                }
            }
            // Too many handshakes under way: this one is dropped unheard.
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(StreamError::new(
                    ErrorKind::Io,
                    format!("accept failed: {e}"),
                ))
            }
        }
        loop {
            match rx.try_recv() {
                Ok((_, Ok(won))) => return Ok(won),
                Ok((peer, Err(e))) => {
                    wrong_key |= e.kind == ErrorKind::WrongKey;
                    refused(peer, &e);
                }
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        if let (Some(d), Some(w)) = (deadline, wait) {
            if Instant::now() >= d {
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
