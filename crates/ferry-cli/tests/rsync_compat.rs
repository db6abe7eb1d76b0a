//! An rsync user's command lines, each compared with what real rsync does
//! on the same data (locally, and pushed over a real sshd where the
//! remote side matters):
//!
//! - [`rules`]: include/exclude rules and `--files-from`.
//! - [`delete`]: `--delete` with rules, `--delete-excluded`, `--max-delete`.
//! - [`meta`]: `-A`, `-u`, `--ignore-existing`, sizes, `--backup`,
//!   `--chmod`, `--link-dest`.
//! - [`flags`]: command lines as typed, `--stats`, exit codes, `--log-file`.
//! - [`in_the_way`]: directory-only excludes, `-b` and `--ignore-existing`
//!   with an entry of another type in the way, `--backup-dir` inside the
//!   destination.
//! - [`hard_links`]: `-H` with `-u`, `--ignore-existing`, `--max-size`.
//! - [`itemize`]: `-i` lines, rsync's selection flags and the `--no-` forms.
//! - [`sources`]: `dir/.`, symlinks named as the source or destination, a
//!   missing source among several.
//! - [`thirty`]: thirty everyday command lines on a rich tree (links, hard
//!   links, ACLs, xattrs, owners), every kept attribute compared.

mod common;
#[path = "rsync_compat/delete.rs"]
mod delete;
#[path = "rsync_compat/flags.rs"]
mod flags;
#[path = "rsync_compat/hard_links.rs"]
mod hard_links;
#[path = "rsync_compat/in_the_way.rs"]
mod in_the_way;
#[path = "rsync_compat/itemize.rs"]
mod itemize;
#[path = "rsync_compat/meta.rs"]
mod meta;
#[path = "rsync_compat/rules.rs"]
mod rules;
#[path = "rsync_compat/sources.rs"]
mod sources;
#[path = "rsync_compat/thirty.rs"]
mod thirty;

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::process::Command;

use common::*;

/// A tree with names the rules below pick apart.
fn tree(root: &Path) {
    for d in ["a/b", "a/x", "keep/deep", "x", "logs", "b"] {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    for f in [
        "top.txt",
        "top.log",
        "a/one.txt",
        "a/one.o",
        "a/special.o",
        "a/b/two.txt",
        "a/x/y",
        "x/y",
        "keep/k.bin",
        "keep/deep/k.txt",
        "logs/l.log",
        "b/bee.txt",
        "#hash",
        "sp ace ",
    ] {
        fs::write(root.join(f), f.as_bytes()).unwrap();
    }
}

/// `rsync ARGS SRC DST`: it must succeed when `strict` (else only its
/// copy counts).
fn rsync(args: &[&str], src: &str, dst: &Path, strict: bool) {
    let out = Command::new("rsync")
        .args(args)
        .arg(src)
        .arg(dst)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!strict || out.status.success(), "rsync {args:?}: {err}");
}

/// `ferry sync PRE ARGS SRC DST --json`, which must succeed.
fn ferry_sync(pre: &[&str], args: &[&str], src: &str, dst: &str) -> serde_json::Value {
    let mut v = vec!["sync"];
    v.extend_from_slice(pre);
    v.extend_from_slice(args);
    v.extend([src, dst]);
    ferry_ok(&v)
}

/// Every path under `root`, relative, directories with a trailing `/`.
fn listing(root: &Path) -> BTreeSet<String> {
    fn walk(root: &Path, rel: &str, out: &mut BTreeSet<String>) {
        for e in fs::read_dir(root.join(rel)).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            let r = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            if e.file_type().unwrap().is_dir() {
                out.insert(format!("{r}/"));
                walk(root, &r, out);
            } else {
                out.insert(r);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(root, "", &mut out);
    out
}
