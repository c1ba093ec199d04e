"""The exact solver's answer with the issue order chosen by the ``asap`` replay, next to the hand FA3-order plan and
to the answer the formula alone chose (issue 13: "the exact kernel ≥ the hand FA3-order plan on every paper
configuration").

``first``: ``optimize(op, hw="h200", solver="cpsat")`` of this checkout (ptsolve.optimize._replayed_order: CP-SAT's
formula optimum, or the best schedule of the operator's declared orders on its tiling where that one replays faster),
saved as ``results/replay_orders/<config>_cpsat.json``; ``formula``: the committed first choice of
``results/first_choice`` (the formula's pick, before the replay); ``hand_p``: the round's hand plan
(``codegen.plan.fa3_order_plan``, BM 128, BN 128, depth 2, two consumer warpgroups, persistent). Configurations: the
paper's eight and three held-out shapes of ``../shared/shapes.md`` (scripts/first_choice_ab.py's HELD_OUT);
``hand_again`` times ``hand_p``'s kernel a second time (the run's noise). Timing and checks are
``results/ab/regress_ab.py``'s (CUDA graphs, order rotated each round, outputs compared).

    python3 scripts/replay_orders_ab.py emit [--resolve] > results/replay_orders/emit.log   # CPU: solve + emit
    PTSOLVE_CACHE_DIR=$PWD/.cubin_replay python3 scripts/replay_orders_ab.py compile
    PTSOLVE_CACHE_DIR=$PWD/.cubin_replay python3 scripts/replay_orders_ab.py   # GPU
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "results/ab"))
sys.path.insert(0, str(ROOT / "scripts"))

import first_choice_ab as F  # noqa: E402
import regress_ab as R  # noqa: E402

OUT = ROOT / "results/replay_orders"
R.AB = OUT / "sources.json"
R.NAMES = [*F.CONFIGS, *F.HELD_OUT]
R.COLS = ["hand_p", "first", "formula", "hand_again"]
R.RATIOS = [("first", "hand_p"), ("formula", "hand_p"), ("first", "formula"), ("hand_again", "hand_p")]
R.__file__ = __file__  # regress_ab's smoke test re-runs this script in a child process


def emit() -> None:
    from codegen.cuda import emit as emit_source
    from codegen.plan import fa3_order_plan, plan_from_program
    from codegen.round import FIXED
    from ptsolve import ops, optimize
    from ptsolve.result import Result
    from ptsolve.simulate import replay_us
    from ptsolve.suites import operator, paper

    OUT.mkdir(parents=True, exist_ok=True)
    cfgs = {c["name"]: c for c in paper()}
    out = {}
    for name in R.NAMES:
        op = operator(cfgs[name]) if name in cfgs else ops.make("flash_attention", dtype="fp16", **F.HELD_OUT[name])
        saved = OUT / f"{name}_cpsat.json"
        if "--resolve" in sys.argv or not saved.exists():
            saved.write_text(optimize(op, hw="h200", solver="cpsat", time_limit=240, compile_check=True,
                                      cache=False).to_json())
        first = Result.from_json(saved.read_text())
        formula = Result.from_json((ROOT / f"results/first_choice/{name}_cpsat_first.json").read_text())
        hand = fa3_order_plan(dict(op.params), FIXED | {"persistent": 1})
        out[name] = {"hand_p": dataclasses.asdict(emit_source(hand, "h200")),
                     "hand_again": dataclasses.asdict(emit_source(hand, "h200")),  # the same kernel: the run's noise
                     "first": dataclasses.asdict(emit_source(plan_from_program(first.program, "h200"), "h200")),
                     "formula": dataclasses.asdict(emit_source(plan_from_program(formula.program, "h200"), "h200"))}
        fr, rr = first.predicted_us / formula.predicted_us, replay_us(first.program, "h200") / replay_us(
            formula.program, "h200")
        print(f"{name}: {first.status} {first.program.policy} {first.tiling}; first / formula's pick: by the formula "
              f"{fr:.3f} ({first.predicted_us:.1f} / {formula.predicted_us:.1f} µs), by the replay {rr:.3f}",
              flush=True)
    R.AB.write_text(json.dumps(out, indent=0, sort_keys=True))


if __name__ == "__main__":
    R.cli(emit)
