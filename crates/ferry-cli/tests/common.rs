//! Helpers shared by the integration tests: run the real `ferry` binary,
//! build trees, compare them.
#![allow(dead_code)]

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn ferry_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ferry"))
}

pub fn ferry(args: &[&str]) -> Output {
    Command::new(ferry_bin())
        .args(args)
        .output()
        .expect("run ferry binary")
}

pub fn ferry_ok(args: &[&str]) -> serde_json::Value {
    let mut a = args.to_vec();
    a.push("--json");
    let out = ferry(&a);
    assert!(
        out.status.success(),
        "ferry {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object on stdout")
}

/// A test that cannot run here says so loudly, and under CI (`CI` set, as
/// `.ci/run` does) fails instead: CI installs everything the tests need, so
/// a missing tool there is a broken CI, not a reason to pass.
/// Whether `tool` is installed; if not, `test` is skipped (a failure
/// under CI, see [`skip`]).
pub fn need(tool: &str, test: &str) -> bool {
    which(tool) || {
        skip(&format!("{test}: {tool} not installed"));
        false
    }
}

pub fn skip(why: &str) {
    if std::env::var_os("CI").is_some_and(|v| !v.is_empty()) {
        panic!("cannot run under CI: {why}");
    }
    eprintln!("SKIPPED: {why}");
}

/// proptest settings for the integration tests: `cases` generated cases and
/// no failure file written into the source tree (a failing case prints its
/// inputs; a test must never dirty a clean clone).
pub fn prop_config(cases: u32) -> proptest::test_runner::Config {
    proptest::test_runner::Config {
        cases,
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    }
}

/// Set a file's modification time to `secs` after the epoch.
pub fn set_mtime(path: &Path, secs: i64) {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs as u64);
    fs::File::options()
        .write(true)
        .open(path)
        .and_then(|f| f.set_modified(t))
        .expect("set mtime");
}

pub fn p(path: &Path) -> &str {
    path.to_str().expect("utf-8 temp path")
}

pub fn slash(path: &Path) -> String {
    format!("{}/", path.display())
}

/// Deterministic pseudo-random bytes.
pub fn bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed | 1;
    let mut v = Vec::with_capacity(n + 8);
    while v.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(n);
    v
}

/// Assert two trees are equal: names, types, contents, modes, mtimes (ns),
/// symlink targets, and hard-link structure.
pub fn assert_same_tree(a: &Path, b: &Path) {
    let mut na: Vec<_> = fs::read_dir(a)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let mut nb: Vec<_> = fs::read_dir(b)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    na.sort();
    nb.sort();
    assert_eq!(na, nb, "names differ in {} vs {}", a.display(), b.display());
    for n in na {
        let (pa, pb) = (a.join(&n), b.join(&n));
        let (ma, mb) = (
            fs::symlink_metadata(&pa).unwrap(),
            fs::symlink_metadata(&pb).unwrap(),
        );
        assert_eq!(ma.file_type(), mb.file_type(), "{}", pb.display());
        if ma.file_type().is_symlink() {
            assert_eq!(fs::read_link(&pa).unwrap(), fs::read_link(&pb).unwrap());
            continue;
        }
        assert_eq!(ma.mode(), mb.mode(), "mode of {}", pb.display());
        if ma.is_dir() {
            assert_same_tree(&pa, &pb);
        } else {
            assert!(
                fs::read(&pa).unwrap() == fs::read(&pb).unwrap(),
                "contents of {}",
                pb.display()
            );
            assert_eq!(ma.nlink(), mb.nlink(), "link count of {}", pb.display());
        }
        assert_eq!(
            (ma.mtime(), ma.mtime_nsec()),
            (mb.mtime(), mb.mtime_nsec()),
            "mtime of {}",
            pb.display()
        );
    }
}

/// Files whose name looks like one of ferry's temporary files.
pub fn temp_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            let path = e.path();
            if e.file_name().to_string_lossy().contains(".ferry-") {
                out.push(path.clone());
            }
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                out.extend(temp_files(&path));
            }
        }
    }
    out
}

pub fn allocated(path: &Path) -> u64 {
    fs::metadata(path).unwrap().blocks() * 512
}

