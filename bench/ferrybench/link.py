"""The emulated link: two network namespaces joined by a veth pair, shaped
with tc tbf (and a delay line for the long fat pipes), and a real sshd in
the receiving namespace.

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

# What each preset puts on both ends of the veth pair: a root tbf (egress,
# so each direction is shaped once; tbf needs burst >= rate/HZ-ish, too
# small a burst starves TCP: see field notes, 32kbit held 100mbit down to
# 10.3 MB/s), and for the long fat pipes a delay line as well. tbf's
# latency is the most it queues: 50 ms; on the long fat pipes 100 ms, a
# bottleneck buffer of one bandwidth-delay product (1 Gbit/s x 100 ms =
# 12.5 MB), the usual rule for a WAN router.
PRESETS = {
    "100mbit": ["rate", "100mbit", "burst", "512kbit", "latency", "50ms"],
    "1gbit": ["rate", "1gbit", "burst", "1mbit", "latency", "50ms"],
    "1gbit-100ms": ["rate", "1gbit", "burst", "1mbit", "latency", "100ms"],
    "1gbit-100ms-loss": ["rate", "1gbit", "burst", "1mbit", "latency", "100ms"],
    "none": None,
}
# Long fat pipes: one-way delay in ms (each direction, so the RTT is twice
# it) and the probability that a frame is lost (each direction). The
# kernels these VMs run have no sch_netem, so tbf paces each direction as
# for 1gbit and a delay line (delayline.py) in the receiving namespace
# holds what arrives on its veth end (iptables NFQUEUE in raw PREROUTING,
# up to 100000 packets: the default 1024 is below the ~8600 full frames
# that 100 ms hold at 1 Gbit/s, and would drop), releases it in order after
# the delay, and drops the lost ones: a bottleneck link, then the
# distance. On a kernel with netem the same link is `tc qdisc add dev DEV
# root netem rate 1gbit delay 50ms [loss 0.1%] limit 100000`, for studies
# by hand.
DELAY = {
    "1gbit-100ms": (50, 0.0),
    "1gbit-100ms-loss": (50, 0.001),
}
NFQUEUE = 0
DELAYLINE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "delayline.py")

# TCP payload bytes per second a preset lets through: tbf
# count each packet's length at the device, 1514 bytes for a full Ethernet
# frame (1500 MTU + 14 header), which carries 1448 bytes of TCP payload
# (1500 - 20 IP - 20 TCP - 12 timestamp option). So rate/8 * 1448/1514.
PAYLOAD_RATE = {
    "100mbit": 100e6 / 8 * 1448 / 1514,
    "1gbit": 1e9 / 8 * 1448 / 1514,
    "1gbit-100ms": 1e9 / 8 * 1448 / 1514,
    "1gbit-100ms-loss": 1e9 / 8 * 1448 / 1514,
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
        self.delaylines: list = []  # (namespace, Popen, counters file)
        self.delay_stats: dict = {}  # preset -> namespace -> a delay line's counters
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
        self.stop_delay()
        for ns, dev in ((NS_A, DEV_A), (NS_B, DEV_B)):
            sh(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], check=False)
            if PRESETS[preset]:
                sh(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf"] + PRESETS[preset])
        if preset in DELAY:
            self.start_delay(preset)
        self.preset = preset
        log(f"link: shaped to {preset}"
            + (f" (tbf {' '.join(PRESETS[preset])}, both directions" if PRESETS[preset] else " (unshaped veth")
            + (f"; delay line {DELAY[preset][0]} ms, loss {DELAY[preset][1]:.2%} each way" if preset in DELAY
               else "") + ")")

    # -- delay lines (long fat pipes) ---------------------------------------
    def start_delay(self, preset: str):
        """A delay line in each namespace for what arrives on its veth end,
        then the NFQUEUE rule that feeds it (the line must listen first: a
        queue without a listener drops every packet)."""
        import sys
        delay, loss = DELAY[preset]
        for ns, dev in ((NS_A, DEV_A), (NS_B, DEV_B)):
            out = os.path.join(self.tmp, f"delayline-{ns}.json")
            err = os.path.join(self.tmp, f"delayline-{ns}.err")
            p = self.procs.add(subprocess.Popen(
                ["ip", "netns", "exec", ns, sys.executable, DELAYLINE, "--queue", str(NFQUEUE),
                 "--delay-ms", str(delay), "--loss", str(loss)],
                stdin=subprocess.DEVNULL, stdout=open(out, "w"), stderr=open(err, "w")))
            self.delaylines.append((ns, p, out))
            for _ in range(250):  # bound: /proc/net/netfilter/nfnetlink_queue lists the queue
                r = sh(["ip", "netns", "exec", ns, "cat", "/proc/net/netfilter/nfnetlink_queue"], check=False)
                if any(ln.split()[:1] == [str(NFQUEUE)] for ln in r.stdout.splitlines()):
                    break
                if p.poll() is not None:
                    raise RuntimeError(f"delay line in {ns} exited {p.returncode}: {open(err).read()[-500:]}")
                time.sleep(0.02)
            else:
                raise RuntimeError(f"delay line in {ns} did not bind queue {NFQUEUE}")
            sh(["ip", "netns", "exec", ns, "iptables", "-t", "raw", "-A", "PREROUTING", "-i", dev,
                "-j", "NFQUEUE", "--queue-num", str(NFQUEUE)])

    def stop_delay(self):
        """Remove the rules, then end the lines (each lets what it holds
        go); their counters land in self.delay_stats[preset][namespace]."""
        if not self.delaylines:
            return
        for ns in (NS_A, NS_B):
            sh(["ip", "netns", "exec", ns, "iptables", "-t", "raw", "-F", "PREROUTING"], check=False)
        stats = self.delay_stats.setdefault(self.preset, {})
        for ns, p, out in self.delaylines:
            self.procs.stop(p)
            try:
                with open(out) as f:
                    stats[ns] = json.loads(f.read().strip().splitlines()[-1])
            except (OSError, ValueError, IndexError):
                stats[ns] = None
        self.delaylines = []

    def rtt_ms(self, n: int = 5) -> float | None:
        """Median round trip A -> B -> A by ping, user to user (-U: the
        kernel stamps a packet as it arrives, before the delay line holds
        it, so ping's usual figure leaves out the way back). None without
        ping."""
        if not which("ping"):
            return None
        r = sh(["ip", "netns", "exec", NS_A, "ping", "-n", "-U", "-c", str(n), "-i", "0.2", ADDR_B], check=False)
        import re
        import statistics
        rtts = [float(x) for x in re.findall(r"time=([0-9.]+) ms", r.stdout)]
        return statistics.median(rtts) if rtts else None

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
        if self.delaylines:
            self.stop_delay()
        if self.sshd is not None:
            self.procs.stop(self.sshd)
            self.sshd = None
        if self.up:
            self.remove_namespaces()
            self.up = False
            log("link: namespaces removed")
        import shutil
        shutil.rmtree(self.tmp, ignore_errors=True)  # keys, configs, sshd log
