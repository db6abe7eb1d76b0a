//! Links that carry [`Message`]s between a sender and a receiver.
//!
//! The engine sees only an [`Endpoint`]: a cloneable [`MsgTx`] that many
//! worker threads may send through, and one [`MsgRx`]. Two links exist:
//!
//! * [`in_process`]: bounded channels, for local-to-local moves. Messages are
//!   moved, not copied; `bytes_wire` counts what their encoding would take.
//! * [`stream_link`]: any byte pipe (ssh's stdin/stdout, a TCP stream, an
//!   encrypted channel). A writer thread encodes frames, a reader thread
//!   decodes them; `bytes_wire` counts the bytes written.
//!
//! Either way both ends are bounded queues, so a slow consumer slows the
//! producer instead of growing memory.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, Sender};

use crate::codec::{self, DecodeError};
#[cfg(test)]
use crate::framing::write_keepalive;
use crate::framing::{read_loop, write_loop};
pub use crate::link_error::LinkError;
use crate::liveness::{Liveness, TICK};
use crate::msg::{CompressedData, Message};
pub use crate::ratelimit::RateLimit;

/// The check a frame carries after its body on a byte pipe: the low 32
/// bits of XXH3-64 over the 8-byte header (length and its complement) and
/// the body. ssh and the direct
/// channel protect their bytes already; this catches a remote shell or a
/// pipe that does not (a flipped bit in a mode or an mtime is not caught
/// by the data digests).
pub fn frame_check(len_and_body: &[u8]) -> u32 {
    xxhash_rust::xxh3::xxh3_64(len_and_body) as u32
}

/// A shared byte counter.
#[derive(Clone, Debug, Default)]
pub struct WireCounter(Arc<AtomicU64>);

impl WireCounter {
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
    pub(crate) fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
}

/// Compression shared by the clones of a [`MsgTx`]: the mode, and the
/// link's drain rate as the writer measures it.
struct CompressShared {
    mode: ferry_compress::Mode,
    /// Bytes per second the pipe took while it was the bottleneck (f64
    /// bits; 0 before the first measurement, infinity when it keeps up).
    link_rate: Arc<std::sync::atomic::AtomicU64>,
    /// `--bwlimit`, which caps the rate whatever the pipe could do.
    cap: Option<f64>,
    workers: usize,
    /// Stream ids not held by a live clone (see [`MAX_STREAMS`]).
    free_streams: Mutex<Vec<u16>>,
}

/// zstd streams a receiver keeps at once (one per sending clone; clones
/// beyond this compress independent blocks). Each costs the receiver up to
/// an 8 MiB window.
pub const MAX_STREAMS: u16 = 32;

/// The link rate assumed before the writer has measured one: a gigabit
/// link's payload. Compression starts cheap and is dropped within 200 ms if
/// the link turns out faster than the compressor.
const ASSUMED_LINK_RATE: f64 = 117e6;

/// What a link's queue carries to its [`MsgRx`]: one message (sent in
/// process), or a run of them a stream reader decoded from one buffer.
pub(crate) enum Batch {
    One(Message),
    Many(std::vec::IntoIter<Message>),
}

/// Sending half of a link. Cheap to clone; safe to use from many threads.
/// On a link with compression each clone has its own compressor, so
/// threads that send through their own clone compress in parallel.
pub struct MsgTx {
    tx: Sender<Batch>,
    /// Counted here for in-process links; stream links count in the writer.
    count_on_send: Option<WireCounter>,
    /// The error that stopped the writer, if any.
    failure: Arc<Mutex<Option<LinkError>>>,
    /// `--bwlimit`: a token bucket shared by every clone.
    limit: Option<Arc<RateLimit>>,
    compress: Option<Arc<CompressShared>>,
    /// This clone's compressor and the zstd stream id it holds, if any.
    compressor: Option<Mutex<(ferry_compress::Compressor, Option<u16>)>>,
    /// Stream links: when frames last left, and the idle timeout.
    live: Option<Arc<Liveness>>,
}

