//! [`Mode::Auto`]'s decision: per-codec estimates of speed and ratio,
//! measured by probes on a sample, and the choice of the [`LADDER`] entry
//! that maximises the effective input rate, with hysteresis. Of each input
//! byte a share `c` is compressible (the rest goes raw, at no CPU cost,
//! but through the same link); the input rate is what the slower of the
//! two allows: the link, `link_rate / (1 - c + c / ratio)`, or the cores
//! compressing, `speed x cores / c`.
//!
//! Owns the estimates, the link rate and worker count, and when to probe.
//! It must not pack real blocks or decide early abort (that is
//! `compressor` and `early_abort`); it only runs trial compressions
//! through the [`BlockEncoder`] it is handed.

use crate::block::BlockEncoder;
use crate::codec::{Codec, Mode};
use crate::early_abort::middle;

/// The codecs [`Mode::Auto`] chooses from, fastest first.
pub const LADDER: [Codec; 6] = [
    Codec::None,
    Codec::Lz4,
    Codec::Zstd(1),
    Codec::Zstd(3),
    Codec::Zstd(6),
    Codec::Zstd(9),
];
/// Input bytes between probes of the current codec's neighbours.
pub const REEVALUATE_EVERY: u64 = 32 << 20;
/// Input bytes between probes of every codec.
pub const FULL_PROBE_EVERY: u64 = 128 << 20;
/// Size of the sample the level probes compress.
pub const PROBE_SAMPLE: usize = 256 << 10;
/// Speed assumed for storing raw (a copy), bytes/s per worker.
const RAW_SPEED: f64 = 8e9;
/// A new choice must beat the current one by this factor.
const HYSTERESIS: f64 = 1.05;
/// A link rate this many times above or below the one the level was
/// chosen at makes the compressor choose again.
const RATE_CHANGE: f64 = 1.5;
/// With fewer spare cores than this (idle, within this process's share,
/// not counting what compressing itself uses; see [`crate::cpu`]; on a
/// process allowed fewer than two cores, an eighth of its share) the
/// machine is saturated: the link's own work (ssh's cipher, a peer on the
/// same host) is what holds it, and compressing only takes CPU from it.
/// Every codec but None is taken as moving nothing, unless the link is
/// slower than [`STARVED_LINK_MAX`]. Measured on two cores: a loopback ssh
/// link leaves 0.0-0.3 of a core spare, a 1 Gbit/s one 0.3-1.1.
pub const MIN_SPARE_CORES: f64 = 0.25;
/// ... and compression comes back only once this many are spare again
/// (0.225 of the share of a process allowed fewer), so that an estimate
/// hovering at the limit does not flip it every window.
pub const RESUME_SPARE_CORES: f64 = 0.45;
/// A link this slow (bytes/s) is worth compressing for even on a busy
/// machine: a quarter of a core of the fastest level outruns it.
pub const STARVED_LINK_MAX: f64 = 32e6;
/// The cores a starved compressor is taken to get anyway (its share of a
/// busy machine's scheduler).
const STARVED_CORES: f64 = 0.25;
/// Input bytes over which the compressible share is averaged.
const MIX_HORIZON: f64 = (16 << 20) as f64;

#[derive(Debug, Clone, Copy)]
struct Estimate {
    /// Input bytes per second per worker.
    speed: f64,
    /// Input bytes / output bytes.
    ratio: f64,
    known: bool,
}

/// The measurements and the current choice of one compressor.
pub(crate) struct Auto {
    est: [Estimate; LADDER.len()],
    /// Index into [`LADDER`] of the codec in use.
    current: usize,
    workers: f64,
    /// Cores compression may use, when measured (see [`crate::cpu`]), and
    /// the process's share of the machine they are out of.
    free: Option<f64>,
    cores: f64,
    /// Too few free cores to compress (with hysteresis).
    starved: bool,
    link_rate: f64,
    /// The link rate when the level was last chosen.
    chosen_at_rate: f64,
    since_eval: u64,
    since_full: u64,
    /// The share of input bytes that is compressible (passes the early
    /// abort): 1 until blocks say otherwise.
    mix: f64,
}

