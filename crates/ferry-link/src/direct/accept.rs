//! Waiting for the client that proves the key.
//!
//! The listening port is one anyone may reach. A connection that sends
//! garbage, the wrong key or nothing at all must neither end the wait nor
//! hold it up: each accepted connection does its handshake on a thread of
//! its own (at most [`MAX_PENDING`] at once, the oldest giving way to a
//! newcomer, each cut short after [`HANDSHAKE_TIMEOUT`] however it trickles
//! bytes in), failures are reported and dropped, and the first connection
//! that completes the handshake is the session; or, when the client
//! stripes its session over several connections, the first session all of
//! whose connections completed it ([`crate::stripe::Groups`]).

use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use ferry_channel::{ChannelError, Join, Psk, Role, Session};

use super::{handshake_tcp_join, HANDSHAKE_TIMEOUT};
use crate::stripe::{Conn, Groups, Joined};

/// Handshakes under way at once; beyond that the oldest is cut short (a
/// flood of silent connections costs at most this many threads). Well
/// above the connections of one striped session, so a client's own
/// connections do not push each other out.
pub const MAX_PENDING: usize = 64;

/// How often the listener is polled while handshakes run.
const POLL: Duration = Duration::from_millis(20);

/// How the wait ended well.
pub enum Accepted {
    /// A client proved the key: its session, and its connection or
    /// connections (blocking, without timeouts).
    Peer(Session, Conn),
    /// `stop` said so (the client chose ssh's pipes instead).
    Stopped,
}

/// How the wait ended badly.
#[derive(Debug, thiserror::Error)]
pub enum AcceptError {
    /// The listener itself failed.
    #[error("accept failed: {0}")]
    Listener(io::Error),
    /// Nobody proved the key within `waited`. `wrong_key`: some connection
    /// failed the key.
    #[error("no peer proved the key within {} s", .waited.as_secs_f64().round())]
    NoPeer { waited: Duration, wrong_key: bool },
}

impl AcceptError {
    /// Whether trying again could help: a client that did not come may
    /// come next time; one with the wrong key, or a broken listener, not.
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            AcceptError::NoPeer {
                wrong_key: false,
                ..
            }
        )
    }
}

type Attempt = (
    SocketAddr,
    Result<(Session, TcpStream, Option<Join>), ChannelError>,
);

/// Accept connections on `l` until one completes the handshake with `psk`
/// (as the responder), or `stop()` says to stop waiting. `refused` is
/// handed the failure of every connection that failed. With `wait`, give
/// up after that long.
pub fn accept_authenticated(
    l: &TcpListener,
    psk: &Psk,
    wait: Option<Duration>,
    refused: &mut dyn FnMut(SocketAddr, ChannelError),
    stop: &dyn Fn() -> bool,
) -> Result<Accepted, AcceptError> {
    l.set_nonblocking(true).map_err(AcceptError::Listener)?;
    let res = Waiting::new(psk).run(l, wait, refused, stop);
    let _ = l.set_nonblocking(false);
    res
}

/// The handshakes under way.
struct Waiting<'a> {
    psk: &'a Psk,
    tx: mpsc::Sender<Attempt>,
    rx: mpsc::Receiver<Attempt>,
    /// When each began, and a handle to cut it short.
    pending: Vec<(Instant, SocketAddr, TcpStream)>,
    /// Striped sessions gathering their connections.
    groups: Groups,
    wrong_key: bool,
}

impl<'a> Waiting<'a> {
    fn new(psk: &'a Psk) -> Self {
        let (tx, rx) = mpsc::channel();
        Waiting {
            psk,
            tx,
            rx,
            pending: Vec::new(),
            groups: Groups::new(HANDSHAKE_TIMEOUT),
            wrong_key: false,
        }
    }

