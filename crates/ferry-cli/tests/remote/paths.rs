//! Remote paths as rsync users write them: `~/`, `DIR/.`, a single
//! symlink as the source, and wildcards in a pull's sources.

use super::*;

/// Remote paths as an rsync user writes them: `~/…` is the remote home
/// (the remote shell expands it, as with rsync), and `host:DIR/.` pulls
/// DIR's contents. A `~` inside a name stays a character.
#[test]
fn remote_paths_with_a_tilde_or_a_dot() {
    let Some(srv) = SshServer::start("remote_paths_with_a_tilde_or_a_dot") else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let home = d.path().join("home");
    fs::create_dir(&home).unwrap();
    srv.set_env(&[("HOME", p(&home))]);
    let rsh = srv.rsh();
    let bin = ferry_bin();
    let bin = p(&bin);
    let src = d.path().join("src");
    tree(&src);
    let host = |rest: &str| format!("{}@127.0.0.1:{rest}", srv.user);
    ferry_ok(&remote_args(&rsh, bin, &[&slash(&src), &host("~/in home")]));
    assert_same_tree(&src, &home.join("in home"));
    assert!(!home.join("~").exists());
    let back = d.path().join("back");
    ferry_ok(&remote_args(&rsh, bin, &[&host("~/in home/"), p(&back)]));
    assert_same_tree(&src, &back);
    let dot = d.path().join("dot");
    let from = srv.remote(&src.join("."));
    ferry_ok(&remote_args(&rsh, bin, &[&from, p(&dot)]));
    assert_same_tree(&src, &dot);
    let odd = d.path().join("a~b");
    ferry_ok(&remote_args(&rsh, bin, &[&slash(&src), &srv.remote(&odd)]));
    assert_same_tree(&src, &odd);
}

/// A symlink named as the only source lands as that symlink at a new
/// name, over a file, and on a pull, as with rsync (it was refused over
/// ssh: "a single-file destination takes a regular file only").
#[test]
fn a_single_symlink_crosses_ssh_as_a_symlink() {
    let Some(srv) = SshServer::start("a_single_symlink_crosses_ssh_as_a_symlink") else {
        return;
    };
    let rsh = srv.rsh();
    let bin = ferry_bin();
    let bin = p(&bin);
    let d = tempfile::tempdir().unwrap();
    let link = d.path().join("link");
    std::os::unix::fs::symlink("../nowhere/x", &link).unwrap();
    let target = |p: &Path| fs::read_link(p).unwrap();
    let new = d.path().join("new");
    ferry_ok(&remote_args(
        &rsh,
        bin,
        &["-a", p(&link), &srv.remote(&new)],
    ));
    assert_eq!(target(&new), Path::new("../nowhere/x"));
    let file = d.path().join("file");
    fs::write(&file, b"old").unwrap();
    ferry_ok(&remote_args(
        &rsh,
        bin,
        &["-a", p(&link), &srv.remote(&file)],
    ));
    assert_eq!(target(&file), Path::new("../nowhere/x"));
    let again = ferry_ok(&remote_args(
        &rsh,
        bin,
        &["-a", p(&link), &srv.remote(&new)],
    ));
    assert_eq!(again["files_transferred"], 0, "{again}");
    let pulled = d.path().join("pulled");
    ferry_ok(&remote_args(
        &rsh,
        bin,
        &["-a", &srv.remote(&link), p(&pulled)],
    ));
    assert_eq!(target(&pulled), Path::new("../nowhere/x"));
}

/// Wildcards in a pull's sources (`host:dir/*.txt`) name what a shell
/// would expand them to, as with rsync: compared with rsync over the same
/// sshd. A hidden name is not matched by `*`; `dir*/` sends each match's
/// contents; a pattern that matches nothing is one error line.
#[test]
fn remote_wildcards_are_expanded_as_rsync_expands_them() {
    let name = "remote_wildcards_are_expanded_as_rsync_expands_them";
    if !need("rsync", name) {
        return;
    }
    let Some(srv) = SshServer::start(name) else {
        return;
    };
    let rsh = srv.rsh();
    let bin = ferry_bin();
    let bin = p(&bin);
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    fs::create_dir_all(src.join("sub")).unwrap();
    fs::create_dir_all(src.join("sub2/deep")).unwrap();
    for f in [
        "a.txt",
        "b.txt",
        ".h.txt",
        "c.log",
        "sp ace.txt",
        "sub/x.txt",
        "sub2/deep/y",
    ] {
        fs::write(src.join(f), f.as_bytes()).unwrap();
    }
    for (i, pat) in ["*.txt", "sub*/", "sub*", "?.*", "[ab].txt"]
        .iter()
        .enumerate()
    {
        let from = format!("{}/{pat}", srv.remote(&src));
        let (f, r) = (
            d.path().join(format!("f{i}")),
            d.path().join(format!("r{i}")),
        );
        ferry_ok(&remote_args(&rsh, bin, &["-a", &from, p(&f)]));
        let st = std::process::Command::new("rsync")
            .args(["-a", "-e", &rsh, &from, p(&r)])
            .status()
            .unwrap();
        assert!(st.success(), "rsync {pat}");
        assert_same_tree(&r, &f);
    }
    assert!(!d.path().join("f0/.h.txt").exists());
    let from = format!("{}/*.none", srv.remote(&src));
    let out = ferry(&remote_args(&rsh, bin, &[&from, p(&d.path().join("none"))]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("*.none: no such file"), "{err}");
}
