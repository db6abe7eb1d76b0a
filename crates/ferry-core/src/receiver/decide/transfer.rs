//! How a changed file is written ([`write_method`]) and asked for: whole
//! or as a delta ([`delta_policy`], [`delta_cost`], [`delta_saving`],
//! [`choose_delta`], [`still_pays`], [`want_mode`]), verified or not, and
//! whether the writes bypass the page cache.

use ferry_link::{layout, EntryKind, WantMode};

use super::FileAt;
use crate::DeltaMode;

/// Cold sequential read rate assumed for the old copy when weighing a
/// delta (measured on this project's machines: ~1.5 GB/s).
pub(crate) const BASIS_READ_RATE: f64 = 1.5e9;
/// Link rate assumed until enough has arrived to measure one (gigabit).
pub(crate) const ASSUMED_LINK_RATE: f64 = 117e6;
/// Below this size a file goes whole: a signature round trip costs more.
pub(crate) const MIN_DELTA_SIZE: u64 = 64 << 10;
/// Bytes that must have arrived before the link rate is measured.
const RATE_MIN_BYTES: u64 = 4 << 20;
/// Seconds that must have passed before the link rate is measured.
const RATE_MIN_SECS: f64 = 0.2;

/// Largest changed file whose old copy is checked first (see
/// [`check_first`]): read and digested on the spot, one segment. Above
/// it a delta may pay ([`MIN_DELTA_SIZE`]), and it answers a changed file
/// with only its changes.
pub(crate) const MAX_CHECK_SIZE: u64 = MIN_DELTA_SIZE;

/// Ask for a changed file with [`WantMode::Check`]: its old copy's digest
/// is offered first, and the sender sends the file only if its own
/// differs. For a file whose time changed but not its size (touched,
/// restored from a backup, copied without times), which often holds the
/// same bytes: then the old copy stays and only its time is set, where a
/// transfer would write, sync and rename a new copy. Only through a
/// temporary file (what is written in place cannot wait for the answer),
/// up to [`MAX_CHECK_SIZE`], never for a file asked for again whole,
/// under `--checksum` (which compared the contents already),
/// `--whole-file` (the old copy is not read) or in a dry run.
pub(crate) fn check_first(
    w: Write,
    (size, old_size): (u64, u64),
    whole_only: bool,
    mode: DeltaMode,
    checksum: bool,
    dry_run: bool,
) -> bool {
    w == Write::Temp
        && size == old_size
        && size > 0
        && size <= MAX_CHECK_SIZE
        && !whole_only
        && mode != DeltaMode::Whole
        && !checksum
        && !dry_run
}

/// Where a changed file's bytes are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Write {
    /// The block device itself, in place.
    Device,
    /// An unnamed temporary file, copied to the character device or FIFO
    /// in order at commit.
    Stream,
    /// The existing file itself (`--inplace`).
    InPlace,
    /// A temporary file renamed over the destination at commit.
    Temp,
}

/// `--inplace` writes into an existing regular file only: a new file still
/// goes through a temporary one, and devices and FIFOs are never replaced.
pub(crate) fn write_method(at: FileAt, inplace: bool) -> Write {
    match at {
        FileAt::BlockDevice => Write::Device,
        FileAt::Stream => Write::Stream,
        FileAt::Regular if inplace => Write::InPlace,
        FileAt::Regular | FileAt::Nothing | FileAt::Dir => Write::Temp,
    }
}

/// Receive into a partial file (kept when the run is cut off, resumed by
/// the next): a file of [`super::super::partial::MIN_SIZE`] or more,
/// written through a temporary file, unless `--no-partial` or asked for
/// again whole (its partial file just failed verification).
pub(crate) fn use_partial(w: Write, partial: bool, whole_only: bool, size: u64) -> bool {
    w == Write::Temp && partial && !whole_only && size >= super::super::partial::MIN_SIZE
}

/// Keep a journal for a block device written in place (with
/// `--partial-dir`): as [`use_partial`], for a device.
pub(crate) fn device_journal(w: Write, partial: bool, whole_only: bool, size: u64) -> bool {
    w == Write::Device && partial && !whole_only && size >= super::super::partial::MIN_SIZE
}

/// Whether a delta is possible at all: an old regular file of `old_size`
/// bytes (`None`: none) with something in it, a new file with something
/// in it, and not a device.
pub(crate) fn delta_possible(w: Write, size: u64, old_size: Option<u64>) -> bool {
    w != Write::Device && size > 0 && old_size.is_some_and(|n| n > 0)
}

