//! The zstd stream, both ends: [`StreamEncoder`] turns a compressor's
//! zstd blocks into flushes of one long-lived stream (window
//! [`STREAM_WINDOW_LOG`], long-distance matching) and [`StreamDecoder`]
//! decodes them, in order, on the receiving side.
//!
//! Owns the stream's life: when it starts, when it must end. It must not
//! choose levels or decide whether a block is sent; the decoder parses
//! untrusted input and must never produce or allocate more than its
//! `max_out`, nor accept a window above [`STREAM_WINDOW_LOG`].

use zstd::stream::raw::{CParameter, DParameter, Decoder, Encoder, InBuffer, Operation, OutBuffer};

use crate::block::start_output;
use crate::error::DecompressError;
use crate::wire::STREAM_WINDOW_LOG;

/// One compressor's zstd stream; one per [`Compressor`](crate::Compressor),
/// so one per sending thread.
pub(crate) struct StreamEncoder {
    /// The live stream and its level, if any.
    live: Option<(i32, Encoder<'static>)>,
    /// The next stream block starts a new stream.
    fresh: bool,
}

impl StreamEncoder {
    pub(crate) fn new() -> StreamEncoder {
        StreamEncoder {
            live: None,
            fresh: true,
        }
    }

    /// Drop the stream: the next block starts a new one.
    pub(crate) fn reset(&mut self) {
        self.live = None;
        self.fresh = true;
    }

    /// `input` as the next block of the zstd stream at `level`, into `out`.
    /// Returns `Some(start)`, or `None` (and ends the stream) when it
    /// failed or did not get smaller: the caller then sends `input` raw.
    pub(crate) fn run(&mut self, level: i32, input: &[u8], out: &mut Vec<u8>) -> Option<bool> {
        self.prepare(level)?;
        let start = self.fresh;
        let ok = self
            .live
            .as_mut()
            .and_then(|(_, e)| encode_flushed(e, input, out));
        if ok.is_none() || out.len() >= input.len() {
            // History the decoder will never see: end this stream.
            self.fresh = true;
            out.clear();
            return None;
        }
        self.fresh = false;
        Some(start)
    }

    /// Make the live stream one at `level`: a new encoder for a new level
    /// (which starts a new stream), a reset one when a new stream is due.
    fn prepare(&mut self, level: i32) -> Option<()> {
        if self.live.as_ref().is_none_or(|(l, _)| *l != level) {
            let mut e = Encoder::new(level).ok()?;
            e.set_parameter(CParameter::WindowLog(STREAM_WINDOW_LOG))
                .ok()?;
            // Long-distance matching finds repeats across the whole window
            // at every level (the fast levels' small hash tables forget
            // them after a few hundred KiB), as `zstd --long` does: ~10%
            // fewer bytes on mixed streams for about the same CPU. The
            // decoder needs nothing new: the window is the same.
            e.set_parameter(CParameter::EnableLongDistanceMatching(true))
                .ok()?;
            self.live = Some((level, e));
            self.fresh = true;
        } else if self.fresh {
            let (_, e) = self.live.as_mut()?;
            e.reinit().ok()?;
        }
        Some(())
    }
}

/// Feed all of `input` to `e` and flush, into `out` (cleared first, never
/// grown beyond the capacity reserved here). `None` when zstd failed,
/// stalled or ran out of room.
fn encode_flushed(e: &mut Encoder<'static>, input: &[u8], out: &mut Vec<u8>) -> Option<()> {
    out.clear();
    out.reserve(zstd::zstd_safe::compress_bound(input.len()) + 1024);
    let cap = out.capacity();
    let mut src = InBuffer::around(input);
    let mut dst = OutBuffer::around(out);
    while src.pos < input.len() {
        let before = (src.pos, dst.pos());
        e.run(&mut src, &mut dst).ok()?;
        if (src.pos, dst.pos()) == before || dst.pos() >= cap {
            return None;
        }
    }
    loop {
        let left = e.flush(&mut dst).ok()?;
        if left == 0 {
            break;
        }
        if dst.pos() >= cap {
            return None;
        }
    }
    Some(())
}

/// Decoder of one compressor's stream blocks (wire ids [`WIRE_STREAM`] and
/// [`WIRE_STREAM_START`]), fed in the order they were made.
///
/// [`WIRE_STREAM`]: crate::WIRE_STREAM
/// [`WIRE_STREAM_START`]: crate::WIRE_STREAM_START
pub struct StreamDecoder {
    dec: Option<Decoder<'static>>,
    /// A stream has started (a continuation before any start is an error).
    live: bool,
}

impl Default for StreamDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl StreamDecoder {
    pub fn new() -> StreamDecoder {
        StreamDecoder {
            dec: None,
            live: false,
        }
    }

    /// Decode the next block (`start`: wire id [`WIRE_STREAM_START`]) into
    /// `out` (cleared first); it must come to exactly `raw_len` bytes, at
    /// most `max_out`. After an error the stream is dead until the next
    /// start.
    ///
    /// [`WIRE_STREAM_START`]: crate::WIRE_STREAM_START
    pub fn decompress(
        &mut self,
        start: bool,
        input: &[u8],
        raw_len: usize,
        max_out: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), DecompressError> {
        start_output(out, raw_len, max_out)?;
        if start {
            match self.dec.as_mut() {
                Some(d) => d.reinit().map_err(|e| corrupt(e.to_string()))?,
                None => {
                    let mut d = Decoder::new().map_err(|e| corrupt(e.to_string()))?;
                    d.set_parameter(DParameter::WindowLogMax(STREAM_WINDOW_LOG))
                        .map_err(|e| corrupt(e.to_string()))?;
                    self.dec = Some(d);
                }
            }
            self.live = true;
        }
        let d = match (self.live, self.dec.as_mut()) {
            (true, Some(d)) => d,
            _ => {
                return Err(corrupt(
                    "continuation of a stream that never started".into(),
                ))
            }
        };
        self.live = false; // until this block decodes cleanly
        decode_exact(d, input, raw_len, out)?;
        self.live = true;
        Ok(())
    }
}

/// Decode all of `input` with `d` into `out`, which must come to exactly
/// `raw_len` bytes, not one more (that would spill into the next block).
fn decode_exact(
    d: &mut Decoder<'static>,
    input: &[u8],
    raw_len: usize,
    out: &mut Vec<u8>,
) -> Result<(), DecompressError> {
    out.resize(raw_len, 0);
    let mut src = InBuffer::around(input);
    let mut dst = OutBuffer::around(&mut out[..]);
    loop {
        let before = (src.pos, dst.pos());
        d.run(&mut src, &mut dst)
            .map_err(|e| corrupt(e.to_string()))?;
        if src.pos == input.len() && dst.pos() == raw_len {
            break;
        }
        if (src.pos, dst.pos()) == before {
            let got = dst.pos();
            return Err(if got < raw_len {
                DecompressError::WrongSize { got, want: raw_len }
            } else {
                corrupt(format!("{} bytes left over", input.len() - src.pos))
            });
        }
    }
    // Output beyond what the block declared would spill into the next.
    let mut probe = [0u8; 1];
    let mut dst = OutBuffer::around(&mut probe[..]);
    d.run(&mut InBuffer::around(&[]), &mut dst)
        .map_err(|e| corrupt(e.to_string()))?;
    if dst.pos() != 0 {
        return Err(corrupt(format!("more than the declared {raw_len} bytes")));
    }
    Ok(())
}

/// A stream block that does not decode.
fn corrupt(msg: String) -> DecompressError {
    DecompressError::Corrupt {
        codec: "zstd stream",
        msg,
    }
}
