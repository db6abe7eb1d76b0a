"""--ferry-base: a second ferry binary (one built from an older commit, say)
measured in the same run as the main one, so that a change can be shown not
to regress: every ferry row gets a `ferry@base ...` twin right after it,
the same command built for the base binary (its own probed forms, its own
flags, its own far side via --remote-ferry or its own `ferry recv`), in
the same rotation as the main binary and the peers, verified the same way.

A base row that fails is reported (FAIL in its table, a loud line at the
end) but does not fail the bench: only the main binary's rows do.
"""

from __future__ import annotations

from typing import Callable

from .ferry_forms import Ferry
from .link import Link, Procs
from .runner import Ctx, Tool

NAME = "ferry@base"
KIND = "ferry-base"


def probe(path: str, work: str, procs: Procs, link: Link | None, logdir: str) -> Ferry:
    """The base binary with its forms probed like the main one's; a form
    whose far side would not be the base binary is n/a."""
    f = Ferry(path, work, NAME)
    f.probe(procs, link, logdir)
    f.pin_far_side()
    return f


def twin_name(name: str) -> str:
    """`ferry sync (ssh)` -> `ferry@base sync (ssh)`."""
    return NAME + name[len("ferry"):] if name.startswith("ferry") else f"{NAME} {name}"


def twins(ctx: Ctx, make: Callable[[Ferry], list[Tool]]) -> list[Tool]:
    """make(binary) -> a scenario's ferry rows for one binary. The main
    binary's rows, each followed by its base twin when --ferry-base is given
    (next to each other in the table; the rotation interleaves them with
    the peers round by round)."""
    rows = make(ctx.ferry)
    if ctx.base is None:
        return rows
    out = []
    for t, b in zip(rows, make(ctx.base)):
        b.name, b.kind, b.ferry, b.twin = twin_name(t.name), KIND, ctx.base, t.name
        out += [t, b]
    return out


def meta(f: Ferry, label: str | None) -> dict:
    """What results.json keeps about the base binary (meta.base)."""
    return {"path": f.path, "label": label or f.version(), "version": f.version(),
            "forms": f.forms_json()}
