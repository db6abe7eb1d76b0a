//! Before and after the data: how the destination root is prepared
//! ([`root_at`], [`late_root`]), whether `--delete` runs ([`deletion`]),
//! which destination entries it removes ([`extras`]) and, with a sender
//! that lists one walk, when a directory's entries have all come
//! ([`subtree_step`]).

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use ferry_link::EntryKind;

use super::Kind;
use crate::error::{Error, Result};
use crate::listcheck::child_path;
use crate::Excludes;

/// What becomes of the destination root of a tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RootAt {
    /// A directory is there.
    Use,
    /// A file or symlink is there and `--force` replaces it by a directory.
    Replace,
    /// Nothing is there (or it cannot be looked at): created.
    Create,
    /// Something that is not a directory stays: the run fails with this.
    Refuse(&'static str),
}

/// The tree's root holds `existing` (`None`: nothing, or `lstat` failed).
/// Only a file or symlink is ever replaced, and only with `--force`; a
/// device, FIFO or socket never.
pub(crate) fn root_at(existing: Option<Kind>, force: bool) -> RootAt {
    match existing {
        None => RootAt::Create,
        Some(Kind::Dir) => RootAt::Use,
        Some(Kind::File | Kind::Symlink) if force => RootAt::Replace,
        Some(Kind::File | Kind::Symlink) => {
            RootAt::Refuse("destination exists and is not a directory (--force replaces it)")
        }
        Some(_) => RootAt::Refuse("destination exists and is not a directory"),
    }
}

/// The root of a file-or-directory destination once its first entry is
/// known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LateRoot {
    /// The directory the entries go into.
    pub(crate) root: PathBuf,
    /// A file source's new path (relative to `root`): the destination's
    /// own name.
    pub(crate) name: Option<Vec<u8>>,
}

/// A directory source goes under the path `p`; any other becomes `p`, a
/// file named as `p`'s last component in `p`'s directory (`.` when it has
/// none). A path without a last component (`/`, `..`) cannot name a file.
pub(crate) fn late_root(p: &Path, first: EntryKind) -> Result<LateRoot> {
    // `dir/.` names a directory (`Path` drops the `.`): a file goes in it.
    let dot = p.as_os_str().as_bytes();
    if first == EntryKind::Dir || dot == b"." || dot.ends_with(b"/.") {
        return Ok(LateRoot {
            root: p.to_path_buf(),
            name: None,
        });
    }
    let name = p
        .file_name()
        .map(|n| n.as_bytes().to_vec())
        .unwrap_or_default();
    if name.is_empty() {
        return Err(Error::Usage(format!("{}: not a file name", p.display())));
    }
    let root = p
        .parent()
        .filter(|q| !q.as_os_str().is_empty())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    Ok(LateRoot {
        root,
        name: Some(name),
    })
}

/// Whether `--delete` runs at the end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Deletion {
    /// Not asked for.
    Off,
    /// Asked for, but the sender could not read part of the source: what
    /// is missing from the list may only be unreadable, so nothing is
    /// deleted (as rsync's "IO error encountered -- skipping file
    /// deletion").
    Skipped,
    Run,
}

/// `source_unread`: the sender reported an entry it could not list or
/// read (a `FileFailed`); `--ignore-errors` deletes anyway.
pub(crate) fn deletion(delete: bool, source_unread: bool, ignore_errors: bool) -> Deletion {
    match (delete, source_unread && !ignore_errors) {
        (false, _) => Deletion::Off,
        (true, true) => Deletion::Skipped,
        (true, false) => Deletion::Run,
    }
}

/// A destination entry `--delete` removes, with all it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Extra {
    pub(crate) name: OsString,
    /// Its path relative to the root.
    pub(crate) rel: Vec<u8>,
    pub(crate) is_dir: bool,
}

/// Whether the destination entry `name` in the directory `parent` may be
/// work of this run in progress while the list streams, which `--delete`
/// leaves alone then although the list does not name it: a temporary file
/// of this process (`pid`), or the partial file or journal of a file the
/// list names (`seen`), which may still be arriving (or waiting to be
/// resumed). Once every transfer is over, the end of the run deletes what
/// was held back so as rsync's `--partial` would (see [`extras`]).
pub(crate) fn in_use(parent: &[u8], name: &[u8], seen: &crate::pathset::PathSet, pid: u32) -> bool {
    crate::fsutil::temp_owner(name) == Some(pid)
        || crate::journal::reserved_base(name)
            .is_some_and(|b| seen.contains(&child_path(parent, b)))
}

