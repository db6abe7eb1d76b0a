use std::io::Write;

use ferry_link::layout::{block_hash, grid_block};
use proptest::prelude::*;

use crate::*;

/// Fast deterministic pseudo-random bytes.
fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        v.extend_from_slice(&s.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// Diffs `source` segment by segment, checking each segment's ops are in
/// order, non-empty and cover it exactly.
fn diff_all(m: &Matcher, source: &[u8], seg: usize) -> Vec<Op> {
    diff_all_ctx(m, source, seg, 0)
}

/// [`diff_all`] with `ctx` bytes of context on each side of each segment
/// (a multiple of the block size), through `Matcher::diff_range`.
fn diff_all_ctx(m: &Matcher, source: &[u8], seg: usize, ctx: usize) -> Vec<Op> {
    let mut ops = Vec::new();
    for (k, piece) in source.chunks(seg).enumerate() {
        let base = (k * seg) as u64;
        let mut at = base;
        let mut check = |op: Op| {
            assert_eq!(op.offset(), at, "ops out of order: {op:?}");
            assert!(!op.is_empty());
            at += op.len();
            ops.push(op);
        };
        if ctx == 0 {
            m.diff(piece, base, &mut check);
        } else {
            let start = (k * seg).saturating_sub(ctx);
            let end = (k * seg + piece.len() + ctx).min(source.len());
            let range = k * seg - start..k * seg - start + piece.len();
            m.diff_range(&source[start..end], start as u64, range, None, &mut check);
        }
        assert_eq!(at, base + piece.len() as u64);
    }
    ops
}

fn literal_bytes(ops: &[Op]) -> u64 {
    ops.iter()
        .filter(|o| matches!(o, Op::Literal { .. }))
        .map(|o| o.len())
        .sum()
}

fn roundtrip(basis: &[u8], source: &[u8], bs: u64, seg: usize) -> Vec<Op> {
    roundtrip_ctx(basis, source, bs, seg, 0)
}

fn roundtrip_ctx(basis: &[u8], source: &[u8], bs: u64, seg: usize, ctx: usize) -> Vec<Op> {
    let (sig, _) = signature_of_bytes(basis, bs);
    let m = Matcher::new(&sig);
    let ops = diff_all_ctx(&m, source, seg, ctx);
    let out = apply_to_vec(basis, source.len() as u64, &ops, source);
    assert!(out == source, "apply did not reproduce the source");
    // Adjacent copies contiguous in both files are merged.
    for w in ops.windows(2) {
        if let (
            Op::Copy {
                offset: a,
                basis_offset: ab,
                len: al,
            },
            Op::Copy {
                offset: b,
                basis_offset: bb,
                ..
            },
        ) = (w[0], w[1])
        {
            let same_seg = a / seg as u64 == b / seg as u64;
            assert!(
                !(same_seg && a + al == b && ab + al == bb),
                "unmerged {w:?}"
            );
        }
    }
    ops
}

#[test]
fn matcher_is_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<Matcher>();
    check::<Signature>();
}

#[test]
fn identical_file_is_one_copy_per_segment() {
    let data = random_bytes(1, 300_000);
    let ops = roundtrip(&data, &data, 8192, 64 * 8192);
    assert_eq!(literal_bytes(&ops), 0);
    assert_eq!(ops.len(), 1);
}

#[test]
fn empty_inputs() {
    let data = random_bytes(2, 50_000);
    assert_eq!(literal_bytes(&roundtrip(&[], &data, 8192, 1 << 20)), 50_000);
    assert!(roundtrip(&data, &[], 8192, 1 << 20).is_empty());
    let (sig, full) = signature_of_bytes(&[], 8192);
    assert!(sig.weak.is_empty() && full.is_empty() && sig.is_consistent());
}

#[test]
fn shifted_and_partial_tail_blocks_match() {
    let basis = random_bytes(3, 100_000);
    // Same file: the partial last block matches in place.
    let ops = roundtrip(&basis, &basis, 8192, 8192 * 4);
    assert_eq!(literal_bytes(&ops), 0);
    // Prepend 5 bytes: everything but the basis's partial tail block and
    // per-segment losses is found.
    let mut src = b"hello".to_vec();
    src.extend_from_slice(&basis);
    let ops = roundtrip(&basis, &src, 8192, 1 << 20);
    assert!(literal_bytes(&ops) <= 5 + 8192, "{ops:?}");
}

#[test]
fn zero_blocks_are_never_copied_or_indexed() {
    let mut basis = random_bytes(4, 8192 * 8);
    basis[8192 * 2..8192 * 5].fill(0);
    let (sig, _) = signature_of_bytes(&basis, 8192);
    let m = Matcher::new(&sig);
    assert_eq!(m.indexed_blocks(), 5);
    let ops = diff_all(&m, &basis, 1 << 20);
    assert_eq!(literal_bytes(&ops), 3 * 8192);
    for op in &ops {
        if let Op::Literal { offset, len } = *op {
            assert_eq!((offset, len), (2 * 8192, 3 * 8192));
        }
    }
}

