"""Ring depth on a tie: the model predicts the same time for a tiling and its deeper-ring twin on most GEMM, attention
and ChunkState shapes, and its tie-break (then ``ptsolve.search._key``, now ``policies.model.tie_key``: the smaller
key) took the shallower one. This times the library's schedule then (``results/sched_new``) against the one the
deepest-first tie-break picks (``results/ab/deep_sched``, solved on the CPU with ``_key`` negating the depth; same
tiling otherwise) and the hand plan, in one process (``bench/ab/regress_ab.py``'s harness). GEMM's 45 shapes:
``bench.gemm_space run results/gemm_model/cands_fit.json results/gemm_model/cands_deep.json``.

    python -m bench ab depth_ab emit                                       # CPU
    PTSOLVE_CACHE_DIR=$PWD/.cubin_deep python -m bench ab depth_ab compile    # CPU
    PTSOLVE_CACHE_DIR=$PWD/.cubin_deep python -m bench ab depth_ab            # GPU
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.ab import regress_ab as R  # noqa: E402

CONFIGS = ("FA2", "FA3", "FA3c", "FA8", "FA8c", "FA13c", "FA14", "FA17c", "ST0", "ST3", "ST5", "ST8", "ST9")
R.AB = ROOT / "results/ab/depth_sources.json"
R.NAMES = list(CONFIGS)
R.COLS = ["now", "now_again", "deep", "hand"]
R.RATIOS = [("deep", "now"), ("now", "hand"), ("deep", "hand")]
R.__file__ = __file__


def emit() -> None:
    from codegen.cuda import emit as emit_source
    from codegen.harness import hand
    from codegen.plan import plan_from_program
    from ptsolve.result import Result

    out = {}
    for c in CONFIGS:
        now = Result.from_json((ROOT / "results/sched_new" / f"{c}_cpsat.json").read_text())
        deep = Result.from_json((ROOT / "results/ab/deep_sched" / f"{c}_cpsat.json").read_text())
        g = now.program.graph
        row = {k: dataclasses.asdict(emit_source(plan_from_program(r.program, "h200"), "h200"))
               for k, r in (("now", now), ("deep", deep))}
        row["now_again"] = row["now"]
        row["hand"] = dataclasses.asdict(emit_source(hand(g.op, dict(g.params)), "h200"))
        out[c] = row
        print(c, now.tiling, "->", deep.tiling, flush=True)
    R.AB.write_text(json.dumps(out, indent=0, sort_keys=True))


if __name__ == "__main__":
    R.cli(emit)
