"""The FA3 order as a schedule the exact solver returns (policy ``cpsat-orders``) next to the hand FA3-order plan and
the free CP-SAT schedule, on the GPU in one process (issue 13: "the exact kernel at least as fast as the hand plan").

Per paper attention configuration, at the hand plan's tiling (codegen.harness.FIXED): ``orders`` is the kernel of
``optimize(..., solver="cpsat-orders")`` (the model's best schedule with FA3's issue and turn order pinned),
``hand`` the hand plan (``codegen.plan.fa3_order_plan``) and ``hand_p`` its persistent form (the round's hand
column), ``cpsat`` the committed CP-SAT schedule's kernel (``results/schedules_h200``, the round's exact column).
Timing and checks are ``bench/ab/regress_ab.py``'s (CUDA graphs, rotated order, outputs compared with ``hand``).

    python -m bench orders_ab emit                                   # CPU: solve + emit -> results/orders_ab/
    PTSOLVE_CACHE_DIR=$PWD/.cubin_orders python -m bench orders_ab compile
    PTSOLVE_CACHE_DIR=$PWD/.cubin_orders python -m bench orders_ab   # GPU: smoke, compare, time
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.ab import regress_ab as R  # noqa: E402

OUT = ROOT / "results/orders_ab"
CONFIGS = ("FA2", "FA3", "FA3c", "FA13c", "FA14", "FA17c")
R.AB = OUT / "sources.json"
R.NAMES = list(CONFIGS)
R.COLS = ["hand", "hand_p", "orders", "orders_p", "cpsat", "cpsat_p", "first"]
R.__file__ = __file__  # regress_ab's smoke test re-runs this script in a child process


def emit() -> None:
    from codegen.cuda import emit as emit_source
    from codegen.harness import FIXED
    from codegen.plan import fa3_order_plan, plan_from_program
    from ptsolve import optimize
    from ptsolve.result import Result
    from ptsolve.suites import operator, paper

    OUT.mkdir(parents=True, exist_ok=True)
    cfgs = {c["name"]: c for c in paper()}
    out = {}
    for name in CONFIGS:
        op = operator(cfgs[name])
        r = optimize(op, hw="h200", solver="cpsat-orders", time_limit=240, fix=FIXED | {"persistent": 0},
                     compile_check=True)
        rp = optimize(op, hw="h200", solver="cpsat-orders", time_limit=240, fix=FIXED | {"persistent": 1},
                      compile_check=True)
        fp = optimize(op, hw="h200", solver="cpsat", time_limit=240, fix=FIXED | {"persistent": 1},
                      compile_check=True)
        first = optimize(op, hw="h200", solver="cpsat", time_limit=240, compile_check=True)
        for tag, x in (("cpsat-orders", r), ("cpsat-orders_p", rp), ("cpsat_p", fp), ("cpsat_first", first)):
            (OUT / f"{name}_{tag}.json").write_text(x.to_json())
        free = Result.from_json((R.SCHED / f"{name}_cpsat.json").read_text()).program
        p = dict(op.params)
        row = {"hand": emit_source(fa3_order_plan(p, FIXED), "h200"),
               "hand_p": emit_source(fa3_order_plan(p, FIXED | {"persistent": 1}), "h200"),
               "orders": emit_source(plan_from_program(r.program, "h200"), "h200"),
               "orders_p": emit_source(plan_from_program(rp.program, "h200"), "h200"),
               "cpsat": emit_source(plan_from_program(free, "h200"), "h200"),
               "cpsat_p": emit_source(plan_from_program(fp.program, "h200"), "h200"),
               "first": emit_source(plan_from_program(first.program, "h200"), "h200")}
        out[name] = {k: dataclasses.asdict(v) for k, v in row.items()}
        print(name, " ".join(f"{k} {x.status} {x.predicted_us:.1f} µs {x.tiling}" for k, x in
                             (("orders", r), ("orders_p", rp), ("cpsat_p", fp), ("first", first))), flush=True)
    R.AB.write_text(json.dumps(out, indent=0, sort_keys=True))


if __name__ == "__main__":
    R.cli(emit)