#[test]
fn zero_runs_keep_the_phase_and_round_trip() {
    // A shifted file with a long zero run in the middle: the phase found
    // before the run is followed after it without a new search.
    let mut basis = random_bytes(12, 8192 * 40);
    basis[8192 * 10..8192 * 30].fill(0);
    let mut src = vec![1u8; 3];
    src.extend_from_slice(&basis);
    let ops = roundtrip(&basis, &src, 8192, 1 << 20);
    let nonzero_lit: u64 = ops
        .iter()
        .filter_map(|o| match *o {
            Op::Literal { offset, len } => {
                let r = &src[offset as usize..(offset + len) as usize];
                Some(r.iter().filter(|&&b| b != 0).count() as u64)
            }
            _ => None,
        })
        .sum();
    assert!(nonzero_lit <= 3 + 2 * 8192, "{ops:?}");
}

#[test]
fn repeated_blocks_are_indexed_once() {
    let block = random_bytes(5, 8192);
    let basis: Vec<u8> = block.iter().cycle().take(8192 * 50).copied().collect();
    let (sig, _) = signature_of_bytes(&basis, 8192);
    assert_eq!(Matcher::new(&sig).indexed_blocks(), 1);
    let mut src = vec![7u8; 100];
    src.extend_from_slice(&basis);
    let ops = roundtrip(&basis, &src, 8192, 1 << 20);
    assert!(literal_bytes(&ops) < 8192 * 2);
}

#[test]
fn candidates_per_weak_value_are_capped() {
    let data = random_bytes(14, 8192 * 40);
    let (mut sig, _) = signature_of_bytes(&data, 8192);
    sig.weak.iter_mut().for_each(|w| *w = 42);
    let m = Matcher::new(&sig);
    assert_eq!(m.indexed_blocks(), MAX_CANDIDATES);
    // Still correct: aligned blocks match by strong hash.
    let ops = diff_all(&m, &data, 1 << 20);
    assert_eq!(literal_bytes(&ops), 0);
}

#[test]
fn inconsistent_signature_does_not_panic() {
    let data = random_bytes(6, 100_000);
    let (mut sig, _) = signature_of_bytes(&data, 8192);
    sig.weak.truncate(3);
    assert!(!sig.is_consistent());
    let m = Matcher::new(&sig);
    let ops = diff_all(&m, &data, 1 << 20);
    assert_eq!(apply_to_vec(&data, data.len() as u64, &ops, &data), data);
    for bs in [0u64, 1 << 62, u64::MAX] {
        let bad = Signature {
            block_size: bs,
            basis_size: u64::MAX,
            weak: vec![1, 2, 3],
            strong: vec![[0; 16]; 2],
        };
        let m = Matcher::new(&bad);
        let mut n = 0;
        m.diff(&data, 0, &mut |op| n += op.len());
        assert_eq!(n, data.len() as u64);
        m.diff(&data, u64::MAX - 10, &mut |op| n += op.len());
    }
}

#[test]
fn diff_with_hashes_agrees_with_diff() {
    let basis = random_bytes(7, 500_000);
    let mut src = basis.clone();
    src[100_000..100_500].fill(9);
    src.splice(300_000..300_000, [1, 2, 3]);
    let (sig, _) = signature_of_bytes(&basis, 8192);
    let m = Matcher::new(&sig);
    let mut a = Vec::new();
    m.diff(&src, 0, &mut |op| a.push(op));
    let hashes: Vec<[u8; 32]> = src.chunks(8192).map(block_hash).collect();
    let mut b = Vec::new();
    m.diff_with_hashes(&src, 0, &hashes, &mut |op| b.push(op));
    assert_eq!(a, b);
    assert_eq!(apply_to_vec(&basis, src.len() as u64, &a, &src), src);
}

#[test]
fn seven_byte_insert_costs_under_one_percent() {
    let size = (8 << 20) + 777_777;
    let bs = grid_block(size as u64);
    let basis = random_bytes(8, size);
    let mut src = basis.clone();
    src.splice(1 << 20..1 << 20, *b"7 bytes");
    let ops = roundtrip(&basis, &src, bs, ferry_link::layout::SEGMENT as usize);
    let lit = literal_bytes(&ops);
    assert!(
        lit * 100 < src.len() as u64,
        "literals {lit} of {}",
        src.len()
    );
    assert!(lit < 3 * bs + 7, "literals {lit}");
}

