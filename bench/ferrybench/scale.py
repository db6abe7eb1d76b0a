"""The scale scenario (issue 21): ferry at scale, beside rsync, cp,
qemu-img, nbdcopy. Only when named: `bash bench/run.sh scale`.

1. A tree of --scale-files files (default 1,000,000; sizes 0-8 KiB, one
   directory per 100 files: 10,000 at the default, 100 of them holding the
   other 9,900), from a deterministic generator (each file's size, bytes,
   mode and mtime follow from its number), cached under --work:
   - locally (`ferry sync SRC/ DST/` against `rsync -a SRC/ DST/`): the
     initial copy, an unchanged re-run with the page cache dropped first
     (the suite's rule) and one right after it with the cache warm, then
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
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shlex
import stat
import time
from concurrent.futures import ProcessPoolExecutor

from . import data, verify
from .base import twins
from .ferry_forms import Ferry
from .link import ADDR_B, NS_A, NS_B
from .measure import GNU_TIME, Server
from .runner import Ctx, Tool, one_run, record, rotate, usable
from .util import log, loud, sh, slug, which

q = shlex.quote
SCEN = "scale"
MiB = 1 << 20
KiB = 1 << 10

# The targets
T_INITIAL = 0.7        # ferry initial / rsync initial (local)
T_UNCHANGED_LOCAL = 3.0  # s
T_UNCHANGED_SSH = 5.0    # s
T_DELETE_X = 2.0       # churn re-run / unchanged re-run
T_RSS_MIB = 256
T_SPARSE_X = 1.5       # sparse / dense
T_STREAM_OVER = 64     # MiB over the configured buffer
STREAM_BUFFER = "256M"
STREAM_BUFFER_MIB = 256

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
        return out
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
    return out


def dst_for(ctx: Ctx, where: str, t: Tool) -> str:
    """One destination per tool and place, whatever the phase's flags."""
    name = t.name.replace(" --delete", "")
    d = os.path.join(ctx.work, "dst", SCEN, slug(f"tree-{where}-{name}"))
    os.makedirs(os.path.dirname(d), exist_ok=True)
    return d


def rm_tree(path: str) -> None:
    if os.path.lexists(path):
        sh(["rm", "-rf", "--one-file-system", path])


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


# -- the sparse file -------------------------------------------------------------------

EXTENT = 256 * KiB
SPARSE_SEED = 2121


