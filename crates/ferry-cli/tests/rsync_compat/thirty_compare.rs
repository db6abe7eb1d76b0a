//! What the thirty lines compare: a snapshot of everything rsync keeps
//! of each path of a tree, and the differences of two snapshots.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use super::*;

/// Everything rsync keeps of one path.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Node {
    kind: &'static str,
    /// Permission bits with set-id and sticky (not for symlinks).
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: (i64, i64),
    size: u64,
    content: u64,
    target: Option<PathBuf>,
    /// Regular files: the link count, and the paths of this tree that
    /// share the inode (empty if none other).
    nlink: u64,
    group: Vec<String>,
    /// Every extended attribute, POSIX ACLs (`system.posix_acl_*`) too.
    xattrs: BTreeMap<String, Vec<u8>>,
}

pub(super) fn content_hash(path: &Path) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    fs::read(path).unwrap().hash(&mut h);
    h.finish()
}

pub(super) fn xattrs_of(path: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut list = vec![0u8; 1 << 16];
    let n = rustix::fs::llistxattr(path, &mut list[..]).unwrap_or(0);
    let mut out = BTreeMap::new();
    for name in list[..n].split(|&b| b == 0).filter(|s| !s.is_empty()) {
        let name = String::from_utf8_lossy(name).into_owned();
        let mut v = vec![0u8; 1 << 16];
        if let Ok(len) = rustix::fs::lgetxattr(path, name.as_str(), &mut v[..]) {
            v.truncate(len);
            out.insert(name, v);
        }
    }
    out
}

/// Every path under `root` (`.` for itself) and what rsync keeps of it.
pub(super) fn snapshot(root: &Path) -> BTreeMap<String, Node> {
    fn walk(root: &Path, rel: &str, out: &mut Vec<(String, fs::Metadata)>) {
        let path = if rel == "." {
            root.to_path_buf()
        } else {
            root.join(rel)
        };
        let m = fs::symlink_metadata(&path).unwrap();
        let is_dir = m.is_dir();
        out.push((rel.to_string(), m));
        if is_dir {
            let mut names: Vec<_> = fs::read_dir(&path)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            for n in names {
                let r = if rel == "." { n } else { format!("{rel}/{n}") };
                walk(root, &r, out);
            }
        }
    }
    let mut all = Vec::new();
    walk(root, ".", &mut all);
    let mut inodes: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for (rel, m) in &all {
        if m.is_file() {
            inodes.entry(m.ino()).or_default().push(rel.clone());
        }
    }
    all.into_iter()
        .map(|(rel, m)| {
            let path = root.join(&rel);
            let ft = m.file_type();
            let kind = if ft.is_dir() {
                "directory"
            } else if ft.is_symlink() {
                "symlink"
            } else if ft.is_file() {
                "file"
            } else {
                "special"
            };
            let group = match inodes.get(&m.ino()) {
                Some(g) if ft.is_file() && g.len() > 1 => g.clone(),
                _ => Vec::new(),
            };
            let node = Node {
                kind,
                mode: if ft.is_symlink() {
                    0
                } else {
                    m.mode() & 0o7777
                },
                uid: m.uid(),
                gid: m.gid(),
                mtime: (m.mtime(), m.mtime_nsec()),
                size: if ft.is_file() { m.len() } else { 0 },
                content: if ft.is_file() { content_hash(&path) } else { 0 },
                target: ft.is_symlink().then(|| fs::read_link(&path).unwrap()),
                nlink: if ft.is_file() { m.nlink() } else { 0 },
                group,
                xattrs: xattrs_of(&path),
            };
            (rel, node)
        })
        .collect()
}

/// What getfacl says of `path` (for messages).
pub(super) fn getfacl(path: &Path) -> String {
    let o = Command::new("getfacl")
        .args(["-n", "-p", "-c"])
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(",")
}

/// Whether rsync leaves directory times alone for `args`: `--backup`
/// without `--backup-dir` implies `--omit-dir-times` (options.c: the
/// backups land in those directories), so rsync's directories keep the
/// times the run gave them while ferry's get the source's.
pub(super) fn omits_dir_times(args: &[&str]) -> bool {
    let backup = args.iter().any(|a| {
        *a == "--backup" || (a.starts_with('-') && !a.starts_with("--") && a.contains('b'))
    });
    backup && !args.iter().any(|a| a.starts_with("--backup-dir"))
}

/// The hard-link groups of a tree (each the sorted paths of one inode).
pub(super) fn link_groups(t: &BTreeMap<String, Node>) -> std::collections::BTreeSet<Vec<String>> {
    t.values()
        .filter(|n| !n.group.is_empty())
        .map(|n| n.group.clone())
        .collect()
}

