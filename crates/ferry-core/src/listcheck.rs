//! The receiver's rules for the sender's file list, as a plain state
//! machine with no I/O: what a hostile sender may not do, whatever the
//! destination holds.
//!
//! Paths are relative, `/`-separated, without empty, `.` or `..`
//! components and without NUL. Ids strictly increase. A path comes once,
//! except a directory again as a directory (`ferry sync a/ b/ dst` merges
//! two trees). An entry's parent is a directory entry of this list (or the
//! destination root), so nothing is ever placed below a symlink, a file or
//! a hard link. The root entry (`""`) is a directory. A hard link names an
//! earlier regular-file entry. A single-file destination takes exactly one
//! entry: a regular file, a symlink or a special file.

use crate::pathset::PathMap;

use ferry_link::{Entry, EntryKind};

/// Where the list is going to land.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// Under a destination directory.
    Tree,
    /// As one regular file (a file-or-directory destination that the first
    /// entry turned into a file).
    SingleFile,
}

/// Checks each entry of a list against the entries before it.
#[derive(Debug)]
pub struct ListCheck {
    shape: Shape,
    last_id: Option<u32>,
    /// Kind and id of every path seen (by keyed digest: see
    /// [`crate::pathset`]); a file's id is what a hard link to it names.
    kinds: PathMap<Listed>,
    /// The last parent found to be a directory of the list: entries come
    /// a directory at a time, and a directory stays one.
    known_dir: Vec<u8>,
    entries: u64,
    /// On a pull: the names the user asked for (see [`ListCheck::expect_top`]).
    top: Option<Vec<Vec<u8>>>,
    /// On a pull: the patterns of sources with wildcards (`host:d/*.log`).
    top_patterns: Vec<crate::globs::NamePattern>,
}

/// What the list said a path is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Listed {
    kind: EntryKind,
    id: u32,
}

/// Largest file size a list may announce: segment indexes are u32.
pub const MAX_FILE_SIZE: u64 = (u32::MAX as u64) * ferry_link::layout::SEGMENT;

/// Why an entry was refused: the sender broke the protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

/// A path as printed in messages.
pub fn shown(p: &[u8]) -> String {
    if p.is_empty() {
        ".".into()
    } else {
        String::from_utf8_lossy(p).into_owned()
    }
}

/// Whether `p` is a relative path ferry accepts from a peer.
pub fn valid_rel(p: &[u8]) -> bool {
    p.is_empty()
        || (!p.contains(&0)
            && p.split(|&b| b == b'/')
                .all(|c| !c.is_empty() && c != b"." && c != b".."))
}

/// The parent of a relative path (`""` for a top-level name).
pub fn parent_of(p: &[u8]) -> &[u8] {
    match p.iter().rposition(|&b| b == b'/') {
        Some(i) => &p[..i],
        None => &[],
    }
}

impl ListCheck {
    pub fn new(shape: Shape) -> Self {
        Self {
            shape,
            last_id: None,
            kinds: PathMap::default(),
            known_dir: Vec::new(),
            entries: 0,
            top: None,
            top_patterns: Vec::new(),
        }
    }

    /// A pull asked for these names (each source's last component, without
    /// a trailing slash): every entry must lie under one of them, and the
    /// root entry is refused, so a hostile sender cannot put `.ssh/…` into
    /// a destination directory when asked for `notes.txt` (rsync's
    /// CVE-2022-29154). `None` (a source with a trailing slash: its
    /// contents) allows any name.
    pub fn expect_top(&mut self, names: Option<Vec<Vec<u8>>>) {
        self.top = names;
    }

    /// With [`ListCheck::expect_top`]: a name one of these patterns
    /// matches was asked for too (a source with wildcards, which the
    /// sender expanded).
    pub fn expect_top_patterns(&mut self, patterns: Vec<crate::globs::NamePattern>) {
        self.top_patterns = patterns;
    }

    /// Whether `path`'s first component is one the user asked for.
    pub fn top_ok(&self, path: &[u8]) -> Result<(), Refused> {
        let Some(top) = &self.top else { return Ok(()) };
        let first = path.split(|&b| b == b'/').next().unwrap_or_default();
        let asked = top.iter().any(|t| t.as_slice() == first)
            || self.top_patterns.iter().any(|p| p.matches(first));
        if path.is_empty() || !asked {
            return Err(Refused(format!(
                "the sender sent {:?}, which was not asked for",
                shown(path)
            )));
        }
        Ok(())
    }

    /// The list turned out to be a single file (see [`Shape::SingleFile`]).
    pub fn set_shape(&mut self, shape: Shape) {
        self.shape = shape;
    }

    /// Whether the list so far named `path`.
    pub fn has(&self, path: &[u8]) -> bool {
        self.kinds.get(path).is_some()
    }

