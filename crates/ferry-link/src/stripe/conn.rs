//! A session's connections, and its incoming and outgoing bytes over them.
//!
//! A striped session has one [`StripeReader`] and one [`StripeWriter`]
//! for its whole life, shared by every reader and writer handle made from
//! it: a daemon's stream follows its request on the same connections, and
//! the chunks' numbers go on, and what the reader took in ahead stays
//! there for the next handle.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_channel::IdleRead;

use super::{StripeReader, StripeWriter};

/// The one reader and writer of a striped session.
pub struct Stripe {
    r: Mutex<StripeReader>,
    w: Mutex<StripeWriter>,
}

/// The connections of one session, in join order (one, or 2 ..=
/// [`super::MAX_STREAMS`]).
pub struct Conn {
    socks: Vec<TcpStream>,
    stripe: Option<Arc<Stripe>>,
}

fn clones(socks: &[TcpStream]) -> io::Result<Vec<TcpStream>> {
    socks.iter().map(TcpStream::try_clone).collect()
}

fn poisoned() -> io::Error {
    io::Error::other("a thread of the session failed")
}

impl Conn {
    /// A session on one connection.
    pub fn single(s: TcpStream) -> Conn {
        Conn {
            socks: vec![s],
            stripe: None,
        }
    }

    /// A session on these connections, in `index` order (the writer's
    /// threads start now).
    pub fn striped(socks: Vec<TcpStream>) -> io::Result<Conn> {
        let stripe = Stripe {
            r: Mutex::new(StripeReader::new(clones(&socks)?, None)),
            w: Mutex::new(StripeWriter::new(clones(&socks)?)),
        };
        Ok(Conn {
            socks,
            stripe: Some(Arc::new(stripe)),
        })
    }

    /// The connection, if there is only one.
    pub fn only(&self) -> Option<&TcpStream> {
        match self.socks.as_slice() {
            [s] => Some(s),
            _ => None,
        }
    }

    /// How many connections.
    pub fn count(&self) -> usize {
        self.socks.len()
    }

    /// The peer's address (connection 0's).
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.socks[0].peer_addr()
    }

    /// The session's incoming bytes, with an idle timeout (`None`: wait
    /// for ever) that [`ConnRead::set_idle`] can change.
    pub fn reader(&self, idle: Option<Duration>) -> io::Result<ConnRead> {
        Ok(match &self.stripe {
            None => ConnRead::One(IdleRead::new(self.socks[0].try_clone()?, idle)),
            Some(s) => ConnRead::Many(s.clone(), idle),
        })
    }

    /// The session's outgoing bytes.
    pub fn writer(&self) -> io::Result<ConnWrite> {
        Ok(match &self.stripe {
            None => ConnWrite::One(self.socks[0].try_clone()?),
            Some(s) => ConnWrite::Many(s.clone()),
        })
    }

    /// Another handle on the same connections (to shut them from another
    /// thread).
    pub fn try_clone(&self) -> io::Result<Conn> {
        Ok(Conn {
            socks: clones(&self.socks)?,
            stripe: self.stripe.clone(),
        })
    }

    /// Shut every connection (`Write`: the end of what this side sends,
    /// after all it wrote; `Both`: unblock everything, on failure).
    pub fn shutdown(&self, how: Shutdown) {
        for s in &self.socks {
            let _ = s.shutdown(how);
        }
    }
}

/// A session's incoming bytes: the connection, or the chunks of all of
/// them in order (with this handle's idle timeout).
pub enum ConnRead {
    One(IdleRead<TcpStream>),
    Many(Arc<Stripe>, Option<Duration>),
}

impl ConnRead {
    /// How long a silence may last before a read fails with `TimedOut`.
    pub fn set_idle(&mut self, idle: Option<Duration>) {
        match self {
            ConnRead::One(r) => r.set_idle(idle),
            ConnRead::Many(_, i) => *i = idle,
        }
    }
}

impl Read for ConnRead {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            ConnRead::One(r) => r.read(buf),
            ConnRead::Many(s, idle) => {
                let mut r = s.r.lock().map_err(|_| poisoned())?;
                r.set_idle(*idle);
                r.read(buf)
            }
        }
    }
}

/// A session's outgoing bytes.
pub enum ConnWrite {
    One(TcpStream),
    Many(Arc<Stripe>),
}

impl Write for ConnWrite {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            ConnWrite::One(w) => w.write(buf),
            ConnWrite::Many(s) => s.w.lock().map_err(|_| poisoned())?.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            ConnWrite::One(w) => w.flush(),
            ConnWrite::Many(s) => s.w.lock().map_err(|_| poisoned())?.flush(),
        }
    }
}
