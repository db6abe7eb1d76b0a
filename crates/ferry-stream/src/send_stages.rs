//! The sender's pipeline stages: reading the producer into blocks,
//! compressing and sealing them on worker threads, writing them in order
//! (with keepalives while the producer is idle), and reading the
//! receiver's ACK or FAIL.

use std::io::{Read, Write};
use std::sync::atomic::Ordering;
use std::time::Instant;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use ferry_channel::{ChannelError, ChannelReader, ChannelWriter, Frame};

use crate::send::BlockPool;
use crate::*;

/// Reads the producer into blocks numbered from `first`, the stream
/// going on from `from` (its offset and digest state: see `resume`).
pub(crate) fn read_input<R: Read>(
    mut input: R,
    bs: usize,
    (first, from): (u64, (u64, blake3::Hasher)),
    ring: &Sender<Job>,
    pool: &BlockPool,
    stats: &Stats,
    ev: &Sender<SendEv>,
) {
    let (mut total, mut hasher) = from;
    let mut seq = first;
    loop {
        let mut buf = pool.get();
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
                raw_len: n,
                raw: buf,
                // Taken by the compressor: a block waiting in the ring
                // holds its input and nothing else.
                comp: Vec::new(),
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
pub(crate) fn compress_worker(
    mode: Mode,
    workers: usize,
    index: usize,
    sealer: &ferry_channel::Sealer,
    rx: &Receiver<Job>,
    tx: &Sender<Job>,
    pool: &BlockPool,
    stats: &Stats,
) {
    let mut c = ferry_compress::Compressor::new(mode);
    c.set_workers(workers);
    c.watch_cpu();
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
            ..
        } = &mut job.kind
        {
            let rate = Stats::get(&stats.link_rate);
            c.set_link_rate(if rate == 0 { None } else { Some(rate as f64) });
            *comp = pool.get();
            let p = c.compress(raw, comp);
            *codec = p.codec;
            *head = block_head(p, index as u8, raw.len());
            let payload = if *codec == Codec::None {
                &raw[..]
            } else {
                &comp[..]
            };
            *sealed = pool.get();
            if sealer
                .seal_data(job.seq, &head[..], payload, sealed)
                .is_ok()
            {
                // Sealed: the frame is all the writer needs, so the input
                // and its compressed copy go back to the pool now, not
                // after the network took the frame.
                pool.put(std::mem::take(raw));
                pool.put(std::mem::take(comp));
            } else {
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
pub(crate) fn net_writer<W: Write>(
    mut w: ChannelWriter<W>,
    first: u64,
    rx: &Receiver<Job>,
    pool: &BlockPool,
    stats: &Stats,
) -> Result<Option<(u64, [u8; 32])>, StreamError> {
    let mut pending = std::collections::BTreeMap::new();
    let mut next = first;
    // How fast the link drains, for the compressors' choice of codec.
    let mut drain = ferry_compress::DrainRate::default();
    let werr = |e: ChannelError| channel_err(e, "sending to the receiver");
    // A keepalive is due KEEPALIVE after the last frame written, however
    // many later blocks arrive meanwhile (one worker slow on block N while
    // the others finish N+1, N+2...: nothing can be written).
    let mut last_write = Instant::now();
    loop {
        let job = match pending.remove(&next) {
            Some(j) => j,
            None => match rx.recv_deadline(last_write + KEEPALIVE) {
                Ok(j) if j.seq == next => j,
                Ok(j) => {
                    pending.insert(j.seq, j);
                    continue;
                }
                Err(RecvTimeoutError::Timeout) => {
                    // The producer is slow: tell the receiver we are alive.
                    w.keepalive().map_err(werr)?;
                    last_write = Instant::now();
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => return Ok(None),
            },
        };
        next += 1;
        match job.kind {
            JobKind::Block {
                raw_len,
                raw,
                comp,
                codec,
                head,
                sealed,
            } => {
                let before = w.wire_bytes;
                let t = Instant::now();
                if sealed.is_empty() {
                    // The worker could not seal it: it kept the payload.
                    let payload = if codec == Codec::None {
                        &raw[..]
                    } else {
                        &comp[..]
                    };
                    w.send_frame2(&head, payload).map_err(werr)?;
                } else if w.next_counter() == job.seq {
                    w.write_sealed(job.seq, &sealed).map_err(werr)?;
                } else {
                    return Err(StreamError::new(
                        ErrorKind::Io,
                        "internal: a sealed block is out of step with the channel",
                    ));
                }
                let now = Instant::now();
                last_write = now;
                let n = w.wire_bytes - before;
                if let Some(rate) = drain.wrote(n, now - t, now) {
                    stats.link_rate.store(rate as u64, Ordering::Relaxed);
                }
                Stats::add(&stats.wire, n);
                Stats::add(&stats.plain_wire, raw_len as u64);
                Stats::add(&stats.plain_out, raw_len as u64);
                Stats::sub(&stats.buffered, raw_len as u64);
                Stats::add(
                    match codec {
                        Codec::None => &stats.blocks_raw,
                        Codec::Lz4 => &stats.blocks_lz4,
                        Codec::Zstd(_) => &stats.blocks_zstd,
                    },
                    1,
                );
                pool.put(raw);
                pool.put(comp);
                pool.put(sealed);
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

pub(crate) fn read_control<R: Read>(mut r: ChannelReader<R>) -> SendEv {
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
    verdict(&frame)
}

/// The receiver's verdict in `frame`: ACK, FAIL, or a protocol error.
pub(crate) fn verdict(frame: &[u8]) -> SendEv {
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
