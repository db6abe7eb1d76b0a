"""One timed run: start the servers it needs (untimed, until they listen),
then the client; stop the clock when the client and every non-persistent
server have exited. CPU is user+sys from wait4() rusage of everything the
suite started (a shell's rusage includes the pipeline it waited for) plus
what the namespace's sshd reaped meanwhile (the remote side of ssh-based
tools). Peak RSS is the largest ru_maxrss among those processes; processes
that sshd spawns are counted in CPU but not in RSS."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field

from .link import Link, Procs
from .util import debug, sh, sync_and_drop


@dataclass
class Server:
    cmd: str
    ns: str | None = None
    port: int | None = None      # wait until something listens here
    persistent: bool = False     # does not exit by itself: SIGTERM after the client
    env: dict | None = None
    socket: str | None = None    # or wait until this unix socket accepts a connection


class ServerError(RuntimeError):
    """A server did not come up; carries its exit code and stderr."""

    def __init__(self, msg: str, rc: int | None, stderr: str):
        super().__init__(msg)
        self.rc, self.stderr = rc, stderr


@dataclass
class Run:
    rc: int = 0
    wall: float = 0.0
    cpu: float = 0.0
    cpu_client: float = 0.0
    cpu_servers: float = 0.0
    cpu_sshd: float = 0.0
    maxrss_kb: int | None = 0
    wire: int | None = None
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    extra: dict = field(default_factory=dict)


GNU_TIME = "/usr/bin/time" if os.access("/usr/bin/time", os.X_OK) else None


def _popen(cmd: str, ns: str | None, env, out, err, procs: Procs, rss_file: str | None = None):
    args = ["bash", "-c", cmd]
    if ns:
        args = ["ip", "netns", "exec", ns] + args
    if rss_file and GNU_TIME:
        args = [GNU_TIME, "-f", "%M", "-o", rss_file, "--"] + args
    debug(f"$ {'[' + ns + '] ' if ns else ''}{cmd}")
    return procs.add(subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out,
                                      stderr=err, env=env, start_new_session=True))


def _listening(ns: str | None, port: int) -> bool:
    args = ["ss", "-H", "-ltn", f"sport = :{port}"]
    if ns:
        args[1:1] = ["-N", ns]
    r = sh(args, check=False)
    return bool(r.stdout.strip())


def _accepting(path: str) -> bool:
    import socket
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def _rss_kib(path: str) -> int | None:
    if not GNU_TIME:
        return None
    try:
        with open(path) as f:
            lines = f.read().strip().splitlines()
        return int(lines[-1]) if lines else 0
    except (OSError, ValueError):
        return 0


def _reap(p, timeout: float | None):
    """wait4 with a deadline; returns (status, rusage) or None on timeout."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid == p.pid:
            p.returncode = os.waitstatus_to_exitcode(status)
            return status, ru
        if deadline is not None and time.monotonic() > deadline:
            return None
        time.sleep(0.005)


