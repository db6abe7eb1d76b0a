//! Mode names: parsing and display of `--compress` values.

use super::*;

#[test]
fn parses_modes() {
    assert_eq!("auto".parse::<Mode>().unwrap(), Mode::Auto);
    assert_eq!("none".parse::<Mode>().unwrap(), Mode::Fixed(Codec::None));
    assert_eq!("lz4".parse::<Mode>().unwrap(), Mode::Fixed(Codec::Lz4));
    assert_eq!("zstd".parse::<Mode>().unwrap(), Mode::Fixed(Codec::Zstd(3)));
    assert_eq!(
        "zstd:7".parse::<Mode>().unwrap(),
        Mode::Fixed(Codec::Zstd(7))
    );
    assert!("zstd:0".parse::<Mode>().is_err());
    assert!("zstd:x".parse::<Mode>().is_err());
    assert!("gzip".parse::<Mode>().is_err());
    assert_eq!(Mode::Fixed(Codec::Zstd(7)).to_string(), "zstd:7");
}
