//! Names of encodings: the [`Codec`] a block was packed with, the
//! [`Mode`] a compressor runs in, and their `--compress` spelling
//! (parsing and display).
//!
//! Owns only names and their text forms. It must not compress, decide
//! anything, or define wire ids beyond [`Codec::id`] (the stream ids live
//! in `wire`).

use std::fmt;
use std::str::FromStr;

/// A block's encoding on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Codec {
    /// Stored raw.
    None,
    /// LZ4 block format (lz4_flex), no size prefix.
    Lz4,
    /// One zstd frame at the given level.
    Zstd(i32),
}

impl Codec {
    /// One-byte id on the wire (the level travels separately).
    pub fn id(self) -> u8 {
        match self {
            Codec::None => 0,
            Codec::Lz4 => 1,
            Codec::Zstd(_) => 2,
        }
    }

    /// Inverse of [`Codec::id`]; `level` is informational for zstd.
    pub fn from_id(id: u8, level: i32) -> Option<Codec> {
        match id {
            0 => Some(Codec::None),
            1 => Some(Codec::Lz4),
            2 => Some(Codec::Zstd(level)),
            _ => None,
        }
    }

    /// The zstd level (0 for other codecs).
    pub fn level(self) -> i32 {
        match self {
            Codec::Zstd(l) => l,
            _ => 0,
        }
    }
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Codec::None => f.write_str("none"),
            Codec::Lz4 => f.write_str("lz4"),
            Codec::Zstd(l) => write!(f, "zstd:{l}"),
        }
    }
}

/// How a [`Compressor`](crate::Compressor) chooses codecs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Choose per block from measured rates.
    Auto,
    /// Always this codec (still storing incompressible blocks raw).
    Fixed(Codec),
}

/// A `--compress` value that does not parse.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("bad compression mode {0:?}: expected auto, none, lz4, zstd or zstd:LEVEL (1-19)")]
pub struct ParseModeError(pub String);

impl FromStr for Mode {
    type Err = ParseModeError;
    fn from_str(s: &str) -> Result<Mode, ParseModeError> {
        let bad = || ParseModeError(s.to_string());
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Mode::Auto),
            "none" | "off" => Ok(Mode::Fixed(Codec::None)),
            "lz4" => Ok(Mode::Fixed(Codec::Lz4)),
            "zstd" => Ok(Mode::Fixed(Codec::Zstd(3))),
            other => {
                let level = other.strip_prefix("zstd:").ok_or_else(bad)?;
                let level: i32 = level.parse().map_err(|_| bad())?;
                if !(1..=19).contains(&level) {
                    return Err(bad());
                }
                Ok(Mode::Fixed(Codec::Zstd(level)))
            }
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mode::Auto => f.write_str("auto"),
            Mode::Fixed(c) => c.fmt(f),
        }
    }
}