def timed(cmd: str, *, ns: str | None, env: dict | None, servers: list[Server],
          procs: Procs, link: Link | None, logdir: str, tag: str,
          timeout: float = 3600.0, drop: bool = True) -> Run:
    run = Run()
    out_path = os.path.join(logdir, f"{tag}.out")
    err_path = os.path.join(logdir, f"{tag}.err")
    started: list[tuple[Server, subprocess.Popen]] = []
    try:
        for i, s in enumerate(servers):
            serr_path = os.path.join(logdir, f"{tag}.server{i}.err")
            serr = open(serr_path, "w")
            p = _popen(s.cmd, s.ns, s.env or env, subprocess.DEVNULL, serr, procs,
                       os.path.join(logdir, f"{tag}.server{i}.rss"))
            started.append((s, p))
            if s.port or s.socket:
                deadline = time.monotonic() + 20
                while not (_listening(s.ns, s.port) if s.port else _accepting(s.socket)):
                    if p.poll() is not None or time.monotonic() > deadline:
                        serr.flush()
                        with open(serr_path) as f:
                            text = f.read()[-2000:]
                        last = (text.strip().splitlines() or [""])[-1]
                        raise ServerError(f"server did not listen on {s.port or s.socket}"
                                          f"{f' (exit {p.returncode})' if p.returncode is not None else ''}:"
                                          f" {s.cmd}: {last}", p.returncode, text)
                    time.sleep(0.02)
        if drop:
            sync_and_drop()
        wire0 = link.wire_bytes() if link and link.up else None
        sshd0 = link.sshd_children_cpu() if link else 0.0
        with open(out_path, "w") as out, open(err_path, "w") as err:
            t0 = time.monotonic()
            client = _popen(cmd, ns, env, out, err, procs, os.path.join(logdir, f"{tag}.rss"))
            r = _reap(client, timeout)
            if r is None:
                run.timed_out = True
                os.killpg(client.pid, signal.SIGKILL)
                r = _reap(client, None)
            status, ru = r
            procs.forget(client.pid)
            run.rc = client.returncode
            run.cpu_client = ru.ru_utime + ru.ru_stime
            run.maxrss_kb = _rss_kib(os.path.join(logdir, f"{tag}.rss"))
            for s, p in started:
                if s.persistent:
                    continue
                left = max(5.0, timeout - (time.monotonic() - t0))
                r = _reap(p, left)
                if r is None:
                    run.timed_out = True
                    os.killpg(p.pid, signal.SIGKILL)
                    r = _reap(p, None)
                procs.forget(p.pid)
                if p.returncode != 0 and run.rc == 0:
                    run.rc = 1000 + p.returncode
                run.cpu_servers += r[1].ru_utime + r[1].ru_stime
            run.wall = time.monotonic() - t0
        for s, p in started:
            if s.persistent:
                ru = procs.stop(p, tree=True)
                if ru is not None:
                    run.cpu_servers += ru.ru_utime + ru.ru_stime
        if link:
            link.sshd_idle()
            run.cpu_sshd = max(0.0, link.sshd_children_cpu() - sshd0)
        if wire0 is not None:
            run.wire = link.wire_bytes() - wire0
        run.cpu = run.cpu_client + run.cpu_servers + run.cpu_sshd
        for i in range(len(started)):
            srv = _rss_kib(os.path.join(logdir, f"{tag}.server{i}.rss"))
            if srv is not None:
                run.maxrss_kb = max(run.maxrss_kb or 0, srv)
    finally:
        for s, p in started:
            if p.returncode is None:
                procs.stop(p, grace=3.0, tree=True)
    with open(out_path) as f:
        run.stdout = f.read()[-20000:]
    with open(err_path) as f:
        run.stderr = f.read()[-4000:]
    return run


@dataclass
class Killed:
    """What a run that was killed part-way did (the resume scenario)."""
    killed: bool = False          # False: it exited (or timed out) before the kill point
    rc: int | None = None         # its exit status (-9 when killed)
    at_s: float = 0.0             # seconds from start to the kill (or its exit)
    delivered: int = 0            # progress() at the kill: bytes at the destination
    wire: int | None = None       # veth bytes from start to the kill
    remote_exit_s: float | None = None  # from the kill until sshd had no session left
    remote_gone: bool = True      # False: a far-side session still ran 60 s after the kill
    stderr: str = ""


def killed(cmd: str, *, ns: str | None, env: dict | None, procs: Procs, link: Link | None,
           logdir: str, tag: str, progress, at: int, timeout: float = 3600.0,
           poll: float = 0.005) -> Killed:
    """Start cmd like a timed run (caches dropped first), poll progress()
    (bytes at the destination) and SIGKILL the client's whole process group
    (the tool, its ssh, the wrappers) as soon as it reaches `at` bytes: a
    crash of the local side, which takes its ssh connection with it. Then
    wait until the far side is gone (sshd has no session left), as a user
    starting again after a crash would find it."""
    k = Killed()
    sync_and_drop()
    wire0 = link.wire_bytes() if link and link.up else None
    err_path = os.path.join(logdir, f"{tag}.err")
    with open(os.path.join(logdir, f"{tag}.out"), "w") as out, open(err_path, "w") as err:
        t0 = time.monotonic()
        client = _popen(cmd, ns, env, out, err, procs)
        try:
            while True:
                if client.poll() is not None:
                    break
                got = progress()
                if got >= at:
                    os.killpg(client.pid, signal.SIGKILL)
                    k.killed, k.delivered = True, got
                    break
                if time.monotonic() - t0 > timeout:
                    os.killpg(client.pid, signal.SIGKILL)
                    break
                time.sleep(poll)
            k.at_s = time.monotonic() - t0
            if wire0 is not None:
                k.wire = link.wire_bytes() - wire0
            client.wait()
        finally:
            if client.returncode is None:
                procs.stop(client, sig=signal.SIGKILL, tree=True)
            procs.forget(client.pid)
        k.rc = client.returncode
        if not k.killed:
            k.delivered = progress()
    t1 = time.monotonic()
    if link:
        k.remote_gone = link.sshd_idle(timeout=60.0)
        k.remote_exit_s = round(time.monotonic() - t1, 3)
    with open(err_path) as f:
        k.stderr = f.read()[-4000:]
    return k
