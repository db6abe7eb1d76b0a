//! A link that goes down for 5 s: two network namespaces joined by a veth
//! pair (10.231.X.1 and .2, nothing else), sshd in one, ferry in the
//! other, the link shaped with tc so the transfer lasts.

use std::fs;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use crate::{assert_complete, finish, procs, say, Source, MARGIN, MIB};

const SIZE: usize = 512 << 20;

/// The two namespaces, their link, and the sshd in the server's: all of
/// it taken apart (by name and pid) when dropped, even after a panic.
struct Net {
    client: String,
    server: String,
    cdev: String,
    sdev: String,
    addr: String,
    user: String,
    dir: tempfile::TempDir,
    namespaces: Vec<String>,
    sshd: Option<Child>,
}

fn cmd(args: &[&str]) -> std::process::Output {
    Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn ok(args: &[&str]) {
    let out = cmd(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Net {
    fn new(test: &str) -> Option<Net> {
        if !is_root() {
            skip(&format!("{test} needs root for network namespaces"));
            return None;
        }
        for tool in ["ip", "tc", "ssh", "ssh-keygen"] {
            if !need(tool, test) {
                return None;
            }
        }
        if !Path::new("/usr/sbin/sshd").exists() {
            skip(&format!("{test}: /usr/sbin/sshd not installed"));
            return None;
        }
        let pid = std::process::id();
        let sub = pid % 250;
        let mut n = Net {
            client: format!("ferry-rs{pid}-c"),
            server: format!("ferry-rs{pid}-s"),
            cdev: format!("frc{pid}"),
            sdev: format!("frs{pid}"),
            addr: format!("10.231.{sub}.2"),
            user: String::from_utf8_lossy(&cmd(&["id", "-un"]).stdout)
                .trim()
                .to_string(),
            dir: tempfile::tempdir().unwrap(),
            namespaces: Vec::new(),
            sshd: None,
        };
        for ns in [n.client.clone(), n.server.clone()] {
            let out = cmd(&["ip", "netns", "add", &ns]);
            if !out.status.success() {
                skip(&format!(
                    "{test}: ip netns add: {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
                return None;
            }
            n.namespaces.push(ns);
        }
        let (c, s, cdev, sdev) = (&n.client, &n.server, &n.cdev, &n.sdev);
        ok(&[
            "ip", "link", "add", cdev, "type", "veth", "peer", "name", sdev,
        ]);
        ok(&["ip", "link", "set", cdev, "netns", c]);
        ok(&["ip", "link", "set", sdev, "netns", s]);
        let caddr = format!("10.231.{sub}.1/24");
        let saddr = format!("{}/24", n.addr);
        ok(&["ip", "-n", c, "addr", "add", &caddr, "dev", cdev]);
        ok(&["ip", "-n", s, "addr", "add", &saddr, "dev", sdev]);
        for (ns, dev) in [(c, cdev), (s, sdev)] {
            ok(&["ip", "-n", ns, "link", "set", dev, "up"]);
            ok(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        }
        // About 50 MB/s from the client: 512 MiB take 10 s or more.
        ok(&[
            "tc", "-n", c, "qdisc", "add", "dev", cdev, "root", "tbf", "rate", "400mbit", "burst",
            "256k", "latency", "50ms",
        ]);
        n.start_sshd();
        Some(n)
    }

    fn start_sshd(&mut self) {
        let d = self.dir.path();
        for k in ["host", "id"] {
            ok(&[
                "ssh-keygen",
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-f",
                p(&d.join(k)),
            ]);
        }
        fs::copy(d.join("id.pub"), d.join("authorized_keys")).unwrap();
        let cfg = d.join("sshd_config");
        fs::write(
            &cfg,
            format!(
                "Port 22\nListenAddress {a}\nHostKey {d}/host\nAuthorizedKeysFile {d}/authorized_keys\n\
                 PermitRootLogin yes\nStrictModes no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
                 UsePAM no\nPidFile {d}/sshd.pid\nLogLevel ERROR\nPrintMotd no\n",
                a = self.addr,
                d = d.display()
            ),
        )
        .unwrap();
        let _ = fs::create_dir_all("/run/sshd");
        self.sshd = Some(
            Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &self.server,
                    "/usr/sbin/sshd",
                    "-D",
                    "-e",
                    "-f",
                ])
                .arg(&cfg)
                .stderr(Stdio::null())
                .spawn()
                .expect("start sshd"),
        );
        // Up when a login from the client's side works.
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let mut c = self.in_client("ssh");
            let login = c
                .args(self.rsh().split(' ').skip(1))
                .args(["-o", "ConnectTimeout=2"])
                .arg(format!("{}@{}", self.user, self.addr))
                .arg("true")
                .output()
                .unwrap();
            if login.status.success() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no ssh login into the server namespace: {}",
                String::from_utf8_lossy(&login.stderr)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `program`, run in the client's namespace.
    fn in_client(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.client]).arg(program);
        c
    }

    fn rsh(&self) -> String {
        format!(
            "ssh -i {} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR",
            self.dir.path().join("id").display()
        )
    }

    fn remote(&self, path: &Path) -> String {
        format!("{}@{}:{}", self.user, self.addr, path.display())
    }

    /// Bytes the shaped link has carried from the client.
    fn sent(&self) -> u64 {
        let out = cmd(&[
            "tc",
            "-s",
            "-n",
            &self.client,
            "qdisc",
            "show",
            "dev",
            &self.cdev,
        ]);
        let text = String::from_utf8_lossy(&out.stdout);
        text.split_whitespace()
            .skip_while(|w| *w != "Sent")
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no Sent counter in: {text}"))
    }

    /// The server's end of the link, down or up.
    fn link(&self, up: bool) {
        let state = if up { "up" } else { "down" };
        ok(&["ip", "-n", &self.server, "link", "set", &self.sdev, state]);
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        if let Some(mut c) = self.sshd.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for ns in &self.namespaces {
            // Only this test's processes are in its namespaces.
            let pids = cmd(&["ip", "netns", "pids", ns]);
            for pid in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
                if let Ok(pid) = pid.parse() {
                    procs::signal(pid, "-KILL");
                }
            }
            let _ = cmd(&["ip", "netns", "del", ns]);
        }
        // A veth that never made it into a namespace.
        let _ = Command::new("ip")
            .args(["link", "del", &self.cdev])
            .stderr(Stdio::null())
            .status();
    }
}

pub fn link_down_for_5s(test: &str) {
    let Some(net) = Net::new(test) else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let src = Source::new(d.path().join("big"), 31, SIZE);
    fs::create_dir(d.path().join("dst")).unwrap();
    let dst = d.path().join("dst/big");
    let bin = ferry_bin();
    let base = net.sent();
    let start = Instant::now();
    let child = net
        .in_client(&bin)
        .args(["sync", "--retries", "3", "--timeout", "2", "--json"])
        .args(["-e", &net.rsh(), "--remote-ferry", p(&bin)])
        .arg(&src.path)
        .arg(net.remote(&dst))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Down for 5 s once 40% has crossed the link.
    let mut child = Some(child);
    while net.sent() - base < SIZE as u64 * 2 / 5 {
        let c = child.as_mut().unwrap();
        if c.try_wait().unwrap().is_some() || start.elapsed() > Duration::from_secs(120) {
            let r = finish(child.take().unwrap(), start, Duration::ZERO, "the run");
            panic!(
                "over before 40% crossed the link: {:?} {}\n{}",
                r.code, r.json, r.err
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let down_at = start.elapsed().as_secs_f64();
    net.link(false);
    std::thread::sleep(Duration::from_secs(5));
    net.link(true);
    let r = finish(
        child.take().unwrap(),
        start,
        Duration::from_secs(180),
        "the run across a link that went down",
    );
    say!(
        "{test}: link down at {down_at:.1} s for 5 s; exit {:?} after {:.1} s, {} reconnects, \
         wrote {} MiB, resumed {} MiB, bytes_wire {} MiB; {} MiB crossed the link",
        r.code,
        r.secs,
        r.json["reconnects"],
        r.json["bytes_written"].as_u64().unwrap_or(0) >> 20,
        r.json["bytes_resumed"].as_u64().unwrap_or(0) >> 20,
        r.json["bytes_wire"].as_u64().unwrap_or(0) >> 20,
        (net.sent() - base) / MIB
    );
    assert_complete(&r, &src, &dst, test);
    assert!(r.n("reconnects") >= 1, "{}", r.json);
    assert!(r.n("bytes_resumed") > 0, "{}", r.json);
    let written = r.n("bytes_written");
    assert!(written <= SIZE as u64 + MARGIN, "{}", r.json);
    // The last attempt wrote what the earlier one had not (a push learns
    // what the remote side wrote only from attempts that finished).
    let resumed = r.n("bytes_resumed");
    assert!(
        written + resumed >= SIZE as u64,
        "written {written} + resumed {resumed} < {SIZE}: {}",
        r.json
    );
}