pub fn is_root() -> bool {
    // SAFETY-free check through the id command's view of the process.
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// A real OpenSSH server on 127.0.0.1 with generated host and client keys,
/// killed (by pid) when dropped.
pub struct SshServer {
    pub port: u16,
    pub user: String,
    dir: tempfile::TempDir,
    child: std::process::Child,
}

impl SshServer {
    /// Start one, or print a loud SKIPPED line and return None when sshd or
    /// ssh is not installed.
    pub fn start(test: &str) -> Option<SshServer> {
        let sshd = ["/usr/sbin/sshd", "/usr/bin/sshd"]
            .into_iter()
            .find(|p| Path::new(p).exists());
        let (Some(sshd), true) = (sshd, which("ssh")) else {
            skip(&format!(
                "{test}: openssh-server/openssh-client not installed (.ci/run installs them)"
            ));
            return None;
        };
        let dir = tempfile::tempdir().expect("temp dir");
        for k in ["host", "id"] {
            let st = Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                .arg(dir.path().join(k))
                .status()
                .expect("ssh-keygen");
            assert!(st.success());
        }
        fs::copy(
            dir.path().join("id.pub"),
            dir.path().join("authorized_keys"),
        )
        .unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let user = String::from_utf8_lossy(&Command::new("id").arg("-un").output().unwrap().stdout)
            .trim()
            .to_string();
        let cfg = dir.path().join("sshd_config");
        fs::write(
            &cfg,
            format!(
                "Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host\nAuthorizedKeysFile {d}/authorized_keys\n\
                 PermitRootLogin yes\nStrictModes no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
                 UsePAM no\nPidFile {d}/sshd.pid\nLogLevel ERROR\nPrintMotd no\nPermitUserEnvironment yes\n",
                d = dir.path().display()
            ),
        )
        .unwrap();
        let _ = fs::create_dir_all("/run/sshd");
        let child = Command::new(sshd)
            .args(["-D", "-e", "-f"])
            .arg(&cfg)
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start sshd");
        let server = SshServer {
            port,
            user,
            dir,
            child,
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "sshd did not start on port {port}"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Some(server)
    }

    /// The `-e` command that reaches this server.
    pub fn rsh(&self) -> String {
        format!(
            "ssh -p {} -i {} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR",
            self.port,
            self.dir.path().join("id").display()
        )
    }

    /// Set `vars` in the environment of every later login (over what
    /// sshd sets: `PATH`, `HOME`...), through the key's `environment=`
    /// options: a test's remote side then finds what it needs, and writes
    /// nothing of the real user's (`HOME`, `XDG_CACHE_HOME`).
    pub fn set_env(&self, vars: &[(&str, &str)]) {
        let key = fs::read_to_string(self.dir.path().join("id.pub")).unwrap();
        let opts: Vec<String> = vars
            .iter()
            .map(|(k, v)| {
                assert!(!v.contains(['"', '\\', '\n']), "{v:?}");
                format!("environment=\"{k}={v}\"")
            })
            .collect();
        let line = if opts.is_empty() {
            key
        } else {
            format!("{} {key}", opts.join(","))
        };
        fs::write(self.dir.path().join("authorized_keys"), line).unwrap();
    }

    /// `user@127.0.0.1:path`.
    pub fn remote(&self, path: &Path) -> String {
        format!("{}@127.0.0.1:{}", self.user, path.display())
    }
}

impl Drop for SshServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A ferry run with `args`, SIGKILLed after `ms` milliseconds (what it
/// leaves is the point).
pub fn killed_after(args: &[&str], ms: u64) {
    let mut c = Command::new(ferry_bin()).args(args).spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(ms));
    let _ = c.kill();
    let _ = c.wait();
}

pub fn which(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

impl SshServer {
    /// The sshd's process id: the processes it starts for a login descend
    /// from it.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// Whether every path is partial state of an interrupted run
/// (`.NAME.ferry-partial`, `.NAME.ferry-journal`), kept by design.
pub fn only_partial_state(paths: &[PathBuf]) -> bool {
    paths.iter().all(|p| {
        let n = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        n.starts_with('.') && (n.ends_with(".ferry-partial") || n.ends_with(".ferry-journal"))
    })
}

/// The data extents of `path` (`SEEK_DATA`/`SEEK_HOLE`), for files too big
/// to read whole.
pub fn data_extents(path: &Path) -> Vec<(u64, u64)> {
    use rustix::fs::SeekFrom;
    let f = fs::File::open(path).unwrap();
    let size = f.metadata().unwrap().len();
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < size {
        let Ok(s) = rustix::fs::seek(&f, SeekFrom::Data(pos)) else {
            break;
        };
        let e = rustix::fs::seek(&f, SeekFrom::Hole(s)).unwrap();
        out.push((s, e));
        pos = e;
    }
    out
}

/// A sparse file of `size` bytes holding `pieces` (offset, bytes) and
/// holes elsewhere.
pub fn sparse_file(path: &Path, size: u64, pieces: &[(u64, Vec<u8>)]) {
    use std::os::unix::fs::FileExt;
    let f = fs::File::create(path).unwrap();
    f.set_len(size).unwrap();
    for (off, b) in pieces {
        f.write_all_at(b, *off).unwrap();
    }
}

/// `path` reads, at each of `pieces`' offsets, those bytes, and has data
/// nowhere else (what is outside reads as zeros).
pub fn holds_only(path: &Path, size: u64, pieces: &[(u64, Vec<u8>)]) {
    use std::os::unix::fs::FileExt;
    let f = fs::File::open(path).unwrap();
    assert_eq!(f.metadata().unwrap().len(), size, "{}", path.display());
    for (off, want) in pieces {
        let mut got = vec![0u8; want.len()];
        f.read_exact_at(&mut got, *off).unwrap();
        assert!(got == *want, "{}: bytes at {off} differ", path.display());
    }
    for (s, e) in data_extents(path) {
        // Data only around the pieces (filesystem blocks round them out),
        // or zeros.
        let near = pieces
            .iter()
            .any(|(off, b)| s < off + b.len() as u64 + 65536 && *off < e + 65536);
        let mut at = s;
        while !near && at < e {
            let mut buf = vec![0u8; (e - at).min(1 << 20) as usize];
            f.read_exact_at(&mut buf, at).unwrap();
            assert!(
                buf.iter().all(|&x| x == 0),
                "{}: data at {at}..{e}",
                path.display()
            );
            at += buf.len() as u64;
        }
    }
}
