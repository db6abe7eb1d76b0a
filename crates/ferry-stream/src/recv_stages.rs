//! The receiver's pipeline stages: reading, authenticating and
//! decompressing blocks from the network, and writing them to the output
//! while hashing what was written.

use std::io::{self, Read, Write};

use crossbeam_channel::{Receiver, Sender};
use ferry_channel::{ChannelError, ChannelReader, Frame};

use crate::*;

/// Decrypt, decompress, queue. After the queue's consumer is gone, keeps
/// reading and discarding until the peer ends.
pub(crate) fn net_reader<R: Read>(
    mut r: ChannelReader<R>,
    offer: Option<Offer>,
    ring: &Sender<Chunk>,
    pool: &Receiver<Vec<u8>>,
    stats: &Stats,
) -> Result<(), StreamError> {
    let mut discarding = false;
    let mut streams: Vec<Option<ferry_compress::StreamDecoder>> = Vec::new();
    let rerr = |e: ChannelError| channel_err(e, "the sender stopped before the end of the stream");
    let bad = |m: &str| StreamError::new(ErrorKind::Integrity, format!("protocol error: {m}"));
    // START: where the blocks continue the stream.
    let offset = match r.next_frame() {
        Ok(Frame::Data(d)) => resume::parse_start(d).ok_or_else(|| bad("no START"))?,
        Ok(Frame::End) => return Err(bad("channel ended before START")),
        Err(e) => return Err(rerr(e)),
    };
    let have = offer.as_ref().map_or(0, |o| o.have);
    if !resume::start_fits(offset, have) {
        return Err(bad("START at an offset that was not offered"));
    }
    let mut from = (0, Box::new(blake3::Hasher::new()));
    if let Some(o) = offer {
        (o.on_start)(offset)
            .map_err(|e| StreamError::new(ErrorKind::Io, format!("output: {e}")))?;
        if offset > 0 {
            from = (offset, Box::new(o.hasher));
        }
    }
    Stats::add(&stats.resumed, offset);
    if ring.send(Chunk::Start(from.0, from.1)).is_err() {
        discarding = true;
    }
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

pub(crate) fn write_output<W: Write>(
    mut out: W,
    rx: &Receiver<Chunk>,
    pool: &Sender<Vec<u8>>,
    stats: &Stats,
) -> RecvEv {
    let mut hasher = Box::new(blake3::Hasher::new());
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
            Chunk::Start(at, h) => (total, hasher) = (at, h),
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