/// What the options say about sending a changed file as a delta.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DeltaPolicy {
    /// `--delta`: whenever possible, at no cost.
    Always,
    /// Whole: `--whole-file`, a local run (reading the old copy costs more
    /// than the memory copy it saves, as rsync finds), or a small file.
    Never,
    /// Across a link: weigh [`delta_cost`] against [`delta_saving`].
    Weigh,
}

pub(crate) fn delta_policy(mode: DeltaMode, in_process: bool, size: u64) -> DeltaPolicy {
    match mode {
        DeltaMode::Delta => DeltaPolicy::Always,
        DeltaMode::Whole => DeltaPolicy::Never,
        DeltaMode::Auto if in_process || size < MIN_DELTA_SIZE => DeltaPolicy::Never,
        DeltaMode::Auto => DeltaPolicy::Weigh,
    }
}

/// The link's rate in bytes per second: measured once `received` bytes
/// over `secs` are enough to tell, else a gigabit; never above
/// `--bwlimit`.
pub(crate) fn link_rate(received: u64, secs: f64, bwlimit: Option<u64>) -> f64 {
    let got = received as f64;
    let mut rate = if got > RATE_MIN_BYTES as f64 && secs > RATE_MIN_SECS {
        got / secs
    } else {
        ASSUMED_LINK_RATE
    };
    if let Some(cap) = bwlimit {
        rate = rate.min(cap as f64);
    }
    rate
}

/// Time to read the old copy of `old_size` bytes (nothing when its
/// signature is cached) over time to send the `size` bytes whole at
/// `rate`: a delta pays when this is below [`delta_saving`].
pub(crate) fn delta_cost(size: u64, old_size: u64, rate: f64, cached: bool) -> f64 {
    let whole = size as f64 / rate;
    let read = if cached {
        0.0
    } else {
        old_size as f64 / BASIS_READ_RATE
    };
    read / whole
}

/// Delta bytes that must be committed before their savings are trusted.
const SAVING_MIN_BYTES: u64 = 8 << 20;
/// Delta files that must be committed before their savings are trusted.
const SAVING_MIN_FILES: u64 = 4;

/// The share of a delta file that deltas have saved so far in this run:
/// `matched` bytes copied from old copies over `done` bytes of committed
/// deltas (`files` of them). Until 4 deltas or 8 MiB of them are done: one
/// half. Files rewritten through and through save nothing, so after a few
/// of them the rest go whole (30% of a 1 GiB tree rewritten: 2.97-3.10 s
/// as deltas, 2.27-2.71 s whole, side by side).
pub(crate) fn delta_saving(done: u64, files: u64, matched: u64) -> f64 {
    if done < SAVING_MIN_BYTES && files < SAVING_MIN_FILES {
        return 0.5;
    }
    (matched as f64 / done as f64).min(1.0)
}

/// Send as a delta? Never a file asked for again whole (`whole_only`);
/// else when a cost was weighed (or forced, 0) and is below the saving.
pub(crate) fn choose_delta(whole_only: bool, cost: Option<f64>, saving: f64) -> bool {
    !whole_only && cost.is_some_and(|c| c < saving)
}

/// Asked again when the old copy is about to be signed: does the delta
/// chosen at `cost` still pay, given the deltas finished since? A forced
/// or free delta (cost 0) always does.
pub(crate) fn still_pays(cost: f64, saving: f64) -> bool {
    !(cost > 0.0 && cost >= saving)
}

/// The `Want` for a file: whole, or a delta that may copy from any offset
/// of the old copy, or (written in place) only from the same offset.
pub(crate) fn want_mode(delta: bool, inplace: bool) -> WantMode {
    match (delta, inplace) {
        (false, _) => WantMode::Whole,
        (true, false) => WantMode::Delta,
        (true, true) => WantMode::DeltaInPlace,
    }
}

/// Digest what is written and compare with the sender's digests: always,
/// except for a whole file over the in-process link (hashing the same
/// buffer on both sides verifies nothing) without `--verify`.
pub(crate) fn verify_segments(delta: bool, in_process: bool, verify: bool) -> bool {
    delta || !in_process || verify
}

/// The digest grid: a delta's is the delta-block grid, so the old copy's
/// block hashes can stand for blocks that did not change.
pub(crate) fn digest_block(delta: bool, size: u64) -> u64 {
    if delta {
        layout::delta_block(size)
    } else {
        layout::grid_block(size)
    }
}

