"""How the scenarios run their tools: one timed and verified run of one
tool (one_run), the rotation of the tools round by round, n/a bookkeeping,
and the generic runners (a file case, the tree's stateful phases, a copy
killed part-way and resumed).
The records land in Ctx.records, keyed (scenario, case, tool).
"""

from __future__ import annotations

import math
import os
import re
import stat
from dataclasses import dataclass, field
from typing import Callable

from . import data, verify
from .ferry_forms import NOT_SUPPORTED, QUIET_NA, Ferry
from .link import Link, Procs
from .measure import killed, timed
from .util import log, loud, rm_rf, sh, slug, which


@dataclass
class Tool:
    name: str
    kind: str                                  # "peer", "ferry", "baseline" or "ferry-base"
    cmd: Callable[[str, str], str]             # (src, dst) -> shell command
    ns: str | None = None
    servers: Callable[[str, str], list] | None = None
    form: str | tuple | None = None            # ferry form(s) it needs
    needs: tuple = ()                          # executables it needs
    env: dict | None = None
    phases: tuple | None = None                # tree: phases it runs in (None: all)
    runs: int | None = None                    # fewer timed runs than ctx.runs (slow peers)
    verify: bool = True                        # False: copies nothing (a baseline like ssh true)
    ferry: Ferry | None = None                 # the binary a ferry row runs (None: ctx.ferry)
    twin: str | None = None                    # a ferry@base row: the main binary's row it pairs with
    flags: tuple = ()                          # (subcommand, flag) pairs beyond its form that it passes
    kill_cmd: Callable[[str, str], str] | None = None  # resume: the run that is killed (None: cmd)
    cap: float | None = None                   # peers: stop a run after this many seconds and report
                                               # the row as capped (too slow to wait for), not failed
    prep: Callable[[str], None] | None = None  # file cases: makes this row's old copy (None: the case's)


@dataclass
class Ctx:
    work: str
    ferry: Ferry
    link: Link | None
    procs: Procs
    logdir: str
    runs: int
    sizes: dict
    records: dict = field(default_factory=dict)
    current_link: str = "none"
    failures: int = 0
    extra: dict = field(default_factory=dict)  # scenario -> figures and notes beyond the table
    base: Ferry | None = None                  # --ferry-base: measured beside ctx.ferry (base.py)

    def note(self, scen: str, text: str) -> None:
        """A Markdown paragraph printed under the scenario's table."""
        self.extra.setdefault(scen, {}).setdefault("notes", []).append(text)

    def data(self, name: str) -> str:
        d = os.path.join(self.work, "data")
        os.makedirs(d, exist_ok=True)
        return os.path.join(d, name)

    def dst(self, scen: str, tool: Tool, suffix: str = "") -> str:
        d = os.path.join(self.work, "dst", scen)
        os.makedirs(d, exist_ok=True)
        return os.path.join(d, re.sub(r"[^A-Za-z0-9]+", "-", tool.name).strip("-") + suffix)


def availability(ctx: Ctx, t: Tool) -> str | None:
    """None when the tool can run, else why not (the n/a reason)."""
    for exe in t.needs:
        if not which(exe):
            return f"{exe} not installed (bench/setup.sh)"
    f = t.ferry or ctx.ferry
    for sub, flag in t.flags:  # an older build (--ferry-base) may lack a newer flag
        if not f.has_flag(sub, flag):
            return f"{NOT_SUPPORTED}: no {sub} {flag}"
    for form in ((t.form,) if isinstance(t.form, str) else t.form or ()):
        ok, why = f.supported(form)
        if not ok:
            return why if why in QUIET_NA or why.startswith("no link") \
                else f"probe failed: {why}"
    return None


def record(ctx: Ctx, scen: str, case: str, t: Tool) -> dict:
    key = (scen, case, t.name)
    if key not in ctx.records:
        ctx.records[key] = {
            "scenario": scen, "case": case, "tool": t.name, "kind": t.kind,
            "link": ctx.current_link, "status": "ok", "reason": "", "runs": [],
        }
        if t.twin:
            ctx.records[key]["twin"] = t.twin
    return ctx.records[key]


