//! The engine of `ferry send`, `ferry recv` and `ferry pipe`: one byte
//! stream (a `zfs send`, a tar, any pipe) moved to another host at line
//! rate, authenticated and encrypted.
//!
//! ```text
//! sender:   reader thread -> ring (--buffer) -> compressor workers -> net writer
//!                                                  (reordered by seq)      |
//!                                                         ferry-channel (AEAD frames)
//!                                                                          v
//! receiver: net reader (decrypt + decompress) -> ring (--buffer) -> writer thread
//! ```
//!
//! The engine prints nothing; it reports through [`Stats`] (atomics the CLI
//! polls) and returns a [`Summary`] or a [`StreamError`] whose
//! [`ErrorKind`] tells the CLI which exit code to use.
//!
//! # Messages (payloads of channel frames)
//!
//! Sender to receiver:
//!
//! ```text
//! 0x01 BLOCK  codec u8 | level-or-stream u8 | raw_len u32 LE | payload
//!             codec 0 raw, 1 lz4, 2 zstd frame (then: level i8);
//!             3 / 4 a block of compressor <stream>'s zstd stream,
//!             continuing / starting it (then: stream u8, < 64); stream
//!             blocks are decoded in wire order, one decoder per stream
//! 0x02 END    total u64 LE | blake3(plaintext) 32
//! 0x03 ABORT  reason (UTF-8): the producer failed; the receiver exits non-zero
//! ```
//!
//! then the channel's authenticated end frame. Receiver to sender:
//!
//! ```text
//! 0x10 ACK    total u64 LE | blake3 32 | status i32 LE (i32::MIN: no command)
//! 0x11 FAIL   kind u8 (see [`ErrorKind::code`]) | status i32 LE | message (UTF-8)
//! ```
//!
//! ACK is sent only after the output was flushed and closed (and, for
//! `pipe`, the command exited), so a sender that got it knows the data
//! arrived whole. Both sides compare byte count and digest.
//!
//! Both sides send the channel's keepalive frames after [`KEEPALIVE`]
//! with nothing to say (the sender while its producer is slow, the
//! receiver until its verdict), and with [`Options::idle`] read through
//! [`IdleRead`], so a silent peer is dead after `--timeout` and a busy one
//! is not. docs/PROTOCOL.md has the bytes.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, unbounded, Receiver, RecvTimeoutError, Sender};
use ferry_channel::{
    ChannelError, ChannelReader, ChannelWriter, Frame, IdleRead, Psk, Role, Suite,
};
pub use ferry_compress::{Codec, Mode};
pub use output::FileOut;

pub mod accept;
mod output;

/// Largest block size (so a block plus its header fits a channel frame).
pub const MAX_BLOCK: usize = 1 << 20;
/// Smallest block size accepted.
pub const MIN_BLOCK: usize = 4 << 10;
const HEAD: usize = 7;
/// A side with nothing to send for this long sends a keepalive frame.
pub const KEEPALIVE: Duration = Duration::from_secs(1);

mod msg {
    pub const BLOCK: u8 = 0x01;
    pub const END: u8 = 0x02;
    pub const ABORT: u8 = 0x03;
    pub const ACK: u8 = 0x10;
    pub const FAIL: u8 = 0x11;
}

/// What went wrong, coarse enough to pick an exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Bad options (block size, key).
    Usage,
    /// The peer does not hold the same key.
    WrongKey,
    /// The listen address is taken.
    AddrInUse,
    /// Connecting failed (refused, unreachable, timed out).
    Unreachable,
    /// The local consumer stopped reading (EPIPE on our output).
    ConsumerExited,
    /// The remote consumer stopped reading.
    PeerConsumerExited,
    /// Reading the input failed (locally, or at the sender).
    ProducerFailed,
    /// The peer went away mid-stream (connection lost, stream truncated).
    PeerKilled,
    /// A frame failed authentication, or the end-of-stream total or digest
    /// did not match, or the peer broke the protocol.
    Integrity,
    /// Local I/O error (output file, socket setup).
    Io,
    /// The peer sent nothing, not even a keepalive, for `--timeout`.
    TimedOut,
}

impl ErrorKind {
    /// Wire code in FAIL messages.
    pub fn code(self) -> u8 {
        self as u8
    }

    fn from_code(c: u8) -> ErrorKind {
        use ErrorKind::*;
        [
            Usage,
            WrongKey,
            AddrInUse,
            Unreachable,
            ConsumerExited,
            PeerConsumerExited,
            ProducerFailed,
            PeerKilled,
            Integrity,
            Io,
            TimedOut,
        ]
        .get(c as usize)
        .copied()
        .unwrap_or(Integrity)
    }
}

/// An error of the stream engine.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{msg}")]
pub struct StreamError {
    pub kind: ErrorKind,
    pub msg: String,
    /// Exit status of the remote command, when the peer reported one.
    pub remote_status: Option<i32>,
}

impl StreamError {
    pub fn new(kind: ErrorKind, msg: impl Into<String>) -> StreamError {
        StreamError {
            kind,
            msg: msg.into(),
            remote_status: None,
        }
    }
}

