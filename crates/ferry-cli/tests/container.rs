//! The Kubernetes volume move end to end, without a cluster: the static
//! binary and the container image built as README says, the manifests
//! rendered (`kubectl kustomize`), validated (`kubernetes-validate`) and
//! checked against the restricted Pod Security Standard
//! (`deploy/kubernetes/check.py`), then the two Jobs' containers run with
//! the command, arguments, mounts and security settings taken from the
//! rendered objects (podman, as user 65532 with a read-only root
//! filesystem, no capabilities, no privilege escalation), each in a network
//! namespace of its own joined by a veth pair. The volume must arrive
//! identical, the destination exit 0 with its outcome in the termination
//! log, and a re-stage move nothing. Root only (podman, namespaces).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

const IMAGE_LIMIT: u64 = 15 << 20;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    out
}

fn podman() -> Command {
    let mut c = Command::new("podman");
    c.args(["--cgroup-manager", "cgroupfs", "--runtime", "runc"]);
    c
}

/// What the test started, removed by name when it ends, however it ends.
struct Cleanup {
    containers: Vec<String>,
    netns: Vec<String>,
    image: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for c in &self.containers {
            let _ = podman().args(["rm", "-f", "-t", "0", c]).output();
        }
        for n in &self.netns {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
        let _ = podman().args(["rmi", "-f", &self.image]).output();
    }
}

fn can_run() -> bool {
    if !is_root() {
        skip("container end-to-end test needs root (podman, network namespaces)");
        return false;
    }
    for tool in [
        "podman",
        "runc",
        "kubectl",
        "kubernetes-validate",
        "ip",
        "python3",
    ] {
        if !need(tool, "container end-to-end test") {
            return false;
        }
    }
    let targets = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("x86_64-unknown-linux-musl"))
        .unwrap_or(false);
    if !targets {
        skip("container end-to-end test needs `rustup target add x86_64-unknown-linux-musl`");
    }
    targets
}

/// The static binary, built as README says (its own target directory:
/// the one `cargo test` holds is locked).
fn static_binary() -> PathBuf {
    let dir = workspace().join("target/static-e2e");
    run(Command::new(env!("CARGO"))
        .current_dir(workspace())
        .env("CARGO_TARGET_DIR", &dir)
        .args([
            "build",
            "--profile",
            "dist",
            "--locked",
            "--target",
            "x86_64-unknown-linux-musl",
            "-p",
            "ferry-cli",
        ]));
    dir.join("x86_64-unknown-linux-musl/dist/ferry")
}

/// The image from the repository's Containerfile, with the binary where
/// it expects it.
fn build_image(bin: &Path, ctx: &Path, tag: &str) {
    let dest = ctx.join("target/x86_64-unknown-linux-musl/dist");
    std::fs::create_dir_all(&dest).unwrap();
    std::fs::copy(bin, dest.join("ferry")).unwrap();
    std::fs::copy(workspace().join("Containerfile"), ctx.join("Containerfile")).unwrap();
    run(podman()
        .args(["build", "-q", "-t", tag, "-f"])
        .arg(ctx.join("Containerfile"))
        .arg(ctx));
    let out = run(podman().args(["image", "inspect", "--format", "{{.Size}}", tag]));
    let size: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(size < IMAGE_LIMIT, "image is {size} bytes");
}

/// Render every kustomization, validate it, check it against the
/// restricted profile; the base's Jobs as JSON.
fn render_and_check(deploy: &Path, key: &str) -> serde_json::Value {
    std::fs::write(deploy.join("base/ferry.key"), key).unwrap();
    let mut base = None;
    for (k, allow) in [
        ("base", &[][..]),
        ("overlays/block", &[]),
        ("overlays/cross-cluster", &[]),
        // The documented exception: root with three capabilities.
        ("overlays/keep-ownership", &["runAsNonRoot", "capabilities"]),
    ] {
        let out = run(Command::new("kubectl").arg("kustomize").arg(deploy.join(k)));
        let file = deploy.join(format!("{}.yaml", k.replace('/', "-")));
        std::fs::write(&file, &out.stdout).unwrap();
        run(Command::new("kubernetes-validate")
            .args(["--strict", "--quiet"])
            .arg(&file));
        let mut c = Command::new("python3");
        c.arg(deploy.join("check.py"));
        for a in allow {
            c.args(["--allow", a]);
        }
        let jobs: serde_json::Value = serde_json::from_slice(&run(c.arg(&file)).stdout).unwrap();
        assert!(
            jobs["ferry-dest"].is_object() && jobs["ferry-source"].is_object(),
            "{k}"
        );
        if k == "base" {
            base = Some(jobs);
        }
        if allow.is_empty() {
            continue;
        }
        // Without the exception it must fail: the check does check.
        let strict = Command::new("python3")
            .arg(deploy.join("check.py"))
            .arg(&file)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(!strict.success(), "{k} passed the restricted check as root");
    }
    base.unwrap()
}