impl Auto {
    pub(crate) fn new(mode: Mode) -> Auto {
        let est = [Estimate {
            speed: 0.0,
            ratio: 1.0,
            known: false,
        }; LADDER.len()];
        let current = match mode {
            Mode::Auto => 1,
            Mode::Fixed(c) => LADDER.iter().position(|x| *x == c).unwrap_or(0),
        };
        let mut est = est;
        est[0] = Estimate {
            speed: RAW_SPEED,
            ratio: 1.0,
            known: true,
        };
        Auto {
            est,
            current,
            workers: 1.0,
            free: None,
            cores: 1.0,
            starved: false,
            link_rate: f64::INFINITY,
            chosen_at_rate: f64::INFINITY,
            since_eval: 0,
            since_full: FULL_PROBE_EVERY, // probe everything on the first block
            mix: 1.0,
        }
    }

    /// The ladder entry currently chosen.
    pub(crate) fn codec(&self) -> Codec {
        LADDER[self.current]
    }

    /// Too few cores are spare to compress for this link (see
    /// [`MIN_SPARE_CORES`], [`STARVED_LINK_MAX`]).
    pub(crate) fn starved(&self) -> bool {
        self.starved && self.link_rate > STARVED_LINK_MAX
    }

    /// How many workers compress in parallel (multiplies the speed).
    pub(crate) fn set_workers(&mut self, n: usize) {
        self.workers = n.max(1) as f64;
    }

    /// Record the cores compression may use and the spare ones (`None`:
    /// unknown, the workers' count alone; see [`crate::cpu::Free`]).
    /// Returns true when the choice should be made again: compression
    /// became starved or fed, or the free cores moved by more than
    /// [`RATE_CHANGE`].
    pub(crate) fn set_free_cores(&mut self, free: Option<(f64, f64)>, cores: f64) -> bool {
        let old = (self.free, self.starved);
        self.free = free.map(|(f, _)| f);
        self.cores = cores.max(0.5);
        let (starve, resume) = (
            MIN_SPARE_CORES.min(0.125 * self.cores),
            RESUME_SPARE_CORES.min(0.225 * self.cores),
        );
        // The first measure must show as many spare cores as coming back
        // does: a link that saturates the machine may leave a third of a
        // core idle in one window (loopback ssh, two cores).
        self.starved = match free {
            None => false,
            Some((_, spare)) if self.starved || old.0.is_none() => spare < resume,
            Some((_, spare)) => spare < starve,
        };
        match (old.0, self.free) {
            _ if old.1 != self.starved => true,
            (Some(a), Some(b)) => {
                !(1.0 / RATE_CHANGE..=RATE_CHANGE).contains(&(b.max(0.01) / a.max(0.01)))
            }
            (a, b) => a.is_some() != b.is_some(),
        }
    }

    /// The cores are to be measured afresh (a first window again, after
    /// an idle gap): the next measure is a first one.
    pub(crate) fn unmeasured(&mut self) {
        self.free = None;
    }

    /// Record the link rate (`None` or 0: unlimited). Returns true when it
    /// moved more than [`RATE_CHANGE`] away from the rate of the last
    /// choice, so that the caller should [`Auto::choose`] again.
    pub(crate) fn set_link_rate(&mut self, bytes_per_sec: Option<f64>) -> bool {
        self.link_rate = match bytes_per_sec {
            Some(r) if r > 0.0 && r.is_finite() => r,
            _ => f64::INFINITY,
        };
        let same = self.link_rate == self.chosen_at_rate
            || (1.0 / RATE_CHANGE..=RATE_CHANGE).contains(&(self.link_rate / self.chosen_at_rate));
        !same
    }

    /// Enough input went by since the last probe for another one.
    pub(crate) fn due(&self) -> bool {
        self.since_eval >= REEVALUATE_EVERY || self.since_full >= FULL_PROBE_EVERY
    }

    /// Count `n` bytes of input towards the next probe.
    pub(crate) fn consumed(&mut self, n: u64) {
        self.since_eval += n;
        self.since_full += n;
    }

    /// A block of `n` input bytes was found compressible or not (by the
    /// early abort's sample).
    pub(crate) fn note_mix(&mut self, n: u64, compressible: bool) {
        let x = if compressible { 1.0 } else { 0.0 };
        self.mix += (x - self.mix) * (n as f64 / MIX_HORIZON).min(1.0);
    }

