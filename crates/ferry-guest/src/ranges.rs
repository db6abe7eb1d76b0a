//! Sorted, disjoint byte ranges.

/// Sorted, disjoint, non-adjacent half-open byte ranges `[start, end)`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ranges(Vec<(u64, u64)>);

impl Ranges {
    pub fn new() -> Self {
        Ranges(Vec::new())
    }

    /// Add `[start, end)`. Ranges may be pushed in any order; pushing in
    /// ascending order is O(1).
    pub fn push(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        match self.0.last_mut() {
            Some(last) if last.1 >= start && last.0 <= start => {
                last.1 = last.1.max(end);
            }
            Some(last) if last.0 > start => {
                self.0.push((start, end));
                self.normalise();
            }
            _ => self.0.push((start, end)),
        }
    }

    fn normalise(&mut self) {
        self.0.sort_unstable();
        let mut out: Vec<(u64, u64)> = Vec::with_capacity(self.0.len());
        for &(s, e) in &self.0 {
            match out.last_mut() {
                Some(l) if l.1 >= s => l.1 = l.1.max(e),
                _ => out.push((s, e)),
            }
        }
        self.0 = out;
    }

    /// Add every range of `other`.
    pub fn extend(&mut self, other: &Ranges) {
        for &(s, e) in &other.0 {
            self.push(s, e);
        }
    }

    /// Remove `[start, end)` from every range.
    pub fn remove(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let mut out = Vec::with_capacity(self.0.len() + 1);
        for &(s, e) in &self.0 {
            if e <= start || s >= end {
                out.push((s, e));
                continue;
            }
            if s < start {
                out.push((s, start));
            }
            if e > end {
                out.push((end, e));
            }
        }
        self.0 = out;
    }

    /// Keep only what lies inside `[start, end)`.
    pub fn clip(&mut self, start: u64, end: u64) {
        self.0.retain_mut(|r| {
            r.0 = r.0.max(start);
            r.1 = r.1.min(end);
            r.0 < r.1
        });
    }

    pub fn as_slice(&self) -> &[(u64, u64)] {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Total bytes covered.
    pub fn total(&self) -> u64 {
        self.0.iter().map(|r| r.1 - r.0).sum()
    }

    /// The first range that ends after `pos`, or `None`. O(log n).
    pub fn first_ending_after(&self, pos: u64) -> Option<(u64, u64)> {
        let i = self.0.partition_point(|r| r.1 <= pos);
        self.0.get(i).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::Ranges;
    use proptest::prelude::*;

    fn model(rs: &[(u64, u64)], removed: &[(u64, u64)]) -> Vec<bool> {
        let mut v = vec![false; 256];
        for &(s, e) in rs {
            for b in s..e {
                v[b as usize] = true;
            }
        }
        for &(s, e) in removed {
            for b in s..e {
                v[b as usize] = false;
            }
        }
        v
    }

    proptest! {
        #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]
        #[test]
        fn matches_a_bitmap(adds in prop::collection::vec((0u64..256, 0u64..64), 0..20),
                            rems in prop::collection::vec((0u64..256, 0u64..64), 0..5)) {
            let adds: Vec<(u64, u64)> = adds.iter().map(|&(s, l)| (s, (s + l).min(256))).collect();
            let rems: Vec<(u64, u64)> = rems.iter().map(|&(s, l)| (s, (s + l).min(256))).collect();
            let mut r = Ranges::new();
            for &(s, e) in &adds { r.push(s, e); }
            for &(s, e) in &rems { r.remove(s, e); }
            let want = model(&adds, &rems);
            let mut got = vec![false; 256];
            for &(s, e) in r.as_slice() { for b in s..e { got[b as usize] = true; } }
            prop_assert_eq!(got, want);
            for w in r.as_slice().windows(2) { prop_assert!(w[0].1 < w[1].0); }
        }
    }
}