/// Write with `O_DIRECT`: only a temporary file, with `--direct-io` (the
/// default), of at least [`crate::direct::MIN_SIZE`] bytes.
pub(crate) fn use_direct(w: Write, direct_io: bool, size: u64) -> bool {
    w == Write::Temp && direct_io && size >= crate::direct::MIN_SIZE
}

/// Most segments whose signature is kept for the cache (1 TiB of file).
pub(crate) const MAX_CACHED_SEGMENTS: u64 = 1 << 17;

/// Keep the signature of what is written for the cache: not for an empty
/// file, nor one so big its signature would not fit.
pub(crate) fn keep_signature(nseg: u64) -> bool {
    nseg > 0 && nseg <= MAX_CACHED_SEGMENTS
}

/// fdatasync the data before the rename (`--fsync`, or `--verify`, which
/// must read back what is on the disk).
pub(crate) fn fsync_before_rename(fsync: bool, readback: bool) -> bool {
    fsync || readback
}

/// Whether a finished file's `fdatasync` may join a batch: one `syncfs`
/// for many files before their renames (see `receiver::commit`). Only a
/// plain temporary file qualifies: a partial file keeps its journal's own
/// order, a file read back (`--verify`) must be on the disk first, and
/// devices and streams are written where they are.
pub(crate) fn batch_commit(fsync: bool, temp: bool, partial: bool, readback: bool) -> bool {
    fsync && temp && !partial && !readback
}

/// Whether the filesystem of magic `f_type` (`fstatfs`) makes a batch's
/// data durable with one `syncfs`: local filesystems whose `syncfs`
/// writes every file's data and metadata and flushes the device. Not
/// FUSE (whose servers mostly ignore `syncfs`), network filesystems or
/// anything unknown: those keep one `fdatasync` per file.
pub(crate) fn batch_fs(f_type: u64) -> bool {
    const EXT4: u64 = 0xEF53;
    const XFS: u64 = 0x5846_5342;
    const BTRFS: u64 = 0x9123_683E;
    const F2FS: u64 = 0xF2F5_2010;
    const TMPFS: u64 = 0x0102_1994;
    matches!(f_type, EXT4 | XFS | BTRFS | F2FS | TMPFS)
}

/// Files and bytes a commit batch may gather, from the open-file budget
/// `budget`: every file in a batch holds a place among the files in
/// flight, so a batch takes at most half of them, and the others keep the
/// transfer going.
pub(crate) fn batch_limits(budget: usize) -> (usize, u64) {
    ((budget / 2).clamp(1, 1024), 256 << 20)
}

/// Whether a commit batch of `files` files and `bytes` bytes, the oldest
/// waiting `age_ms`, is due: full, or old enough that a slow transfer
/// still sees its files appear.
pub(crate) fn batch_due(files: usize, bytes: u64, age_ms: u64, limits: (usize, u64)) -> bool {
    files >= limits.0 || bytes >= limits.1 || (files > 0 && age_ms >= BATCH_AGE_MS)
}

/// How long a finished file may wait for its batch's `syncfs`.
pub(crate) const BATCH_AGE_MS: u64 = 2000;

/// Whether a batched file of `size` bytes has its write-back started as
/// it joins the batch (`sync_file_range`), so that its pages go to the
/// disk while the run goes on. Small files do not: each such call is an
/// I/O of its own, where the batch's `syncfs` writes a directory's small
/// files together (100,000 files of 0-8 KiB: 14.1-14.6 s without, 14.8-17.7
/// s with).
pub(crate) fn early_writeback(size: u64) -> bool {
    size >= EARLY_WRITEBACK_MIN
}

/// The smallest file whose write-back starts early ([`early_writeback`]).
pub(crate) const EARLY_WRITEBACK_MIN: u64 = 64 << 10;

/// Why a block device of `capacity` bytes cannot take `size` bytes.
pub(crate) fn device_refusal(capacity: u64, size: u64) -> Option<String> {
    (capacity < size).then(|| format!("device holds {capacity} bytes, source has {size}"))
}

/// An NBD destination takes exactly one file, the list's first entry.
pub(crate) fn nbd_entry_ok(kind: EntryKind, id: u32) -> bool {
    kind == EntryKind::File && id == 0
}

