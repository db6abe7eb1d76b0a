//! Several connections to one export used as one ([`Pool`]): reads and
//! writes are cut into requests that are spread round-robin over the
//! connections and pipelined on each, so a server that handles each
//! connection on its own thread (qemu-nbd, nbdkit, a remote server behind a
//! long link) works on all of them at once.
//!
//! More connections are opened only when the server sets
//! `NBD_FLAG_CAN_MULTI_CONN` (the spec's promise that a FLUSH on one
//! connection covers writes acknowledged on all of them). A server may
//! still refuse them: qemu-nbd's default `--shared=1` leaves a second
//! connection in its listen queue, unanswered. Each extra connection is
//! therefore given a short handshake deadline (ten times what the first
//! handshake took, within 0.25 to 3 s) and the pool goes on with the ones
//! that answered.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::ahead::Ahead;
use crate::client::{wait_done, wait_into, Client, DEFAULT_REQUEST_SIZE};
use crate::conn::ConnectOptions;
use crate::error::Result;

/// One export over up to `n` connections; see the module doc.
#[derive(Clone, Debug)]
pub struct Pool {
    /// Distinct connections, the first one first.
    clients: Vec<Client>,
    /// Where the next request goes, so that calls of one request each
    /// (and calls from several threads) still spread over all connections.
    next: Arc<AtomicUsize>,
    /// Pieces asked for ahead of their reader ([`Pool::read_ahead_at`]).
    ahead: Arc<Ahead>,
}

impl Pool {
    /// Connects to `uri` and, if the server allows multi-conn, opens up to
    /// `n - 1` more connections (those that do not answer in time are
    /// left out).
    pub fn connect(uri: &str, n: usize) -> Result<Pool> {
        let t0 = Instant::now();
        let first = Client::connect(uri)?;
        Ok(Self::grow(first, n, t0.elapsed()))
    }

    /// A pool of `first` and up to `n - 1` more connections to its export;
    /// `took` is how long `first`'s connect and handshake took.
    pub fn grow(first: Client, n: usize, took: Duration) -> Pool {
        let mut clients = vec![first];
        let first = &clients[0];
        if n <= 1 || !first.can_multi_conn() {
            return Pool::of(clients);
        }
        let deadline = extra_deadline(took);
        let opts = ConnectOptions {
            connect_timeout: deadline,
            ..first.options().clone()
        };
        // Each attempt on a thread of its own, waited for until the
        // deadline as a whole: a connect() into a full listen queue or a
        // handshake dripped byte by byte is abandoned, not joined (the
        // thread drops its connection when it ends).
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 1..n {
            let (tx, uri, opts) = (tx.clone(), first.uri().clone(), opts.clone());
            let spawned = std::thread::Builder::new()
                .name("ferry-nbd-connect".into())
                .spawn(move || {
                    let _ = tx.send(Client::connect_uri(&uri, opts));
                });
            if spawned.is_err() {
                break;
            }
        }
        drop(tx);
        let until = Instant::now() + deadline;
        let mut extra = Vec::new();
        while let Ok(r) = rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
            // The same export, as the first connection saw it.
            match r {
                Ok(c) if c.size() == first.size() && c.read_only() == first.read_only() => {
                    extra.push(c)
                }
                _ => {}
            }
        }
        clients.extend(extra);
        Pool::of(clients)
    }

    fn of(clients: Vec<Client>) -> Pool {
        Pool {
            clients,
            next: Arc::new(AtomicUsize::new(0)),
            ahead: Arc::default(),
        }
    }

    pub(crate) fn ahead(&self) -> &Ahead {
        &self.ahead
    }

    /// The size of one request (the server's largest, at most 1 MiB).
    pub(crate) fn request_size(&self) -> usize {
        shape(&self.clients).0
    }

    /// The connection the next of `n` requests goes to.
    pub(crate) fn next_client(&self, n: usize) -> &Client {
        &self.clients[self.start(n) % self.clients.len()]
    }

    /// Where a call of `n` requests starts.
    fn start(&self, n: usize) -> usize {
        self.next.fetch_add(n, Ordering::Relaxed)
    }

    /// The distinct connections, the first one first.
    pub fn clients(&self) -> &[Client] {
        &self.clients
    }

    /// How many connections the pool uses.
    pub fn connections(&self) -> usize {
        self.clients.len()
    }

    /// The first connection (for size, flags, extents, zeroing, flush).
    pub fn first(&self) -> &Client {
        &self.clients[0]
    }

    /// Reads `buf.len()` bytes at `offset` over all connections.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let start = self.start(buf.len().div_ceil(shape(&self.clients).0));
        read_spread(&self.clients, start, offset, buf)
    }

    /// Writes `data` at `offset` over all connections; returns once every
    /// request is acknowledged.
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.ahead.forget(offset, data.len() as u64);
        let start = self.start(data.len().div_ceil(shape(&self.clients).0));
        write_spread(&self.clients, start, offset, data)
    }

    /// Makes `[offset, offset + len)` read as zeros (see
    /// [`Client::write_zeroes`]).
    pub fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        self.ahead.forget(offset, len);
        self.first().write_zeroes(offset, len)
    }

    /// FLUSH. With multi-conn, one connection's FLUSH covers the writes
    /// acknowledged on all of them; without it the pool has one connection.
    pub fn flush(&self) -> Result<()> {
        self.first().flush()
    }
}

