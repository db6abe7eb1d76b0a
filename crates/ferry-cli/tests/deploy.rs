//! `ferry sync --deploy` through a real sshd to a login whose PATH has no
//! ferry: the hint without it, the upload, its reuse, a damaged copy
//! replaced, and the usage conflicts.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use common::*;

fn tree(root: &Path) {
    fs::create_dir_all(root.join("a/b")).unwrap();
    fs::write(root.join("a/one.bin"), bytes(1, 1 << 20)).unwrap();
    fs::write(root.join("a/b/two.txt"), b"two").unwrap();
    std::os::unix::fs::symlink("a/b/two.txt", root.join("link")).unwrap();
}

/// The one `ferry-HASH` in the remote cache directory.
fn cached(dir: &Path) -> PathBuf {
    let names: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(names.len(), 1, "one file, no temporary left: {names:?}");
    let f = names[0].clone();
    let name = f.file_name().unwrap().to_str().unwrap();
    assert!(
        name.starts_with("ferry-") && name.len() == "ferry-".len() + 32,
        "{name}"
    );
    f
}

fn notes(j: &serde_json::Value) -> Vec<String> {
    j["notices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn deploy_reaches_a_host_without_ferry() {
    let Some(srv) = SshServer::start("deploy_reaches_a_host_without_ferry") else {
        return;
    };
    let rsh = srv.rsh();
    let d = tempfile::tempdir().unwrap();
    // The remote login: a PATH without ferry, and a HOME and cache of the
    // test's own (a space and a quote in it: quoted all the way).
    let home = d.path().join("home");
    fs::create_dir(&home).unwrap();
    let cache = d.path().join("remote cache 'x'");
    for dir in ["/usr/bin", "/bin"] {
        assert!(
            !Path::new(dir).join("ferry").exists(),
            "{dir}/ferry exists: the test needs a PATH without ferry"
        );
    }
    srv.set_env(&[
        ("PATH", "/usr/bin:/bin"),
        ("HOME", p(&home)),
        ("XDG_CACHE_HOME", p(&cache)),
    ]);
    let src = d.path().join("src");
    tree(&src);
    let pushed = d.path().join("pushed");
    let dst = srv.remote(&pushed);

    // (1) No ferry there, no --deploy: one line that says so and
    // suggests --deploy, exit 5, nothing written.
    let out = ferry(&["sync", "-e", &rsh, &slash(&src), &dst]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("ferry is not installed on") && err.contains("run with --deploy"),
        "{err}"
    );
    assert!(!pushed.exists() && !cache.exists());

    // (2) --deploy: uploaded, then the sync runs it.
    let j = ferry_ok(&["sync", "-e", &rsh, "--deploy", &slash(&src), &dst]);
    assert_same_tree(&src, &pushed);
    let n = notes(&j);
    assert!(
        n.iter().any(|l| l.starts_with("deployed ferry (")
            && l.contains(&format!(
                "to {}@127.0.0.1:{}/ferry/ferry-",
                srv.user,
                cache.display()
            ))),
        "{n:?}"
    );
    // The test build is dynamically linked: said, with the static build.
    assert!(
        n.iter()
            .any(|l| l.contains("dynamically linked") && l.contains("musl")),
        "{n:?}"
    );
    let dir = cache.join("ferry");
    let bin = cached(&dir);
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!((mode(&dir), mode(&bin)), (0o700, 0o755));
    assert!(fs::read(&bin).unwrap() == fs::read(ferry_bin()).unwrap());
    assert!(!home.join(".cache").exists());

    // (3) Again, a pull this time: the cached copy is reused, not sent.
    let meta = fs::metadata(&bin).unwrap();
    let pulled = d.path().join("pulled");
    let out = ferry(&[
        "sync",
        "-e",
        &rsh,
        "--deploy",
        &format!("{}/", srv.remote(&src)),
        p(&pulled),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("deployed"), "uploaded again: {err}");
    assert_same_tree(&src, &pulled);
    let again = fs::metadata(cached(&dir)).unwrap();
    assert_eq!(
        (again.ino(), again.mtime(), again.mtime_nsec()),
        (meta.ino(), meta.mtime(), meta.mtime_nsec())
    );

    // `pipe` too: the hint without --deploy (exit 6), the cached copy
    // with it.
    let host = format!("{}@127.0.0.1", srv.user);
    let piped = d.path().join("piped");
    let cmd = format!("cat > '{}'", piped.display());
    for deploy in [false, true] {
        let mut args = vec!["pipe", "-e", &rsh];
        if deploy {
            args.push("--deploy");
        }
        args.extend([host.as_str(), "--", "sh", "-c", &cmd]);
        let (code, err) = pipe_in(&args, b"through pipe");
        if deploy {
            assert_eq!(code, Some(0), "{err}");
            assert!(!err.contains("deployed"), "uploaded again: {err}");
            assert_eq!(fs::read(&piped).unwrap(), b"through pipe");
        } else {
            assert_eq!(code, Some(6), "{err}");
            assert!(err.contains("run with --deploy"), "{err}");
            assert!(!piped.exists());
        }
    }

    // (4) A damaged copy (cut short) is replaced, and the run goes on.
    fs::File::options()
        .write(true)
        .open(&bin)
        .unwrap()
        .set_len(4096)
        .unwrap();
    fs::write(src.join("new.txt"), b"new").unwrap();
    let j = ferry_ok(&["sync", "-e", &rsh, "--deploy", &slash(&src), &dst]);
    assert!(notes(&j).iter().any(|l| l.contains("was damaged")), "{j}");
    assert_same_tree(&src, &pushed);
    assert!(fs::read(cached(&dir)).unwrap() == fs::read(ferry_bin()).unwrap());
}

/// Run ferry with `input` on its stdin: its exit code and stderr.
fn pipe_in(args: &[&str], input: &[u8]) -> (Option<i32>, String) {
    use std::io::Write;
    let mut child = std::process::Command::new(ferry_bin())
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let _ = child.stdin.take().unwrap().write_all(input);
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn deploy_usage_conflicts_are_one_line() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("f");
    fs::write(&src, b"x").unwrap();
    let to = d.path().join("g");
    for (args, says) in [
        (
            vec!["--deploy", "--remote-ferry", "/opt/ferry", "h:/x"],
            "cannot be used with",
        ),
        (vec!["--deploy", p(&to)], "needs a host:path"),
        (
            vec!["--deploy", "ferry://127.0.0.1:9/x"],
            "a ferry:// daemon runs its own ferry",
        ),
    ] {
        let mut a = vec!["sync", p(&src)];
        a.splice(1..1, args.iter().copied().take(args.len() - 1));
        a.push(args[args.len() - 1]);
        let out = ferry(&a);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{a:?}: {err}");
        assert!(err.contains(says), "{a:?}: {err}");
        assert!(!to.exists());
    }
    // Not an executable: refused before ssh is started.
    let out = ferry(&[
        "sync",
        "-e",
        "/nonexistent/ssh",
        &format!("--deploy={}", p(&src)),
        p(&src),
        "h:/x",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("is not an executable ferry can upload"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}
