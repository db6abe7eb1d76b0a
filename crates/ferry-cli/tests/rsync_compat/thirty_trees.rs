//! The trees the thirty lines run on: the rich source, the older copy
//! and the rule files.

use std::os::unix::fs::PermissionsExt;

use super::*;

/// `rsync -aHAX FROM/ TO`: an exact copy of a prepared tree.
pub(super) fn copy_tree(from: &Path, to: &Path) {
    rsync(&["-aHAX"], &slash(from), to, true);
}

/// Set the mtime of `path` (not following a symlink), nanoseconds too.
pub(super) fn set_time(path: &Path, secs: i64, nsec: i64) {
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

pub(super) fn set_xattr(path: &Path, name: &str, value: &[u8]) {
    rustix::fs::lsetxattr(path, name, value, rustix::fs::XattrFlags::empty())
        .unwrap_or_else(|e| panic!("set {name} on {}: {e}", path.display()));
}

pub(super) fn setfacl(path: &Path, args: &[&str]) {
    let st = Command::new("setfacl")
        .args(args)
        .arg(path)
        .status()
        .unwrap();
    assert!(st.success(), "setfacl {args:?} {}", path.display());
}

pub(super) fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// The source tree. Every path gets its own mtime with nanoseconds,
/// directories last (deepest first), so that nothing later moves them.
pub(super) fn build_source(src: &Path) {
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
pub(super) fn age(old: &Path) {
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
pub(super) fn rule_files(dir: &Path) {
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
