//! Hashers for maps whose keys are already well spread and not chosen by
//! a peer, where the default SipHash only costs time (a million-file
//! re-run hashes each path's digest and each file id once or more). A map
//! whose keys a peer picks (names, ids or digests it sends) keeps SipHash.

use std::hash::{BuildHasherDefault, Hasher};

/// Hashes a 128-bit digest made with a secret key (see
/// [`crate::pathset`]) by taking its low 64 bits: a peer cannot steer a
/// keyed hash, so these bits are as random as a second hash would make
/// them. Never for digests a peer sends (file or block hashes): those it
/// can choose.
#[derive(Clone, Copy, Debug, Default)]
pub struct DigestHasher(u64);

impl Hasher for DigestHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Maps of digests only call `write_u128`.
        debug_assert!(bytes.is_empty(), "a keyed digest is hashed as a u128");
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u128(&mut self, v: u128) {
        self.0 = v as u64;
    }
}

/// Hashes entry ids (this side's own counter, never a peer's choice: a
/// peer may only look ids up) by a multiply that spreads consecutive ids
/// over the high bits a table's tags use as well as the low bits of its
/// index.
#[derive(Clone, Copy, Debug, Default)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u32(&mut self, v: u32) {
        self.write_u64(u64::from(v));
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

pub type KeyedDigests = BuildHasherDefault<DigestHasher>;
pub type Ids = BuildHasherDefault<IdHasher>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::hash::BuildHasher;

    #[test]
    fn a_digest_is_its_own_low_bits() {
        let h = KeyedDigests::default().hash_one(0x1234_u128 << 64 | 0xabcd);
        assert_eq!(h, 0xabcd);
    }

    #[test]
    fn consecutive_ids_spread_over_high_and_low_bits() {
        let ids = Ids::default();
        let hs: Vec<u64> = (0..64u32).map(|i| ids.hash_one(i)).collect();
        let tags: std::collections::HashSet<u64> = hs.iter().map(|h| h >> 57).collect();
        let low: std::collections::HashSet<u64> = hs.iter().map(|h| h & 63).collect();
        assert!(
            tags.len() > 32 && low.len() > 32,
            "{} tags, {} low",
            tags.len(),
            low.len()
        );
        let mut m: HashMap<u32, u32, Ids> = HashMap::default();
        for i in 0..100_000 {
            m.insert(i, i * 2);
        }
        assert!((0..100_000).all(|i| m.get(&i) == Some(&(i * 2))));
        assert_eq!(m.get(&100_000), None);
    }
}