fn channel_err(e: ChannelError, what: &str) -> StreamError {
    match e {
        ChannelError::WrongKey => StreamError::new(ErrorKind::WrongKey, e.to_string()),
        ChannelError::KeyTooShort(_) => StreamError::new(ErrorKind::Usage, e.to_string()),
        ChannelError::Truncated => {
            StreamError::new(ErrorKind::PeerKilled, format!("stream truncated: {what}"))
        }
        ChannelError::BadHello(_) => StreamError::new(ErrorKind::Unreachable, e.to_string()),
        ChannelError::Io(ref io) => match io.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                StreamError::new(ErrorKind::TimedOut, format!("{what}: {io}"))
            }
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionAborted => StreamError::new(
                ErrorKind::PeerKilled,
                format!("stream truncated: {what}: {e}"),
            ),
            _ => StreamError::new(ErrorKind::Io, format!("{what}: {e}")),
        },
        other => StreamError::new(ErrorKind::Integrity, format!("{what}: {other}")),
    }
}

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
            stats: Arc::default(),
        }
    }

    fn check(&self) -> Result<(), StreamError> {
        if !(MIN_BLOCK..=MAX_BLOCK).contains(&self.block_size) {
            return Err(StreamError::new(
                ErrorKind::Usage,
                format!("block size must be between {MIN_BLOCK} and {MAX_BLOCK} bytes"),
            ));
        }
        Ok(())
    }

    fn ring_blocks(&self) -> usize {
        (self.buffer / self.block_size).max(2)
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
    /// The sender's estimate of what the link drains, bytes/s (0: unknown).
    pub link_rate: AtomicU64,
    /// Set once the stream is complete or failed.
    pub done: AtomicBool,
}

