"""The lfp scenario (issue 19): long fat pipes. 1 Gbit/s with 100 ms RTT
(link preset 1gbit-100ms), and the same with 0.1% of the frames lost each
way (1gbit-100ms-loss). One TCP connection cannot fill such a pipe: its
window (the sending buffer, tcp_wmem's maximum) over 100 ms caps it, and
each loss cuts it back for many round trips. ferry opens several.

Per link, measured in the same run on the same link:
- the references: iperf3 -P 8 and single-stream iperf3 (goodput at the
  receiver, from iperf3 --json), each --runs times, alternating;
- case "stream": a file of random bytes piped to a file in B: `ferry pipe`
  (direct TCP connections keyed over ssh) with its automatic number of
  connections and with `--streams 1`, against `mbuffer -O` / `-I` (one TCP
  connection) and `zstd -1 -T0 | ssh 'zstd -d > out'`;
- case "file": the same file synced to B with `ferry sync --direct`,
  default and `--streams 1`, against rsync over ssh.
Every copy is compared byte for byte with the source; a ferry row that
fails or does not verify fails the bench. A peer run slower than
PEER_FLOOR on average is stopped and its row reported as capped, never a
failure. The figures (goodput, ratios to iperf3 -P 8, default / --streams 1)
are a table under the scenario's and in results.json under meta.extra.lfp.
"""

from __future__ import annotations

import json
import os
import shlex
import statistics

from . import data
from .base import twins
from .ferry_forms import Ferry
from .link import ADDR_B, DELAY, NS_A, NS_B
from .measure import Server, timed
from .report import esc, summarize
from .runner import Ctx, Tool, record, run_file_case
from .scenarios import MBUF, MBUF_PORT, file_to_b
from .util import log, loud, sh, slug, which

q = shlex.quote
SCEN = "lfp"
IPERF_PORT = 5211
IPERF_S = 15          # each iperf3 run: long enough to leave slow start (~1 s at 100 ms) far behind
PEER_FLOOR = 5e6      # bytes/s: a peer run that would average less is stopped (peer_cap)
PEER_GRACE = 30.0     # s: added to size / PEER_FLOOR (logins, slow start)
RTT_OK = (90.0, 125.0)  # ms: the presets' RTT is 100 ms; outside this the link is broken
# The "Done when" (reported; a ferry row that fails verification
# is what fails the bench): on the lossless link each default form reaches
# this share of iperf3 -P 8's goodput; with loss, default / --streams 1.
T_OF_P8, T_LOSS_X = 0.85, 3.0
STREAM, FILE = "stream", "file"


def lfp_file(ctx: Ctx) -> str:
    """--lfp-mib MiB of random bytes: the stream scenario's incompressible
    data, same name, seed and parameters, so the two share the file when
    their sizes agree."""
    n = ctx.sizes["lfp_mib"]
    return data.cached(ctx.data(f"stream-random-{n}M"), {"mib": n, "seed": 6, "kind": "random"},
                       lambda p: data.random_stream(p, n, 6))


def peer_cap(size: int) -> float:
    """Seconds after which a peer's run is stopped and its row capped."""
    return size / PEER_FLOOR + PEER_GRACE


def case_name(kind: str, preset: str) -> str:
    return f"{kind}, {preset}"


# -- references ------------------------------------------------------------------

def iperf3(ctx: Ctx, preset: str, streams: int, i: int) -> dict:
    """One iperf3 run A -> B: {"goodput_Bps", "retransmits", "rc", "error"};
    goodput is the receiver's bytes / its seconds (end.sum_received)."""
    tag = f"{SCEN}-{slug(preset)}-iperf3-P{streams}-{i}"
    srv = Server(f"exec iperf3 -s -1 -B {ADDR_B} -p {IPERF_PORT}", NS_B, IPERF_PORT)
    cmd = f"iperf3 -c {ADDR_B} -p {IPERF_PORT} -t {IPERF_S} -P {streams} -i 0 --json"
    try:
        r = timed(cmd, ns=NS_A, env=ctx.link.env(), servers=[srv], procs=ctx.procs, link=ctx.link,
                  logdir=ctx.logdir, tag=tag, timeout=IPERF_S + 60, drop=False)
    except RuntimeError as e:
        return {"goodput_Bps": None, "rc": None, "error": str(e)[:300]}
    out = {"rc": r.rc, "wall_s": round(r.wall, 3), "goodput_Bps": None, "error": ""}
    try:
        with open(os.path.join(ctx.logdir, f"{tag}.out")) as f:  # the whole JSON (r.stdout is its tail)
            j = json.load(f)
        got = j["end"]["sum_received"]
        out["goodput_Bps"] = round(got["bytes"] / got["seconds"])
        out["retransmits"] = j["end"].get("sum_sent", {}).get("retransmits")
    except (OSError, ValueError, KeyError, ZeroDivisionError) as e:
        out["error"] = f"exit {r.rc}: {(r.stderr.strip().splitlines() or [repr(e)])[-1][:200]}"
    return out


