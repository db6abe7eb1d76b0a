//! Unit tests of [`super`]: op placement, segment completion, failure
//! handling, `Copy` shortcuts and budgets, on values built by hand.

use super::*;
use std::collections::HashSet;

const SEG: u64 = layout::SEGMENT;

#[test]
fn empty_op_is_harmless_up_to_the_end_but_not_beyond() {
    assert_eq!(op_fit(0, 0, 0), OpFit::Empty);
    assert_eq!(op_fit(100, 0, 100), OpFit::Empty);
    assert_eq!(op_fit(101, 0, 100), OpFit::Outside);
}

#[test]
fn op_must_stay_within_one_segment() {
    assert_eq!(op_fit(0, SEG, 2 * SEG), OpFit::Segment(0));
    assert_eq!(op_fit(SEG, SEG, 2 * SEG), OpFit::Segment(1));
    // One byte across the boundary.
    assert_eq!(op_fit(SEG - 1, 2, 2 * SEG), OpFit::Outside);
    assert_eq!(op_fit(SEG - 1, 1, 2 * SEG), OpFit::Segment(0));
}

#[test]
fn op_past_the_end_or_wrapping_around_is_outside() {
    assert_eq!(op_fit(90, 11, 100), OpFit::Outside);
    assert_eq!(op_fit(90, 10, 100), OpFit::Segment(0));
    // A hostile offset + length that overflows must not wrap into range.
    assert_eq!(op_fit(u64::MAX, 2, 100), OpFit::Outside);
    assert_eq!(
        op_fit(u64::MAX - 1, 1, u64::MAX),
        OpFit::Segment((u64::MAX - 1) / SEG)
    );
}

#[test]
fn ops_of_a_segment_must_follow_each_other_exactly() {
    assert!(in_order(0, 0, 10, 100));
    assert!(!in_order(10, 11, 5, 100), "a gap");
    assert!(!in_order(10, 9, 5, 100), "an overlap");
    assert!(!in_order(90, 90, 11, 100), "past the end");
    assert!(in_order(90, 90, 10, 100));
    assert!(!in_order(u64::MAX, u64::MAX, 1, u64::MAX), "overflow");
}

#[test]
fn page_cache_files_keep_to_one_writer_direct_ones_spread() {
    let n = 4;
    let first = worker_index(3, 0, false, n);
    assert!((0..64).all(|s| worker_index(3, s, false, n) == first));
    let spread: HashSet<usize> = (0..64).map(|s| worker_index(3, s, true, n)).collect();
    assert!(spread.len() > 1);
    assert!(spread.iter().all(|&k| k < n));
    // A segment's ops all go to one writer: the same answer every time.
    assert_eq!(worker_index(3, 5, true, n), worker_index(3, 5, true, n));
    assert_eq!(worker_index(u32::MAX, u64::MAX, true, 1), 0);
    // Page-cache files in turn: a tree of small files keeps every writer busy.
    let turns: Vec<usize> = (10..18).map(|f| worker_index(f, 0, false, n)).collect();
    assert_eq!(turns, [2, 3, 0, 1, 2, 3, 0, 1]);
}

#[test]
fn strided_segments_spread_over_all_writers() {
    // A sparse image's data every 2^k segments (measured: 4,096 extents
    // 32 segments apart all went to one of two writers): each writer
    // takes a fair share, whatever the stride and the writer count.
    for n in 2..=8usize {
        for k in 0..=12u32 {
            for file in [1u32, 2, 7, 1000] {
                let mut count = vec![0usize; n];
                let segs = 256 * n as u64;
                for i in 0..segs {
                    count[worker_index(file, i << k, true, n)] += 1;
                }
                let fair = segs as usize / n;
                assert!(
                    count.iter().all(|&c| c * 3 >= fair * 2),
                    "n {n}, stride 2^{k}, file {file}: {count:?}"
                );
            }
        }
    }
}

#[test]
fn tally_rejects_unknown_and_repeated_segments() {
    let mut t = SegmentTally::new(3);
    assert_eq!(t.finish(3), Err(SegmentError::OutOfRange));
    assert_eq!(t.finish(u32::MAX), Err(SegmentError::OutOfRange));
    assert_eq!(t.finish(1), Ok(false));
    assert_eq!(t.finish(1), Err(SegmentError::Twice));
}