impl Clone for MsgTx {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
            count_on_send: self.count_on_send.clone(),
            failure: self.failure.clone(),
            limit: self.limit.clone(),
            compress: self.compress.clone(),
            compressor: self.compress.as_ref().map(new_compressor),
            live: self.live.clone(),
        }
    }
}

impl Drop for MsgTx {
    fn drop(&mut self) {
        // Give the stream id back. Every block of this clone is queued
        // already, so a later clone's first block (a stream start) follows
        // them on the wire.
        if let (Some(shared), Some(k)) = (&self.compress, &self.compressor) {
            if let Ok(g) = k.lock() {
                if let (Some(id), Ok(mut free)) = (g.1, shared.free_streams.lock()) {
                    free.push(id);
                }
            }
        }
    }
}

fn new_compressor(c: &Arc<CompressShared>) -> Mutex<(ferry_compress::Compressor, Option<u16>)> {
    let mut k = ferry_compress::Compressor::new(c.mode);
    k.set_workers(c.workers);
    // A `--bwlimit` link is slower than the machine by the user's choice:
    // compressing for it pays whatever else the CPU is doing.
    if c.cap.is_none() {
        k.watch_cpu();
    }
    let id = c.free_streams.lock().ok().and_then(|mut f| f.pop());
    k.set_streaming(id.is_some());
    Mutex::new((k, id))
}

/// A data message, compressed when that pays (stream links only).
fn compress_data(
    shared: &CompressShared,
    k: &mut ferry_compress::Compressor,
    stream: Option<u16>,
    file: u32,
    offset: u64,
    data: Vec<u8>,
) -> Message {
    let measured = f64::from_bits(shared.link_rate.load(Ordering::Relaxed));
    let mut rate = if measured > 0.0 {
        measured
    } else {
        ASSUMED_LINK_RATE
    };
    if let Some(cap) = shared.cap {
        rate = rate.min(cap);
    }
    k.set_link_rate(rate.is_finite().then_some(rate));
    let mut out = Vec::new();
    let p = k.compress(&data, &mut out);
    if p.codec == ferry_compress::Codec::None {
        return Message::Data { file, offset, data };
    }
    Message::Compressed(CompressedData {
        file,
        offset,
        codec: p.wire_id(),
        stream: stream.filter(|_| p.stream.is_some()).unwrap_or(0),
        level: p.codec.level(),
        raw_len: data.len() as u32,
        data: out,
    })
}

/// The [`Message::Data`] that `c` compressed; stream blocks go through
/// the peer's stream `c.stream` of `streams`.
fn decompress_data(
    streams: &mut Vec<Option<ferry_compress::StreamDecoder>>,
    c: CompressedData,
) -> Result<Message, LinkError> {
    let mut out = Vec::new();
    let bad = |e: ferry_compress::DecompressError| LinkError::Corrupt(e.to_string());
    if c.codec == ferry_compress::WIRE_STREAM || c.codec == ferry_compress::WIRE_STREAM_START {
        if c.stream >= MAX_STREAMS {
            return Err(LinkError::Decode(DecodeError::BadValue("stream")));
        }
        let i = c.stream as usize;
        if streams.len() <= i {
            streams.resize_with(i + 1, || None);
        }
        streams[i]
            .get_or_insert_with(ferry_compress::StreamDecoder::new)
            .decompress(
                c.codec == ferry_compress::WIRE_STREAM_START,
                &c.data,
                c.raw_len as usize,
                crate::codec::MAX_DATA,
                &mut out,
            )
            .map_err(bad)?;
    } else {
        let codec = ferry_compress::Codec::from_id(c.codec, c.level)
            .ok_or(LinkError::Decode(DecodeError::BadValue("codec")))?;
        ferry_compress::decompress_block(
            codec,
            &c.data,
            c.raw_len as usize,
            crate::codec::MAX_DATA,
            &mut out,
        )
        .map_err(bad)?;
    }
    Ok(Message::Data {
        file: c.file,
        offset: c.offset,
        data: out,
    })
}

