//! Thirty everyday rsync command lines, each run by `rsync` and by `ferry
//! sync` on identical copies of one rich tree (odd names, every kind of
//! link, hard-link pairs and a triple, ACLs, user xattrs, special modes,
//! nanosecond times, owners as root, files the usual rules exclude), onto
//! the same prepared destination where the line needs one; the two
//! destination trees must then be alike in everything rsync keeps: type,
//! contents, mode, owner, mtime to the nanosecond (directories too),
//! symlink targets, hard-link grouping and link counts, ACLs and xattrs,
//! and the two exit codes (ferry's with `--rsync-exit-codes`) must agree.
//! Six lines push over a real sshd, rsync and ferry both.
//!
//! [`MORE`] holds further lines: `-i`, `--chown`, `--backup-dir`, `-x`,
//! the `--no-` forms.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;

use super::*;

/// What the destination holds before the line runs.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Pre {
    /// Nothing: the destination does not exist.
    Empty,
    /// An older copy of the tree (see [`age`]): changed, extra and missing
    /// files, other modes, owners, ACLs and xattrs, a broken hard link.
    Old,
    /// Nothing, and the older copy as `{prev}` for `--link-dest`.
    Prev,
}

/// How the sources are named.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Srcs {
    /// `src/`: the contents.
    Contents,
    /// `src`: the directory itself.
    Dir,
    /// `src/docs src/hl/ src/top.txt` into `dst/`.
    Several,
}

struct Line {
    args: &'static [&'static str],
    pre: Pre,
    srcs: Srcs,
    /// Pushed over ssh (rsync and ferry both), else local.
    ssh: bool,
}

const fn line(args: &'static [&'static str], pre: Pre) -> Line {
    Line {
        args,
        pre,
        srcs: Srcs::Contents,
        ssh: false,
    }
}

const fn ssh(args: &'static [&'static str], pre: Pre) -> Line {
    Line {
        args,
        pre,
        srcs: Srcs::Contents,
        ssh: true,
    }
}

const fn srcs(args: &'static [&'static str], srcs: Srcs) -> Line {
    Line {
        args,
        pre: Pre::Empty,
        srcs,
        ssh: false,
    }
}

use Pre::{Empty, Old, Prev};

// What differs today, and where the fix belongs (README.md, "What still
// differs from rsync"):
//
// - Hard links without -H (lines 1, 2, 6-11, 13-23, 25-30): rsync copies
//   each name as a separate file, ferry always links them. The grouping is
//   made in ferry-core sender/walk.rs (`visit_file`, `meta.nlink() > 1`);
//   it needs a `SyncOptions` switch (lib.rs), carried to a remote sender
//   with the serve arguments (remote/command.rs), that ferry-cli turns off
//   for an rsync line without -H: the switch main's `--no-H` needs too.
// - -rlt (line 26): without -p rsync gives new files the source's mode
//   less the umask and no set-ID or sticky bits, without -o/-g (as root)
//   the receiver's owner; ferry keeps both. The steps are chosen in
//   receiver/decide/compare.rs (`meta_for_new`, `meta_fixes`): the same
//   switches as main's `--no-perms`, `--no-owner`, `--no-group`.
// - -AX onto an older copy (line 5): an ACL or xattr the source lacks stays.
//   `meta_fixes` and `meta_for_new` apply xattrs only when the source has
//   some, and destdir.rs `write_xattrs` / fsutil.rs `fwrite_xattrs` only
//   set; they should also remove the destination's names in scope
//   (sender/walk.rs `xattr_wanted`, narrowed by decide/defang.rs for an
//   untrusted sender) that the entry does not carry.
// - --files-from (line 15): rsync leaves the destination root as it finds
//   or makes it; ferry's receiver gives it the source root's mode and
//   times (receiver/finish.rs directory loop, entries.rs `dir`). Needs an
//   option saying the root is not listed, carried in the serve arguments.
// - --max-delete (line 18): exit 23 with --rsync-exit-codes, rsync 25. The
//   stop is reported as a plain error (receiver/finish.rs); a counter in
//   stats.rs and in ferry-wire's Report (for pushes) would let
//   ferry-cli rsync_codes.rs say 25.

