"""Where does 1000³ lose 3 µs against 1024³ (every tiling of the sweep, ``sweep.py``)? One tiling (the first choice of
both, 64×128 ping-pong, depth 5), each of M, N, K made ragged alone, and K from 64 to 4096 (the fixed cost and the
cost per K step), timed next to cuBLAS in one process (reduce_ab.py's harness). Exploration.

    python -m bench gemm_skinny ragged emit                                     # CPU
    PTSOLVE_CACHE_DIR=$PWD/.cubin_sk python -m bench gemm_skinny ragged compile  # CPU
    PTSOLVE_CACHE_DIR=$PWD/.cubin_sk python -m bench gemm_skinny ragged run --out $OUT/ragged.json  # GPU
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[2] / "results/gemm_skinny"  # the study's data
sys.path.insert(0, str(HERE.parents[1]))

from bench.gemm_reduce import reduce_ab as R  # noqa: E402

R.SRC = HERE / "ragged_sources.json"
TILING = {"BM": 64, "BN": 128, "BK": 64, "depth": 5, "groups": 1, "splits": 1, "pingpong": 1}
SHAPES = {"1024": (1024, 1024, 1024), "M1000": (1000, 1024, 1024), "N1000": (1024, 1000, 1024),
          "K1000": (1024, 1024, 1000), "K1008": (1024, 1024, 1008), "K960": (1024, 1024, 960),
          "K1088": (1024, 1024, 1088), "1000": (1000, 1000, 1000),
          **{f"K{k}": (1024, 1024, k) for k in (64, 128, 256, 512, 2048, 4096)}}


def emit() -> None:
    import ptsolve
    from codegen.cuda import emit as emit_source
    from codegen.plan import plan_from_program
    src = {}
    for name, (M, N, K) in SHAPES.items():
        op = ptsolve.ops.gemm(M=M, N=N, K=K, dtype="fp16")
        res = ptsolve.optimize(op, hw="h200", solver="cpsat", time_limit=5, cache=False, executor="serial",
                               fix=TILING, compile_check=False)
        src[name] = {"M": M, "N": N, "K": K, "tiling": res.tiling, "predicted_us": res.predicted_us,
                     "kernels": {"k": dataclasses.asdict(emit_source(plan_from_program(res.program, "h200"), "h200"))}}
        print(name, round(res.predicted_us, 2), flush=True)
    R.SRC.write_text(json.dumps(src, indent=0, sort_keys=True))


if __name__ == "__main__":
    R.main(emit, None, sys.argv)