#[test]
fn seven_byte_insert_with_context_costs_seven_bytes() {
    // Many small segments, so every segment boundary would cost a block
    // without context.
    let size = 3_000_000;
    let bs = 8192u64;
    let basis = random_bytes(13, size);
    let mut src = basis.clone();
    src.splice(100_000..100_000, *b"7 bytes");
    let seg = 64 * bs as usize;
    let ops = roundtrip_ctx(&basis, &src, bs, seg, bs as usize);
    // The block holding the insert point is sent, plus the 7 bytes.
    assert!(literal_bytes(&ops) <= bs + 7, "{ops:?}");
    let without = literal_bytes(&roundtrip(&basis, &src, bs, seg));
    assert!(without > 4 * bs, "segment ends should cost without context");
}

#[test]
fn scattered_overwrites_cost_under_eight_percent() {
    let size = 64usize << 20;
    let bs = 8192u64;
    let basis = random_bytes(9, size);
    let mut src = basis.clone();
    let mut rng = random_bytes(10, 1 << 16).into_iter();
    let mut next = || {
        let mut x = 0u64;
        for _ in 0..4 {
            x = x << 8 | u64::from(rng.next().unwrap_or(0));
        }
        x
    };
    let mut changed = 0usize;
    while changed < size / 20 {
        let len = 4096 + (next() % (60 << 10)) as usize;
        let at = (next() % (size - len) as u64) as usize;
        let fill = random_bytes(next(), len);
        src[at..at + len].copy_from_slice(&fill);
        changed += len;
    }
    let ops = roundtrip(&basis, &src, bs, ferry_link::layout::SEGMENT as usize);
    let lit = literal_bytes(&ops);
    assert!(lit * 100 < size as u64 * 8, "literals {lit} of {size}");
}

#[test]
fn file_signature_equals_memory_signature() {
    let bs = 8192u64;
    for (size, threads) in [
        (0usize, 1usize),
        (1, 2),
        (8192 * 3, 2),
        (5_000_123, 3),
        (9_999_999, 2),
    ] {
        let mut data = random_bytes(size as u64, size);
        let mut f = tempfile::tempfile().expect("tempfile");
        if size > 3_000_000 {
            // Holes: zero a large aligned range and punch it out by writing
            // the file in two pieces around it, plus a zero run inside data.
            data[1 << 20..3 << 20].fill(0);
            data[4_000_000..4_020_000].fill(0);
            f.write_all(&data[..1 << 20]).expect("write");
            f.set_len(size as u64).expect("set_len");
            use std::os::unix::fs::FileExt;
            f.write_all_at(&data[3 << 20..], 3 << 20).expect("write");
        } else {
            f.write_all(&data).expect("write");
        }
        let (s1, f1) = signature_of_file(&f, size as u64, bs, threads).expect("sig");
        let (s2, f2) = signature_of_bytes(&data, bs);
        assert!(s1 == s2 && f1 == f2, "size {size} threads {threads}");
        assert!(s1.is_consistent());
    }
}

#[test]
fn file_shorter_than_basis_size_is_an_error() {
    let mut f = tempfile::tempfile().expect("tempfile");
    f.write_all(&random_bytes(11, 10_000)).expect("write");
    let e = signature_of_file(&f, 20_000, 8192, 2).expect_err("short file");
    assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    assert!(signature_of_file(&f, 10_000, 0, 2).is_err());
}

#[derive(Clone, Debug)]
enum Edit {
    Overwrite(u32, u16, u64),
    Insert(u32, u16, u64),
    Delete(u32, u16),
    Truncate(u32),
    Extend(u16, u64),
    Zero(u32, u16),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<u32>(), any::<u16>(), any::<u64>()).prop_map(|(a, b, c)| Edit::Overwrite(a, b, c)),
        (any::<u32>(), any::<u16>(), any::<u64>()).prop_map(|(a, b, c)| Edit::Insert(a, b, c)),
        (any::<u32>(), any::<u16>()).prop_map(|(a, b)| Edit::Delete(a, b)),
        any::<u32>().prop_map(Edit::Truncate),
        (any::<u16>(), any::<u64>()).prop_map(|(a, b)| Edit::Extend(a, b)),
        (any::<u32>(), any::<u16>()).prop_map(|(a, b)| Edit::Zero(a, b)),
    ]
}

