//! Unit tests on hand-built images: the shapes and the damage real tools
//! do not make on demand.

mod build;

use super::free_ranges;
use crate::error::FsError;
use build::*;
use proptest::prelude::*;

/// The byte ranges a spec's free extents name (less its AGFL blocks).
fn want(spec: &Spec) -> Vec<(u64, u64)> {
    let mut r = crate::Ranges::new();
    for (ag, a) in spec.ags.iter().enumerate() {
        for &(s, l) in &a.free {
            r.push(spec.block(ag as u32, s), spec.block(ag as u32, s + l));
        }
        for &b in &a.agfl {
            r.remove(spec.block(ag as u32, b), spec.block(ag as u32, b + 1));
        }
    }
    r.as_slice().to_vec()
}

fn ok(spec: &Spec, img: &Sparse) -> crate::map::FsMap {
    let m = free_ranges(img).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m.kind, "xfs");
    assert_eq!(m.free.as_slice(), want(spec).as_slice());
    m
}

fn corrupt(img: &Sparse, needle: &str) {
    match free_ranges(img) {
        Err(FsError::Corrupt { why, .. }) => {
            assert!(why.contains(needle), "{why:?} does not say {needle:?}")
        }
        other => panic!("expected Corrupt ({needle}), got {other:?}"),
    }
}

fn unsupported(img: &Sparse, needle: &str) {
    match free_ranges(img) {
        Err(FsError::Unsupported { why, .. }) => {
            assert!(why.contains(needle), "{why:?} does not say {needle:?}")
        }
        other => panic!("expected Unsupported ({needle}), got {other:?}"),
    }
}

#[test]
fn maps_v5_and_v4() {
    for v5 in [true, false] {
        let spec = Spec::new(v5);
        let m = ok(&spec, &spec.build());
        assert_eq!(m.in_use, None);
        assert_eq!(m.free.total(), (10 + 1 + 15000 + 16284) * 4096);
    }
}

#[test]
fn deep_trees_and_small_blocks() {
    // 512-byte blocks (v4) and 1 KiB (v5), trees of 2 records a leaf and 2
    // pointers a node: 5 and more levels.
    for (v5, bs) in [(false, 512u32), (true, 1024)] {
        let mut spec = Spec::new(v5);
        spec.bs = bs;
        spec.agblocks = (64 << 20) / bs;
        spec.dblocks = 2 * u64::from(spec.agblocks);
        spec.log = None;
        let free: Vec<(u32, u32)> = (0..40).map(|i| (1000 + 7 * i, 1 + i % 5)).collect();
        spec.ags[0] = AgSpec {
            per_leaf: 2,
            per_node: 2,
            ..AgSpec::new(&free)
        };
        spec.ags[1] = AgSpec::new(&[(100, spec.agblocks - 100)]);
        let img = spec.build();
        ok(&spec, &img);
        let agf = spec.block(0, 0) + u64::from(spec.sect);
        assert!(img.be32(agf + 28) >= 5, "levels {}", img.be32(agf + 28));
    }
}

#[test]
fn a_full_ag_has_an_empty_root_leaf() {
    let mut spec = Spec::new(true);
    spec.ags[1] = AgSpec::new(&[]);
    let m = ok(&spec, &spec.build());
    assert!(m.free.as_slice().iter().all(|r| r.1 <= spec.ag_byte(1)));
}

#[test]
fn free_list_blocks_are_kept() {
    let mut spec = Spec::new(true);
    spec.ags[0].agfl = vec![4, 5, 6];
    ok(&spec, &spec.build());
    // A free-list block inside a bnobt extent is not reported free.
    spec.ags[0].agfl = vec![4, 605, 606];
    let m = ok(&spec, &spec.build());
    assert!(m
        .free
        .as_slice()
        .contains(&(spec.block(0, 607), spec.block(0, 15600))));
}

#[test]
fn a_free_list_of_another_size_keeps_every_slot() {
    let spec = Spec::new(true);
    let mut img = spec.build();
    let agf = spec.block(0, 0) + 512;
    // flfirst 0, fllast 1, flcount 3: the counts disagree.
    spec.edit(&mut img, agf, 512, 216, |b| {
        b[44..48].copy_from_slice(&1u32.to_be_bytes());
        b[48..52].copy_from_slice(&3u32.to_be_bytes());
    });
    spec.edit(&mut img, spec.block(0, 0) + 3 * 512, 512, 32, |b| {
        b[36 + 4 * 7..36 + 4 * 8].copy_from_slice(&700u32.to_be_bytes());
    });
    let m = free_ranges(&img).unwrap();
    let b700 = spec.block(0, 700);
    assert!(m.free.first_ending_after(b700).unwrap().0 == b700 + 4096);
}

