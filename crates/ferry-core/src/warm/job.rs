//! The warmers' work: list a directory, or `lstat` a slice of its names;
//! and the walk's order, which the work is taken in.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};

use crate::listcheck::child_path;

/// Names one warmer `lstat`s before it looks at the queue again: a large
/// directory is shared among the warmers.
pub(super) const SLICE: usize = 128;
/// Names of one directory listed at most (the first met; the walk finds
/// the rest cold).
pub(super) const MAX_NAMES: usize = 32_768;

/// List directory `rel`, or `lstat` the `names` in it. Queued by its key
/// (see [`dir_key`]); `end` is the key of the last thing it covers, which
/// once the walk has passed it leaves the job nothing worth doing.
pub(super) struct Job {
    pub rel: Vec<u8>,
    pub names: Option<Vec<OsString>>,
    pub end: Vec<u8>,
}

/// Which directories to leave alone (those the walk will skip).
pub type Skip = Box<dyn Fn(&[u8]) -> bool + Send + Sync>;

impl Job {
    /// Bytes it holds, for the queue's bound.
    pub fn size(&self, key: &[u8]) -> usize {
        let names = self.names.as_ref().map_or(0, |n| {
            n.iter()
                .map(|s| s.len() + std::mem::size_of::<OsString>())
                .sum()
        });
        64 + key.len() + self.end.len() + self.rel.len() + names
    }
}

/// The walk's order as bytes: each component followed by a NUL (which no
/// name holds), so a directory's entries sort with its subdirectories'
/// contents in between, as a depth-first walk in name order meets them.
pub(super) fn dir_key(rel: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(rel.len() + 1);
    for c in rel.split(|&b| b == b'/').filter(|c| !c.is_empty()) {
        k.extend_from_slice(c);
        k.push(0);
    }
    k
}

/// The key of entry `rel` itself (a slice starting at it sorts here).
pub(super) fn entry_key(rel: &[u8]) -> Vec<u8> {
    let (dir, name) = match rel.iter().rposition(|&b| b == b'/') {
        Some(i) => (&rel[..i], &rel[i + 1..]),
        None => (&rel[..0], rel),
    };
    let mut k = dir_key(dir);
    k.extend_from_slice(name);
    k
}

/// Whether a walk at `pos` has passed `key`: it comes before, and is not
/// a directory (or the start of a slice) the walk is still in.
pub(super) fn passed(pos: &[u8], key: &[u8]) -> bool {
    key < pos && !pos.starts_with(key)
}

/// Open directory `rel` beneath `root`: no symlink, no `..`, and no other
/// mount (not even a bind mount of the same filesystem) on the way. No
/// fallback without `openat2`: warming is only worth it where it is cheap.
fn open_dir(root: &OwnedFd, rel: &[u8]) -> Option<OwnedFd> {
    let how = ResolveFlags::BENEATH
        | ResolveFlags::NO_SYMLINKS
        | ResolveFlags::NO_MAGICLINKS
        | ResolveFlags::NO_XDEV;
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    rustix::fs::openat2(
        root,
        std::ffi::OsStr::from_bytes(rel),
        flags,
        Mode::empty(),
        how,
    )
    .ok()
}

/// The names in `dir` (not `.` and `..`), in name order: at most
/// [`MAX_NAMES`], none once `stop` is set.
fn list(dir: &OwnedFd, stop: &AtomicBool) -> Vec<OsString> {
    let mut out = Vec::new();
    let Ok(mut d) = rustix::fs::Dir::read_from(dir) else {
        return out;
    };
    while let Some(Ok(ent)) = d.read() {
        if out.len() >= MAX_NAMES
            || (out.len().is_multiple_of(1024) && stop.load(Ordering::Relaxed))
        {
            break;
        }
        let name = ent.file_name().to_bytes();
        if name != b"." && name != b".." {
            out.push(std::ffi::OsStr::from_bytes(name).to_os_string());
        }
    }
    out.sort();
    out
}

/// A listing job for directory `rel`, with its key.
pub(super) fn listing(rel: Vec<u8>) -> (Vec<u8>, Job) {
    let key = dir_key(&rel);
    let end = key.clone();
    (
        key,
        Job {
            rel,
            names: None,
            end,
        },
    )
}

