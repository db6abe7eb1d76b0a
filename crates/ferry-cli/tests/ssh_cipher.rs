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
            "#!/bin/sh\necho \"$*\" >> {d}/args\ncase \" $* \" in *\" -G \"*) exec {real} \"$@\";; esac\n\
             exec {real} -v -E {d}/debug \"$@\"\n",
            d = dir.display()
        ),
    )
    .unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    path.display().to_string()
}

/// Push `src` with `-e rsh_extra…` through the wrapper; what it ran (one
/// line per command) and the ciphers the connection negotiated.
fn push(srv: &SshServer, src: &Path, case: &str, extra: &str) -> (Vec<String>, Vec<String>) {
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
    let ciphers = debug
        .lines()
        .filter_map(|l| l.split("cipher: ").nth(1))
        .filter_map(|c| c.split_whitespace().next())
        .map(str::to_string)
        .collect();
    (args.lines().map(str::to_string).collect(), ciphers)
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

    // Nobody chose: two `ssh -G` probes, then the connection with the
    // default list reordered (AES-GCM first), and AES-GCM both ways.
    let (ran, ciphers) = push(&srv, &src, "default", "");
    let probes = ran.iter().filter(|l| l.contains(" -G ")).count();
    let conn: Vec<&String> = ran.iter().filter(|l| !l.contains(" -G ")).collect();
    assert_eq!(conn.len(), 1, "{ran:?}");
    assert_eq!(ciphers.len(), 2, "{ciphers:?}");
    if aes {
        assert_eq!(probes, 2, "{ran:?}");
        assert!(conn[0].contains(" -c aes128-gcm@openssh.com,"), "{ran:?}");
        assert!(
            conn[0].contains(",chacha20-poly1305@openssh.com"),
            "{ran:?}"
        );
        assert!(
            ciphers.iter().all(|c| c == "aes128-gcm@openssh.com"),
            "{ciphers:?}"
        );
    } else {
        assert!(!conn[0].contains(" -c "), "{ran:?}");
    }

    // `-c` in -e: no probe, nothing added, the user's cipher is used.
    let (ran, ciphers) = push(&srv, &src, "-c", " -c chacha20-poly1305@openssh.com");
    assert!(ran.iter().all(|l| !l.contains(" -G ")), "{ran:?}");
    assert_eq!(ran[0].matches(" -c ").count(), 1, "{ran:?}");
    assert!(
        ciphers.iter().all(|c| c == "chacha20-poly1305@openssh.com"),
        "{ciphers:?}"
    );

    // Ciphers in an ssh_config: probed, found chosen, left alone.
    let cfg = d.path().join("ssh_config");
    fs::write(
        &cfg,
        "Ciphers chacha20-poly1305@openssh.com,aes256-gcm@openssh.com\n",
    )
    .unwrap();
    let (ran, ciphers) = push(&srv, &src, "config", &format!(" -F {}", cfg.display()));
    let conn: Vec<&String> = ran.iter().filter(|l| !l.contains(" -G ")).collect();
    assert_eq!(conn.len(), 1, "{ran:?}");
    assert!(!conn[0].contains(" -c "), "{ran:?}");
    assert!(
        ciphers.iter().all(|c| c == "chacha20-poly1305@openssh.com"),
        "{ciphers:?}"
    );
}