impl MsgTx {
    /// Queue `m` for the peer; blocks while the link is full.
    pub fn send(&self, m: Message) -> Result<(), LinkError> {
        self.send_with(m, None)
    }

    /// [`MsgTx::send`] `m`, then queue `then` (not data) right behind it,
    /// as one hand-over: a segment's last data and its `SegmentDone`.
    /// Sent apart, each wakes the consumer once; on many small files
    /// that is two thread wake-ups a file where one will do.
    pub fn send_then(&self, m: Message, then: Message) -> Result<(), LinkError> {
        debug_assert!(!matches!(then, Message::Data { .. }));
        self.send_with(m, Some(then))
    }

    fn send_with(&self, m: Message, then: Option<Message>) -> Result<(), LinkError> {
        let batch = |m: Message, then: Option<Message>| match then {
            None => Batch::One(m),
            Some(t) => Batch::Many(vec![m, t].into_iter()),
        };
        match (&self.compress, &self.compressor, m) {
            (Some(shared), Some(k), Message::Data { file, offset, data }) if data.len() >= 4096 => {
                let Ok(mut k) = k.lock() else {
                    return self.enqueue_batch(batch(Message::Data { file, offset, data }, then));
                };
                let (k, stream) = &mut *k;
                let m = compress_data(shared, k, *stream, file, offset, data);
                // Still holding this clone's compressor: its stream blocks
                // reach the queue in the order they were made.
                self.enqueue_batch(batch(m, then))
            }
            (_, _, m) => self.enqueue_batch(batch(m, then)),
        }
    }

    /// Queue `ms` for the peer in this order, as one hand-over: for a
    /// thread that makes many small control messages (a file list's
    /// entries), which would otherwise cost the queue's lock and a wake-up
    /// each. Data goes through [`MsgTx::send`], which compresses it.
    pub fn send_batch(&self, ms: Vec<Message>) -> Result<(), LinkError> {
        match ms.len() {
            0 => Ok(()),
            1 => ms.into_iter().try_for_each(|m| self.send(m)),
            _ => {
                debug_assert!(!ms.iter().any(|m| matches!(m, Message::Data { .. })));
                self.enqueue_batch(Batch::Many(ms.into_iter()))
            }
        }
    }

    fn enqueue_batch(&self, m: Batch) -> Result<(), LinkError> {
        if let Some(l) = self.live.as_ref().filter(|l| l.watching()) {
            // The writer has been stuck in one write for too long: the
            // peer takes nothing (whatever room the queue still has).
            l.check_moved()?;
        }
        if self.count_on_send.is_some() || self.limit.is_some() {
            let n = match &m {
                Batch::One(m) => codec::encoded_len(m),
                Batch::Many(ms) => ms.as_slice().iter().map(codec::encoded_len).sum(),
            } as u64;
            if let Some(c) = &self.count_on_send {
                c.add(n);
            }
            if let Some(l) = &self.limit {
                l.take(n);
            }
        }
        let Some(live) = self.live.as_ref().filter(|l| l.watching()) else {
            return self.tx.send(m).map_err(|_| self.failure());
        };
        // The queue stays full only while the pipe takes nothing: a peer
        // that stops reading is dead after the idle timeout.
        let mut m = m;
        loop {
            match self.tx.send_timeout(m, TICK) {
                Ok(()) => return Ok(()),
                Err(crossbeam_channel::SendTimeoutError::Timeout(back)) => {
                    live.check_moved()?;
                    m = back;
                }
                Err(crossbeam_channel::SendTimeoutError::Disconnected(_)) => {
                    return Err(self.failure())
                }
            }
        }
    }