#[test]
fn runs_of_holes_are_taken_whole_or_not_at_all() {
    let mut t = SegmentTally::new(10);
    assert_eq!(t.finish_run(2, 3, true), Ok(false));
    assert!(t.finished(2) && t.finished(4) && !t.finished(5) && !t.finished(1));
    // Overlapping what is done, on either side or inside: refused whole.
    assert_eq!(t.finish_run(0, 3, true), Err(SegmentError::Twice));
    assert_eq!(t.finish_run(4, 2, true), Err(SegmentError::Twice));
    assert_eq!(t.finish_run(3, 1, true), Err(SegmentError::Twice));
    assert_eq!(t.finish_run(0, 11, true), Err(SegmentError::OutOfRange));
    assert_eq!(t.finish_run(9, 0, true), Err(SegmentError::OutOfRange));
    assert_eq!(
        t.finish_run(u32::MAX, u32::MAX, true),
        Err(SegmentError::OutOfRange)
    );
    assert!(
        !t.finished(0) && !t.finished(5),
        "a refused run takes nothing"
    );
    assert_eq!(t.finish(5), Ok(false));
    assert_eq!(t.finish_run(6, 4, true), Ok(false));
    assert_eq!(t.finish_run(0, 2, true), Ok(true));
    // Adjacent runs merged: one run, whatever the order they came in.
    assert_eq!(t.runs.len(), 1);
}

#[test]
fn holes_may_not_cover_a_segment_under_way() {
    let mut t = SegmentTally::new(8);
    assert_eq!(t.start(3), Ok(()));
    assert_eq!(t.start(3), Ok(()), "more ops of the same segment");
    assert_eq!(t.finish_run(2, 3, true), Err(SegmentError::Started));
    assert!(!t.finished(2), "nothing taken");
    assert_eq!(t.finish_run(0, 3, true), Ok(false));
    assert_eq!(t.finish(3), Ok(false));
    assert_eq!(t.start(3), Err(SegmentError::Twice), "ops after its done");
    assert_eq!(t.finish_run(4, 4, true), Ok(true));
}

#[test]
fn tally_of_runs_agrees_with_a_set_of_segments() {
    // Random runs against a plain set: the same answers, every step.
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    for _ in 0..200 {
        let nseg = 1 + next(64);
        let mut t = SegmentTally::new(nseg);
        let mut set = HashSet::new();
        for _ in 0..64 {
            let first = next(nseg + 2) as u32;
            let count = next(6) as u32;
            let want = if count == 0 || first as u64 + count as u64 > nseg {
                Err(SegmentError::OutOfRange)
            } else if (first..first + count).any(|s| set.contains(&s)) {
                Err(SegmentError::Twice)
            } else {
                set.extend(first..first + count);
                Ok(set.len() as u64 == nseg)
            };
            assert_eq!(t.finish_run(first, count, true), want);
            for s in 0..nseg + 1 {
                assert_eq!(t.finished(s), set.contains(&(s as u32)));
            }
        }
    }
}

#[test]
fn file_is_complete_on_its_last_segment_in_any_order() {
    let mut t = SegmentTally::new(3);
    assert_eq!(t.finish(2), Ok(false));
    assert!(t.finished(2) && !t.finished(0));
    assert_eq!(t.finish(0), Ok(false));
    assert_eq!(t.finish(1), Ok(true));
    // An empty file has no segment to finish.
    assert_eq!(
        SegmentTally::new(0).finish(0),
        Err(SegmentError::OutOfRange)
    );
}

#[test]
fn incomplete_segment_fails_without_a_retry() {
    assert!(segment_check(Some(SEG), 0, SEG).is_ok());
    let short = segment_check(Some(SEG - 1), 0, SEG).unwrap_err();
    assert!(matches!(&short, Failure::Other(m) if m == "incomplete data for bytes 0..8388608"));
    let none = segment_check(None, SEG, 2 * SEG).unwrap_err();
    // Missing data is the sender's fault, not a stale old copy's.
    assert_eq!(after_failure(&none, true), AfterFailure::Fail);
}

#[test]
fn digest_mismatch_of_a_delta_is_retried_whole_once() {
    assert!(digest_check(&[1; 32], &[1; 32], 0, 10).is_ok());
    let bad = digest_check(&[1; 32], &[2; 32], 0, 10).unwrap_err();
    assert!(matches!(&bad, Failure::Mismatch(m) if m.contains("bytes 0..10 differ")));
    assert_eq!(after_failure(&bad, true), AfterFailure::RetryWhole);
    // Sent again whole, a mismatch is final.
    assert_eq!(after_failure(&bad, false), AfterFailure::Fail);
}

#[test]
fn other_failures_of_a_delta_are_not_retried() {
    for why in [
        Failure::Io("write", "No space left on device".into()),
        Failure::Sender("a: Permission denied".into()),
        Failure::Other("protocol error".into()),
    ] {
        assert_eq!(after_failure(&why, true), AfterFailure::Fail, "{why:?}");
    }
}

fn copy(off: u64, boff: u64, len: u64) -> CopyAt {
    CopyAt {
        off,
        boff,
        len,
        bs: 4096,
        size: 4 * SEG,
        basis_size: 4 * SEG,
        known: (4 * SEG / 4096) as usize,
        aligned: true,
    }
}

