//! One group's block bitmap: bit `i` (little-endian within each byte) set
//! when block `i` of the group is in use.

/// Whether bit `i` is set (bits past the slice count as set).
fn bit(bits: &[u8], i: u64) -> bool {
    match usize::try_from(i / 8).ok().and_then(|b| bits.get(b)) {
        Some(byte) => byte & (1 << (i % 8)) != 0,
        None => true,
    }
}

/// How many of the first `n` bits are clear.
pub(crate) fn count_clear(bits: &[u8], n: u64) -> u64 {
    let mut free = 0;
    free_runs(bits, n, |s, e| free += e - s);
    free
}

/// Whether every bit of `[start, end)` is set.
pub(crate) fn all_set(bits: &[u8], start: u64, end: u64) -> bool {
    (start..end).all(|i| bit(bits, i))
}

/// Set every bit of `[start, end)` (bits past the slice are ignored).
pub(crate) fn set_range(bits: &mut [u8], start: u64, end: u64) {
    for i in start..end {
        if let Some(b) = usize::try_from(i / 8).ok().and_then(|b| bits.get_mut(b)) {
            *b |= 1 << (i % 8);
        }
    }
}

/// Call `f(start, end)` for each run of clear bits among the first `n`, in
/// ascending order. Whole bytes of 0x00 or 0xFF are taken at once.
pub(crate) fn free_runs(bits: &[u8], n: u64, mut f: impl FnMut(u64, u64)) {
    let n = n.min(bits.len() as u64 * 8);
    let mut run: Option<u64> = None;
    let mut i = 0u64;
    while i < n {
        let byte = bits.get((i / 8) as usize).copied().unwrap_or(0xFF);
        if i.is_multiple_of(8) && i + 8 <= n && (byte == 0 || byte == 0xFF) {
            if byte == 0 {
                run.get_or_insert(i);
            } else if let Some(s) = run.take() {
                f(s, i);
            }
            i += 8;
            continue;
        }
        if byte & (1 << (i % 8)) == 0 {
            run.get_or_insert(i);
        } else if let Some(s) = run.take() {
            f(s, i);
        }
        i += 1;
    }
    if let Some(s) = run {
        f(s, n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn runs() {
        let bits = [0b1111_0001u8, 0x00, 0xFF, 0b0000_0001];
        let mut got = Vec::new();
        free_runs(&bits, 32, |s, e| got.push((s, e)));
        assert_eq!(got, [(1, 4), (8, 16), (25, 32)]);
        assert_eq!(count_clear(&bits, 32), 3 + 8 + 7);
        assert_eq!(count_clear(&bits, 28), 3 + 8 + 3);
        assert!(all_set(&bits, 4, 8));
        assert!(!all_set(&bits, 3, 8));
        assert!(!all_set(&bits, 30, 40));
        let mut b = [0u8; 2];
        set_range(&mut b, 3, 12);
        assert_eq!(b, [0b1111_1000, 0b0000_1111]);
        set_range(&mut b, 15, 100);
        assert_eq!(b[1], 0b1000_1111);
    }

    proptest! {
        #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]
        #[test]
        fn runs_match_bit_by_bit(bits in prop::collection::vec(any::<u8>(), 0..40), n in 0u64..400) {
            let mut got = vec![false; n as usize];
            free_runs(&bits, n, |s, e| for i in s..e { got[i as usize] = true; });
            for i in 0..n {
                prop_assert_eq!(got[i as usize], !bit(&bits, i), "bit {}", i);
            }
        }
    }
}
