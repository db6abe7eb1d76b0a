//! [`Compressor`]: the per-thread front end that packs one block at a
//! time. It ties the parts together: early abort, the [`Auto`] choice,
//! the independent-block encoder and the zstd stream.
//!
//! It must stay glue: codec mechanics belong in `block` and `stream`, the
//! rate model in `auto`, the saving threshold in `early_abort`.

use crate::auto::{thread_cpu, Auto};
use crate::block::BlockEncoder;
use crate::codec::{Codec, Mode};
use crate::cpu::Free;
use crate::early_abort::{sample_saves, saves_enough};
use crate::stream::StreamEncoder;
use crate::wire::Packed;

/// Per-block compressor with its reusable contexts and its measurements.
/// One per worker thread.
pub struct Compressor {
    mode: Mode,
    /// zstd contexts and the scratch buffer of trial runs.
    blocks: BlockEncoder,
    /// Estimates and choice of [`Mode::Auto`].
    auto: Auto,
    streaming: bool,
    stream: StreamEncoder,
    /// [`Mode::Auto`] weighs the cores free on this machine (see
    /// [`Compressor::watch_cpu`]).
    watch_cpu: bool,
}

impl Compressor {
    pub fn new(mode: Mode) -> Compressor {
        Compressor {
            mode,
            blocks: BlockEncoder::new(),
            auto: Auto::new(mode),
            streaming: false,
            stream: StreamEncoder::new(),
            watch_cpu: false,
        }
    }

    /// In [`Mode::Auto`], measure the cores free on this machine (idle,
    /// plus what compressing itself uses) and compress only while some
    /// are spare ([`MIN_SPARE_CORES`]): on a saturated machine, a block
    /// waits longer for its compression than the link would have taken
    /// for the bytes it saves, and the CPU it takes slows the link itself
    /// (ssh's cipher, a peer on the same host). Off by default, so that a
    /// compressor's choice does not depend on what else the machine runs
    /// (tests).
    ///
    /// [`MIN_SPARE_CORES`]: crate::auto::MIN_SPARE_CORES
    pub fn watch_cpu(&mut self) {
        self.watch_cpu = true;
    }

