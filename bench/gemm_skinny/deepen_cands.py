"""The 45 GEMM shapes' first choices with and without the ring deepening (``Hardware.deep_ring_max``, GEMM 8 in the
H200 table; ``policies.model.deepen``), as bench.gemm_space candidate files (labels ``flat`` and ``deepen``), so
that one ``gemm_space run`` times the two next to cuBLAS:

    python -m bench gemm_skinny deepen_cands                                                   # CPU
    PTSOLVE_CACHE_DIR=$PWD/.cubin_dp python -m bench gemm_space precompile results/gemm_skinny/cands_flat.json \\
        results/gemm_skinny/cands_deepen.json                                                      # CPU
    PTSOLVE_CACHE_DIR=$PWD/.cubin_dp python -m bench gemm_space run results/gemm_skinny/cands_flat.json \\
        results/gemm_skinny/cands_deepen.json --out $OUT/space                                      # GPU
"""
from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[2] / "results/gemm_skinny"  # the study's data


def main() -> None:
    import ptsolve
    from bench.gemm_space.gemm_space import shapes
    from codegen.plan import plan_from_program
    from ptsolve.hw import load
    from ptsolve.provenance import stamp
    hw = load("h200")
    flat = dataclasses.replace(hw, op_constants={k: {**v, "deep_ring_max": 0} for k, v in hw.op_constants.items()})
    for tag, table in (("flat", flat), ("deepen", hw)):
        doc = {"hw": "h200", "tag": tag, "date": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime()),
               "commit": stamp()["commit"], "shapes": {}}
        for name, M, N, K, kind in shapes(()):
            r = ptsolve.optimize(ptsolve.ops.gemm(M=M, N=N, K=K), hw=table, cache=False, executor="serial")
            doc["shapes"][name] = {"M": M, "N": N, "K": K, "set": kind, "cands": {tag: {
                "tiling": dict(r.program.graph.tiling), "predicted_us": r.predicted_us, "status": r.status,
                "check": (r.kernel_check or {}).get("status"), "plan": plan_from_program(r.program, hw).to_json()}}}
            print(tag, name, r.tiling, round(r.predicted_us, 2), flush=True)
        (HERE / f"cands_{tag}.json").write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    sys.exit(main())