/// Why the NBD export (`read_only`, of `capacity` bytes) cannot take
/// `size` bytes.
pub(crate) fn nbd_refusal(read_only: bool, capacity: u64, size: u64) -> Option<String> {
    if read_only {
        return Some("the NBD export is read-only".into());
    }
    (capacity < size).then(|| format!("the export holds {capacity} bytes, the source has {size}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_temp_files_join_a_commit_batch() {
        assert!(batch_commit(true, true, false, false));
        assert!(!batch_commit(false, true, false, false), "--no-fsync");
        assert!(!batch_commit(true, false, false, false), "in place");
        assert!(!batch_commit(true, true, true, false), "partial file");
        assert!(!batch_commit(true, true, false, true), "--verify");
    }

    #[test]
    fn only_local_filesystems_batch_their_syncs() {
        for t in [0xEF53, 0x5846_5342, 0x9123_683E, 0xF2F5_2010, 0x0102_1994] {
            assert!(batch_fs(t), "{t:#x}");
        }
        // FUSE, NFS, CIFS/SMB2, overlayfs, unknown.
        for t in [0x6573_5546, 0x6969, 0xFE53_4D42, 0x794C_7630, 0] {
            assert!(!batch_fs(t), "{t:#x}");
        }
    }

    #[test]
    fn a_batch_takes_half_the_budget_and_is_due_when_full_or_old() {
        assert_eq!(batch_limits(4096), (1024, 256 << 20));
        assert_eq!(batch_limits(244), (122, 256 << 20));
        assert_eq!(batch_limits(4), (2, 256 << 20));
        assert_eq!(batch_limits(1).0, 1);
        let l = batch_limits(244);
        assert!(!batch_due(121, 1 << 20, 10, l));
        assert!(batch_due(122, 1 << 20, 10, l));
        assert!(batch_due(3, 256 << 20, 10, l));
        assert!(batch_due(1, 0, BATCH_AGE_MS, l));
        assert!(!batch_due(0, 0, BATCH_AGE_MS * 10, l));
    }

    #[test]
    fn only_files_of_64_kib_or_more_start_their_write_back_early() {
        assert!(!early_writeback(0));
        assert!(!early_writeback(8 << 10));
        assert!(!early_writeback(EARLY_WRITEBACK_MIN - 1));
        assert!(early_writeback(EARLY_WRITEBACK_MIN));
        assert!(early_writeback(256 << 10));
        assert!(early_writeback(u64::MAX));
    }

    #[test]
    fn inplace_writes_into_existing_regular_files_only() {
        assert_eq!(write_method(FileAt::Regular, true), Write::InPlace);
        assert_eq!(write_method(FileAt::Regular, false), Write::Temp);
        assert_eq!(write_method(FileAt::Nothing, true), Write::Temp);
        assert_eq!(write_method(FileAt::Dir, true), Write::Temp);
        assert_eq!(write_method(FileAt::Stream, true), Write::Stream);
        assert_eq!(write_method(FileAt::BlockDevice, false), Write::Device);
        assert_eq!(write_method(FileAt::BlockDevice, true), Write::Device);
    }

    #[test]
    fn delta_needs_a_non_empty_old_copy_a_non_empty_file_and_no_device() {
        assert!(delta_possible(Write::Temp, 1, Some(1)));
        assert!(delta_possible(Write::InPlace, 1, Some(1)));
        assert!(!delta_possible(Write::Temp, 1, None));
        assert!(!delta_possible(Write::Temp, 1, Some(0)));
        assert!(!delta_possible(Write::Temp, 0, Some(100)));
        assert!(!delta_possible(Write::Device, 1 << 30, Some(1 << 30)));
    }

    #[test]
    fn delta_and_whole_file_options_override_size_and_locality() {
        assert_eq!(delta_policy(DeltaMode::Delta, true, 1), DeltaPolicy::Always);
        assert_eq!(
            delta_policy(DeltaMode::Whole, false, 1 << 40),
            DeltaPolicy::Never
        );
    }

    #[test]
    fn auto_is_whole_locally_and_weighs_from_64_kib_across_a_link() {
        assert_eq!(
            delta_policy(DeltaMode::Auto, true, 1 << 40),
            DeltaPolicy::Never
        );
        assert_eq!(
            delta_policy(DeltaMode::Auto, false, MIN_DELTA_SIZE - 1),
            DeltaPolicy::Never
        );
        assert_eq!(
            delta_policy(DeltaMode::Auto, false, MIN_DELTA_SIZE),
            DeltaPolicy::Weigh
        );
    }

    #[test]
    fn link_rate_is_assumed_until_over_4_mib_and_0_2_s() {
        let mib4 = 4 << 20;
        assert_eq!(link_rate(mib4, 10.0, None), ASSUMED_LINK_RATE);
        assert_eq!(link_rate(mib4 + 1, 0.2, None), ASSUMED_LINK_RATE);
        assert_eq!(link_rate(100 << 20, 2.0, None), (50 << 20) as f64);
        // Nothing received yet is no reason to divide by zero.
        assert_eq!(link_rate(0, 0.0, None), ASSUMED_LINK_RATE);
    }

    #[test]
    fn bwlimit_caps_the_rate_but_never_raises_it() {
        assert_eq!(link_rate(0, 0.0, Some(1000)), 1000.0);
        assert_eq!(link_rate(100 << 20, 2.0, Some(1000)), 1000.0);
        assert_eq!(link_rate(0, 0.0, Some(u64::MAX >> 8)), ASSUMED_LINK_RATE);
    }

    #[test]
    fn delta_cost_is_read_time_over_send_time_and_nothing_when_cached() {
        // 1.5 GB old copy reads in 1 s; 1.5 GB at 1.5 GB/s sends in 1 s.
        assert_eq!(delta_cost(1_500_000_000, 1_500_000_000, 1.5e9, false), 1.0);
        // A slow link makes reading the old copy comparatively cheap.
        let slow = delta_cost(1_500_000_000, 1_500_000_000, 1.5e7, false);
        assert!((slow - 0.01).abs() < 1e-12);
        assert_eq!(delta_cost(1 << 20, 1 << 30, 1.0, true), 0.0);
    }

    #[test]
    fn saving_is_one_half_until_4_deltas_or_8_mib() {
        assert_eq!(delta_saving(0, 0, 0), 0.5);
        assert_eq!(delta_saving((8 << 20) - 1, 3, 0), 0.5);
        // Either threshold ends the grace period.
        assert_eq!(delta_saving(8 << 20, 1, 2 << 20), 0.25);
        assert_eq!(delta_saving(1000, 4, 100), 0.1);
    }

    #[test]
    fn saving_never_exceeds_one_even_on_odd_counters() {
        // More matched than committed (files still in flight matched too).
        assert_eq!(delta_saving(16 << 20, 5, 64 << 20), 1.0);
        // Four empty-matching deltas of nothing: no division trap.
        assert_eq!(delta_saving(0, 4, 0), 1.0);
    }

    #[test]
    fn choose_delta_strictly_below_the_saving_and_never_when_retried() {
        assert!(choose_delta(false, Some(0.0), 0.5));
        assert!(choose_delta(false, Some(0.49), 0.5));
        assert!(!choose_delta(false, Some(0.5), 0.5));
        assert!(!choose_delta(false, None, 1.0));
        // A file whose delta failed is asked for whole, even with --delta.
        assert!(!choose_delta(true, Some(0.0), 0.5));
    }

    #[test]
    fn forced_delta_still_pays_and_weighed_one_is_reconsidered() {
        assert!(still_pays(0.0, 0.0));
        assert!(still_pays(0.3, 0.5));
        assert!(!still_pays(0.5, 0.5));
        // Deltas since said they save nothing: a weighed delta goes whole.
        assert!(!still_pays(0.01, 0.0));
    }

    #[test]
    fn partial_files_for_big_files_through_a_temp_file_only() {
        let big = 32 << 20;
        assert!(use_partial(Write::Temp, true, false, big));
        assert!(!use_partial(Write::Temp, true, false, big - 1), "small");
        assert!(!use_partial(Write::Temp, false, false, big), "--no-partial");
        assert!(
            !use_partial(Write::Temp, true, true, big),
            "asked again whole"
        );
        for w in [Write::InPlace, Write::Device, Write::Stream] {
            assert!(!use_partial(w, true, false, big), "{w:?}");
        }
        assert!(device_journal(Write::Device, true, false, big));
        assert!(!device_journal(Write::Device, false, false, big));
        assert!(!device_journal(Write::Device, true, true, big));
        assert!(!device_journal(Write::Device, true, false, big - 1));
        assert!(!device_journal(Write::Temp, true, false, big));
    }

    #[test]
    fn want_mode_follows_delta_and_inplace() {
        assert_eq!(want_mode(false, true), WantMode::Whole);
        assert_eq!(want_mode(false, false), WantMode::Whole);
        assert_eq!(want_mode(true, false), WantMode::Delta);
        assert_eq!(want_mode(true, true), WantMode::DeltaInPlace);
    }

    #[test]
    fn a_touched_small_file_is_checked_first() {
        let (t, auto, k) = (Write::Temp, DeltaMode::Auto, (4096, 4096));
        assert!(check_first(t, k, false, auto, false, false));
        assert!(check_first(t, k, false, DeltaMode::Delta, false, false));
        let max = (MAX_CHECK_SIZE, MAX_CHECK_SIZE);
        assert!(check_first(t, max, false, auto, false, false));
        // A new size is new contents; nothing to check in an empty file.
        assert!(!check_first(t, (4096, 4095), false, auto, false, false));
        assert!(!check_first(t, (0, 0), false, auto, false, false));
        // Big enough for a delta to pay: a delta sends only the changes.
        let big = (MAX_CHECK_SIZE + 1, MAX_CHECK_SIZE + 1);
        assert!(!check_first(t, big, false, auto, false, false));
        // In place, a device, a stream: written as the data comes.
        for w in [Write::InPlace, Write::Device, Write::Stream] {
            assert!(!check_first(w, k, false, auto, false, false), "{w:?}");
        }
        // Asked again whole, --whole-file, --checksum (compared
        // already), a dry run.
        assert!(!check_first(t, k, true, auto, false, false));
        assert!(!check_first(t, k, false, DeltaMode::Whole, false, false));
        assert!(!check_first(t, k, false, auto, true, false));
        assert!(!check_first(t, k, false, auto, false, true));
    }

    #[test]
    fn only_whole_files_in_process_skip_verification() {
        assert!(!verify_segments(false, true, false));
        assert!(verify_segments(true, true, false));
        assert!(verify_segments(false, false, false));
        assert!(verify_segments(false, true, true));
    }

    #[test]
    fn deltas_digest_on_the_finer_delta_grid() {
        // 1 MiB: 8 KiB delta blocks, so unchanged blocks of the old copy
        // line up with digest blocks; a whole file keeps 64 KiB.
        assert_eq!(digest_block(true, 1 << 20), 8 << 10);
        assert_eq!(digest_block(false, 1 << 20), 64 << 10);
        // Both grids meet at 1 MiB blocks for very big files.
        assert_eq!(digest_block(true, 1 << 40), digest_block(false, 1 << 40));
    }

    #[test]
    fn direct_writes_for_big_temp_files_only() {
        let min = crate::direct::MIN_SIZE;
        assert!(use_direct(Write::Temp, true, min));
        assert!(!use_direct(Write::Temp, true, min - 1));
        assert!(!use_direct(Write::Temp, false, min << 10));
        assert!(!use_direct(Write::InPlace, true, min << 10));
        assert!(!use_direct(Write::Device, true, min << 10));
    }

    #[test]
    fn cached_signature_kept_from_one_segment_up_to_a_tebibyte() {
        assert!(!keep_signature(0));
        assert!(keep_signature(1));
        assert!(keep_signature(1 << 17));
        assert!(!keep_signature((1 << 17) + 1));
        assert_eq!(
            layout::segment_count(1 << 40),
            MAX_CACHED_SEGMENTS,
            "the limit is 1 TiB of file"
        );
    }

    #[test]
    fn verify_forces_the_fsync_that_no_fsync_skips() {
        assert!(!fsync_before_rename(false, false));
        assert!(fsync_before_rename(false, true));
        assert!(fsync_before_rename(true, false));
    }

    #[test]
    fn a_device_or_export_must_hold_the_whole_source() {
        assert_eq!(device_refusal(100, 100), None);
        assert_eq!(
            device_refusal(99, 100).as_deref(),
            Some("device holds 99 bytes, source has 100")
        );
        assert_eq!(nbd_refusal(false, 100, 100), None);
        assert!(nbd_refusal(false, 99, 100).is_some_and(|m| m.contains("99 bytes")));
        // A read-only export is refused whatever its size.
        assert_eq!(
            nbd_refusal(true, u64::MAX, 0).as_deref(),
            Some("the NBD export is read-only")
        );
    }

    #[test]
    fn nbd_takes_the_first_entry_and_only_a_file() {
        assert!(nbd_entry_ok(EntryKind::File, 0));
        assert!(!nbd_entry_ok(EntryKind::File, 1));
        assert!(!nbd_entry_ok(EntryKind::Dir, 0));
        assert!(!nbd_entry_ok(EntryKind::Symlink, 0));
    }
}
