"""The scale scenario's million-file tree (part 1 in scale.py's docstring):
the deterministic generator (each file's size, bytes, mode and mtime follow
from its number) cached under --work, the churn (10% deleted, 10% touched,
a tenth of those rewritten) and its undo (a marker beside the tree while it
is applied), the listing + sample-hash check, and the tree cases, local
(`ferry sync` against `rsync -a`) and over ssh, in their four phases.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import stat
import time
from concurrent.futures import ProcessPoolExecutor

from . import data
from .link import ADDR_B, NS_A
from .measure import GNU_TIME, timed
from .runner import Ctx, Tool, rotate, usable
from .scale_common import KiB, SCEN, last_run, paired, q, remote_wrapper, rsync_rss_path, timed_run
from .util import log, sh, slug

# -- the tree ----------------------------------------------------------------------

TREE_SEED = 21
FILE_MAX = 8 * KiB
MTIME0 = 1_600_000_000
SAMPLE_MOD = 100  # files whose number is 0 mod this are hashed in every check


def layout(n: int) -> list[str]:
    """The directories of an n-file tree: n/100 of them, the first isqrt of
    that many at the top, the others spread below those."""
    d = max(1, round(n / 100))
    t = max(1, math.isqrt(d))
    return [f"t{j:03d}" for j in range(t)] + [f"t{(j - t) % t:03d}/s{j:05d}" for j in range(t, d)]


def file_rel(dirs: list[str], i: int) -> str:
    return f"{dirs[i % len(dirs)]}/f{i:07d}"


def file_size(i: int, gen: int) -> int:
    h = hashlib.shake_128(b"size:%d:%d:%d" % (TREE_SEED, i, gen)).digest(4)
    return int.from_bytes(h, "little") % (FILE_MAX + 1)


def file_bytes(i: int, gen: int) -> bytes:
    n = file_size(i, gen)
    return hashlib.shake_128(b"data:%d:%d:%d" % (TREE_SEED, i, gen)).digest(n) if n else b""


def file_mode(i: int) -> int:
    return 0o755 if i % 89 == 0 else 0o600 if i % 97 == 0 else 0o644


def file_mtime_ns(i: int, gen: int) -> int:
    return (MTIME0 + 10_000_000 * gen + i) * 10**9 + (i * 7919) % 10**9


def dir_mtime_ns(j: int) -> int:
    return (MTIME0 - 1_000_000 + j) * 10**9 + 123_456_789


def write_file(root: str, dirs: list[str], i: int, gen: int) -> int:
    b = file_bytes(i, gen)
    fd = os.open(os.path.join(root, file_rel(dirs, i)), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, file_mode(i))
        if b:
            os.write(fd, b)
        t = file_mtime_ns(i, gen)
        os.utime(fd, ns=(t, t))
    finally:
        os.close(fd)
    return len(b)


def _gen_chunk(args) -> int:
    root, n, lo, hi, gen = args
    dirs = layout(n)
    return sum(write_file(root, dirs, i, gen) for i in range(lo, hi))


def _parallel(root: str, n: int, idx: list[int] | range, gen: int) -> int:
    """write_file for each file number in idx, on two processes."""
    if isinstance(idx, range):
        step = 25_000
        chunks = [(root, n, lo, min(lo + step, idx.stop), gen) for lo in range(idx.start, idx.stop, step)]
        with ProcessPoolExecutor(max_workers=2) as ex:
            return sum(ex.map(_gen_chunk, chunks))
    dirs = layout(n)
    return sum(write_file(root, dirs, i, gen) for i in idx)


def reset_dir_times(root: str, n: int) -> None:
    dirs = layout(n)
    for j in reversed(range(len(dirs))):  # children before their parents
        t = dir_mtime_ns(j)
        os.utime(os.path.join(root, dirs[j]), ns=(t, t))


def make_tree(root: str, n: int) -> dict:
    t0 = time.monotonic()
    dirs = layout(n)
    os.makedirs(root, exist_ok=True)
    for d in dirs:
        os.makedirs(os.path.join(root, d), exist_ok=True)
    total = _parallel(root, n, range(n), 0)
    reset_dir_times(root, n)
    log(f"{SCEN}: generated {n} files in {len(dirs)} directories, {total / 2**30:.2f} GiB, "
        f"in {time.monotonic() - t0:.0f} s")
    return {"files": n, "dirs": len(dirs), "bytes": total}


def tree_data(ctx: Ctx) -> str:
    n = ctx.sizes["scale_files"]
    path = ctx.data(f"scale-tree-{n}")
    p = {"files": n, "seed": TREE_SEED, "max": FILE_MAX, "v": 1}
    path = data.cached(path, p, lambda d: make_tree(d, n))
    restore(path, n)
    return path


def churn_sets(n: int) -> tuple[list[int], list[int], list[int]]:
    """(deleted, touched, rewritten): 10% of the files each for the first
    two, disjoint; rewritten is every tenth touched file (new contents, new
    size). Deterministic."""
    k = n // 10
    pick = random.Random(TREE_SEED * 1000 + 1).sample(range(n), 2 * k)
    deleted, touched = sorted(pick[:k]), sorted(pick[k:])
    return deleted, touched, touched[::10]


def marker(root: str) -> str:
    return root.rstrip("/") + ".churned"


def apply_churn(root: str, n: int) -> dict:
    deleted, touched, rewritten = churn_sets(n)
    with open(marker(root), "w") as f:  # first: a run that dies mid-way is undone next time
        f.write(json.dumps({"n": n}))
    dirs = layout(n)
    for i in deleted:
        os.unlink(os.path.join(root, file_rel(dirs, i)))
    rw = set(rewritten)
    for i in touched:
        if i in rw:
            write_file(root, dirs, i, 1)
        else:
            t = file_mtime_ns(i, 1)
            os.utime(os.path.join(root, file_rel(dirs, i)), ns=(t, t))
    # rsync -a --delete sets a directory's time and then deletes in it;
    # when the source directory changed in the same second as its run, it
    # leaves the deletion's time (reproduced with rsync alone, 3 of 3).
    # At --quick sizes the churn and the run share that second.
    time.sleep(1.1)
    return {"deleted": len(deleted), "touched": len(touched), "rewritten": len(rewritten)}


def restore(root: str, n: int) -> None:
    """Undo apply_churn (if its marker is there): the tree the generator makes."""
    if not os.path.exists(marker(root)):
        return
    t0 = time.monotonic()
    deleted, touched, rewritten = churn_sets(n)
    dirs = layout(n)
    _parallel(root, n, sorted(set(deleted) | set(rewritten)), 0)
    for i in touched:
        t = file_mtime_ns(i, 0)
        os.utime(os.path.join(root, file_rel(dirs, i)), ns=(t, t))
    reset_dir_times(root, n)
    os.unlink(marker(root))
    log(f"{SCEN}: source tree restored in {time.monotonic() - t0:.0f} s")


def listing(root: str) -> dict[str, tuple]:
    """rel path -> (type, size (files), mtime ns, permission bits), every
    entry below root."""
    out = {}
    stack = [""]
    while stack:
        rel = stack.pop()
        with os.scandir(os.path.join(root, rel) if rel else root) as it:
            for e in it:
                r = f"{rel}/{e.name}" if rel else e.name
                st = e.stat(follow_symlinks=False)
                fmt = stat.S_IFMT(st.st_mode)
                out[r] = (fmt, st.st_size if fmt == stat.S_IFREG else 0, st.st_mtime_ns, stat.S_IMODE(st.st_mode))
                if fmt == stat.S_IFDIR:
                    stack.append(r)
    return out


def file_hash(p: str) -> bytes:
    with open(p, "rb") as f:
        return hashlib.blake2b(f.read()).digest()


def check_tree(src: str, src_list: dict, dst: str, hashed: list[str]) -> tuple[bool, str]:
    if not os.path.isdir(dst):
        return False, f"{dst}: missing"
    got = listing(dst)
    missing = [r for r in src_list if r not in got]
    if missing:
        return False, f"{len(missing)} entries missing, e.g. {missing[0]}"
    extra = [r for r in got if r not in src_list]
    if extra:
        return False, f"{len(extra)} unexpected entries, e.g. {extra[0]}"
    names = ("type", "size", "mtime_ns", "mode")
    for r, a in src_list.items():
        b = got[r]
        if a != b:
            k = next(i for i in range(4) if a[i] != b[i])
            n = sum(1 for x, y in src_list.items() if got[x] != y)
            return False, f"{n} entries differ, e.g. {r}: {names[k]} {b[k]} != {a[k]}"
    for r in hashed:
        if file_hash(os.path.join(src, r)) != file_hash(os.path.join(dst, r)):
            return False, f"{r}: contents differ"
    return True, ""


# -- tree cases ----------------------------------------------------------------------

INITIAL, COLD, WARM, CHURN = "initial", "unchanged (cold cache)", "unchanged (warm cache)", \
    "10% deleted + 10% touched, --delete"


def case(where: str, phase: str) -> str:
    return f"tree {where}: {phase}"


def tree_tools(ctx: Ctx, where: str, delete: bool) -> list[tuple[Tool, str | None]]:
    """(tool, far-side RSS file or None) for a phase; --delete in the churn phase."""
    dl = "--delete " if delete else ""
    if where == "local":
        out = [(Tool("rsync -a" + (" --delete" if delete else ""), "peer",
                     lambda s, d: f"rsync -a {dl}{s}/ {d}/", needs=("rsync",)), None)]
        for f in [ctx.ferry] + ([ctx.base] if ctx.base else []):
            out.append((Tool(f"{f.name} sync" + (" --delete" if delete else ""),
                             "ferry" if f is ctx.ferry else "ferry-base",
                             lambda s, d, f=f: f"{q(f.path)} sync --json {dl}{s}/ {d}/", form="local",
                             ferry=f), None))
        return paired(ctx, out)
    link = ctx.link
    ssh = link.ssh_cmd()
    rr = rsync_rss_path(ctx)
    rpath = f"{GNU_TIME} -f %M -o {rr} rsync" if GNU_TIME else "rsync"
    out = [(Tool("rsync -a (ssh)" + (" --delete" if delete else ""), "peer",
                 lambda s, d: f"rsync -a {dl}-e {q(ssh)} --rsync-path={q(rpath)} {s}/ {ADDR_B}:{d}/",
                 NS_A, needs=("rsync",)), rr)]
    for f in [ctx.ferry] + ([ctx.base] if ctx.base else []):
        w, rss = remote_wrapper(ctx, f)
        out.append((Tool(f"{f.name} sync (ssh)" + (" --delete" if delete else ""),
                         "ferry" if f is ctx.ferry else "ferry-base",
                         lambda s, d, f=f, w=w: (f"{q(f.path)} sync -e {q(ssh)} --remote-ferry {q(w)} --json "
                                                 f"{dl}{s}/ {ADDR_B}:{d}/"),
                         NS_A, form="remote", ferry=f), rss))
    return paired(ctx, out)


def dst_for(ctx: Ctx, where: str, t: Tool) -> str:
    """One destination per tool and place, whatever the phase's flags."""
    name = t.name.replace(" --delete", "")
    d = os.path.join(ctx.work, "dst", SCEN, slug(f"tree-{where}-{name}"))
    os.makedirs(os.path.dirname(d), exist_ok=True)
    return d