impl Stats {
    fn add(a: &AtomicU64, n: u64) {
        a.fetch_add(n, Ordering::Relaxed);
    }
    fn sub(a: &AtomicU64, n: u64) {
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

// ---------------------------------------------------------------- sockets

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

/// Accept one connection.
pub fn accept(l: &TcpListener) -> Result<TcpStream, StreamError> {
    let (s, _) = l
        .accept()
        .map_err(|e| StreamError::new(ErrorKind::Io, format!("accept failed: {e}")))?;
    let _ = s.set_nodelay(true);
    Ok(s)
}

/// Connect to the receiver.
pub fn connect(peer: SocketAddr, timeout: Duration) -> Result<TcpStream, StreamError> {
    let s = TcpStream::connect_timeout(&peer, timeout).map_err(|e| {
        StreamError::new(
            ErrorKind::Unreachable,
            format!("cannot connect to {peer}: {e}"),
        )
    })?;
    let _ = s.set_nodelay(true);
    Ok(s)
}

fn split(s: TcpStream) -> Result<(TcpStream, TcpStream, TcpStream), StreamError> {
    let c = |e: io::Error| StreamError::new(ErrorKind::Io, format!("socket: {e}"));
    let r = s.try_clone().map_err(c)?;
    let ctl = s.try_clone().map_err(c)?;
    Ok((r, s, ctl))
}

// ---------------------------------------------------------------- sender

enum JobKind {
    /// `sealed`: the whole channel frame, sealed by the worker with frame
    /// number = seq (empty: the writer seals it).
    Block {
        raw: Vec<u8>,
        comp: Vec<u8>,
        codec: Codec,
        /// The BLOCK header (made with the codec by the worker).
        head: [u8; HEAD],
        sealed: Vec<u8>,
    },
    End {
        total: u64,
        digest: [u8; 32],
    },
    Abort(String),
}

struct Job {
    seq: u64,
    kind: JobKind,
}

enum SendEv {
    WriterDone {
        total: u64,
        digest: [u8; 32],
    },
    WriterErr(StreamError),
    Ack {
        total: u64,
        digest: [u8; 32],
        status: Option<i32>,
    },
    PeerFail(StreamError),
    CtlErr(StreamError),
    Producer(String),
}

/// Connect to `peer` and send everything `input` produces.
pub fn send<R: Read + Send + 'static>(
    opts: &Options,
    input: R,
    peer: SocketAddr,
) -> Result<Summary, StreamError> {
    opts.check()?;
    let s = connect(peer, opts.connect_timeout)?;
    let (r, w, ctl) = split(s)?;
    let abort = move || {
        let _ = ctl.shutdown(std::net::Shutdown::Both);
    };
    send_over(opts, input, r, w, Some(Box::new(abort)))
}

/// Send over any connected byte pipe (TCP halves, ssh's stdout/stdin).
/// `abort` is called to unblock the transport when the stream fails. With
/// `opts.idle`, a receiver that sends nothing (it sends a keepalive every
/// [`KEEPALIVE`] while it has nothing to say) for that long is dead.
pub fn send_over<R, NR, NW>(
    opts: &Options,
    input: R,
    mut net_r: NR,
    mut net_w: NW,
    abort: Option<Box<dyn Fn() + Send>>,
) -> Result<Summary, StreamError>
where
    R: Read + Send + 'static,
    NR: Read + AsFd + Send + 'static,
    NW: Write + Send + 'static,
{
    opts.check()?;
    let start = Instant::now();
    let session = ferry_channel::handshake(&mut net_r, &mut net_w, &opts.key, Role::Initiator)
        .map_err(|e| channel_err(e, "handshake"))?;
    let suite = session.suite;
    let chan_r = ChannelReader::new(IdleRead::new(net_r, opts.idle), &session);
    let chan_w = ChannelWriter::new(net_w, &session);
    let stats = opts.stats.clone();
    stats.buffer_cap.store(
        (opts.ring_blocks() * opts.block_size) as u64,
        Ordering::Relaxed,
    );

    let (ev_tx, ev_rx) = unbounded::<SendEv>();
    let (ring_tx, ring_rx) = bounded::<Job>(opts.ring_blocks());
    let (done_tx, done_rx) = bounded::<Job>(opts.workers.max(1) * 2 + 2);
    let (pool_tx, pool_rx) = unbounded::<Vec<u8>>();

    // Reader.
    {
        let ev = ev_tx.clone();
        let stats = stats.clone();
        let pool = pool_rx.clone();
        let bs = opts.block_size;
        let spawned = thread::Builder::new()
            .name("ferry-input".into())
            .spawn(move || read_input(input, bs, &ring_tx, &pool, &stats, &ev));
        spawned.map_err(|e| StreamError::new(ErrorKind::Io, format!("spawn: {e}")))?;
    }
    // Compressors.
    for i in 0..opts.workers.max(1) {
        let rx = ring_rx.clone();
        let tx = done_tx.clone();
        let pool = pool_rx.clone();
        let stats = stats.clone();
        let mode = opts.compress;
        let n = opts.workers.max(1);
        let sealer = chan_w.sealer();
        thread::Builder::new()
            .name(format!("ferry-compress-{i}"))
            .spawn(move || compress_worker(mode, n, i, &sealer, &rx, &tx, &pool, &stats))
            .map_err(|e| StreamError::new(ErrorKind::Io, format!("spawn: {e}")))?;
    }
    drop(ring_rx);
    drop(done_tx);
    // Network writer.
    {
        let ev = ev_tx.clone();
        let stats = stats.clone();
        thread::Builder::new()
            .name("ferry-net-writer".into())
            .spawn(move || {
                let r = net_writer(chan_w, &done_rx, &pool_tx, &stats);
                let _ = ev.send(match r {
                    Ok(Some((total, digest))) => SendEv::WriterDone { total, digest },
                    Ok(None) => return,
                    Err(e) => SendEv::WriterErr(e),
                });
            })
            .map_err(|e| StreamError::new(ErrorKind::Io, format!("spawn: {e}")))?;
    }
    // Control reader: ACK or FAIL from the receiver.
    {
        let ev = ev_tx.clone();
        thread::Builder::new()
            .name("ferry-net-ctl".into())
            .spawn(move || {
                let _ = ev.send(read_control(chan_r));
            })
            .map_err(|e| StreamError::new(ErrorKind::Io, format!("spawn: {e}")))?;
    }
    drop(ev_tx);

    let fail = |e: StreamError| {
        if let Some(a) = &abort {
            a();
        }
        stats.done.store(true, Ordering::Relaxed);
        Err(e)
    };
    let mut sent: Option<(u64, [u8; 32])> = None;
    let mut acked: Option<(u64, [u8; 32], Option<i32>)> = None;
    loop {
        let ev = match ev_rx.recv() {
            Ok(ev) => ev,
            Err(_) => {
                return fail(StreamError::new(
                    ErrorKind::Io,
                    "internal: all workers ended",
                ))
            }
        };
        match ev {
            SendEv::WriterDone { total, digest } => sent = Some((total, digest)),
            SendEv::Ack {
                total,
                digest,
                status,
            } => acked = Some((total, digest, status)),
            SendEv::PeerFail(e) => return fail(e),
            SendEv::CtlErr(e) => {
                return fail(StreamError::new(
                    e.kind,
                    format!("receiver went away before acknowledging: {}", e.msg),
                ))
            }
            SendEv::WriterErr(e) => {
                // The receiver may have said why it stopped reading.
                let better = wait_for_peer_reason(&ev_rx, Duration::from_secs(2));
                return fail(better.unwrap_or(e));
            }
            SendEv::Producer(msg) => {
                // The writer sends ABORT to the receiver; give it a moment.
                let _ = ev_rx.recv_timeout(Duration::from_secs(2));
                return fail(StreamError::new(ErrorKind::ProducerFailed, msg));
            }
        }
        if let (Some((st, sd)), Some((at, ad, status))) = (sent, acked) {
            stats.done.store(true, Ordering::Relaxed);
            if st != at || sd != ad {
                return fail(StreamError::new(
                    ErrorKind::Integrity,
                    format!("receiver acknowledged {at} bytes with a different digest; sent {st}"),
                ));
            }
            return Ok(Summary {
                bytes: st,
                wire_bytes: Stats::get(&stats.wire),
                elapsed: start.elapsed(),
                blake3: blake3::Hash::from_bytes(sd).to_hex().to_string(),
                suite: suite_name(suite),
                remote_status: status,
            });
        }
    }
}

fn suite_name(s: Suite) -> String {
    s.to_string()
}

fn wait_for_peer_reason(rx: &Receiver<SendEv>, t: Duration) -> Option<StreamError> {
    let deadline = Instant::now() + t;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(SendEv::PeerFail(e)) => return Some(e),
            Ok(_) => continue,
            Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => return None,
        }
    }
}