    /// Record the cores compression may use and those spare, as
    /// `(free, spare)` (`None`: unknown; see [`crate::auto`]) out of
    /// `cores` this process may use; what [`Compressor::watch_cpu`] does
    /// before each block.
    pub fn set_free_cores(&mut self, free: Option<(f64, f64)>, cores: f64) {
        if self.auto.set_free_cores(free, cores) && self.mode == Mode::Auto {
            self.auto.choose();
        }
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Change the mode in place, keeping contexts, estimates and the
    /// stream (tests of what a level change does to the stream).
    #[cfg(test)]
    pub(crate) fn set_mode(&mut self, mode: Mode) {
        self.mode = mode;
    }

    /// Compress zstd blocks as one stream (see the crate docs): better
    /// ratios, but the receiver must decode this compressor's blocks in
    /// the order they were made, with one [`StreamDecoder`].
    ///
    /// [`StreamDecoder`]: crate::StreamDecoder
    pub fn set_streaming(&mut self, on: bool) {
        self.streaming = on;
        self.stream.reset();
    }

    /// How many workers compress in parallel (multiplies the speed).
    pub fn set_workers(&mut self, n: usize) {
        self.auto.set_workers(n);
    }

    /// Bytes per second of compressed output the link takes when it is the
    /// bottleneck (measured by the caller as bytes written / time blocked in
    /// writes). `None` or 0 means unknown (treated as unlimited).
    pub fn set_link_rate(&mut self, bytes_per_sec: Option<f64>) {
        // A link that turns out much slower or faster than when the level
        // was chosen changes the best level at once: the estimates are
        // already there, so waiting for the next probe (32 MiB of
        // compressible input per worker, which a mostly random or sparse
        // source may never send) would keep a choice made for another link.
        let moved = self.auto.set_link_rate(bytes_per_sec);
        if self.mode == Mode::Auto && moved {
            self.auto.choose();
        }
    }

    /// Tests: take these speeds and ratios as measured (see
    /// `Auto::assume`), so that a decision does not depend on the load
    /// of the machine the test runs on.
    #[cfg(test)]
    pub(crate) fn assume(&mut self, table: &[(f64, f64); crate::LADDER.len() - 1]) {
        self.auto.assume(table);
    }

    /// The codec Auto would use for the next block (or the fixed one).
    pub fn current(&self) -> Codec {
        match self.mode {
            Mode::Auto => self.auto.codec(),
            Mode::Fixed(c) => c,
        }
    }

    /// Early abort: does a cheap pass over a sample of a large block save
    /// enough to be worth a real pass? (Small blocks: always yes.)
    fn sample_saves(&mut self, input: &[u8]) -> bool {
        let cheap = if self.current() == Codec::Lz4 {
            Codec::Lz4
        } else {
            Codec::Zstd(1)
        };
        sample_saves(&mut self.blocks, cheap, input)
    }

    /// Compress one block. Returns the codec used; with [`Codec::None`]
    /// `out` is left empty and the caller sends `input` itself (no copy).
    /// Independent blocks only: streaming is for [`Compressor::compress`].
    pub fn compress_block(&mut self, input: &[u8], out: &mut Vec<u8>) -> Codec {
        let streaming = std::mem::replace(&mut self.streaming, false);
        let p = self.compress(input, out);
        self.streaming = streaming;
        p.codec
    }

    /// Compress one block, as a block of the zstd stream when streaming is
    /// on. With [`Codec::None`] `out` is left empty and the caller sends
    /// `input` itself (no copy).
    pub fn compress(&mut self, input: &[u8], out: &mut Vec<u8>) -> Packed {
        if !(self.watch_cpu && self.mode == Mode::Auto) {
            return self.pack(input, out);
        }
        self.compress_seeing(crate::cpu::free(), input, out)
    }

    /// [`Compressor::compress`] on a machine in the state `free` (see
    /// [`crate::cpu`]): the first window's blocks at the cheapest level,
    /// the measured window's raw, then as the cores allow.
    pub(crate) fn compress_seeing(
        &mut self,
        free: Free,
        input: &[u8],
        out: &mut Vec<u8>,
    ) -> Packed {
        match free {
            // Raw while the first real window is measured: it must show the
            // load of the link's own work (ssh's cipher, the peer), which
            // a block compressed in the dark may be what starves. Measured
            // side by side on the bench's tree (7 runs each): unshaped
            // loopback as fast as before (0.833 s, before 0.830, no
            // compression 0.819); at 1 Gbit/s 1.25 s against 1.29, and a
            // 37 MB push 0.64 s against 0.70.
            Free::Measuring => {
                out.clear();
                return Packed {
                    codec: Codec::None,
                    stream: None,
                };
            }
            Free::Settling => {
                self.auto.unmeasured();
                let t = thread_cpu();
                let p = self.pack_first(input, out);
                crate::cpu::note_compressing(thread_cpu() - t);
                return p;
            }
            Free::Cores { free, spare } => {
                self.set_free_cores(Some((free, spare)), crate::cpu::my_cores())
            }
            Free::Unknown => self.set_free_cores(None, crate::cpu::my_cores()),
        }
        let t = thread_cpu();
        let p = self.pack(input, out);
        crate::cpu::note_compressing(thread_cpu() - t);
        p
    }

    /// A block of the first window (see [`crate::cpu::FIRST_WINDOW`]):
    /// the cheapest level that pays on text (lz4 barely does, on the
    /// bench's), as an independent block, without probes. The bytes that
    /// fill the link's buffers now cross a slow link later; on a fast one
    /// this costs a window's worth of the cheapest level's CPU.
    fn pack_first(&mut self, input: &[u8], out: &mut Vec<u8>) -> Packed {
        out.clear();
        let raw = Packed {
            codec: Codec::None,
            stream: None,
        };
        if input.is_empty() {
            return raw;
        }
        let n = input.len() as u64;
        let saved = sample_saves(&mut self.blocks, Codec::Zstd(1), input)
            && self.blocks.run(Codec::Zstd(1), input, out)
            && saves_enough(out.len(), input.len());
        self.auto.note_mix(n, saved);
        if !saved {
            out.clear();
            return raw;
        }
        Packed {
            codec: Codec::Zstd(1),
            stream: None,
        }
    }

    fn pack(&mut self, input: &[u8], out: &mut Vec<u8>) -> Packed {
        const RAW: Packed = Packed {
            codec: Codec::None,
            stream: None,
        };
        out.clear();
        if input.is_empty() {
            return RAW;
        }
        let n = input.len() as u64;
        let mut sampled = false;
        if self.mode == Mode::Auto && self.auto.starved() {
            // No probes either: they would measure levels that cannot be
            // used, with CPU the link needs (the first block's probe of
            // every level costs several ms).
            return RAW;
        }
        if self.mode == Mode::Auto {
            // Incompressible blocks are stored raw whatever the level, so
            // they say nothing about which level to use: they neither
            // count towards nor trigger a re-evaluation (mixed data would
            // otherwise drag every estimate towards ratio 1).
            // The compressible share is counted from the blocks sampled
            // (while raw is chosen, only those that a probe is due on):
            // what the sample rejects, and then what did not shrink.
            let due = self.auto.due();
            if due || self.current() != Codec::None {
                if !self.sample_saves(input) {
                    self.auto.note_mix(n, false);
                    return RAW;
                }
                sampled = true;
            }
            self.auto.maybe_reevaluate(&mut self.blocks, input);
            self.auto.consumed(n);
        }
        let codec = self.current();
        if codec == Codec::None {
            return RAW;
        }
        // Early abort: a cheap pass over a sample of a large block.
        if self.mode != Mode::Auto && !self.sample_saves(input) {
            return RAW;
        }
        let mut stream = None;
        let ok = match codec {
            Codec::Zstd(level) if self.streaming => {
                stream = self.stream.run(level, input, out);
                stream.is_some()
            }
            _ => self.blocks.run(codec, input, out),
        };
        // A stream block that got smaller goes out whatever it saved: the
        // decoder needs it for the blocks after it.
        let saved = ok && saves_enough(out.len(), input.len());
        if sampled {
            self.auto.note_mix(n, saved);
        }
        let fits = saved || (ok && stream.is_some());
        // Estimates come from the probes only, which measure every level
        // on the same sample: a real block (a stream block above all)
        // would flatter the level in use.
        if !fits {
            out.clear();
            return RAW;
        }
        Packed { codec, stream }
    }
}
