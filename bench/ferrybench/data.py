"""Deterministic, seeded data generators. The same flags and seed give the
same bytes on every machine (random.Random is specified to be stable for a
given seed), so two runs, or two tools, see identical data.

Text is built from slices of a 4 MiB pool of pseudo-words taken at random
offsets, so it compresses like prose (zstd -1 about 2.5-3x) but repeats
only beyond zstd -1's 512 KiB window.
"""

from __future__ import annotations

import json
import os
import random
import shutil

MiB = 1 << 20
KiB = 1 << 10

_POOL: bytes | None = None


def _text_pool() -> bytes:
    global _POOL
    if _POOL is None:
        rnd = random.Random(0x7E47)
        letters = "etaoinshrdlcumwfgypbvkjxqz"
        weights = [12, 9, 8, 7, 7, 6, 6, 6, 5, 4, 4, 3, 3, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1]
        vocab = ["".join(rnd.choices(letters, weights, k=rnd.randint(2, 10))) for _ in range(6000)]
        vocab += [w.capitalize() + "," for w in vocab[:400]] + [w + "." for w in vocab[:400]]
        words = rnd.choices(vocab, k=760_000)
        for i in range(0, len(words), rnd.randint(9, 14)):
            words[i] += "\n"
        _POOL = " ".join(words).encode()[: 4 * MiB]
    return _POOL


def text_bytes(rnd: random.Random, n: int) -> bytes:
    pool = _text_pool()
    out = bytearray()
    while len(out) < n:
        take = min(n - len(out), rnd.randint(16 * KiB, 64 * KiB))
        off = rnd.randrange(0, len(pool) - take)
        out += pool[off: off + take]
    return bytes(out)


def random_bytes(rnd: random.Random, n: int) -> bytes:
    if n <= 64 * MiB:
        return rnd.randbytes(n)
    return b"".join(rnd.randbytes(min(64 * MiB, n - o)) for o in range(0, n, 64 * MiB))


def _write_mixed(f, rnd: random.Random, size: int, p_random: float, block=MiB):
    left = size
    while left > 0:
        n = min(block, left)
        f.write(random_bytes(rnd, n) if rnd.random() < p_random else text_bytes(rnd, n))
        left -= n


# -- caching ---------------------------------------------------------------

def cached(path: str, params: dict, make) -> str:
    """Build `path` with make(path) unless a marker says it was built with
    the same params. If make returns a dict (what the generator knows about
    the data, e.g. the sparse image's layout), it is kept beside the data
    as PATH.info.json (see info())."""
    marker = path.rstrip("/") + ".params.json"
    infof = path.rstrip("/") + ".info.json"
    want = json.dumps(params, sort_keys=True)
    if os.path.exists(marker) and os.path.exists(path):
        with open(marker) as f:
            if f.read() == want:
                return path
    for p in (path, marker, infof):
        if os.path.isdir(p):
            shutil.rmtree(p)
        elif os.path.lexists(p):
            os.unlink(p)
    got = make(path)
    if isinstance(got, dict):
        with open(infof, "w") as f:
            json.dump(got, f)
    with open(marker, "w") as f:
        f.write(want)
    return path


def info(path: str) -> dict | None:
    """What the generator recorded about cached data (PATH.info.json)."""
    try:
        with open(path.rstrip("/") + ".info.json") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def set_info(path: str, **kv) -> None:
    """Add figures derived once from the data (e.g. a compressed size) to
    PATH.info.json, so the next run reuses them."""
    d = info(path) or {}
    d.update(kv)
    tmp = path.rstrip("/") + ".info.json.tmp"
    with open(tmp, "w") as f:
        json.dump(d, f)
    os.replace(tmp, path.rstrip("/") + ".info.json")


# -- generators ------------------------------------------------------------

