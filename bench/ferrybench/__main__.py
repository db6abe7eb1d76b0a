"""ferrybench: ferry against the tools it replaces, same data, same link,
one run. Entry point: bash bench/run.sh [options] [scenario ...]."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shlex
import signal
import subprocess
import sys

from . import base, report, util
from .ferry_forms import Ferry
from .link import PRESETS, Link, Procs, netns_available
from .runner import Ctx
from .scenarios import SCENARIOS
from .util import log, loud

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(BENCH)

FULL = dict(files=1024, file_kb=256, big_mib=512, mangle_pct=5.0, img_mib=512, img_data_mib=64,
            guest_img_mib=512, guest_data_mib=300, stream_mib=1024, resume_mib=1024, resume_kill_pct=60.0,
            lfp_mib=2048, scale_files=1_000_000, scale_sparse_gib=1024, scale_data_mib=1024,
            scale_stream_mib=2048, runs=3)
QUICK = dict(files=48, file_kb=32, big_mib=16, mangle_pct=5.0, img_mib=64, img_data_mib=8,
             guest_img_mib=64, guest_data_mib=36, stream_mib=32, resume_mib=64, resume_kill_pct=60.0, lfp_mib=64,
             scale_files=2000, scale_sparse_gib=4, scale_data_mib=16, scale_stream_mib=64, runs=1)
# The sizes the open issues state their targets at (--issue-sizes): a 1 GiB
# tree of 1 MiB files, a 1 GiB big file, a 4 GiB sparse image with ~300 MiB
# allocated, a 2 GiB ext4 image with ~1.2 GiB of files written (half then
# deleted), a 2 GiB stream, a 4 GiB file killed at 60% and resumed, 2 GiB
# over a long fat pipe (lfp: its default is the issue's size already).
ISSUE = dict(files=1024, file_kb=1024, big_mib=1024, mangle_pct=5.0, img_mib=4096, img_data_mib=300,
             guest_img_mib=2048, guest_data_mib=1228, stream_mib=2048, resume_mib=4096, resume_kill_pct=60.0,
             lfp_mib=2048, scale_files=1_000_000, scale_sparse_gib=1024, scale_data_mib=1024,
             scale_stream_mib=2048)
FLOATS = ("mangle_pct", "resume_kill_pct")

DESCRIBE = {
    "tree": "A tree ({files} files, about {file_kb} KiB each, half compressible text, half random, "
            "a few empty files and symlinks) pushed over ssh from namespace A to B: the initial copy, "
            "an unchanged re-run, then 30% and 60% of the files rewritten (whole files, so N% churn "
            "changes about N% of the bytes). Each tool keeps its own destination through the phases.",
    "bigfile": "One {big_mib} MiB file (1 MiB blocks, half random, half text) already at the destination "
               "in its old version; the source has {mangle_pct:g}% of it overwritten in scattered 4-64 KiB "
               "pieces, or 7 bytes inserted at 1 MiB (everything after shifts). Pushed over ssh. The insert case "
               "leaves out the --whole-file variants: what they send does not depend on the change.",
    "sparse": "A raw image of {img_mib} MiB with {img_data_mib} MiB allocated in extents of 64 KiB to 4 MiB: "
              "one third random data, one third English-like text, one third written zeros (by bytes), "
              "the rest holes. scp and rsync push over ssh; nbdkit (file plugin, "
              "read-only) serves it from A over TCP and nbdcopy / qemu-img convert pull it into a file in B "
              "(server start not timed). dst allocated = st_blocks of the copy.",
    "guest": "An ext4 image of {guest_img_mib} MiB (4 KiB blocks, made by mkfs.ext4 -d) with {guest_data_mib} MiB "
             "of files written (64 KiB to 32 MiB, half random, half text), then half of them (by bytes) deleted "
             "in the guest with debugfs: their blocks are free, their bytes still on the disk. Pushed over ssh "
             "(nbdkit + qemu-img convert: pulled into B); then the same image as `disk.img` inside a tar "
             "(`vm.ova`), read in place by ferry against unpacking it first; then copied locally (no link) "
             "against `e2image -ra`, which copies only the blocks in use. dst allocated = st_blocks of the copy.",
    "stream": "A {stream_mib} MiB stream (1 MiB blocks, 60% random, 40% text) read from a file and written "
              "to a file on the other side; then, as case \"incompressible\", {stream_mib} MiB of random "
              "bytes (no zstd row: nothing to gain). mbuffer's receiver is started (untimed) before the "
              "sender, as its users must; `-s 128k -m 128M` both ends.",
    "local": "The same tree, image and mangled big file copied disk to disk on one host: tree initial "
             "copy / unchanged / 30% churn, sparse image copy, the sparse image read from a local NBD "
             "export (qemu-nbd on a unix socket, started untimed) into a file, big-file update.",
    "resume": "One {resume_mib} MiB file of random bytes pushed over ssh into an empty directory in B: "
              "a full copy; then a copy killed with SIGKILL when {resume_kill_pct:g}% of the file is at the "
              "destination, and the same command run again to finish it (the resume, timed and verified). "
              "Not in the default set: `bash bench/run.sh resume`, or with --issue-sizes.",
    "lfp": "{lfp_mib} MiB of random bytes over a long fat pipe, 1 Gbit/s with 100 ms RTT (1gbit-100ms), then the "
           "same with 0.1% of the frames lost each way (1gbit-100ms-loss): piped to a file in B (`ferry pipe` with "
           "its automatic number of connections and with `--streams 1`, `mbuffer -O`/`-I`, `zstd -1 -T0 | ssh`) "
           "and synced as a file (`ferry sync --direct`, default and `--streams 1`, rsync over ssh); iperf3 -P 8 "
           "and one stream measured on the same link as references. Only when named: `bash bench/run.sh lfp`.",
    "scale": "Issue 21, ferry at scale. (1) A tree of {scale_files} files of 0-8 KiB (random bytes; one "
             "directory per 100 files) copied locally (`ferry sync SRC/ DST/` against `rsync -a`) and pushed "
             "over ssh to namespace B (unshaped veth, real sshd): the initial copy, an unchanged re-run with "
             "the cache dropped (cold) and one right after (warm), then 10% of the files deleted and 10% "
             "touched (a tenth of those rewritten) and a re-run with --delete. (2) A {scale_sparse_gib} GiB "
             "sparse file with {scale_data_mib} MiB of random data in 256 KiB extents evenly spread, and a "
             "dense file of the same bytes: copied locally (ferry, cp --sparse=always, qemu-img convert), "
             "pushed over ssh (ferry) and read from an NBD export of it (nbdkit's file plugin on a unix "
             "socket; ferry, nbdcopy). (3) A {scale_stream_mib} MiB stream (60% random, 40% text) over the "
             "1gbit link with ferry pipe and send / recv at `-m 256M`. Peak RSS per side under the targets "
             "table. Only when named: `bash bench/run.sh scale` (one run unless --runs; --scale-files etc. "
             "to run smaller).",
}


def parse(argv):
    p = argparse.ArgumentParser(
        prog="bench/run.sh",
        description="Benchmark ferry against rsync, scp, qemu-img, nbdkit+nbdcopy and mbuffer "
                    "on the same data over the same emulated link in one run.")
    p.add_argument("scenarios", nargs="*", metavar="SCENARIO",
                   help=f"any of {', '.join(SCENARIOS)} (default: all but "
                        f"{', '.join(s for s in SCENARIOS if not SCENARIOS[s].get('default', True))}; "
                        "--issue-sizes adds those unless --quick, except "
                        f"{', '.join(s for s in SCENARIOS if SCENARIOS[s].get('named_only'))}, which runs only "
                        "when named)")
    p.add_argument("--quick", action="store_true",
                   help="smoke mode for CI: tiny data, 1 run, link 1gbit; fails only on a verification error")
    p.add_argument("--runs", type=int, help="timed runs per tool and case (default 3, quick 1)")
    p.add_argument("--link", choices=list(PRESETS),
                   help="one link for every networked scenario "
                        "(default: tree/bigfile/stream/resume 1gbit, sparse/guest 100mbit); lfp runs its own "
                        "two (1gbit-100ms, 1gbit-100ms-loss), or only the one named here")
    p.add_argument("--ferry", help="ferry binary (default: $FERRY, $CARGO_TARGET_DIR/release/ferry, target/release/ferry)")
    p.add_argument("--work", default=os.environ.get("FERRYBENCH_WORK", "/var/tmp/ferrybench"),
                   help="scratch directory for data and destinations (default /var/tmp/ferrybench; data is cached here)")
    p.add_argument("--out", help="results directory (default bench/results/<UTC timestamp>)")
    p.add_argument("--report", metavar="FILE", help="also write/update FILE (e.g. BENCHMARKS.md) and bench/charts/*.png")
    p.add_argument("--timeout", type=float,
                   help="seconds before one timed run is killed and FAILs (default 1800, quick 120 "
                        "unless --issue-sizes)")
    g = p.add_argument_group("data sizes (defaults: full / --quick; --issue-sizes sets all of them, "
                                 "explicit flags still win)")
    g.add_argument("--issue-sizes", action="store_true",
                   help="the sizes the issues state their targets at: tree 1024 files x 1024 KiB, "
                        "big file 1024 MiB, sparse image 4096 MiB with ~300 MiB allocated, guest ext4 image "
                        "2048 MiB with 1228 MiB of files written, stream 2048 MiB, "
                        "resume 4096 MiB (and the resume scenario joins the default set)")
    for k, h in (("files", "tree: number of files"), ("file_kb", "tree: average file size, KiB"),
                 ("big_mib", "bigfile: size, MiB"), ("mangle_pct", "bigfile: percent overwritten"),
                 ("img_mib", "sparse: virtual size, MiB"), ("img_data_mib", "sparse: data written, MiB"),
                 ("guest_img_mib", "guest: ext4 image size, MiB"),
                 ("guest_data_mib", "guest: MiB of files written into it (about half then deleted)"),
                 ("stream_mib", "stream: size, MiB"), ("resume_mib", "resume: file size, MiB"),
                 ("resume_kill_pct", "resume: kill the copy when this %% of the file is at the destination"),
                 ("lfp_mib", "lfp: MiB of random bytes streamed and synced over the long fat pipes"),
                 ("scale_files", "scale: files in the tree (one directory per 100)"),
                 ("scale_sparse_gib", "scale: the sparse file's size, GiB"),
                 ("scale_data_mib", "scale: MiB of data in it (256 KiB extents), and the dense file's size"),
                 ("scale_stream_mib", "scale: the stream's size, MiB")):
        g.add_argument("--" + k.replace("_", "-"), type=float if k in FLOATS else int,
                       help=f"{h} ({FULL[k]:g} / {QUICK[k]:g}; issue {ISSUE[k]:g})".replace("1e+06", "1000000"))
    p.add_argument("--probe", action="store_true",
                   help="only report which ferry forms this binary supports (sets up the link), then exit")
    p.add_argument("--gen-only", action="store_true",
                   help="only generate (and cache in --work) the data the chosen scenarios need, then exit")
    p.add_argument("--built-from", metavar="TEXT",
                   help="what the ferry binary was built from, for the report (default: this checkout's HEAD)")
    p.add_argument("--ferry-base", metavar="PATH",
                   help="a second ferry binary (e.g. built from an older commit): every ferry row also runs "
                        "with it (`ferry@base ...`, its far side too), interleaved with the main binary and "
                        "the peers; the report compares ferry's ratio to its best peer for both")
    p.add_argument("--base-label", metavar="TEXT",
                   help="what the --ferry-base binary was built from, for the report (default: its --version)")
    p.add_argument("-v", "--verbose", action="store_true", help="log every command")
    a = p.parse_args(argv)
    for s in a.scenarios:
        if s not in SCENARIOS:
            p.error(f"unknown scenario {s!r}; choose from {', '.join(SCENARIOS)}")
    if a.resume_kill_pct is not None and not 0 < a.resume_kill_pct < 100:
        p.error("--resume-kill-pct: between 0 and 100 (exclusive)")
    if a.ferry_base and not os.access(a.ferry_base, os.X_OK):
        p.error(f"--ferry-base {a.ferry_base}: not an executable file")
    if a.base_label and not a.ferry_base:
        p.error("--base-label goes with --ferry-base")
    return a


def find_ferry(a) -> str | None:
    cands = [a.ferry, os.environ.get("FERRY")]
    if os.environ.get("CARGO_TARGET_DIR"):
        cands.append(os.path.join(os.environ["CARGO_TARGET_DIR"], "release", "ferry"))
    cands.append(os.path.join(REPO, "target", "release", "ferry"))
    for c in cands:
        if c and os.access(c, os.X_OK):
            return os.path.abspath(c)
    return None


def git_commit() -> str:
    r = subprocess.run(["git", "-C", REPO, "log", "-1", "--format=%h (%cd)", "--date=format:%Y-%m-%d %H:%M"],
                       capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--", "crates", "Cargo.lock"],
                           capture_output=True, text=True).stdout.strip()
    return (r.stdout.strip() or "?") + (" + uncommitted changes in crates/" if dirty else "")


def main(argv=None) -> int:
    a = parse(sys.argv[1:] if argv is None else argv)
    util.VERBOSE = a.verbose
    defaults = dict(QUICK if a.quick else FULL)
    if a.issue_sizes:
        defaults.update(ISSUE)  # runs and link stay those of the mode (--quick: 1 run, 1gbit)
    sizes = {k: (getattr(a, k) if getattr(a, k, None) is not None else defaults[k])
             for k in defaults if k != "runs"}
    sizes["timeout"] = a.timeout or (120.0 if a.quick and not a.issue_sizes else 1800.0)
    runs = a.runs or defaults["runs"]
    # resume is not in the default set (it kills copies and takes a while),
    # except at the issues' sizes, where its issue states its target
    wanted = a.scenarios or [s for s in SCENARIOS if SCENARIOS[s].get("default", True)
                             or (a.issue_sizes and not a.quick and not SCENARIOS[s].get("named_only"))]
    if a.gen_only:
        from . import guest as gu, lfp, scale, scenarios as sc
        ctx = Ctx(work=a.work, ferry=None, link=None, procs=None, logdir="", runs=runs, sizes=sizes)
        need = {"tree": [sc.tree_base], "bigfile": [sc.big_files], "sparse": [sc.sparse_img], "guest": [gu.guest_data],
                "stream": [sc.stream_file, sc.random_stream_file],
                "local": [sc.tree_base, sc.sparse_img, sc.big_files], "resume": [sc.resume_file],
                "lfp": [lfp.lfp_file], "scale": [scale.tree_data, scale.sparse_files, scale.stream_data]}
        for s in wanted:
            for fn in need[s]:
                log(f"data: {fn.__name__} -> {fn(ctx)}")
        return 0
    ferry_path = find_ferry(a)
    if not ferry_path and not a.ferry and util.which("cargo") and os.path.exists(os.path.join(REPO, "Cargo.toml")):
        # a fresh clone (CI): build the release binary the suite measures
        log("no ferry binary found: cargo build --release -p ferry-cli")
        r = subprocess.run(["cargo", "build", "--release", "-p", "ferry-cli"], cwd=REPO)
        if r.returncode == 0:
            ferry_path = find_ferry(a)
    if not ferry_path:
        print("ferrybench: no ferry binary; build it (CARGO_TARGET_DIR=... cargo build --release -p ferry-cli) "
              "or pass --ferry PATH", file=sys.stderr)
        return 2
    started = dt.datetime.now(dt.timezone.utc)
    load0 = os.getloadavg()
    outdir = a.out or os.path.join(BENCH, "results", started.strftime("%Y%m%dT%H%M%SZ"))
    os.makedirs(outdir, exist_ok=True)
    logdir = os.path.join(outdir, "logs")
    os.makedirs(logdir, exist_ok=True)
    os.makedirs(a.work, exist_ok=True)
    pidfile = os.environ.get("FERRYBENCH_PIDFILE")
    procs = Procs(pidfile)

    def on_signal(sig, _frame):
        raise KeyboardInterrupt(f"signal {sig}")
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if inherited as ignored
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    net = [s for s in wanted if SCENARIOS[s]["net"]] if not a.probe else ["probe"]
    ok_ns, why = netns_available() if net else (False, "")
    skipped = []
    if net and not ok_ns:
        loud(f"SKIPPED: network scenarios ({', '.join(net)}): network namespaces unavailable ({why}); "
             "running the local scenario only")
        skipped = net
        wanted = [s for s in wanted if not SCENARIOS[s]["net"]] or ["local"]
    if a.probe:
        wanted = ["tree"] if ok_ns else []
    can_drop = util.sync_and_drop()
    if not can_drop:
        loud("WARNING: cannot drop caches (not root): runs are warm-cache")

    # One run at a time: a second run would tear down the first's namespaces
    # (same names) and skew its timings anyway.
    import fcntl
    try:
        lock = open("/tmp/ferrybench.lock", "a")
    except OSError:  # someone else's lock file and we are not root: no netns for us anyway
        lock = None
    try:
        if lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        print("ferrybench: another run is active (/tmp/ferrybench.lock); one at a time", file=sys.stderr)
        return 2
    link = None
    ferry = Ferry(ferry_path, a.work)

    def scen_link(s):
        own = SCENARIOS[s].get("links")  # shapes its links itself, in turn; --link may pick one
        if own:
            return a.link if a.link in own else ", ".join(own)
        return (a.link or ("1gbit" if a.quick else SCENARIOS[s]["link"])) if SCENARIOS[s]["net"] else None
    links = {s: scen_link(s) for s in wanted}
    records = []
    ctx = None
    interrupted = False
    try:
        if any(SCENARIOS[s]["net"] for s in wanted):
            link = Link(a.work, procs)
            try:
                link.create()
                link.shape("none")
                link.start_sshd(ferry_path)
            except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                # e.g. no sshd or no tbf qdisc: same treatment as no netns
                procs.stop_all()
                link.close()
                link = None
                why = f"link setup failed: {str(e).strip().splitlines()[0] if str(e).strip() else e!r}"
                skipped = [s for s in wanted if SCENARIOS[s]["net"]]
                loud(f"SKIPPED: network scenarios ({', '.join(skipped)}): {why}; running the local scenario only")
                wanted = [s for s in wanted if not SCENARIOS[s]["net"]] or ["local"]
                links = {s: None for s in wanted}
        log(f"ferry: {ferry_path} ({ferry.version()})")
        ferry.probe(procs, link, logdir)
        base_ferry = None
        if a.ferry_base:
            log(f"{base.NAME}: {os.path.abspath(a.ferry_base)} ({a.base_label or 'no label'})")
            base_ferry = base.probe(a.ferry_base, a.work, procs, link, logdir)
        if a.probe:
            for f in [ferry] + ([base_ferry] if base_ferry else []):
                for k, (ok, why) in f.forms.items():
                    name = f"{f.name} {k}" if base_ferry else k
                    print(f"{name:{25 if base_ferry else 14}} {'supported' if ok else 'n/a (' + why + ')'}")
            return 0
        ctx = Ctx(work=a.work, ferry=ferry, link=link, procs=procs, logdir=logdir, runs=runs, sizes=sizes,
                  base=base_ferry)
        for s in wanted:
            if SCENARIOS[s].get("links"):
                ctx.current_link = links[s]  # the scenario shapes them
            elif SCENARIOS[s]["net"]:
                link.shape(links[s])
                ctx.current_link = links[s]
            else:
                ctx.current_link = "none"
            # a scenario may run fewer times by default (scale: one), --runs still wins
            ctx.runs = a.runs or SCENARIOS[s].get("runs") or runs
            log(f"=== scenario {s} (seed {SCENARIOS[s]['seed']}), link {links[s] or 'local'}, {ctx.runs} run(s)")
            SCENARIOS[s]["fn"](ctx)
    except KeyboardInterrupt as e:
        loud(f"interrupted ({e}); cleaning up, then writing what was measured")
        interrupted = True
    finally:
        procs.stop_all()
        if link:
            link.close()
        if ctx is not None:
            records = list(ctx.records.values())

    if interrupted and not records:
        return 130
    cmd = "bash bench/run.sh " + shlex.join(sys.argv[1:] if argv is None else argv)
    if interrupted:
        cmd += "   # INTERRUPTED: partial results"
    meta = {
        "started": started.strftime("%Y-%m-%d %H:%M UTC"), "command": cmd.strip(),
        "machine": report.machine(a.work), "ferry_version": ferry.version(), "ferry_path": ferry_path,
        "commit": a.built_from or git_commit(), "runs": runs if len(wanted) != 1 else (a.runs or SCENARIOS[wanted[0]].get("runs") or runs),
        "links": links, "sizes": sizes,
        "drop_caches": can_drop, "skipped": skipped,
        "loadavg_start": [round(x, 2) for x in load0], "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "finished": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "forms": ferry.forms_json(),
        **({"base": base.meta(ctx.base, a.base_label)} if ctx is not None and ctx.base else {}),
        "seeds": {s: SCENARIOS[s]["seed"] for s in SCENARIOS},
        "extra": ctx.extra if ctx is not None else {},
        "describe": {s: DESCRIBE[s].format(**sizes) for s in SCENARIOS},
        "data_text": (("Sizes: --issue-sizes (the issues' own). " if a.issue_sizes else "")
                      + f"tree {sizes['files']} files x ~{sizes['file_kb']} KiB "
                      f"(~{sizes['files'] * sizes['file_kb'] / 1024:.0f} MiB); big file {sizes['big_mib']} MiB "
                      f"({sizes['mangle_pct']:g}% mangled / 7 bytes inserted); sparse image {sizes['img_mib']} MiB "
                      f"with ~{sizes['img_data_mib']} MiB allocated (thirds random / text / written zeros); guest ext4 image "
                      f"{sizes['guest_img_mib']} MiB with {sizes['guest_data_mib']} MiB of files written, about "
                      f"half deleted; stream {sizes['stream_mib']} MiB (and as many random bytes). "
                      + (f"Resume: {sizes['resume_mib']} MiB of random bytes, killed at "
                         f"{sizes['resume_kill_pct']:g}%. " if "resume" in wanted else "")
                      + (f"Long fat pipes: {sizes['lfp_mib']} MiB of random bytes. " if "lfp" in wanted else "")
                      + (f"Scale: a tree of {sizes['scale_files']} files of 0-8 KiB, a {sizes['scale_sparse_gib']} GiB "
                         f"sparse file with {sizes['scale_data_mib']} MiB of data, a {sizes['scale_stream_mib']} MiB "
                         "stream. " if "scale" in wanted else "")
                      + 
                      "Generated deterministically (seeded) by bench/ferrybench/data.py."),
    }
    text, charts = report.write_results(outdir, meta, records)
    print(text)
    if a.report:
        report.write_benchmarks_md(os.path.abspath(a.report), REPO, outdir, meta, records, charts)
    if interrupted:
        loud("INTERRUPTED: the results above are partial")
        return 130
    fails = [r for r in records if r["status"] == "FAIL" and r["kind"] != base.KIND]
    base_fails = [r for r in records if r["status"] == "FAIL" and r["kind"] == base.KIND]
    na = [r for r in records if r["status"] == "n/a"]
    log(f"results: {outdir}/results.md, results.json" + (", charts" if charts else ""))
    if skipped:
        loud(f"SKIPPED: {', '.join(skipped)} ({why})")
    # the plain closing line CI runners understand: measured rows passed,
    # n/a rows skipped
    for r in base_fails:  # reported, but only the main binary's rows fail the bench
        loud(f"FAILED (base binary, does not fail the bench): {r['scenario']} / {r['case']} / {r['tool']}: "
             f"{r['reason']}")
    print(f"bench: {len(records) - len(fails) - len(base_fails) - len(na)} passed, {len(fails)} failed, "
          f"{len(na)} skipped" + (f", {len(base_fails)} base failed (not counted)" if base_fails else ""),
          flush=True)
    if fails:
        for r in fails:
            loud(f"FAILED: {r['scenario']} / {r['case']} / {r['tool']}: {r['reason']}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