/// The thirty. In the words, `{dir}` is the directory holding the rule
/// and list files, `{prev}` the older copy for `--link-dest` and `{log}` a
/// log file (the last two each tool's own).
const LINES: &[Line] = &[
    line(&["-a"], Empty),
    line(&["-av", "--log-file={log}"], Old),
    line(&["-aH"], Empty),
    line(&["-aHAX"], Empty),
    ssh(&["-aHAX", "--delete"], Old),
    ssh(&["-az"], Empty),
    line(&["-aP"], Empty),
    line(&["-a", "--delete"], Old),
    ssh(&["-a", "--delete", "--exclude=*.o"], Old),
    line(
        &[
            "-a",
            "--delete-excluded",
            "--exclude=*.log",
            "--exclude=cache/",
        ],
        Old,
    ),
    line(&["-a", "--exclude-from={dir}/excludes"], Empty),
    line(
        &["-a", "--include=*/", "--include=*.txt", "--exclude=*"],
        Empty,
    ),
    line(&["-a", "--filter=- *.log"], Empty),
    line(&["-a", "--filter=merge {dir}/rules"], Empty),
    line(&["-a", "--files-from={dir}/list"], Empty),
    ssh(&["-a", "--numeric-ids"], Empty),
    line(&["-a", "--chmod=Dg+s,go-w,Fu+rw"], Empty),
    line(&["-a", "--delete", "--max-delete=2"], Old),
    line(&["-a", "--backup", "--suffix=.bak"], Old),
    ssh(&["-ab", "--delete"], Old),
    line(&["-a", "--link-dest={prev}"], Prev),
    line(&["-ac"], Old),
    line(&["-au"], Old),
    line(&["-a", "--ignore-existing"], Old),
    line(&["-a", "--inplace"], Old),
    line(&["-rlt"], Empty),
    srcs(&["-a"], Srcs::Dir),
    srcs(&["-a"], Srcs::Several),
    line(&["-a", "--stats"], Old),
    ssh(&["-a", "--timeout=30"], Empty),
];

/// Lines of the flags added after the thirty (`-i`, `--chown`,
/// `--backup-dir`, `-x`, the `--no-` forms), two pushed over ssh. Each has
/// `-H` so that only the new flag is tried.
const MORE: &[Line] = &[
    line(&["-aHi", "--delete"], Old),
    line(&["-aH", "--chown=65534:65534"], Empty),
    line(&["-aH", "--backup", "--backup-dir={prev}"], Old),
    line(&["-aHx"], Empty),
    line(&["-aH", "--no-perms", "--no-owner", "--no-group"], Empty),
    ssh(&["-aH", "--chown=65534:65534"], Old),
    ssh(
        &["-aHi", "--no-perms", "--delete", "--backup-dir=../bak"],
        Old,
    ),
];

/// Lines that pin fixes made while comparing (each also has a unit test
/// in ferry-core): `--ignore-existing` leaves a file where the source has a
/// symlink, and separate files where it has hard links; `-X` alone sends
/// no ACLs.
const PINS: &[Line] = &[
    line(&["-aH", "--ignore-existing"], Old),
    line(&["-aHX"], Empty),
    ssh(&["-aHX"], Empty),
];

#[test]
fn thirty_everyday_lines_match_rsync() {
    run_lines("thirty_everyday_lines_match_rsync", LINES);
}

#[test]
fn fixes_found_by_the_thirty_stay_fixed() {
    run_lines("fixes_found_by_the_thirty_stay_fixed", PINS);
}

#[test]
fn more_lines_match_rsync() {
    run_lines("more_lines_match_rsync", MORE);
}

fn run_lines(test: &str, lines: &[Line]) {
    for tool in ["rsync", "setfacl", "getfacl"] {
        if !need(tool, test) {
            return;
        }
    }
    let Some(srv) = SshServer::start(test) else {
        return;
    };
    let started = now_secs();
    let d = tempfile::tempdir().unwrap();
    let work = d.path();
    let src = work.join("src");
    build_source(&src);
    let old = work.join("old");
    copy_tree(&src, &old);
    age(&old);
    rule_files(work);
    let mut report = Vec::new();
    let mut failures = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let diffs = run_line(i + 1, l, work, &src, &old, &srv, started);
        let what = describe(l);
        if diffs.is_empty() {
            report.push(format!("{:2} ok    {what}", i + 1));
            continue;
        }
        // The first difference, then the rest (a few), one a line.
        let mut text = format!("{:2} FAIL  {what}\n      first: {}", i + 1, diffs[0]);
        for d in diffs.iter().skip(1).take(7) {
            text.push_str(&format!("\n      also:  {d}"));
        }
        if diffs.len() > 8 {
            text.push_str(&format!("\n      and {} more", diffs.len() - 8));
        }
        report.push(text.clone());
        failures.push(text);
    }
    eprintln!("{}", report.join("\n"));
    assert!(
        failures.is_empty(),
        "{} of {} lines differ from rsync:\n{}",
        failures.len(),
        lines.len(),
        failures.join("\n")
    );
}