/// Of the entries (name, is a directory) of the destination directory
/// `parent`, those to delete: not in the source list (`seen`, by path,
/// whatever its kind there), not protected by the excludes (`None`:
/// nothing is protected, `--delete-excluded`) and, `during` the list, not
/// work in progress ([`in_use`]), in listing order; and whether work in
/// progress was held back (the end of the run looks again).
pub(crate) fn extras(
    parent: &[u8],
    listing: Vec<(OsString, bool)>,
    seen: &crate::pathset::PathSet,
    excludes: Option<&Excludes>,
    during: bool,
) -> (Vec<Extra>, bool) {
    let mut held = false;
    let extras = listing
        .into_iter()
        .filter_map(|(name, is_dir)| {
            let rel = child_path(parent, name.as_bytes());
            let keep = seen.contains(&rel)
                || excludes.is_some_and(|x| x.excluded(Path::new(OsStr::from_bytes(&rel)), is_dir));
            let busy = !keep
                && during
                && !is_dir
                && in_use(parent, name.as_bytes(), seen, crate::fsutil::own_pid());
            held |= busy;
            (!keep && !busy).then_some(Extra { name, rel, is_dir })
        })
        .collect();
    (extras, held)
}

/// A sender that announced one walk ([`ferry_link::features::SUBTREES`])
/// lists the entry `path` (`is_dir`: a directory); `open` holds the
/// directories the list is in, outermost first (the root, `""`, is never
/// among them: it ends with the list). Returns the directories whose
/// subtree this entry ends, innermost first, and updates `open`; or,
/// when the entry's directory is not open (its subtree ended before, so
/// the sender broke its promise), why, and `open` is left as it was.
pub(crate) fn subtree_step(
    open: &mut Vec<Vec<u8>>,
    path: &[u8],
    is_dir: bool,
) -> std::result::Result<Vec<Vec<u8>>, String> {
    if path.is_empty() {
        return Ok(Vec::new());
    }
    if is_dir && open.iter().any(|d| d.as_slice() == path) {
        return Err(format!(
            "{}: directory listed again (the sender announced one walk)",
            crate::listcheck::shown(path)
        ));
    }
    let parent = crate::listcheck::parent_of(path);
    let keep = if parent.is_empty() {
        0
    } else {
        match open.iter().rposition(|d| d.as_slice() == parent) {
            Some(i) => i + 1,
            None => {
                return Err(format!(
                    "{}: listed after the entries of its directory ended (the sender announced one walk)",
                    crate::listcheck::shown(path)
                ))
            }
        }
    };
    let mut ended = open.split_off(keep);
    ended.reverse();
    if is_dir {
        open.push(path.to_vec());
    }
    Ok(ended)
}

/// The order rsync deletes the entries of one directory in, which decides
/// what a `--max-delete` limit spares: its sorted list (files before
/// directories, each by name) walked backwards, so directories first, each
/// kind by name from the end.
pub(crate) fn rsync_delete_order(a: (&OsStr, bool), b: (&OsStr, bool)) -> std::cmp::Ordering {
    (b.1, b.0).cmp(&(a.1, a.0))
}

/// Changed directories from which the end of a run syncs their whole
/// filesystems (one `syncfs` each) instead of each directory: an fsync
/// per directory commits the journal once per directory.
pub(crate) const SYNCFS_DIRS: usize = 32;

