"""Is the hand FA3-order plan a point of the schedule space, and how does the model rank it? (issue 13)

For each attention configuration of the paper round, with the cost model of this checkout on the H200 table:
the model's best schedule over all orders (CP-SAT) at the round's CP-SAT tiling and at the hand plan's tiling
(codegen.harness.FIXED, persistent), and its best schedule with every consumer warpgroup's loop pinned to the
FA3 order (``codegen.plan.fa3_order_plan``: QK of j, PV of j-1, then the softmax of j) at the hand plan's
tiling. An order is cyclic: warpgroup 0 keeps the plan's rotation and every rotation of the other
warpgroups' is tried (the best is kept). Beside them, what the GPU measured for the two kernels
(``results/round_main_h200.json``: the CP-SAT schedule's kernel and the hand plan's, one process).

    python -m bench fa3_order_model > results/fa3_order_model.md      # CPU, ~10 min on 2 cores
"""
from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from codegen.harness import FIXED  # noqa: E402
from codegen.plan import fa3_order_plan  # noqa: E402
from ptsolve import ops  # noqa: E402
from ptsolve.hw import load  # noqa: E402
from ptsolve.policies import cpsat  # noqa: E402
from ptsolve.policies.model import build  # noqa: E402
from ptsolve.policies.orders import rotate  # noqa: E402
from ptsolve.simulate import predicted_us  # noqa: E402

LIMIT_S = 60.0  # per CP-SAT solve; every solve below is reported with its status


def best(P, pins: list[dict]) -> tuple:
    """(predicted µs, ii cycles, status, pin index) of the best solve over ``pins`` (None: free)."""
    hw = P.hw
    out = None
    for i, pin in enumerate(pins):
        prog, st = cpsat.solve(P, time_limit=LIMIT_S, pin=pin)
        if prog is None:
            continue
        row = (predicted_us(prog, hw), prog.ii, st["status"], i)
        out = row if out is None or row[0] < out[0] else out
    return out


def main() -> None:
    hw = load("h200")
    rnd = json.loads((ROOT / "results/round_main_h200.json").read_text())
    rows = {r["config"]: r for r in rnd["rows"] if r["op"] == "flash_attention"}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    print("# The FA3 order in the schedule space: the model's ranking against the GPU's\n")
    print(f"Command: `python -m bench fa3_order_model` (CPU, cost model of commit {commit}, H200 table; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}). Measured columns: "
          f"`results/round_main_h200.json` ({rnd['device']}, {rnd['date']}). CP-SAT {LIMIT_S:.0f} s per solve.\n")
    print("| config | model: free, CP-SAT tiling µs (ii) | model: free, hand tiling µs (ii) | "
          "model: FA3 order, hand tiling µs (ii) | model FA3 / free | GPU: CP-SAT kernel µs | GPU: hand FA3 kernel µs "
          "| GPU hand / CP-SAT |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        op = ops.make("flash_attention", **r["params"])
        P0 = build(op.graph(dict(r["cpsat_tiling"]), hw), hw)
        free0 = best(P0, [None])
        tiling = FIXED | {"persistent": 1}
        P1 = build(op.graph(dict(tiling), hw), hw)
        free1 = best(P1, [None])
        loop = fa3_order_plan(dict(op.params), tiling).order["loop"]
        wgs = sorted(k for k in loop if k != "producer")
        pins = [{w: (loop[w] if j == 0 else rotate(loop[w], m[j - 1])) for j, w in enumerate(wgs)}
                for m in itertools.product(range(len(loop[wgs[0]])), repeat=len(wgs) - 1)]
        fa3 = best(P1, pins)

        def cell(x: tuple | None) -> str:
            return "infeasible" if x is None else f"{x[0]:.1f} ({x[1]})" + ("" if x[2] == "OPTIMAL" else f" {x[2]}")
        ratio = f"{fa3[0] / free1[0]:.3f}" if fa3 and free1 else "—"
        print(f"| {name} | {cell(free0)} | {cell(free1)} | {cell(fa3)} | {ratio} | {r['cpsat_us']:.1f} | "
              f"{r['hand_us']:.1f} | {r['hand_us'] / r['cpsat_us']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