fn apply_edit(v: &mut Vec<u8>, e: &Edit, max: usize) {
    let pos = |p: u32, v: &Vec<u8>| (p as usize) % (v.len() + 1);
    let len = |l: u16| (l as usize) % max;
    match *e {
        Edit::Overwrite(p, l, s) => {
            let at = pos(p, v);
            let n = len(l).min(v.len() - at);
            v[at..at + n].copy_from_slice(&random_bytes(s, n));
        }
        Edit::Insert(p, l, s) => {
            let at = pos(p, v);
            v.splice(at..at, random_bytes(s, len(l)));
        }
        Edit::Delete(p, l) => {
            let at = pos(p, v);
            let n = len(l).min(v.len() - at);
            v.drain(at..at + n);
        }
        Edit::Truncate(p) => {
            let at = pos(p, v);
            v.truncate(v.len() - (v.len() - at) / 4);
        }
        Edit::Extend(l, s) => v.extend(random_bytes(s, len(l))),
        Edit::Zero(p, l) => {
            let at = pos(p, v);
            let n = len(l).min(v.len() - at);
            v[at..at + n].fill(0);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, failure_persistence: None, ..ProptestConfig::default() })]

    /// Random basis with zero runs, random edits, diffed over segments:
    /// applying the ops reproduces the source exactly.
    #[test]
    fn edits_round_trip(
        seed in any::<u64>(),
        size in 0usize..120_000,
        zero_runs in proptest::collection::vec((any::<u32>(), 0usize..20_000), 0..4),
        edits in proptest::collection::vec(edit(), 0..6),
        bs_pick in 0usize..4,
        seg_blocks in 1usize..6,
        ctx_blocks in 0usize..3,
    ) {
        let bs = [64u64, 256, 1024, 8192][bs_pick];
        let mut basis = random_bytes(seed, size);
        for (p, l) in zero_runs {
            let at = (p as usize) % (basis.len() + 1);
            let n = l.min(basis.len() - at);
            basis[at..at + n].fill(0);
        }
        let mut src = basis.clone();
        for e in &edits {
            apply_edit(&mut src, e, 3 * bs as usize + 100);
        }
        roundtrip_ctx(&basis, &src, bs, seg_blocks * bs as usize, ctx_blocks * bs as usize);
    }

    /// Reusing block hashes changes nothing, with or without context.
    #[test]
    fn hashes_do_not_change_the_ops(
        seed in any::<u64>(),
        size in 1usize..40_000,
        edits in proptest::collection::vec(edit(), 0..4),
        start_blocks in 0usize..4,
        len in 0usize..40_000,
    ) {
        let bs = 1024u64;
        let basis = random_bytes(seed, size);
        let mut src = basis.clone();
        for e in &edits {
            apply_edit(&mut src, e, 3000);
        }
        let m = Matcher::new(&signature_of_bytes(&basis, bs).0);
        let hashes: Vec<[u8; 32]> = src.chunks(bs as usize).map(block_hash).collect();
        let start = (start_blocks * bs as usize).min(src.len());
        let range = start..(start + len).min(src.len());
        let (mut a, mut b) = (Vec::new(), Vec::new());
        m.diff_range(&src, 0, range.clone(), None, &mut |op| a.push(op));
        m.diff_range(&src, 0, range.clone(), Some(&hashes), &mut |op| b.push(op));
        prop_assert_eq!(&a, &b);
        let covered: u64 = a.iter().map(|o| o.len()).sum();
        prop_assert_eq!(covered, range.len() as u64);
    }

    /// Periodic, low-entropy data (many weak collisions, repeated blocks)
    /// still round-trips.
    #[test]
    fn repetitive_data_round_trips(
        period in 1usize..300,
        size in 0usize..60_000,
        edits in proptest::collection::vec(edit(), 0..4),
        bs_pick in 0usize..3,
    ) {
        let bs = [64u64, 256, 1024][bs_pick];
        let basis: Vec<u8> = (0..size).map(|i| ((i % period) * 7 % 5) as u8).collect();
        let mut src = basis.clone();
        for e in &edits {
            apply_edit(&mut src, e, 2 * bs as usize);
        }
        roundtrip(&basis, &src, bs, 4 * bs as usize);
    }
}

#[test]
fn shift_after_a_long_new_region_is_still_found() {
    // Rolling backs off over data that matches nothing; where the old data
    // resumes (shifted by a non-block amount) it must be found again within
    // the back-off's reach, not lost for the rest of the segment.
    let bs = 8192u64;
    let basis = random_bytes(21, 2 << 20);
    let mut src = random_bytes(22, (1 << 20) + 3);
    src.extend_from_slice(&basis);
    let ops = roundtrip(&basis, &src, bs, src.len());
    let lit = literal_bytes(&ops);
    let new = (1u64 << 20) + 3;
    assert!(lit >= new, "{lit}");
    assert!(
        lit <= new + 65 * bs,
        "lost too much after the new region: {lit}"
    );
    let copied: u64 = ops
        .iter()
        .map(|o| match o {
            Op::Copy { len, .. } => *len,
            _ => 0,
        })
        .sum();
    assert!(copied >= basis.len() as u64 - 65 * bs);
}
