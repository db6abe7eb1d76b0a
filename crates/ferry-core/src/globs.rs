//! Wildcards in the sources of a pull (`host:logs/*.gz`), as rsync users
//! write them: the remote ferry expands them itself, the way a shell
//! would (`*`, `?`, `[...]` within one component; a name starting with
//! `.` only matched by a pattern starting with `.`; sorted; a pattern
//! that matches nothing stays as written), so the path still crosses
//! ssh fully quoted. The receiver accepts, as top-level names, those that
//! the last component's pattern matches (see [`crate::listcheck`]).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use globset::{GlobBuilder, GlobMatcher};

/// Whether `s` holds a wildcard.
pub fn has_glob(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// One path component's pattern.
#[derive(Clone, Debug)]
pub struct NamePattern {
    glob: GlobMatcher,
    /// The pattern starts with `.`: it may match hidden names.
    dot: bool,
}

impl NamePattern {
    /// `None` when `pat` has no wildcard or is not a valid pattern (it is
    /// then a plain name).
    pub fn new(pat: &str) -> Option<NamePattern> {
        if !has_glob(pat) || pat.contains('/') {
            return None;
        }
        let glob = GlobBuilder::new(pat)
            .literal_separator(true)
            .backslash_escape(true)
            .build()
            .ok()?
            .compile_matcher();
        Some(NamePattern {
            glob,
            dot: pat.starts_with('.'),
        })
    }

    pub fn matches(&self, name: &[u8]) -> bool {
        (self.dot || !name.starts_with(b"."))
            && name != b"."
            && name != b".."
            && self.glob.is_match(Path::new(OsStr::from_bytes(name)))
    }
}

/// The paths `path` names once its wildcards are expanded against the
/// filesystem, sorted; `path` itself when it has none or matches nothing.
/// A trailing `/` matches directories only and is kept on each.
pub fn expand(path: &str) -> Vec<String> {
    if !has_glob(path) {
        return vec![path.to_string()];
    }
    let slash = path.ends_with('/');
    let absolute = path.starts_with('/');
    let parts: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    let mut found: Vec<String> = vec![if absolute { "/".into() } else { String::new() }];
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        let mut next = Vec::new();
        for base in &found {
            let join = |name: &str| format!("{base}{name}{}", if last { "" } else { "/" });
            let Some(pat) = NamePattern::new(part) else {
                next.push(join(part));
                continue;
            };
            let dir = if base.is_empty() { "." } else { base.as_str() };
            let Ok(rd) = std::fs::read_dir(dir) else {
                continue;
            };
            let mut names: Vec<String> = rd
                .filter_map(|e| e.ok())
                .filter(|e| pat.matches(e.file_name().as_bytes()))
                // A name that is not UTF-8 cannot be passed on as a source.
                .filter_map(|e| e.file_name().into_string().ok())
                .collect();
            names.sort();
            next.extend(names.iter().map(|n| join(n)));
        }
        found = next;
    }
    // Only what is there: a plain component after a wildcard may name
    // nothing (`*/x` where some match has no `x`).
    found.retain(|p| match std::fs::symlink_metadata(p) {
        Ok(_) if slash => Path::new(p).is_dir(),
        Ok(_) => true,
        Err(_) => false,
    });
    if found.is_empty() {
        return vec![path.to_string()];
    }
    if slash {
        found.iter_mut().for_each(|p| p.push('/'));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_as_a_shell_does() {
        let p = NamePattern::new("*.txt").unwrap();
        assert!(p.matches(b"a.txt"));
        assert!(!p.matches(b".hidden.txt"));
        assert!(!p.matches(b"a.txt.gz"));
        assert!(NamePattern::new(".*").unwrap().matches(b".hidden"));
        assert!(!NamePattern::new(".*").unwrap().matches(b".."));
        assert!(NamePattern::new("f[0-9]?").unwrap().matches(b"f1x"));
        assert!(NamePattern::new("plain").is_none());
        assert!(NamePattern::new("[unclosed").is_none());
    }

    #[test]
    fn expand_walks_each_component() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().to_str().unwrap();
        for f in [
            "a/x.txt", "a/y.txt", "a/.z.txt", "b/x.txt", "b/w.log", "c.txt",
        ] {
            let p = d.path().join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, b"").unwrap();
        }
        let rel = |v: Vec<String>| -> Vec<String> {
            v.into_iter()
                .map(|p| p.strip_prefix(root).unwrap_or(&p).to_string())
                .collect()
        };
        assert_eq!(
            rel(expand(&format!("{root}/a/*.txt"))),
            ["/a/x.txt", "/a/y.txt"]
        );
        assert_eq!(
            rel(expand(&format!("{root}/*/x.txt"))),
            ["/a/x.txt", "/b/x.txt"]
        );
        assert_eq!(rel(expand(&format!("{root}/*/"))), ["/a/", "/b/"]);
        assert_eq!(rel(expand(&format!("{root}/?.txt"))), ["/c.txt"]);
        assert_eq!(rel(expand(&format!("{root}/a/*.none"))), ["/a/*.none"]);
        assert_eq!(rel(expand(&format!("{root}/c.txt"))), ["/c.txt"]);
    }
}
