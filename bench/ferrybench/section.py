"""Write one run's results into BENCHMARKS.md as a dated section of its own,
under the page's introduction and above the earlier runs, from the run's
results.json (never typed): the way a run of only some scenarios (such as
`resume`) is quoted without replacing the full run's generated tables.

    python3 -m ferrybench.section RESULTS_DIR "TITLE" INTRO.md [BENCHMARKS.md]

INTRO.md holds the paragraphs written above the generated part (what the
run was for, what changed); the generated part follows it: the command,
the machine, the data and each scenario's tables and notes, and the charts
copied to bench/charts/.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

from . import compare, report


def section(results_dir: str, title: str, intro: str, repo: str, page: str) -> str:
    with open(os.path.join(results_dir, "results.json")) as f:
        data = json.load(f)
    meta, records = data["meta"], data["records"]
    name = os.path.basename(os.path.normpath(results_dir))
    body = [f"## {title}", "", intro.strip(), "",
            f"<!-- generated from {name}/results.json by bench/ferrybench/section.py -->", "",
            f"Generated {meta['started']} by:", "", "```", meta["command"], "```", "",
            report.machine_line(meta), "", f"Data: {meta['data_text']}", ""]
    for scen, by_case in report.cases(records).items():
        link = meta["links"].get(scen)
        body += [f"### {scen}", "", f"Reproduces: seed {meta['seeds'].get(scen, '')}.", "",
                 f"Link: {report.link_text(link)}.", "", meta["describe"].get(scen, ""), "",
                 report.scenario_table(scen, by_case), ""] + report.notes(meta, scen)
        png = os.path.join(results_dir, f"{scen}.png")
        if os.path.exists(png):
            # Named after the run: an earlier section keeps its own chart.
            dst = os.path.join(repo, "bench", "charts", f"{scen}-{name}.png")
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copyfile(png, dst)
            rel = os.path.relpath(dst, os.path.dirname(os.path.abspath(page)))
            body += [f"![{scen} chart]({rel})", ""]
    # A run with --ferry-base: its comparison table, a level down.
    body += [("#" + line) if line.startswith("## ") else line for line in compare.table(meta, records)]
    return "\n".join(body)


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4):
        print(__doc__, file=sys.stderr)
        return 2
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    page = argv[3] if len(argv) == 4 else os.path.join(repo, "BENCHMARKS.md")
    with open(argv[2]) as f:
        intro = f.read()
    block = section(argv[0], argv[1], intro, repo, page)
    with open(page) as f:
        old = f.read()
    # Above the first "## " heading: the newest run comes first.
    at = old.find("\n## ")
    new = old.rstrip() + "\n\n" + block + "\n" if at < 0 else old[:at + 1] + block + "\n" + old[at + 1:]
    with open(page, "w") as f:
        f.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