#[test]
fn space_past_the_filesystem_is_kept() {
    let mut spec = Spec::new(true);
    spec.slack = 1 << 20;
    let m = ok(&spec, &spec.build());
    assert_eq!(m.free.as_slice().last().unwrap().1, spec.dblocks * 4096);
}

#[test]
fn not_xfs() {
    assert!(matches!(
        free_ranges(&Sparse::default()),
        Err(FsError::NotThis("xfs"))
    ));
    let spec = Spec::new(true);
    let mut img = spec.build();
    img.write(0, b"XFSC");
    assert!(matches!(free_ranges(&img), Err(FsError::NotThis("xfs"))));
}

#[test]
fn truncated() {
    let spec = Spec::new(true);
    let mut img = spec.build();
    img.size -= 1;
    corrupt(&img, "truncated");
    img.size = 300;
    corrupt(&img, "truncated");
}

#[test]
fn superblock_checks() {
    let spec = Spec::new(true);
    let clean = spec.build();
    let sb = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut img = clean.clone();
        spec.edit(&mut img, 0, 512, 224, f);
        img
    };
    let mut img = clean.clone();
    img.write(150, &[1]);
    corrupt(&img, "superblock CRC");
    corrupt(&sb(&|b| b[124] = 13), "agblklog");
    corrupt(
        &sb(&|b| b[4..8].copy_from_slice(&3000u32.to_be_bytes())),
        "block size",
    );
    corrupt(
        &sb(&|b| b[8..16].copy_from_slice(&40000u64.to_be_bytes())),
        "do not make",
    );
    corrupt(
        &sb(&|b| b[102..104].copy_from_slice(&1000u16.to_be_bytes())),
        "sector size",
    );
    unsupported(
        &sb(&|b| b[16..24].copy_from_slice(&100u64.to_be_bytes())),
        "realtime",
    );
    unsupported(
        &sb(&|b| b[100..102].copy_from_slice(&0xb4a3u16.to_be_bytes())),
        "version 3",
    );
    unsupported(&sb(&|b| b[218] |= 1), "incompatible features 0x100");
    unsupported(&sb(&|b| b[215] |= 0x10), "read-only-compatible");
    corrupt(&sb(&|b| b[219] |= 0x10), "xfs_repair");
    corrupt(
        &sb(&|b| b[48..56].copy_from_slice(&16383u64.to_be_bytes())),
        "internal log",
    );
    // In use: mkfs unfinished, or log features in use.
    let m = free_ranges(&sb(&|b| b[126] = 1)).unwrap();
    assert!(m.in_use.unwrap().contains("mkfs"));
    let m = free_ranges(&sb(&|b| b[223] = 1)).unwrap();
    assert!(m.in_use.unwrap().contains("log-incompatible"));
    // An external log cannot be checked: in use.
    let m = free_ranges(&sb(&|b| b[48..56].fill(0))).unwrap();
    assert!(m.in_use.unwrap().contains("another device"));
}

#[test]
fn agf_checks() {
    let spec = Spec::new(true);
    let clean = spec.build();
    let agf1 = spec.block(1, 0) + 512;
    let agf = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut img = clean.clone();
        spec.edit(&mut img, agf1, 512, 216, f);
        img
    };
    let mut img = clean.clone();
    img.write(agf1 + 100, &[1]);
    corrupt(&img, "AG 1: AGF CRC");
    corrupt(&agf(&|b| b[0] = b'Y'), "AGF magic");
    corrupt(
        &agf(&|b| b[8..12].copy_from_slice(&0u32.to_be_bytes())),
        "sequence",
    );
    corrupt(
        &agf(&|b| b[12..16].copy_from_slice(&100u32.to_be_bytes())),
        "length",
    );
    corrupt(&agf(&|b| b[64] ^= 1), "UUID");
    corrupt(&agf(&|b| b[31] = 10), "10 levels");
    corrupt(
        &agf(&|b| b[16..20].copy_from_slice(&0u32.to_be_bytes())),
        "root 0",
    );
    corrupt(
        &agf(&|b| b[40..44].copy_from_slice(&1000u32.to_be_bytes())),
        "free list",
    );
    let mut img = clean.clone();
    spec.edit(&mut img, spec.block(0, 0) + 512, 512, 216, |b| {
        b[52..56].copy_from_slice(&15010u32.to_be_bytes())
    });
    corrupt(&img, "more than the AGF's 15010");
    corrupt(
        &agf(&|b| b[52..56].copy_from_slice(&20000u32.to_be_bytes())),
        "counts",
    );
    corrupt(
        &agf(&|b| b[56..60].copy_from_slice(&16000u32.to_be_bytes())),
        "longest",
    );
    let mut img = clean.clone();
    spec.edit(&mut img, spec.block(1, 0) + 3 * 512, 512, 32, |b| b[7] = 0);
    corrupt(&img, "AGFL is not this AG's");
}

