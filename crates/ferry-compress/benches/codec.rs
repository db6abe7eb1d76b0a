//! Compress / decompress throughput of one 1 MiB block, random and
//! text-like. Run with `cargo bench -p ferry-compress`; divan prints time
//! per block and, through `bytes_count`, MB/s.

use divan::counter::BytesCount;
use divan::Bencher;
use ferry_compress::{decompress_block, Codec, Compressor, Mode};
use rand::{Rng, SeedableRng};

fn main() {
    divan::main();
}

const BLOCK: usize = 1 << 20;

fn text(n: usize) -> Vec<u8> {
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
    let mut r = rand::rngs::StdRng::seed_from_u64(7);
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

fn random(n: usize) -> Vec<u8> {
    let mut r = rand::rngs::StdRng::seed_from_u64(7);
    let mut v = vec![0u8; n];
    r.fill(&mut v[..]);
    v
}

fn data(kind: &str) -> Vec<u8> {
    if kind == "random" {
        random(BLOCK)
    } else {
        text(BLOCK)
    }
}

const MODES: &[&str] = &["auto", "lz4", "zstd:1", "zstd:3", "zstd:6"];

#[divan::bench(args = MODES)]
fn compress_random(b: Bencher, mode: &str) {
    compress(b, mode, "random")
}

#[divan::bench(args = MODES)]
fn compress_text(b: Bencher, mode: &str) {
    compress(b, mode, "text")
}

fn compress(b: Bencher, mode: &str, kind: &str) {
    let input = data(kind);
    let mut c = Compressor::new(mode.parse::<Mode>().expect("mode"));
    let mut out = Vec::new();
    b.counter(BytesCount::new(BLOCK))
        .bench_local(|| c.compress_block(&input, &mut out));
}

#[divan::bench(args = ["lz4", "zstd:1", "zstd:3", "zstd:6"])]
fn decompress_text(b: Bencher, mode: &str) {
    let input = data("text");
    let mut c = Compressor::new(mode.parse::<Mode>().expect("mode"));
    let mut z = Vec::new();
    let codec = c.compress_block(&input, &mut z);
    assert_ne!(codec, Codec::None);
    let mut out = Vec::new();
    b.counter(BytesCount::new(BLOCK))
        .bench_local(|| decompress_block(codec, &z, BLOCK, BLOCK, &mut out).expect("decompress"));
}