    /// The same link, compressing data per block with `mode` (`--compress`);
    /// `workers` is how many threads send through clones of it.
    pub fn with_compression(
        mut self,
        mode: ferry_compress::Mode,
        workers: usize,
        link_rate: Arc<std::sync::atomic::AtomicU64>,
        cap: Option<u64>,
    ) -> Self {
        if mode == ferry_compress::Mode::Fixed(ferry_compress::Codec::None) {
            return self;
        }
        let shared = Arc::new(CompressShared {
            mode,
            link_rate,
            cap: cap.map(|c| c as f64),
            workers,
            free_streams: Mutex::new((0..MAX_STREAMS).rev().collect()),
        });
        self.compressor = Some(new_compressor(&shared));
        self.compress = Some(shared);
        self
    }

    /// The same link, limited to `bytes_per_sec` (`--bwlimit`).
    pub fn with_rate_limit(mut self, bytes_per_sec: u64) -> Self {
        self.limit = Some(Arc::new(RateLimit::new(bytes_per_sec)));
        self
    }

    fn failure(&self) -> LinkError {
        failure_of(&self.failure)
    }
}

/// Why the link ended, as its stream reader recorded it, or just closed.
fn failure_of(f: &Mutex<Option<LinkError>>) -> LinkError {
    f.lock()
        .ok()
        .and_then(|g| g.clone())
        .unwrap_or(LinkError::Closed)
}

/// Receiving half of a link.
pub struct MsgRx {
    rx: Receiver<Batch>,
    /// Why the link ended, set by a stream reader before it hangs up.
    failure: Arc<Mutex<Option<LinkError>>>,
    /// The rest of the batch being taken, and the peer's zstd streams.
    /// Held while a message is taken off the queue and decoded, so stream
    /// blocks decode in arrival order.
    state: Mutex<RxState>,
    /// Stream links: when frames last arrived, and the idle timeout.
    live: Option<Arc<Liveness>>,
}

#[derive(Default)]
struct RxState {
    /// Messages of the last batch not taken yet.
    pending: Option<std::vec::IntoIter<Message>>,
    /// The peer's zstd streams, by id.
    streams: Vec<Option<ferry_compress::StreamDecoder>>,
}

impl MsgRx {
    /// See [`Endpoint::set_idle_timeout`]; the clock starts now.
    pub fn set_idle_timeout(&self, idle: Option<Duration>) {
        if let Some(l) = &self.live {
            l.set_idle(idle);
        }
    }

    /// Next message from the peer; an error once the peer hung up or sent
    /// garbage.
    pub fn recv(&self) -> Result<Message, LinkError> {
        self.recv_or_wake(&crossbeam_channel::never())
            .and_then(|m| m.ok_or(LinkError::Closed))
    }

    /// Whether a message is at hand: [`MsgRx::recv`] would not wait for
    /// the peer (for a thread that holds messages for the peer until it
    /// would).
    pub fn ready(&self) -> bool {
        let pending = self
            .state
            .lock()
            .is_ok_and(|st| st.pending.as_ref().is_some_and(|p| p.len() > 0));
        pending || !self.rx.is_empty()
    }

    /// [`MsgRx::recv`], or `None` as soon as `wake` has something: for a
    /// thread that must also notice events on its own side.
    pub fn recv_or_wake(&self, wake: &Receiver<()>) -> Result<Option<Message>, LinkError> {
        let mut st = self
            .state
            .lock()
            .map_err(|_| LinkError::Io("receiver state poisoned".into()))?;
        let st = &mut *st;
        let live = self.live.as_ref().filter(|l| l.watching());
        // What is at hand is taken without a select: a select registers
        // with both queues under their locks, which the thread filling
        // `rx` contends for (a million-entry list spent a fifth of the
        // receiver's time there when each message came alone). `wake` is
        // looked at first, so a busy link cannot starve it.
        if wake.try_recv().is_ok() {
            return Ok(None);
        }
        loop {
            if let Some(m) = st.pending.as_mut().and_then(|p| p.next()) {
                return match m {
                    Message::Compressed(c) => decompress_data(&mut st.streams, c).map(Some),
                    m => Ok(Some(m)),
                };
            }
            st.pending = None;
            match self.next_batch(wake, live)? {
                None => return Ok(None),
                Some(Batch::One(Message::Compressed(c))) => {
                    return decompress_data(&mut st.streams, c).map(Some)
                }
                Some(Batch::One(m)) => return Ok(Some(m)),
                Some(Batch::Many(it)) => st.pending = Some(it),
            }
        }
    }

