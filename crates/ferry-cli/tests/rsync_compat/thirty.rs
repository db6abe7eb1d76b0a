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

use std::os::unix::fs::MetadataExt;

use super::*;

#[path = "thirty_compare.rs"]
mod compare;
#[path = "thirty_trees.rs"]
mod trees;

use compare::*;
use trees::*;

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
