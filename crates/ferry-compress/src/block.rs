//! Independent blocks, both ways: [`BlockEncoder`] packs one block with a
//! given codec (one reusable zstd context per level, per compressor) and
//! [`decompress_block`] unpacks one from a peer (one zstd context per
//! thread).
//!
//! This module does what it is told: it must not choose codecs, measure
//! anything or decide that a block is not worth sending (that is
//! `compressor`, `auto` and `early_abort`). [`decompress_block`] parses
//! untrusted input: it must never produce or allocate more than its
//! `max_out`.

use crate::codec::Codec;
use crate::error::DecompressError;

/// Packs independent blocks; one per [`Compressor`](crate::Compressor).
pub(crate) struct BlockEncoder {
    /// One zstd context per level used so far.
    zstd: Vec<(i32, zstd::bulk::Compressor<'static>)>,
    /// Output of trial runs ([`BlockEncoder::trial`]), kept for reuse.
    scratch: Vec<u8>,
}

impl BlockEncoder {
    pub(crate) fn new() -> BlockEncoder {
        BlockEncoder {
            zstd: Vec::new(),
            scratch: Vec::new(),
        }
    }

    fn zstd_ctx(&mut self, level: i32) -> std::io::Result<&mut zstd::bulk::Compressor<'static>> {
        let pos = match self.zstd.iter().position(|(l, _)| *l == level) {
            // The level used last goes last: the other one is evicted.
            Some(p) => {
                let hit = self.zstd.remove(p);
                self.zstd.push(hit);
                self.zstd.len() - 1
            }
            None => {
                // Contexts of high levels take tens of MiB: keep the two
                // levels used last (least recently used goes), not one per
                // level the choice tried.
                if self.zstd.len() >= 2 {
                    self.zstd.remove(0);
                }
                self.zstd.push((level, zstd::bulk::Compressor::new(level)?));
                self.zstd.len() - 1
            }
        };
        Ok(&mut self.zstd[pos].1)
    }

    /// Compress `input` with `codec` into `out` (cleared first). Returns
    /// false when the codec failed or did not fit, in which case the caller
    /// stores the block raw.
    pub(crate) fn run(&mut self, codec: Codec, input: &[u8], out: &mut Vec<u8>) -> bool {
        out.clear();
        match codec {
            Codec::None => false,
            Codec::Lz4 => {
                out.resize(lz4_flex::block::get_maximum_output_size(input.len()), 0);
                match lz4_flex::block::compress_into(input, out) {
                    Ok(n) => {
                        out.truncate(n);
                        true
                    }
                    Err(_) => false,
                }
            }
            Codec::Zstd(level) => {
                out.reserve(zstd::zstd_safe::compress_bound(input.len()));
                match self.zstd_ctx(level) {
                    Ok(ctx) => ctx.compress_to_buffer(input, out).is_ok(),
                    Err(_) => false,
                }
            }
        }
    }

    /// Compress `sample` with `codec` into the scratch buffer, only to
    /// measure it: the compressed size, or `None` when [`BlockEncoder::run`]
    /// failed.
    pub(crate) fn trial(&mut self, codec: Codec, sample: &[u8]) -> Option<usize> {
        let mut out = std::mem::take(&mut self.scratch);
        let ok = self.run(codec, sample, &mut out);
        let len = out.len();
        self.scratch = out;
        ok.then_some(len)
    }
}

thread_local! {
    static DCTX: std::cell::RefCell<zstd::zstd_safe::DCtx<'static>> =
        std::cell::RefCell::new(zstd::zstd_safe::DCtx::create());
}

/// Clears `out` for a block the sender declared as `raw_len` bytes, which
/// must not be above `max_out` (checked before anything is allocated).
pub(crate) fn start_output(
    out: &mut Vec<u8>,
    raw_len: usize,
    max_out: usize,
) -> Result<(), DecompressError> {
    out.clear();
    if raw_len > max_out {
        return Err(DecompressError::TooLarge(raw_len, max_out));
    }
    Ok(())
}

/// A block must decode to exactly the size declared.
fn exact_size(got: usize, want: usize) -> Result<(), DecompressError> {
    if got != want {
        return Err(DecompressError::WrongSize { got, want });
    }
    Ok(())
}

/// Decompress one block of untrusted `input` into `out` (cleared first).
/// `raw_len` is the size the sender declared; anything above `max_out` is
/// refused before allocating, and a block that decodes to any other size
/// is an error.
pub fn decompress_block(
    codec: Codec,
    input: &[u8],
    raw_len: usize,
    max_out: usize,
    out: &mut Vec<u8>,
) -> Result<(), DecompressError> {
    start_output(out, raw_len, max_out)?;
    match codec {
        Codec::None => {
            exact_size(input.len(), raw_len)?;
            out.extend_from_slice(input);
        }
        Codec::Lz4 => {
            out.resize(raw_len, 0);
            let got = lz4_flex::block::decompress_into(input, out).map_err(|e| {
                DecompressError::Corrupt {
                    codec: "lz4",
                    msg: e.to_string(),
                }
            })?;
            exact_size(got, raw_len)?;
        }
        Codec::Zstd(_) => {
            // The frame's own content size, when present, must agree.
            if let Ok(Some(declared)) = zstd::zstd_safe::get_frame_content_size(input) {
                if declared != raw_len as u64 {
                    return Err(DecompressError::WrongSize {
                        got: usize::try_from(declared).unwrap_or(usize::MAX),
                        want: raw_len,
                    });
                }
            }
            out.resize(raw_len, 0);
            let got = DCTX
                .with(|d| d.borrow_mut().decompress(&mut out[..], input))
                .map_err(|code| DecompressError::Corrupt {
                    codec: "zstd",
                    msg: zstd::zstd_safe::get_error_name(code).to_string(),
                })?;
            exact_size(got, raw_len)?;
        }
    }
    Ok(())
}
