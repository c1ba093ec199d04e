"""Why does a 1-row GEMM run slower than a 16-row one with the same kernel (M1_14336x4096 37.2 µs, M16_14336x4096
33.8 µs, unsplit 64x128 ping-pong, sweep.py)? The same tilings at M = 1, 8, 16, 32, 64 (A's 64-row TMA box then has
63 ... 0 rows past M, zero-filled), timed next to cuBLAS in one process (reduce_ab.py's harness). Exploration.

    python -m bench gemm_skinny small_m emit                                     # CPU
    PTSOLVE_CACHE_DIR=$PWD/.cubin_sk python -m bench gemm_skinny small_m compile  # CPU
    PTSOLVE_CACHE_DIR=$PWD/.cubin_sk python -m bench gemm_skinny small_m run --out $OUT/small_m.json  # GPU
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[2] / "results/gemm_skinny"  # the study's data
sys.path.insert(0, str(HERE.parents[1]))

from bench.gemm_reduce import reduce_ab as R  # noqa: E402

R.SRC = HERE / "small_m_sources.json"
CASES = {"14336x4096 64x128 pp": (14336, 4096, {"BM": 64, "BN": 128, "BK": 64, "depth": 5, "groups": 1,
                                                  "pingpong": 1}),
         "4096x4096 64x128 s4": (4096, 4096, {"BM": 64, "BN": 128, "BK": 64, "depth": 8, "groups": 1, "splits": 4})}
MS = (1, 8, 16, 32, 64)


def emit() -> None:
    import ptsolve
    from codegen.cuda import emit as emit_source
    from codegen.plan import plan_from_program
    from ptsolve.hw import load
    hw = load("h200")
    src = {}
    for label, (N, K, t) in CASES.items():
        for M in MS:
            g = ptsolve.ops.gemm(M=M, N=N, K=K).graph(t, hw)
            res = ptsolve.optimize(g, hw=hw, solver="cpsat", time_limit=5, cache=False, executor="serial",
                                   compile_check=False)
            name = f"M{M} {label}"
            src[name] = {"M": M, "N": N, "K": K, "tiling": res.tiling, "predicted_us": res.predicted_us,
                         "kernels": {"k": dataclasses.asdict(emit_source(plan_from_program(res.program, hw), "h200"))}}
            print(name, round(res.predicted_us, 2), flush=True)
    R.SRC.write_text(json.dumps(src, indent=0, sort_keys=True))


def report(path: Path) -> None:
    res = json.loads(path.read_text())
    print("| case | M | µs | cuBLAS µs | cuBLAS / it | model µs |\n|---|---|---|---|---|---|")
    for name, r in res["shapes"].items():
        print(f"| {name.split(' ', 1)[1]} | {r['M']} | {r['us']['k']:.2f} | {r['us']['cublas']:.2f} | "
              f"{r['us']['cublas'] / r['us']['k']:.3f} | {r['predicted_us']:.2f} |")


if __name__ == "__main__":
    R.main(emit, report, sys.argv)
