"""The emulated link: two network namespaces joined by a veth pair, shaped
with tc tbf, and a real sshd in the receiving namespace.

Everything here is created by the suite and removed by it (by pid and by
namespace name) on exit, Ctrl-C or error. No address outside the two
namespaces is ever used: A is 10.203.0.1, B is 10.203.0.2.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time

from .util import debug, log, sh, which

NS_A = "ferrybench-a"
NS_B = "ferrybench-b"
DEV_A = "fbench-a"
DEV_B = "fbench-b"
ADDR_A = "10.203.0.1"
ADDR_B = "10.203.0.2"
SSH_PORT = 2207

# rate, burst (tbf needs burst >= rate/HZ-ish; too small a burst starves
# TCP: see field notes, 32kbit held 100mbit down to 10.3 MB/s)
PRESETS = {
    "100mbit": ("100mbit", "512kbit"),
    "1gbit": ("1gbit", "1mbit"),
    "none": None,
}

# TCP payload bytes per second a tbf preset lets through: tbf counts each
# packet's length at the device, 1514 bytes for a full Ethernet frame (1500
# MTU + 14 header), which carries 1448 bytes of TCP payload (1500 - 20 IP -
# 20 TCP - 12 timestamp option). So rate/8 * 1448/1514.
PAYLOAD_RATE = {
    "100mbit": 100e6 / 8 * 1448 / 1514,
    "1gbit": 1e9 / 8 * 1448 / 1514,
    "none": None,
}
PAYLOAD_TEXT = "tbf rate / 8 × 1448/1514 (TCP payload with timestamps per 1514-byte Ethernet frame)"


class Procs:
    """Every long-lived process the suite starts, so cleanup can end them
    by pid (never by name). Pids are mirrored to a file that bench/run.sh's
    trap reads if Python itself dies hard."""

    def __init__(self, pidfile: str | None):
        self.pidfile = pidfile
        self.live: dict[int, subprocess.Popen] = {}

    def _write(self):
        if self.pidfile:
            with open(self.pidfile, "w") as f:
                f.write("".join(f"{p}\n" for p in self.live))

    def add(self, p: subprocess.Popen) -> subprocess.Popen:
        self.live[p.pid] = p
        self._write()
        return p

    def forget(self, pid: int) -> None:
        self.live.pop(pid, None)
        self._write()

    @staticmethod
    def descendants(pid: int) -> list[int]:
        out, todo = [], [pid]
        while todo:
            q = todo.pop()
            try:
                with open(f"/proc/{q}/task/{q}/children") as f:
                    kids = [int(x) for x in f.read().split()]
            except OSError:
                kids = []
            out += kids
            todo += kids
        return out

    def stop(self, p: subprocess.Popen, sig=signal.SIGTERM, grace=5.0, tree=False):
        """Signal one process we started and reap it; returns its rusage.
        tree=True signals its descendants first (found by pid through
        /proc), so a wrapper like GNU time sees its child exit and still
        reports; the process itself is signalled if it has not exited
        after half the grace time, and everything is killed after it."""
        ru = None

        def signal_all(pids, s):
            for pid in pids:
                try:
                    os.kill(pid, s)
                except ProcessLookupError:
                    pass
        if p.returncode is None:
            kids = self.descendants(p.pid) if tree else []
            signal_all(kids or [p.pid], sig)
            t0 = time.monotonic()
            signalled_self = not kids
            while True:
                pid, status, ru = os.wait4(p.pid, os.WNOHANG)
                if pid == p.pid:
                    p.returncode = os.waitstatus_to_exitcode(status)
                    break
                waited = time.monotonic() - t0
                if not signalled_self and waited > grace / 2:
                    signal_all([p.pid], sig)
                    signalled_self = True
                if waited > grace:
                    signal_all(self.descendants(p.pid) + [p.pid], signal.SIGKILL)
                    _, status, ru = os.wait4(p.pid, 0)
                    p.returncode = os.waitstatus_to_exitcode(status)
                    break
                time.sleep(0.02)
        self.forget(p.pid)
        return ru

    def stop_all(self):
        for p in list(self.live.values()):
            try:
                self.stop(p, grace=2.0, tree=True)
            except ChildProcessError:
                self.forget(p.pid)


def netns_available() -> tuple[bool, str]:
    if os.geteuid() != 0:
        return False, "not root"
    if not which("ip"):
        return False, "iproute2 (ip) not installed"
    r = sh(["ip", "netns", "add", "ferrybench-probe"], check=False)
    if r.returncode != 0:
        return False, "ip netns add failed: " + r.stderr.strip()
    sh(["ip", "netns", "del", "ferrybench-probe"], check=False)
    return True, ""


class Link:
    def __init__(self, workdir: str, procs: Procs):
        self.procs = procs
        self.tmp = tempfile.mkdtemp(prefix="ferrybench-ssh.", dir=workdir)
        self.sshd: subprocess.Popen | None = None
        self.preset = None
        self.ssh_config = os.path.join(self.tmp, "ssh_config")
        self.bin = os.path.join(self.tmp, "bin")
        self.up = False

    # -- namespaces -------------------------------------------------------
    @staticmethod
    def remove_namespaces():
        for ns in (NS_A, NS_B):
            sh(["ip", "netns", "del", ns], check=False)

    def create(self):
        self.remove_namespaces()  # a stale pair from a run that was killed
        self.up = True
        sh(["ip", "netns", "add", NS_A])
        sh(["ip", "netns", "add", NS_B])
        sh(["ip", "link", "add", DEV_A, "netns", NS_A, "type", "veth",
            "peer", "name", DEV_B, "netns", NS_B])
        for ns, dev, addr in ((NS_A, DEV_A, ADDR_A), (NS_B, DEV_B, ADDR_B)):
            sh(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev])
            sh(["ip", "-n", ns, "link", "set", "lo", "up"])
            sh(["ip", "-n", ns, "link", "set", dev, "up"])
        log(f"link: namespaces {NS_A} ({ADDR_A}) <-> {NS_B} ({ADDR_B}) up")

    def shape(self, preset: str):
        if preset == self.preset:
            return
        for ns, dev in ((NS_A, DEV_A), (NS_B, DEV_B)):
            sh(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], check=False)
            if PRESETS[preset]:
                rate, burst = PRESETS[preset]
                sh(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf",
                    "rate", rate, "burst", burst, "latency", "50ms"])
        self.preset = preset
        log(f"link: shaped to {preset}"
            + (f" (tbf rate {PRESETS[preset][0]} burst {PRESETS[preset][1]} latency 50ms, both directions)"
               if PRESETS[preset] else " (unshaped veth)"))

    def wire_bytes(self) -> int:
        """rx+tx bytes seen by A's end of the veth pair."""
        r = sh(["ip", "-j", "-s", "-n", NS_A, "link", "show", "dev", DEV_A])
        st = json.loads(r.stdout)[0]["stats64"]
        return int(st["rx"]["bytes"]) + int(st["tx"]["bytes"])

    # -- sshd -------------------------------------------------------------
    def start_sshd(self, ferry: str):
        os.makedirs(self.bin, exist_ok=True)
        os.makedirs("/run/sshd", exist_ok=True)  # privilege separation dir
        hk = os.path.join(self.tmp, "host_ed25519")
        ck = os.path.join(self.tmp, "client_ed25519")
        sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", hk])
        sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", ck])
        auth = os.path.join(self.tmp, "authorized_keys")
        with open(ck + ".pub") as src, open(auth, "w") as dst:
            dst.write(src.read())
        os.chmod(auth, 0o600)
        # `ferry` (for the remote side of ferry's ssh forms) and an `ssh`
        # that always uses our config (for tools that call plain `ssh`).
        fl = os.path.join(self.bin, "ferry")
        if os.path.lexists(fl):
            os.unlink(fl)
        os.symlink(os.path.abspath(ferry), fl)
        with open(os.path.join(self.bin, "ssh"), "w") as f:
            f.write(f'#!/bin/sh\nexec /usr/bin/ssh -F "{self.ssh_config}" "$@"\n')
        os.chmod(os.path.join(self.bin, "ssh"), 0o755)
        path = f"{self.bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        cfg = os.path.join(self.tmp, "sshd_config")
        with open(cfg, "w") as f:
            f.write(
                f"ListenAddress {ADDR_B}\nPort {SSH_PORT}\nHostKey {hk}\n"
                f"AuthorizedKeysFile {auth}\nPermitRootLogin prohibit-password\n"
                "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
                "UsePAM no\nStrictModes no\nUseDNS no\nPrintMotd no\n"
                f"PidFile {self.tmp}/sshd.pid\nSubsystem sftp internal-sftp\n"
                f"SetEnv PATH={path}\nLogLevel ERROR\n"
            )
        with open(self.ssh_config, "w") as f:
            f.write(
                f"Host {ADDR_B} ferrybench-b\n  HostName {ADDR_B}\n  Port {SSH_PORT}\n"
                f"  User root\n  IdentityFile {ck}\n  IdentitiesOnly yes\n"
                "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"
                "  LogLevel ERROR\n  BatchMode yes\n"
            )
        sshd = which("sshd") or "/usr/sbin/sshd"
        self.sshd = self.procs.add(subprocess.Popen(
            ["ip", "netns", "exec", NS_B, sshd, "-D", "-e", "-f", cfg],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(self.tmp, "sshd.log"), "w"),
        ))
        # `ip netns exec` execs sshd, so the pid is sshd's own.
        for _ in range(100):
            if self.sshd.poll() is not None:
                break  # sshd exited: no point waiting
            r = sh(["ip", "netns", "exec", NS_A, "ssh", "-F", self.ssh_config,
                    ADDR_B, "echo", "$PATH"], check=False, timeout=20)
            if r.returncode == 0:
                if self.bin not in r.stdout:
                    log("link: warning: sshd sessions do not get the bench PATH; "
                        "ferry's remote side may not be found")
                log(f"link: sshd up in {NS_B} on {ADDR_B}:{SSH_PORT}")
                return
            time.sleep(0.1)
        raise RuntimeError("sshd did not come up: " + open(
            os.path.join(self.tmp, "sshd.log")).read()[-1000:])

    def sshd_children_cpu(self) -> float:
        """user+sys seconds of everything sshd has reaped (sessions)."""
        if not self.sshd:
            return 0.0
        with open(f"/proc/{self.sshd.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        hz = os.sysconf("SC_CLK_TCK")
        return (int(fields[13]) + int(fields[14])) / hz  # cutime, cstime

    def sshd_idle(self, timeout=10.0) -> bool:
        """Wait until sshd has no session children (their work is done and
        their CPU is in cutime)."""
        if not self.sshd:
            return True
        path = f"/proc/{self.sshd.pid}/task/{self.sshd.pid}/children"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with open(path) as f:
                    if not f.read().strip():
                        return True
            except OSError:
                return True
            time.sleep(0.02)
        debug("sshd still has children after timeout")
        return False

    def ssh_cmd(self) -> str:
        return f"/usr/bin/ssh -F {self.ssh_config}"

    def env(self) -> dict:
        e = dict(os.environ)
        e["PATH"] = self.bin + ":" + e.get("PATH", "/usr/bin:/bin")
        return e

    def close(self):
        if self.sshd is not None:
            self.procs.stop(self.sshd)
            self.sshd = None
        if self.up:
            self.remove_namespaces()
            self.up = False
            log("link: namespaces removed")
        import shutil
        shutil.rmtree(self.tmp, ignore_errors=True)  # keys, configs, sshd log
