//! The zstd stream: round trips, long-distance repeats, order and
//! integrity checks, level changes and garbage.

use super::*;
use proptest::prelude::*;

#[test]
fn stream_blocks_roundtrip_and_beat_independent_blocks() {
    // Text that repeats at a distance of 3 MiB: independent 1 MiB blocks
    // cannot see it, a stream with an 8 MiB window can.
    let pool = text(3 << 20, 7);
    let mut blocks = Vec::new();
    for i in 0..9 {
        blocks.push(if i % 3 == 2 {
            random(1 << 20, i)
        } else {
            pool[(i as usize % 3) << 20..][..1 << 20].to_vec()
        });
    }
    let mut k = Compressor::new(Mode::Fixed(Codec::Zstd(3)));
    k.set_streaming(true);
    let packed = stream_blocks(&mut k, &blocks);
    assert_eq!(packed[0].0, WIRE_STREAM_START);
    assert_eq!(packed[1].0, WIRE_STREAM);
    assert_eq!(packed[2].0, 0, "random block stored raw");
    assert_eq!(
        packed[3].0, WIRE_STREAM,
        "a raw block does not end the stream"
    );
    assert_eq!(decode_all(&packed).expect("decodes"), blocks);
    let stream_bytes: usize = packed.iter().map(|p| p.2.len()).sum();
    let mut k = Compressor::new(Mode::Fixed(Codec::Zstd(3)));
    let indep: usize = stream_blocks(&mut k, &blocks)
        .iter()
        .map(|p| p.2.len())
        .sum();
    assert!(stream_bytes * 10 < indep * 9, "{stream_bytes} vs {indep}");
}

#[test]
fn stream_finds_repeats_far_beyond_the_fast_levels_reach() {
    // Four distinct MiB of text, then the first again, 4 MiB back: the
    // fastest level's hash table has long forgotten it, long-distance
    // matching has not, so the repeat costs almost nothing.
    let pool = text(4 << 20, 11);
    let mut blocks: Vec<Vec<u8>> = pool.chunks(1 << 20).map(<[u8]>::to_vec).collect();
    blocks.push(blocks[0].clone());
    let mut k = Compressor::new(Mode::Fixed(Codec::Zstd(1)));
    k.set_streaming(true);
    let packed = stream_blocks(&mut k, &blocks);
    assert_eq!(decode_all(&packed).expect("decodes"), blocks);
    let first = packed[0].2.len();
    let repeat = packed[4].2.len();
    assert!(
        repeat * 20 < first,
        "repeat took {repeat} bytes, its first time {first}"
    );
}

#[test]
fn stream_blocks_out_of_order_or_without_start_fail() {
    let blocks: Vec<Vec<u8>> = (0..4).map(|i| text(1 << 18, i)).collect();
    let mut k = Compressor::new(Mode::Fixed(Codec::Zstd(1)));
    k.set_streaming(true);
    let packed = stream_blocks(&mut k, &blocks);
    // Missing the start.
    assert!(decode_all(&packed[1..]).is_err());
    // Two blocks swapped: an error, or at worst different bytes (the
    // engine's digests catch those), never a panic.
    let mut swapped = packed.clone();
    swapped.swap(1, 2);
    if let Ok(got) = decode_all(&swapped) {
        assert_ne!(
            got,
            vec![
                blocks[0].clone(),
                blocks[2].clone(),
                blocks[1].clone(),
                blocks[3].clone()
            ]
        );
    }
    // A lying length.
    let mut lying = packed.clone();
    lying[1].1 -= 1;
    assert!(decode_all(&lying).is_err());
    let mut lying = packed;
    lying[1].1 += 1;
    assert!(decode_all(&lying).is_err());
}

#[test]
fn stream_level_change_starts_a_new_stream() {
    let blocks: Vec<Vec<u8>> = (0..3).map(|i| text(1 << 18, i)).collect();
    let mut k = Compressor::new(Mode::Fixed(Codec::Zstd(1)));
    k.set_streaming(true);
    let mut packed = stream_blocks(&mut k, &blocks[..2]);
    k.set_mode(Mode::Fixed(Codec::Zstd(6)));
    packed.extend(stream_blocks(&mut k, &blocks[2..]));
    assert_eq!(packed[2].0, WIRE_STREAM_START);
    assert_eq!(decode_all(&packed).expect("decodes"), blocks);
}

#[test]
fn first_window_blocks_are_independent_and_interleave_with_the_stream() {
    use crate::cpu::Free;
    let mut k = Compressor::new(Mode::Auto);
    k.set_streaming(true);
    k.set_workers(2);
    k.set_link_rate(Some(50e6));
    k.assume(&TYPICAL);
    let blocks = vec![
        text(1 << 20, 31),
        random(1 << 20, 32),
        text(1 << 20, 33),
        text(1 << 20, 34),
        text(1 << 20, 35),
        text(1 << 20, 36),
    ];
    // The first window, the measured one, cores free, a new first
    // window (after an idle gap), cores free again.
    let phases = [
        Free::Settling,
        Free::Settling,
        Free::Measuring,
        Free::Cores {
            free: 1.5,
            spare: 1.5,
        },
        Free::Settling,
        Free::Cores {
            free: 1.5,
            spare: 1.5,
        },
    ];
    let packed: Vec<(u8, usize, Vec<u8>)> = blocks
        .iter()
        .zip(phases)
        .map(|(b, f)| {
            let mut out = Vec::new();
            let p = k.compress_seeing(f, b, &mut out);
            let data = if p.codec == Codec::None {
                b.clone()
            } else {
                out
            };
            (p.wire_id(), b.len(), data)
        })
        .collect();
    let ids: Vec<u8> = packed.iter().map(|p| p.0).collect();
    let z1 = Codec::Zstd(1).id();
    let raw = Codec::None.id();
    assert_eq!(&ids[..3], [z1, raw, raw], "{ids:?}");
    assert_eq!(ids[3], WIRE_STREAM_START, "{ids:?}");
    assert_eq!(ids[4], z1, "{ids:?}");
    assert_eq!(ids[5], WIRE_STREAM, "{ids:?}");
    assert!(packed[0].2.len() < blocks[0].len() / 2);
    assert_eq!(decode_all(&packed).expect("decodes"), blocks);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn stream_decoder_survives_garbage(
        blocks in proptest::collection::vec((any::<bool>(), proptest::collection::vec(any::<u8>(), 0..300), 0usize..5000), 1..6)
    ) {
        let mut d = StreamDecoder::new();
        for (start, data, n) in blocks {
            let mut out = Vec::new();
            let _ = d.decompress(start, &data, n, 4096, &mut out);
            prop_assert!(out.len() <= 4096);
        }
    }
}