    fn run(
        mut self,
        l: &TcpListener,
        wait: Option<Duration>,
        refused: &mut dyn FnMut(SocketAddr, ChannelError),
        stop: &dyn Fn() -> bool,
    ) -> Result<Accepted, AcceptError> {
        let deadline = wait.map(|w| Instant::now() + w);
        loop {
            if stop() {
                self.cut_all_but(None);
                return Ok(Accepted::Stopped);
            }
            self.take_backlog(l)?;
            if let Some(won) = self.collect(refused) {
                return Ok(won);
            }
            self.groups.expire();
            // However it trickles bytes in, no handshake outlives its time
            // (and one cut short is no longer pending: whatever its thread
            // reports is dropped).
            let now = Instant::now();
            self.pending.retain(|(t, _, h)| {
                let keep = now.duration_since(*t) <= HANDSHAKE_TIMEOUT;
                if !keep {
                    let _ = h.shutdown(Shutdown::Both);
                }
                keep
            });
            if let (Some(d), Some(w)) = (deadline, wait) {
                if now >= d {
                    self.cut_all_but(None);
                    return Err(AcceptError::NoPeer {
                        waited: w,
                        wrong_key: self.wrong_key,
                    });
                }
            }
            thread::sleep(POLL);
        }
    }

    /// Start a handshake for every connection waiting in the backlog.
    fn take_backlog(&mut self, l: &TcpListener) -> Result<(), AcceptError> {
        loop {
            match l.accept() {
                Ok((s, peer)) => self.start(s, peer),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if transient(&e) => {
                    thread::sleep(POLL);
                    return Ok(());
                }
                Err(e) => return Err(AcceptError::Listener(e)),
            }
        }
    }

    fn start(&mut self, s: TcpStream, peer: SocketAddr) {
        if self.pending.len() >= MAX_PENDING {
            // Full: the oldest gives way, so a flood of silent
            // connections cannot lock the real client out.
            let (_, _, oldest) = self.pending.remove(0);
            let _ = oldest.shutdown(Shutdown::Both);
        }
        let Ok(handle) = s.try_clone() else { return };
        let (tx, psk) = (self.tx.clone(), self.psk.clone());
        let spawned = thread::Builder::new()
            .name("ferry-handshake".into())
            .spawn(move || {
                let res = handshake_tcp_join(s, &psk, Role::Responder, HANDSHAKE_TIMEOUT, None);
                let _ = tx.send((peer, res));
            });
        if spawned.is_ok() {
            self.pending.push((Instant::now(), peer, handle));
        }
    }

    /// The handshakes that ended: the first that succeeded, if any.
    fn collect(&mut self, refused: &mut dyn FnMut(SocketAddr, ChannelError)) -> Option<Accepted> {
        while let Ok((peer, res)) = self.rx.try_recv() {
            // A connection cut short (pushed out by newer ones, or out of
            // time) may still have finished its handshake: its socket is
            // shut, so it is nobody's session.
            let Some(k) = self.pending.iter().position(|(_, p, _)| *p == peer) else {
                continue;
            };
            self.pending.remove(k);
            match res {
                Ok((session, s, None)) => {
                    self.cut_all_but(Some(peer));
                    return Some(Accepted::Peer(session, Conn::single(s)));
                }
                Ok((session, s, Some(join))) => match self.groups.add(join, session, s) {
                    Joined::Waiting => {}
                    Joined::Complete(session, conn) => {
                        self.cut_all_but(None);
                        return Some(Accepted::Peer(session, conn));
                    }
                    Joined::Refused(why) => refused(peer, ChannelError::Handshake(why)),
                },
                Err(e) => {
                    self.wrong_key |= matches!(e, ChannelError::WrongKey);
                    refused(peer, e);
                }
            }
        }
        None
    }

    /// Cut short every handshake under way (but the winner's).
    fn cut_all_but(&self, winner: Option<SocketAddr>) {
        for (_, p, h) in &self.pending {
            if Some(*p) != winner {
                let _ = h.shutdown(Shutdown::Both);
            }
        }
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