def mark_na(ctx: Ctx, scen: str, case: str, t: Tool, why: str):
    """The tool cannot run here. A form of the measured ferry whose probe
    failed (rather than one this build does not have) is broken: that is a
    failure of the bench, not a row to skip."""
    r = record(ctx, scen, case, t)
    broken = t.kind == "ferry" and why.startswith("probe failed")
    r["status"], r["reason"] = ("FAIL" if broken else "n/a"), why


def ferry_json(stdout: str) -> dict | None:
    import json
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def one_run(ctx: Ctx, scen: str, case: str, t: Tool, src: str, dst: str,
            check: Callable[[], tuple[bool, str]], image: bool = False, extra: dict | None = None,
            drop: bool = True):
    """drop=False: keep the page cache (a warm re-run, the scale scenario)."""
    rec = record(ctx, scen, case, t)
    tag = f"{slug(scen)}-{slug(case)}-{slug(t.name)}-{len(rec['runs'])}"
    servers = t.servers(src, dst) if t.servers else []
    env = t.env if t.env is not None else (ctx.link.env() if ctx.link else None)
    cap = t.cap if t.kind == "peer" else None
    try:
        r = timed(t.cmd(src, dst), ns=t.ns, env=env, servers=servers, procs=ctx.procs,
                  link=ctx.link if t.ns else None, logdir=ctx.logdir, tag=tag,
                  timeout=cap or ctx.sizes["timeout"], drop=drop)
    except RuntimeError as e:
        fail(ctx, rec, t, str(e)[:300], f"FAIL {scen} / {case} / {t.name}: {e}")
        return
    if cap and r.timed_out:  # a peer too slow to wait for: reported, never a failure
        rec["runs"].append({"wall_s": round(r.wall, 4), "wire_bytes": r.wire, "rc": r.rc, "verified": False,
                            "capped": True, "error": f"stopped after {cap:.0f} s"})
        rec["status"], rec["reason"] = "capped", f"stopped after {cap:.0f} s"
        loud(f"{scen} / {case} / {t.name}: did not finish in {cap:.0f} s; stopped, reported as capped "
             f"(not a failure){'' if r.wire is None else f'; {r.wire / 1e6:.0f} MB crossed the link'}")
        return
    if r.rc != 0:
        ok, msg = False, f"exit {r.rc}{' (timed out)' if r.timed_out else ''}: " + \
            (r.stderr.strip().splitlines() or [""])[-1][:200]
    elif not t.verify:
        ok, msg = True, ""
        rec["no_data"] = True
    else:
        ok, msg = check()
    run = {"wall_s": round(r.wall, 4), "cpu_s": round(r.cpu, 4),
           "cpu_client_s": round(r.cpu_client, 4), "cpu_servers_s": round(r.cpu_servers, 4),
           "cpu_sshd_s": round(r.cpu_sshd, 4), "peak_rss_kib": r.maxrss_kb,
           "wire_bytes": r.wire, "rc": r.rc, "verified": ok, "error": msg,
           "loadavg_1m": round(os.getloadavg()[0], 2), **(extra or {})}
    if image and os.path.exists(dst):
        run["dst_allocated_bytes"] = verify.allocated(dst)
        run["src_allocated_bytes"] = verify.allocated(src)
    if t.kind in ("ferry", "ferry-base"):
        j = ferry_json(r.stdout)
        if j:
            run["ferry_json"] = j
    rec["runs"].append(run)
    wire = f", wire {r.wire / 1e6:.1f} MB" if r.wire is not None else ""
    log(f"{scen} / {case} / {t.name}: {r.wall:.2f}s, cpu {r.cpu:.2f}s{wire}"
        + ("" if ok else f"  VERIFY FAILED: {msg}"))
    if not ok:
        fail(ctx, rec, t, msg, f"FAIL {scen} / {case} / {t.name}: {msg} (logs: {ctx.logdir}/{tag}.*)")