    /// Accept `e` or say why not. An accepted entry is remembered.
    pub fn admit(&mut self, e: &Entry) -> Result<(), Refused> {
        let kind = e.kind();
        let path = &e.path;
        let refuse = |why: &str| Err(Refused(format!("{why}: {:?}", shown(path))));
        if !valid_rel(path) {
            return refuse("unsafe path in file list");
        }
        if self.last_id.is_some_and(|last| e.id <= last) {
            return refuse("entry ids do not increase");
        }
        if self.shape == Shape::SingleFile {
            if self.entries > 0 {
                return refuse("a single-file destination takes one file, and the list goes on");
            }
            if matches!(kind, EntryKind::Dir | EntryKind::HardLink) {
                return refuse("a single-file destination takes one file, symlink or special file");
            }
        }
        if path.is_empty() && kind != EntryKind::Dir {
            return refuse("the root of the list is not a directory");
        }
        if e.size > MAX_FILE_SIZE {
            return refuse("file larger than the protocol allows");
        }
        let key = self.kinds.key(path);
        match self.kinds.get_at(key).map(|l| l.kind) {
            Some(EntryKind::Dir) if kind == EntryKind::Dir => {}
            Some(_) => return refuse("entry sent twice"),
            None => {}
        }
        let parent = parent_of(path);
        if !path.is_empty() && !parent.is_empty() && parent != self.known_dir.as_slice() {
            if self.kinds.get(parent).map(|l| l.kind) != Some(EntryKind::Dir) {
                return refuse("entry is not below a directory of the list");
            }
            self.known_dir.clear();
            self.known_dir.extend_from_slice(parent);
        }
        // The path and the id must name the same earlier file.
        let target = Listed {
            kind: EntryKind::File,
            id: e.link_to,
        };
        if kind == EntryKind::HardLink
            && (e.target.is_empty()
                || !valid_rel(&e.target)
                || self.kinds.get(&e.target) != Some(&target))
        {
            return refuse("hard link to an entry that is not an earlier regular file");
        }
        self.last_id = Some(e.id);
        self.entries += 1;
        self.kinds.insert_at(key, Listed { kind, id: e.id });
        Ok(())
    }
}

