"""The scale scenario (issue 21): ferry at scale, beside rsync, cp,
qemu-img, nbdcopy. Only when named: `bash bench/run.sh scale`.

1. A tree of --scale-files files (default 1,000,000; sizes 0-8 KiB, one
   directory per 100 files: 10,000 at the default, 100 of them holding the
   other 9,900), from a deterministic generator (each file's size, bytes,
   mode and mtime follow from its number), cached under --work:
   - locally (`ferry sync SRC/ DST/` against `rsync -a SRC/ DST/`): the
     initial copy, an unchanged re-run with the page cache dropped first
     (the suite's rule) and one with the cache warm (right after an untimed
     run of the same command: the other tool's cold run dropped it), then
     10% of the files deleted and 10% touched (a tenth of those with new
     contents) and a re-run with --delete;
   - the same pushed over ssh to namespace B (a real sshd; the veth pair
     unshaped), with the far side's peak RSS measured by wrapping it in GNU
     time (`--remote-ferry WRAPPER`, `rsync --rsync-path`).
   The source is the cached tree itself; the churn is undone afterwards
   (deleted and rewritten files regenerated, times reset), also at the next
   start if a run died half-way (a marker says so).
   Verified: a listing of every entry (path, type, size, mtime in ns, mode)
   equal to the source's, plus a BLAKE2 hash of the contents of a
   deterministic 1% sample (file numbers = 0 mod 100) and, after the churn,
   of every touched or rewritten file.
2. A sparse file of --scale-sparse-gib GiB (default 1024: 1 TiB) holding
   --scale-data-mib MiB (default 1024) in extents of 256 KiB of random bytes,
   evenly spread, and a dense file of the same bytes: copied locally (ferry,
   cp --sparse=always, qemu-img convert), pushed over ssh (ferry), and from an
   NBD export of the sparse file (nbdkit's file plugin on a unix socket) into
   a file (ferry, nbdcopy). Verified: the same size, and every byte range that
   either file has as data (SEEK_DATA / SEEK_HOLE) read and compared; outside
   those both are holes, which read as zeros. The destination's data layout
   and allocated size (st_blocks) are reported against the source's.
3. A --scale-stream-mib MiB stream (default 2048) over the 1gbit link with
   `ferry send / recv` and `ferry pipe` at `--buffer 256M`: the peak RSS of
   each side against the buffer + 64 MiB.

The parts live in scale_tree (1), scale_sparse (2) and scale_stream (3),
with what they share (names, units, per-side peak RSS) in scale_common; this
module holds the issue's targets, the table of figures against them, and
scen_scale, which runs the three parts in turn.
"""

from __future__ import annotations

import os

from . import data
from .runner import Ctx
from .scale_common import MiB, SCEN
from .scale_sparse import EXTENT, cmp_estimate, file_rows, run_file_cases, sparse_files, sparse_layout
from .scale_stream import STREAM_BUFFER, STREAM_BUFFER_MIB, run_stream, stream_data
from .scale_tree import CHURN, COLD, INITIAL, WARM, case, layout, restore, run_tree_cases, tree_data
from .util import log

# The targets
T_INITIAL = 0.7        # ferry initial / rsync initial (local)
T_UNCHANGED_LOCAL = 3.0  # s
T_UNCHANGED_SSH = 5.0    # s
T_DELETE_X = 2.0       # churn re-run / unchanged re-run
T_RSS_MIB = 256
T_SPARSE_X = 1.5       # sparse / dense
T_STREAM_OVER = 64     # MiB over the configured buffer (STREAM_BUFFER, in scale_stream)


# -- figures ---------------------------------------------------------------------------------