    /// Effective input rate of ladder entry `i` under the current estimates.
    fn effective(&self, i: usize) -> f64 {
        let e = self.est[i];
        if i == 0 {
            return (e.speed * self.workers).min(self.link_rate);
        }
        let cores = match self.free {
            _ if self.starved && self.link_rate > STARVED_LINK_MAX => return 0.0,
            Some(f) if self.starved => f.max(STARVED_CORES).min(self.workers),
            Some(f) => f.min(self.workers),
            None => self.workers,
        };
        input_rate(self.mix, e.speed * cores, self.link_rate, e.ratio)
    }

    /// Measure ladder entry `i` on `sample` and fold it into the estimates.
    fn probe(&mut self, enc: &mut BlockEncoder, i: usize, sample: &[u8]) {
        if i == 0 || sample.is_empty() {
            return;
        }
        // CPU time of this thread, not wall time: a probe preempted by the
        // other end's threads would otherwise look several times slower.
        let t = thread_cpu();
        let packed = enc.trial(LADDER[i], sample);
        let secs = (thread_cpu() - t).max(1e-7);
        let ratio = match packed {
            Some(n) if n > 0 => sample.len() as f64 / n as f64,
            _ => 1.0,
        };
        self.update(i, sample.len() as f64 / secs, ratio, 0.5);
    }

    fn update(&mut self, i: usize, speed: f64, ratio: f64, weight: f64) {
        let e = &mut self.est[i];
        if e.known {
            e.speed = e.speed * (1.0 - weight) + speed * weight;
            e.ratio = e.ratio * (1.0 - weight) + ratio * weight;
        } else {
            *e = Estimate {
                speed,
                ratio,
                known: true,
            };
        }
    }

    /// Take `table` (speed in bytes/s per worker, ratio) as measured for
    /// ladder entries 1.., and hold off probes for a while: tests of the
    /// decision must not hang on how fast this machine compresses now.
    #[cfg(test)]
    pub(crate) fn assume(&mut self, table: &[(f64, f64); LADDER.len() - 1]) {
        for (e, &(speed, ratio)) in self.est[1..].iter_mut().zip(table) {
            *e = Estimate {
                speed,
                ratio,
                known: true,
            };
        }
        self.since_eval = 0;
        self.since_full = 0;
        self.choose();
    }

    /// Re-probe and re-choose if enough input went by since last time.
    pub(crate) fn maybe_reevaluate(&mut self, enc: &mut BlockEncoder, input: &[u8]) {
        if !self.due() {
            return;
        }
        // Probes see a bigger sample than the early abort: on 64 KiB a
        // level's fixed set-up cost hides its real speed and ratio.
        let sample = middle(input, PROBE_SAMPLE);
        if self.since_full >= FULL_PROBE_EVERY {
            for i in 1..LADDER.len() {
                self.probe(enc, i, sample);
            }
            self.since_full = 0;
        } else {
            self.probe(enc, self.current, sample);
            if self.current > 0 {
                self.probe(enc, self.current - 1, sample);
            }
            if self.current + 1 < LADDER.len() {
                self.probe(enc, self.current + 1, sample);
            }
        }
        self.since_eval = 0;
        self.choose();
    }

    /// Pick the ladder entry with the best effective rate under the
    /// current estimates and link rate.
    pub(crate) fn choose(&mut self) {
        self.chosen_at_rate = self.link_rate;
        let cur = self.effective(self.current);
        let mut best = self.current;
        for i in 0..LADDER.len() {
            if self.est[i].known && self.effective(i) > self.effective(best) {
                best = i;
            }
        }
        if best != self.current && self.effective(best) > cur * HYSTERESIS {
            self.current = best;
        }
    }
}

/// Input bytes a second of a stream whose share `c` is compressible, its
/// compressible bytes packed at `ratio` by cores that take `cpu` bytes a
/// second, the rest sent raw, all through a link of `link` bytes a second.
/// The early abort's sample costs CPU on every block, compressible or
/// not: about this share of a pass over the block at the level in use.
pub(crate) fn input_rate(c: f64, cpu: f64, link: f64, ratio: f64) -> f64 {
    let c = if c.is_nan() { 1.0 } else { c.clamp(0.0, 1.0) };
    let by_link = link / (1.0 - c + c / ratio.max(1.0));
    by_link.min(cpu / (c + (1.0 - c) * SAMPLE_COST))
}