def rm_tree(path: str) -> None:
    if os.path.lexists(path):
        sh(["rm", "-rf", "--one-file-system", path])


def warm_up(ctx: Ctx, t: Tool, src: str, dst: str) -> None:
    """The same command once, untimed, before a warm-cache run: the other
    tools' cold runs dropped the caches after this tool's own, so without
    it the tool's destination would be read back from the disk during the
    "warm" run (its source stays cached by the tool before it)."""
    env = t.env if t.env is not None else (ctx.link.env() if ctx.link else None)
    r = timed(t.cmd(src, dst), ns=t.ns, env=env, servers=[], procs=ctx.procs,
              link=ctx.link if t.ns else None, logdir=ctx.logdir,
              tag=f"{slug(SCEN)}-warm-up-{slug(t.name)}", timeout=ctx.sizes["timeout"], drop=False)
    log(f"{SCEN}: warm-up run of {t.name}: {r.wall:.2f} s, exit {r.rc} (not counted)")


def run_tree_cases(ctx: Ctx, where: str, src: str, n: int) -> None:
    plain, dele = tree_tools(ctx, where, False), tree_tools(ctx, where, True)
    phases = [(INITIAL, plain), (COLD, plain), (WARM, plain), (CHURN, dele)]
    ok_names = set()
    for phase, tools in phases:  # rows in order; n/a where a tool cannot run
        ok_names |= {t.name for t in usable(ctx, SCEN, [case(where, phase)], [t for t, _ in tools])}
    dirs = layout(n)
    sample = [file_rel(dirs, i) for i in range(0, n, SAMPLE_MOD)]
    for rnd in range(ctx.runs):
        restore(src, n)
        for t, _ in plain:
            rm_tree(dst_for(ctx, where, t))
        src_list = None
        for pi, (phase, tools) in enumerate(phases):
            hashed = sample
            if phase == CHURN:
                ch = apply_churn(src, n)
                deleted, touched, _ = churn_sets(n)
                gone = set(deleted)
                hashed = [r for i, r in zip(range(0, n, SAMPLE_MOD), sample) if i not in gone] \
                    + [file_rel(dirs, i) for i in touched]
                log(f"{SCEN}: churn: {ch}")
                ctx.extra.setdefault(SCEN, {})["churn"] = ch
                src_list = None
            if src_list is None:
                t0 = time.monotonic()
                src_list = listing(src)
                log(f"{SCEN}: source listing: {len(src_list)} entries in {time.monotonic() - t0:.1f} s")
            for t, far in rotate([x for x in tools if x[0].name in ok_names], rnd + pi):
                dst = dst_for(ctx, where, t)
                if phase == WARM:
                    warm_up(ctx, t, src, dst)
                t0 = time.monotonic()
                timed_run(ctx, case(where, phase), t, src, dst,
                          lambda: check_tree(src, src_list, dst, hashed), far=far, drop=(phase != WARM))
                log(f"{SCEN}: checked {len(src_list)} entries and hashed {len(hashed)} files "
                    f"in {time.monotonic() - t0 - (last_run(ctx, case(where, phase), t) or {}).get('wall_s', 0):.0f} s")
                ctx.extra.setdefault(SCEN, {}).setdefault("verified", {})[case(where, phase)] = {
                    "entries": len(src_list), "hashed_files": len(hashed)}
        restore(src, n)
    for t, _ in plain:
        rm_tree(dst_for(ctx, where, t))
