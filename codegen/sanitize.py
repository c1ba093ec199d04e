"""Small launches of the generated kernels, for compute-sanitizer (memcheck, racecheck, synccheck).

On the GPU machine::

    compute-sanitizer --tool memcheck  --error-exitcode 9 python3 -m codegen.sanitize
    compute-sanitizer --tool racecheck --error-exitcode 9 python3 -m codegen.sanitize

Each kernel runs once on a small, ragged shape (GEMM 200×136×200; attention causal with seq 200, GQA, both
the hand FA3-order plan with ping-pong turns and the CP-SAT schedule of FA3 from results/schedules_h200 with
its full turn order; Mamba2 ChunkScan and ChunkState, batch 1, 2 heads, seq 300, with the CP-SAT schedules
of CS3 / ST3, with co-resident CTAs and with one CTA per SM; and the CP-SAT first choices of FA3c, GEMM1, CS3 and ST3
in results/study_h200, the release-point model's) and is checked against a float32 / float64 reference, so a clean
sanitizer run is also a correct one.
"""
from __future__ import annotations

import sys


def main() -> int:
    import dataclasses
    from pathlib import Path

    import torch

    from codegen.bench import check_fa, check_gemm, fa3_order_plan
    from codegen.plan import default_plan, plan_from_program
    from ptsolve.result import Result

    results = []
    tg = {"BM": 128, "BN": 128, "BK": 64, "depth": 3, "groups": 2}
    results.append(check_gemm(200, 136, 200, "fp16", tg, default_plan("gemm", {"M": 200, "N": 136, "K": 200,
                                                                                 "dtype": "fp16"}, tg), trials=1))
    p = {"batch": 1, "heads": 8, "kv_heads": 2, "seq_q": 200, "seq_kv": 200, "head_dim": 128, "causal": True,
         "dtype": "fp16"}
    t = {"BM": 128, "BN": 128, "depth": 2, "groups": 2}
    results.append(check_fa(p, t, fa3_order_plan(p, t), trials=1, label="fa3_hand"))
    # the exact schedule ptsolve found for FA3 (no solver on the GPU machine: it travels as JSON)
    r = Result.from_json((Path(__file__).parents[1] / "results/schedules_h200/FA3_cpsat.json").read_text())
    plan = plan_from_program(r.program, "h200")
    results.append(check_fa(p, plan.tiling, dataclasses.replace(plan, params=p), trials=1, label="cpsat"))
    from codegen.bench import TOL
    from codegen.mamba import check
    small = {"batch": 1, "heads": 2, "seq": 300}
    for name in ("CS3", "ST3"):
        for label in ("cpsat", "cpsat@1cta"):  # co-resident CTAs, and one CTA per SM
            f = Path(__file__).parents[1] / f"results/schedules_h200/{name}_{label}.json"
            r = Result.from_json(f.read_text())
            pl = plan_from_program(r.program, "h200")
            pl = dataclasses.replace(pl, params=pl.params | small)
            err = check(pl, trials=1, poison_tail=pl.op == "mamba2_chunk_state")
            results.append({"op": pl.op, "order": f"{label} {pl.tiling}", "rel_err": err, "ok": err <= TOL})
    # the schedules of the measured-selection study (the release-point model, compile-checked): each operator's
    # CP-SAT first choice on a small, ragged shape
    import json

    from ptsolve.program import SProgram
    study = json.loads((Path(__file__).parents[1] / "results/study_h200/candidates.json").read_text())
    for name in ("FA3c", "GEMM1", "CS3", "ST3"):
        c = study["configs"][name]["candidates"][0]
        pl = plan_from_program(SProgram.from_json(c["program"]), "h200")
        if pl.op == "flash_attention":
            results.append(check_fa(p, pl.tiling, dataclasses.replace(pl, params=p), trials=1, label=f"study {name}"))
        elif pl.op == "gemm":
            results.append(check_gemm(200, 136, 200, "fp16", pl.tiling, dataclasses.replace(
                pl, params={"M": 200, "N": 136, "K": 200, "dtype": "fp16"}), trials=1))
        else:
            pl = dataclasses.replace(pl, params=pl.params | small)
            err = check(pl, trials=1, poison_tail=pl.op == "mamba2_chunk_state")
            results.append({"op": pl.op, "order": f"study {name} {pl.tiling}", "rel_err": err, "ok": err <= TOL})
    torch.cuda.synchronize()
    for r in results:
        print(f"{r['op']} {r.get('order', '')}: rel err {r['rel_err']:.2e} {'PASS' if r['ok'] else 'FAIL'}", flush=True)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
