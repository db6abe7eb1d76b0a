//! The sending half of a striped session: chunks onto whichever
//! connection can take them.
//!
//! Each connection has a thread of its own that writes the chunks queued
//! for it (at most [`QUEUED`] waiting, besides the one being written), so
//! a connection whose window is small (slow start, a loss) never holds up
//! the others: a chunk goes to the next connection, round robin, whose
//! queue has room, and the caller waits only when every queue is full.

use std::io::{self, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;

use crossbeam_channel::{bounded, Receiver, Select, Sender, TrySendError};

use super::{CHUNK, HEADER};

/// Chunks waiting for each connection, besides the one being written.
const QUEUED: usize = 1;

/// What the connection threads share with the writer: chunks written so
/// far, and the first error.
#[derive(Default)]
struct Progress {
    state: Mutex<(u64, Option<io::Error>)>,
    changed: Condvar,
}

impl Progress {
    fn wrote(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.0 += 1;
        }
        self.changed.notify_all();
    }
    fn failed(&self, e: io::Error) {
        if let Ok(mut s) = self.state.lock() {
            s.1.get_or_insert(e);
        }
        self.changed.notify_all();
    }
    /// The first error, as a fresh `io::Error`.
    fn error(&self) -> Option<io::Error> {
        let s = self.state.lock().ok()?;
        s.1.as_ref()
            .map(|e| io::Error::new(e.kind(), e.to_string()))
    }
}

/// Writes the bytes given to it as chunks (at most [`CHUNK`] each) over
/// its connections; see the module docs for the format. `flush` waits
/// until every chunk is in the kernel's hands.
pub struct StripeWriter {
    lanes: Vec<Sender<Vec<u8>>>,
    /// Buffers the connection threads hand back.
    spare: Receiver<Vec<u8>>,
    progress: Arc<Progress>,
    seq: u64,
    /// Where the round robin looks first.
    turn: usize,
}

/// One connection's thread: write each chunk whole, hand its buffer back.
fn lane(mut s: TcpStream, rx: Receiver<Vec<u8>>, spare: Sender<Vec<u8>>, p: Arc<Progress>) {
    for chunk in rx {
        if let Err(e) = s.write_all(&chunk) {
            // The reader of the other side would wait for this chunk for
            // ever: end every direction of this connection.
            let _ = s.shutdown(Shutdown::Both);
            p.failed(e);
            return;
        }
        let _ = spare.try_send(chunk);
        p.wrote();
    }
}

impl StripeWriter {
    pub fn new(socks: Vec<TcpStream>) -> Self {
        let progress = Arc::new(Progress::default());
        let (spare_tx, spare) = bounded(socks.len() * (QUEUED + 1) + 1);
        let mut lanes = Vec::with_capacity(socks.len());
        for (i, s) in socks.into_iter().enumerate() {
            let (tx, rx) = bounded(QUEUED);
            let (spare_tx, p) = (spare_tx.clone(), progress.clone());
            let spawned = thread::Builder::new()
                .name(format!("ferry-stripe-{i}"))
                .spawn(move || lane(s, rx, spare_tx, p));
            if let Err(e) = spawned {
                progress.failed(e);
            }
            lanes.push(tx);
        }
        StripeWriter {
            lanes,
            spare,
            progress,
            seq: 0,
            turn: 0,
        }
    }

    /// Queue `chunk` on the next connection with room, waiting for one if
    /// none has.
    fn queue(&mut self, mut chunk: Vec<u8>) -> io::Result<()> {
        let n = self.lanes.len();
        for k in 0..n {
            let i = (self.turn + k) % n;
            match self.lanes[i].try_send(chunk) {
                Ok(()) => {
                    self.turn = (i + 1) % n;
                    return Ok(());
                }
                Err(TrySendError::Full(c)) => chunk = c,
                Err(TrySendError::Disconnected(_)) => return Err(self.failure()),
            }
        }
        let mut sel = Select::new();
        for l in &self.lanes {
            sel.send(l);
        }
        let op = sel.select();
        let i = op.index();
        op.send(&self.lanes[i], chunk).map_err(|_| self.failure())?;
        self.turn = (i + 1) % n;
        Ok(())
    }

    fn failure(&self) -> io::Error {
        self.progress
            .error()
            .unwrap_or_else(|| io::Error::new(io::ErrorKind::BrokenPipe, "a connection closed"))
    }
}

impl Write for StripeWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if let Some(e) = self.progress.error() {
            return Err(e);
        }
        let data = &buf[..buf.len().min(CHUNK)];
        let mut chunk = self.spare.try_recv().unwrap_or_default();
        chunk.clear();
        chunk.extend_from_slice(&self.seq.to_be_bytes());
        chunk.extend_from_slice(&(data.len() as u32).to_be_bytes());
        chunk.extend_from_slice(data);
        debug_assert_eq!(chunk.len(), HEADER + data.len());
        self.queue(chunk)?;
        self.seq += 1;
        Ok(data.len())
    }

    /// Wait until every chunk queued is written to its connection.
    fn flush(&mut self) -> io::Result<()> {
        let mut s = self
            .progress
            .state
            .lock()
            .map_err(|_| io::Error::other("a connection thread failed"))?;
        loop {
            if let Some(e) = &s.1 {
                return Err(io::Error::new(e.kind(), e.to_string()));
            }
            if s.0 >= self.seq {
                return Ok(());
            }
            s = self
                .progress
                .changed
                .wait(s)
                .map_err(|_| io::Error::other("a connection thread failed"))?;
        }
    }
}
