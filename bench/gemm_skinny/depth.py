"""Do deeper rings than the space's (GEMM depth 2-5; 3-4 with split-K) pay where the loop waits on its loads? The
first choice's tiling of some of sweep.py's shapes (and 1024x1024x4096), at ring depths up to what shared memory
holds, each solved by CP-SAT on that graph, timed next to cuBLAS in one process (reduce_ab.py's harness).

    python -m bench gemm_skinny depth emit                                     # CPU (needs sweep's sources)
    PTSOLVE_CACHE_DIR=$PWD/.cubin_sk python -m bench gemm_skinny depth compile  # CPU
    PTSOLVE_CACHE_DIR=$PWD/.cubin_sk python -m bench gemm_skinny depth run --out $OUT/depth.json  # GPU
    python -m bench gemm_skinny depth report <depth.json>
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[2] / "results/gemm_skinny"  # the study's data
sys.path.insert(0, str(HERE.parents[1]))

from bench.gemm_reduce import reduce_ab as R  # noqa: E402

R.SRC = HERE / "depth_sources.json"
SHAPES = {"sq1024": None, "K4096": (1024, 1024, 4096), "M1024_1024x4096": None, "sq2048": None, "GEMM0": None,
          "M128_4096x4096": None, "M1_4096x4096": None, "M16_14336x4096": None, "odd1000": None}
DEPTHS = range(2, 11)


def emit() -> None:
    import ptsolve
    from codegen.cuda import emit as emit_source
    from codegen.plan import plan_from_program
    from ptsolve.errors import PtsolveError
    from ptsolve.hw import load
    from ptsolve.policies.model import fits
    hw = load("h200")
    sweep = json.loads((HERE / "sources.json").read_text())
    src = {}
    for name, mnk in SHAPES.items():
        row0 = sweep.get(name) or sweep["sq1024"]
        M, N, K = mnk or (row0["M"], row0["N"], row0["K"])
        t0 = dict(row0["tiling"])
        op = ptsolve.ops.gemm(M=M, N=N, K=K, dtype="fp16")
        row = {"M": M, "N": N, "K": K, "tiling": t0, "predicted_us": 0.0, "kernels": {}, "model_us": {}}
        for d in DEPTHS:
            t = t0 | {"depth": d}
            g = op.graph(t, hw)
            if fits(g, hw, registers=False):
                continue
            try:
                res = ptsolve.optimize(g, hw=hw, solver="cpsat", time_limit=5, cache=False, executor="serial",
                                       compile_check=False)
            except PtsolveError as e:
                print(name, d, "no schedule:", e, flush=True)
                continue
            row["kernels"][f"d{d}"] = dataclasses.asdict(emit_source(plan_from_program(res.program, "h200"), "h200"))
            row["model_us"][f"d{d}"] = res.predicted_us
        row["predicted_us"] = row["model_us"].get(f"d{t0['depth']}", 0.0)
        src[name] = row
        print(name, t0, {k: round(v, 2) for k, v in row["model_us"].items()}, flush=True)
    R.SRC.write_text(json.dumps(src, indent=0, sort_keys=True))


def report(path: Path) -> None:
    res = json.loads(path.read_text())
    model = {n: r["model_us"] for n, r in json.loads(R.SRC.read_text()).items()}
    print("| shape | tiling (depth of the first choice) | µs per ring depth (model µs) | cuBLAS µs "
          "| best depth: cuBLAS / it |")
    print("|---|---|---|---|---|")
    for name, r in res["shapes"].items():
        us = {k: v for k, v in r["us"].items() if k != "cublas"}
        t = r["tiling"]
        best = min(us, key=us.get)
        cells = ", ".join(f"{k}: {v:.2f} ({model[name][k]:.2f})"
                          for k, v in sorted(us.items(), key=lambda kv: int(kv[0][1:])))
        sp = f" s{t['splits']}" if t.get("splits", 1) > 1 else ""
        print(f"| {name} | {t['BM']}x{t['BN']} g{t['groups']}{sp}"
              f"{' pp' if t.get('pingpong') else ''} (d{t['depth']}) | {cells} | {r['us']['cublas']:.2f} | {best}: "
              f"{r['us']['cublas'] / us[best]:.3f} |")


if __name__ == "__main__":
    R.main(emit, report, sys.argv)