/// Two namespaces joined by a veth pair: (dest, source), dest's address.
fn namespaces(tag: &str, clean: &mut Cleanup) -> (String, String, String) {
    let (d, s) = (format!("{tag}-d"), format!("{tag}-s"));
    for n in [&d, &s] {
        run(Command::new("ip").args(["netns", "add", n]));
        clean.netns.push(n.clone());
    }
    let oct = std::process::id() % 200 + 20;
    let (da, sa) = (format!("10.231.{oct}.1"), format!("10.231.{oct}.2"));
    let (vd, vs) = (format!("fe{oct}d"), format!("fe{oct}s"));
    let ip = |ns: &str, args: &[&str]| {
        run(Command::new("ip")
            .args(["netns", "exec", ns, "ip"])
            .args(args));
    };
    run(Command::new("ip").args([
        "link", "add", &vd, "netns", &d, "type", "veth", "peer", "name", &vs, "netns", &s,
    ]));
    ip(&d, &["addr", "add", &format!("{da}/24"), "dev", &vd]);
    ip(&s, &["addr", "add", &format!("{sa}/24"), "dev", &vs]);
    for (ns, dev) in [(&d, &vd), (&s, &vs)] {
        ip(ns, &["link", "set", dev, "up"]);
        ip(ns, &["link", "set", "lo", "up"]);
    }
    (d, s, da)
}

/// `podman run` flags for a Job's container as rendered: the user, the
/// security settings, and each mount from the host directory standing in
/// for its volume.
fn run_flags(
    job: &serde_json::Value,
    volume: &dyn Fn(&serde_json::Value) -> PathBuf,
) -> Vec<String> {
    let mut f = vec![format!("--user={}:{}", job["runAsUser"], job["runAsGroup"])];
    if job["readOnlyRootFilesystem"] == true {
        f.push("--read-only".into());
    }
    if job["allowPrivilegeEscalation"] == false {
        f.push("--security-opt=no-new-privileges".into());
    }
    for c in job["capDrop"].as_array().unwrap() {
        f.push(format!("--cap-drop={}", c.as_str().unwrap()));
    }
    for c in job["capAdd"].as_array().unwrap() {
        f.push(format!("--cap-add={}", c.as_str().unwrap()));
    }
    for m in job["mounts"].as_array().unwrap() {
        let ro = if m["readOnly"] == true { ":ro" } else { "" };
        f.push(format!(
            "--volume={}:{}{ro}",
            volume(&m["volume"]).display(),
            m["path"].as_str().unwrap()
        ));
    }
    for e in job["env"].as_array().unwrap() {
        f.push(format!(
            "--env={}={}",
            e["name"].as_str().unwrap(),
            e["value"].as_str().unwrap_or("")
        ));
    }
    f
}

