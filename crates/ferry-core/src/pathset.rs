//! Sets of paths kept as 128-bit keyed digests, for the sets a file list
//! fills one entry at a time (every path listed, for `--delete` and the
//! list's checks). A path's bytes are not kept: a million paths cost
//! about 32 bytes each instead of their length plus a heap allocation
//! and a `Vec`.
//!
//! The digest is two SipHash-1-3 with keys drawn at random for each set,
//! so a peer cannot choose paths that collide; by chance, two of a billion
//! paths collide with a probability near 2^-68. A collision makes a path
//! look listed that was not: for `--delete` an extra file is kept, never
//! a listed one removed. The tables hash a digest by its low half (see
//! [`crate::fasthash`]), which the second key keeps out of a peer's reach.

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hasher};

use crate::fasthash::KeyedDigests;

/// The keys of one set's digests.
#[derive(Clone, Debug, Default)]
pub struct PathKeys {
    a: RandomState,
    b: RandomState,
}

impl PathKeys {
    /// The digest of `path` under these keys.
    pub fn key(&self, path: &[u8]) -> u128 {
        let mut a = self.a.build_hasher();
        a.write(path);
        let mut b = self.b.build_hasher();
        b.write(path);
        (u128::from(a.finish()) << 64) | u128::from(b.finish())
    }
}

/// A set of paths.
#[derive(Clone, Debug, Default)]
pub struct PathSet {
    keys: PathKeys,
    set: HashSet<u128, KeyedDigests>,
}

impl PathSet {
    pub fn insert(&mut self, path: &[u8]) -> bool {
        self.set.insert(self.keys.key(path))
    }

    pub fn contains(&self, path: &[u8]) -> bool {
        self.set.contains(&self.keys.key(path))
    }

    pub fn len(&self) -> usize {
        self.set.len()
    }

    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }
}

impl<'a> FromIterator<&'a [u8]> for PathSet {
    fn from_iter<I: IntoIterator<Item = &'a [u8]>>(it: I) -> PathSet {
        let mut s = PathSet::default();
        for p in it {
            s.insert(p);
        }
        s
    }
}

/// A map from paths to values, keyed as [`PathSet`] is.
#[derive(Clone, Debug)]
pub struct PathMap<V> {
    keys: PathKeys,
    map: HashMap<u128, V, KeyedDigests>,
}

impl<V> Default for PathMap<V> {
    fn default() -> Self {
        PathMap {
            keys: PathKeys::default(),
            map: HashMap::default(),
        }
    }
}

/// A path's digest in one [`PathMap`], for a lookup and an insert that
/// hash the path once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathKey(u128);

impl<V> PathMap<V> {
    pub fn insert(&mut self, path: &[u8], v: V) -> Option<V> {
        self.map.insert(self.keys.key(path), v)
    }

    pub fn get(&self, path: &[u8]) -> Option<&V> {
        self.map.get(&self.keys.key(path))
    }

    /// `path`'s digest in this map.
    pub fn key(&self, path: &[u8]) -> PathKey {
        PathKey(self.keys.key(path))
    }

    pub fn get_at(&self, k: PathKey) -> Option<&V> {
        self.map.get(&k.0)
    }

    pub fn insert_at(&mut self, k: PathKey, v: V) -> Option<V> {
        self.map.insert(k.0, v)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// A set of directory paths, kept whole, that remembers the last one
/// found: a list brings a directory's entries together, so most lookups
/// ask for the same directory as the one before and cost a comparison.
#[derive(Clone, Debug, Default)]
pub struct DirSet {
    set: HashSet<Vec<u8>>,
    last: Option<Vec<u8>>,
}

impl DirSet {
    /// The set of `path` alone.
    pub fn with(path: &[u8]) -> DirSet {
        let mut d = DirSet::default();
        d.insert(path);
        d
    }

    pub fn insert(&mut self, path: &[u8]) -> bool {
        !self.set.contains(path) && self.set.insert(path.to_vec())
    }

    /// Whether `path` is in the set (paths are never removed, so the last
    /// one found stays in it).
    pub fn contains(&mut self, path: &[u8]) -> bool {
        if self.last.as_deref() == Some(path) {
            return true;
        }
        if !self.set.contains(path) {
            return false;
        }
        let last = self.last.get_or_insert_with(Vec::new);
        last.clear();
        last.extend_from_slice(path);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_found_and_others_are_not() {
        let mut s: PathSet = [&b"a/x"[..], b"a", b""].into_iter().collect();
        assert!(s.contains(b"a/x") && s.contains(b"a") && s.contains(b""));
        assert!(!s.contains(b"a/y") && !s.contains(b"b/x") && !s.contains(b"a/"));
        assert!(!s.insert(b"a"), "already there");
        assert_eq!(s.len(), 3);
        let mut m = PathMap::default();
        assert_eq!(m.insert(b"d", 1), None);
        assert_eq!(m.insert(b"d", 2), Some(1));
        assert_eq!(m.get(b"d"), Some(&2));
        assert_eq!(m.get(b"e"), None);
        let k = m.key(b"e");
        assert_eq!(k, m.key(b"e"));
        assert_eq!(m.insert_at(k, 3), None);
        assert_eq!((m.get(b"e"), m.get_at(m.key(b"d"))), (Some(&3), Some(&2)));
        assert_eq!(m.len(), 2);
    }

    #[test]
    fn a_dir_set_finds_the_last_one_found_and_the_others() {
        let mut d = DirSet::default();
        assert!(!d.contains(b""));
        assert!(d.insert(b"") && d.insert(b"a") && !d.insert(b"a"));
        assert!(
            d.contains(b"a") && d.contains(b"a"),
            "found, then remembered"
        );
        assert!(d.contains(b"") && d.contains(b"a"));
        assert!(!d.contains(b"b") && !d.contains(b"a/"));
        assert!(d.contains(b"a"));
    }

    #[test]
    fn each_set_has_its_own_keys() {
        let (a, b) = (PathKeys::default(), PathKeys::default());
        assert_ne!(a.key(b"same"), b.key(b"same"));
        assert_eq!(a.key(b"same"), a.clone().key(b"same"));
    }

    #[test]
    fn a_hundred_thousand_paths_do_not_collide() {
        let mut s = PathSet::default();
        for i in 0..100_000u32 {
            assert!(s.insert(format!("d{}/f{}", i / 100, i % 100).as_bytes()));
        }
        assert_eq!(s.len(), 100_000);
    }
}