fn read_input<R: Read>(
    mut input: R,
    bs: usize,
    ring: &Sender<Job>,
    pool: &Receiver<Vec<u8>>,
    stats: &Stats,
    ev: &Sender<SendEv>,
) {
    let mut hasher = blake3::Hasher::new();
    let mut total = 0u64;
    let mut seq = 0u64;
    loop {
        let mut buf = pool.try_recv().unwrap_or_default();
        buf.resize(bs, 0);
        let n = match ferry_channel::read_full(&mut input, &mut buf) {
            Ok(n) => n,
            Err(e) => {
                let msg = format!("reading input failed: {e}");
                let _ = ring.send(Job {
                    seq,
                    kind: JobKind::Abort(msg.clone()),
                });
                let _ = ev.send(SendEv::Producer(msg));
                return;
            }
        };
        if n == 0 {
            let digest = *hasher.finalize().as_bytes();
            let _ = ring.send(Job {
                seq,
                kind: JobKind::End { total, digest },
            });
            return;
        }
        buf.truncate(n);
        hasher.update(&buf);
        total += n as u64;
        Stats::add(&stats.plain_in, n as u64);
        Stats::add(&stats.buffered, n as u64);
        let job = Job {
            seq,
            kind: JobKind::Block {
                raw: buf,
                comp: pool.try_recv().unwrap_or_default(),
                codec: Codec::None,
                head: [0; HEAD],
                sealed: Vec::new(),
            },
        };
        if ring.send(job).is_err() {
            return; // the stream failed downstream
        }
        seq += 1;
    }
}

/// Most compressor streams a receiver decodes (one per sending worker;
/// workers beyond this compress independent blocks).
const MAX_STREAMS: usize = 64;

/// The BLOCK message header of a block packed as `p` by worker `stream`.
fn block_head(p: ferry_compress::Packed, stream: u8, raw_len: usize) -> [u8; HEAD] {
    let mut head = [0u8; HEAD];
    head[0] = msg::BLOCK;
    head[1] = p.wire_id();
    head[2] = match p.stream {
        Some(_) => stream,
        None => p.codec.level().clamp(-128, 127) as i8 as u8,
    };
    head[3..7].copy_from_slice(&(raw_len as u32).to_le_bytes());
    head
}

/// Compresses and seals blocks (both in parallel across workers; the
/// frame number of a block is its seq, so the writer only orders them).
#[allow(clippy::too_many_arguments)]
fn compress_worker(
    mode: Mode,
    workers: usize,
    index: usize,
    sealer: &ferry_channel::Sealer,
    rx: &Receiver<Job>,
    tx: &Sender<Job>,
    pool: &Receiver<Vec<u8>>,
    stats: &Stats,
) {
    let mut c = ferry_compress::Compressor::new(mode);
    c.set_workers(workers);
    // Each worker's zstd blocks form one stream: this worker takes jobs in
    // seq order and the writer sends them in seq order, so the receiver
    // sees each stream's blocks in the order they were made.
    c.set_streaming(index < MAX_STREAMS);
    for mut job in rx {
        if let JobKind::Block {
            raw,
            comp,
            codec,
            head,
            sealed,
        } = &mut job.kind
        {
            let rate = Stats::get(&stats.link_rate);
            c.set_link_rate(if rate == 0 { None } else { Some(rate as f64) });
            let p = c.compress(raw, comp);
            *codec = p.codec;
            *head = block_head(p, index as u8, raw.len());
            let payload = if *codec == Codec::None {
                &raw[..]
            } else {
                &comp[..]
            };
            *sealed = pool.try_recv().unwrap_or_default();
            if sealer
                .seal_data(job.seq, &head[..], payload, sealed)
                .is_err()
            {
                sealed.clear();
            }
        }
        if tx.send(job).is_err() {
            return;
        }
    }
}

