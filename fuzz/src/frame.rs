//! `frame`: ferry-link's message codec and the byte-stream link's framing.
//!
//! Input: `mode`, two bytes `flip` (u16 LE), then records (see
//! [`crate::util::records`]), each a frame body.
//!
//! * Every record goes through [`ferry_link::decode`] alone: whatever it
//!   accepts keeps the limits the receiver relies on, re-encodes to a
//!   body that decodes to the same message, and the encoding is a fixed
//!   point (canonical).
//! * A byte stream goes through the real reader of [`ferry_link::stream_link`]
//!   (magic, `len`/`!len` header, body, XXH3 check, decode, and the
//!   decompression of `Compressed` messages by `MsgRx`), and what it
//!   delivers and the error it ends with are compared with a model of the
//!   framing written from `docs/PROTOCOL.md`. `mode % 3` picks the stream:
//!   0 the records as well-formed frames (then, with `mode & 4`, one bit
//!   flipped at `flip`), 1 the magic and the raw records area, 2 the raw
//!   records area alone (so the magic is fuzzed too).

use std::io::Cursor;

use ferry_link::codec::{MAX_DATA, MAX_REPORT_ERRORS, MAX_SIG_BLOCKS, MAX_STR, MAX_XATTRS};
use ferry_link::transport::frame_check;
use ferry_link::{
    decode, encode, encoded_len, CompressedData, DecodeError, LinkError, Message, SignaturePart,
    MAGIC, MAX_FRAME,
};

use crate::util::{records, Bytes};

/// Most messages compared per input.
const MAX_MSGS: usize = 256;

pub fn run(data: &[u8]) {
    let mut b = Bytes(data);
    let mode = b.u8();
    let flip = b.u16() as usize;
    let rest = b.rest();
    for body in records(rest).take(MAX_MSGS) {
        check_body(body);
    }
    let stream = match mode % 3 {
        0 => {
            let mut s = MAGIC.to_vec();
            for body in records(rest).take(MAX_MSGS) {
                s.extend_from_slice(&frame_of(body));
            }
            if mode & 4 != 0 && s.len() > MAGIC.len() {
                let bits = (s.len() - MAGIC.len()) * 8;
                let bit = flip % bits;
                s[MAGIC.len() + bit / 8] ^= 1 << (bit % 8);
            }
            s
        }
        1 => [&MAGIC[..], rest].concat(),
        _ => rest.to_vec(),
    };
    compare_with_model(&stream);
}

/// A frame as the writer makes it: `len`, `!len`, body, check.
pub fn frame_of(body: &[u8]) -> Vec<u8> {
    let n = body.len() as u32;
    let mut f = Vec::with_capacity(body.len() + 12);
    f.extend_from_slice(&n.to_le_bytes());
    f.extend_from_slice(&(!n).to_le_bytes());
    f.extend_from_slice(body);
    let check = frame_check(&f);
    f.extend_from_slice(&check.to_le_bytes());
    f
}

/// The decoder alone.
fn check_body(body: &[u8]) {
    let Ok(m) = decode(body) else { return };
    limits(&m);
    let mut e = Vec::new();
    encode(&m, &mut e);
    assert_eq!(encoded_len(&m), e.len() + 12, "encoded_len of {}", m.name());
    let m2 = decode(&e).unwrap_or_else(|err| panic!("re-encoded {} fails: {err}", m.name()));
    if strings_fit(&m) {
        assert_eq!(m2, m, "decode(encode(m)) != m");
    }
    let mut e2 = Vec::new();
    encode(&m2, &mut e2);
    assert_eq!(e2, e, "the encoding of {} is not canonical", m.name());
}

/// The promises of `decode` that the engine relies on.
fn limits(m: &Message) {
    match m {
        Message::Entry(e) => {
            assert!(e.kind.is_some(), "decoded entry without a kind");
            assert!(e.mtime_nsec < 1_000_000_000);
            assert!(e.path.len() <= MAX_STR && e.target.len() <= MAX_STR);
            assert!(e.xattrs.len() <= MAX_XATTRS);
        }
        Message::Signature(SignaturePart {
            block_size,
            weak,
            strong,
            ..
        }) => {
            assert!(*block_size > 0);
            assert_eq!(weak.len(), strong.len());
            assert!(weak.len() <= MAX_SIG_BLOCKS);
        }
        Message::Data { offset, data, .. } => {
            assert!(data.len() <= MAX_DATA);
            assert!(offset.checked_add(data.len() as u64).is_some());
        }
        Message::Zero { offset, len, .. } => assert!(offset.checked_add(*len).is_some()),
        Message::Copy {
            offset,
            basis_offset,
            len,
            ..
        } => {
            assert!(offset.checked_add(*len).is_some());
            assert!(basis_offset.checked_add(*len).is_some());
        }
        Message::ReceiverDone(r) => assert!(r.errors.len() <= MAX_REPORT_ERRORS),
        Message::Compressed(CompressedData {
            offset,
            raw_len,
            data,
            stream,
            ..
        }) => {
            assert!(*raw_len as usize <= MAX_DATA && data.len() <= MAX_DATA);
            assert!(offset.checked_add(u64::from(*raw_len)).is_some());
            let _ = stream;
        }
        _ => {}
    }
}

/// Texts are decoded lossily (invalid UTF-8 grows), and the encoder clips
/// them to [`MAX_STR`]: only texts within it round-trip exactly.
fn strings_fit(m: &Message) -> bool {
    match m {
        Message::FileFailed { error, .. } | Message::Fatal { error, .. } => error.len() <= MAX_STR,
        Message::ReceiverDone(r) => r.errors.iter().all(|e| e.len() <= MAX_STR),
        _ => true,
    }
}