/// Do `job` in the tree at `root` (on filesystem `dev`): the jobs it
/// leads to (with their keys; no listing of a directory `skip` names),
/// and how many entries it warmed.
pub(super) fn run(
    root: &OwnedFd,
    dev: u64,
    job: Job,
    skip: Option<&Skip>,
    stop: &AtomicBool,
) -> (Vec<(Vec<u8>, Job)>, u64) {
    let opened;
    let dir = if job.rel.is_empty() {
        root
    } else {
        match open_dir(root, &job.rel) {
            Some(fd) => {
                opened = fd;
                &opened
            }
            None => return (Vec::new(), 0),
        }
    };
    let Some(names) = job.names else {
        // Listed, then warmed in slices.
        let base = dir_key(&job.rel);
        let mut slices = Vec::new();
        let mut names = list(dir, stop).into_iter();
        loop {
            let slice: Vec<OsString> = names.by_ref().take(SLICE).collect();
            let (Some(first), Some(last)) = (slice.first(), slice.last()) else {
                break;
            };
            let key = [base.as_slice(), first.as_bytes()].concat();
            let end = [base.as_slice(), last.as_bytes()].concat();
            let rel = job.rel.clone();
            let names = Some(slice);
            slices.push((key, Job { rel, names, end }));
        }
        return (slices, 0);
    };
    let mut more = Vec::new();
    let mut warmed = 0;
    for name in &names {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        warmed += 1;
        let Ok(st) = rustix::fs::statat(dir, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW) else {
            continue;
        };
        #[allow(clippy::unnecessary_cast)]
        let same_fs = st.st_dev as u64 == dev;
        if same_fs && FileType::from_raw_mode(st.st_mode) == FileType::Directory {
            let rel = child_path(&job.rel, name.as_bytes());
            if !skip.is_some_and(|f| f(&rel)) {
                more.push(listing(rel));
            }
        }
    }
    (more, warmed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_a_depth_first_walk_in_name_order() {
        // a, a/x, a/y (a slice of a), a-b: '/' would sort after '-', NUL
        // does not.
        let a = dir_key(b"a");
        let ax = dir_key(b"a/x");
        let slice = entry_key(b"a/y");
        let ab = dir_key(b"a-b");
        assert!(a < ax && ax < slice && slice < ab);
        assert_eq!(dir_key(b""), b"");
        assert_eq!(entry_key(b"f"), b"f");
        assert_eq!(entry_key(b"a/b/f"), b"a\0b\0f");
    }

    #[test]
    fn what_the_walk_has_passed_is_dropped() {
        let pos = dir_key(b"m/n");
        let slice = |d: &[u8], n: &[u8]| [dir_key(d), n.to_vec()].concat();
        assert!(passed(&pos, &dir_key(b"a")));
        assert!(passed(&pos, &slice(b"m", b"a")));
        assert!(passed(&pos, &dir_key(b"m/a")));
        // Where the walk is, and around it: still ahead.
        assert!(!passed(&pos, &dir_key(b"")));
        assert!(!passed(&pos, &dir_key(b"m")));
        assert!(!passed(&pos, &dir_key(b"m/n")));
        assert!(!passed(&pos, &slice(b"m/n", b"a")));
        assert!(!passed(&pos, &dir_key(b"m/n/a")));
        assert!(!passed(&pos, &slice(b"m", b"o")));
        assert!(!passed(&pos, &dir_key(b"z")));
        // Within a directory, by the entry the walk is at.
        let pos = entry_key(b"m/k");
        assert!(passed(&pos, &slice(b"m", b"a")));
        assert!(!passed(&pos, &slice(b"m", b"k")));
        assert!(!passed(&pos, &slice(b"m", b"q")));
    }

    fn clone(j: &Job) -> Job {
        Job {
            rel: j.rel.clone(),
            names: j.names.clone(),
            end: j.end.clone(),
        }
    }

    #[test]
    fn a_listing_is_sliced_and_a_slice_finds_the_subdirectories() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        for j in 0..SLICE + 5 {
            std::fs::write(d.path().join(format!("f{j:04}")), b"").unwrap();
        }
        std::os::unix::fs::symlink("/", d.path().join("up")).unwrap();
        let root = rustix::fs::open(d.path(), OFlags::DIRECTORY, Mode::empty()).unwrap();
        let dev = rustix::fs::fstat(&root).unwrap().st_dev as u64;
        let stop = AtomicBool::new(false);
        let (slices, n) = run(&root, dev, listing(vec![]).1, None, &stop);
        assert_eq!((slices.len(), n), (2, 0));
        assert_eq!(slices[0].0, b"f0000");
        assert_eq!(slices[0].1.end, format!("f{:04}", SLICE - 1).as_bytes());
        assert_eq!(slices[1].0, format!("f{:04}", SLICE).as_bytes());
        assert_eq!(slices[1].1.end, b"up");
        let last = slices.into_iter().nth(1).unwrap().1;
        assert_eq!(last.names.as_ref().unwrap().len(), 7); // ... sub, up
        let skip_sub: Skip = Box::new(|rel| rel == b"sub");
        let (more, n) = run(&root, dev, clone(&last), Some(&skip_sub), &stop);
        assert_eq!((more.len(), n), (0, 7));
        let (more, n) = run(&root, dev, last, None, &stop);
        assert_eq!(n, 7);
        // The directory, not the symlink to one.
        assert_eq!(more.len(), 1);
        assert_eq!(
            (more[0].0.as_slice(), more[0].1.rel.as_slice()),
            (&b"sub\0"[..], &b"sub"[..])
        );
        // A symlink is not a directory to open.
        assert!(open_dir(&root, b"up").is_none());
        assert!(open_dir(&root, b"sub").is_some());
    }
}