fn describe(l: &Line) -> String {
    let s = match l.srcs {
        Srcs::Contents => "src/ dst",
        Srcs::Dir => "src dst",
        Srcs::Several => "src/docs src/hl/ src/top.txt dst/",
    };
    format!(
        "{} {s}{}{}",
        l.args.join(" "),
        match l.pre {
            Empty => "",
            Old => "  (onto an older copy)",
            Prev => "  (older copy as {prev})",
        },
        if l.ssh { "  [ssh]" } else { "" }
    )
}

fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Run line `n` with both tools; the differences, first one first.
fn run_line(
    n: usize,
    l: &Line,
    work: &Path,
    src: &Path,
    old: &Path,
    srv: &SshServer,
    started: i64,
) -> Vec<String> {
    let mut out = Vec::new();
    for who in ["rsync", "ferry"] {
        let base = work.join(format!("{n:02}-{who}"));
        fs::create_dir(&base).unwrap();
        let (dst, prev) = (base.join("dst"), base.join("prev"));
        match l.pre {
            Empty => {}
            Old => copy_tree(old, &dst),
            Prev => copy_tree(old, &prev),
        }
        let words: Vec<String> = l
            .args
            .iter()
            .map(|w| {
                w.replace("{dir}", p(work))
                    .replace("{prev}", p(&prev))
                    .replace("{log}", p(&base.join("log")))
            })
            .collect();
        let mut sources: Vec<String> = match l.srcs {
            Srcs::Contents => vec![slash(src)],
            Srcs::Dir => vec![p(src).into()],
            Srcs::Several => vec![
                p(&src.join("docs")).into(),
                slash(&src.join("hl")),
                p(&src.join("top.txt")).into(),
            ],
        };
        let target = match (l.ssh, l.srcs) {
            (true, _) => srv.remote(&dst),
            (false, Srcs::Several) => slash(&dst),
            (false, _) => p(&dst).into(),
        };
        let mut cmd = if who == "rsync" {
            let mut c = Command::new("rsync");
            if l.ssh {
                c.args(["-e", &srv.rsh()]);
            }
            c
        } else {
            let mut c = Command::new(ferry_bin());
            c.args(["sync", "--rsync-exit-codes"]);
            if l.ssh {
                c.args(["-e", &srv.rsh(), "--remote-ferry", p(&ferry_bin())]);
            }
            c
        };
        sources.push(target);
        let o = cmd.args(&words).args(&sources).output().unwrap();
        out.push((
            o.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&o.stderr).into_owned(),
            dst,
            prev,
        ));
    }
    let (r, f) = (&out[0], &out[1]);
    let mut diffs = Vec::new();
    if r.0 != f.0 {
        diffs.push(format!(
            "exit code: rsync {}, ferry {} (rsync said: {:?}; ferry said: {:?})",
            r.0,
            f.0,
            r.1.trim(),
            f.1.trim()
        ));
    }
    if !r.2.exists() || !f.2.exists() {
        diffs.push(format!(
            "destination exists: rsync {}, ferry {} (ferry said {:?})",
            r.2.exists(),
            f.2.exists(),
            f.1.trim()
        ));
        return diffs;
    }
    let (a, b) = (snapshot(&r.2), snapshot(&f.2));
    diffs.extend(compare(
        &a,
        &b,
        &r.2,
        &f.2,
        started,
        !omits_dir_times(l.args),
    ));
    if l.pre == Prev {
        let (sa, sb) = (shared_with(&r.2, &r.3), shared_with(&f.2, &f.3));
        let only = |x: &[String], y: &[String]| -> Vec<String> {
            x.iter().filter(|p| !y.contains(p)).cloned().collect()
        };
        if sa != sb {
            diffs.push(format!(
                "linked to {{prev}}: only by rsync {:?}, only by ferry {:?}",
                only(&sa, &sb),
                only(&sb, &sa)
            ));
        }
    }
    diffs
}

