"""How well does each placement rule predict the GPU? (the model's CTA-to-SM assignment)

For each attention configuration of the paper round: the model's prediction of the CP-SAT schedule at the round's
tiling (re-solved with this checkout's cost model, H200 table) under the even split (the paper's rule, the
default), longest-first and ``dynamic`` (the GPU's block scheduler: CTAs in launch order, each to the SM that
frees first), next to the CP-SAT kernel's measured time (``results/round_main_h200.json``; that kernel is the
committed schedule's, so its order can differ from the re-solved one's).

    python -m bench placement > results/placement_h200.md      # CPU, ~2 min
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ptsolve import ops  # noqa: E402
from ptsolve.hw import load  # noqa: E402
from ptsolve.policies import cpsat  # noqa: E402
from ptsolve.policies.model import build  # noqa: E402
from ptsolve.simulate import predicted_us  # noqa: E402

RULES = ("even", "lpt", "dynamic")


def main() -> None:
    hw = load("h200")
    rnd = json.loads((ROOT / "results/round_main_h200.json").read_text())
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    print("# Placement rules against the GPU (attention, H200)\n")
    print(f"Command: `python -m bench placement` (CPU, cost model of commit {commit}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}). Measured: `results/round_main_h200.json` "
          f"({rnd['device']}, {rnd['date']}). Predicted µs (predicted / measured).\n")
    print("| config | causal | " + " | ".join(RULES) + " | measured µs |")
    print("|---|---|" + "---|" * len(RULES) + "---|")
    for r in rnd["rows"]:
        if r["op"] != "flash_attention":
            continue
        g = ops.make("flash_attention", **r["params"]).graph(dict(r["cpsat_tiling"]), hw)
        cells = []
        for rule in RULES:
            prog, _ = cpsat.solve(build(g, hw, placement=rule), time_limit=30)
            us = predicted_us(prog, hw, rule)
            cells.append(f"{us:.1f} ({us / r['cpsat_us']:.2f})")
        print(f"| {r['config']} | {r['params']['causal']} | " + " | ".join(cells) + f" | {r['cpsat_us']:.1f} |",
              flush=True)


if __name__ == "__main__":
    main()
