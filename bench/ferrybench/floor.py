"""The floors the issues measure ferry against, and the figures they need:
the bytes a link must carry (random bytes raw, text at `zstd -1`) over
its payload rate, plus one ssh login timed like a tool's run; and the
medians of a case's verified runs. Owns the floor computations and their
notes under a scenario's table; the scenarios own the runs.
"""

from __future__ import annotations

import os
import subprocess
import threading

from . import data
from .link import ADDR_B, NS_A, PAYLOAD_RATE, PAYLOAD_TEXT
from .measure import timed
from .runner import Ctx
from .util import slug, which


def zstd1_size(chunks) -> int | None:
    """Bytes of `zstd -1` of the concatenated chunks (None without zstd)."""
    if not which("zstd"):
        return None
    p = subprocess.Popen(["zstd", "-1", "-q", "-c"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    out = [0]

    def count():
        while True:
            b = p.stdout.read(1 << 20)
            if not b:
                break
            out[0] += len(b)
    th = threading.Thread(target=count)
    th.start()
    for b in chunks:
        p.stdin.write(b)
    p.stdin.close()
    th.join()
    return out[0] if p.wait() == 0 else None


def sparse_mix(img: str) -> dict | None:
    """The image's random / text / zero byte counts (from the generator) and
    the zstd -1 size of its text extents, computed once and kept in the
    image's info file. None if the image has no layout record."""
    inf = data.info(img)
    if not inf or "bytes" not in inf:
        return None
    if "text_zstd1" not in inf:
        n = zstd1_size(data.read_extents(img, inf["extents"], "text"))
        if n is not None:
            data.set_info(img, text_zstd1=n)
            inf["text_zstd1"] = n
    b = inf["bytes"]
    return {"random": b["random"], "text": b["text"], "zero": b["zero"],
            "text_zstd1": inf.get("text_zstd1")}


def ssh_true(ctx: Ctx) -> str:
    """A bare login over the link, with the ssh command and options the
    suite gives rsync and ferry (`ssh -F cfg`: root@B, port 2207)."""
    return f"{ctx.link.ssh_cmd()} {ADDR_B} true"


def ssh_login_s(ctx: Ctx, scen: str, n: int = 3) -> tuple[float | None, list[float]]:
    """Median of n timed `ssh host true` over the current link, measured
    like a tool's run (caches dropped before each, namespace A)."""
    import statistics
    times = []
    for i in range(n):
        r = timed(ssh_true(ctx), ns=NS_A, env=ctx.link.env(), servers=[], procs=ctx.procs,
                  link=ctx.link, logdir=ctx.logdir, tag=f"{slug(scen)}-ssh-login-{i}",
                  timeout=ctx.sizes["timeout"])
        if r.rc == 0:
            times.append(round(r.wall, 4))
    return (statistics.median(times) if times else None), times


def medians(ctx: Ctx, scen: str, case: str, kind: str | None = "ferry") -> dict[str, float]:
    """{tool: median wall s} of the verified runs of one case."""
    from .report import summarize
    out = {}
    for (sc, c, name), rec in ctx.records.items():
        if sc == scen and c == case and (kind is None or rec["kind"] == kind):
            sm = summarize(rec)
            if sm:
                out[name] = sm["median"]
    return out


def sparse_floor(ctx: Ctx, img: str, login: float | None, login_runs: list) -> dict | None:
    """The issue's floor: (random bytes + zstd -1 size of the text bytes) /
    link payload rate + one ssh login. Written zeros and holes cost nothing."""
    mix = sparse_mix(img)
    rate = PAYLOAD_RATE.get(ctx.current_link)
    fl = {"link": ctx.current_link, "payload_rate_Bps": rate, "payload_rate_text": PAYLOAD_TEXT,
          "ssh_login_s": login, "ssh_login_runs_s": login_runs, "mix_bytes": mix, "floor_s": None}
    if mix is None or mix.get("text_zstd1") is None or rate is None or login is None:
        fl["why_none"] = ("no image layout" if mix is None else "zstd not installed"
                          if mix.get("text_zstd1") is None else "unshaped link" if rate is None
                          else "ssh login failed")
        return fl
    fl["bytes_to_send"] = mix["random"] + mix["text_zstd1"]
    fl["floor_s"] = round(fl["bytes_to_send"] / rate + login, 4)
    return fl


def floor_notes(ctx: Ctx, scen: str, case: str, fl: dict) -> None:
    M = 2 ** 20
    if fl["floor_s"] is None:
        ctx.note(scen, f"Floor: not computed ({fl.get('why_none')}).")
        return
    mix = fl["mix_bytes"]
    ctx.note(scen, (
        f"**Floor** (the issue's): (random {mix['random'] / M:.1f} MiB + text {mix['text'] / M:.1f} MiB "
        f"at `zstd -1` = {mix['text_zstd1'] / M:.1f} MiB) / link payload rate "
        f"{fl['payload_rate_Bps'] / 1e6:.2f} MB/s + one ssh login {fl['ssh_login_s']:.2f} s "
        f"(median of {len(fl['ssh_login_runs_s'])} `ssh host true` over the same link, caches dropped "
        f"as before every run) = **{fl['floor_s']:.2f} s**. Written zeros ({mix['zero'] / M:.1f} MiB) "
        f"and holes cost nothing. Payload rate for {fl['link']}: {fl['payload_rate_text']}."))
    ratios = {}
    rows = ["| ferry form | median s | floor s | × floor |", "|---|---|---|---|"]
    for name, med in medians(ctx, scen, case).items():
        ratios[name] = round(med / fl["floor_s"], 3)
        rows.append(f"| **{name}** | {med:.2f} | {fl['floor_s']:.2f} | {med / fl['floor_s']:.2f} |")
    fl["ferry_over_floor"] = ratios
    if ratios:
        ctx.note(scen, "\n".join(rows))


def tree_mix(root: str) -> dict:
    """The bench tree's random (.bin) and text (.txt) bytes, and the
    `zstd -1` size of its text files in walk order."""
    txt, rnd = [], 0
    for p in data.tree_files(root):
        if p.endswith(".txt"):
            txt.append(p)
        else:
            rnd += os.path.getsize(p)

    def chunks():
        for p in txt:
            with open(p, "rb") as f:
                yield f.read()
    return {"random": rnd, "text": sum(os.path.getsize(p) for p in txt), "zero": 0,
            "text_zstd1": zstd1_size(chunks())}


def tree_floor_notes(ctx: Ctx, root: str, case: str, login: float | None) -> None:
    """The tree's initial sync against the floor (random bytes + its text at
    `zstd -1`, over the payload rate, plus the login measured beside it as
    the `ssh host true` row) and against `rsync -az --zc=zstd`: the issue
    asks for within 5% of the one and at most 0.9x the other."""
    rate = PAYLOAD_RATE.get(ctx.current_link)
    if rate is None or login is None:
        return
    mix = tree_mix(root)
    if mix["text_zstd1"] is None:
        ctx.note("tree", "Floor: not computed (zstd not installed).")
        return
    M = 2 ** 20
    fl = {"link": ctx.current_link, "payload_rate_Bps": rate, "ssh_login_s": login, "mix_bytes": mix,
          "bytes_to_send": mix["random"] + mix["text_zstd1"]}
    fl["floor_s"] = round(fl["bytes_to_send"] / rate + login, 4)
    rz = medians(ctx, "tree", case, "peer").get("rsync -az --zc=zstd (ssh)")
    ferry = medians(ctx, "tree", case)
    # A daemon row logs in to no ssh: its floor is the bytes alone.
    own = {k: fl["floor_s"] - (login if "daemon" in k else 0.0) for k in ferry}
    fl["ferry_over_floor"] = {k: round(v / own[k], 3) for k, v in ferry.items()}
    fl["ferry_over_rsync_z"] = {k: round(v / rz, 3) for k, v in ferry.items()} if rz else {}
    ctx.extra.setdefault("tree", {})["floor"] = fl
    ctx.note("tree", (
        f"**Floor of the {case} sync** (the issue's): (random {mix['random'] / M:.1f} MiB + text "
        f"{mix['text'] / M:.1f} MiB at `zstd -1` = {mix['text_zstd1'] / M:.1f} MiB) / link payload rate "
        f"{rate / 1e6:.2f} MB/s + one ssh login {login:.2f} s (the `ssh host true` row) = "
        f"**{fl['floor_s']:.2f} s** (without the login for the daemon, which needs none). "
        f"Payload rate for {fl['link']}: {PAYLOAD_TEXT}."))
    rows = ["| ferry form | median s | floor s | × floor | × rsync -az --zc=zstd |", "|---|---|---|---|---|"]
    for k, v in ferry.items():
        rows.append(f"| **{k}** | {v:.2f} | {own[k]:.2f} | {v / own[k]:.2f} | "
                    + (f"{v / rz:.2f} |" if rz else "- |"))
    ctx.note("tree", "\n".join(rows))