def references(ctx: Ctx, preset: str) -> dict:
    """iperf3 -P 8 and single-stream, --runs times each, alternating."""
    runs = {"P8": [], "single": []}
    if not which("iperf3"):
        return {"why_none": "iperf3 not installed (bench/setup.sh)", **runs}
    for i in range(ctx.runs):
        for key, n in (("P8", 8), ("single", 1)) if i % 2 == 0 else (("single", 1), ("P8", 8)):
            res = iperf3(ctx, preset, n, i)
            runs[key].append(res)
            log(f"{SCEN} / {preset} / iperf3 -P {n}: " + (f"{res['goodput_Bps'] / 1e6:.1f} MB/s"
                if res["goodput_Bps"] else f"FAILED ({res['error']})"))
    out = dict(runs)
    for key in runs:
        good = [x["goodput_Bps"] for x in runs[key] if x["goodput_Bps"]]
        out[key + "_Bps"] = statistics.median(good) if good else None
    return out


# -- the rows --------------------------------------------------------------------

def stream_tools(ctx: Ctx, size: int) -> list[Tool]:
    link, cap = ctx.link, peer_cap(size)
    ssh = link.ssh_cmd()

    def pipe(f: Ferry, name: str, flags: str) -> Tool:
        return Tool(name, "ferry", lambda s, d: f.pipe_cmd(f"cat {s}", link, f"sh -c {q('cat > ' + d)}", flags),
                    NS_A, form="pipe", env=f.key_env("pipe", link.env()),
                    flags=(("pipe", "--streams"),) if flags else ())
    return [
        Tool("mbuffer -O / -I", "peer", lambda s, d: f"cat {s} | {MBUF} -O {ADDR_B}:{MBUF_PORT}", NS_A,
             servers=lambda s, d: [Server(f"{MBUF} -I {MBUF_PORT} -o {q(d)}", NS_B, MBUF_PORT)],
             needs=("mbuffer",), cap=cap),
        Tool("zstd -1 -T0 | ssh 'zstd -d > out'", "peer",
             lambda s, d: f"cat {s} | zstd -1 -T0 -q -c | {ssh} {ADDR_B} {q('zstd -d -q -c > ' + d)}", NS_A,
             needs=("ssh", "zstd"), cap=cap),
        *twins(ctx, lambda f: [pipe(f, "ferry pipe", ""), pipe(f, "ferry pipe --streams 1", "--streams 1 ")]),
    ]


def file_tools(ctx: Ctx, size: int) -> list[Tool]:
    link, cap = ctx.link, peer_cap(size)

    def sync(f: Ferry, name: str, flags: str) -> Tool:
        return Tool(name, "ferry", lambda s, d: f.sync_cmd(flags + file_to_b(s, d), link), NS_A,
                    form="remote-direct",
                    flags=(("sync", "--direct"),) + ((("sync", "--streams"),) if "--streams" in flags else ()))
    return [
        Tool("rsync (ssh)", "peer", lambda s, d: f"rsync -a -e {q(link.ssh_cmd())} {s} {ADDR_B}:{d}", NS_A,
             needs=("rsync",), cap=cap),
        *twins(ctx, lambda f: [sync(f, "ferry sync --direct", "--direct "),
                               sync(f, "ferry sync --direct --streams 1", "--direct --streams 1 ")]),
    ]


# -- the scenario ----------------------------------------------------------------

def link_check(ctx: Ctx, preset: str) -> tuple[float | None, str]:
    """The RTT as ping -U sees it; '' if it is the preset's, else why not.
    A wrong RTT is a broken link: a FAIL row, and the link's cases are
    not run."""
    rtt = ctx.link.rtt_ms()
    want = 2 * DELAY[preset][0]
    if rtt is None:
        return None, ""  # no ping: nothing to check against (bench/setup.sh installs it)
    if not RTT_OK[0] <= rtt <= RTT_OK[1]:
        return rtt, f"ping -U RTT {rtt:.1f} ms, not ~{want} ms"
    return rtt, ""


