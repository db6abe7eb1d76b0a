//! Early abort: is a block worth compressing at all? A cheap pass over a
//! [`SAMPLE`] from the middle of a large block must save at least
//! [`MIN_SAVING_PCT`] percent, and so must the whole block afterwards.
//!
//! Owns the threshold and the sampling. It must not choose the codec
//! (the caller passes the cheap one) nor touch the rate estimates.

use crate::block::BlockEncoder;
use crate::codec::Codec;

/// Blocks saving less than this percentage are stored raw.
pub const MIN_SAVING_PCT: usize = 3;
/// Size of the sample used for early abort and probing.
pub const SAMPLE: usize = 64 << 10;

/// Does `packed` bytes for `raw` bytes of input save at least
/// [`MIN_SAVING_PCT`] percent?
pub(crate) fn saves_enough(packed: usize, raw: usize) -> bool {
    packed * 100 < raw * (100 - MIN_SAVING_PCT)
}

/// Does a pass of `cheap` over a sample of a large block save enough to be
/// worth a real pass? (Small blocks: always yes.)
pub(crate) fn sample_saves(enc: &mut BlockEncoder, cheap: Codec, input: &[u8]) -> bool {
    if input.len() <= 2 * SAMPLE {
        return true;
    }
    let sample = sample_of(input);
    matches!(enc.trial(cheap, sample), Some(n) if saves_enough(n, sample.len()))
}

/// Up to `n` bytes from the middle of `input`.
pub(crate) fn middle(input: &[u8], n: usize) -> &[u8] {
    if input.len() <= n {
        return input;
    }
    let start = (input.len() - n) / 2;
    &input[start..start + n]
}

/// Up to [`SAMPLE`] bytes from the middle of `input`.
fn sample_of(input: &[u8]) -> &[u8] {
    middle(input, SAMPLE)
}
