"""Shared by the scale scenario's modules (scale_tree, scale_sparse,
scale_stream, scale): the scenario's name and units, and the per-side
peak RSS of a run (GNU time around the local command; around the far side
through a `--remote-ferry` wrapper script, `rsync --rsync-path` or a
server), recorded in the run by timed_run.
"""

from __future__ import annotations

import os
import shlex

from .ferry_forms import Ferry
from .measure import GNU_TIME
from .runner import Ctx, Tool, one_run, record, rotate, usable
from .util import slug

q = shlex.quote
SCEN = "scale"
MiB = 1 << 20
KiB = 1 << 10


# -- the far side's peak RSS -------------------------------------------------------

def remote_wrapper(ctx: Ctx, f: Ferry) -> tuple[str, str]:
    """(a script for --remote-ferry that runs f under GNU time, the file
    where it writes the far side's peak RSS in KiB)."""
    d = os.path.join(ctx.work, "scale-wrap")
    os.makedirs(d, exist_ok=True)
    w, rss = os.path.join(d, f"{slug(f.name)}.sh"), os.path.join(d, f"{slug(f.name)}.rss")
    with open(w, "w") as fh:
        fh.write(f"#!/bin/sh\nexec {GNU_TIME or '/usr/bin/time'} -f %M -o {q(rss)} {q(f.path)} \"$@\"\n")
    os.chmod(w, 0o755)
    return w, rss


def paired(ctx: Ctx, rows: list) -> list:
    """Rows (a Tool first in each) with every base binary's row named as the
    twin of the main binary's row of the same form, for the comparison
    table; the scale rows are built per binary, not through base.twins."""
    for row in rows:
        t = row[0]
        if ctx.base is not None and t.ferry is ctx.base and t.name.startswith(ctx.base.name):
            t.twin = ctx.ferry.name + t.name[len(ctx.base.name):]
    return rows


def rsync_rss_path(ctx: Ctx) -> str:
    d = os.path.join(ctx.work, "scale-wrap")
    os.makedirs(d, exist_ok=True)
    return os.path.join(d, "rsync.rss")


def read_kib(path: str) -> int | None:
    try:
        with open(path) as f:
            lines = f.read().strip().splitlines()
        return int(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None


def last_run(ctx: Ctx, case: str, t: Tool) -> dict | None:
    runs = ctx.records[(SCEN, case, t.name)]["runs"]
    return runs[-1] if runs else None


def note_rss(ctx: Ctx, case: str, t: Tool, n0: int, far: str | None = None, server: bool = False) -> None:
    """Per-side peak RSS of the run one_run just made (if it made one):
    local_rss_kib = the client command's largest process (GNU time around
    it, without the servers), remote_rss_kib = the far side's (the wrapper's
    file, or a server's GNU time)."""
    rec = ctx.records[(SCEN, case, t.name)]
    if len(rec["runs"]) <= n0:
        return
    run = rec["runs"][-1]
    tag = f"{slug(SCEN)}-{slug(case)}-{slug(t.name)}-{n0}"
    run["local_rss_kib"] = read_kib(os.path.join(ctx.logdir, f"{tag}.rss"))
    if far:
        run["remote_rss_kib"] = read_kib(far)
    elif server:
        run["remote_rss_kib"] = read_kib(os.path.join(ctx.logdir, f"{tag}.server0.rss"))


def timed_run(ctx: Ctx, case: str, t: Tool, src: str, dst: str, check, far: str | None = None,
              server: bool = False, drop: bool = True, image: bool = False) -> None:
    rec = record(ctx, SCEN, case, t)
    n0 = len(rec["runs"])
    if far and os.path.exists(far):
        os.unlink(far)
    one_run(ctx, SCEN, case, t, src, dst, check, image=image, drop=drop)
    note_rss(ctx, case, t, n0, far, server)


def rounds(ctx: Ctx, cname: str, rows, ext: str):
    """The runs of case cname: (tool, far side, server, dst) for each usable
    row, round by round in rotating order, dst (its own file, suffix ext)
    removed before each."""
    ok = {t.name for t in usable(ctx, SCEN, [cname], [t for t, _, _ in rows])}
    d = os.path.join(ctx.work, "dst", SCEN)
    os.makedirs(d, exist_ok=True)
    for rnd in range(ctx.runs):
        for t, far, server in rotate([r for r in rows if r[0].name in ok], rnd):
            dst = os.path.join(d, slug(t.name) + ext)
            if os.path.exists(dst):
                os.unlink(dst)
            yield t, far, server, dst