fn args_of(job: &serde_json::Value) -> Vec<String> {
    job["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

fn source_tree(root: &Path) {
    std::fs::create_dir_all(root.join("app/db")).unwrap();
    for i in 0..200 {
        std::fs::write(
            root.join(format!("app/f{i:03}.txt")),
            bytes(i, (i as usize * 97) % 5000),
        )
        .unwrap();
    }
    std::fs::write(root.join("app/db/big.bin"), bytes(1, 24 << 20)).unwrap();
    let sparse = std::fs::File::create(root.join("app/db/sparse.img")).unwrap();
    sparse.set_len(64 << 20).unwrap();
    use std::os::unix::fs::FileExt;
    sparse.write_all_at(&bytes(2, 1 << 20), 32 << 20).unwrap();
    std::os::unix::fs::symlink("db/big.bin", root.join("app/current")).unwrap();
}

#[test]
fn a_volume_moves_between_two_containers_as_the_manifests_say() {
    if !can_run() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let tag = format!("ferry-e2e-{}", std::process::id());
    let image = format!("localhost/{tag}:test");
    let mut clean = Cleanup {
        containers: Vec::new(),
        netns: Vec::new(),
        image: image.clone(),
    };
    let bin = static_binary();
    assert!(std::fs::metadata(&bin).unwrap().len() < IMAGE_LIMIT);
    build_image(&bin, &t.path().join("ctx"), &image);

    let deploy = t.path().join("deploy");
    run(Command::new("cp")
        .arg("-r")
        .arg(workspace().join("deploy/kubernetes"))
        .arg(&deploy));
    let key = "7b1f0c2d9e8a4b6c5d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c";
    let jobs = render_and_check(&deploy, key);

    // The volumes: the source claim, the destination claim (owned by the
    // Pods' user, as fsGroup would make it), the Secret as a file.
    let (src, dst, secret) = (
        t.path().join("src"),
        t.path().join("dst"),
        t.path().join("secret"),
    );
    source_tree(&src);
    std::fs::create_dir(&dst).unwrap();
    std::fs::create_dir(&secret).unwrap();
    std::fs::write(secret.join("key"), key).unwrap();
    for p in [&t.path().to_path_buf(), &secret, &secret.join("key")] {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    run(Command::new("chown").args(["-R", "65532:65532"]).arg(&dst));
    let tlog = t.path().join("termination-log");
    std::fs::write(&tlog, b"").unwrap();
    run(Command::new("chown").arg("65532:65532").arg(&tlog));
    let volume = |v: &serde_json::Value| -> PathBuf {
        match v["persistentVolumeClaim"]["claimName"].as_str() {
            Some("source-pvc") => src.clone(),
            Some("dest-pvc") => dst.clone(),
            _ if v["secret"].is_object() => secret.clone(),
            other => panic!("unexpected volume {other:?}"),
        }
    };
    let (dns, sns, dest_ip) = namespaces(&tag, &mut clean);

    let stage = |round: u32, clean: &mut Cleanup| -> serde_json::Value {
        let dest = format!("{tag}-dest-{round}");
        clean.containers.push(dest.clone());
        let mut d = podman();
        d.args([
            "run",
            "-d",
            "--name",
            &dest,
            &format!("--network=ns:/run/netns/{dns}"),
        ]);
        d.args(run_flags(&jobs["ferry-dest"], &volume));
        d.arg(format!("--volume={}:/dev/termination-log", tlog.display()));
        d.arg(&image).args(args_of(&jobs["ferry-dest"]));
        run(&mut d);
        // Wait for its "listening on" line.
        let t0 = Instant::now();
        loop {
            let logs = run(podman().args(["logs", &dest]));
            if String::from_utf8_lossy(&logs.stderr).contains("listening on") {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "the destination never listened"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let source = format!("{tag}-source-{round}");
        clean.containers.push(source.clone());
        let mut s = podman();
        s.args([
            "run",
            "--name",
            &source,
            &format!("--network=ns:/run/netns/{sns}"),
        ]);
        s.arg(format!("--add-host=ferry-dest:{dest_ip}"));
        s.args(run_flags(&jobs["ferry-source"], &volume));
        s.arg(&image).args(args_of(&jobs["ferry-source"]));
        let out = run(&mut s);
        let summary: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("the source's JSON summary");
        let waited = run(podman().args(["wait", &dest]));
        assert_eq!(
            String::from_utf8_lossy(&waited.stdout).trim(),
            "0",
            "destination exit code"
        );
        let line = std::fs::read_to_string(&tlog).unwrap();
        assert!(
            line.contains("done:") && line.contains("(exit 0)"),
            "{line}"
        );
        summary
    };
    let first = stage(1, &mut clean);
    assert_eq!(first["exit_code"], 0, "{first}");
    assert_eq!(first["files_transferred"], 203, "{first}");
    assert_same_tree(&src, &dst);
    // Holes stay holes on the destination claim.
    assert!(allocated(&dst.join("app/db/sparse.img")) < 8 << 20);
    // Re-stage with nothing changed: nothing moves.
    let again = stage(2, &mut clean);
    assert_eq!(again["files_transferred"], 0, "{again}");
    assert_same_tree(&src, &dst);
}
