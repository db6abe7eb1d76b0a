//! Throughput of signature, match and apply. Run with
//! `cargo bench -p ferry-delta --bench delta`.

use std::io::Write;

use divan::counter::BytesCount;
use divan::{black_box, Bencher};
use ferry_delta::{apply_to_vec, signature_of_bytes, signature_of_file, weak_hash, Matcher, Op};

const SIZE: usize = 64 << 20;
const BS: u64 = 8192;
const SEG: usize = 8 << 20;

fn main() {
    divan::main();
}

fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        v.extend_from_slice(&s.to_le_bytes());
    }
    v.truncate(len);
    v
}

fn diff_all(m: &Matcher, src: &[u8]) -> Vec<Op> {
    let mut ops = Vec::new();
    for (k, piece) in src.chunks(SEG).enumerate() {
        m.diff(piece, (k * SEG) as u64, &mut |op| ops.push(op));
    }
    ops
}

#[divan::bench(sample_count = 5)]
fn weak_hash_block(b: Bencher) {
    let data = random_bytes(1, SIZE);
    b.counter(BytesCount::new(SIZE)).bench(|| {
        data.chunks(BS as usize)
            .map(weak_hash)
            .fold(0u64, |a, h| a ^ h)
    });
}

#[divan::bench(sample_count = 5, args = [1, 2])]
fn signature_file(b: Bencher, threads: usize) {
    let data = random_bytes(2, SIZE);
    let mut f = tempfile::tempfile().expect("tempfile");
    f.write_all(&data).expect("write");
    b.counter(BytesCount::new(SIZE))
        .bench(|| signature_of_file(black_box(&f), SIZE as u64, BS, threads).expect("sig"));
}

/// Unchanged file: the aligned fast path only.
#[divan::bench(sample_count = 5)]
fn match_unchanged(b: Bencher) {
    let data = random_bytes(3, SIZE);
    let m = Matcher::new(&signature_of_bytes(&data, BS).0);
    b.counter(BytesCount::new(SIZE))
        .bench(|| diff_all(&m, black_box(&data)));
}

/// 7 bytes inserted at 1 MiB: one rolling search per segment, then the
/// followed phase.
#[divan::bench(sample_count = 5)]
fn match_shifted(b: Bencher) {
    let basis = random_bytes(4, SIZE);
    let mut src = basis.clone();
    src.splice(1 << 20..1 << 20, *b"7 bytes");
    let m = Matcher::new(&signature_of_bytes(&basis, BS).0);
    b.counter(BytesCount::new(src.len()))
        .bench(|| diff_all(&m, black_box(&src)));
}

/// Entirely new data: the worst case, rolling over every byte.
#[divan::bench(sample_count = 3)]
fn match_all_new(b: Bencher) {
    let basis = random_bytes(5, SIZE);
    let src = random_bytes(6, SIZE);
    let m = Matcher::new(&signature_of_bytes(&basis, BS).0);
    b.counter(BytesCount::new(SIZE))
        .bench(|| diff_all(&m, black_box(&src)));
}

/// A sparse image: 90% zeros, the rest unrelated to the basis. Zero runs
/// are passed without rolling.
#[divan::bench(sample_count = 5)]
fn match_sparse_new(b: Bencher) {
    let basis = random_bytes(8, SIZE);
    let mut src = vec![0u8; SIZE];
    for (k, c) in src.chunks_mut(1 << 20).enumerate() {
        let n = c.len() / 10;
        c[..n].copy_from_slice(&random_bytes(100 + k as u64, n));
    }
    let m = Matcher::new(&signature_of_bytes(&basis, BS).0);
    b.counter(BytesCount::new(SIZE))
        .bench(|| diff_all(&m, black_box(&src)));
}

#[divan::bench(sample_count = 5)]
fn apply(b: Bencher) {
    let basis = random_bytes(7, SIZE);
    let mut src = basis.clone();
    src.splice(1 << 20..1 << 20, *b"7 bytes");
    let m = Matcher::new(&signature_of_bytes(&basis, BS).0);
    let ops = diff_all(&m, &src);
    b.counter(BytesCount::new(src.len()))
        .bench(|| apply_to_vec(&basis, src.len() as u64, black_box(&ops), &src));
}