def tree(root: str, files: int, file_kb: int, seed: int = 1) -> None:
    """N files in directories of 64; even-numbered files compressible text,
    odd-numbered random; sizes spread 0.25x-1.75x around file_kb; a few
    empty files and symlinks so metadata paths are exercised too."""
    rnd = random.Random(seed)
    os.makedirs(root, exist_ok=True)
    for i in range(files):
        d = os.path.join(root, f"d{i // 64:03d}")
        os.makedirs(d, exist_ok=True)
        size = 0 if i % 97 == 13 else int(file_kb * KiB * rnd.uniform(0.25, 1.75))
        with open(os.path.join(d, f"f{i:05d}.{'txt' if i % 2 == 0 else 'bin'}"), "wb") as f:
            f.write(text_bytes(rnd, size) if i % 2 == 0 else random_bytes(rnd, size))
    for j in range(max(1, files // 256)):
        os.symlink(f"d000/f{j:05d}.txt", os.path.join(root, f"link{j}"))


def tree_files(root: str) -> list[str]:
    out = []
    for dp, dns, fns in os.walk(root):
        dns.sort()
        for fn in sorted(fns):
            p = os.path.join(dp, fn)
            if not os.path.islink(p):
                out.append(p)
    return out


def churn(root: str, percent: float, seed: int) -> int:
    """Rewrite percent% of the files completely (same size, new bytes of the
    same kind). Unlike the seed's generator, which rewrote only the first
    MiB, N% churn here really changes about N% of the bytes. Returns the
    number of bytes rewritten."""
    rnd = random.Random(seed)
    files = tree_files(root)
    pick = rnd.sample(files, round(len(files) * percent / 100))
    total = 0
    for p in sorted(pick):
        st = os.stat(p)
        size = st.st_size
        data = text_bytes(rnd, size) if p.endswith(".txt") else random_bytes(rnd, size)
        with open(p, "wb") as f:
            f.write(data)
        # A change made within the same second as the previous copy would
        # keep size and (to the second) mtime, and rsync's quick check would
        # rightly skip it; real changes come later, so move mtime at least
        # 2 s past the old one.
        t = max(os.stat(p).st_mtime_ns, st.st_mtime_ns + 2_000_000_000)
        os.utime(p, ns=(t, t))
        total += size
    return total


def bigfile(path: str, size_mib: int, seed: int = 2) -> None:
    """One file of 1 MiB blocks, half random, half text."""
    rnd = random.Random(seed)
    with open(path, "wb") as f:
        _write_mixed(f, rnd, size_mib * MiB, 0.5)


def mangle(path: str, percent: float, seed: int = 3) -> int:
    """Scattered 4-64 KiB overwrites with random bytes until percent% of the
    file has been overwritten (in place). Returns bytes overwritten."""
    rnd = random.Random(seed)
    size = os.path.getsize(path)
    goal = int(size * percent / 100)
    done = 0
    with open(path, "r+b") as f:
        while done < goal:
            n = min(rnd.randint(4 * KiB, 64 * KiB), goal - done)
            f.seek(rnd.randrange(0, size - n))
            f.write(random_bytes(rnd, n))
            done += n
    return done


def insert(src: str, dst: str, at: int = MiB, data: bytes = b"FERRY!\n") -> None:
    """dst = src with `data` (7 bytes) inserted at offset `at`: everything
    after it shifts, which defeats aligned-block matching."""
    with open(src, "rb") as i, open(dst, "wb") as o:
        o.write(i.read(at))
        o.write(data)
        shutil.copyfileobj(i, o, 8 * MiB)


def sparse_image(path: str, size_mib: int, data_mib: int, seed: int = 4) -> dict:
    """A raw disk image of size_mib with data_mib allocated (the issue's mix:
    "extents of 64 KiB to 4 MiB: one third random data, one third
    English-like text, one third written zeros"), the rest holes.

    Extent sizes are 64 KiB multiples, log-uniform between 64 KiB and 4 MiB
    (at most data/8, so a small --quick image still gets the three kinds in
    about equal parts); each extent takes the kind that has the fewest bytes
    so far, so the kinds are thirds by bytes to within one extent. Extents
    do not overlap and sit at 64 KiB-aligned offsets with random holes
    between them, so what is allocated is exactly data_mib. Returns the
    layout ({"extents": [[offset, length, kind], ...], "bytes": {kind: n}}),
    which the scenarios use for the floor (random + compressed text)."""
    rnd = random.Random(seed)
    unit = 64 * KiB
    size = size_mib * MiB
    total = min(data_mib * MiB, size) // unit * unit
    top = max(unit, min(4 * MiB, total // 8 // unit * unit))
    lens: list[int] = []
    left = total
    while left > 0:
        n = max(1, round(2 ** rnd.uniform(0, (top // unit).bit_length() - 1))) * unit
        n = min(n, top, left)
        lens.append(n)
        left -= n
    kinds = ("random", "text", "zero")
    have = {k: 0 for k in kinds}
    exts = []
    for n in lens:
        k = min(kinds, key=lambda k: (have[k], kinds.index(k)))
        have[k] += n
        exts.append([n, k])
    rnd.shuffle(exts)
    holes = (size - total) // unit
    cuts = sorted(rnd.randint(0, holes) for _ in exts)
    layout = []
    with open(path, "wb") as f:
        f.truncate(size)
        pos, prev = 0, 0
        for (n, k), c in zip(exts, cuts):
            pos += (c - prev) * unit
            prev = c
            f.seek(pos)
            if k == "zero":
                f.write(bytes(n))  # written, so allocated: zeros a tool must not send
            elif k == "random":
                f.write(random_bytes(rnd, n))
            else:
                f.write(text_bytes(rnd, n))
            layout.append([pos, n, k])
            pos += n
    return {"extents": layout, "bytes": have}


# -- a guest filesystem (the guest scenario) -------------------------------

GUEST_MIN, GUEST_MAX = 64 * KiB, 32 * MiB


def guest_image(path: str, img_mib: int, data_mib: int, seed: int = 8) -> dict:
    """An ext4 image of img_mib (4 KiB blocks) as a guest leaves it: made by
    `mkfs.ext4 -q -F -b 4096 -d TREE` from about data_mib of files (sizes
    log-uniform between 64 KiB and 32 MiB, at most data/8 so a small image
    still gets a few dozen files; each file random or text, whichever kind
    has fewer bytes so far; in 8 directories), then about half of each
    kind's bytes deleted by `debugfs -w` (`rm` frees their blocks; their
    bytes stay on the disk, as after a guest's `rm`). UUID, hash seed and
    timestamps are fixed, so the image is byte for byte the same on every
    machine with the same e2fsprogs.

    Returns {"files": [[path, size, kind, kept], ...], "bytes": {...}} with
    the filesystem's block size and used bytes ((Block count - Free blocks)
    x Block size, from `dumpe2fs -h`)."""
    import subprocess
    import uuid
    rnd = random.Random(seed)
    stage = path + ".stage"
    shutil.rmtree(stage, ignore_errors=True)
    total, top = data_mib * MiB, max(GUEST_MIN, min(GUEST_MAX, data_mib * MiB // 8))
    files, have, left, i = [], {"random": 0, "text": 0}, total, 0
    while left > 0:
        n = min(left, int(2 ** rnd.uniform(GUEST_MIN.bit_length() - 1, top.bit_length() - 1)))
        kind = min(have, key=lambda k: (have[k], k))
        rel = f"d{rnd.randrange(8)}/f{i:04d}.{'bin' if kind == 'random' else 'txt'}"
        os.makedirs(os.path.join(stage, os.path.dirname(rel)), exist_ok=True)
        with open(os.path.join(stage, rel), "wb") as f:
            f.write(random_bytes(rnd, n) if kind == "random" else text_bytes(rnd, n))
        files.append([rel, n, kind, True])
        have[kind] += n
        left -= n
        i += 1
    for dp, dns, fns in os.walk(stage):
        for x in dns + fns + [""]:
            os.utime(os.path.join(dp, x), (1_600_000_000, 1_600_000_000))
    # Half of each kind's bytes, by files taken in a seeded order, each one
    # deleted when that brings the kind closer to half.
    gone = {"random": 0, "text": 0}
    for fl in sorted(files, key=lambda _: rnd.random()):
        half = have[fl[2]] / 2
        if abs(gone[fl[2]] + fl[1] - half) < abs(gone[fl[2]] - half):
            gone[fl[2]] += fl[1]
            fl[3] = False
    u = uuid.UUID(int=rnd.getrandbits(128), version=4)
    env = dict(os.environ, E2FSPROGS_FAKE_TIME="1600000000")
    try:
        subprocess.run(["mkfs.ext4", "-q", "-F", "-b", "4096", "-U", str(u), "-E", f"hash_seed={u}",
                        "-d", stage, path, f"{img_mib}M"], check=True, env=env, capture_output=True)
        # mkfs -d copies each entry's ctime, which no one can set on the
        # stage; fix it, then delete.
        ents = ["/", "/lost+found"] + sorted({"/" + os.path.dirname(f[0]) for f in files}) \
            + ["/" + f[0] for f in files]
        cmds = "".join(f"sif {e} ctime @1600000000\n" for e in ents) \
            + "".join(f"rm /{f[0]}\n" for f in files if not f[3])
        subprocess.run(["debugfs", "-w", "-f", "-", path], input=cmds.encode(), check=True, env=env,
                       capture_output=True)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    out = subprocess.run(["dumpe2fs", "-h", path], check=True, capture_output=True, text=True).stdout
    hdr = {k.strip(): v.strip() for k, v in (ln.split(":", 1) for ln in out.splitlines() if ":" in ln)}
    bs = int(hdr["Block size"])
    used = (int(hdr["Block count"]) - int(hdr["Free blocks"])) * bs
    kept = {k: have[k] - gone[k] for k in have}
    return {"files": files, "block_size": bs, "used_bytes": used,
            "bytes": {"written": total, "deleted": gone, "kept": kept, "by_kind": have}}


def read_extents(path: str, extents: list, kind: str, chunk: int = 8 * MiB):
    """Yield the bytes of the extents of one kind (for compressing the text)."""
    with open(path, "rb") as f:
        for off, n, k in extents:
            if k != kind:
                continue
            f.seek(off)
            while n > 0:
                b = f.read(min(chunk, n))
                if not b:
                    break
                n -= len(b)
                yield b


def stream(path: str, size_mib: int, seed: int = 5) -> None:
    """A stream's bytes, saved to a file: 1 MiB blocks, 60% random, 40% text."""
    rnd = random.Random(seed)
    with open(path, "wb") as f:
        _write_mixed(f, rnd, size_mib * MiB, 0.6)


def random_stream(path: str, size_mib: int, seed: int = 6) -> None:
    """An incompressible stream's bytes, saved to a file: all random."""
    rnd = random.Random(seed)
    with open(path, "wb") as f:
        for _ in range(size_mib):
            f.write(rnd.randbytes(MiB))


def main(argv=None) -> int:
    """python3 -m ferrybench.data KIND PATH [options]: make one data set."""
    import argparse
    p = argparse.ArgumentParser(prog="python3 -m ferrybench.data",
                                description="Make one of the suite's seeded data sets.")
    p.add_argument("kind", choices=["tree", "churn", "bigfile", "mangle", "insert", "sparse", "stream",
                                    "random-stream", "guest"])
    p.add_argument("path", help="where to write (for churn/mangle: what to change in place; "
                                "for insert: the output, with --src the input)")
    p.add_argument("--files", type=int, default=1024)
    p.add_argument("--file-kb", type=int, default=256)
    p.add_argument("--percent", type=float, default=5.0, help="churn / mangle percent")
    p.add_argument("--mib", type=int, default=512, help="bigfile / stream / sparse / guest image size")
    p.add_argument("--data-mib", type=int, default=64, help="sparse / guest: data written")
    p.add_argument("--src", help="insert: the file to copy with 7 bytes inserted at 1 MiB")
    p.add_argument("--seed", type=int, default=None)
    a = p.parse_args(argv)
    seed = a.seed
    if a.kind == "tree":
        tree(a.path, a.files, a.file_kb, 1 if seed is None else seed)
    elif a.kind == "churn":
        print(churn(a.path, a.percent, 1000 + int(a.percent) if seed is None else seed), "bytes rewritten")
    elif a.kind == "bigfile":
        bigfile(a.path, a.mib, 2 if seed is None else seed)
    elif a.kind == "mangle":
        print(mangle(a.path, a.percent, 3 if seed is None else seed), "bytes overwritten")
    elif a.kind == "insert":
        if not a.src:
            p.error("insert needs --src")
        insert(a.src, a.path)
    elif a.kind == "sparse":
        lay = sparse_image(a.path, a.mib, a.data_mib, 4 if seed is None else seed)
        print(len(lay["extents"]), "extents;",
              ", ".join(f"{k} {n / MiB:.1f} MiB" for k, n in lay["bytes"].items()))
    elif a.kind == "stream":
        stream(a.path, a.mib, 5 if seed is None else seed)
    elif a.kind == "guest":
        g = guest_image(a.path, a.mib, a.data_mib, 8 if seed is None else seed)
        print(len(g["files"]), "files;", sum(not f[3] for f in g["files"]), "deleted;",
              f"used {g['used_bytes'] / MiB:.1f} MiB")
    elif a.kind == "random-stream":
        random_stream(a.path, a.mib, 6 if seed is None else seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