/// The list path of `name` in the directory listed as `parent` (the root
/// is the empty path): one `/` between, none before a child of the root.
/// Names are bytes, not UTF-8.
pub fn child_path(parent: &[u8], name: &[u8]) -> Vec<u8> {
    let mut path = Vec::with_capacity(parent.len() + 1 + name.len());
    path.extend_from_slice(parent);
    if !path.is_empty() {
        path.push(b'/');
    }
    path.extend_from_slice(name);
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ent(id: u32, path: &str, kind: EntryKind) -> Entry {
        Entry {
            id,
            path: path.as_bytes().to_vec(),
            kind: Some(kind),
            ..Default::default()
        }
    }

    fn run(shape: Shape, list: &[Entry]) -> Result<(), Refused> {
        let mut c = ListCheck::new(shape);
        list.iter().try_for_each(|e| c.admit(e))
    }

    use EntryKind::{Dir, File, HardLink, Symlink};

    #[test]
    fn children_are_listed_under_their_directory() {
        assert_eq!(child_path(b"", b"x"), b"x");
        assert_eq!(child_path(b"a", b"x"), b"a/x");
        assert_eq!(child_path(b"a/b", b"x y"), b"a/b/x y");
        assert_eq!(child_path(b"d", b"\xff"), b"d/\xff");
    }

    #[test]
    fn an_ordinary_tree_passes() {
        let mut link = ent(5, "a/h", HardLink);
        link.link_to = 3;
        link.target = b"a/b/f".to_vec();
        let list = [
            ent(0, "", Dir),
            ent(1, "a", Dir),
            ent(2, "a/b", Dir),
            ent(3, "a/b/f", File),
            ent(4, "a/l", Symlink),
            link,
            ent(6, "a-b", File),
        ];
        assert_eq!(run(Shape::Tree, &list), Ok(()));
    }

    #[test]
    fn two_trees_merge_their_directories() {
        let list = [
            ent(0, "", Dir),
            ent(1, "d", Dir),
            ent(2, "d/x", File),
            ent(3, "", Dir),
            ent(4, "d", Dir),
            ent(5, "d/y", File),
        ];
        assert_eq!(run(Shape::Tree, &list), Ok(()));
    }

    #[test]
    fn a_directory_replaced_by_a_symlink_is_refused() {
        let list = [ent(0, "a", Dir), ent(1, "a", Symlink), ent(2, "a/x", File)];
        assert!(run(Shape::Tree, &list).is_err());
    }

    #[test]
    fn nothing_below_a_non_directory() {
        for k in [Symlink, File] {
            let list = [ent(0, "l", k), ent(1, "l/x", File)];
            assert!(run(Shape::Tree, &list).is_err(), "{k:?}");
        }
        // A parent that was never sent.
        assert!(run(Shape::Tree, &[ent(0, "nope/x", File)]).is_err());
    }

    #[test]
    fn the_root_is_a_directory() {
        for k in [Symlink, File, HardLink] {
            assert!(run(Shape::Tree, &[ent(0, "", k)]).is_err(), "{k:?}");
        }
    }

    #[test]
    fn duplicates_and_ids_that_do_not_increase_are_refused() {
        assert!(run(Shape::Tree, &[ent(0, "a", File), ent(1, "a", File)]).is_err());
        assert!(run(Shape::Tree, &[ent(0, "a", Dir), ent(1, "a", File)]).is_err());
        assert!(run(Shape::Tree, &[ent(1, "a", File), ent(1, "b", File)]).is_err());
        assert!(run(Shape::Tree, &[ent(2, "a", File), ent(1, "b", File)]).is_err());
    }

    #[test]
    fn unsafe_paths_are_refused() {
        for p in ["..", "a/../b", "/etc/x", "a//b", ".", "a/.", "x\0y", "a/"] {
            assert!(run(Shape::Tree, &[ent(0, p, File)]).is_err(), "{p:?}");
        }
    }

    #[test]
    fn hard_links_name_an_earlier_regular_file() {
        let mut to_dir = ent(2, "h", HardLink);
        to_dir.link_to = 0;
        assert!(run(Shape::Tree, &[ent(0, "d", Dir), ent(1, "f", File), to_dir]).is_err());
        let mut forward = ent(1, "h", HardLink);
        forward.link_to = 2;
        assert!(run(Shape::Tree, &[ent(0, "d", Dir), forward, ent(2, "f", File)]).is_err());
        let mut to_link = ent(1, "h", HardLink);
        to_link.link_to = 0;
        assert!(run(Shape::Tree, &[ent(0, "l", Symlink), to_link]).is_err());
        // Version 10: the target's path is a listed regular file too.
        let link = |target: &str| {
            let mut l = ent(3, "h", HardLink);
            l.link_to = 1;
            l.target = target.as_bytes().to_vec();
            l
        };
        let before = [ent(0, "d", Dir), ent(1, "f", File), ent(2, "l", Symlink)];
        let with = |l: Entry| {
            let mut v = before.to_vec();
            v.push(l);
            run(Shape::Tree, &v)
        };
        assert_eq!(with(link("f")), Ok(()));
        for bad in ["", "d", "l", "nope", "../f", "/f", "f/"] {
            assert!(with(link(bad)).is_err(), "{bad:?}");
        }
        // The id and the path must name the same file.
        let mut two = before.to_vec();
        two.push(ent(3, "g", File));
        let mut crossed = ent(4, "h", HardLink);
        crossed.link_to = 1;
        crossed.target = b"g".to_vec();
        two.push(crossed);
        assert!(run(Shape::Tree, &two).is_err());
    }

    #[test]
    fn the_remembered_parent_is_only_ever_a_directory() {
        // Entries of one directory, then a file whose name is that of a
        // later parent: the remembered directory does not cover it.
        let list = [
            ent(0, "d", Dir),
            ent(1, "d/a", File),
            ent(2, "d/b", File),
            ent(3, "f", File),
            ent(4, "f/x", File),
        ];
        assert!(run(Shape::Tree, &list).is_err());
        let ok = [
            ent(0, "d", Dir),
            ent(1, "d/a", File),
            ent(2, "e", Dir),
            ent(3, "e/a", File),
            ent(4, "d/b", File),
        ];
        assert_eq!(run(Shape::Tree, &ok), Ok(()));
    }

    #[test]
    fn a_pull_takes_only_the_names_asked_for() {
        let mut c = ListCheck::new(Shape::Tree);
        c.expect_top(Some(vec![b"notes.txt".to_vec(), b"d".to_vec()]));
        assert!(c.top_ok(b"notes.txt").is_ok());
        assert!(c.top_ok(b"d/x/y").is_ok());
        for p in ["", ".ssh", ".ssh/authorized_keys", "notes.txt2", "dd/x"] {
            assert!(c.top_ok(p.as_bytes()).is_err(), "{p:?}");
        }
        c.expect_top_patterns(vec![crate::globs::NamePattern::new("*.log").unwrap()]);
        assert!(c.top_ok(b"a.log/x").is_ok());
        assert!(c.top_ok(b"notes.txt").is_ok());
        for p in ["", ".ssh", ".x.log", "a.log2"] {
            assert!(c.top_ok(p.as_bytes()).is_err(), "{p:?}");
        }
        c.expect_top(None);
        assert!(c.top_ok(b".ssh").is_ok());
    }

    #[test]
    fn sizes_beyond_u32_segments_are_refused() {
        let mut big = ent(0, "f", File);
        big.size = MAX_FILE_SIZE + 1;
        assert!(run(Shape::Tree, &[big]).is_err());
        let mut ok = ent(0, "f", File);
        ok.size = MAX_FILE_SIZE;
        assert!(run(Shape::Tree, &[ok]).is_ok());
    }

    #[test]
    fn a_single_file_destination_takes_one_regular_file() {
        assert_eq!(run(Shape::SingleFile, &[ent(0, "f", File)]), Ok(()));
        assert!(run(Shape::SingleFile, &[ent(0, "f", File), ent(1, "g", File)]).is_err());
        assert_eq!(run(Shape::SingleFile, &[ent(0, "l", Symlink)]), Ok(()));
        assert!(run(Shape::SingleFile, &[ent(0, "d", Dir)]).is_err());
    }
}