def scen_lfp(ctx: Ctx):
    """Issue 19: ferry's pipe and sync --direct on a long fat pipe, with
    and without loss, against iperf3 and the peers."""
    # the links to run, set by __main__: SCENARIOS["lfp"]["links"], or the one --link names
    presets = ctx.current_link.split(", ")
    src = lfp_file(ctx)
    size = os.path.getsize(src)
    ex = ctx.extra.setdefault(SCEN, {})
    ex.update({"bytes": size, "links": {}, "peer_floor_Bps": PEER_FLOOR})
    for k in ("tcp_congestion_control", "tcp_rmem", "tcp_wmem"):
        r = sh(["ip", "netns", "exec", NS_A, "sysctl", "-n", f"net.ipv4.{k}"], check=False)
        ex[k] = " ".join(r.stdout.split()) or "?"
    try:
        for preset in presets:
            ctx.link.shape(preset)
            ctx.current_link = preset
            rtt, bad = link_check(ctx, preset)
            log(f"{SCEN} / {preset}: RTT {rtt if rtt is None else round(rtt, 1)} ms (ping -U)")
            lk = ex["links"].setdefault(preset, {"rtt_ms": rtt})
            if bad:
                t = Tool("link check (ping -U)", "baseline", lambda s, d: "", verify=False)
                rec = record(ctx, SCEN, f"link {preset}", t)
                rec["status"], rec["reason"] = "FAIL", bad
                loud(f"FAIL {SCEN} / {preset}: {bad}: the delay line is not working; its cases are not run")
                continue
            lk["iperf3"] = references(ctx, preset)
            run_file_case(ctx, SCEN, case_name(STREAM, preset), stream_tools(ctx, size), src, lambda d: None)
            run_file_case(ctx, SCEN, case_name(FILE, preset), file_tools(ctx, size), src, lambda d: None)
            ctx.link.shape("none")  # ends the delay lines: their counters
            lk["delay_line"] = ctx.link.delay_stats.get(preset)
    finally:
        ctx.current_link = ", ".join(presets)
    figures(ctx, presets, size)


# -- figures -------------------------------------------------------------------------

def goodputs(ctx: Ctx, case: str, size: int) -> dict:
    """{tool: {"kind", "median_s", "goodput_Bps", "status", ...}} of one case."""
    out = {}
    for (sc, c, tool), rec in ctx.records.items():
        if sc != SCEN or c != case:
            continue
        sm = summarize(rec)
        g = {"kind": rec["kind"], "status": rec["status"], "reason": rec["reason"],
             "median_s": sm["median"] if sm else None,
             "goodput_Bps": round(size / sm["median"]) if sm else None}
        capped = [r for r in rec["runs"] if r.get("capped")]
        if capped and capped[0].get("wire_bytes"):  # what crossed the link until it was stopped
            g["capped_wire_Bps"] = round(capped[0]["wire_bytes"] / capped[0]["wall_s"])
        fj = [r.get("ferry_json") for r in rec["runs"] if r.get("verified") and r.get("ferry_json")]
        for k in ("streams", "connections"):  # what ferry says it used, if it says
            v = [j[k] for j in fj if isinstance(j.get(k), (int, float))]
            if v:
                g[k] = statistics.median(v)
        out[tool] = g
    return out


def ratio(a, b):
    return round(a / b, 3) if a and b else None