#[test]
fn extent_checks() {
    let bad = |free: &[(u32, u32)], needle: &str| {
        let mut spec = Spec::new(false);
        spec.ags[0] = AgSpec::new(free);
        corrupt(&spec.build(), needle);
    };
    bad(&[(400, 10), (405, 10)], "overlaps or precedes");
    bad(&[(0, 1)], "out of the AG");
    bad(&[(400, 0)], "out of the AG");
    bad(&[(16000, 385)], "out of the AG");
    bad(&[(100, 10)], "overlaps the log");
    // Two extents in the cntbt order that the bnobt would not take.
    let mut spec = Spec::new(false);
    spec.ags[0] = AgSpec::new(&[(600, 5), (400, 10)]);
    corrupt(&spec.build(), "out of order");
}

#[test]
fn the_trees_must_agree() {
    let spec = Spec::new(true);
    let clean = spec.build();
    // The cntbt leaf of AG 0 (block 9): the same extents by size.
    let cnt = spec.block(0, 9);
    let mut img = clean.clone();
    spec.edit(&mut img, cnt, 4096, 52, |b| {
        // (500,1) -> (501,1): same count and total, not the same set.
        b[56..60].copy_from_slice(&501u32.to_be_bytes());
    });
    corrupt(&img, "does not hold the bnobt's");
    let mut img = clean.clone();
    spec.edit(&mut img, cnt, 4096, 52, |b| b[7] = 2); // one record fewer
    corrupt(&img, "does not hold");
}

/// A two-level bnobt in AG 0: root at `root`, leaves at `leaves`.
fn two_level() -> (Spec, Sparse, u64, Vec<u64>) {
    let mut spec = Spec::new(true);
    let free: Vec<(u32, u32)> = (0..9).map(|i| (400 + 10 * i, 2)).collect();
    spec.ags[0] = AgSpec {
        per_leaf: 3,
        ..AgSpec::new(&free)
    };
    let img = spec.build();
    ok(&spec, &img);
    // Leaves 8, 9, 10, then the root 11.
    let leaves = (8..11).map(|b| spec.block(0, b)).collect();
    (spec.clone(), img, spec.block(0, 11), leaves)
}

#[test]
fn tree_shape_checks() {
    let (spec, clean, root, leaves) = two_level();
    let ptrs = 56 + 8 * ((4096 - 56) / 12);
    let edit = |off: u64, f: &dyn Fn(&mut Vec<u8>)| {
        let mut img = clean.clone();
        spec.edit(&mut img, off, 4096, 52, f);
        img
    };
    let set = |b: &mut Vec<u8>, o: usize, v: u32| b[o..o + 4].copy_from_slice(&v.to_be_bytes());
    // The root points at itself; at the same leaf twice (whatever the
    // keys, they cannot be both in order and the leaf's); at a block of
    // the AG header.
    corrupt(&edit(root, &|b| set(b, ptrs, 11)), "level 1, expected 0");
    corrupt(
        &edit(root, &|b| {
            set(b, ptrs + 4, 8);
            set(b, 56 + 8, 400);
        }),
        "keys out of order",
    );
    corrupt(
        &edit(root, &|b| set(b, ptrs + 8, 0)),
        "pointer 0 out of the AG",
    );
    // Sibling pointers that loop, skip or lie.
    corrupt(&edit(leaves[1], &|b| set(b, 12, 8)), "sibling");
    corrupt(&edit(leaves[0], &|b| set(b, 12, 10)), "sibling");
    corrupt(&edit(leaves[2], &|b| set(b, 12, 8)), "right sibling");
    corrupt(&edit(leaves[0], &|b| set(b, 8, 10)), "left sibling");
    // A key that is not its child's first record.
    corrupt(&edit(root, &|b| set(b, 56 + 8, 421)), "parent's key");
    // Records that are not the block's: count, level, owner, place, magic.
    corrupt(&edit(leaves[0], &|b| b[7] = 0), "0 records");
    corrupt(&edit(leaves[0], &|b| b[6] = 2), "records");
    corrupt(&edit(leaves[0], &|b| b[5] = 1), "level 1");
    corrupt(&edit(leaves[0], &|b| b[51] = 1), "not this filesystem");
    corrupt(&edit(leaves[0], &|b| b[23] ^= 8), "says it is at");
    corrupt(&edit(leaves[0], &|b| b[3] = b'C'), "bad magic");
    let mut img = clean.clone();
    img.write(leaves[0] + 200, &[1]);
    corrupt(&img, "CRC mismatch");
}

