//! The sender: `send`/`send_over` start the pipeline (input reader,
//! compressors, network writer, control reader) and decide the outcome
//! from their events and the receiver's verdict.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, unbounded, Receiver, RecvTimeoutError};
use ferry_channel::{ChannelReader, ChannelWriter, Role, Session};
use ferry_link::stripe::{self, Conn, ConnRead, ConnWrite};

use crate::resume::skip_prefix;
use crate::*;

pub(crate) enum JobKind {
    /// `sealed`: the whole channel frame, sealed by the worker with frame
    /// number = seq (empty: the writer seals it).
    Block {
        /// The input's length (`raw` is emptied once the block is sealed).
        raw_len: usize,
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

/// Block buffers handed back for reuse, at most `cap` of them kept: what
/// the pipeline holds is the ring and its few stages, not a growing pile.
#[derive(Clone)]
pub(crate) struct BlockPool {
    tx: crossbeam_channel::Sender<Vec<u8>>,
    rx: Receiver<Vec<u8>>,
}

impl BlockPool {
    fn new(cap: usize) -> Self {
        let (tx, rx) = bounded(cap);
        BlockPool { tx, rx }
    }
    /// A buffer to fill (empty, or with capacity from an earlier block).
    pub(crate) fn get(&self) -> Vec<u8> {
        self.rx.try_recv().unwrap_or_default()
    }
    /// Keeps `v` for reuse, or frees it when the pool is full.
    pub(crate) fn put(&self, mut v: Vec<u8>) {
        if v.capacity() > 0 {
            v.clear();
            let _ = self.tx.try_send(v);
        }
    }
}

pub(crate) struct Job {
    pub(crate) seq: u64,
    pub(crate) kind: JobKind,
}

pub(crate) enum SendEv {
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

/// Connect to `peer` (over as many connections as `opts.streams` says)
/// and send everything `input` produces.
pub fn send<R: Read + Send + 'static>(
    opts: &Options,
    input: R,
    peer: SocketAddr,
) -> Result<Summary, StreamError> {
    opts.check()?;
    let start = Instant::now();
    let (session, r, w, abort) = dial(opts, peer)?;
    send_session(opts, input, session, r, w, Some(abort), None, start)
}

/// As [`send`], from a file: when it is a regular file and the receiver
/// already holds a prefix of it (an interrupted run), only the rest is
/// sent (see [`crate::resume`]).
pub fn send_file(opts: &Options, input: File, peer: SocketAddr) -> Result<Summary, StreamError> {
    opts.check()?;
    let start = Instant::now();
    send_file_dialed(opts, input, start, dial(opts, peer)?)
}

/// As [`send_file`], on a connection already made to the receiver (more
/// are opened to the same address as `opts.streams` says).
pub fn send_file_on(opts: &Options, input: File, s: TcpStream) -> Result<Summary, StreamError> {
    opts.check()?;
    let start = Instant::now();
    send_file_dialed(opts, input, start, join(opts, s)?)
}

/// As [`send_file`], over a session's connections that are already
/// there (a daemon's, after its answer): a fresh handshake on them, then
/// the stream.
pub fn send_file_conn(opts: &Options, input: File, conn: &Conn) -> Result<Summary, StreamError> {
    opts.check()?;
    let start = Instant::now();
    let (mut r, mut w, abort) = halves(opts, conn, std::net::Shutdown::Both)?;
    r.set_idle(opts.handshake_wait());
    let session = ferry_channel::handshake(&mut r, &mut w, &opts.key, Role::Initiator)
        .map_err(|e| channel_err(e, "handshake"))?;
    r.set_idle(opts.idle);
    send_file_dialed(opts, input, start, (session, r, w, abort))
}

/// A file's stream over a session with the receiver, resumable.
fn send_file_dialed(
    opts: &Options,
    input: File,
    start: Instant,
    (session, r, w, abort): Dialed,
) -> Result<Summary, StreamError> {
    let resumer = resumer(&input)?;
    send_session(
        opts,
        input,
        session,
        r,
        w,
        Some(abort),
        Some(resumer),
        start,
    )
}

/// As [`send_over`], from a file that may resume (see [`send_file`]).
pub fn send_file_over<NR, NW>(
    opts: &Options,
    input: File,
    net_r: NR,
    net_w: NW,
    abort: Option<Box<dyn Fn() + Send>>,
) -> Result<Summary, StreamError>
where
    NR: Read + AsFd + Send + 'static,
    NW: Write + Send + 'static,
{
    let resumer = resumer(&input)?;
    send_inner(opts, input, net_r, net_w, abort, Some(resumer))
}

/// Skips what the receiver holds of `input` already.
fn resumer(input: &File) -> Result<Resumer, StreamError> {
    let mut skip = input
        .try_clone()
        .map_err(|e| StreamError::new(ErrorKind::Io, format!("input: {e}")))?;
    Ok(Box::new(move |have, digest| {
        skip_prefix(&mut skip, have, digest)
    }))
}

/// A session with the receiver: its keys, its read and write halves, and
/// how to cut it.
type Dialed = (Session, ConnRead, ConnWrite, Box<dyn Fn() + Send>);

/// Connect to `peer`, as many connections as `opts.streams` says, and
/// prove the key on each.
fn dial(opts: &Options, peer: SocketAddr) -> Result<Dialed, StreamError> {
    join(opts, connect(peer, opts.connect_timeout)?)
}

/// [`dial`], the first connection made.
fn join(opts: &Options, s: TcpStream) -> Result<Dialed, StreamError> {
    let (session, conn) = stripe::join_client(s, &opts.key, opts.streams, opts.handshake_limit())
        .map_err(|e| {
        let flag = if opts.idle.is_some() {
            " (--timeout)"
        } else {
            ""
        };
        match e {
            ferry_channel::ChannelError::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => {
                StreamError::new(ErrorKind::TimedOut, format!("handshake: {io}{flag}"))
            }
            e => channel_err(e, "handshake"),
        }
    })?;
    let (r, w, abort) = halves(opts, &conn, std::net::Shutdown::Both)?;
    Ok((session, r, w, abort))
}

/// Answers an OFFER: the state over the input's first `have` bytes when
/// they hash to the digest offered (the input then continues after them).
type Resumer = Box<dyn FnOnce(u64, &[u8; 32]) -> std::io::Result<Option<blake3::Hasher>> + Send>;

/// Send over any connected byte pipe (TCP halves, ssh's stdout/stdin).
/// `abort` is called to unblock the transport when the stream fails. With
/// `opts.idle`, a receiver that sends nothing (it sends a keepalive every
/// [`KEEPALIVE`] while it has nothing to say) for that long is dead.
pub fn send_over<R, NR, NW>(
    opts: &Options,
    input: R,
    net_r: NR,
    net_w: NW,
    abort: Option<Box<dyn Fn() + Send>>,
) -> Result<Summary, StreamError>
where
    R: Read + Send + 'static,
    NR: Read + AsFd + Send + 'static,
    NW: Write + Send + 'static,
{
    send_inner(opts, input, net_r, net_w, abort, None)
}

fn send_inner<R, NR, NW>(
    opts: &Options,
    input: R,
    net_r: NR,
    mut net_w: NW,
    abort: Option<Box<dyn Fn() + Send>>,
    resumer: Option<Resumer>,
) -> Result<Summary, StreamError>
where
    R: Read + Send + 'static,
    NR: Read + AsFd + Send + 'static,
    NW: Write + Send + 'static,
{
    opts.check()?;
    let start = Instant::now();
    let (session, net_r) = handshake(opts, net_r, &mut net_w, Role::Initiator)?;
    send_session(opts, input, session, net_r, net_w, abort, resumer, start)
}

/// The stream after the handshake.
#[allow(clippy::too_many_arguments)]
fn send_session<R, NR, NW>(
    opts: &Options,
    input: R,
    session: Session,
    net_r: NR,
    net_w: NW,
    abort: Option<Box<dyn Fn() + Send>>,
    resumer: Option<Resumer>,
    start: Instant,
) -> Result<Summary, StreamError>
where
    R: Read + Send + 'static,
    NR: Read + Send + 'static,
    NW: Write + Send + 'static,
{
    let mut chan_r = ChannelReader::new(net_r, &session);
    let mut chan_w = ChannelWriter::new(net_w, &session);
    let stats = opts.run_stats(opts.send_ring_blocks());
    let from = match start_at(&mut chan_r, &mut chan_w, resumer) {
        Ok(f) => f,
        Err(e) => {
            if let Some(a) = &abort {
                a();
            }
            stats.done.store(true, Ordering::Relaxed);
            return Err(e);
        }
    };
    Stats::add(&stats.resumed, from.0);
    let ev_rx = start_pipeline(opts, input, chan_r, chan_w, &stats, from)?;

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
        let ev = match next_event(&ev_rx) {
            Ok(ev) => ev,
            Err(e) => return fail(e),
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
            return Ok(Summary::new(st, sd, &stats, start, session.suite, status));
        }
    }
}

/// Read the receiver's OFFER, decide where the stream starts and say so
/// (START): the offset and the digest state over what precedes it.
fn start_at<NR: Read, NW: Write>(
    chan_r: &mut ChannelReader<NR>,
    chan_w: &mut ChannelWriter<NW>,
    resumer: Option<Resumer>,
) -> Result<(u64, blake3::Hasher), StreamError> {
    let lost = |e: ferry_channel::ChannelError| channel_err(e, "reading the receiver's offer");
    let no_offer = || {
        StreamError::new(
            ErrorKind::Integrity,
            "protocol error: no OFFER from the receiver",
        )
    };
    let (have, digest) = match chan_r.next_frame().map_err(lost)? {
        ferry_channel::Frame::Data(d) => match resume::parse_offer(d) {
            Some(o) => o,
            // A receiver that could not open its output says why instead.
            None => match send_stages::verdict(d) {
                SendEv::PeerFail(e) => return Err(e),
                _ => return Err(no_offer()),
            },
        },
        ferry_channel::Frame::End => return Err(no_offer()),
    };
    let mut from = (0, blake3::Hasher::new());
    if let Some(r) = resumer.filter(|_| have > 0) {
        // Hashing a large prefix takes a while: the receiver, waiting for
        // START, hears a keepalive every second meanwhile.
        let res = std::thread::scope(|s| {
            let h = s.spawn(move || r(have, &digest));
            let mut last = Instant::now();
            while !h.is_finished() {
                std::thread::sleep(Duration::from_millis(50));
                if last.elapsed() >= KEEPALIVE {
                    let _ = chan_w.keepalive();
                    last = Instant::now();
                }
            }
            h.join()
        });
        match res {
            Ok(Ok(Some(h))) => from = (have, h),
            Ok(Ok(None)) => {}
            Ok(Err(e)) => {
                return Err(StreamError::new(
                    ErrorKind::ProducerFailed,
                    format!("reading input failed: {e}"),
                ))
            }
            Err(_) => {
                return Err(StreamError::new(
                    ErrorKind::Io,
                    "internal: input hashing failed",
                ))
            }
        }
    }
    chan_w
        .send_frame(&resume::start_message(from.0))
        .map_err(|e| channel_err(e, "sending to the receiver"))?;
    Ok(from)
}

/// Starts the sender's threads: the input reader, the compressors, the
/// network writer and the control reader. Their events come out of the
/// receiver returned. The stream continues from `from` (offset, digest
/// state): blocks are numbered on from the channel's next frame.
fn start_pipeline<R, NR, NW>(
    opts: &Options,
    input: R,
    chan_r: ChannelReader<NR>,
    chan_w: ChannelWriter<NW>,
    stats: &Arc<Stats>,
    from: (u64, blake3::Hasher),
) -> Result<Receiver<SendEv>, StreamError>
where
    R: Read + Send + 'static,
    NR: Read + Send + 'static,
    NW: Write + Send + 'static,
{
    let (ev_tx, ev_rx) = unbounded::<SendEv>();
    let (ring_tx, ring_rx) = bounded::<Job>(opts.send_ring_blocks());
    let (done_tx, done_rx) = bounded::<Job>(opts.workers.max(1) * 2 + 2);
    let pool = BlockPool::new(opts.workers.max(1) * 3 + 8);
    let first = chan_w.next_counter();

    // Reader.
    {
        let ev = ev_tx.clone();
        let stats = stats.clone();
        let pool = pool.clone();
        let bs = opts.block_size;
        spawn("ferry-input", move || {
            read_input(input, bs, (first, from), &ring_tx, &pool, &stats, &ev)
        })?;
    }
    // Compressors.
    for i in 0..opts.workers.max(1) {
        let rx = ring_rx.clone();
        let tx = done_tx.clone();
        let pool = pool.clone();
        let stats = stats.clone();
        let mode = opts.compress;
        let n = opts.workers.max(1);
        let sealer = chan_w.sealer();
        spawn(format!("ferry-compress-{i}"), move || {
            compress_worker(mode, n, i, &sealer, &rx, &tx, &pool, &stats)
        })?;
    }
    drop(ring_rx);
    drop(done_tx);
    // Network writer.
    {
        let ev = ev_tx.clone();
        let stats = stats.clone();
        spawn("ferry-net-writer", move || {
            let r = net_writer(chan_w, first, &done_rx, &pool, &stats);
            let _ = ev.send(match r {
                Ok(Some((total, digest))) => SendEv::WriterDone { total, digest },
                Ok(None) => return,
                Err(e) => SendEv::WriterErr(e),
            });
        })?;
    }
    // Control reader: ACK or FAIL from the receiver.
    spawn("ferry-net-ctl", move || {
        let _ = ev_tx.send(read_control(chan_r));
    })?;
    Ok(ev_rx)
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