/// Everything rsync keeps of one path.
#[derive(Clone, Debug, PartialEq)]
struct Node {
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

fn content_hash(path: &Path) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    fs::read(path).unwrap().hash(&mut h);
    h.finish()
}

fn xattrs_of(path: &Path) -> BTreeMap<String, Vec<u8>> {
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
fn snapshot(root: &Path) -> BTreeMap<String, Node> {
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
fn getfacl(path: &Path) -> String {
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
fn omits_dir_times(args: &[&str]) -> bool {
    let backup = args.iter().any(|a| {
        *a == "--backup" || (a.starts_with('-') && !a.starts_with("--") && a.contains('b'))
    });
    backup && !args.iter().any(|a| a.starts_with("--backup-dir"))
}

/// The hard-link groups of a tree (each the sorted paths of one inode).
fn link_groups(t: &BTreeMap<String, Node>) -> std::collections::BTreeSet<Vec<String>> {
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
fn compare(
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
fn shared_with(dst: &Path, prev: &Path) -> Vec<String> {
    let ino = |p: &Path| fs::symlink_metadata(p).map(|m| m.ino()).ok();
    snapshot(dst)
        .into_iter()
        .filter(|(rel, n)| n.kind == "file" && ino(&prev.join(rel)) == ino(&dst.join(rel)))
        .map(|(rel, _)| rel)
        .collect()
}

/// `rsync -aHAX FROM/ TO`: an exact copy of a prepared tree.
fn copy_tree(from: &Path, to: &Path) {
    rsync(&["-aHAX"], &slash(from), to, true);
}

/// Set the mtime of `path` (not following a symlink), nanoseconds too.
fn set_time(path: &Path, secs: i64, nsec: i64) {
    use rustix::fs::{AtFlags, Timespec, Timestamps, CWD};
    let t = Timespec {
        tv_sec: secs,
        tv_nsec: nsec as _,
    };
    rustix::fs::utimensat(
        CWD,
        path,
        &Timestamps {
            last_access: t,
            last_modification: t,
        },
        AtFlags::SYMLINK_NOFOLLOW,
    )
    .unwrap_or_else(|e| panic!("set the time of {}: {e}", path.display()));
}

fn set_xattr(path: &Path, name: &str, value: &[u8]) {
    rustix::fs::lsetxattr(path, name, value, rustix::fs::XattrFlags::empty())
        .unwrap_or_else(|e| panic!("set {name} on {}: {e}", path.display()));
}

fn setfacl(path: &Path, args: &[&str]) {
    let st = Command::new("setfacl")
        .args(args)
        .arg(path)
        .status()
        .unwrap();
    assert!(st.success(), "setfacl {args:?} {}", path.display());
}

fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// The source tree. Every path gets its own mtime with nanoseconds,
/// directories last (deepest first), so that nothing later moves them.
fn build_source(src: &Path) {
    use std::os::unix::fs::{lchown, symlink};
    let root = is_root();
    for dir in [
        "docs",
        "bin",
        "modes",
        "shared",
        "sticky",
        "odd",
        "links",
        "hl",
        "other",
        "deep/x/y/z",
        "acl/dir",
        "xattr/dir",
        "build",
        "logs",
        "cache/sub",
        "emptydir",
    ] {
        fs::create_dir_all(src.join(dir)).unwrap();
    }
    let files: &[(&str, usize, u32)] = &[
        ("top.txt", 40, 0o644),
        ("empty", 0, 0o644),
        ("big.bin", 1536 * 1024 + 17, 0o644),
        ("docs/a.txt", 100, 0o644),
        ("docs/same-size.txt", 64, 0o644),
        ("docs/newer.txt", 64, 0o644),
        ("docs/older.txt", 64, 0o644),
        ("docs/notes.log", 30, 0o644),
        ("docs/medium.dat", 200 * 1024, 0o640),
        ("bin/tool", 5000, 0o755),
        ("bin/suid", 300, 0o4755),
        ("bin/ro", 20, 0o444),
        ("modes/private", 10, 0o600),
        ("modes/group", 10, 0o640),
        ("modes/exec-only", 10, 0o711),
        ("shared/file", 10, 0o664),
        ("sticky/file", 10, 0o666),
        ("odd/with space.txt", 11, 0o644),
        ("odd/-leading-dash", 12, 0o644),
        ("odd/ünïcødé ファイル.txt", 13, 0o644),
        ("odd/#hash", 14, 0o644),
        ("odd/star*name", 15, 0o644),
        ("odd/brackets[1].txt", 16, 0o644),
        ("hl/a", 500, 0o644),
        ("hl/c", 700, 0o600),
        ("tri1", 900, 0o644),
        ("deep/x/y/z/leaf.txt", 5, 0o644),
        ("acl/file", 33, 0o640),
        ("acl/plain", 34, 0o644),
        ("xattr/file", 35, 0o644),
        ("build/main.c", 50, 0o644),
        ("build/main.o", 2000, 0o644),
        ("build/util.o", 3000, 0o644),
        ("logs/app.log", 60, 0o644),
        ("logs/keep.txt", 61, 0o644),
        ("cache/blob", 4096, 0o644),
        ("cache/sub/blob.o", 100, 0o644),
        ("swap", 8, 0o644),
    ];
    for (i, &(f, size, _)) in files.iter().enumerate() {
        fs::write(src.join(f), bytes(i as u64 + 1, size)).unwrap();
    }
    // Hard links: a pair in one directory, a pair across two, a triple
    // across three (one of them in a directory with odd names).
    fs::hard_link(src.join("hl/a"), src.join("hl/b")).unwrap();
    fs::hard_link(src.join("hl/c"), src.join("other/c-link")).unwrap();
    fs::hard_link(src.join("tri1"), src.join("deep/x/tri2")).unwrap();
    fs::hard_link(src.join("tri1"), src.join("odd/tri3")).unwrap();
    // Symlinks: relative, absolute, dangling, to a directory, to a link.
    symlink("../top.txt", src.join("links/rel")).unwrap();
    symlink("/etc/passwd", src.join("links/abs")).unwrap();
    symlink("nowhere/at/all", src.join("links/dangling")).unwrap();
    symlink("../docs", src.join("links/todir")).unwrap();
    symlink("rel", src.join("links/to-link")).unwrap();
    for &(f, _, mode) in files {
        chmod(&src.join(f), mode);
    }
    chmod(&src.join("shared"), 0o2775);
    chmod(&src.join("sticky"), 0o1777);
    chmod(&src.join("modes"), 0o750);
    // ACLs: on a file, a directory with a default ACL (what is created in
    // it inherits), and a plain file next to them.
    setfacl(&src.join("acl/file"), &["-m", "u:65534:rw,g:65534:r"]);
    setfacl(
        &src.join("acl/dir"),
        &["-m", "u:65534:rwx", "-d", "-m", "u:65534:rx,g::r"],
    );
    fs::write(src.join("acl/dir/inside"), b"inherits the default ACL").unwrap();
    // User xattrs: text and binary values, on a file, a directory and one
    // file of a hard-linked pair.
    set_xattr(&src.join("xattr/file"), "user.note", b"hello");
    set_xattr(&src.join("xattr/file"), "user.bin", &[0, 1, 2, 255]);
    set_xattr(&src.join("xattr/dir"), "user.dirnote", b"a directory");
    set_xattr(&src.join("hl/a"), "user.linked", b"both names");
    if root {
        // Owners other than the one running (numeric: no such user needed).
        lchown(src.join("docs/a.txt"), Some(65534), Some(65534)).unwrap();
        lchown(src.join("bin/tool"), Some(1000), Some(1000)).unwrap();
        lchown(src.join("shared"), None, Some(65534)).unwrap();
        lchown(src.join("links/rel"), Some(65534), Some(65534)).unwrap();
        lchown(src.join("hl/c"), Some(4242), Some(4343)).unwrap();
    }
    // Times: every path its own, with nanoseconds; directories last,
    // deepest first.
    let mut all: Vec<String> = snapshot(src).into_keys().collect();
    all.sort_by_key(|rel| {
        let is_dir = fs::symlink_metadata(src.join(rel)).unwrap().is_dir();
        (
            is_dir,
            std::cmp::Reverse(rel.matches('/').count() + usize::from(rel != ".")),
            rel.clone(),
        )
    });
    for (i, rel) in all.iter().enumerate() {
        set_time(
            &src.join(rel),
            1_600_000_000 + 1000 * i as i64,
            (123_456_789 * (i as i64 + 1)) % 1_000_000_000,
        );
    }
}

/// Make `old` (an exact copy of the source) into an older copy: files
/// changed (one behind the same size and time), newer at the destination,
/// gone or extra there (also where the rules below exclude), other modes,
/// owners, ACLs and xattrs, a hard link broken, a file where a symlink
/// goes, an empty directory where a file goes.
fn age(old: &Path) {
    let t = |rel: &str| {
        let m = fs::symlink_metadata(old.join(rel)).unwrap();
        (m.mtime(), m.mtime_nsec())
    };
    // Same size and time, other bytes: only -c sees it.
    let (s, ns) = t("docs/same-size.txt");
    fs::write(old.join("docs/same-size.txt"), bytes(99, 64)).unwrap();
    set_time(&old.join("docs/same-size.txt"), s, ns);
    // Newer here: -u keeps it.
    fs::write(old.join("docs/newer.txt"), b"edited at the destination").unwrap();
    set_time(&old.join("docs/newer.txt"), 1_900_000_000, 5);
    // Older here.
    fs::write(old.join("docs/older.txt"), b"an older version").unwrap();
    set_time(&old.join("docs/older.txt"), 1_500_000_000, 7);
    // A few bytes changed in the middle of the big file (a delta).
    let mut big = fs::read(old.join("big.bin")).unwrap();
    big[700_000..700_100].fill(0xAA);
    fs::write(old.join("big.bin"), big).unwrap();
    set_time(&old.join("big.bin"), 1_500_000_000, 0);
    // Missing here.
    fs::remove_file(old.join("logs/keep.txt")).unwrap();
    fs::remove_file(old.join("odd/with space.txt")).unwrap();
    // Only here: plain, in a directory the source lacks, and where the
    // rules exclude.
    fs::write(old.join("extra.txt"), b"only at the destination").unwrap();
    fs::create_dir_all(old.join("gone/sub")).unwrap();
    fs::write(old.join("gone/sub/x.txt"), b"x").unwrap();
    fs::write(old.join("build/stale.o"), b"o").unwrap();
    fs::write(old.join("logs/old.log"), b"l").unwrap();
    fs::write(old.join("cache/stale"), b"c").unwrap();
    // Another mode, same contents and time.
    chmod(&old.join("modes/private"), 0o644);
    // Another owner (as root).
    if is_root() {
        std::os::unix::fs::lchown(old.join("docs/a.txt"), Some(1), Some(1)).unwrap();
    }
    // ACLs: another entry than the source's, and one the source lacks.
    setfacl(&old.join("acl/file"), &["-m", "u:65534:r"]);
    setfacl(&old.join("acl/plain"), &["-m", "u:65534:rw"]);
    // An xattr the source lacks, one with another value.
    set_xattr(&old.join("xattr/file"), "user.stale", b"gone at the source");
    set_xattr(&old.join("xattr/file"), "user.note", b"older note");
    // The cross-directory pair as two files.
    let c = fs::read(old.join("other/c-link")).unwrap();
    let (s, ns) = t("other/c-link");
    fs::remove_file(old.join("other/c-link")).unwrap();
    fs::write(old.join("other/c-link"), c).unwrap();
    chmod(&old.join("other/c-link"), 0o600);
    set_time(&old.join("other/c-link"), s, ns);
    // A file where the source has a symlink; an empty directory where
    // it has a file.
    fs::remove_file(old.join("links/rel")).unwrap();
    fs::write(old.join("links/rel"), b"not a link yet").unwrap();
    fs::remove_file(old.join("swap")).unwrap();
    fs::create_dir(old.join("swap")).unwrap();
}

/// The rule and list files the lines name under `{dir}`.
fn rule_files(dir: &Path) {
    fs::write(
        dir.join("excludes"),
        "# build output\n*.o\ncache/\n\n; logs\n*.log\n",
    )
    .unwrap();
    fs::write(
        dir.join("rules"),
        "- *.log\n- /build/\n+ /cache/\n- cache/sub/\n",
    )
    .unwrap();
    fs::write(
        dir.join("list"),
        "docs/a.txt\nhl/a\nhl/b\nlinks/rel\nodd/with space.txt\ntri1\ndeep/x/tri2\nacl/file\nxattr/file\ncache\n",
    )
    .unwrap();
}