/// Writes jobs in sequence order. `Ok(Some)` after END, `Ok(None)` after
/// ABORT or when the pipeline stopped.
fn net_writer<W: Write>(
    mut w: ChannelWriter<W>,
    rx: &Receiver<Job>,
    pool: &Sender<Vec<u8>>,
    stats: &Stats,
) -> Result<Option<(u64, [u8; 32])>, StreamError> {
    let mut pending = std::collections::BTreeMap::new();
    let mut next = 0u64;
    let mut rate_ewma = 0f64;
    // Wire bytes per wall second over the last 200 ms window: what the
    // pipeline actually pushes, the cap for a link that never blocks.
    let (mut win_start, mut win_bytes, mut pushed) = (Instant::now(), 0u64, 0f64);
    let werr = |e: ChannelError| channel_err(e, "sending to the receiver");
    loop {
        let job = match pending.remove(&next) {
            Some(j) => j,
            None => match rx.recv_timeout(KEEPALIVE) {
                Ok(j) if j.seq == next => j,
                Ok(j) => {
                    pending.insert(j.seq, j);
                    continue;
                }
                Err(RecvTimeoutError::Timeout) => {
                    // The producer is slow: tell the receiver we are alive.
                    w.keepalive().map_err(werr)?;
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => return Ok(None),
            },
        };
        next += 1;
        match job.kind {
            JobKind::Block {
                raw,
                comp,
                codec,
                head,
                sealed,
            } => {
                let before = w.wire_bytes;
                let t = Instant::now();
                if sealed.is_empty() || w.next_counter() != job.seq {
                    let payload = if codec == Codec::None {
                        &raw[..]
                    } else {
                        &comp[..]
                    };
                    w.send_frame2(&head, payload).map_err(werr)?;
                } else {
                    w.write_sealed(job.seq, &sealed).map_err(werr)?;
                }
                let secs = t.elapsed().as_secs_f64();
                let n = w.wire_bytes - before;
                // Drain rate while the link was the bottleneck: bytes over
                // the time spent blocked in the write. A write that did not
                // block says only "at least this fast": let the estimate
                // drift up slowly instead of jumping, so the compressor does
                // not flap between codecs, and never above 1.25x what the
                // pipeline pushes: when the CPU is the bottleneck, a rate
                // compounded from non-blocking writes would make the
                // compressor trade ratio for speed it cannot use.
                win_bytes += n;
                let span = win_start.elapsed().as_secs_f64();
                if span >= 0.2 {
                    pushed = win_bytes as f64 / span;
                    win_start = Instant::now();
                    win_bytes = 0;
                }
                if secs > 0.0 {
                    let r = n as f64 / secs;
                    rate_ewma = if rate_ewma == 0.0 {
                        r
                    } else if r < rate_ewma * 1.5 {
                        rate_ewma * 0.8 + r * 0.2
                    } else if pushed > 0.0 {
                        (rate_ewma * 1.05).min(pushed * 1.25).max(pushed)
                    } else {
                        rate_ewma * 1.05
                    };
                    stats.link_rate.store(rate_ewma as u64, Ordering::Relaxed);
                }
                Stats::add(&stats.wire, n);
                Stats::add(&stats.plain_wire, raw.len() as u64);
                Stats::add(&stats.plain_out, raw.len() as u64);
                Stats::sub(&stats.buffered, raw.len() as u64);
                Stats::add(
                    match codec {
                        Codec::None => &stats.blocks_raw,
                        Codec::Lz4 => &stats.blocks_lz4,
                        Codec::Zstd(_) => &stats.blocks_zstd,
                    },
                    1,
                );
                if pool.len() < 64 {
                    let _ = pool.send(raw);
                    let _ = pool.send(comp);
                    let _ = pool.send(sealed);
                }
            }
            JobKind::End { total, digest } => {
                let mut m = [0u8; 41];
                m[0] = msg::END;
                m[1..9].copy_from_slice(&total.to_le_bytes());
                m[9..].copy_from_slice(&digest);
                let before = w.wire_bytes;
                w.send_frame(&m).map_err(werr)?;
                w.finish().map_err(werr)?;
                Stats::add(&stats.wire, w.wire_bytes - before);
                return Ok(Some((total, digest)));
            }
            JobKind::Abort(reason) => {
                let mut m = vec![msg::ABORT];
                m.extend_from_slice(reason.as_bytes());
                let _ = w.send_frame(&m);
                let _ = w.finish();
                return Ok(None);
            }
        }
    }
}

fn read_control<R: Read>(mut r: ChannelReader<R>) -> SendEv {
    let lost = |e: ChannelError| SendEv::CtlErr(channel_err(e, "reading from the receiver"));
    let frame = match r.next_frame() {
        Ok(Frame::Data(d)) => d.to_vec(),
        Ok(Frame::End) => {
            return SendEv::CtlErr(StreamError::new(
                ErrorKind::Integrity,
                "receiver ended without a reply",
            ))
        }
        Err(e) => return lost(e),
    };
    match frame.first() {
        Some(&msg::ACK) if frame.len() == 45 => {
            let total = u64::from_le_bytes(frame[1..9].try_into().unwrap_or([0; 8]));
            let digest: [u8; 32] = frame[9..41].try_into().unwrap_or([0; 32]);
            let s = i32::from_le_bytes(frame[41..45].try_into().unwrap_or([0; 4]));
            SendEv::Ack {
                total,
                digest,
                status: (s != i32::MIN).then_some(s),
            }
        }
        Some(&msg::FAIL) if frame.len() >= 6 => {
            let kind = ErrorKind::from_code(frame[1]);
            let s = i32::from_le_bytes(frame[2..6].try_into().unwrap_or([0; 4]));
            let text = String::from_utf8_lossy(&frame[6..]).to_string();
            let kind = match kind {
                ErrorKind::ConsumerExited => ErrorKind::PeerConsumerExited,
                k => k,
            };
            SendEv::PeerFail(StreamError {
                kind,
                msg: format!("receiver: {text}"),
                remote_status: (s != i32::MIN).then_some(s),
            })
        }
        _ => SendEv::CtlErr(StreamError::new(
            ErrorKind::Integrity,
            "unexpected message from the receiver",
        )),
    }
}

// ---------------------------------------------------------------- receiver

/// Hooks for `pipe`'s remote side, where the output is a command's stdin.
#[derive(Default)]
pub struct RecvHooks {
    /// Called after the output was flushed and closed; returns the
    /// command's exit status for the ACK.
    pub on_complete: Option<Box<dyn FnOnce() -> Option<i32> + Send>>,
    /// Called when the stream failed, before the output is closed (kill the
    /// command so it does not commit a partial stream).
    pub on_abort: Option<Arc<dyn Fn() + Send + Sync>>,
}

/// Opens the output once a sender has proved the key (so a wrong key or a
/// stray connection never truncates a file or starts a command), with the
/// hooks that go with it.
pub type Opener<W> = Box<dyn FnOnce() -> Result<(W, RecvHooks), StreamError> + Send>;

/// An output that is already open and needs no hooks.
pub fn opened<W: Send + 'static>(w: W) -> Opener<W> {
    Box::new(move || Ok((w, RecvHooks::default())))
}

