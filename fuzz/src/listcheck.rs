//! `listcheck`: the receiver's rules for a sender's file list
//! ([`ferry_core::listcheck::ListCheck`]), on arbitrary entry lists.
//!
//! Input: `flags`, then 4 bytes per entry: kind and id step, path,
//! `link_to` (a hard link's target path is taken from the same table by
//! it), size class (see [`entry`]); paths come from a small table of
//! names and hostile forms (`..`, `.`, `a//b`, `/a`, NUL, …), or raw bytes.
//! `flags & 1`: a single-file destination; `& 2`: a pull that asked for
//! `a` and `c` only; `& 4`: the shape turns single-file after the first
//! entry (a file-or-directory destination).
//!
//! Every verdict of `admit`/`top_ok` is compared with a model written from
//! the module's documented rules, and the accepted list is checked for
//! what those rules are for: every accepted entry has a safe relative
//! path whose ancestors are all accepted directories, ids increase, a
//! path comes once unless it is a directory again, a hard link names an
//! earlier accepted regular file, the root is a directory, a single-file
//! destination holds one entry that is neither a directory nor a hard link.

use std::collections::HashMap;

use ferry_core::listcheck::{ListCheck, Shape, MAX_FILE_SIZE};
use ferry_link::{Entry, EntryKind};

use crate::util::Bytes;

const PATHS: &[&[u8]] = &[
    b"", b"a", b"b", b"c", b"a/b", b"a/c", b"a/b/c", b"b/a", b"c/d", b"..", b".", b"a/..", b"../a",
    b"a/./b", b"a//b", b"/a", b"a/", b"a\0b", b"a/b/..", b"...", b"a/.b", b"d",
];

/// One entry from 4 input bytes (more for a raw path).
fn entry(b: &mut Bytes<'_>, id: &mut u32) -> Entry {
    let k = b.u8();
    let kind = match k & 3 {
        0 => EntryKind::File,
        1 => EntryKind::Dir,
        2 => EntryKind::Symlink,
        _ => EntryKind::HardLink,
    };
    *id = match (k >> 2) & 3 {
        0 => id.wrapping_add(1),
        1 => *id,
        2 => id.wrapping_sub(1),
        _ => id.wrapping_add(u32::from(k >> 4)),
    };
    let p = b.u8();
    let path = if p == 0xff {
        let n = b.u8() as usize;
        b.take(n).to_vec()
    } else {
        PATHS[p as usize % PATHS.len()].to_vec()
    };
    let link_to = u32::from(b.u8());
    let size = match b.u8() {
        0 => 0,
        1 => MAX_FILE_SIZE,
        2 => MAX_FILE_SIZE + 1,
        3 => u64::MAX,
        s => u64::from(s),
    };
    let target = if kind == EntryKind::HardLink {
        PATHS[link_to as usize % PATHS.len()].to_vec()
    } else {
        Vec::new()
    };
    Entry {
        id: *id,
        path,
        kind: Some(kind),
        link_to,
        target,
        size,
        ..Default::default()
    }
}

/// The documented rules, as a model.
struct Model {
    single: bool,
    last_id: Option<u32>,
    kinds: HashMap<Vec<u8>, EntryKind>,
    /// Each regular file's id, by path: a hard link names both.
    files: HashMap<Vec<u8>, u32>,
    entries: u64,
    top: Option<Vec<Vec<u8>>>,
}

fn safe(p: &[u8]) -> bool {
    p.is_empty()
        || (!p.contains(&0)
            && p.split(|&c| c == b'/')
                .all(|c| !c.is_empty() && c != b"." && c != b".."))
}

fn parent(p: &[u8]) -> &[u8] {
    p.iter()
        .rposition(|&c| c == b'/')
        .map_or(&[][..], |i| &p[..i])
}

/// What a single-file destination takes: a file, a symlink or a node.
fn single_kind(kind: EntryKind) -> bool {
    !matches!(kind, EntryKind::Dir | EntryKind::HardLink)
}