/// A log of 2048 blocks (16384 BBs, more than the 2 x 4096 checked around
/// the head) at block 32 of AG 0.
fn big_log() -> (Spec, Ring, u64) {
    let mut spec = Spec::new(true);
    spec.log = Some((32, 2048));
    spec.ags[0] = AgSpec::new(&[(2100, 10), (3000, 13000)]);
    let log = spec.ring();
    (spec, log, log.n)
}

fn in_use(img: &Sparse) -> Option<String> {
    free_ranges(img).unwrap().in_use
}

#[test]
fn log_states() {
    let (spec, log, n) = big_log();
    let fresh = spec.build();
    assert_eq!(in_use(&fresh), None, "as mkfs leaves it");

    // Mounted: records after the unmount record; the last is not one.
    let mut img = fresh.clone();
    write_record(&mut img, log, 2, 1, 5, 0, true);
    assert!(in_use(&img).unwrap().contains("not an unmount record"));
    // ... then unmounted.
    write_unmount_record(&mut img, log, 4, 1, true);
    assert_eq!(in_use(&img), None);
    // ... a CRC that does not match.
    img.write(log.base + 5 * 512 + 20, &[1]);
    assert!(in_use(&img).unwrap().contains("CRC"));

    // Wrapped: cycle 2 up to the head at 9000, cycle 1 after it.
    let mut img = fresh.clone();
    stamp(&mut img, log, 0, n, 1);
    stamp(&mut img, log, 0, 9000, 2);
    write_unmount_record(&mut img, log, 8998, 2, true);
    assert_eq!(in_use(&img), None);
    // A hole: a write before the head that never made it.
    stamp(&mut img, log, 8000, 8001, 1);
    assert!(in_use(&img).unwrap().contains("next to the head"));
    // A stale unmount record, with later writes in flight past it.
    let mut img2 = fresh.clone();
    stamp(&mut img2, log, 0, n, 1);
    stamp(&mut img2, log, 0, 9000, 2);
    write_unmount_record(&mut img2, log, 8998, 2, true);
    stamp(&mut img2, log, 9100, 9200, 2);
    assert!(in_use(&img2).is_some());

    // Head at the very end: the whole ring in cycle 3.
    let mut img = fresh.clone();
    stamp(&mut img, log, 0, n, 3);
    write_unmount_record(&mut img, log, n - 2, 3, true);
    assert_eq!(in_use(&img), None);
    // An unmount record that wraps around the end of the ring: its data
    // BB, at 0, in the next cycle.
    let mut img = fresh.clone();
    stamp(&mut img, log, 0, n, 2);
    write_unmount_record(&mut img, log, n - 1, 2, true);
    assert_eq!(img.be32(log.base), 3);
    assert_eq!(in_use(&img), None);

    // Never written: zeroed.
    let mut img = fresh.clone();
    img.write(log.base, &[0u8; 1024]);
    assert_eq!(in_use(&img), None);
    // Cycles that jump.
    let mut img = fresh.clone();
    stamp(&mut img, log, n - 1, n, 7);
    assert!(in_use(&img).unwrap().contains("cycles"));
    // Another filesystem's log.
    let mut img = fresh.clone();
    img.write(log.base + 304, b"another-uuid!!!!");
    assert!(in_use(&img).unwrap().contains("another filesystem"));
}

#[test]
fn in_use_and_corrupt_says_in_use() {
    let (spec, log, _) = big_log();
    let mut img = spec.build();
    write_record(&mut img, log, 2, 1, 5, 0, true);
    img.write(spec.block(1, 0) + 600, &[1]); // AG 1's AGF CRC
    let m = free_ranges(&img).unwrap();
    assert!(m.free.is_empty());
    let why = m.in_use.unwrap();
    assert!(
        why.contains("not clean") && why.contains("AGF CRC"),
        "{why}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() })]
    /// Random bytes over the metadata of a built image (v4 with a deep
    /// tree, so that most changes get past the CRCs) never panic or hang,
    /// and what is still mapped names only blocks the image's trees could.
    #[test]
    fn mutations_never_panic(v5 in any::<bool>(), muts in prop::collection::vec((any::<prop::sample::Index>(), 0u64..4096, any::<u8>()), 1..6)) {
        let mut spec = Spec::new(v5);
        let free: Vec<(u32, u32)> = (0..30).map(|i| (400 + 10 * i, 1 + i % 4)).collect();
        spec.ags[0] = AgSpec { per_leaf: 3, per_node: 3, agfl: vec![2, 3], ..AgSpec::new(&free) };
        let mut img = spec.build();
        let chunks = img.written();
        for (at, off, v) in muts {
            let o = chunks[at.index(chunks.len())] + off;
            img.write(o, &[v]);
        }
        if let Ok(m) = free_ranges(&img) {
            for &(_, e) in m.free.as_slice() {
                prop_assert!(e <= img.size);
            }
        }
    }
}
