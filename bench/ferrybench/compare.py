"""The report's side of --ferry-base: per scenario and case, ferry's ratio to
its best peer with the main binary and with the base binary, measured side
by side in one run, and the change; a change worse than LIMIT_PCT is
flagged (the architecture issue: "every scenario's ratio to its peers
within 5% of its figure before the change"). Built from the records and
meta that results.json holds; nothing here is typed by hand.
"""

from __future__ import annotations

from .base import KIND as BASE_KIND
from .report import best_peer, cases, esc, summarize

LIMIT_PCT = 5.0


def label(meta: dict) -> str:
    return meta["base"]["label"]


def _state(rec: dict | None) -> str | None:
    """None when rec has a median, else what to print instead."""
    if rec is None:
        return "none measured"
    if summarize(rec):
        return None
    if rec["status"] == "n/a":
        return f"n/a ({esc(rec['reason'])})"
    return f"FAIL: {esc(rec['reason'])}" if rec["status"] == "FAIL" else "not run"


def _fastest(recs: list[dict], kind: str) -> dict | None:
    ok = [r for r in recs if r["kind"] == kind and summarize(r)]
    return min(ok, key=lambda r: summarize(r)["median"]) if ok else None


def _row(scen: str, case: str, form: str, new: dict | None, old: dict | None, bp) -> tuple[str, bool]:
    """One table row and whether it is flagged. Both ratios share the best
    peer, so the change in ratio is the change in median."""
    cols = []
    for rec in (new, old):
        st = _state(rec)
        med = None if st else summarize(rec)["median"]
        cols.append(st or (f"{med / bp[1]['median']:.2f}" if bp else "-") + f" ({med:.2f} s)")
    change, flag = "-", ""
    if not _state(new) and not _state(old):
        pct = 100.0 * (summarize(new)["median"] / summarize(old)["median"] - 1.0)
        change = f"{pct:+.1f}%"
        if pct > LIMIT_PCT:
            flag = f"**worse by more than {LIMIT_PCT:g}%**"
    peer = esc(bp[0]["tool"]) if bp else "-"
    return f"| {scen} | {esc(case)} | {form} | {peer} | {cols[0]} | {cols[1]} | {change} | {flag} |", bool(flag)


def table(meta: dict, records: list[dict]) -> list[str]:
    """The Markdown section (lines) comparing the two binaries; [] without
    a base binary."""
    if "base" not in meta:
        return []
    lines = ["| scenario | case | ferry form | best peer | × best peer (new) | "
             f"× best peer (base {esc(label(meta))}) | change | |", "|---|---|---|---|---|---|---|---|"]
    flagged = total = 0
    for scen, by_case in cases(records).items():
        for case, recs in by_case.items():
            bases = {r["twin"]: r for r in recs if r["kind"] == BASE_KIND}
            if not bases:
                continue
            bp = best_peer(recs)
            pairs = [(f"**{esc(r['tool'])}**", r, bases.get(r["tool"])) for r in recs if r["kind"] == "ferry"]
            if len(pairs) > 1:  # the summary's figure: each binary's fastest form
                new, old = _fastest(recs, "ferry"), _fastest(recs, BASE_KIND)
                pairs.insert(0, (f"*fastest: {esc(new['tool']) if new else '-'} / "
                                 f"{esc(old['tool']) if old else '-'}*", new, old))
            for form, new, old in pairs:
                row, bad = _row(scen, case, form, new, old, bp)
                lines.append(row)
                total += not (_state(new) or _state(old))
                flagged += bad
    b = meta["base"]
    return [f"## Against the base binary ({esc(label(meta))})", "",
            f"Every ferry row also ran with the base binary `{b['path']}` ({esc(b['version'])}), "
            "as `ferry@base ...` (its far side too), in the same rotation as the main binary and "
            "the peers, every copy verified. Per case: ferry's median / the best peer's median for each "
            "binary (where a case has several forms, the fastest of each first), and the change of the new binary against the base "
            f"(+ is slower); more than {LIMIT_PCT:g}% worse is flagged. "
            f"{flagged} of {total} comparisons flagged. Medians of {meta['runs']} run(s): on these VMs "
            "single runs drift by more than 5%, so a flag from a --quick run is a place to look, not a verdict.",
            ""] + lines + [""]