#[test]
fn known_run_takes_whole_aligned_blocks() {
    assert_eq!(known_run(copy(0, 0, 3 * 4096 + 100)), 3);
    assert_eq!(known_run(copy(4096, 8192, 4096)), 1);
    assert_eq!(known_run(copy(0, 0, 4095)), 0);
    assert_eq!(known_run(copy(1, 0, 8192)), 0, "new offset off the grid");
    assert_eq!(known_run(copy(0, 1, 8192)), 0, "old offset off the grid");
    let unaligned = CopyAt {
        aligned: false,
        ..copy(0, 0, 8192)
    };
    assert_eq!(known_run(unaligned), 0);
}

#[test]
fn known_run_stops_at_segment_file_and_old_copy_ends() {
    // At the segment's end, even when the copy runs on.
    assert_eq!(known_run(copy(SEG - 4096, 0, 2 * SEG)), 1);
    let short_file = CopyAt {
        size: 8192 + 10,
        ..copy(0, 0, 8192 + 10)
    };
    assert_eq!(known_run(short_file), 2);
    let short_old = CopyAt {
        basis_size: 3 * 4096 - 1,
        ..copy(0, 0, SEG)
    };
    assert_eq!(known_run(short_old), 2);
}

#[test]
fn known_run_never_trusts_blocks_not_yet_signed_or_past_the_old_copy() {
    let signing = CopyAt {
        known: 5,
        ..copy(0, 3 * 4096, SEG)
    };
    assert_eq!(known_run(signing), 2);
    // A hostile Copy beyond the old copy gets no known blocks.
    assert_eq!(known_run(copy(0, 8 * SEG, SEG)), 0);
    assert_eq!(
        known_run(CopyAt {
            known: 0,
            ..copy(0, 0, SEG)
        }),
        0
    );
    assert_eq!(
        known_run(CopyAt {
            bs: 0,
            ..copy(0, 0, SEG)
        }),
        0
    );
}

#[test]
fn copy_onto_itself_in_place_writes_nothing() {
    assert!(!copy_writes(true, 4096, 4096));
    assert!(copy_writes(true, 4096, 0));
    assert!(copy_writes(false, 4096, 4096));
    assert!(zeros_written(false, false));
    assert!(!zeros_written(true, false));
    assert!(
        zeros_written(true, true),
        "a resumed partial holds old bytes"
    );
}

#[test]
fn a_writer_opens_at_most_1024_segments_and_its_share_of_buffers() {
    assert!(may_open_segment(MAX_OPEN_SEGMENTS - 1));
    assert!(!may_open_segment(MAX_OPEN_SEGMENTS));
    // 16 buffers over 4 writers: 4 each.
    assert!(buffer_segment(true, 3, 4));
    assert!(!buffer_segment(true, 4, 4));
    // More writers than buffers: still one each; no thread count is zero.
    assert!(buffer_segment(true, 0, 64));
    assert!(!buffer_segment(true, 1, 64));
    assert!(buffer_segment(true, 15, 0));
    assert!(!buffer_segment(false, 0, 1));
}

#[test]
fn file_budget_is_a_quarter_of_the_limit_within_4_to_4096() {
    assert_eq!(FileBudget::from_nofile(Some(1024)).max(), (1024 - 64) / 4);
    assert_eq!(FileBudget::from_nofile(Some(0)).max(), 4);
    assert_eq!(FileBudget::from_nofile(Some(60)).max(), 4);
    assert_eq!(FileBudget::from_nofile(Some(1 << 20)).max(), 4096);
    assert_eq!(FileBudget::from_nofile(None).max(), 4096);
}

#[test]
fn stuck_files_free_their_place_only_at_the_budget() {
    let b = FileBudget::from_nofile(Some(64));
    assert_eq!(b.max(), 4);
    assert_eq!(b.holding(3, || panic!("not asked below the budget")), 3);
    assert_eq!(b.holding(4, || 1), 3);
    assert_eq!(b.holding(4, || 9), 0);
    assert!(b.has_room(b.holding(4, || 1)));
    assert!(!b.has_room(b.holding(4, || 0)));
}

#[test]
fn listed_files_wait_in_list_order() {
    let b = FileBudget::from_nofile(Some(64));
    assert!(!b.must_wait(0, 0));
    assert!(b.must_wait(0, 4));
    // Room, but others wait: behind them.
    assert!(b.must_wait(1, 0));
}

#[test]
fn end_of_list_waits_for_queued_files_deltas_and_retries() {
    assert!(may_end_list(true, 0, 0, false));
    assert!(!may_end_list(false, 0, 0, false));
    assert!(!may_end_list(true, 1, 0, false));
    assert!(!may_end_list(true, 0, 1, false));
    assert!(!may_end_list(true, 0, 0, true));
}

#[test]
fn decided_is_told_every_so_many_entries() {
    assert!(!decided_due(0, 0));
    assert!(!decided_due(DECIDED_EVERY - 1, 0));
    assert!(decided_due(DECIDED_EVERY, 0));
    assert!(!decided_due(DECIDED_EVERY + 5, DECIDED_EVERY));
    // The list runs a window ahead of it: the receiver always tells
    // before the sender has to stop.
    const { assert!((DECIDED_EVERY as usize) < crate::window::WINDOW / 4) };
}
