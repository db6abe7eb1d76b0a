"""The scale scenario's stream (part 3 in scale.py's docstring): the
--scale-stream-mib MiB of mixed data (shared with the stream scenario when
the sizes agree) through `ferry pipe` over ssh and `ferry send / recv`,
both at `-m 256M`, over the 1gbit link, each side's peak RSS recorded.
"""

from __future__ import annotations

import os

from . import data, verify
from .link import ADDR_B, NS_A, NS_B
from .measure import Server
from .runner import Ctx, Tool
from .scale_common import paired, q, remote_wrapper, rounds, timed_run

STREAM_BUFFER = "256M"  # the stream rows' -m
STREAM_BUFFER_MIB = 256

# -- stream -------------------------------------------------------------------------------

def stream_data(ctx: Ctx) -> str:
    """The stream scenario's mixed data (60% random, 40% text; same name,
    seed and parameters: shared with it when the sizes agree)."""
    n = ctx.sizes["scale_stream_mib"]
    return data.cached(ctx.data(f"stream-{n}M"), {"mib": n, "seed": 5}, lambda p: data.stream(p, n, 5))


def stream_rows(ctx: Ctx) -> list[tuple[Tool, str | None, bool]]:
    link = ctx.link
    out = []
    for f in [ctx.ferry] + ([ctx.base] if ctx.base else []):
        kind = "ferry" if f is ctx.ferry else "ferry-base"
        w, rss = remote_wrapper(ctx, f)
        js = "--json " if f.has_flag("pipe", "--json") else ""
        out.append((Tool(f"{f.name} pipe (ssh) -m {STREAM_BUFFER}", kind,
                         lambda s, d, f=f, w=w: (f"cat {s} | {q(f.path)} pipe -m {STREAM_BUFFER} {js}"
                                                 f"-e {q(link.ssh_cmd())} --remote-ferry {q(w)} "
                                                 f"{f.key_args('pipe')}{ADDR_B} -- sh -c {q('cat > ' + d)}"),
                         NS_A, form="pipe", env=f.key_env("pipe", link.env()), ferry=f), rss, False))
        js = "--json " if f.has_flag("send", "--json") else ""
        listen = "--listen " if f.has_flag("recv", "--listen") else ""
        out.append((Tool(f"{f.name} send / recv -m {STREAM_BUFFER}", kind,
                         lambda s, d, f=f: (f"cat {s} | {q(f.path)} send -m {STREAM_BUFFER} {js}"
                                            f"{f.key_args('send')}{ADDR_B}:7411"), NS_A,
                         servers=lambda s, d, f=f, listen=listen: [Server(
                             f"{q(f.path)} recv -m {STREAM_BUFFER} {f.key_args('recv')}{listen}{ADDR_B}:7411 "
                             f"> {q(d)}", ns=NS_B, port=7411, env=f.key_env("recv", link.env()))],
                         form="send-recv", env=f.key_env("send", link.env()), ferry=f), None, True))
    return paired(ctx, out)


def run_stream(ctx: Ctx, src: str) -> str:
    cname = f"stream {os.path.getsize(src) >> 20} MiB, 1gbit"
    ctx.link.shape("1gbit")
    try:
        for t, far, server, dst in rounds(ctx, cname, stream_rows(ctx), ".out"):
            timed_run(ctx, cname, t, src, dst, lambda: verify.same_file(src, dst), far=far, server=server)
            if os.path.exists(dst):
                os.unlink(dst)
    finally:
        ctx.link.shape("none")
    return cname