    /// The next batch off the queue, or `None` once `wake` has something.
    fn next_batch(
        &self,
        wake: &Receiver<()>,
        live: Option<&Arc<Liveness>>,
    ) -> Result<Option<Batch>, LinkError> {
        let ready = match self.rx.try_recv() {
            Ok(m) => Some(Ok(m)),
            Err(crossbeam_channel::TryRecvError::Empty) => None,
            Err(crossbeam_channel::TryRecvError::Disconnected) => {
                Some(Err(crossbeam_channel::RecvError))
            }
        };
        let m = if let Some(m) = ready {
            m
        } else {
            loop {
                let tick = if live.is_some() { TICK } else { Duration::MAX };
                break crossbeam_channel::select! {
                    recv(self.rx) -> m => m,
                    recv(wake) -> w => match w {
                        Ok(()) => return Ok(None),
                        // Nobody can wake us any more: wait for the peer alone.
                        Err(_) => match live {
                            None => self.rx.recv(),
                            Some(l) => match self.rx.recv_timeout(tick) {
                                Ok(m) => Ok(m),
                                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                                    l.check_heard()?;
                                    continue;
                                }
                                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                                    Err(crossbeam_channel::RecvError)
                                }
                            },
                        },
                    },
                    default(tick) => {
                        if let Some(l) = live {
                            l.check_heard()?;
                        }
                        continue;
                    }
                };
            }
        };
        m.map(Some).map_err(|_| failure_of(&self.failure))
    }
}

/// One end of a link.
pub struct Endpoint {
    pub tx: MsgTx,
    pub rx: MsgRx,
    /// Bytes this end sent.
    pub sent: WireCounter,
    /// Bytes this end received.
    pub received: WireCounter,
    /// The pipe's measured drain rate (f64 bits, bytes/s; 0 = unknown or
    /// not the bottleneck), for compression choices.
    pub link_rate: Arc<std::sync::atomic::AtomicU64>,
}

impl Endpoint {
    /// Fail the link once the peer has sent nothing, or taken nothing, for
    /// `idle` (`--timeout`); `None` waits forever. Stream links only: an
    /// in-process peer cannot go silent without its thread ending.
    pub fn set_idle_timeout(&self, idle: Option<Duration>) {
        self.rx.set_idle_timeout(idle);
    }
}

/// Messages queued per direction.
const QUEUE: usize = 64;

/// A pair of connected in-process endpoints.
pub fn in_process() -> (Endpoint, Endpoint) {
    let (a_tx, b_rx) = bounded::<Batch>(QUEUE);
    let (b_tx, a_rx) = bounded::<Batch>(QUEUE);
    let a_sent = WireCounter::default();
    let b_sent = WireCounter::default();
    let a = in_process_end(a_tx, a_rx, &a_sent, &b_sent);
    let b = in_process_end(b_tx, b_rx, &b_sent, &a_sent);
    (a, b)
}