/// The differences of ferry's tree `b` from rsync's `a`, in path order.
/// A directory's mtime is not compared when both are from this run
/// (`started` or later): neither tool took it from the source (the
/// destination's root when the sources are named without a trailing
/// slash or come from --files-from, directories only the destination
/// has, whose entries a run deleted), so the clock decides; nor at all
/// when rsync omits directory times (`dir_times` false, see
/// [`omits_dir_times`]).
pub(super) fn compare(
    a: &BTreeMap<String, Node>,
    b: &BTreeMap<String, Node>,
    ra: &Path,
    rb: &Path,
    started: i64,
    dir_times: bool,
) -> Vec<String> {
    let mut diffs: Vec<(String, String)> = Vec::new();
    for rel in a.keys().filter(|k| !b.contains_key(*k)) {
        diffs.push((
            rel.clone(),
            format!("{rel}: rsync has it ({}), ferry not", a[rel].kind),
        ));
    }
    for rel in b.keys().filter(|k| !a.contains_key(*k)) {
        diffs.push((
            rel.clone(),
            format!("{rel}: ferry has it ({}), rsync not", b[rel].kind),
        ));
    }
    // Hard links once per group that differs, not once per name.
    let (ga, gb) = (link_groups(a), link_groups(b));
    let groups_of = |t: &BTreeMap<String, Node>, g: &[String]| {
        let mut v: Vec<Vec<String>> = g
            .iter()
            .filter_map(|p| t.get(p))
            .map(|n| n.group.clone())
            .filter(|g| !g.is_empty())
            .collect();
        v.dedup();
        if v.is_empty() {
            "separate files".to_string()
        } else {
            format!("{v:?}")
        }
    };
    let mut told = std::collections::BTreeSet::new();
    for g in ga.symmetric_difference(&gb) {
        if g.iter().any(|p| told.contains(p)) {
            continue;
        }
        told.extend(g.iter().cloned());
        diffs.push((
            g[0].clone(),
            format!(
                "{}: hard links: rsync {}, ferry {}",
                g.join(" + "),
                groups_of(a, g),
                groups_of(b, g)
            ),
        ));
    }
    for (rel, x) in a {
        let Some(y) = b.get(rel) else { continue };
        let mut d = |what: &str, l: String, r: String| {
            diffs.push((rel.clone(), format!("{rel}: {what}: rsync {l}, ferry {r}")));
        };
        if x.kind != y.kind {
            d("type", x.kind.into(), y.kind.into());
            continue;
        }
        if x.mode != y.mode {
            d("mode", format!("{:04o}", x.mode), format!("{:04o}", y.mode));
        }
        if (x.uid, x.gid) != (y.uid, y.gid) {
            d(
                "owner",
                format!("{}:{}", x.uid, x.gid),
                format!("{}:{}", y.uid, y.gid),
            );
        }
        let both_now = x.mtime.0 >= started && y.mtime.0 >= started;
        let is_dir = x.kind == "directory";
        if x.mtime != y.mtime && !(is_dir && (both_now || !dir_times)) {
            d(
                "mtime",
                format!("{}.{:09}", x.mtime.0, x.mtime.1),
                format!("{}.{:09}", y.mtime.0, y.mtime.1),
            );
        }
        if (x.size, x.content) != (y.size, y.content) {
            d(
                "contents",
                format!("{} bytes", x.size),
                format!("{} bytes, other bytes", y.size),
            );
        }
        if x.target != y.target {
            d(
                "symlink target",
                format!("{:?}", x.target),
                format!("{:?}", y.target),
            );
        }
        if x.group == y.group && x.nlink != y.nlink {
            d("link count", x.nlink.to_string(), y.nlink.to_string());
        }
        if x.xattrs != y.xattrs {
            let acl = |m: &BTreeMap<String, Vec<u8>>| {
                m.iter()
                    .filter(|(k, _)| k.starts_with("system.posix_acl"))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect::<BTreeMap<_, _>>()
            };
            if acl(&x.xattrs) != acl(&y.xattrs) {
                d("ACL", getfacl(&ra.join(rel)), getfacl(&rb.join(rel)));
            }
            let rest = |m: &BTreeMap<String, Vec<u8>>| {
                m.iter()
                    .filter(|(k, _)| !k.starts_with("system.posix_acl"))
                    .map(|(k, v)| format!("{k}={}", String::from_utf8_lossy(v)))
                    .collect::<Vec<_>>()
            };
            if rest(&x.xattrs) != rest(&y.xattrs) {
                d(
                    "xattrs",
                    format!("{:?}", rest(&x.xattrs)),
                    format!("{:?}", rest(&y.xattrs)),
                );
            }
        }
    }
    diffs.sort_by(|x, y| x.0.cmp(&y.0));
    diffs.into_iter().map(|(_, m)| m).collect()
}

/// The files of `dst` that are the same inode as in `prev`.
pub(super) fn shared_with(dst: &Path, prev: &Path) -> Vec<String> {
    let ino = |p: &Path| fs::symlink_metadata(p).map(|m| m.ino()).ok();
    snapshot(dst)
        .into_iter()
        .filter(|(rel, n)| n.kind == "file" && ino(&prev.join(rel)) == ino(&dst.join(rel)))
        .map(|(rel, _)| rel)
        .collect()
}