/// Whether `n` changed directories are synced by filesystem (see
/// [`SYNCFS_DIRS`]). A few are fsynced one by one: a `syncfs` also
/// writes everything else waiting on that filesystem.
pub(crate) fn sync_whole_fs(n: usize) -> bool {
    n >= SYNCFS_DIRS
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pathset::PathSet;

    #[test]
    fn deletion_goes_in_rsyncs_order() {
        let mut v = vec![
            ("e1", false),
            ("old", true),
            ("e3", false),
            ("a", true),
            ("z", false),
        ];
        v.sort_by(|a, b| rsync_delete_order((OsStr::new(a.0), a.1), (OsStr::new(b.0), b.1)));
        assert_eq!(
            v,
            [
                ("old", true),
                ("a", true),
                ("z", false),
                ("e3", false),
                ("e1", false)
            ]
        );
    }

    #[test]
    fn root_directory_is_used_and_a_missing_one_created() {
        assert_eq!(root_at(Some(Kind::Dir), false), RootAt::Use);
        assert_eq!(root_at(None, false), RootAt::Create);
        assert_eq!(root_at(None, true), RootAt::Create);
    }

    #[test]
    fn root_file_or_symlink_needs_force_and_says_so() {
        assert_eq!(root_at(Some(Kind::File), true), RootAt::Replace);
        assert_eq!(root_at(Some(Kind::Symlink), true), RootAt::Replace);
        let RootAt::Refuse(why) = root_at(Some(Kind::Symlink), false) else {
            panic!("a symlink root must not be followed or replaced without --force");
        };
        assert!(why.contains("--force"));
    }

    #[test]
    fn root_device_fifo_or_socket_is_never_replaced() {
        for k in [Kind::BlockDevice, Kind::CharDevice, Kind::Fifo, Kind::Other] {
            let r = root_at(Some(k), true);
            assert_eq!(
                r,
                RootAt::Refuse("destination exists and is not a directory"),
                "{k:?}"
            );
        }
    }

    #[test]
    fn late_root_of_a_directory_source_is_the_path() {
        let r = late_root(Path::new("out/tree"), EntryKind::Dir).unwrap();
        assert_eq!(r.root, PathBuf::from("out/tree"));
        assert_eq!(r.name, None);
        // Even "/" can take a tree.
        assert!(late_root(Path::new("/"), EntryKind::Dir).is_ok());
    }

    #[test]
    fn late_root_of_a_file_source_is_its_directory_and_name() {
        let r = late_root(Path::new("out/copy.txt"), EntryKind::File).unwrap();
        assert_eq!(r.root, PathBuf::from("out"));
        assert_eq!(r.name.as_deref(), Some(&b"copy.txt"[..]));
        let bare = late_root(Path::new("copy.txt"), EntryKind::Symlink).unwrap();
        assert_eq!(bare.root, PathBuf::from("."));
        let abs = late_root(Path::new("/copy"), EntryKind::File).unwrap();
        assert_eq!(abs.root, PathBuf::from("/"));
        // `new/.` names a directory: the file goes in it, as its own name.
        let dot = late_root(Path::new("out/new/."), EntryKind::File).unwrap();
        assert_eq!((dot.root, dot.name), (PathBuf::from("out/new/."), None));
    }

    #[test]
    fn late_root_refuses_a_path_that_names_no_file() {
        for p in ["/", "a/..", ".."] {
            let r = late_root(Path::new(p), EntryKind::File);
            assert!(
                matches!(&r, Err(Error::Usage(m)) if m.contains("not a file name")),
                "{p}"
            );
        }
    }

    #[test]
    fn delete_runs_unless_the_sender_failed_to_read_something() {
        assert_eq!(deletion(false, false, false), Deletion::Off);
        assert_eq!(deletion(false, true, true), Deletion::Off);
        assert_eq!(deletion(true, false, false), Deletion::Run);
        assert_eq!(deletion(true, true, false), Deletion::Skipped);
        assert_eq!(deletion(true, true, true), Deletion::Run);
    }

    fn listing(names: &[(&str, bool)]) -> Vec<(OsString, bool)> {
        names.iter().map(|&(n, d)| (n.into(), d)).collect()
    }

    fn rels(x: &[Extra]) -> Vec<&[u8]> {
        x.iter().map(|e| &e.rel[..]).collect()
    }

    #[test]
    fn extras_are_what_the_list_lacks_in_listing_order() {
        let seen: PathSet = [&b"d/keep"[..], b"d/sub"].into_iter().collect();
        let none = Excludes::new(&[]).unwrap();
        let got = extras(
            b"d",
            listing(&[("zz", false), ("keep", false), ("sub", true), ("old", true)]),
            &seen,
            Some(&none),
            false,
        )
        .0;
        assert_eq!(rels(&got), [&b"d/zz"[..], b"d/old"]);
        assert_eq!(got[1].name, OsString::from("old"));
        assert!(got[1].is_dir && !got[0].is_dir);
    }

    #[test]
    fn extras_match_whole_paths_not_names() {
        // "x" is listed under "a" only: the "x" under "b" goes.
        let seen: PathSet = [&b"a/x"[..]].into_iter().collect();
        let none = Excludes::new(&[]).unwrap();
        assert_eq!(
            rels(&extras(b"b", listing(&[("x", false)]), &seen, Some(&none), false).0),
            [b"b/x"]
        );
        assert!(
            extras(b"a", listing(&[("x", false)]), &seen, Some(&none), false)
                .0
                .is_empty()
        );
    }

    #[test]
    fn excluded_entries_are_protected_by_kind_and_path() {
        let ex = Excludes::new(&["*.tmp".into(), "cache/".into()]).unwrap();
        let got = extras(
            b"",
            listing(&[
                ("a.tmp", false),
                ("cache", true),
                ("cache", false),
                ("b", false),
            ]),
            &PathSet::default(),
            Some(&ex),
            false,
        )
        .0;
        // "cache/" protects a directory only; a file of that name goes.
        assert_eq!(rels(&got), [&b"cache"[..], b"b"]);
        assert!(!got[0].is_dir);
        // --delete-excluded: nothing is protected.
        let all = extras(
            b"",
            listing(&[("a.tmp", false), ("b", false)]),
            &PathSet::default(),
            None,
            false,
        )
        .0;
        assert_eq!(rels(&all), [&b"a.tmp"[..], b"b"]);
    }

    #[test]
    fn many_changed_directories_sync_their_filesystem_once() {
        assert!(!sync_whole_fs(0));
        assert!(!sync_whole_fs(SYNCFS_DIRS - 1));
        assert!(sync_whole_fs(SYNCFS_DIRS));
        assert!(sync_whole_fs(10_000));
    }

    fn step(open: &mut Vec<Vec<u8>>, p: &str, dir: bool) -> Vec<String> {
        subtree_step(open, p.as_bytes(), dir)
            .unwrap()
            .into_iter()
            .map(|d| String::from_utf8(d).unwrap())
            .collect()
    }

    #[test]
    fn a_directory_ends_when_the_walk_leaves_its_subtree() {
        let mut open = Vec::new();
        assert!(
            step(&mut open, "", true).is_empty(),
            "the root is never open"
        );
        assert!(step(&mut open, "a", true).is_empty());
        assert!(step(&mut open, "a/f", false).is_empty());
        assert!(step(&mut open, "a/b", true).is_empty());
        assert!(step(&mut open, "a/b/c", true).is_empty());
        assert!(step(&mut open, "a/b/c/f", false).is_empty());
        // Back in a: b and c ended, innermost first.
        assert_eq!(step(&mut open, "a/g", false), ["a/b/c", "a/b"]);
        assert_eq!(step(&mut open, "d", true), ["a"]);
        assert_eq!(open, vec![b"d".to_vec()]);
        // A file at the top ends d; nothing is left open.
        assert_eq!(step(&mut open, "z", false), ["d"]);
        assert!(open.is_empty());
    }

    #[test]
    fn an_entry_in_an_ended_directory_breaks_the_promise() {
        let mut open = Vec::new();
        step(&mut open, "a", true);
        step(&mut open, "a/x", true);
        step(&mut open, "b", true);
        let before = open.clone();
        let err = subtree_step(&mut open, b"a/y", false).unwrap_err();
        assert!(err.contains("a/y") && err.contains("one walk"), "{err}");
        assert_eq!(open, before, "nothing ended by a refused entry");
        assert!(subtree_step(&mut open, b"a/x/deep", false).is_err());
        // A directory still open, listed again.
        step(&mut open, "c", true);
        let err = subtree_step(&mut open, b"c", true).unwrap_err();
        assert!(err.contains("listed again"), "{err}");
        assert_eq!(open, vec![b"c".to_vec()]);
    }

    #[test]
    fn work_in_progress_is_never_an_extra() {
        let seen: crate::pathset::PathSet = [&b"d/big"[..], b"d"].into_iter().collect();
        let me = std::process::id();
        let mine = crate::fsutil::temp_name_for(OsStr::new("new"));
        assert!(in_use(b"d", mine.as_bytes(), &seen, me));
        // Another process's temporary file is not this run's.
        assert!(!in_use(b"d", mine.as_bytes(), &seen, me.wrapping_add(1)));
        // The partial state of a listed file stays for a resume; of a
        // name the list lacks, it is stale.
        assert!(in_use(b"d", b".big.ferry-partial", &seen, me));
        assert!(in_use(b"d", b".big.ferry-journal", &seen, me));
        assert!(!in_use(b"d", b".gone.ferry-partial", &seen, me));
        assert!(
            !in_use(b"", b".big.ferry-partial", &seen, me),
            "another directory's name"
        );
        assert!(!in_use(b"d", b"plain", &seen, me));
        let listing = vec![
            (mine.clone(), false),
            (OsString::from(".big.ferry-partial"), false),
            (OsString::from(".gone.ferry-journal"), false),
            (OsString::from("extra"), false),
        ];
        let (during, held) = extras(b"d", listing.clone(), &seen, None, true);
        let got: Vec<_> = during.into_iter().map(|x| x.rel).collect();
        assert_eq!(
            got,
            vec![b"d/.gone.ferry-journal".to_vec(), b"d/extra".to_vec()]
        );
        assert!(held);
        // At the end, no transfer is left: all four go.
        let (after, held) = extras(b"d", listing, &seen, None, false);
        assert_eq!(after.len(), 4);
        assert!(!held);
    }
}