def figures(ctx: Ctx, presets: list, size: int) -> None:
    ex = ctx.extra[SCEN]
    mb = lambda x: "-" if not x else f"{x / 1e6:.1f}"  # noqa: E731
    num = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    num1 = lambda x: "-" if x is None else f"{x:.1f}"  # noqa: E731
    targets = []
    for preset in presets:
        lk = ex["links"].get(preset, {})
        ref = lk.get("iperf3")
        if ref is None:
            continue
        p8, single = ref.get("P8_Bps"), ref.get("single_Bps")
        rows = ["| form | case | median s | goodput MB/s | / iperf3 -P 8 | verified |", "|---|---|---|---|---|---|",
                f"| iperf3 -P 8 | reference | - | {mb(p8)} | 1.00 | - |",
                f"| iperf3 (one stream) | reference | - | {mb(single)} | {num(ratio(single, p8))} | - |"]
        for kind in (STREAM, FILE):
            gp = goodputs(ctx, case_name(kind, preset), size)
            lk[kind] = gp
            for tool, g in gp.items():
                g["of_iperf3_P8"] = ratio(g["goodput_Bps"], p8)
                name = {"ferry": f"**{esc(tool)}**", "ferry-base": f"*{esc(tool)}*"}.get(g["kind"], esc(tool))
                if g["status"] == "n/a":
                    rows.append(f"| {name} | {kind} | n/a ({esc(g['reason'])}) | | | |")
                    continue
                good = mb(g["goodput_Bps"])
                if g["status"] == "capped" and not g["goodput_Bps"]:
                    good = f"< {PEER_FLOOR / 1e6:.0f} (capped" + (
                        f"; {g['capped_wire_Bps'] / 1e6:.1f} on the wire)" if g.get("capped_wire_Bps") else ")")
                rows.append(f"| {name} | {kind} | {num(g['median_s'])} | {good} | {num(g['of_iperf3_P8'])} | "
                            + ("yes" if g["status"] == "ok" else esc(g["status"] + ": " + g["reason"])) + " |")
            d, s1 = gp.get("ferry pipe" if kind == STREAM else "ferry sync --direct"), \
                gp.get("ferry pipe --streams 1" if kind == STREAM else "ferry sync --direct --streams 1")
            lk[kind + "_default_over_streams1"] = ratio((d or {}).get("goodput_Bps"), (s1 or {}).get("goodput_Bps"))
            if not DELAY[preset][1]:
                targets.append((f"{preset}: **{'ferry pipe' if kind == STREAM else 'ferry sync --direct'}** "
                                "goodput / iperf3 -P 8", (d or {}).get("of_iperf3_P8"), T_OF_P8))
            else:
                targets.append((f"{preset}: **{'ferry pipe' if kind == STREAM else 'ferry sync --direct'}** "
                                "goodput / its own `--streams 1`", lk[kind + "_default_over_streams1"], T_LOSS_X))
        dl = lk.get("delay_line") or {}
        frames = sum((v or {}).get("frames", 0) for v in dl.values())
        lost = sum((v or {}).get("lost_frames", 0) for v in dl.values())
        events = sum((v or {}).get("lost_packets", 0) for v in dl.values())
        cpu = sum((v or {}).get("cpu_s", 0) for v in dl.values())
        secs = max([(v or {}).get("seconds", 0) for v in dl.values()] or [0])
        ctx.note(SCEN, (
            f"**{preset}**: RTT {num1(lk.get('rtt_ms'))} ms (median of 5 "
            f"`ping -U`); iperf3 (median of {len(ref.get('P8', []))} run(s) of {IPERF_S} s each, receiver's "
            f"goodput): -P 8 {mb(p8)} MB/s, one stream {mb(single)} MB/s"
            + (f" ({ref['why_none']})" if ref.get("why_none") else "")
            + (f"; the delay lines passed {frames} frames and lost {events} times, {lost} frames "
               f"({100 * lost / frames:.3f}%)" if frames and DELAY[preset][1] else "")
            + (f"; the two delay lines used {cpu:.0f} s of CPU in the {secs:.0f} s they ran" if secs else "")
            + "."))
        ctx.note(SCEN, "\n".join(rows))
        log(f"{SCEN} / {preset}: iperf3 -P 8 {mb(p8)} MB/s, one stream {mb(single)} MB/s; "
            + "; ".join(f"{t} {mb(g['goodput_Bps'])} MB/s ({num(g['of_iperf3_P8'])} of -P 8)"
                        for kind in (STREAM, FILE) for t, g in lk.get(kind, {}).items() if g["kind"] != "peer"))
    # "goals", not "targets": report.py prints a "targets" list as at-most ratios
    ex["goals"] = [{"figure": f, "value": v, "at_least": t} for f, v, t in targets]
    if targets:
        lines = ["The issue's targets (goodput = size / median wall time, ssh login and start included; "
                 "reported, not enforced):", "", "| figure | value | target | |", "|---|---|---|---|"]
        for f, v, t in targets:
            lines.append(f"| {f} | {num(v)} | ≥ {t:.2f} | "
                         + ("no run" if v is None else "met" if v >= t else "**NOT met**") + " |")
        ctx.note(SCEN, "\n".join(lines))
        for f, v, t in targets:
            log(f"{SCEN}: {f.replace('**', '')}: {v} (target >= {t})")
    ctx.note(SCEN, (
        f"Data: {size / 2**20:.0f} MiB of random bytes (the issue's size is 2048 MiB). TCP in both namespaces "
        f"(the host's settings): congestion control {ex['tcp_congestion_control']}, tcp_wmem {ex['tcp_wmem']}, "
        f"tcp_rmem {ex['tcp_rmem']}; one connection's window is bounded by tcp_wmem's maximum, so one stream "
        f"gets about that / RTT. A peer run that would average under {PEER_FLOOR / 1e6:.0f} MB/s is stopped "
        f"at size / that + {PEER_GRACE:g} s and its row reported as capped (with what crossed the link per "
        "second until then), not failed, and not run again in that case."))
