//! Independent blocks: what gets stored raw, what compresses, round trips
//! of any input, and a decoder that refuses bad input without panicking.

use super::*;
use proptest::prelude::*;

#[test]
fn random_blocks_are_stored_raw() {
    for mode in ["auto", "lz4", "zstd:3"] {
        let mut c = Compressor::new(mode.parse().unwrap());
        for seed in 0..4 {
            assert_eq!(
                roundtrip(&mut c, &random(1 << 20, seed)),
                Codec::None,
                "{mode}"
            );
        }
    }
}

#[test]
fn text_blocks_compress() {
    for mode in ["auto", "lz4", "zstd:1", "zstd:9"] {
        let mut c = Compressor::new(mode.parse().unwrap());
        // Auto compresses only when the link is the bottleneck.
        c.set_link_rate(Some(50e6));
        for seed in 0..4 {
            let codec = roundtrip(&mut c, &text(1 << 20, seed));
            assert_ne!(codec, Codec::None, "{mode}");
        }
    }
}

#[test]
fn decompress_refuses_oversize_and_garbage() {
    let data = text(100_000, 1);
    let mut c = Compressor::new(Mode::Fixed(Codec::Zstd(3)));
    let mut out = Vec::new();
    let codec = c.compress_block(&data, &mut out);
    let mut back = Vec::new();
    assert!(matches!(
        decompress_block(codec, &out, data.len(), 1000, &mut back),
        Err(DecompressError::TooLarge(..))
    ));
    assert!(decompress_block(codec, &out, data.len() - 1, 1 << 20, &mut back).is_err());
    assert!(
        decompress_block(codec, &out[..out.len() / 2], data.len(), 1 << 20, &mut back).is_err()
    );
    assert!(decompress_block(Codec::Lz4, &out, data.len(), 1 << 20, &mut back).is_err());
    assert!(decompress_block(Codec::None, &out, data.len(), 1 << 20, &mut back).is_err());
}

/// A case proptest once found (small repetitive text, Zstd(1)); kept
/// as a plain test so that no seed file is needed.
#[test]
fn roundtrips_short_repetitive_text() {
    let mut c = Compressor::new(Mode::Fixed(Codec::Zstd(1)));
    roundtrip(&mut c, &text(65, 0));
}

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn roundtrips_any_bytes(data in proptest::collection::vec(any::<u8>(), 0..300_000), m in 0usize..4) {
        let mode = [Mode::Auto, Mode::Fixed(Codec::Lz4), Mode::Fixed(Codec::Zstd(1)), Mode::Fixed(Codec::Zstd(5))][m];
        let mut c = Compressor::new(mode);
        roundtrip(&mut c, &data);
    }

    #[test]
    fn roundtrips_repetitive(seed in any::<u64>(), n in 0usize..400_000, m in 0usize..4) {
        let data = text(n, seed);
        let mode = [Mode::Auto, Mode::Fixed(Codec::Lz4), Mode::Fixed(Codec::Zstd(1)), Mode::Fixed(Codec::Zstd(5))][m];
        let mut c = Compressor::new(mode);
        roundtrip(&mut c, &data);
    }

    #[test]
    fn decompress_never_panics(data in proptest::collection::vec(any::<u8>(), 0..4096), id in 0u8..3, raw in 0usize..100_000) {
        let codec = Codec::from_id(id, 3).unwrap();
        let mut out = Vec::new();
        let _ = decompress_block(codec, &data, raw, 65536, &mut out);
        prop_assert!(out.len() <= 65536);
    }
}
