"""Summarise a finished ``mutmut run`` (the ``mutants/`` folder) as markdown: score per module, date, commit.
Usage: python -m bench mutation mutation_report [--sample] [--note=TEXT ...] > results/mutation.md"""
from __future__ import annotations

import collections
import datetime
import re
import subprocess
import sys

KILLED = ("killed", "timeout")  # a mutant that makes the tests hang is caught too (mutmut counts it so)


def main() -> int:
    out = subprocess.run([sys.executable, "-m", "mutmut", "results", "--all", "true"], capture_output=True,
                         text=True, check=True).stdout
    per: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in out.splitlines():
        m = re.match(r"\s*([\w.]+?)\.x[ǁ_]?.*__mutmut_\d+:\s*(\w[\w ]*)$", line)
        if m:
            per[m.group(1)][m.group(2).strip()] += 1
    sample = "--sample" in sys.argv[1:]
    notes = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--note=")]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = ["# Mutation score of ptsolve's core modules", "",
             "- command: `python -m bench mutation` (mutmut, config in pyproject.toml `[tool.mutmut]`)",
             f"- date: {date}", f"- commit: {commit}", *[f"- note: {n}" for n in notes], "",
             ("- sample: the mutants numbered ...0 (1 in 10 of each function's); `python -m bench mutation` without "
              "--sample runs all" if sample else "- all mutants"), "",
             "Score = (killed + timeout) / (mutants checked, less skipped). 'no tests': no selected test runs the "
             "mutated function. Survivors: `mutmut results`; one diff: `mutmut show <name>`.", "",
             "| module | mutants | killed | timeout | survived | no tests | other | score |",
             "|---|---|---|---|---|---|---|---|"]
    tot: collections.Counter[str] = collections.Counter()
    for mod in sorted(per):
        c = per[mod]
        tot += c
        lines.append(_row(mod, c))
    lines.append(_row("**all**", tot))
    print("\n".join(lines))
    return 0


def _row(mod: str, c: collections.Counter[str]) -> str:
    n = sum(c.values()) - c["skipped"] - c["not checked"]
    k = sum(c[x] for x in KILLED)
    other = n - k - c["survived"] - c["no tests"]
    return (f"| {mod} | {n} | {c['killed']} | {c['timeout']} | {c['survived']} | {c['no tests']} | {other} | "
            f"{100 * k / max(n, 1):.1f}% |")


if __name__ == "__main__":
    sys.exit(main())
