//! `decompress`: ferry-compress's decoders of compressed blocks from a
//! peer ([`decompress_block`], [`StreamDecoder`]), used by both the sync
//! link (`Compressed` messages) and the stream engine (BLOCK messages).
//!
//! Input: `sel`, `level`, then records. `sel % 3`:
//!
//! * 0: each record is `codec u8`, `raw_len u32 LE`, payload, decoded as
//!   an independent block: success means exactly `raw_len` bytes (a raw
//!   block: the payload itself), and a declared size above the limit is
//!   refused as such, before anything is allocated;
//! * 1: each record is `start u8`, `raw_len u32 LE`, payload, fed in order
//!   to one stream decoder: success means exactly `raw_len` bytes, and
//!   after a failure the stream stays dead until the next start;
//! * 2: each record is plain data, compressed by a real [`Compressor`]
//!   (lz4, or zstd blocks or a zstd stream by `sel`) and decoded as a
//!   receiver does: it must come back unchanged.

use ferry_compress::{
    decompress_block, Codec, Compressor, DecompressError, Mode, StreamDecoder, WIRE_STREAM,
    WIRE_STREAM_START,
};

use crate::util::{records, Bytes};

/// The limit the receivers pass (ferry-stream's block; the sync link's is
/// 8 MiB).
pub const MAX_OUT: usize = 1 << 20;

fn head(r: &[u8]) -> (u8, usize, &[u8]) {
    let mut b = Bytes(r);
    let x = b.u8();
    let raw_len = b.u32() as usize;
    (x, raw_len, b.rest())
}

pub fn run(data: &[u8]) {
    let mut b = Bytes(data);
    let sel = b.u8();
    let level = i32::from(b.u8() as i8);
    let recs: Vec<&[u8]> = records(b.rest()).take(32).collect();
    match sel % 3 {
        0 => blocks(level, &recs),
        1 => stream(&recs),
        _ => roundtrip(sel, level, &recs),
    }
}

fn blocks(level: i32, recs: &[&[u8]]) {
    let mut out = Vec::new();
    for r in recs {
        let (id, raw_len, payload) = head(r);
        let Some(codec) = Codec::from_id(id, level) else {
            continue;
        };
        let res = decompress_block(codec, payload, raw_len, MAX_OUT, &mut out);
        if raw_len > MAX_OUT {
            assert_eq!(res, Err(DecompressError::TooLarge(raw_len, MAX_OUT)));
            continue;
        }
        if res.is_ok() {
            assert_eq!(out.len(), raw_len, "{codec} block of the wrong size");
            if codec == Codec::None {
                assert_eq!(out, payload, "a raw block changed");
            }
        }
    }
}

fn stream(recs: &[&[u8]]) {
    let mut d = StreamDecoder::new();
    let mut out = Vec::new();
    let mut dead = true;
    for r in recs {
        let (start, raw_len, payload) = head(r);
        let start = start & 1 != 0;
        let res = d.decompress(start, payload, raw_len, MAX_OUT, &mut out);
        if raw_len > MAX_OUT {
            assert_eq!(res, Err(DecompressError::TooLarge(raw_len, MAX_OUT)));
        }
        match res {
            Ok(()) => {
                assert!(!dead || start, "a dead stream decoded a continuation");
                assert_eq!(out.len(), raw_len, "a stream block of the wrong size");
                dead = false;
            }
            // A refusal before decoding leaves the stream as it was.
            Err(DecompressError::TooLarge(..)) => {}
            Err(_) => dead = true,
        }
    }
}

fn roundtrip(sel: u8, level: i32, recs: &[&[u8]]) {
    let level = level.rem_euclid(3) + 1;
    let (codec, streaming) = match (sel / 3) % 3 {
        0 => (Codec::Lz4, false),
        1 => (Codec::Zstd(level), false),
        _ => (Codec::Zstd(level), true),
    };
    let mut c = Compressor::new(Mode::Fixed(codec));
    c.set_streaming(streaming);
    let mut d = StreamDecoder::new();
    let mut packed = Vec::new();
    let mut out = Vec::new();
    for r in recs {
        let p = c.compress(r, &mut packed);
        match p.wire_id() {
            0 => {
                assert!(packed.is_empty(), "a raw block with compressed bytes");
                continue;
            }
            WIRE_STREAM | WIRE_STREAM_START => {
                let start = p.wire_id() == WIRE_STREAM_START;
                d.decompress(start, &packed, r.len(), MAX_OUT, &mut out)
                    .unwrap_or_else(|e| panic!("own stream block fails: {e}"));
            }
            _ => decompress_block(p.codec, &packed, r.len(), MAX_OUT, &mut out)
                .unwrap_or_else(|e| panic!("own {} block fails: {e}", p.codec)),
        }
        assert!(out == *r, "{codec} round trip changed the data");
    }
}
