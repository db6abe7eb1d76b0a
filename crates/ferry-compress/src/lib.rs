//! Per-block adaptive compression for ferry's streams.
//!
//! A stream is cut into blocks (1 MiB by default); each block is compressed
//! on its own and tagged with the [`Codec`] that was used, so the receiver
//! needs no state and the sender may change its mind at any block.
//!
//! [`Compressor::compress_block`] does two things that `zstd --adapt` does
//! not:
//!
//! * **Early abort.** Before spending a zstd pass on a block it compresses a
//!   64 KiB sample from the middle of the block with a cheap codec; when that
//!   saves less than [`MIN_SAVING_PCT`] percent, the block is stored raw.
//!   Whole blocks that come out larger than that threshold are stored raw too.
//! * **Rate-driven choice** (in [`Mode::Auto`]). The caller reports how fast
//!   the link drains compressed bytes ([`Compressor::set_link_rate`]) and how
//!   many workers compress in parallel; the compressor measures its own
//!   speed and ratio per codec, and the share `c` of the input that
//!   compresses at all. The codec chosen maximises the *effective input
//!   rate*: the slower of the link, `link_rate / (1 - c + c / ratio)`, and
//!   the cores, `speed x cores / c` (see `auto`). With
//!   [`Compressor::watch_cpu`] the cores are those free on the machine
//!   (`cpu`), the first 100 ms of a run (and of a run after 2 s without a
//!   block) go as independent zstd level 1 blocks, and the next 100 ms,
//!   which are measured, raw. Estimates of the
//!   codec in use come from every real block (so they track the data); its
//!   neighbours on the [`LADDER`] are probed on a sample every
//!   [`REEVALUATE_EVERY`] bytes, and every codec is probed every
//!   [`FULL_PROBE_EVERY`] bytes, so a change in data or link is noticed
//!   within a few MiB, not after 32 MiB jobs, and the choice never sticks.
//!
//! **Streams.** With [`Compressor::set_streaming`], zstd blocks are not
//! independent frames but flushes of one long-lived zstd stream per
//! compressor (window [`STREAM_WINDOW_LOG`], with long-distance matching
//! as in `zstd --long`), so a block can refer to the blocks before it, as
//! `zstd | mbuffer` and rsync's `-z` do, and to repeats a few MiB back,
//! which they miss. Such a block
//! ([`Packed::stream`]) must be decoded in order by one [`StreamDecoder`];
//! the first block of a stream says so, and a block that was fed to the
//! stream but not sent ends it.
//!
//! [`decompress_block`] and [`StreamDecoder`] are parsers of untrusted
//! input: they never produce or allocate more than the `max_out` they are
//! given, and a stream's window is capped at [`STREAM_WINDOW_LOG`].
//!
//! **Layout.** `codec` names the encodings and modes; `wire` holds the
//! wire ids; `block` packs and unpacks independent blocks; `stream` is
//! the zstd stream, both ends; `early_abort` decides whether a block is
//! worth a pass; `auto` measures the codecs and picks one; `drain` estimates the link's
//! drain rate and `cpu` the cores free on the machine that `auto` weighs them against; `compressor`
//! ties them into [`Compressor`]. Every public item is re-exported here.

mod auto;
mod block;
mod codec;
mod compressor;
mod cpu;
mod drain;
mod early_abort;
mod error;
mod stream;
mod wire;

#[cfg(test)]
mod tests;

pub use auto::{
    FULL_PROBE_EVERY, LADDER, MIN_SPARE_CORES, PROBE_SAMPLE, REEVALUATE_EVERY, RESUME_SPARE_CORES,
    STARVED_LINK_MAX,
};
pub use block::decompress_block;
pub use codec::{Codec, Mode, ParseModeError};
pub use compressor::Compressor;
pub use drain::DrainRate;
pub use early_abort::{MIN_SAVING_PCT, SAMPLE};
pub use error::DecompressError;
pub use stream::StreamDecoder;
pub use wire::{Packed, STREAM_WINDOW_LOG, WIRE_STREAM, WIRE_STREAM_START};
