"""ChunkState under the ring-depth tie-break: the library's schedule before it (``results/sched_new``, commit
0f0b7b9) and after it (``results/depth_tie/sched``: ``codegen.round prepare`` with ``tie_key``; ChunkScan's
choices did not change), timed in one process with ``bench/ab/regress_ab.py``'s harness.

    python -m bench depth_tie mamba_tie emit                                       # CPU
    PTSOLVE_CACHE_DIR=$PWD/.cubin_tie python -m bench depth_tie mamba_tie compile     # CPU
    PTSOLVE_CACHE_DIR=$PWD/.cubin_tie python -m bench depth_tie mamba_tie             # GPU
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.ab import regress_ab as R  # noqa: E402

CONFIGS = ("ST0", "ST3", "ST5", "ST8", "ST9")
R.AB = ROOT / "results/depth_tie/mamba_sources.json"
R.NAMES = list(CONFIGS)
R.COLS = ["now", "now_again", "tie"]
R.RATIOS = [("tie", "now"), ("now_again", "now")]
R.__file__ = __file__


def emit() -> None:
    from codegen.cuda import emit as emit_source
    from codegen.plan import plan_from_program
    from ptsolve.result import Result

    out = {}
    for c in CONFIGS:
        now = Result.from_json((ROOT / "results/sched_new" / f"{c}_cpsat.json").read_text())
        tie = Result.from_json((ROOT / "results/depth_tie/sched" / f"{c}_cpsat.json").read_text())
        row = {k: dataclasses.asdict(emit_source(plan_from_program(r.program, "h200"), "h200"))
               for k, r in (("now", now), ("tie", tie))}
        row["now_again"] = row["now"]
        out[c] = row
        print(c, now.tiling, "->", tie.tiling, flush=True)
    R.AB.write_text(json.dumps(out, indent=0, sort_keys=True))


if __name__ == "__main__":
    R.cli(emit)