def sparse_layout(virt: int, data_bytes: int) -> list[tuple[int, int]]:
    n = max(1, data_bytes // EXTENT)
    stride = max(EXTENT, (virt // n) // MiB * MiB)
    return [(k * stride, EXTENT) for k in range(n)]


def make_sparse(path: str, virt: int, data_bytes: int, dense: bool) -> dict:
    rnd = random.Random(SPARSE_SEED)
    ext = sparse_layout(virt, data_bytes)
    with open(path, "wb") as f:
        if not dense:
            f.truncate(virt)
        for off, ln in ext:
            b = rnd.randbytes(ln)
            if dense:
                f.write(b)
            else:
                os.pwrite(f.fileno(), b, off)
        f.flush()
        os.fsync(f.fileno())
    return {"extents": len(ext), "extent_bytes": EXTENT, "virtual": virt if not dense else len(ext) * EXTENT}


def sparse_files(ctx: Ctx) -> tuple[str, str]:
    gib, mib = ctx.sizes["scale_sparse_gib"], ctx.sizes["scale_data_mib"]
    virt, dbytes = gib << 30, mib << 20
    p = {"virt_gib": gib, "data_mib": mib, "extent": EXTENT, "seed": SPARSE_SEED}
    sp = data.cached(ctx.data(f"scale-sparse-{gib}G-{mib}M.img"), p,
                     lambda x: make_sparse(x, virt, dbytes, False))
    de = data.cached(ctx.data(f"scale-dense-{mib}M.img"), {**p, "dense": True},
                     lambda x: make_sparse(x, virt, dbytes, True))
    return sp, de


def union(a: list, b: list) -> list:
    out = []
    for s, e in sorted(a + b):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def check_sparse(src: str, dst: str, info: dict) -> tuple[bool, str]:
    """Same size, and every range either file has data in reads the same in
    both (outside them both are holes, reading as zeros). The layouts and
    allocations are recorded in info."""
    try:
        ss, sd = os.stat(src), os.stat(dst)
    except OSError as e:
        return False, str(e)
    if ss.st_size != sd.st_size:
        return False, f"size {sd.st_size} != {ss.st_size}"
    ra, rb = verify.data_ranges(src), verify.data_ranges(dst)
    info.update({"src_data_ranges": len(ra), "dst_data_ranges": len(rb), "same_layout": ra == rb,
                 "src_data_bytes": sum(e - s for s, e in ra), "dst_data_bytes": sum(e - s for s, e in rb),
                 "src_allocated": ss.st_blocks * 512, "dst_allocated": sd.st_blocks * 512})
    with open(src, "rb") as fa, open(dst, "rb") as fb:
        compared = 0
        for s, e in union(ra, rb):
            off = s
            while off < e:
                n = min(8 * MiB, e - off)
                if os.pread(fa.fileno(), n, off) != os.pread(fb.fileno(), n, off):
                    return False, f"contents differ in [{off}, {off + n})"
                off += n
                compared += n
    info["compared_bytes"] = compared
    return True, ""


def check_dense(src: str, dst: str, info: dict) -> tuple[bool, str]:
    ok, msg = verify.same_file(src, dst)
    st = os.stat(dst) if os.path.exists(dst) else None
    info.update({"compared_bytes": os.path.getsize(src), "dst_allocated": st.st_blocks * 512 if st else None,
                 "src_allocated": os.stat(src).st_blocks * 512})
    return ok, msg


def file_rows(ctx: Ctx, where: str, sock: str | None = None) -> list[tuple[Tool, str | None, bool]]:
    """(tool, far-side RSS file, far side is a server) for a sparse/dense case."""
    out = []
    if where == "local":
        out += [(Tool("cp --sparse=always", "peer", lambda s, d: f"cp --sparse=always {s} {d}"), None, False),
                (Tool("qemu-img convert -O raw", "peer", lambda s, d: f"qemu-img convert -f raw -O raw {s} {d}",
                      needs=("qemu-img",)), None, False)]
        for f in [ctx.ferry] + ([ctx.base] if ctx.base else []):
            out.append((Tool(f"{f.name} sync", "ferry" if f is ctx.ferry else "ferry-base",
                             lambda s, d, f=f: f"{q(f.path)} sync --json {s} {d}", form="local", ferry=f),
                        None, False))
    elif where == "ssh":
        ssh = ctx.link.ssh_cmd()
        for f in [ctx.ferry] + ([ctx.base] if ctx.base else []):
            w, rss = remote_wrapper(ctx, f)
            out.append((Tool(f"{f.name} sync (ssh)", "ferry" if f is ctx.ferry else "ferry-base",
                             lambda s, d, f=f, w=w: (f"{q(f.path)} sync -e {q(ssh)} --remote-ferry {q(w)} "
                                                     f"--json {s} {ADDR_B}:{d}"), NS_A, form="remote", ferry=f),
                        rss, False))
    else:  # nbd
        uri = q(f"nbd+unix:///?socket={sock}")
        srv = lambda s, d: [Server(f"rm -f {q(sock)}; exec nbdkit -f -r -U {q(sock)} file file={q(s)}",  # noqa: E731
                                   socket=sock, persistent=True)]
        out.append((Tool("nbdcopy", "peer", lambda s, d: f"nbdcopy {uri} {d}", servers=srv,
                         needs=("nbdkit", "nbdcopy")), None, False))
        for f in [ctx.ferry] + ([ctx.base] if ctx.base else []):
            out.append((Tool(f"{f.name} sync nbd+unix://", "ferry" if f is ctx.ferry else "ferry-base",
                             lambda s, d, f=f: f"{q(f.path)} sync --json {uri} {d}", servers=srv,
                             form="nbd", needs=("nbdkit",), ferry=f), None, False))
    return out


def run_file_cases(ctx: Ctx, cname: str, rows, src: str, sparse: bool, after=None) -> None:
    """Each row copies src to a new file, verified; after(src, dst) runs
    once on the first verified copy of the main ferry, before it is removed."""
    tools = usable(ctx, SCEN, [cname], [t for t, _, _ in rows])
    ok = {t.name for t in tools}
    d = os.path.join(ctx.work, "dst", SCEN)
    os.makedirs(d, exist_ok=True)
    for rnd in range(ctx.runs):
        for t, far, server in rotate([r for r in rows if r[0].name in ok], rnd):
            dst = os.path.join(d, slug(t.name) + ".img")
            if os.path.exists(dst):
                os.unlink(dst)
            info: dict = {}
            chk = (lambda: check_sparse(src, dst, info)) if sparse else (lambda: check_dense(src, dst, info))
            t0 = time.monotonic()
            timed_run(ctx, cname, t, src, dst, chk, far=far, server=server, image=True)
            run = last_run(ctx, cname, t)
            if run is not None:
                run["layout"] = info
                log(f"{SCEN}: {cname} / {t.name}: checked in "
                    f"{time.monotonic() - t0 - run.get('wall_s', 0):.0f} s: {info}")
            if after and run is not None and run.get("verified") and t.kind == "ferry" and os.path.exists(dst):
                after(src, dst)
                after = None
            if os.path.exists(dst):
                os.unlink(dst)


def cmp_estimate(src: str, dst: str) -> dict | None:
    """How long `cmp` of the sparse file against its copy would take: cmp -n
    of the first 16 GiB (or all of a smaller file), caches dropped first,
    timed, scaled to the file's size."""
    from .util import sync_and_drop
    size = os.path.getsize(src)
    n = min(size, 16 << 30)
    sync_and_drop()
    t0 = time.monotonic()
    r = sh(["cmp", "-n", str(n), src, dst], check=False)
    dt = time.monotonic() - t0
    if r.returncode != 0:
        return None
    return {"bytes": n, "seconds": round(dt, 2), "full_estimate_s": round(dt * size / n, 1)}


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
    return out


def run_stream(ctx: Ctx, src: str) -> str:
    cname = f"stream {os.path.getsize(src) >> 20} MiB, 1gbit"
    ctx.link.shape("1gbit")
    try:
        rows = stream_rows(ctx)
        tools = usable(ctx, SCEN, [cname], [t for t, _, _ in rows])
        ok = {t.name for t in tools}
        d = os.path.join(ctx.work, "dst", SCEN)
        os.makedirs(d, exist_ok=True)
        for rnd in range(ctx.runs):
            for t, far, server in rotate([r for r in rows if r[0].name in ok], rnd):
                dst = os.path.join(d, slug(t.name) + ".out")
                timed_run(ctx, cname, t, src, dst, lambda: verify.same_file(src, dst), far=far, server=server)
                if os.path.exists(dst):
                    os.unlink(dst)
    finally:
        ctx.link.shape("none")
    return cname


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
        "runs right after, without dropping. ssh rows: namespace A to a real sshd in namespace B over an "
        "unshaped veth pair. Verified: every tree copy's full listing (path, type, size, mtime ns, mode) "
        "equals the source's, and a BLAKE2 hash of the contents of every 100th file (1%) and, after the "
        "churn, of every touched file matches; each sparse copy: size, then every range that either file "
        "has as data compared byte for byte (holes read as zeros in both); dense and stream copies byte "
        "for byte."))
