"""Why 3000³ runs at 0.59× cuBLAS (results/gemm_heldout): K = 3000 makes every row of A and B 6000 bytes, 16 mod 32.
The first choice's tiling and larger ones, at 3000³, with only K aligned (3000×3000×3008), only K misaligned
(3008×3008×3000), all aligned (3008³), and 1000³ / 1008³, next to cuBLAS in one process (reduce_ab.py's harness:
every output checked against float32, two launches bit-equal). Exploration.

    python -m bench gemm_heldout misaligned emit                                        # CPU
    PTSOLVE_CACHE_DIR=$PWD/.cubin_ma python -m bench gemm_heldout misaligned compile     # CPU
    PTSOLVE_CACHE_DIR=$PWD/.cubin_ma python -m bench gemm_heldout misaligned run --out $OUT/misaligned.json  # GPU
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[2] / "results/gemm_heldout"  # the study's data
sys.path.insert(0, str(HERE.parents[1]))

from bench.gemm_reduce import reduce_ab as R  # noqa: E402

R.SRC = HERE / "misaligned_sources.json"
SHAPES = {"3000": (3000, 3000, 3000), "K3008": (3000, 3000, 3008), "MN3008_K3000": (3008, 3008, 3000),
          "3008": (3008, 3008, 3008), "1000": (1000, 1000, 1000), "1008": (1008, 1008, 1008)}
TILINGS = {"128x192pp": {"BM": 128, "BN": 192, "depth": 4, "groups": 1, "pingpong": 1},
           "128x256g2": {"BM": 128, "BN": 256, "depth": 4, "groups": 2},
           "128x192g2": {"BM": 128, "BN": 192, "depth": 4, "groups": 2},
           "256x128g2": {"BM": 256, "BN": 128, "depth": 4, "groups": 2},
           "256x192g2": {"BM": 256, "BN": 192, "depth": 3, "groups": 2},
           "64x128pp": {"BM": 64, "BN": 128, "depth": 5, "groups": 1, "pingpong": 1}}


def emit() -> None:
    import ptsolve
    from codegen.cuda import emit as emit_source
    from codegen.plan import plan_from_program
    from ptsolve.errors import PtsolveError
    src = {}
    for name, (M, N, K) in SHAPES.items():
        op = ptsolve.ops.gemm(M=M, N=N, K=K, dtype="fp16")
        row = src.setdefault(name, {"M": M, "N": N, "K": K, "tiling": {}, "predicted_us": {}, "kernels": {}})
        for tn, t in TILINGS.items():
            try:
                res = ptsolve.optimize(op, hw="h200", solver="cpsat", time_limit=5, cache=False, executor="serial",
                                       fix=t | {"BK": 64, "splits": 1}, compile_check=False)
            except PtsolveError as e:
                print(name, tn, "skipped:", str(e)[:100])
                continue
            row["tiling"][tn], row["predicted_us"][tn] = res.tiling, res.predicted_us
            row["kernels"][tn] = dataclasses.asdict(emit_source(plan_from_program(res.program, "h200"), "h200"))
            print(name, tn, round(res.predicted_us, 2), flush=True)
    R.SRC.write_text(json.dumps(src, indent=0, sort_keys=True))


if __name__ == "__main__":
    R.main(emit, lambda p: None, sys.argv)
