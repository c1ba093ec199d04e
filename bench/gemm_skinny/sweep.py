"""How good is the GEMM model's ranking on the shapes where its first choice trails cuBLAS most? Per shape, the
model's 10 best distinct compile-clean schedules (``ptsolve.tune.candidates``, CP-SAT 3 s per tiling) are timed next
to cuBLAS in one process (reduce_ab.py's harness: CUDA graphs, 21 interleaved rounds, inputs rotating past the L2,
each output checked against the float32 product and repeated bit-equal). Exploration: the model is not changed by it.

    python -m bench gemm_skinny sweep emit                                     # CPU
    PTSOLVE_CACHE_DIR=$PWD/.cubin_sk python -m bench gemm_skinny sweep compile  # CPU
    PTSOLVE_CACHE_DIR=$PWD/.cubin_sk python -m bench gemm_skinny sweep run --out $OUT/sweep.json  # GPU
    python -m bench gemm_skinny sweep report <sweep.json>
"""
from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[2] / "results/gemm_skinny"  # the study's data
sys.path.insert(0, str(HERE.parents[1]))

from bench.gemm_reduce import reduce_ab as R  # noqa: E402

R.SRC = HERE / "sources.json"
SHAPES = ("M1_4096x4096", "M1_14336x4096", "M16_4096x4096", "M16_14336x4096", "M128_4096x4096",
          "M128_4096x14336", "M128_14336x4096", "M1024_1024x4096", "M1024_4096x4096", "sq1024", "odd1000", "GEMM0",
          "sq2048")
K_BEST = 10


def tiling_name(t: dict[str, int]) -> str:
    return (f"{t['BM']}x{t['BN']}g{t['groups']}d{t['depth']}" + (f"s{t['splits']}" if t.get("splits", 1) > 1 else "")
            + ("pp" if t.get("pingpong") else ""))


def emit() -> None:
    import ptsolve
    from codegen.cuda import emit as emit_source
    from codegen.plan import plan_from_program
    from ptsolve.tune import candidates
    shapes = json.loads(R.CANDS.read_text())["shapes"]
    src = json.loads(R.SRC.read_text()) if R.SRC.exists() else {}
    for name in SHAPES:
        if name in src:
            continue
        sh = shapes[name]
        op = ptsolve.ops.gemm(M=sh["M"], N=sh["N"], K=sh["K"], dtype="fp16")
        cands, _ = candidates(op, "h200", K_BEST, solver="cpsat", time_limit=3.0)
        row = {"M": sh["M"], "N": sh["N"], "K": sh["K"], "tiling": cands[0].tiling,
               "predicted_us": cands[0].result.predicted_us, "kernels": {}, "model_us": {}}
        for c in cands:
            key = f"r{c.rank}_{tiling_name(c.tiling)}"
            row["kernels"][key] = dataclasses.asdict(emit_source(plan_from_program(c.result.program, "h200"), "h200"))
            row["model_us"][key] = c.result.predicted_us
        src[name] = row
        print(name, {k: round(v, 2) for k, v in row["model_us"].items()}, flush=True)
        R.SRC.write_text(json.dumps(src, indent=0, sort_keys=True))


def report(path: Path) -> None:
    res = json.loads(path.read_text())
    model = {n: r["model_us"] for n, r in json.loads(R.SRC.read_text()).items()}
    print("| shape | first choice | µs | cuBLAS / first | fastest measured | µs | cuBLAS / fastest | its model rank |"
          " Spearman (model, GPU) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in res["shapes"].items():
        us = {k: v for k, v in r["us"].items() if k != "cublas"}
        cb = r["us"]["cublas"]
        first = min(us, key=lambda k: int(k.split("_")[0][1:]))
        best = min(us, key=us.get)
        ks = sorted(us)
        mr = {k: i for i, k in enumerate(sorted(ks, key=lambda k: model[name][k]))}
        gr = {k: i for i, k in enumerate(sorted(ks, key=us.get))}
        n = len(ks)
        rho = 1 - 6 * sum((mr[k] - gr[k]) ** 2 for k in ks) / (n * (n * n - 1)) if n > 2 else math.nan
        print(f"| {name} | {first.split('_', 1)[1]} | {us[first]:.2f} | {cb / us[first]:.3f} | {best.split('_', 1)[1]} "
              f"| {us[best]:.2f} | {cb / us[best]:.3f} | {best.split('_')[0][1:]} | {rho:.2f} |")


if __name__ == "__main__":
    R.main(emit, report, sys.argv)
