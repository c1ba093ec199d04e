"""The exact solver's first choice against the hand FA3-order plan, on every paper attention configuration
(issue 13: "the exact kernel ≥ the hand FA3-order plan on every paper configuration"), and on three held-out shapes
of ``../shared/shapes.md`` (``HELD_OUT``).

``first``: ``optimize(op, hw="h200", solver="cpsat")`` over the whole space with this checkout's H200 table (its
per-task costs fitted from the profiler: ``ptsolve calibrate-tasks``); ``hand_p``: the round's hand plan
(``codegen.plan.fa3_order_plan``, persistent); ``first_before``: the first choice of ``results/orders_ab`` (the
table without per-task costs), where that run had the configuration. Timing and checks are
``bench/ab/regress_ab.py``'s (CUDA graphs, order rotated each round, outputs compared).

    python -m bench first_choice emit [--resolve] [--only-new]   # CPU: solve (unless saved) + emit
    PTSOLVE_CACHE_DIR=$PWD/.cubin_first python -m bench first_choice compile
    PTSOLVE_CACHE_DIR=$PWD/.cubin_first python -m bench first_choice   # GPU
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.ab import regress_ab as R  # noqa: E402

OUT = ROOT / "results/first_choice"
CONFIGS = ("FA2", "FA3", "FA3c", "FA8", "FA8c", "FA13c", "FA14", "FA17c")
HELD_OUT = {  # shapes.md shapes that neither the paper suite nor the per-task fit (results/task_costs) used
    "H1": dict(batch=4, heads=28, kv_heads=4, head_dim=128, seq_q=1000, seq_kv=1000, causal=True),  # Qwen2.5 7B
    "H2": dict(batch=1, heads=64, kv_heads=8, head_dim=128, seq_q=4097, seq_kv=4097, causal=False),  # Llama-3 70B
    "H3": dict(batch=16, heads=12, kv_heads=12, head_dim=64, seq_q=511, seq_kv=511, causal=True),  # GPT-2
}
R.AB = OUT / "sources.json"
R.NAMES = [*CONFIGS, *HELD_OUT]
R.COLS = ["hand_p", "first", "first_before"]
R.__file__ = __file__  # regress_ab's smoke test re-runs this script in a child process


def emit() -> None:
    from codegen.cuda import emit as emit_source
    from codegen.harness import FIXED
    from codegen.plan import fa3_order_plan, plan_from_program
    from ptsolve import ops, optimize
    from ptsolve.result import Result
    from ptsolve.suites import operator, paper

    OUT.mkdir(parents=True, exist_ok=True)
    cfgs = {c["name"]: c for c in paper()}
    before = json.loads((ROOT / "results/orders_ab/sources.json").read_text())
    out = json.loads(R.AB.read_text()) if R.AB.exists() and "--only-new" in sys.argv else {}
    for name in R.NAMES:
        if name in out:
            continue
        op = operator(cfgs[name]) if name in cfgs else ops.make("flash_attention", dtype="fp16", **HELD_OUT[name])
        saved = OUT / f"{name}_cpsat_first.json"
        if "--resolve" in sys.argv or not saved.exists():
            saved.write_text(optimize(op, hw="h200", solver="cpsat", time_limit=240, compile_check=True,
                                      cache=False).to_json())
        first = Result.from_json(saved.read_text())
        row = {"hand_p": dataclasses.asdict(emit_source(fa3_order_plan(dict(op.params), FIXED | {"persistent": 1}),
                                                        "h200")),
               "first": dataclasses.asdict(emit_source(plan_from_program(first.program, "h200"), "h200"))}
        if name in before:
            row["first_before"] = before[name]["first"]
        out[name] = row
        print(name, first.status, f"{first.predicted_us:.1f} µs", first.tiling, flush=True)
    R.AB.write_text(json.dumps(out, indent=0, sort_keys=True))


if __name__ == "__main__":
    R.cli(emit)