/// How long an extra connection may take to answer: ten times the first
/// handshake, within 0.25 to 3 s.
fn extra_deadline(took: Duration) -> Duration {
    (took * 10).clamp(Duration::from_millis(250), Duration::from_secs(3))
}

/// Requests in flight over `clients` together, and their size.
fn shape(clients: &[Client]) -> (usize, usize) {
    let rs = clients
        .iter()
        .map(|c| c.request_size(DEFAULT_REQUEST_SIZE))
        .min()
        .unwrap_or(1);
    let depth = clients.iter().map(Client::pipeline_depth).sum::<usize>();
    (rs, depth.max(1))
}

/// Reads `buf` at `offset` in requests spread round-robin over `clients`,
/// the first one to `clients[start % len]`.
pub(crate) fn read_spread(
    clients: &[Client],
    start: usize,
    offset: u64,
    buf: &mut [u8],
) -> Result<()> {
    let (rs, depth) = shape(clients);
    let mut queue = VecDeque::new();
    let mut chunks = buf.chunks_mut(rs).enumerate();
    loop {
        while queue.len() < depth {
            let Some((i, c)) = chunks.next() else { break };
            let at = offset + (i * rs) as u64;
            let t = clients[(start + i) % clients.len()]
                .connection()
                .submit_read(at, crate::spare::read_buf(c.len()))?;
            queue.push_back((c, t));
        }
        let Some((c, t)) = queue.pop_front() else {
            return Ok(());
        };
        wait_into(t, c)?;
    }
}

/// Writes `data` at `offset` in requests spread round-robin over
/// `clients` (the first to `clients[start % len]`); returns when all are
/// acknowledged.
pub(crate) fn write_spread(
    clients: &[Client],
    start: usize,
    offset: u64,
    data: &[u8],
) -> Result<()> {
    let (rs, depth) = shape(clients);
    let mut queue = VecDeque::new();
    for (i, c) in data.chunks(rs).enumerate() {
        if queue.len() >= depth {
            if let Some(t) = queue.pop_front() {
                wait_done(t)?;
            }
        }
        let at = offset + (i * rs) as u64;
        queue.push_back(
            clients[(start + i) % clients.len()]
                .connection()
                .submit_write(at, c, false)?,
        );
    }
    queue.into_iter().try_for_each(wait_done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_connections_wait_briefly() {
        assert_eq!(
            extra_deadline(Duration::from_micros(300)),
            Duration::from_millis(250)
        );
        assert_eq!(
            extra_deadline(Duration::from_millis(40)),
            Duration::from_millis(400)
        );
        assert_eq!(
            extra_deadline(Duration::from_secs(2)),
            Duration::from_secs(3)
        );
    }
}
