//! [`Connection`]: connecting (socket, handshake, reader thread), its
//! accessors, and disconnecting. The `submit_*` methods are in `pipeline`.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::handshake::handshake;
use super::info::{ConnectOptions, ExportInfo};
use super::lock;
use super::reader;
use super::socket::{open_socket, Sock};
use super::state::{Dead, Shared};
use crate::error::{Error, Result};
use crate::proto::*;
use crate::uri::NbdUri;

/// One NBD connection in the transmission phase. Share it between threads
/// with `Arc`; each method submits one request and returns a [`Ticket`](super::Ticket).
pub struct Connection {
    pub(super) info: ExportInfo,
    pub(super) writer: Mutex<Sock>,
    pub(super) shared: Arc<Shared>,
    reader: Mutex<Option<JoinHandle<()>>>,
    pub(super) next_cookie: AtomicU64,
    pub(super) opts: ConnectOptions,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("info", &self.info)
            .finish()
    }
}

impl Connection {
    /// Connects, negotiates, and starts the reply reader thread.
    pub fn connect(uri: &NbdUri, opts: &ConnectOptions) -> Result<Connection> {
        let mut sock = open_socket(uri, opts.connect_timeout)?;
        let t = Some(opts.connect_timeout.max(Duration::from_millis(1)));
        sock.set_read_timeout(t)
            .and_then(|_| sock.set_write_timeout(t))
            .map_err(|e| Error::io("setting socket timeouts", e))?;
        let info = handshake(&mut sock, &uri.export, opts)?;
        Self::start(sock, info, opts)
    }

    fn start(sock: Sock, info: ExportInfo, opts: &ConnectOptions) -> Result<Connection> {
        let io_timeout = opts.io_timeout.max(Duration::from_millis(10));
        sock.set_write_timeout(Some(io_timeout))
            .map_err(|e| Error::io("setting socket timeouts", e))?;
        let rsock = sock
            .try_clone()
            .map_err(|e| Error::io("cloning socket", e))?;
        // The reader wakes up regularly to check for timeouts and close.
        rsock
            .set_read_timeout(Some(io_timeout.min(Duration::from_millis(250))))
            .map_err(|e| Error::io("setting socket timeouts", e))?;
        let killer = sock
            .try_clone()
            .map_err(|e| Error::io("cloning socket", e))?;
        let shared = Arc::new(Shared::new(opts.max_in_flight.max(1), killer));
        let handle = reader::spawn(
            rsock,
            shared.clone(),
            info.structured,
            info.base_allocation,
            io_timeout,
        )
        .map_err(|e| Error::io("spawning the NBD reader thread", e))?;
        Ok(Connection {
            info,
            writer: Mutex::new(sock),
            shared,
            reader: Mutex::new(Some(handle)),
            next_cookie: AtomicU64::new(1),
            opts: opts.clone(),
        })
    }

    /// What the handshake established.
    pub fn info(&self) -> &ExportInfo {
        &self.info
    }

    /// The options this connection was opened with.
    pub fn options(&self) -> &ConnectOptions {
        &self.opts
    }

    /// Requests currently in flight.
    pub fn in_flight(&self) -> usize {
        lock(&self.shared.state).in_flight
    }

    /// The error that killed the connection, if it is dead.
    pub fn dead_error(&self) -> Option<Error> {
        lock(&self.shared.state).dead.as_ref().map(Dead::to_error)
    }

    /// Sends NBD_CMD_DISC after the requests in flight completed (waits at
    /// most the I/O timeout for them), then closes the socket. Idempotent.
    pub fn disconnect(&self) {
        if self.shared.closing.swap(true, Ordering::SeqCst) {
            return;
        }
        let deadline = Instant::now() + self.opts.io_timeout;
        {
            let mut st = lock(&self.shared.state);
            while st.in_flight > 0 && st.dead.is_none() && Instant::now() < deadline {
                let (g, _) = self
                    .shared
                    .space
                    .wait_timeout(st, Duration::from_millis(100))
                    .unwrap_or_else(|p| p.into_inner());
                st = g;
            }
        }
        let alive = lock(&self.shared.state).dead.is_none();
        if alive {
            let hdr = encode_request(0, CMD_DISC, 0, 0, 0);
            let _ = lock(&self.writer).write_all(&hdr);
        }
        self.shared.fail(Dead::Closed);
        if let Some(h) = lock(&self.reader).take() {
            let _ = h.join();
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.disconnect();
    }
}
