"""The decode plans of ``results/decode_h200/plans.json`` under the ring-depth tie-break (ptsolve.policies.model.
tie_key): every ``split`` / ``nosplit`` plan whose loop streams memory and whose deeper-ring twin the model predicts
equally fast is replaced by that twin's schedule (CP-SAT, compiler in the loop), the rest kept, so that a GPU run of
both files (``bench/decode/decode_bench.py run``) times the tie-break alone.

    PTSOLVE_CACHE_DIR=<cubins> python -m bench depth_tie decode_tie results/decode_h200/plans.json OUT.json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(src: Path, dst: Path) -> None:
    import ptsolve
    from codegen.cuda import emit
    from codegen.plan import plan_from_program
    from codegen.runtime import compile_kernel
    from ptsolve.hw import load
    from ptsolve.policies.model import build, fits, streams_memory
    from ptsolve.provenance import stamp

    hw = load("h200")
    data = json.loads(src.read_text())
    changed = 0
    for sh in data["shapes"]:
        for label, v in sorted(sh["plans"].items()):
            op = ptsolve.ops.make(v["op"], **sh["params"])
            g = op.graph(v["tiling"], hw)
            P = build(g, hw, registers=False)
            deep = op.graph(v["tiling"] | {"depth": v["tiling"]["depth"] + 1}, hw)
            if not streams_memory(P.tm, P.phase) or fits(deep, hw, registers=False) is not None:
                continue
            a = ptsolve.optimize(g, hw=hw, solver="cpsat", cache=False, compile_check=False)
            b = ptsolve.optimize(deep, hw=hw, solver="cpsat", cache=False, compile_check=True)
            kc = b.kernel_check or {}
            if b.objective != a.objective or kc.get("status") != "ok":
                print(sh["name"], label, "kept:", b.objective, a.objective, kc.get("status"), flush=True)
                continue
            plan = plan_from_program(b.program, "h200")
            ks = emit(plan, "h200")
            c = compile_kernel(ks)
            sh["plans"][label] = v | {"plan": json.loads(plan.to_json()), "tiling": b.tiling,
                                      "predicted_us": b.predicted_us, "status": b.status, "kernel": ks.name,
                                      "grid": ks.grid[0], "registers": c.report["registers"],
                                      "spills": c.report["spill_stores"],
                                      "serialized": c.report["wgmma_serialized"]}
            changed += 1
            print(sh["name"], label, v["tiling"]["depth"], "->", b.tiling["depth"], flush=True)
    data["provenance"] = stamp()
    data["note"] = f"{src} with the ring-depth tie-break: {changed} plans deeper"
    dst.write_text(json.dumps(data, indent=1, sort_keys=True))
    print(changed, "plans deeper")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