def fail(ctx: Ctx, rec: dict, t: Tool, reason: str, text: str) -> None:
    """A FAILed row; a ferry@base row's failure is reported but does not
    count against the bench."""
    rec["status"], rec["reason"] = "FAIL", reason
    if t.kind == "ferry-base":
        text += " (the base binary: reported, does not fail the bench)"
    else:
        ctx.failures += 1
    loud(text)


def rotate(xs: list, k: int) -> list:
    if not xs:
        return xs
    k %= len(xs)
    return xs[k:] + xs[:k]


def usable(ctx: Ctx, scen: str, cases: list[str], tools: list[Tool]) -> list[Tool]:
    for c in cases:  # rows in the tools' order, whatever runs first
        for t in tools:
            if t.phases is None or c in t.phases:
                record(ctx, scen, c, t)
    out = []
    for t in tools:
        why = availability(ctx, t)
        if why:
            for c in cases:
                if t.phases is None or c in t.phases:
                    mark_na(ctx, scen, c, t, why)
            log(f"{scen}: {t.name}: n/a ({why})")
        else:
            out.append(t)
    return out


# -- generic runners ---------------------------------------------------------

def run_file_case(ctx: Ctx, scen: str, case: str, tools: list[Tool], src: str,
                  prepare: Callable[[str], None], image: bool = False,
                  check: Callable[[Tool, str, str], tuple[bool, str]] | None = None):
    """Each tool copies src to its own dst, round by round. Every copy is
    checked by check(tool, src, dst), byte for byte against src unless
    given (the guest scenario checks a --sparsify copy as a filesystem)."""
    tools = usable(ctx, scen, [case], tools)
    check = check or (lambda t, s, d: verify.same_file(s, d))
    for rnd in range(ctx.runs):  # a capped peer would be capped again: once is enough
        for t in rotate([t for t in tools if (t.runs is None or rnd < t.runs)
                         and record(ctx, scen, case, t)["status"] != "capped"], rnd):
            dst = ctx.dst(scen, t)
            rm_rf(dst)
            (t.prep or prepare)(dst)
            one_run(ctx, scen, case, t, src, dst,
                    lambda: check(t, src, dst), image=image)
    for t in tools:
        rm_rf(ctx.dst(scen, t))


TREE_PHASES = [("initial", 0), ("unchanged", 0), ("churn 30%", 30), ("churn 60%", 60)]


def run_tree(ctx: Ctx, scen: str, tools: list[Tool], base: str, phases=TREE_PHASES):
    tools = usable(ctx, scen, [p for p, _ in phases], tools)
    src = os.path.join(ctx.work, "src", scen)
    for rnd in range(ctx.runs):
        rm_rf(src)
        os.makedirs(os.path.dirname(src), exist_ok=True)
        sh(["cp", "-a", base, src])
        for t in tools:
            rm_rf(ctx.dst(scen, t))
        for pi, (phase, pct) in enumerate(phases):
            if pct:
                n = data.churn(src, pct, seed=1000 + pct)
                log(f"{scen}: {phase}: rewrote {n / 2**20:.1f} MiB of the source")
            for t in rotate([t for t in tools if t.phases is None or phase in t.phases], rnd + pi):
                dst = ctx.dst(scen, t)
                one_run(ctx, scen, phase, t, src, dst, lambda: verify.same_tree(src, dst))
    for t in tools:
        rm_rf(ctx.dst(scen, t))
    rm_rf(src)


# -- resume: a full copy, then a copy killed part-way and its re-run ----------

def delivered(d: str) -> int:
    """Bytes written so far into the files of directory d: each regular
    file's allocated size, at most its length. ferry's partial file is as
    long as the source from the start but sparse until written; rsync's
    temporary file grows as it is written."""
    return sum(min(v["size"], v["allocated"]) for v in left_behind(d).values() if v["regular"])