def med(ctx: Ctx, cname: str, tool: str, key: str = "wall_s") -> float | None:
    rec = ctx.records.get((SCEN, cname, tool))
    if not rec:
        return None
    v = [r[key] for r in rec["runs"] if r.get("verified") and r.get(key) is not None]
    if not v:
        return None
    v.sort()
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def peak(ctx: Ctx, cname: str, tool: str, key: str) -> float | None:
    """The largest peak RSS over the verified runs, MiB."""
    rec = ctx.records.get((SCEN, cname, tool))
    v = [r[key] for r in (rec or {}).get("runs", []) if r.get("verified") and r.get(key) is not None]
    return max(v) / 1024 if v else None


def figures(ctx: Ctx, n: int, sparse_cases: dict, stream_case: str | None, cmp_est: dict | None) -> None:
    ex = ctx.extra.setdefault(SCEN, {})
    f = ctx.ferry.name
    rows = []  # (figure, value, unit, target, what "met" means: "le"/"eq")

    def add(fig, v, unit, tgt, how="le"):
        rows.append((fig, v, unit, tgt, how))
    # tree
    for where, fr, rr in (("local", f"{f} sync", "rsync -a"), ("ssh", f"{f} sync (ssh)", "rsync -a (ssh)")):
        fi, ri = med(ctx, case(where, INITIAL), fr), med(ctx, case(where, INITIAL), rr)
        if where == "local":
            add(f"tree local initial: **ferry** / rsync -a ({_s(fi)} / {_s(ri)})",
                fi / ri if fi and ri else None, "x", T_INITIAL)
        else:
            add(f"tree ssh initial: **ferry** / rsync -a (ssh) ({_s(fi)} / {_s(ri)}; no target)",
                fi / ri if fi and ri else None, "x", None)
        tgt = T_UNCHANGED_LOCAL if where == "local" else T_UNCHANGED_SSH
        for ph in (COLD, WARM):
            add(f"tree {where} {ph}: **ferry** s (rsync {_s(med(ctx, case(where, ph), rr))})",
                med(ctx, case(where, ph), fr), "s", tgt)
        ch = med(ctx, case(where, CHURN), fr + " --delete")
        for ph in (COLD, WARM):
            un = med(ctx, case(where, ph), fr)
            add(f"tree {where} churn --delete / unchanged ({ph.split('(')[1][:-1]}): **ferry** "
                f"({_s(ch)} / {_s(un)}; rsync {_ratio(med(ctx, case(where, CHURN), rr + ' --delete'), med(ctx, case(where, ph), rr))})",
                ch / un if ch and un else None, "x", T_DELETE_X)
        rss_l = [peak(ctx, case(where, ph), fr + x, "local_rss_kib") for ph, x in
                 ((INITIAL, ""), (COLD, ""), (WARM, ""), (CHURN, " --delete"))]
        rss_l = max([x for x in rss_l if x is not None], default=None)
        peer_l = max([x for x in (peak(ctx, case(where, ph), rr + x, "local_rss_kib") for ph, x in
                                  ((INITIAL, ""), (COLD, ""), (WARM, ""), (CHURN, " --delete")))
                      if x is not None], default=None)
        add(f"tree {where}: **ferry** peak RSS, {'the one process' if where == 'local' else 'sender'} "
            f"(rsync's largest process: {_m(peer_l)})", rss_l, "MiB", T_RSS_MIB)
        if where == "ssh":
            rss_r = max([x for x in (peak(ctx, case(where, ph), fr + x, "remote_rss_kib") for ph, x in
                                     ((INITIAL, ""), (COLD, ""), (WARM, ""), (CHURN, " --delete")))
                         if x is not None], default=None)
            peer_r = max([x for x in (peak(ctx, case(where, ph), rr + x, "remote_rss_kib") for ph, x in
                                      ((INITIAL, ""), (COLD, ""), (WARM, ""), (CHURN, " --delete")))
                          if x is not None], default=None)
            add(f"tree ssh: **ferry** peak RSS, receiver (remote rsync: {_m(peer_r)})", rss_r, "MiB", T_RSS_MIB)
    # sparse
    for where, (sc, dc, tool) in sparse_cases.items():
        s, d = med(ctx, sc, tool), med(ctx, dc, tool)
        add(f"sparse {where}: **ferry** sparse / dense ({_s(s)} / {_s(d)})", s / d if s and d else None, "x",
            T_SPARSE_X)
        rec = ctx.records.get((SCEN, sc, tool), {"runs": []})
        good = [r for r in rec["runs"] if r.get("verified")]
        if good:
            lay = good[-1].get("layout", {})
            add(f"sparse {where}: **ferry** copy's allocated MiB (source {_m((lay.get('src_allocated') or 0) / MiB)}; "
                f"same data layout: {'yes' if lay.get('same_layout') else 'no'})",
                (lay.get("dst_allocated") or 0) / MiB, "MiB", (lay.get("src_allocated") or 0) / MiB, "eq")
        for c in (sc, dc):
            for k, side in (("local_rss_kib", "sender" if where == "ssh" else "process"),
                            ("remote_rss_kib", "receiver")):
                v = peak(ctx, c, tool, k)
                if v is not None:
                    add(f"{c}: **ferry** peak RSS, {side}", v, "MiB", T_RSS_MIB)
    nb = ex.get("nbd_case")
    if nb:
        fs, ns = med(ctx, nb, f"{f} sync nbd+unix://"), med(ctx, nb, "nbdcopy")
        add(f"{nb}: **ferry** / nbdcopy ({_s(fs)} / {_s(ns)}; no target)", fs / ns if fs and ns else None, "x", None)
        v = peak(ctx, nb, f"{f} sync nbd+unix://", "local_rss_kib")
        add(f"{nb}: **ferry** peak RSS", v, "MiB", T_RSS_MIB)
    if stream_case:
        for tool, sides in ((f"{f} pipe (ssh) -m {STREAM_BUFFER}", ("sender", "far side (ferry pipe over ssh)")),
                            (f"{f} send / recv -m {STREAM_BUFFER}", ("ferry send", "ferry recv"))):
            for k, side in zip(("local_rss_kib", "remote_rss_kib"), sides):
                add(f"{stream_case}: **{tool}** peak RSS, {side}", peak(ctx, stream_case, tool, k), "MiB",
                    STREAM_BUFFER_MIB + T_STREAM_OVER)
    ex["goals"] = [{"figure": a, "value": None if v is None else round(v, 3), "unit": u, "target": t,
                    "how": h} for a, v, u, t, h in rows]
    lines = ["The issue's targets (medians of the verified runs; peak RSS: the largest of them; reported, "
             "not enforced):", "", "| figure | value | target | |", "|---|---|---|---|"]
    for a, v, u, t, h in rows:
        val = "-" if v is None else (f"{v:.2f}" if u in ("x", "s") else f"{v:.0f}") + ("" if u == "x" else f" {u}")
        if t is None:
            tg, met = "-", "for reference"
        elif h == "eq":
            tg = f"= {t:.0f} {u}"
            met = "no run" if v is None else ("met" if abs(v - t) < 1 else "**NOT met**")
        else:
            tg = f"≤ {t:.2f}" if u == "x" else f"< {t:.0f} s" if u == "s" else f"≤ {t:.0f} {u}"
            met = "no run" if v is None else ("met" if v <= t else "**NOT met**")
        lines.append(f"| {a.replace('|', chr(92) + '|')} | {val} | {tg} | {met} |")
    ctx.note(SCEN, "\n".join(lines))
    if cmp_est:
        ctx.note(SCEN, f"A byte-for-byte `cmp` of the sparse file against a copy would read all of it, holes "
                       f"included: `cmp -n` of its first {cmp_est['bytes'] / 2**30:.0f} GiB took "
                       f"{cmp_est['seconds']:.1f} s with the cache dropped, so about {cmp_est['full_estimate_s']:.0f} s "
                       "for the whole file per check; the check used instead reads only the data ranges.")
    for a, v, u, t, h in rows:
        log(f"{SCEN}: {a.replace('**', '')}: {v} {u} (target {t})")