/// Framing version 4 (the magic's 7th byte) made an empty frame a
/// keepalive, which the reader skips.
const KEEPALIVES: bool = MAGIC[6] >= 4;

/// How a stream ends, as the model sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum End {
    Closed,
    BadMagic,
    Version(u8),
    Checksum,
    TooLarge(u64),
    Decode(DecodeError),
}

struct Model {
    msgs: Vec<Message>,
    end: End,
    /// Bytes the reader counts as received.
    counted: u64,
}

/// The framing, from `docs/PROTOCOL.md`: the 8-byte magic (another
/// framing version is named as such), then frames of `len u32 LE`, `!len`,
/// `len` bytes of body and the low 32 bits of XXH3-64 over header and body
/// (an empty body: a keepalive, from framing version 4).
fn model(s: &[u8]) -> Model {
    let done = |msgs, end, counted| Model { msgs, end, counted };
    if s.is_empty() {
        return done(vec![], End::Closed, 0);
    }
    if s.len() < 8 {
        return done(vec![], End::BadMagic, 0);
    }
    if s[..6] == MAGIC[..6] && s[7] == b'\n' && s[6] != MAGIC[6] {
        return done(vec![], End::Version(s[6]), 0);
    }
    if s[..8] != MAGIC[..] {
        return done(vec![], End::BadMagic, 0);
    }
    let mut msgs = Vec::new();
    let mut counted = 8u64;
    let mut p = &s[8..];
    loop {
        if p.len() < 8 {
            return done(msgs, End::Closed, counted);
        }
        let n = u32::from_le_bytes([p[0], p[1], p[2], p[3]]);
        let not_n = u32::from_le_bytes([p[4], p[5], p[6], p[7]]);
        if not_n != !n {
            return done(msgs, End::Checksum, counted);
        }
        if n as usize > MAX_FRAME {
            return done(msgs, End::TooLarge(n.into()), counted);
        }
        let total = 8 + n as usize + 4;
        if p.len() < total {
            return done(msgs, End::Closed, counted);
        }
        counted += total as u64;
        let (frame, tail) = p.split_at(total);
        let check = u32::from_le_bytes(frame[total - 4..].try_into().expect("4 bytes"));
        if check != frame_check(&frame[..total - 4]) {
            return done(msgs, End::Checksum, counted);
        }
        if n == 0 && KEEPALIVES {
            p = tail;
            continue;
        }
        match decode(&frame[8..total - 4]) {
            Ok(m) => msgs.push(m),
            Err(e) => return done(msgs, End::Decode(e), counted),
        }
        if msgs.len() > MAX_MSGS * 4 {
            // Enough compared; the real reader is cut short the same way.
            return done(msgs, End::Closed, counted);
        }
        p = tail;
    }
}

fn end_of(e: &LinkError) -> Option<End> {
    Some(match e {
        LinkError::Closed => End::Closed,
        LinkError::BadMagic(_) => End::BadMagic,
        LinkError::Version(v) => End::Version(*v),
        LinkError::Checksum => End::Checksum,
        LinkError::FrameTooLarge(n) => End::TooLarge(*n),
        LinkError::Decode(d) => End::Decode(d.clone()),
        // I/O, corrupt compressed blocks, time-outs: not framing.
        _ => return None,
    })
}

fn compare_with_model(stream: &[u8]) {
    let want = model(stream);
    if want.msgs.len() > MAX_MSGS * 4 {
        return;
    }
    let threads = crate::util::Threads::before();
    let (ep, flushed) =
        ferry_link::stream_link_flushed(Cursor::new(stream.to_vec()), std::io::sink());
    let mut got = Vec::new();
    let end = loop {
        match ep.rx.recv() {
            Ok(m) => got.push(m),
            Err(e) => break e,
        }
    };
    let counted = ep.received.get();
    drop(ep);
    flushed.wait();
    threads.settle("the stream link");

    // A Compressed message reaches the engine as the Data it unpacks to,
    // or stops the link there as corrupt.
    for (i, g) in got.iter().enumerate() {
        let w = want.msgs.get(i).unwrap_or_else(|| {
            panic!(
                "the reader delivered {} beyond the model's {} messages",
                g.name(),
                want.msgs.len()
            )
        });
        match (w, g) {
            (
                Message::Compressed(CompressedData {
                    file,
                    offset,
                    codec,
                    raw_len,
                    data: packed,
                    ..
                }),
                Message::Data {
                    file: f2,
                    offset: o2,
                    data,
                },
            ) => {
                assert_eq!((file, offset), (f2, o2), "unpacked Data moved");
                assert_eq!(data.len(), *raw_len as usize, "unpacked to another size");
                if *codec == 0 {
                    assert_eq!(data, packed, "a raw 'compressed' block changed");
                }
            }
            (w, g) => assert_eq!(g, w, "message {i} differs from the model"),
        }
    }
    if got.len() < want.msgs.len() {
        // Stopped early: only at a Compressed message that does not unpack.
        let w = &want.msgs[got.len()];
        assert!(
            matches!(w, Message::Compressed(CompressedData { .. }))
                && matches!(
                    end,
                    LinkError::Corrupt(_) | LinkError::Decode(DecodeError::BadValue(_))
                ),
            "the reader stopped at message {} ({}) with {end:?}; the model goes on to {:?}",
            got.len(),
            w.name(),
            want.end
        );
        return;
    }
    assert_eq!(
        end_of(&end),
        Some(want.end.clone()),
        "the link ended with {end:?}, the model with {:?}",
        want.end
    );
    assert_eq!(counted, want.counted, "bytes counted as received");
}
