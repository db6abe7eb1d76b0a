//! What the CLI sets ([`Options`]), what it polls while a stream runs
//! ([`Stats`]) and what a finished stream reports ([`Summary`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use ferry_channel::{Psk, Suite};

use crate::*;

/// Options shared by send and recv.
#[derive(Clone)]
pub struct Options {
    pub key: Psk,
    pub compress: Mode,
    /// Ring buffer size in bytes (each side).
    pub buffer: usize,
    pub block_size: usize,
    /// Compressor threads (sender).
    pub workers: usize,
    pub connect_timeout: Duration,
    /// recv: how long to wait for a sender that proves the key (`None`:
    /// for ever).
    pub wait: Option<Duration>,
    /// A peer that sends nothing, not even a keepalive, for this long on
    /// an established stream is dead (`--timeout`; `None`: never). Both
    /// sides send a keepalive after [`KEEPALIVE`] with nothing to say, so
    /// a slow producer or consumer never trips it.
    pub idle: Option<Duration>,
    /// send: how many TCP connections the stream stripes over
    /// (`--streams`; the receiver takes what the sender opens).
    pub streams: ferry_link::stripe::Streams,
    pub stats: Arc<Stats>,
}

impl Options {
    pub fn new(key: Psk) -> Options {
        Options {
            key,
            compress: Mode::Auto,
            buffer: 256 << 20,
            block_size: MAX_BLOCK,
            workers: thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
                .min(4),
            connect_timeout: Duration::from_secs(10),
            wait: None,
            idle: None,
            streams: ferry_link::stripe::Streams::Auto,
            stats: Arc::default(),
        }
    }

    pub(crate) fn check(&self) -> Result<(), StreamError> {
        if !(MIN_BLOCK..=MAX_BLOCK).contains(&self.block_size) {
            return Err(StreamError::new(
                ErrorKind::Usage,
                format!("block size must be between {MIN_BLOCK} and {MAX_BLOCK} bytes"),
            ));
        }
        // Keepalives go out after KEEPALIVE of silence: a shorter timeout
        // would take a live peer for a dead one.
        if self.idle.is_some_and(|d| d < 2 * KEEPALIVE) {
            return Err(StreamError::new(
                ErrorKind::Usage,
                "the idle timeout must be at least 2 s",
            ));
        }
        Ok(())
    }

    /// How long each read of the handshake may wait: the idle timeout, and
    /// never longer than [`accept::HANDSHAKE_TIMEOUT`] (a peer that
    /// accepted the connection but says nothing is not one).
    pub(crate) fn handshake_wait(&self) -> Option<Duration> {
        Some(self.handshake_limit())
    }

    /// [`Self::handshake_wait`], as a plain duration.
    pub(crate) fn handshake_limit(&self) -> Duration {
        self.idle.map_or(accept::HANDSHAKE_TIMEOUT, |d| {
            d.min(accept::HANDSHAKE_TIMEOUT)
        })
    }

    /// The receiver's ring: the whole buffer (its other stages hold a
    /// block or two).
    pub(crate) fn ring_blocks(&self) -> usize {
        (self.buffer / self.block_size).max(2)
    }

    /// Blocks the sender holds outside its ring at most: the buffer pool,
    /// the queue of compressed and sealed blocks to the network writer
    /// (two buffers each), each compressor's block in hand (raw,
    /// compressed, sealed), the reader's and the writer's.
    pub(crate) fn send_stage_blocks(&self) -> usize {
        let w = self.workers.max(1);
        (w * 3 + 8) + (w * 2 + 2) * 2 + w * 3 + 4
    }

    /// The sender's ring: the buffer less what its other stages hold, so
    /// that all of them together stay within `--buffer` (the peak RSS is
    /// the buffer plus the compressors' contexts).
    pub(crate) fn send_ring_blocks(&self) -> usize {
        (self.buffer / self.block_size)
            .saturating_sub(self.send_stage_blocks())
            .max(2)
    }

    /// The live counters, with the capacity of a ring of `ring` blocks set
    /// for this run.
    pub(crate) fn run_stats(&self, ring: usize) -> Arc<Stats> {
        self.stats
            .buffer_cap
            .store((ring * self.block_size) as u64, Ordering::Relaxed);
        self.stats.clone()
    }
}

/// Live counters, shared with the CLI (which polls them for the status
/// line). Sender: `plain_in` = read from the producer, `plain_out` = handed
/// to the network. Receiver: `plain_in` = decoded from the network,
/// `plain_out` = written to the consumer.
#[derive(Debug, Default)]
pub struct Stats {
    pub plain_in: AtomicU64,
    pub plain_out: AtomicU64,
    /// Plaintext bytes of the blocks that crossed the wire.
    pub plain_wire: AtomicU64,
    /// Bytes on the wire in the data direction (frame headers and tags included).
    pub wire: AtomicU64,
    /// Plaintext bytes currently in the ring.
    pub buffered: AtomicU64,
    pub buffer_cap: AtomicU64,
    pub blocks_raw: AtomicU64,
    pub blocks_lz4: AtomicU64,
    pub blocks_zstd: AtomicU64,
    /// Bytes of the stream that an interrupted run had delivered already:
    /// not sent again (see `resume`).
    pub resumed: AtomicU64,
    /// The sender's estimate of what the link drains, bytes/s (0: unknown).
    pub link_rate: AtomicU64,
    /// TCP connections the stream runs over (0: not connected, or not
    /// over TCP).
    pub connections: AtomicU64,
    /// Set once the stream is complete or failed.
    pub done: AtomicBool,
}

impl Stats {
    pub(crate) fn add(a: &AtomicU64, n: u64) {
        a.fetch_add(n, Ordering::Relaxed);
    }
    pub(crate) fn sub(a: &AtomicU64, n: u64) {
        a.fetch_sub(n, Ordering::Relaxed);
    }
    pub fn get(a: &AtomicU64) -> u64 {
        a.load(Ordering::Relaxed)
    }
    /// Buffer fill in percent.
    pub fn fill_pct(&self) -> f64 {
        let cap = Self::get(&self.buffer_cap).max(1) as f64;
        (Self::get(&self.buffered) as f64 * 100.0 / cap).min(100.0)
    }
    /// Plain bytes / wire bytes so far (1.0 before any data).
    pub fn ratio(&self) -> f64 {
        let w = Self::get(&self.wire);
        if w == 0 {
            1.0
        } else {
            Self::get(&self.plain_wire) as f64 / w as f64
        }
    }
}

/// CPU time (user + system) this process used so far.
pub fn cpu_time() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// What a finished stream did.
#[derive(Debug, Clone)]
pub struct Summary {
    pub bytes: u64,
    pub wire_bytes: u64,
    pub elapsed: Duration,
    pub blake3: String,
    pub suite: String,
    /// Exit status of the remote command (pipe), from the receiver's ACK.
    pub remote_status: Option<i32>,
}

impl Summary {
    /// A stream of `bytes` whose BLAKE3 is `digest`, started at `start`.
    pub(crate) fn new(
        bytes: u64,
        digest: [u8; 32],
        stats: &Stats,
        start: Instant,
        suite: Suite,
        remote_status: Option<i32>,
    ) -> Summary {
        Summary {
            bytes,
            wire_bytes: Stats::get(&stats.wire),
            elapsed: start.elapsed(),
            blake3: blake3::Hash::from_bytes(digest).to_hex().to_string(),
            suite: suite.to_string(),
            remote_status,
        }
    }
}