enum Chunk {
    Data(Vec<u8>),
    End { total: u64, digest: [u8; 32] },
}

enum RecvEv {
    WriterDone { total: u64, digest: [u8; 32] },
    WriterErr(StreamError),
    NetErr(StreamError),
    NetDone,
}

/// Listen on `listen`, accept one sender and write the stream to `output`.
pub fn recv<W: Write + Send + 'static>(
    opts: &Options,
    listen: SocketAddr,
    output: W,
) -> Result<Summary, StreamError> {
    opts.check()?;
    let l = bind(listen)?;
    recv_on(opts, &l, opened(output), &|_, _| {})
}

/// Wait on a bound listener for a sender that proves the key (connections
/// that do not are passed to `refused` and dropped; see [`accept`]), then
/// open the output and receive.
pub fn recv_on<W: Write + Send + 'static>(
    opts: &Options,
    l: &TcpListener,
    open: Opener<W>,
    refused: &dyn Fn(SocketAddr, &StreamError),
) -> Result<Summary, StreamError> {
    opts.check()?;
    let (session, s) = accept::accept_authenticated(opts, l, opts.wait, refused)?;
    let (r, w, ctl) = split(s)?;
    let shut = move || {
        let _ = ctl.shutdown(std::net::Shutdown::Write);
    };
    recv_session(opts, session, r, w, open, Some(Box::new(shut)))
}

/// Receive over any connected byte pipe: the handshake, then the stream.
pub fn recv_over<W, NR, NW>(
    opts: &Options,
    mut net_r: NR,
    mut net_w: NW,
    open: Opener<W>,
    close_write: Option<Box<dyn Fn() + Send>>,
) -> Result<Summary, StreamError>
where
    W: Write + Send + 'static,
    NR: Read + AsFd + Send + 'static,
    NW: Write + Send + 'static,
{
    opts.check()?;
    let session = ferry_channel::handshake(&mut net_r, &mut net_w, &opts.key, Role::Responder)
        .map_err(|e| channel_err(e, "handshake"))?;
    recv_session(opts, session, net_r, net_w, open, close_write)
}

