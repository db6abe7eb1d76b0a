//! The receiver: `recv`/`recv_on`/`recv_over` wait for an authenticated
//! sender, open the output, run the pipeline and send the verdict (with
//! keepalives until it is ready).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, unbounded, Receiver, RecvTimeoutError, Sender};
use ferry_channel::{ChannelReader, ChannelWriter, Role};
use ferry_link::stripe::Conn;

use crate::*;

/// Hooks for `pipe`'s remote side, where the output is a command's stdin.
#[derive(Default)]
pub struct RecvHooks {
    /// Called after the output was flushed and closed; returns the
    /// command's exit status for the ACK.
    pub on_complete: Option<Box<dyn FnOnce() -> Option<i32> + Send>>,
    /// Called when the stream failed, before the output is closed (kill the
    /// command so it does not commit a partial stream).
    pub on_abort: Option<Arc<dyn Fn() + Send + Sync>>,
    /// What the output already holds of the stream, offered to the sender
    /// (a file an interrupted run left; see [`crate::resume`]).
    pub offer: Option<Offer>,
}

/// Opens the output once a sender has proved the key (so a wrong key or a
/// stray connection never truncates a file or starts a command), with the
/// hooks that go with it.
pub type Opener<W> = Box<dyn FnOnce() -> Result<(W, RecvHooks), StreamError> + Send>;

/// An output that is already open and needs no hooks.
pub fn opened<W: Send + 'static>(w: W) -> Opener<W> {
    Box::new(move || Ok((w, RecvHooks::default())))
}

pub(crate) enum Chunk {
    /// First: the stream continues at this offset, with this digest state
    /// over what precedes it.
    Start(u64, Box<blake3::Hasher>),
    Data(Vec<u8>),
    End {
        total: u64,
        digest: [u8; 32],
    },
}

pub(crate) enum RecvEv {
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
    let (session, conn) = accept::accept_authenticated(opts, l, opts.wait, refused)?;
    let (r, w, shut) = halves(opts, &conn, std::net::Shutdown::Write)?;
    recv_session(opts, session, r, w, open, Some(shut))
}

/// Receive over a session's connections that are already there (a
/// daemon's, after its answer): a fresh handshake on them, then the
/// stream.
pub fn recv_conn<W: Write + Send + 'static>(
    opts: &Options,
    conn: &Conn,
    open: Opener<W>,
) -> Result<Summary, StreamError> {
    opts.check()?;
    let (mut r, mut w, shut) = halves(opts, conn, std::net::Shutdown::Write)?;
    r.set_idle(opts.handshake_wait());
    let session = ferry_channel::handshake(&mut r, &mut w, &opts.key, Role::Responder)
        .map_err(|e| channel_err(e, "handshake"))?;
    r.set_idle(opts.idle);
    recv_session(opts, session, r, w, open, Some(shut))
}

/// Receive over any connected byte pipe: the handshake, then the stream.
pub fn recv_over<W, NR, NW>(
    opts: &Options,
    net_r: NR,
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
    let (session, net_r) = handshake(opts, net_r, &mut net_w, Role::Responder)?;
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
    NR: Read + Send + 'static,
    NW: Write + Send + 'static,
{
    let start = Instant::now();
    let suite = session.suite;
    let chan_r = ChannelReader::new(net_r, &session);
    let reply = Reply::start(ChannelWriter::new(net_w, &session), close_write)?;
    // Only now, with a sender that proved the key, is the output opened.
    let (output, mut hooks) = match open() {
        Ok(o) => o,
        Err(e) => {
            reply.last(fail_message(&e, e.remote_status));
            return Err(e);
        }
    };
    let stats = opts.run_stats(opts.ring_blocks());
    let offer = hooks.offer.take();
    let (have, digest) = offer
        .as_ref()
        .map_or((0, [0; 32]), |o| (o.have, *o.hasher.finalize().as_bytes()));
    let digest = if have == 0 {
        *blake3::Hasher::new().finalize().as_bytes()
    } else {
        digest
    };
    reply.send(resume::offer_message(have, &digest));

    let (ev_tx, ev_rx) = unbounded::<RecvEv>();
    let (ring_tx, ring_rx) = bounded::<Chunk>(opts.ring_blocks());
    let (pool_tx, pool_rx) = unbounded::<Vec<u8>>();
    {
        let ev = ev_tx.clone();
        let stats = stats.clone();
        let on_abort = hooks.on_abort.clone();
        spawn("ferry-net-reader", move || {
            let r = net_reader(chan_r, offer, &ring_tx, &pool_rx, &stats);
            if let Err(e) = r {
                if let Some(a) = &on_abort {
                    a();
                }
                let _ = ev.send(RecvEv::NetErr(e));
            } else {
                let _ = ev.send(RecvEv::NetDone);
            }
        })?;
    }
    {
        let stats = stats.clone();
        spawn("ferry-output", move || {
            let _ = ev_tx.send(write_output(output, &ring_rx, &pool_tx, &stats));
        })?;
    }

    loop {
        match next_event(&ev_rx)? {
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
                return Ok(Summary::new(total, digest, &stats, start, suite, status));
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

/// The receiver's direction to the sender: a thread that sends the OFFER,
/// then a keepalive every [`KEEPALIVE`] until the verdict (ACK or FAIL) is
/// ready, so a sender whose data waits on our slow consumer (or on the
/// command finishing) knows we are alive.
struct Reply {
    /// A message, and whether it is the last.
    tx: Sender<(Vec<u8>, bool)>,
    /// Disconnected when the thread is done.
    done: Receiver<()>,
}

/// How long the verdict may take to write: a sender that stopped reading
/// (its socket buffers full of our keepalives) does not keep us waiting.
const REPLY_WAIT: Duration = Duration::from_secs(10);

impl Reply {
    fn start<NW: Write + Send + 'static>(
        mut w: ChannelWriter<NW>,
        close_write: Option<Box<dyn Fn() + Send>>,
    ) -> Result<Reply, StreamError> {
        let (tx, rx) = bounded::<(Vec<u8>, bool)>(1);
        let (done_tx, done) = bounded::<()>(0);
        spawn("ferry-net-reply", move || {
            let _done = done_tx;
            let mut alive = true;
            let last = loop {
                match rx.recv_timeout(KEEPALIVE) {
                    Ok((m, true)) => break Some(m),
                    Ok((m, false)) => alive = alive && w.send_frame(&m).is_ok(),
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
        })?;
        Ok(Reply { tx, done })
    }

    /// Send a message that is not the last.
    fn send(&self, m: Vec<u8>) {
        let _ = self.tx.send((m, false));
    }

    /// Send the verdict, end our direction and wait until it is written
    /// (at most [`REPLY_WAIT`]).
    fn last(self, m: Vec<u8>) {
        let _ = self.tx.send((m, true));
        let _ = self.done.recv_timeout(REPLY_WAIT);
    }
}