impl Model {
    fn admit(&mut self, e: &Entry) -> bool {
        let kind = e.kind();
        let p = &e.path;
        let ok = safe(p)
            && self.last_id.is_none_or(|l| e.id > l)
            && (!self.single || (self.entries == 0 && single_kind(kind)))
            && (!p.is_empty() || kind == EntryKind::Dir)
            && e.size <= MAX_FILE_SIZE
            && match self.kinds.get(p) {
                None => true,
                Some(k) => *k == EntryKind::Dir && kind == EntryKind::Dir,
            }
            && (p.is_empty()
                || parent(p).is_empty()
                || self.kinds.get(parent(p)) == Some(&EntryKind::Dir))
            && (kind != EntryKind::HardLink
                || (self.files.get(&e.target) == Some(&e.link_to)
                    && !e.target.is_empty()
                    && safe(&e.target)
                    && self.kinds.get(&e.target) == Some(&EntryKind::File)));
        if ok {
            self.last_id = Some(e.id);
            self.entries += 1;
            self.kinds.insert(p.clone(), kind);
            if kind == EntryKind::File {
                self.files.insert(p.clone(), e.id);
            }
        }
        ok
    }

    fn top_ok(&self, p: &[u8]) -> bool {
        match &self.top {
            None => true,
            Some(t) => {
                let first = p.split(|&c| c == b'/').next().unwrap_or_default();
                !p.is_empty() && t.iter().any(|n| n == first)
            }
        }
    }
}

pub fn run(data: &[u8]) {
    let mut b = Bytes(data);
    let flags = b.u8();
    let single = flags & 1 != 0;
    let top = (flags & 2 != 0).then(|| vec![b"a".to_vec(), b"c".to_vec()]);
    let turn_single = flags & 4 != 0;

    let mut check = ListCheck::new(if single {
        Shape::SingleFile
    } else {
        Shape::Tree
    });
    check.expect_top(top.clone());
    let mut model = Model {
        single,
        last_id: None,
        kinds: HashMap::new(),
        files: HashMap::new(),
        entries: 0,
        top,
    };
    let mut accepted: Vec<Entry> = Vec::new();
    let mut id = 0u32;
    for n in 0..256 {
        if b.0.is_empty() {
            break;
        }
        let e = entry(&mut b, &mut id);
        let top_real = check.top_ok(&e.path).is_ok();
        assert_eq!(top_real, model.top_ok(&e.path), "top_ok({:?})", e.path);
        let real = check.admit(&e);
        let want = model.admit(&e);
        assert_eq!(
            real.is_ok(),
            want,
            "admit({e:?}) after {} accepted: {real:?}",
            accepted.len()
        );
        if real.is_ok() {
            accepted.push(e);
        }
        if n == 0 && turn_single {
            check.set_shape(Shape::SingleFile);
            model.single = true;
        }
    }
    invariants(&accepted, single);
}

/// What the accepted list guarantees, checked on the list as a whole.
fn invariants(list: &[Entry], single: bool) {
    let mut kinds: HashMap<&[u8], EntryKind> = HashMap::new();
    let mut files: HashMap<&[u8], u32> = HashMap::new();
    let mut last = None;
    for e in list {
        let p = &e.path[..];
        assert!(safe(p), "accepted unsafe path {p:?}");
        assert!(last.is_none_or(|l| e.id > l), "ids do not increase");
        last = Some(e.id);
        if p.is_empty() {
            assert_eq!(e.kind(), EntryKind::Dir, "the root is not a directory");
        }
        let mut a = parent(p);
        while !a.is_empty() {
            assert_eq!(
                kinds.get(a),
                Some(&EntryKind::Dir),
                "{p:?} accepted below {a:?}, not an accepted directory"
            );
            a = parent(a);
        }
        if let Some(k) = kinds.get(p) {
            assert!(
                *k == EntryKind::Dir && e.kind() == EntryKind::Dir,
                "{p:?} accepted twice"
            );
        }
        if e.kind() == EntryKind::HardLink {
            assert_eq!(
                files.get(e.target.as_slice()),
                Some(&e.link_to),
                "hard link to {} named {:?}",
                e.link_to,
                e.target
            );
            assert_eq!(
                kinds.get(e.target.as_slice()),
                Some(&EntryKind::File),
                "hard link to path {:?}",
                e.target
            );
        }
        assert!(e.size <= MAX_FILE_SIZE);
        kinds.insert(p, e.kind());
        if e.kind() == EntryKind::File {
            files.insert(p, e.id);
        }
    }
    if single {
        assert!(
            list.len() <= 1 && list.iter().all(|e| single_kind(e.kind())),
            "a single-file destination accepted {list:?}"
        );
    }
}
