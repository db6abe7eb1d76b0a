"""The scale scenario's sparse and dense files (part 2 in scale.py's
docstring): the --scale-sparse-gib GiB sparse file with --scale-data-mib MiB
of random bytes in 256 KiB extents and the dense file of the same bytes
(cached under --work), the data-range check (SEEK_DATA / SEEK_HOLE) and the
byte-for-byte one, the rows copying them (locally: ferry, cp, qemu-img; over
ssh: ferry; from an nbdkit export: ferry, nbdcopy), and the `cmp` estimate.
"""

from __future__ import annotations

import os
import random
import time

from . import data, verify
from .link import ADDR_B, NS_A
from .measure import Server
from .runner import Ctx, Tool
from .scale_common import KiB, MiB, SCEN, last_run, paired, q, remote_wrapper, rounds, timed_run
from .util import log, sh

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
    return paired(ctx, out)


def run_file_cases(ctx: Ctx, cname: str, rows, src: str, sparse: bool, after=None) -> None:
    """Each row copies src to a new file, verified; after(src, dst) runs
    once on the first verified copy of the main ferry, before it is removed."""
    for t, far, server, dst in rounds(ctx, cname, rows, ".img"):
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
