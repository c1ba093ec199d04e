"""CP-SAT's polish (ptsolve.policies.cpsat.polish: among the optima, the one with the most idle time before each
tensor-core issue) on the GPU: the library's schedule before it (``results/sched_new``; ChunkState
``results/depth_tie/sched``, which has the ring-depth tie-break) and after it (``results/polish/sched``:
``codegen.round prepare`` with polish), with the hand plan, timed in one process (``bench/ab/regress_ab.py``).

    python -m bench polish polish_ab emit                                       # CPU
    PTSOLVE_CACHE_DIR=$PWD/.cubin_pol python -m bench polish polish_ab compile     # CPU
    PTSOLVE_CACHE_DIR=$PWD/.cubin_pol python -m bench polish polish_ab             # GPU
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.ab import regress_ab as R  # noqa: E402

CONFIGS = ("FA2", "FA3", "FA3c", "FA8", "FA8c", "FA13c", "FA14", "FA17c", "CS0", "CS3", "ST0", "ST3")
R.AB = ROOT / "results/polish/sources.json"
R.NAMES = list(CONFIGS)
R.COLS = ["now", "now_again", "pol", "hand"]
R.RATIOS = [("pol", "now"), ("now", "hand"), ("pol", "hand"), ("now_again", "now")]
R.__file__ = __file__


def before(c: str) -> Path:
    tie = ROOT / "results/depth_tie/sched" / f"{c}_cpsat.json"
    return tie if c.startswith("ST") else ROOT / "results/sched_new" / f"{c}_cpsat.json"


def emit() -> None:
    from codegen.cuda import emit as emit_source
    from codegen.harness import hand
    from codegen.plan import plan_from_program
    from ptsolve.result import Result

    out = {}
    for c in CONFIGS:
        now = Result.from_json(before(c).read_text())
        pol = Result.from_json((ROOT / "results/polish/sched" / f"{c}_cpsat.json").read_text())
        g = now.program.graph
        row = {k: dataclasses.asdict(emit_source(plan_from_program(r.program, "h200"), "h200"))
               for k, r in (("now", now), ("pol", pol))}
        row["now_again"] = row["now"]
        row["hand"] = dataclasses.asdict(emit_source(hand(g.op, dict(g.params)), "h200"))
        out[c] = row
        print(c, now.tiling, "->", pol.tiling, "same kernel" if row["pol"] == row["now"] else "", flush=True)
    R.AB.write_text(json.dumps(out, indent=0, sort_keys=True))


if __name__ == "__main__":
    R.cli(emit)
