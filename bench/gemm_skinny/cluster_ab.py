"""2-CTA clusters with B multicast (tiling key ``cluster`` = 2) against the same tilings without, on the shapes of
``sweep.py``: every timed tiling there that can pair M tiles (splits 1, at least two M tiles) is re-solved with
cluster = 2 (CP-SAT, tiling fixed) and timed next to its unclustered kernel and cuBLAS in one process (reduce_ab.py's
harness: CUDA graphs, 21 interleaved rounds, each output checked against the float32 product and repeated
bit-equal).

    python -m bench gemm_skinny cluster_ab emit                                     # CPU (needs sweep's sources)
    PTSOLVE_CACHE_DIR=$PWD/.cubin_sk python -m bench gemm_skinny cluster_ab compile  # CPU
    PTSOLVE_CACHE_DIR=$PWD/.cubin_sk python -m bench gemm_skinny cluster_ab run --out $OUT/cluster.json  # GPU
    python -m bench gemm_skinny cluster_ab report <cluster.json>
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

R.SRC = HERE / "cluster_sources.json"
SWEEP = HERE / "sources.json"


def emit(*only: str) -> None:
    import ptsolve
    from codegen.cuda import emit as emit_source
    from codegen.plan import plan_from_program
    src = {}
    for name, row in json.loads(SWEEP.read_text()).items():
        if only and name not in only:
            continue
        out = {k: row[k] for k in ("M", "N", "K", "tiling", "predicted_us")} | {"kernels": {}, "model_us": {}}
        op = ptsolve.ops.gemm(M=row["M"], N=row["N"], K=row["K"], dtype="fp16")
        seen = set()
        for key, ks in sorted(row["kernels"].items(), key=lambda kv: int(kv[0].split("_")[0][1:])):
            t = {k: v for k, v in ks["info"]["tiling"].items() if k != "ctas"}
            if t.get("splits", 1) > 1 or -(-row["M"] // t["BM"]) < 2 or key.split("_", 1)[1] in seen:
                continue
            seen.add(key.split("_", 1)[1])
            res = ptsolve.optimize(op, hw="h200", solver="cpsat", time_limit=5, cache=False, executor="serial",
                                   fix=t | {"cluster": 2}, compile_check=False)
            out["kernels"][key] = ks
            out["kernels"][key + "_cl2"] = dataclasses.asdict(emit_source(plan_from_program(res.program, "h200"),
                                                                          "h200"))
            out["model_us"][key] = row["model_us"][key]
            out["model_us"][key + "_cl2"] = res.predicted_us
            if len(seen) == 4:
                break
        if out["kernels"]:
            src[name] = out
            print(name, sorted(out["kernels"]), flush=True)
    R.SRC.write_text(json.dumps(src, indent=0, sort_keys=True))


def report(path: Path) -> None:
    res = json.loads(path.read_text())
    model = {n: r["model_us"] for n, r in json.loads(R.SRC.read_text()).items()}
    print("| shape | tiling | µs | with cluster 2 µs | cluster / none | model: cluster / none | cuBLAS µs |")
    print("|---|---|---|---|---|---|---|")
    rs = []
    for name, r in res["shapes"].items():
        us = r["us"]
        for k in sorted(us):
            if k.endswith("_cl2") or k == "cublas" or k + "_cl2" not in us:
                continue
            c = us[k + "_cl2"]
            rs.append(c / us[k])
            print(f"| {name} | {k.split('_', 1)[1]} | {us[k]:.2f} | {c:.2f} | {c / us[k]:.3f} | "
                  f"{model[name][k + '_cl2'] / model[name][k]:.3f} | {us['cublas']:.2f} |")
    if rs:
        print(f"\ngeomean cluster / none over {len(rs)} tilings: {math.exp(sum(map(math.log, rs)) / len(rs)):.3f}")


if __name__ == "__main__":
    R.main(emit, report, sys.argv)
