//! The rolling weak hash.
//!
//! # Choice
//!
//! A Rabin–Karp polynomial over a byte-substitution table, modulo 2^64:
//!
//! ```text
//! weak(x_0 .. x_{w-1}) = Σ T[x_i] · B^(w-1-i)   (mod 2^64)
//! ```
//!
//! where `T` is a fixed table of 256 pseudo-random 64-bit words and `B` an
//! odd 64-bit multiplier. Rolling the window one byte is
//! `h' = h·B − T[out]·B^w + T[in]`: one multiply, one add and two table
//! loads (`T[out]·B^w` is tabulated too).
//!
//! Why not the alternatives:
//!
//! * rsync's Adler-style sum is two 16-bit running sums. Its values cluster
//!   (the low sum of a block of bytes is bounded by `255·w`), so typical
//!   data hits few distinct values and the hash table has long chains: on
//!   VM images this pinned a core for hours (rsync #213, #217).
//! * A 64-bit buzhash (cyclic polynomial) rotates each byte's table entry by
//!   its distance to the window end, modulo 64. In a window longer than 64
//!   bytes (ours are 8 KiB and up), two equal bytes 64 apart get the same
//!   rotation and cancel out by XOR: any content with a period dividing 64
//!   (padding, tables of fixed-size records) hashes to a handful of values,
//!   and all such blocks land in a few hash chains. The polynomial has no
//!   such cancellation (a test checks 64-periodic blocks stay distinct).
//! * The polynomial's weak spot is its low bits (bit 0 is a parity of the
//!   table entries' bit 0), so the index never uses low bits alone: it
//!   buckets on the high bits of `weak · K`, which depend on every bit.
//!   Adversarial collisions (Thue–Morse strings) exist for any modulus-2^64
//!   polynomial; they cost a strong-hash check each, which the matcher
//!   bounds with a per-segment budget, and never affect correctness.
//!
//! Hashing a whole block (the signature side) processes 8 bytes per step by
//! Horner's rule with `B^8`; within a step each byte's term comes from a
//! table premultiplied by its power of `B`, so a step is 8 loads, 7 adds and
//! one multiply-add on the serial chain (several GB/s, the same order as
//! blake3, which the signature computes too).

/// The multiplier: odd, with well spread bits (2^64 / golden ratio).
const B: u64 = 0x9E37_79B9_7F4A_7C15;

