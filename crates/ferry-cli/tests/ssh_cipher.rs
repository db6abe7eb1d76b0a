//! Through a real sshd on 127.0.0.1: where ssh's ciphers are OpenSSH's
//! defaults and the CPU has AES, ferry asks ssh to prefer AES-GCM, and
//! the connection really uses it; a cipher chosen in `-e` or in an
//! ssh_config is left as it is. A wrapper named `ssh` logs each command
//! line ferry runs and has the real ssh write its debug log, where the
//! negotiated cipher shows.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::*;

/// Whether this CPU has what ferry counts as AES instructions.
fn cpu_has_aes() -> bool {
    let info = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags = info
        .lines()
        .find(|l| l.starts_with("flags") || l.starts_with("Features"))
        .unwrap_or("");
    let has = |f: &str| flags.split_whitespace().any(|w| w == f);
    if cfg!(target_arch = "x86_64") {
        has("aes") && has("pclmulqdq")
    } else if cfg!(target_arch = "aarch64") {
        has("aes")
    } else {
        false
    }
}

/// A `ssh` wrapper in `dir` that appends its arguments to `dir/args` and
/// runs the real ssh, with `-v -E dir/debug` for connections.
fn wrapper(dir: &Path) -> String {
    let real = Command::new("sh")
        .args(["-c", "command -v ssh"])
        .output()
        .unwrap();
    let real = String::from_utf8(real.stdout).unwrap().trim().to_string();
    assert!(real.starts_with('/'), "ssh not found: {real:?}");
    let path = dir.join("ssh");
    fs::write(
        &path,
        format!(
            "#!/bin/sh\necho \"$*\" >> {d}/args\ncase \" $* \" in *\" -G \"*|\" -V \") exec {real} \"$@\";; esac\n\
             exec {real} -v -E {d}/debug \"$@\"\n",
            d = dir.display()
        ),
    )
    .unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    path.display().to_string()
}

/// What one push through the wrapper ran and negotiated.
struct Ran {
    /// `ssh -V` calls, `ssh … -G …` probes, and the connections.
    versions: usize,
    probes: usize,
    conns: Vec<String>,
    /// The ciphers of the connection, both ways (ssh's debug log).
    ciphers: Vec<String>,
}

/// Push `src` with `-e rsh_extra…` through the wrapper.
fn push(srv: &SshServer, src: &Path, case: &str, extra: &str) -> Ran {
    let d = tempfile::tempdir().unwrap();
    let ssh = wrapper(d.path());
    let rsh = srv.rsh().replacen("ssh", &ssh, 1) + extra;
    let bin = ferry_bin();
    let dst = d.path().join("dst");
    let out = Command::new(&bin)
        .args(["sync", "-e", &rsh, "--remote-ferry", p(&bin)])
        .arg(slash(src))
        .arg(srv.remote(&dst))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{case}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_same_tree(src, &dst);
    let args = fs::read_to_string(d.path().join("args")).unwrap();
    let debug = fs::read_to_string(d.path().join("debug")).unwrap();
    let lines: Vec<&str> = args.lines().collect();
    Ran {
        versions: lines.iter().filter(|l| **l == "-V").count(),
        probes: lines.iter().filter(|l| l.contains(" -G ")).count(),
        conns: lines
            .iter()
            .filter(|l| **l != "-V" && !l.contains(" -G "))
            .map(|l| l.to_string())
            .collect(),
        ciphers: debug
            .lines()
            .filter_map(|l| l.split("cipher: ").nth(1))
            .filter_map(|c| c.split_whitespace().next())
            .map(str::to_string)
            .collect(),
    }
}

fn all(ciphers: &[String], name: &str) -> bool {
    ciphers.len() == 2 && ciphers.iter().all(|c| c == name)
}

#[test]
fn ssh_prefers_aes_gcm_only_where_nobody_chose_a_cipher() {
    let Some(srv) = SshServer::start("ssh_prefers_aes_gcm_only_where_nobody_chose_a_cipher") else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    fs::create_dir_all(src.join("a")).unwrap();
    fs::write(src.join("a/one.bin"), bytes(5, 1 << 20)).unwrap();
    fs::write(src.join("two.txt"), b"two").unwrap();
    let aes = cpu_has_aes();
    const GCM: &str = "aes128-gcm@openssh.com";
    const CHACHA: &str = "chacha20-poly1305@openssh.com";

    // Nobody chose: `ssh -V`, two `ssh -G` probes, then the connection
    // with the default list reordered (AES-GCM first), used both ways.
    let r = push(&srv, &src, "default", "");
    assert_eq!(r.conns.len(), 1, "{:?}", r.conns);
    if aes {
        assert_eq!((r.versions, r.probes), (1, 2));
        assert!(r.conns[0].contains(&format!(" -c {GCM},")), "{:?}", r.conns);
        assert!(r.conns[0].contains(&format!(",{CHACHA}")), "{:?}", r.conns);
        assert!(all(&r.ciphers, GCM), "{:?}", r.ciphers);
    } else {
        assert!(!r.conns[0].contains(" -c "), "{:?}", r.conns);
    }

    // `-c` in -e: no probe, nothing added, the user's cipher is used.
    let r = push(&srv, &src, "-c", &format!(" -c {CHACHA}"));
    assert_eq!((r.versions, r.probes), (0, 0));
    assert_eq!(r.conns[0].matches(" -c ").count(), 1, "{:?}", r.conns);
    assert!(all(&r.ciphers, CHACHA), "{:?}", r.ciphers);

    // Ciphers in an ssh_config: probed, found chosen, left alone.
    let cfg = d.path().join("ssh_config");
    fs::write(&cfg, format!("Ciphers {CHACHA},aes256-gcm@openssh.com\n")).unwrap();
    let with_cfg = format!(" -F {}", cfg.display());
    let r = push(&srv, &src, "config", &with_cfg);
    assert_eq!(r.conns.len(), 1, "{:?}", r.conns);
    assert!(!r.conns[0].contains(" -c "), "{:?}", r.conns);
    assert!(all(&r.ciphers, CHACHA), "{:?}", r.ciphers);

    // Chosen for another host only: this one gets the reordered list.
    fs::write(
        &cfg,
        format!("Host elsewhere.invalid\n  Ciphers {CHACHA}\n"),
    )
    .unwrap();
    let r = push(&srv, &src, "other host", &with_cfg);
    if aes {
        assert!(r.conns[0].contains(&format!(" -c {GCM},")), "{:?}", r.conns);
        assert!(all(&r.ciphers, GCM), "{:?}", r.ciphers);
    }
}

/// A host that ssh would read as an option (`-oProxyCommand=...` runs a
/// command) is refused before anything is started.
#[test]
fn a_host_that_looks_like_an_option_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    fs::create_dir_all(&src).unwrap();
    let mark = d.path().join("ran");
    // No '/' before the ':' (or it is a local path): run where `ran` is.
    let dest = "-oProxyCommand=touch ran:dst";
    let src = p(&src);
    // (`pipe` cannot be given such a target: clap reads it as an option.)
    for args in [vec!["sync", src, "--", dest], vec!["sync", "--", dest, src]] {
        let out = Command::new(ferry_bin())
            .args(&args)
            .current_dir(d.path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains("begins with '-'"), "{args:?}: {err}");
        assert!(!mark.exists(), "{args:?}");
    }
}
