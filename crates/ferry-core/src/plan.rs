//! Turning `SRC... DST` into what the sender sends and where the receiver
//! writes, with rsync's trailing-slash rule:
//!
//! * `src/` (trailing slash) copies the *contents* of `src` into `DST`;
//! * `src` copies the directory itself, as `DST/src`;
//! * a single file copied to a path that is not an existing directory (and
//!   does not end in `/`) is written *as* that path; a block device as
//!   destination is written in place.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// One source argument as the sender walks it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceSpec {
    /// The path to read.
    pub path: PathBuf,
    /// Its name under the destination root; empty when its contents go
    /// straight into the root (`src/`).
    pub name: Vec<u8>,
    /// Follow a symlink at `path` (a trailing slash asks for the target).
    pub follow: bool,
}

/// Where a sync reads and writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub sources: Vec<SourceSpec>,
    /// The directory the receiver writes under; created if missing.
    pub dest_root: PathBuf,
    /// Write the one source into this NBD export instead.
    pub dest_nbd: Option<String>,
}

/// The name a source path has in the destination directory; empty when
/// its contents go there (`dir/.`, `.`, `..`, `/`).
pub(crate) fn basename(p: &str) -> Result<Vec<u8>> {
    let trimmed = p.trim_end_matches('/');
    // `dir/.` names `dir`'s contents (`Path` would drop the `.`).
    if trimmed == "." || trimmed.ends_with("/.") {
        return Ok(Vec::new());
    }
    let name = Path::new(trimmed)
        .file_name()
        .map(|n| n.as_bytes().to_vec())
        .unwrap_or_default();
    if name.is_empty() || name == b".." || name == b"." {
        // `.` or `..` or `/`: copy contents, as rsync does for `.`.
        return Ok(Vec::new());
    }
    Ok(name)
}

/// Where a receiver writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dest {
    /// Everything goes under this directory (created if missing).
    Dir(PathBuf),
    /// One source without a trailing slash, whose kind only the sender
    /// knows (a pull, or a push to a path only the remote can see): if the
    /// path is an existing directory or the source is a directory, this is
    /// `Dir`; if the source is a file, it is written *as* this path.
    FileOrDir(PathBuf),
    /// An NBD export (`nbd://…`, `nbd+unix://…`): the one source file is
    /// written into it, in place.
    Nbd(String),
}

/// Source specs for the sender from command-line paths (trailing-slash
/// rule), where `is_dir` tells which paths are directories.
pub fn source_specs(
    sources: &[String],
    is_dir: impl Fn(&str) -> Option<bool>,
) -> Result<Vec<SourceSpec>> {
    let mut specs = Vec::new();
    for s in sources {
        if s.is_empty() {
            return Err(Error::Usage("empty source path".into()));
        }
        let slash = s.ends_with('/');
        let name = if let Some(own) = crate::endpoint::own_name(s) {
            own
        } else if slash && is_dir(s) == Some(true) {
            Vec::new()
        } else {
            basename(s)?
        };
        specs.push(SourceSpec {
            path: PathBuf::from(s),
            name,
            follow: slash,
        });
    }
    Ok(specs)
}

/// Plan a local sync. `dest_kind` reports what `dest` is now: `None` when it
/// does not exist, `Some(true)` for a directory, `Some(false)` otherwise.
pub fn plan(
    sources: &[String],
    dest: &str,
    source_is_dir: impl Fn(&str) -> Option<bool>,
    dest_kind: Option<bool>,
) -> Result<Plan> {
    if sources.is_empty() {
        return Err(Error::Usage("no source given".into()));
    }
    if dest.is_empty() {
        return Err(Error::Usage("empty destination".into()));
    }
    let mut specs = source_specs(sources, &source_is_dir)?;
    let dest_path = PathBuf::from(dest);
    let single_file = specs.len() == 1 && source_is_dir(&sources[0]) == Some(false);
    if single_file && dest_kind != Some(true) && !dest.ends_with('/') {
        // File to file: write under the parent with the destination's name.
        let name = basename(dest)?;
        if name.is_empty() {
            return Err(Error::Usage(format!("{dest}: not a file name")));
        }
        let parent = dest_path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        specs[0].name = name;
        return Ok(Plan {
            sources: specs,
            dest_root: parent,
            dest_nbd: None,
        });
    }
    if dest_kind == Some(false) {
        return Err(Error::Usage(format!(
            "{dest}: destination is not a directory (copying {} to it){}",
            if specs.len() > 1 {
                "several sources"
            } else {
                "a directory"
            },
            if specs.len() > 1 {
                ""
            } else {
                "; --force replaces a file or symlink with the directory"
            }
        )));
    }
    // Two sources that land on the same name would overwrite each other.
    let mut names: Vec<&[u8]> = specs
        .iter()
        .map(|s| s.name.as_slice())
        .filter(|n| !n.is_empty())
        .collect();
    names.sort();
    if names.windows(2).any(|w| w[0] == w[1]) {
        return Err(Error::Usage(
            "two sources have the same name in the destination".into(),
        ));
    }
    Ok(Plan {
        sources: specs,
        dest_root: dest_path,
        dest_nbd: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(srcs: &[&str], dest: &str, dirs: &[&str], dest_kind: Option<bool>) -> Plan {
        let srcs: Vec<String> = srcs.iter().map(|s| s.to_string()).collect();
        plan(
            &srcs,
            dest,
            |s| Some(dirs.contains(&s.trim_end_matches('/'))),
            dest_kind,
        )
        .unwrap()
    }

    #[test]
    fn trailing_slash_rule() {
        let a = p(&["src/"], "dst", &["src"], None);
        assert_eq!(a.sources[0].name, b"");
        assert_eq!(a.dest_root, PathBuf::from("dst"));
        let b = p(&["a/src"], "dst", &["a/src"], Some(true));
        assert_eq!(b.sources[0].name, b"src");
        assert_eq!(b.dest_root, PathBuf::from("dst"));
        // `src/.` is `src`'s contents, as in rsync; `src/./x` is `x`.
        for dot in ["a/src/.", "a/src/./", "."] {
            let c = p(&[dot], "dst", &["a/src/.", "."], Some(true));
            assert_eq!(c.sources[0].name, b"", "{dot}");
        }
        let d = p(&["src/./x"], "dst", &["src/./x"], Some(true));
        assert_eq!(d.sources[0].name, b"x");
    }

    #[test]
    fn single_file_targets() {
        let a = p(&["x/f.img"], "y/g.img", &[], None);
        assert_eq!(a.sources[0].name, b"g.img");
        assert_eq!(a.dest_root, PathBuf::from("y"));
        let b = p(&["f.img"], "dir", &[], Some(true));
        assert_eq!(b.sources[0].name, b"f.img");
        assert_eq!(b.dest_root, PathBuf::from("dir"));
        let c = p(&["f.img"], "newdir/", &[], None);
        assert_eq!(c.sources[0].name, b"f.img");
        let d = p(&["f"], "g", &[], None);
        assert_eq!(d.dest_root, PathBuf::from("."));
    }

    #[test]
    fn refusals() {
        let srcs = vec!["a".to_string(), "b".to_string()];
        assert!(plan(&srcs, "file", |_| Some(false), Some(false)).is_err());
        let srcs = vec!["x/a".to_string(), "y/a".to_string()];
        assert!(plan(&srcs, "d", |_| Some(false), Some(true)).is_err());
    }
}