/// One end of [`in_process`]: sends on `tx` counting into `sent`,
/// receives on `rx` what the other end counted into `received`.
fn in_process_end(
    tx: Sender<Batch>,
    rx: Receiver<Batch>,
    sent: &WireCounter,
    received: &WireCounter,
) -> Endpoint {
    Endpoint {
        tx: MsgTx {
            tx,
            count_on_send: Some(sent.clone()),
            failure: Arc::default(),
            limit: None,
            compress: None,
            compressor: None,
            live: None,
        },
        rx: MsgRx {
            rx,
            failure: Arc::default(),
            state: Mutex::default(),
            live: None,
        },
        sent: sent.clone(),
        received: received.clone(),
        link_rate: Arc::default(),
    }
}

/// Waits for a stream link's writer to put everything queued on the pipe.
pub struct Flushed(Option<thread::JoinHandle<()>>);

impl Flushed {
    /// Block until every sender handle is gone and the writer has flushed
    /// and closed its pipe. A process must call this before it exits, or
    /// its last messages may never leave.
    pub fn wait(self) {
        self.wait_for(None);
    }

    /// [`Flushed::wait`], giving up after `limit`: a peer that stopped
    /// reading must not keep this process alive (its writer may be stuck
    /// in a write for ever).
    pub fn wait_for(mut self, limit: Option<Duration>) {
        let Some(h) = self.0.take() else { return };
        let Some(limit) = limit else {
            let _ = h.join();
            return;
        };
        let until = std::time::Instant::now() + limit;
        while !h.is_finished() {
            if std::time::Instant::now() >= until {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        let _ = h.join();
    }
}

/// An endpoint speaking frames over a byte pipe. Spawns one reader and one
/// writer thread; they end when the pipe closes or the endpoint is dropped.
pub fn stream_link<R, W>(r: R, w: W) -> Endpoint
where
    R: Read + Send + 'static,
    W: Write + Send + 'static,
{
    stream_link_flushed(r, w).0
}

/// [`stream_link`], plus a handle to wait for the writer to finish.
pub fn stream_link_flushed<R, W>(mut r: R, mut w: W) -> (Endpoint, Flushed)
where
    R: Read + Send + 'static,
    W: Write + Send + 'static,
{
    let sent = WireCounter::default();
    let received = WireCounter::default();
    let failure: Arc<Mutex<Option<LinkError>>> = Arc::default();

    let (tx, wrx) = bounded::<Batch>(QUEUE);
    let (rtx, rx) = bounded::<Batch>(crate::framing::READ_QUEUE);
    let rfailure: Arc<Mutex<Option<LinkError>>> = Arc::default();

    let live = Arc::new(Liveness::default());
    let wlive = live.clone();
    let wsent = sent.clone();
    let wfail = failure.clone();
    let link_rate: Arc<std::sync::atomic::AtomicU64> = Arc::default();
    let wrate = link_rate.clone();
    let writer = thread::Builder::new()
        .name("ferry-writer".into())
        .spawn(move || {
            if let Err(e) = write_loop(&mut w, &wrx, &wsent, &wrate, &wlive) {
                if let Ok(mut g) = wfail.lock() {
                    *g = Some(e);
                }
            }
        })
        .ok();

    let rrecv = received.clone();
    let rfail = rfailure.clone();
    let rlive = live.clone();
    let _ = thread::Builder::new()
        .name("ferry-reader".into())
        .spawn(move || {
            if let Err(e) = read_loop(&mut r, &rtx, &rrecv, &rlive) {
                if let Ok(mut g) = rfail.lock() {
                    *g = Some(e);
                }
            }
            // Dropping `rtx` here wakes the receiver with the error.
        });

    let ep = Endpoint {
        tx: MsgTx {
            tx,
            count_on_send: None,
            failure,
            limit: None,
            compress: None,
            compressor: None,
            live: Some(live.clone()),
        },
        rx: MsgRx {
            rx,
            failure: rfailure,
            state: Mutex::default(),
            live: Some(live),
        },
        sent,
        received,
        link_rate,
    };
    (ep, Flushed(writer))
}

#[cfg(test)]
#[path = "transport_tests.rs"]
mod tests;
