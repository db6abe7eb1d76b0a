"""Byte-for-byte checks of a destination against its source."""

from __future__ import annotations

import os
import stat

CHUNK = 1 << 20


def same_file(a: str, b: str) -> tuple[bool, str]:
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError as e:
        return False, str(e)
    if sa.st_size != sb.st_size:
        return False, f"{b}: size {sb.st_size} != {sa.st_size}"
    with open(a, "rb") as fa, open(b, "rb") as fb:
        off = 0
        while True:
            x, y = fa.read(CHUNK), fb.read(CHUNK)
            if x != y:
                return False, f"{b}: content differs near offset {off}"
            if not x:
                return True, ""
            off += len(x)


def allocated(path: str) -> int:
    return os.stat(path).st_blocks * 512


def _entries(root: str) -> dict[str, os.stat_result]:
    out = {}
    for dp, dns, fns in os.walk(root):
        for n in dns + fns:
            p = os.path.join(dp, n)
            out[os.path.relpath(p, root)] = os.lstat(p)
    return out


def same_tree(a: str, b: str) -> tuple[bool, str]:
    if not os.path.isdir(b):
        return False, f"{b}: missing"
    ea, eb = _entries(a), _entries(b)
    missing = sorted(set(ea) - set(eb))
    extra = sorted(set(eb) - set(ea))
    if missing:
        return False, f"{len(missing)} entries missing, e.g. {missing[0]}"
    if extra:
        return False, f"{len(extra)} unexpected entries, e.g. {extra[0]}"
    for rel, sa in sorted(ea.items()):
        sb = eb[rel]
        if stat.S_IFMT(sa.st_mode) != stat.S_IFMT(sb.st_mode):
            return False, f"{rel}: type differs"
        if stat.S_ISLNK(sa.st_mode):
            if os.readlink(os.path.join(a, rel)) != os.readlink(os.path.join(b, rel)):
                return False, f"{rel}: symlink target differs"
        elif stat.S_ISREG(sa.st_mode):
            ok, msg = same_file(os.path.join(a, rel), os.path.join(b, rel))
            if not ok:
                return False, msg
    return True, ""


def tree_bytes(root: str) -> int:
    return sum(s.st_size for s in _entries(root).values() if stat.S_ISREG(s.st_mode))


def data_ranges(path: str) -> list[tuple[int, int]]:
    """[(start, end)] of the data regions, by SEEK_DATA / SEEK_HOLE."""
    out = []
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        off = 0
        while off < size:
            try:
                s = os.lseek(fd, off, os.SEEK_DATA)
            except OSError:  # ENXIO: no data after off
                break
            e = os.lseek(fd, s, os.SEEK_HOLE)
            out.append((s, e))
            off = e
    finally:
        os.close(fd)
    return out
