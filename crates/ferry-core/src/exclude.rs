//! `--exclude PATTERN`: gitignore-style globs matched against paths relative
//! to each source root (and, for `--delete`, to the destination root).

use std::path::Path;

use ignore::gitignore::{Gitignore, GitignoreBuilder};

use crate::error::{Error, Result};

/// A compiled set of exclude patterns.
#[derive(Clone, Debug)]
pub struct Excludes {
    set: Option<Gitignore>,
    patterns: Vec<String>,
}

impl Excludes {
    /// Compile `patterns`; an invalid glob is a usage error.
    pub fn new(patterns: &[String]) -> Result<Self> {
        if patterns.is_empty() {
            return Ok(Self {
                set: None,
                patterns: Vec::new(),
            });
        }
        let mut b = GitignoreBuilder::new("/");
        for p in patterns {
            b.add_line(None, p)
                .map_err(|e| Error::Usage(format!("--exclude {p}: {e}")))?;
        }
        let set = b
            .build()
            .map_err(|e| Error::Usage(format!("--exclude: {e}")))?;
        Ok(Self {
            set: Some(set),
            patterns: patterns.to_vec(),
        })
    }

    /// The patterns as given.
    pub fn patterns(&self) -> &[String] {
        &self.patterns
    }

    /// True when the entry at `rel` (relative, `/`-separated) is excluded.
    pub fn excluded(&self, rel: &Path, is_dir: bool) -> bool {
        match &self.set {
            None => false,
            Some(s) => {
                let abs = Path::new("/").join(rel);
                s.matched_path_or_any_parents(&abs, is_dir).is_ignore()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gitignore_semantics() {
        let e = Excludes::new(&["*.tmp".into(), "/build/".into(), "cache".into()]).unwrap();
        assert!(e.excluded(Path::new("a/b.tmp"), false));
        assert!(e.excluded(Path::new("build"), true));
        assert!(!e.excluded(Path::new("x/build"), true));
        assert!(e.excluded(Path::new("x/cache/y"), false));
        assert!(!e.excluded(Path::new("keep.txt"), false));
        assert!(!Excludes::new(&[]).unwrap().excluded(Path::new("a"), false));
    }
}
