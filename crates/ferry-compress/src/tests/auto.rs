//! [`Mode::Auto`]: the level follows the link rate, at once and without
//! flapping.

use super::*;

#[test]
fn auto_rechooses_at_once_when_the_link_rate_changes() {
    // One block: every level is probed once, on an unmeasured link.
    let data = text(1 << 20, 5);
    let mut k = Compressor::new(Mode::Auto);
    roundtrip(&mut k, &data);
    assert!(
        !matches!(k.current(), Codec::Zstd(l) if l >= 3),
        "an unlimited link wants speed, got {}",
        k.current()
    );
    // The link turns out slow: ratio pays, before any more input.
    k.set_link_rate(Some(1e6));
    assert!(
        matches!(k.current(), Codec::Zstd(l) if l >= 3),
        "{}",
        k.current()
    );
    // A small wobble of the rate does not flip it back and forth.
    let chosen = k.current();
    k.set_link_rate(Some(1.2e6));
    assert_eq!(k.current(), chosen);
    // Fast again: speed pays.
    k.set_link_rate(Some(1e12));
    assert!(
        !matches!(k.current(), Codec::Zstd(l) if l >= 3),
        "{}",
        k.current()
    );
}

#[test]
fn auto_prefers_ratio_on_slow_links_and_speed_on_fast_ones() {
    let data = text(1 << 20, 9);
    let mut slow = Compressor::new(Mode::Auto);
    slow.set_link_rate(Some(1e6));
    let mut fast = Compressor::new(Mode::Auto);
    fast.set_link_rate(Some(1e12));
    for _ in 0..40 {
        roundtrip(&mut slow, &data);
        roundtrip(&mut fast, &data);
    }
    assert!(
        matches!(slow.current(), Codec::Zstd(l) if l >= 3),
        "{}",
        slow.current()
    );
    assert_eq!(fast.current(), Codec::None);
    // And it follows a change of link.
    fast.set_link_rate(Some(1e6));
    for _ in 0..200 {
        roundtrip(&mut fast, &data);
    }
    assert!(
        matches!(fast.current(), Codec::Zstd(_)),
        "{}",
        fast.current()
    );
}