const fn splitmix(state: u64) -> u64 {
    let mut z = state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

const fn make_table() -> [u64; 256] {
    let mut t = [0u64; 256];
    let mut i = 0;
    while i < 256 {
        // A fixed seed: both ends must derive the same table.
        t[i] = splitmix(0x6665_7272_7977_6b31u64.wrapping_add((i as u64 + 1) << 32 | i as u64));
        i += 1;
    }
    t
}

/// Byte substitution table.
static T: [u64; 256] = T_CONST;

const fn pow(mut base: u64, mut exp: u64) -> u64 {
    let mut acc = 1u64;
    while exp > 0 {
        if exp & 1 == 1 {
            acc = acc.wrapping_mul(base);
        }
        base = base.wrapping_mul(base);
        exp >>= 1;
    }
    acc
}

const P8: u64 = pow(B, 8);

const fn make_shifted() -> [[u64; 256]; 8] {
    let mut t = [[0u64; 256]; 8];
    let mut j = 0;
    while j < 8 {
        let m = pow(B, 7 - j as u64);
        let mut i = 0;
        while i < 256 {
            t[j][i] = T_CONST[i].wrapping_mul(m);
            i += 1;
        }
        j += 1;
    }
    t
}

const T_CONST: [u64; 256] = make_table();

/// `TS[j][b] = T[b] · B^(7-j)`: the table entry of byte `b` at position `j`
/// of an 8-byte step, premultiplied, so a step is 8 loads and 7 adds
/// (16 KiB of tables, in L1).
static TS: [[u64; 256]; 8] = make_shifted();

/// One Horner step over 8 bytes.
#[inline(always)]
fn step8(h: u64, c: &[u8]) -> u64 {
    let a = TS[0][c[0] as usize].wrapping_add(TS[1][c[1] as usize]);
    let b = TS[2][c[2] as usize].wrapping_add(TS[3][c[3] as usize]);
    let d = TS[4][c[4] as usize].wrapping_add(TS[5][c[5] as usize]);
    let e = TS[6][c[6] as usize].wrapping_add(TS[7][c[7] as usize]);
    h.wrapping_mul(P8)
        .wrapping_add(a.wrapping_add(b).wrapping_add(d.wrapping_add(e)))
}

/// Weak hash by one serial chain.
fn weak_serial(mut h: u64, b: &[u8]) -> u64 {
    let mut chunks = b.chunks_exact(8);
    for c in &mut chunks {
        h = step8(h, c);
    }
    for &x in chunks.remainder() {
        h = h.wrapping_mul(B).wrapping_add(T[x as usize]);
    }
    h
}

/// Weak hash of a whole window (any length).
///
/// Long inputs are hashed as four quarters on four independent chains (the
/// CPU overlaps them; one chain is bound by its add/multiply latency), then
/// combined: `h = Σ h_k · B^(bytes after quarter k)`.
pub fn weak_hash(b: &[u8]) -> u64 {
    const MIN_SPLIT: usize = 1024;
    if b.len() < MIN_SPLIT {
        return weak_serial(0, b);
    }
    let q = b.len() / 4 / 8 * 8;
    let (s0, rest) = b.split_at(q);
    let (s1, rest) = rest.split_at(q);
    let (s2, s3) = rest.split_at(q);
    let (mut h0, mut h1, mut h2, mut h3) = (0u64, 0u64, 0u64, 0u64);
    for (((c0, c1), c2), c3) in s0
        .chunks_exact(8)
        .zip(s1.chunks_exact(8))
        .zip(s2.chunks_exact(8))
        .zip(s3.chunks_exact(8))
    {
        h0 = step8(h0, c0);
        h1 = step8(h1, c1);
        h2 = step8(h2, c2);
        h3 = step8(h3, c3);
    }
    h3 = weak_serial(h3, &s3[q..]);
    let l3 = s3.len() as u64;
    let pq = pow(B, q as u64);
    let p3 = pow(B, l3);
    // h0·B^(2q+l3) + h1·B^(q+l3) + h2·B^l3 + h3
    h0.wrapping_mul(pq)
        .wrapping_add(h1)
        .wrapping_mul(pq)
        .wrapping_add(h2)
        .wrapping_mul(p3)
        .wrapping_add(h3)
}

/// Weak hash of `len` zero bytes, in O(log len).
pub fn zero_weak(len: u64) -> u64 {
    // T[0] · (1 + B + … + B^(len-1)); the geometric sum by doubling.
    // s(n) = 1 + B + … + B^(n-1); s(2n) = s(n)·(1 + B^n); s(n+1) = s(n)·B + 1.
    let mut s = 0u64; // s(k) for the prefix of len's bits seen so far
    let mut bk = 1u64; // B^k
    for bit in (0..64).rev() {
        // k → 2k
        s = s.wrapping_mul(bk.wrapping_add(1));
        bk = bk.wrapping_mul(bk);
        if (len >> bit) & 1 == 1 {
            // k → k+1
            s = s.wrapping_mul(B).wrapping_add(1);
            bk = bk.wrapping_mul(B);
        }
    }
    T[0].wrapping_mul(s)
}

/// A window of fixed width that rolls one byte at a time.
#[derive(Clone, Debug)]
pub struct Roller {
    /// `T[b] · B^w` for every byte `b`.
    out: Box<[u64; 256]>,
}

impl Roller {
    /// A roller for windows of `width` bytes.
    pub fn new(width: u64) -> Self {
        let bw = pow(B, width);
        let mut out = Box::new([0u64; 256]);
        for (o, t) in out.iter_mut().zip(T.iter()) {
            *o = t.wrapping_mul(bw);
        }
        Self { out }
    }

    /// The hash of the window moved one byte on: `old` leaves, `new` enters.
    #[inline(always)]
    pub fn roll(&self, h: u64, old: u8, new: u8) -> u64 {
        // The difference does not depend on `h`: only one multiply-add is
        // on the serial chain from one position to the next.
        h.wrapping_mul(B)
            .wrapping_add(T[new as usize].wrapping_sub(self.out[old as usize]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(b: &[u8]) -> u64 {
        b.iter()
            .fold(0u64, |h, &x| h.wrapping_mul(B).wrapping_add(T[x as usize]))
    }

    #[test]
    fn chunked_equals_naive() {
        let v: Vec<u8> = (0..2000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        for len in [
            0, 1, 7, 8, 9, 63, 64, 65, 999, 1000, 1023, 1024, 1025, 1031, 1032, 2000,
        ] {
            assert_eq!(weak_hash(&v[..len]), naive(&v[..len]), "len {len}");
        }
    }

    #[test]
    fn zero_weak_matches() {
        for len in [0u64, 1, 2, 3, 8, 100, 8192, 8193, 1 << 20] {
            assert_eq!(
                zero_weak(len),
                weak_hash(&vec![0u8; len as usize]),
                "len {len}"
            );
        }
    }

    #[test]
    fn rolling_equals_fresh() {
        let v: Vec<u8> = (0..5000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        for w in [1usize, 64, 100, 1024] {
            let r = Roller::new(w as u64);
            let mut h = weak_hash(&v[..w]);
            for q in 1..v.len() - w {
                h = r.roll(h, v[q - 1], v[q + w - 1]);
                assert_eq!(h, weak_hash(&v[q..q + w]), "w {w} q {q}");
            }
        }
    }

    #[test]
    fn period_64_content_does_not_collapse() {
        // Distinct 64-periodic blocks must get distinct hashes (buzhash
        // would map all of them to one value).
        let mut seen = std::collections::HashSet::new();
        for k in 0..200u32 {
            let pat: Vec<u8> = (0..64u32).map(|i| (i * 31 + k * 17) as u8).collect();
            let block: Vec<u8> = pat.iter().cycle().take(8192).copied().collect();
            seen.insert(weak_hash(&block));
        }
        assert_eq!(seen.len(), 200);
    }
}