def left_behind(d: str) -> dict:
    """{name: {"size", "allocated"}} of what a killed run left in d."""
    out = {}
    try:
        with os.scandir(d) as it:
            for e in it:
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                out[e.name] = {"size": st.st_size, "allocated": st.st_blocks * 512,
                               "regular": stat.S_ISREG(st.st_mode)}
    except OSError:
        pass
    return out


RESUME_FULL = "full copy"


def resume_case(pct: float) -> str:
    return f"resume after a kill at {pct:g}%"


def run_resume(ctx: Ctx, scen: str, tools: list[Tool], src: str, kill_pct: float):
    """Per round: every tool copies src in full (timed, verified); then every
    tool, in the next rotation, copies it into an empty directory again and
    is SIGKILLed (its whole local process group) when kill_pct% of the file
    is at the destination (delivered()), and the same command (Tool.cmd)
    runs again, timed and verified: the resume. Each tool has its own
    destination directory, removed after each copy."""
    full, resume = RESUME_FULL, resume_case(kill_pct)
    tools = usable(ctx, scen, [full, resume], tools)
    size = os.path.getsize(src)
    name = os.path.basename(src)
    at = math.ceil(size * kill_pct / 100)

    def fresh(t: Tool) -> tuple[str, str]:
        d = ctx.dst(scen, t)
        rm_rf(d)
        os.makedirs(d)
        return d, os.path.join(d, name)
    for rnd in range(ctx.runs):
        for t in rotate(tools, rnd):
            d, dst = fresh(t)
            one_run(ctx, scen, full, t, src, dst, lambda: verify.same_file(src, dst))
            rm_rf(d)
        for t in rotate(tools, rnd + 1):
            d, dst = fresh(t)
            rec = record(ctx, scen, resume, t)
            tag = f"{slug(scen)}-kill-{slug(t.name)}-{len(rec['runs'])}"
            env = t.env if t.env is not None else (ctx.link.env() if ctx.link else None)
            k = killed((t.kill_cmd or t.cmd)(src, dst), ns=t.ns, env=env, procs=ctx.procs,
                       link=ctx.link if t.ns else None, logdir=ctx.logdir, tag=tag,
                       progress=lambda: delivered(d), at=at, timeout=ctx.sizes["timeout"])
            left = left_behind(d)
            info = {"killed": k.killed, "rc": k.rc, "at_s": round(k.at_s, 4),
                    "delivered_bytes": k.delivered, "delivered_pct": round(100 * k.delivered / size, 2),
                    "wire_bytes": k.wire, "remote_exit_s": k.remote_exit_s,
                    "remote_gone": k.remote_gone, "left": left}
            log(f"{scen} / {t.name}: " + (
                f"killed at {k.at_s:.2f}s with {info['delivered_pct']:.1f}% at the destination"
                if k.killed else f"NOT killed: exited {k.rc} after {k.at_s:.2f}s first")
                + f"; far side gone after {k.remote_exit_s}s; left: "
                + (", ".join(f"{n} {v['size'] / 2**20:.1f} MiB ({v['allocated'] / 2**20:.1f} allocated)"
                             for n, v in sorted(left.items())) or "nothing"))
            if not k.killed:
                loud(f"{scen} / {t.name}: the run to be killed exited ({k.rc}) before "
                     f"{kill_pct:g}% reached the destination ({info['delivered_pct']:.1f}%); "
                     f"its re-run resumes nothing (logs: {ctx.logdir}/{tag}.*)")
            if not k.remote_gone:
                loud(f"{scen} / {t.name}: its far side still ran {k.remote_exit_s}s after the kill")
            n0 = len(rec["runs"])
            one_run(ctx, scen, resume, t, src, dst, lambda: verify.same_file(src, dst),
                    extra={"kill": info})
            run = rec["runs"][-1] if len(rec["runs"]) > n0 else {}
            code = (run.get("ferry_json") or {}).get("exit_code")
            if run.get("verified") and code not in (None, 0):
                run["verified"], run["error"] = False, f"--json exit_code {code}"
                fail(ctx, rec, t, run["error"], f"FAIL {scen} / {resume} / {t.name}: {run['error']}")
            rm_rf(d)
