"""Would the cheaper split-K reduction pay on the small square shapes the model does not split (1024³, 1000³)?
The first choice (``results/depth_tie/cands_tie.json``) next to default plans of split tilings, and cuBLAS, timed with
reduce_ab.py's harness (one process, CUDA graphs). Exploration: the model is not changed by it.

    python -m bench gemm_reduce small_split emit                                     # CPU
    PTSOLVE_CACHE_DIR=$PWD/.cubin_gs python -m bench gemm_reduce small_split compile  # CPU
    PTSOLVE_CACHE_DIR=$PWD/.cubin_gs python -m bench gemm_reduce small_split run --out $OUT/small.json  # GPU
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[2] / "results/gemm_reduce"  # the study's data
sys.path.insert(0, str(HERE.parents[1]))

from bench.gemm_reduce import reduce_ab as R  # noqa: E402

R.SRC = HERE / "small_sources.json"
SHAPES = ("sq1024", "odd1000")
SPLITS = ({"BM": 128, "BN": 128, "BK": 64, "depth": 4, "groups": 2, "splits": 2},
          {"BM": 64, "BN": 128, "BK": 64, "depth": 4, "groups": 1, "splits": 2},
          {"BM": 128, "BN": 128, "BK": 64, "depth": 4, "groups": 2, "splits": 4})


def emit() -> None:
    import ptsolve
    from codegen.cuda import emit as emit_source
    from codegen.plan import KernelPlan, default_plan
    cands = json.loads(R.CANDS.read_text())["shapes"]
    src = {}
    for name in SHAPES:
        sh, c = cands[name], cands[name]["cands"]["tie"]
        p = {"M": sh["M"], "N": sh["N"], "K": sh["K"], "dtype": "fp16"}
        row = src.setdefault(name, {**{k: sh[k] for k in ("M", "N", "K")}, "tiling": c["tiling"],
                                    "predicted_us": c["predicted_us"], "kernels": {}})
        row["kernels"]["first"] = dataclasses.asdict(emit_source(KernelPlan.from_json(c["plan"]), "h200"))
        op = ptsolve.ops.gemm(**p)
        for t in SPLITS:
            key = f"{t['BM']}x{t['BN']}s{t['splits']}"
            row["kernels"][key] = dataclasses.asdict(emit_source(default_plan("gemm", p, t), "h200"))
            res = ptsolve.optimize(op, hw="h200", solver="cpsat", time_limit=10, cache=False, executor="serial",
                                   fix=t, compile_check=False)
            row.setdefault("model_us", {})[key] = res.predicted_us
        print(name, row["predicted_us"], row["model_us"], flush=True)
    R.SRC.write_text(json.dumps(src, indent=0, sort_keys=True))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "emit":
        emit()
    elif cmd == "compile":
        R.compile_all()
    elif cmd == "run":
        out = Path(sys.argv[sys.argv.index("--out") + 1])
        R.run(out)  # its table has only old / new rows: this one has every kernel
        model = {n: r.get("model_us", {}) for n, r in json.loads(R.SRC.read_text()).items()}
        print("\n| shape | kernel | model µs | µs | cuBLAS / it |\n|---|---|---|---|---|")
        for n, r in json.loads(out.read_text())["shapes"].items():
            for k, us in sorted(r["us"].items()):
                m = r["predicted_us"] if k == "first" else model[n].get(k)
                print(f"| {n} | {k} | {m:.2f} | {us:.2f} | {r['us']['cublas'] / us:.3f} |" if m else
                      f"| {n} | {k} | — | {us:.2f} | 1.000 |")