/// The stream after the handshake: open the output, then receive.
fn recv_session<W, NR, NW>(
    opts: &Options,
    session: ferry_channel::Session,
    net_r: NR,
    net_w: NW,
    open: Opener<W>,
    close_write: Option<Box<dyn Fn() + Send>>,
) -> Result<Summary, StreamError>
where
    W: Write + Send + 'static,
    NR: Read + AsFd + Send + 'static,
    NW: Write + Send + 'static,
{
    let start = Instant::now();
    let suite = session.suite;
    let chan_r = ChannelReader::new(IdleRead::new(net_r, opts.idle), &session);
    let reply = Reply::start(ChannelWriter::new(net_w, &session), close_write)?;
    // Only now, with a sender that proved the key, is the output opened.
    let (output, mut hooks) = match open() {
        Ok(o) => o,
        Err(e) => {
            reply.last(fail_message(&e, e.remote_status));
            return Err(e);
        }
    };
    let stats = opts.stats.clone();
    stats.buffer_cap.store(
        (opts.ring_blocks() * opts.block_size) as u64,
        Ordering::Relaxed,
    );

    let (ev_tx, ev_rx) = unbounded::<RecvEv>();
    let (ring_tx, ring_rx) = bounded::<Chunk>(opts.ring_blocks());
    let (pool_tx, pool_rx) = unbounded::<Vec<u8>>();
    {
        let ev = ev_tx.clone();
        let stats = stats.clone();
        let on_abort = hooks.on_abort.clone();
        thread::Builder::new()
            .name("ferry-net-reader".into())
            .spawn(move || {
                let r = net_reader(chan_r, &ring_tx, &pool_rx, &stats);
                if let Err(e) = r {
                    if let Some(a) = &on_abort {
                        a();
                    }
                    let _ = ev.send(RecvEv::NetErr(e));
                } else {
                    let _ = ev.send(RecvEv::NetDone);
                }
            })
            .map_err(|e| StreamError::new(ErrorKind::Io, format!("spawn: {e}")))?;
    }
    {
        let ev = ev_tx.clone();
        let stats = stats.clone();
        thread::Builder::new()
            .name("ferry-output".into())
            .spawn(move || {
                let _ = ev.send(write_output(output, &ring_rx, &pool_tx, &stats));
            })
            .map_err(|e| StreamError::new(ErrorKind::Io, format!("spawn: {e}")))?;
    }
    drop(ev_tx);

    loop {
        let ev = match ev_rx.recv() {
            Ok(ev) => ev,
            Err(_) => {
                return Err(StreamError::new(
                    ErrorKind::Io,
                    "internal: all workers ended",
                ))
            }
        };
        match ev {
            RecvEv::NetDone => continue,
            RecvEv::WriterDone { total, digest } => {
                let status = hooks.on_complete.take().and_then(|f| f());
                let mut m = [0u8; 45];
                m[0] = msg::ACK;
                m[1..9].copy_from_slice(&total.to_le_bytes());
                m[9..41].copy_from_slice(&digest);
                m[41..].copy_from_slice(&status.unwrap_or(i32::MIN).to_le_bytes());
                // The data is safe; a sender gone by now does not change that.
                reply.last(m.to_vec());
                stats.done.store(true, Ordering::Relaxed);
                return Ok(Summary {
                    bytes: total,
                    wire_bytes: Stats::get(&stats.wire),
                    elapsed: start.elapsed(),
                    blake3: blake3::Hash::from_bytes(digest).to_hex().to_string(),
                    suite: suite_name(suite),
                    remote_status: status,
                });
            }
            RecvEv::WriterErr(mut e) => {
                if let Some(a) = &hooks.on_abort {
                    a();
                }
                let status = hooks.on_complete.take().and_then(|f| f());
                e.remote_status = status;
                reply.last(fail_message(&e, status));
                // Keep draining (the net reader discards now) until the sender
                // hangs up, so it reads our reason rather than a reset.
                let deadline = Instant::now() + Duration::from_secs(5);
                while let Ok(ev) =
                    ev_rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
                {
                    if matches!(ev, RecvEv::NetErr(_) | RecvEv::NetDone) {
                        break;
                    }
                }
                stats.done.store(true, Ordering::Relaxed);
                return Err(e);
            }
            RecvEv::NetErr(e) => {
                let status = hooks.on_complete.take().and_then(|f| f());
                reply.last(fail_message(&e, status));
                stats.done.store(true, Ordering::Relaxed);
                return Err(e);
            }
        }
    }
}

/// A FAIL message saying `e` (and the command's exit status, if any).
fn fail_message(e: &StreamError, status: Option<i32>) -> Vec<u8> {
    let mut m = vec![msg::FAIL, e.kind.code()];
    m.extend_from_slice(&status.unwrap_or(i32::MIN).to_le_bytes());
    m.extend_from_slice(e.msg.as_bytes());
    m
}

/// The receiver's direction to the sender: a thread that sends a
/// keepalive every [`KEEPALIVE`] until the verdict (ACK or FAIL) is ready,
/// so a sender whose data waits on our slow consumer (or on the command
/// finishing) knows we are alive.
struct Reply {
    tx: Sender<Vec<u8>>,
    thread: thread::JoinHandle<()>,
}

impl Reply {
    fn start<NW: Write + Send + 'static>(
        mut w: ChannelWriter<NW>,
        close_write: Option<Box<dyn Fn() + Send>>,
    ) -> Result<Reply, StreamError> {
        let (tx, rx) = bounded::<Vec<u8>>(1);
        let thread = thread::Builder::new()
            .name("ferry-net-reply".into())
            .spawn(move || {
                let mut alive = true;
                let last = loop {
                    match rx.recv_timeout(KEEPALIVE) {
                        Ok(m) => break Some(m),
                        Err(RecvTimeoutError::Timeout) => {
                            alive = alive && w.keepalive().is_ok();
                        }
                        Err(RecvTimeoutError::Disconnected) => break None,
                    }
                };
                if let Some(m) = last {
                    let _ = w.send_frame(&m).and_then(|_| w.finish());
                }
                if let Some(c) = &close_write {
                    c();
                }
            })
            .map_err(|e| StreamError::new(ErrorKind::Io, format!("spawn: {e}")))?;
        Ok(Reply { tx, thread })
    }

    /// Send the verdict, end our direction and wait until it is written.
    fn last(self, m: Vec<u8>) {
        let _ = self.tx.send(m);
        let _ = self.thread.join();
    }
}

