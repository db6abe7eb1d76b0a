"""Small helpers shared by the suite: logging, running commands, sizes."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time

T0 = time.monotonic()
VERBOSE = False


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def debug(msg: str) -> None:
    if VERBOSE:
        log(msg)


def loud(msg: str) -> None:
    bar = "!" * 78
    print(f"\n{bar}\n{msg}\n{bar}\n", file=sys.stderr, flush=True)


def sh(cmd, check=True, capture=True, timeout=None, env=None, input=None):
    """Run an untimed helper command; returns CompletedProcess."""
    if isinstance(cmd, str):
        args = ["bash", "-c", cmd]
    else:
        args = list(cmd)
    debug("$ " + (cmd if isinstance(cmd, str) else shlex.join(args)))
    r = subprocess.run(
        args,
        check=False,
        capture_output=capture,
        text=True,
        timeout=timeout,
        env=env,
        input=input,
    )
    if check and r.returncode != 0:
        raise RuntimeError(
            f"command failed ({r.returncode}): {cmd}\n{(r.stderr or '')[-2000:]}"
        )
    return r


def which(name: str) -> str | None:
    return shutil.which(name)


def mib(n: float | None) -> str:
    return "-" if n is None else f"{n / (1 << 20):.1f}"


def slug(s: str) -> str:
    """s as a file-name part: runs of anything but letters and digits -> '-'."""
    return re.sub(r"[^A-Za-z0-9]+", "-", s).strip("-").lower()


def rm_rf(path: str) -> None:
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)


def is_root() -> bool:
    return os.geteuid() == 0


def sync_and_drop() -> bool:
    """`sync` then drop the page cache; False when not allowed (not root)."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False