def _s(x):
    return "-" if x is None else f"{x:.2f} s"


def _m(x):
    return "-" if x is None else f"{x:.0f} MiB"


def _ratio(a, b):
    return "-" if not a or not b else f"{a:.2f} / {b:.2f} s = {a / b:.2f}x"


# -- the scenario ------------------------------------------------------------------------------

def scen_scale(ctx: Ctx) -> None:
    ex = ctx.extra.setdefault(SCEN, {})
    n = ctx.sizes["scale_files"]
    ctx.link.shape("none")
    ctx.current_link = "none"
    src = tree_data(ctx)
    inf = data.info(src) or {}
    ex["tree"] = {"files": n, "dirs": len(layout(n)), "bytes": inf.get("bytes")}
    try:
        run_tree_cases(ctx, "local", src, n)
        run_tree_cases(ctx, "ssh", src, n)
    finally:
        restore(src, n)
    sp, de = sparse_files(ctx)
    ex["sparse"] = {"virtual": os.path.getsize(sp), "allocated": os.stat(sp).st_blocks * 512,
                    "extents": len(sparse_layout(os.path.getsize(sp), ctx.sizes["scale_data_mib"] << 20)),
                    "extent_bytes": EXTENT, "dense": os.path.getsize(de)}
    vg = os.path.getsize(sp) >> 30
    dm = os.path.getsize(de) >> 20
    s_loc, d_loc = f"sparse {vg} GiB local", f"dense {dm} MiB local"
    est = {}
    run_file_cases(ctx, s_loc, file_rows(ctx, "local"), sp, True,
                   after=lambda a, b: est.update(cmp_estimate(a, b) or {}))
    run_file_cases(ctx, d_loc, file_rows(ctx, "local"), de, False)
    s_ssh, d_ssh = f"sparse {vg} GiB over ssh", f"dense {dm} MiB over ssh"
    run_file_cases(ctx, s_ssh, file_rows(ctx, "ssh"), sp, True)
    run_file_cases(ctx, d_ssh, file_rows(ctx, "ssh"), de, False)
    from .ferry_forms import sock_path
    nb = f"sparse {vg} GiB from NBD (nbdkit file plugin)"
    ex["nbd_case"] = nb
    run_file_cases(ctx, nb, file_rows(ctx, "nbd", sock_path(ctx.work, "scale.sock")), sp, True)
    cmp_est = est or None
    ex["cmp_estimate"] = cmp_est
    stream_case = run_stream(ctx, stream_data(ctx))
    figures(ctx, n, {"local": (s_loc, d_loc, f"{ctx.ferry.name} sync"),
                     "ssh": (s_ssh, d_ssh, f"{ctx.ferry.name} sync (ssh)")}, stream_case, cmp_est)
    ctx.note(SCEN, (
        f"Tree: {n} files in {len(layout(n))} directories, {(inf.get('bytes') or 0) / 2**30:.2f} GiB. Peak RSS "
        "in the table is the largest process of the local command (GNU time; for the NBD rows nbdkit's too); "
        "the per-side figures above come from GNU time around the local command alone and around the far "
        "side (`--remote-ferry` wrapper script, `rsync --rsync-path`, ferry recv as a server). \"Unchanged "
        "(cold cache)\" runs after `sync; echo 3 > drop_caches` like every run of the suite; \"warm cache\" "
        "runs without dropping, right after an untimed run of the same command (the other tool's cold run dropped the cache). ssh rows: namespace A to a real sshd in namespace B over an "
        "unshaped veth pair. Verified: every tree copy's full listing (path, type, size, mtime ns, mode) "
        "equals the source's, and a BLAKE2 hash of the contents of every 100th file (1%) and, after the "
        "churn, of every touched file matches; each sparse copy: size, then every range that either file "
        "has as data compared byte for byte (holes read as zeros in both); dense and stream copies byte "
        "for byte."))
