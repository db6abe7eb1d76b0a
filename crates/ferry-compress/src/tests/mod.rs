//! Tests of the crate through its public API (and `compress_seeing`, the
//! machine's phases given by hand), by topic: `codec` (mode
//! names), `block` (independent blocks and their decoder), `auto` (the
//! adaptive choice), `stream` (the zstd stream, both ends). This file
//! holds only the data generators and round-trip helpers they share; it
//! must not hold tests itself.

use crate::*;
use rand::{Rng, SeedableRng};

mod auto;
mod block;
mod codec;
mod stream;

fn text(n: usize, seed: u64) -> Vec<u8> {
    let words = [
        "ferry ",
        "moves ",
        "data ",
        "between ",
        "hosts ",
        "at ",
        "line ",
        "rate ",
        "zfs ",
        "send ",
        "snapshot ",
        "pool/",
        "dataset@",
        "2026-12-02 ",
        "INFO ",
        "block=",
        "\n",
    ];
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    let mut v = Vec::with_capacity(n + 16);
    while v.len() < n {
        v.extend_from_slice(words[r.random_range(0..words.len())].as_bytes());
        if r.random_range(0..8) == 0 {
            v.extend_from_slice(r.random_range(0..100000u32).to_string().as_bytes());
        }
    }
    v.truncate(n);
    v
}

fn random(n: usize, seed: u64) -> Vec<u8> {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    let mut v = vec![0u8; n];
    r.fill(&mut v[..]);
    v
}

/// Speeds (bytes/s per worker, one core each) and ratios of the ladder's codecs after
/// `None`, as this kind of machine measures them on `text`: the tests of
/// Auto's decisions take these instead of probing, whose figures follow
/// the load of the machine (a CI run of tests in parallel).
const TYPICAL: [(f64, f64); LADDER.len() - 1] = [
    (800e6, 2.2),
    (400e6, 3.0),
    (250e6, 3.4),
    (80e6, 3.7),
    (40e6, 3.9),
];

fn roundtrip(c: &mut Compressor, data: &[u8]) -> Codec {
    let mut out = Vec::new();
    let codec = c.compress_block(data, &mut out);
    let wire: &[u8] = if codec == Codec::None { data } else { &out };
    let mut back = Vec::new();
    decompress_block(codec, wire, data.len(), 1 << 20, &mut back).unwrap();
    assert_eq!(back, data);
    codec
}

fn stream_blocks(k: &mut Compressor, blocks: &[Vec<u8>]) -> Vec<(u8, usize, Vec<u8>)> {
    blocks
        .iter()
        .map(|b| {
            let mut out = Vec::new();
            let p = k.compress(b, &mut out);
            if p.codec == Codec::None {
                (p.wire_id(), b.len(), b.clone())
            } else {
                (p.wire_id(), b.len(), out)
            }
        })
        .collect()
}

fn decode_all(packed: &[(u8, usize, Vec<u8>)]) -> Result<Vec<Vec<u8>>, DecompressError> {
    let mut d = StreamDecoder::new();
    packed
        .iter()
        .map(|(id, n, data)| {
            let mut out = Vec::new();
            match *id {
                WIRE_STREAM | WIRE_STREAM_START => {
                    d.decompress(*id == WIRE_STREAM_START, data, *n, 8 << 20, &mut out)?
                }
                id => decompress_block(
                    Codec::from_id(id, 0).expect("known id"),
                    data,
                    *n,
                    8 << 20,
                    &mut out,
                )?,
            }
            Ok(out)
        })
        .collect()
}