/// What the early abort's sample of a block costs, as a share of a full
/// pass over it (64 KiB of a 1 MiB block, at the cheapest level).
const SAMPLE_COST: f64 = 0.1;

/// Seconds of CPU this thread has used.
pub(crate) fn thread_cpu() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6 * b.abs().max(1.0)
    }

    #[test]
    fn the_input_rate_is_what_the_slower_of_link_and_cores_allows() {
        // All compressible: the old min(speed x cores, link x ratio).
        assert!(close(input_rate(1.0, 300e6, 100e6, 2.0), 200e6));
        assert!(close(input_rate(1.0, 150e6, 100e6, 2.0), 150e6));
        // Half of it random: the link carries that half raw, and the
        // cores compress only the other half (and sample the random one).
        assert!(close(input_rate(0.5, 150e6, 100e6, 2.0), 100e6 / 0.75));
        let sampled = 0.5 + 0.5 * SAMPLE_COST;
        assert!(close(input_rate(0.5, 50e6, 100e6, 2.0), 50e6 / sampled));
        // Nothing compressible: the link's own rate, or what sampling
        // every block for nothing allows; a ratio under one (an estimate
        // from a bad sample) is taken as one.
        assert!(close(input_rate(0.0, 1e9, 100e6, 4.0), 100e6));
        assert!(close(input_rate(0.0, 1e6, 100e6, 4.0), 1e6 / SAMPLE_COST));
        assert!(close(input_rate(1.0, 1e9, 100e6, 0.5), 100e6));
        assert!(close(input_rate(f64::NAN, 150e6, 100e6, 2.0), 150e6));
    }

    fn auto_with(mix: f64) -> Auto {
        let mut a = Auto::new(Mode::Auto);
        a.set_workers(2);
        a.set_free_cores(Some((1.0, 1.0)), 2.0);
        a.set_link_rate(Some(125e6));
        // zstd 1 fast, zstd 3 slower with a better ratio; the rest unknown.
        a.est[2] = Estimate {
            speed: 320e6,
            ratio: 2.25,
            known: true,
        };
        a.est[3] = Estimate {
            speed: 150e6,
            ratio: 3.5,
            known: true,
        };
        a.current = 2;
        a.mix = mix;
        a.choose();
        a
    }

    #[test]
    fn the_compressible_share_follows_the_blocks() {
        let mut a = Auto::new(Mode::Auto);
        assert_eq!(a.mix, 1.0);
        for _ in 0..64 {
            a.note_mix(1 << 20, false);
            a.note_mix(1 << 20, true);
        }
        assert!((a.mix - 0.5).abs() < 0.05, "{}", a.mix);
        // A block bigger than the horizon says all there is to say.
        a.note_mix(1 << 30, false);
        assert_eq!(a.mix, 0.0);
        a.note_mix(0, true);
        assert_eq!(a.mix, 0.0);
    }

    #[test]
    fn random_input_on_an_unmeasured_link_goes_raw() {
        // The stream sender's link rate may be unknown (infinite): a
        // fast codec must not look better than raw because there is
        // little to compress.
        let mut a = Auto::new(Mode::Auto);
        a.set_workers(2);
        a.est[1] = Estimate {
            speed: 700e6,
            ratio: 1.1,
            known: true,
        };
        for mix in [0.0, 0.02, 0.5, 1.0] {
            a.mix = mix;
            a.current = 0;
            a.choose();
            assert_eq!(a.codec(), Codec::None, "mix {mix}");
        }
    }

    #[test]
    fn random_blocks_in_the_input_make_ratio_pay_for_the_rest() {
        // All text on a gigabit link with one core free: zstd 3 would be
        // held back by its speed, zstd 1 fills the link.
        assert_eq!(auto_with(1.0).codec(), Codec::Zstd(1));
        // Half the bytes random: they cross raw, taking half the link,
        // and the cores have twice as long for the text: zstd 3's ratio
        // now moves more input.
        assert_eq!(auto_with(0.5).codec(), Codec::Zstd(3));
    }
}