/// Decrypt, decompress, queue. After the queue's consumer is gone, keeps
/// reading and discarding until the peer ends.
fn net_reader<R: Read>(
    mut r: ChannelReader<R>,
    ring: &Sender<Chunk>,
    pool: &Receiver<Vec<u8>>,
    stats: &Stats,
) -> Result<(), StreamError> {
    let mut discarding = false;
    let mut streams: Vec<Option<ferry_compress::StreamDecoder>> = Vec::new();
    let rerr = |e: ChannelError| channel_err(e, "the sender stopped before the end of the stream");
    let bad = |m: &str| StreamError::new(ErrorKind::Integrity, format!("protocol error: {m}"));
    loop {
        let frame = match r.next_frame() {
            Ok(Frame::Data(d)) => d,
            Ok(Frame::End) => return Err(bad("channel ended before END")),
            Err(e) => {
                if discarding {
                    return Ok(());
                }
                return Err(rerr(e));
            }
        };
        let wire = (frame.len() + ferry_channel::FRAME_OVERHEAD) as u64;
        match frame.first() {
            Some(&msg::BLOCK) if frame.len() >= HEAD => {
                let raw_len = u32::from_le_bytes([frame[3], frame[4], frame[5], frame[6]]) as usize;
                let mut out = pool.try_recv().unwrap_or_default();
                let codec = if frame[1] == ferry_compress::WIRE_STREAM
                    || frame[1] == ferry_compress::WIRE_STREAM_START
                {
                    let i = frame[2] as usize;
                    if i >= MAX_STREAMS {
                        return Err(bad("stream id out of range"));
                    }
                    if streams.len() <= i {
                        streams.resize_with(i + 1, || None);
                    }
                    streams[i]
                        .get_or_insert_with(ferry_compress::StreamDecoder::new)
                        .decompress(
                            frame[1] == ferry_compress::WIRE_STREAM_START,
                            &frame[HEAD..],
                            raw_len,
                            MAX_BLOCK,
                            &mut out,
                        )
                        .map_err(|e| bad(&e.to_string()))?;
                    Codec::Zstd(0)
                } else {
                    let codec = Codec::from_id(frame[1], frame[2] as i8 as i32)
                        .ok_or_else(|| bad("unknown codec"))?;
                    ferry_compress::decompress_block(
                        codec,
                        &frame[HEAD..],
                        raw_len,
                        MAX_BLOCK,
                        &mut out,
                    )
                    .map_err(|e| bad(&e.to_string()))?;
                    codec
                };
                Stats::add(&stats.wire, wire);
                Stats::add(&stats.plain_wire, raw_len as u64);
                Stats::add(
                    match codec {
                        Codec::None => &stats.blocks_raw,
                        Codec::Lz4 => &stats.blocks_lz4,
                        Codec::Zstd(_) => &stats.blocks_zstd,
                    },
                    1,
                );
                if discarding {
                    continue;
                }
                Stats::add(&stats.plain_in, raw_len as u64);
                Stats::add(&stats.buffered, raw_len as u64);
                if ring.send(Chunk::Data(out)).is_err() {
                    discarding = true;
                }
            }
            Some(&msg::END) if frame.len() == 41 => {
                let total = u64::from_le_bytes(frame[1..9].try_into().unwrap_or([0; 8]));
                let digest: [u8; 32] = frame[9..41].try_into().unwrap_or([0; 32]);
                Stats::add(&stats.wire, wire);
                match r.next_frame() {
                    Ok(Frame::End) => {}
                    Ok(Frame::Data(_)) => return Err(bad("data after END")),
                    Err(e) => return Err(rerr(e)),
                }
                let _ = ring.send(Chunk::End { total, digest });
                return Ok(());
            }
            Some(&msg::ABORT) => {
                let why = String::from_utf8_lossy(&frame[1..]).to_string();
                return Err(StreamError::new(
                    ErrorKind::ProducerFailed,
                    format!("the sender aborted the stream: {why}"),
                ));
            }
            _ => return Err(bad("unexpected message from the sender")),
        }
    }
}

fn write_output<W: Write>(
    mut out: W,
    rx: &Receiver<Chunk>,
    pool: &Sender<Vec<u8>>,
    stats: &Stats,
) -> RecvEv {
    let mut hasher = blake3::Hasher::new();
    let mut total = 0u64;
    let werr = |e: io::Error| {
        if e.kind() == io::ErrorKind::BrokenPipe {
            StreamError::new(
                ErrorKind::ConsumerExited,
                "the consumer exited before reading all data (broken pipe)",
            )
        } else {
            StreamError::new(ErrorKind::Io, format!("writing output failed: {e}"))
        }
    };
    for chunk in rx {
        match chunk {
            Chunk::Data(d) => {
                if let Err(e) = out.write_all(&d) {
                    return RecvEv::WriterErr(werr(e));
                }
                hasher.update(&d);
                total += d.len() as u64;
                Stats::add(&stats.plain_out, d.len() as u64);
                Stats::sub(&stats.buffered, d.len() as u64);
                if pool.len() < 64 {
                    let _ = pool.send(d);
                }
            }
            Chunk::End {
                total: want,
                digest: want_digest,
            } => {
                if let Err(e) = out.flush() {
                    return RecvEv::WriterErr(werr(e));
                }
                drop(out);
                let digest = *hasher.finalize().as_bytes();
                if want != total || want_digest != digest {
                    return RecvEv::WriterErr(StreamError::new(
                        ErrorKind::Integrity,
                        format!("integrity check failed: sender sent {want} bytes, received {total} (or digests differ)"),
                    ));
                }
                return RecvEv::WriterDone { total, digest };
            }
        }
    }
    // The net reader stopped without END: it reports why.
    RecvEv::NetDone
}
