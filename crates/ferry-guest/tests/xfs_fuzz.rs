//! Random damage to real XFS images: never a panic, never a hang, and never
//! more free space than the undamaged image has.

mod xfs_util;

use ferry_guest::{xfs, Ranges, ReadAt};
use proptest::prelude::*;
use std::path::Path;
use std::time::{Duration, Instant};
use xfs_util::*;

/// What the reader reads of a clean image: the regions to damage, each
/// with the offset of its CRC when it is a v5 structure that has one (so
/// that damage can get past the CRC, as if XFS had written it).
fn regions(path: &Path) -> (Ranges, Vec<(u64, usize, Option<usize>)>) {
    let img = Img::open(path);
    let m = xfs::free_ranges(&img).expect("the clean image maps");
    assert_eq!(m.in_use, None);
    let mut seen = img.reads.lock().unwrap().clone();
    seen.sort_unstable();
    seen.dedup();
    // Structures only: the many reads of the log's cycle numbers (unit
    // tests cover the log) would drown them.
    let bs = sb_field(path, "blocksize") as usize;
    let out = seen
        .into_iter()
        .filter(|&(_, len)| (512..=bs).contains(&len))
        .map(|(off, len)| {
            let magic = if len >= 512 { img.get(off, 4) } else { vec![] };
            let crc = match magic.as_slice() {
                b"XFSB" => Some(224),
                b"XAGF" => Some(216),
                b"XAFL" => Some(32),
                b"AB3B" | b"AB3C" => Some(52),
                _ => None,
            };
            (off, len, crc)
        })
        .collect();
    (m.free, out)
}

/// Apply `muts` (region, byte in it, xor) and map; the result must come
/// quickly and name nothing the clean image did not.
fn damaged(
    path: &Path,
    clean: &Ranges,
    regions: &[(u64, usize, Option<usize>)],
    muts: &[Mutation],
) -> Result<(), TestCaseError> {
    let mut img = Img::open(path);
    for (at, byte, xor, fix, near) in muts {
        let (off, len, crc) = regions[at.index(regions.len())];
        // Headers and the first records, mostly: the bytes that matter.
        let span = if *near { len.min(256) } else { len };
        let o = off + (byte % span) as u64;
        let v = img.get(o, 1)[0] ^ xor.max(&1);
        img.put(o, &[v]);
        if let (Some(c), true) = (crc, fix) {
            img.fix_crc(off, len, c);
        }
    }
    let t = Instant::now();
    let res = xfs::free_ranges(&img);
    prop_assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    if let Ok(m) = res {
        for &(s, e) in m.free.as_slice() {
            let mut c = Ranges::new();
            c.push(s, e);
            c.clip(0, img.size());
            for &(cs, ce) in clean.as_slice() {
                c.remove(cs, ce);
            }
            prop_assert!(c.is_empty(), "[{s}, {e}) was not free: {:?}", m.in_use);
        }
    }
    Ok(())
}

/// Region, byte in it, xor, fix the CRC, keep to the first 256 bytes.
type Mutation = (prop::sample::Index, usize, u8, bool, bool);

fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    let m = (
        any::<prop::sample::Index>(),
        any::<usize>(),
        any::<u8>(),
        any::<bool>(),
        prop::bool::weighted(0.8),
    );
    prop::collection::vec(m, 1..4)
}

/// A v4 image (no CRCs: every change reaches the parser) and a v5 one with
/// two-level trees (damage comes with its CRC fixed half of the time).
#[test]
fn damaged_real_images() {
    let tmp = tempfile::tempdir().unwrap();
    let v4 = tmp.path().join("v4.img");
    v4_proto_image(&v4, 10, 64 << 10, 0x5eed_0005);
    let v5 = tmp.path().join("v5.img");
    fragmented_image(&v5);
    for path in [&v4, &v5] {
        let (clean, regions) = regions(path);
        assert!(regions.len() > 10, "{} regions read", regions.len());
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
            cases: 300,
            failure_persistence: None,
            ..ProptestConfig::default()
        });
        runner
            .run(&mutations(), |muts| damaged(path, &clean, &regions, &muts))
            .unwrap_or_else(|e| panic!("{path:?}: {e}"));
    }
}
