"""Which ways of running ferry this binary supports, found at run time.

Remote forms are being built while this suite exists, so each form is
probed once on a tiny input: a form whose subcommand is absent from
`ferry --help`, or whose probe exits with ferry's usage code (1), is
"n/a (not supported by this build)"; a probe that fails otherwise is
broken: its rows FAIL with the error ("probe failed: ...") and the suite
exits 1. Extra flags (an ssh command, a key) are passed only when the
subcommand's --help mentions them, so the suite follows the CLI as it lands.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import subprocess

from .link import ADDR_B, NS_A, NS_B, Link, Procs
from .measure import Server, ServerError, timed
from .util import log, loud, rm_rf, sh, slug, which
from . import verify

NOT_SUPPORTED = "not supported by this build"
NO_NBD_SERVER = "no NBD server (qemu-nbd or nbdkit) installed; bench/setup.sh"
NO_REMOTE_FERRY = "no --remote-ferry in this build: its far side would be the main binary"
QUIET_NA = (NOT_SUPPORTED, NO_NBD_SERVER, NO_REMOTE_FERRY)  # n/a reasons that are not probe failures
RECV_PORT = 7411
DAEMON_PORT = 7412


def nbd_unix_server(image: str, sock: str, ns: str | None = None) -> Server | None:
    """A read-only NBD export of a raw image on a unix socket, as an untimed
    server: qemu-nbd if installed, else nbdkit's file plugin; None if
    neither is. The URI for it is nbd_uri(sock)."""
    q = shlex.quote
    if which("qemu-nbd"):
        cmd = (f"rm -f {q(sock)}; exec qemu-nbd --read-only --persistent --shared=16 --format=raw "
               f"--socket={q(sock)} {q(image)}")
    elif which("nbdkit"):
        cmd = f"rm -f {q(sock)}; exec nbdkit -f -r -U {q(sock)} file file={q(image)}"
    else:
        return None
    return Server(cmd, ns, socket=sock, persistent=True)


def nbd_server_name() -> str:
    if which("qemu-nbd"):
        return "qemu-nbd --read-only --persistent --format=raw --socket=SOCK"
    return "nbdkit -r -U SOCK file" if which("nbdkit") else "none"


def nbd_uri(sock: str) -> str:
    return f"nbd+unix:///?socket={sock}"


def sock_path(workdir: str, name: str) -> str:
    """A unix socket path short enough for sun_path (108 bytes)."""
    d = os.path.join(workdir, "sock")
    if len(d) + len(name) > 100:
        d = os.path.join("/tmp", f"ferrybench-sock.{os.getuid()}")
    os.makedirs(d, exist_ok=True)
    return os.path.join(d, name)


# The forms whose far side is a ferry started over ssh (not recv, which
# the suite starts itself with this binary's path).
SSH_FORMS = {"remote": "sync", "remote-delta": "sync", "remote-direct": "sync", "nbd-remote": "sync",
             "pipe": "pipe"}


class Ferry:
    def __init__(self, path: str, workdir: str, name: str = "ferry"):
        """name: how rows and logs call this binary ("ferry", or
        "ferry@base" for the --ferry-base one)."""
        self.path = os.path.abspath(path)
        self.workdir = workdir
        self.name = name
        self.forms: dict[str, tuple[bool, str]] = {}
        self._help: dict[str, str] = {}
        self.key = secrets.token_hex(16)
        self.keyfile = os.path.join(workdir, f"{slug(name)}.key")
        with open(self.keyfile, "w") as f:
            f.write(self.key + "\n")
        os.chmod(self.keyfile, 0o600)

    # -- help parsing -------------------------------------------------------
    def help(self, sub: str | None = None) -> str:
        k = sub or ""
        if k not in self._help:
            args = [self.path] + ([sub] if sub else []) + ["--help"]
            r = subprocess.run(args, capture_output=True, text=True)
            self._help[k] = (r.stdout + r.stderr) if r.returncode == 0 else ""
        return self._help[k]

    def has_sub(self, sub: str) -> bool:
        top = self.help()
        m = re.search(r"Commands:\n(.*?)(\n\n|\Z)", top, re.S)
        block = m.group(1) if m else top
        return re.search(rf"^\s+{re.escape(sub)}\b", block, re.M) is not None

    def has_flag(self, sub: str, flag: str) -> bool:
        """Whether an option line of `ferry SUB --help` defines flag (clap
        style: `  -e, --rsh <CMD>  text`); mentions in prose do not count."""
        for line in self.help(sub).splitlines():
            spec = line.strip()
            if not spec.startswith("-"):
                continue
            spec = re.split(r"\s{2,}", spec)[0]
            for tok in spec.split(","):
                name = re.split(r"[\s=<\[]", tok.strip(), maxsplit=1)[0]
                if name == flag:
                    return True
        return False

    def version(self) -> str:
        r = subprocess.run([self.path, "--version"], capture_output=True, text=True)
        return r.stdout.strip()

    # -- command builders ----------------------------------------------------
    def rsh_args(self, sub: str, link: Link) -> str:
        """How to tell ferry which ssh to use, if it asks; otherwise the
        bench PATH has an `ssh` wrapper with our config."""
        out = ""
        for flag in ("-e", "--rsh", "--ssh"):
            if self.has_flag(sub, flag):
                out = f"{flag} {shlex.quote(link.ssh_cmd())} "
                break
        # the far side is this machine: point it at the binary under test
        if self.has_flag(sub, "--remote-ferry"):
            out += f"--remote-ferry {shlex.quote(self.path)} "
        return out

    def key_args(self, sub: str) -> str:
        if self.has_flag(sub, "--key-file"):
            return f"--key-file {shlex.quote(self.keyfile)} "
        if self.has_flag(sub, "--psk-file"):
            return f"--psk-file {shlex.quote(self.keyfile)} "
        if self.has_flag(sub, "--key"):
            return f"--key {self.key} "
        return ""

    def key_env(self, sub: str, base: dict) -> dict:
        env = dict(base)
        for var in set(re.findall(r"\bFERRY_[A-Z_]*(?:KEY|PSK)[A-Z_]*\b", self.help(sub))):
            env[var] = self.key
        env.setdefault("FERRY_KEY", self.key)
        return env

    def sync_cmd(self, args: str, remote_link: Link | None = None) -> str:
        rsh = self.rsh_args("sync", remote_link) if remote_link else ""
        return f"{shlex.quote(self.path)} sync {rsh}--json {args}"

    def pipe_cmd(self, producer: str, link: Link, remote_cmd: str, flags: str = "") -> str:
        """flags: more options for pipe, e.g. "--streams 1 " (with the space)."""
        rsh = self.rsh_args("pipe", link)
        js = "--json " if self.has_flag("pipe", "--json") else ""
        return (f"{producer} | {shlex.quote(self.path)} pipe {flags}{js}{rsh}{self.key_args('pipe')}"
                f"{ADDR_B} -- {remote_cmd}")

    def recv_server(self, out: str, env: dict) -> Server:
        listen = "--listen " if self.has_flag("recv", "--listen") else ""
        return Server(
            cmd=f"{shlex.quote(self.path)} recv {self.key_args('recv')}{listen}"
                f"{ADDR_B}:{RECV_PORT} > {shlex.quote(out)}",
            ns=NS_B, port=RECV_PORT, env=self.key_env("recv", env))

    def daemon_server(self, env: dict) -> Server:
        """`ferry serve --listen` in B, serving the whole filesystem (the
        bench's destinations are absolute paths), untimed."""
        return Server(
            cmd=f"exec {shlex.quote(self.path)} serve --listen {ADDR_B}:{DAEMON_PORT} --root / "
                f"--key-file {shlex.quote(self.keyfile)}",
            ns=NS_B, port=DAEMON_PORT, persistent=True, env=env)

    def daemon_args(self, args: str) -> str:
        """Push ARGS (`SRC B:DST`) to the daemon instead: `SRC ferry://B:PORT/DST`."""
        url = f"ferry://{ADDR_B}:{DAEMON_PORT}"
        return f"--key-file {shlex.quote(self.keyfile)} " + args.replace(f"{ADDR_B}:", url)

    def send_cmd(self, producer: str) -> str:
        js = "--json " if self.has_flag("send", "--json") else ""
        return (f"{producer} | {shlex.quote(self.path)} send {js}{self.key_args('send')}"
                f"{ADDR_B}:{RECV_PORT}")

    # -- probing -------------------------------------------------------------
    def _set(self, form: str, ok: bool, why: str = ""):
        self.forms[form] = (ok, why)
        if ok:
            log(f"{self.name}: form {form}: supported")
        elif why in QUIET_NA:
            log(f"{self.name}: form {form}: n/a ({why})")
        else:
            loud(f"{self.name}: form {form}: n/a (probe failed: {why})")

    def forms_json(self) -> dict:
        return {k: {"supported": v[0], "why": v[1]} for k, v in self.forms.items()}

    def pin_far_side(self):
        """For a binary that is not the bench PATH's `ferry` (--ferry-base):
        a form whose far side ferry starts over ssh measures this binary
        there only if the subcommand takes --remote-ferry; without it the far
        side would be the main binary, so the form is n/a."""
        for form, sub in SSH_FORMS.items():
            if self.forms.get(form, (False, ""))[0] and not self.has_flag(sub, "--remote-ferry"):
                self._set(form, False, NO_REMOTE_FERRY)

    def supported(self, form: str) -> tuple[bool, str]:
        return self.forms.get(form, (False, "not probed"))

    def _judge(self, form: str, r, check) -> None:
        text = (r.stderr or "") + (r.stdout or "")
        if re.search(r"not supported|unrecognized subcommand", text):
            self._set(form, False, NOT_SUPPORTED)
        elif r.rc == 1:
            last = (r.stderr.strip().splitlines() or ["?"])[-1]
            self._set(form, False, f"usage error (exit 1): {last[:200]}")
        elif r.timed_out:
            self._set(form, False, "timed out")
        elif r.rc != 0:
            first = (r.stderr.strip().splitlines() or ["?"])[-1]
            self._set(form, False, f"exit {r.rc}: {first[:200]}")
        else:
            ok, msg = check()
            if ok:
                self._set(form, True)
            else:
                # The form exists and ran, but copied wrong bytes: keep it
                # "supported" so its timed runs fail verification loudly.
                loud(f"{self.name}: form {form}: WRONG OUTPUT on the probe: {msg}")
                self.forms[form] = (True, f"wrong output on probe: {msg}")

    def probe(self, procs: Procs, link: Link | None, logdir: str):
        d = os.path.join(self.workdir, "probe")
        rm_rf(d)
        os.makedirs(os.path.join(d, "src", "sub"))
        for i in range(3):
            with open(os.path.join(d, "src", "sub", f"f{i}"), "wb") as f:
                f.write(os.urandom(100_000 + i))
        with open(os.path.join(d, "old"), "wb") as f:
            f.write(os.urandom(300_000))
        with open(os.path.join(d, "old"), "rb") as f:
            old = f.read()
        with open(os.path.join(d, "new"), "wb") as f:
            f.write(old[:150_000] + b"changed" + old[150_000:])
        src, new = os.path.join(d, "src"), os.path.join(d, "new")

        def run(form, cmd, ns=None, env=None, servers=()):
            return timed(cmd, ns=ns, env=env, servers=list(servers), procs=procs,
                         link=None, logdir=logdir, tag=f"probe-{slug(self.name)}-{form}", timeout=20, drop=False)

        if not self.has_sub("sync"):
            self._set("local", False, NOT_SUPPORTED)
        else:
            out = os.path.join(d, "out-local")
            r = run("local", self.sync_cmd(f"{src}/ {out}/"))
            self._judge("local", r, lambda: verify.same_tree(src, out))
            dst = os.path.join(d, "delta-local")
            sh(["cp", "--preserve=mode", os.path.join(d, "old"), dst])
            if self.has_flag("sync", "--delta"):
                r = run("local-delta", self.sync_cmd(f"--delta {new} {dst}"))
                self._judge("local-delta", r, lambda: verify.same_file(new, dst))
            else:
                self._set("local-delta", False, NOT_SUPPORTED)
        # An NBD export as the source: a 4 MiB raw image (200 KB of data at
        # 1 MiB, the rest a hole) served read-only on a unix socket.
        img = os.path.join(d, "nbd.img")
        with open(img, "wb") as f:
            f.truncate(4 << 20)
            f.seek(1 << 20)
            f.write(os.urandom(200_000))
        sock = sock_path(self.workdir, "probe-nbd.sock")
        nbd_srv = nbd_unix_server(img, sock)

        def judge_nbd(form, r, check):
            # a build without NBD sources takes the URI for a missing path
            err = r.stderr or ""
            if r.rc not in (0, 1) and "NBD" not in err and re.search(r"No such file|not found", err):
                self._set(form, False, NOT_SUPPORTED)
            else:
                self._judge(form, r, check)
        if not self.forms["local"][0]:
            self._set("nbd", False, NOT_SUPPORTED)
        elif nbd_srv is None:
            self._set("nbd", False, NO_NBD_SERVER)
        else:
            out = os.path.join(d, "out-nbd")
            try:
                r = run("nbd", self.sync_cmd(f"{shlex.quote(nbd_uri(sock))} {out}"), servers=[nbd_srv])
                judge_nbd("nbd", r, lambda: verify.same_file(img, out))
            except ServerError as e:
                self._set("nbd", False, f"NBD server did not start: {str(e)[:250]}")
        if link is None:
            for f in ("remote", "remote-delta", "remote-direct", "nbd-remote", "pipe", "send-recv", "daemon"):
                self.forms[f] = (False, "no link (netns unavailable)")
            return
        env = link.env()
        if not self.forms["local"][0]:
            self._set("remote", False, NOT_SUPPORTED)
            self._set("remote-delta", False, NOT_SUPPORTED)
            self._set("remote-direct", False, NOT_SUPPORTED)
        else:
            out = os.path.join(d, "out-remote")
            r = run("remote", self.sync_cmd(f"{src}/ {ADDR_B}:{out}/", link), NS_A, env)
            self._judge("remote", r, lambda: verify.same_tree(src, out))
            if self.forms["remote"][0] and self.has_flag("sync", "--delta"):
                dst = os.path.join(d, "delta-remote")
                sh(["cp", os.path.join(d, "old"), dst])
                r = run("remote-delta", self.sync_cmd(f"--delta {new} {ADDR_B}:{dst}", link), NS_A, env)
                self._judge("remote-delta", r, lambda: verify.same_file(new, dst))
            else:
                self._set("remote-delta", False, NOT_SUPPORTED)
            if self.forms["remote"][0] and self.has_flag("sync", "--direct"):
                out = os.path.join(d, "out-direct")
                r = run("remote-direct", self.sync_cmd(f"--direct {src}/ {ADDR_B}:{out}/", link), NS_A, env)
                self._judge("remote-direct", r, lambda: verify.same_tree(src, out))
            else:
                self._set("remote-direct", False, NOT_SUPPORTED)
        if self.forms["local"][0] and self.has_flag("serve", "--listen"):
            out = os.path.join(d, "out-daemon")
            try:
                r = run("daemon", self.sync_cmd(self.daemon_args(f"{src}/ {ADDR_B}:{out}/")), NS_A, env,
                        [self.daemon_server(env)])
                self._judge("daemon", r, lambda: verify.same_tree(src, out))
            except ServerError as e:
                self._set("daemon", False, f"daemon did not start: {str(e)[:250]}")
        else:
            self._set("daemon", False, NOT_SUPPORTED)
        if not self.forms["nbd"][0] or not self.forms["remote"][0]:
            why = self.forms["nbd"][1] if not self.forms["nbd"][0] else NOT_SUPPORTED
            self.forms["nbd-remote"] = (False, why)  # said once already, for nbd or remote
        else:
            out = os.path.join(d, "out-nbd-remote")
            srv = nbd_unix_server(img, sock, NS_A)
            try:
                r = run("nbd-remote", self.sync_cmd(f"{shlex.quote(nbd_uri(sock))} {ADDR_B}:{out}", link),
                        NS_A, env, [srv])
                judge_nbd("nbd-remote", r, lambda: verify.same_file(img, out))
            except ServerError as e:
                self._set("nbd-remote", False, f"NBD server did not start: {str(e)[:250]}")
        if self.has_sub("pipe"):
            out = os.path.join(d, "out-pipe")
            r = run("pipe", self.pipe_cmd(f"cat {new}", link, f"sh -c 'cat > {out}'"),
                    NS_A, self.key_env("pipe", env))
            self._judge("pipe", r, lambda: verify.same_file(new, out))
        else:
            self._set("pipe", False, NOT_SUPPORTED)
        if self.has_sub("send") and self.has_sub("recv"):
            out = os.path.join(d, "out-send")
            try:
                r = run("send-recv", self.send_cmd(f"cat {new}"), NS_A,
                        self.key_env("send", env), [self.recv_server(out, env)])
                self._judge("send-recv", r, lambda: verify.same_file(new, out))
            except ServerError as e:
                if re.search(r"not supported|unrecognized subcommand", e.stderr):
                    self._set("send-recv", False, NOT_SUPPORTED)
                else:
                    self._set("send-recv", False, str(e)[:300])
        else:
            self._set("send-recv", False, NOT_SUPPORTED)
