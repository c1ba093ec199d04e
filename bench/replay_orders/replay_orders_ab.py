"""The exact solver's answer with the issue order chosen by the ``asap`` replay, next to the hand FA3-order plan and
to the answer the formula alone chose (issue 13: "the exact kernel ≥ the hand FA3-order plan on every paper
configuration").

``first``: ``optimize(op, hw="h200", solver="cpsat")`` of this checkout (ptsolve.optimize._replayed_order: CP-SAT's
formula optimum, or the best schedule of the operator's declared orders on its tiling where that one replays faster),
saved as ``results/replay_orders/<config>_cpsat.json``; ``formula``: the committed first choice of
``results/first_choice`` (the formula's pick, before the replay); ``hand_p``: the round's hand plan
(``codegen.plan.fa3_order_plan``, BM 128, BN 128, depth 2, two consumer warpgroups, persistent). Configurations: the
paper's eight and three held-out shapes of ``../shared/shapes.md`` (bench/first_choice/first_choice_ab.py's HELD_OUT);
``hand_again`` times ``hand_p``'s kernel a second time (the run's noise). Timing and checks are
``bench/ab/regress_ab.py``'s (CUDA graphs, order rotated each round, outputs compared).

    python -m bench replay_orders emit [--resolve] > results/replay_orders/emit.log   # CPU: solve + emit
    PTSOLVE_CACHE_DIR=$PWD/.cubin_replay python -m bench replay_orders compile
    PTSOLVE_CACHE_DIR=$PWD/.cubin_replay python -m bench replay_orders   # GPU
    python -m bench replay_orders rank > results/replay_orders/rank_study.md  # CPU: the replay across tilings

``decode`` (CPU, > results/replay_orders/decode_check.md): on decode_bench's quick shapes (every 9th of its 57),
does the replay change optimize's answer (compiler not in the loop)? flash_decode declares issue orders too.

``rank``: does the replay also rank *different tilings and policies* better than the formula? The 168 schedules of
``results/study_h200`` (21 configurations, the model's 4 best of CP-SAT and of greedy each, timed on an H200), each
predicted by this checkout's formula and replay, against their measured times.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.ab import regress_ab as R  # noqa: E402
from bench.first_choice import first_choice_ab as F  # noqa: E402

OUT = ROOT / "results/replay_orders"
R.AB = OUT / "sources.json"
R.NAMES = [*F.CONFIGS, *F.HELD_OUT]
R.COLS = ["hand_p", "first", "formula", "hand_again"]
R.RATIOS = [("first", "hand_p"), ("formula", "hand_p"), ("first", "formula"), ("hand_again", "hand_p")]
R.__file__ = __file__  # regress_ab's smoke test re-runs this script in a child process


def emit() -> None:
    from codegen.cuda import emit as emit_source
    from codegen.harness import FIXED
    from codegen.plan import fa3_order_plan, plan_from_program
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


def rank() -> None:
    from ptsolve.hw import load
    from ptsolve.program import SProgram
    from ptsolve.provenance import stamp
    from ptsolve.simulate import predicted_us, replay_us

    hw = load("h200")
    st = ROOT / "results/study_h200"
    cands = json.loads((st / "candidates.json").read_text())["configs"]
    times = json.loads((st / "study.json").read_text())["configs"]
    st_ = stamp()
    print("# The formula and the asap replay ranking measured schedules across tilings (results/study_h200)\n")
    print(f"`python -m bench replay_orders rank` (CPU, {st_['date']}, commit {st_['commit']}: the study's "
          "programs, solved at commit d5b8e34, predicted with this commit's H200 table; times measured on an H200 on "
          "2026-11-30). Pairs: the candidate pairs whose "
          "measured times differ by 0.5% or more, and how many of them each prediction orders as measured; pick: the "
          "measured time of each prediction's best candidate over the measured best.\n")
    print("| config | op | pairs ordered right: formula | replay | pick / best: formula | replay |")
    print("|---|---|---|---|---|---|")
    tot = [0, 0, 0, 0, 0, 0]
    for name, e in cands.items():
        m = times[name]["measured_us"]
        f, r = {}, {}
        for c in e["candidates"]:
            if c["label"] in m:
                p = SProgram.from_json(c["program"] if isinstance(c["program"], str) else json.dumps(c["program"]))
                f[c["label"]], r[c["label"]] = predicted_us(p, hw), replay_us(p, hw)
        ks = sorted(f)
        pairs = [(a, b) for i, a in enumerate(ks) for b in ks[i + 1:] if abs(m[a] / m[b] - 1) >= 0.005]
        pf = sum((f[a] < f[b]) == (m[a] < m[b]) for a, b in pairs)
        pr = sum((r[a] < r[b]) == (m[a] < m[b]) for a, b in pairs)
        best = min(m[k] for k in ks)
        fm, rm = m[min(f, key=f.get)] / best, m[min(r, key=r.get)] / best
        tot = [tot[0] + pf, tot[1] + pr, tot[2] + len(pairs), tot[3] + (fm == 1), tot[4] + (rm == 1), tot[5] + 1]
        print(f"| {name} | {e['op']} | {pf} of {len(pairs)} | {pr} | {fm:.3f} | {rm:.3f} |")
    print(f"\nAll: pairs ordered right, formula {tot[0]} and replay {tot[1]} of {tot[2]}; the measured best picked, "
          f"formula {tot[3]} and replay {tot[4]} of {tot[5]} configurations.")


def decode() -> None:
    from bench.decode.decode_bench import shapes
    from ptsolve import ops, optimize
    from ptsolve.hw import load
    from ptsolve.provenance import stamp
    from ptsolve.simulate import replay_us

    hw = load("h200")
    st_ = stamp()
    print("# Does the replay change optimize's decode answers?\n")
    print(f"`python -m bench replay_orders decode` (CPU, {st_['date']}, commit {st_['commit']}, H200 table, "
          "compiler not in the loop, 60 s per search).\n")
    print("| shape | answer's policy | tiling | predicted µs | replay µs |")
    print("|---|---|---|---|---|")
    changed = n = 0
    for sh in shapes(quick=True):
        op = ops.make("flash_decode" if sh["kind"] == "decode" else "flash_attention", dtype="fp16", **sh["params"])
        r = optimize(op, hw="h200", solver="cpsat", time_limit=60, cache=False, compile_check=False)
        n += 1
        changed += r.program.policy.startswith("cpsat-orders") and r.features[0].startswith("issue order")
        print(f"| {sh['name']} | {r.program.policy} ({r.status}) | {r.tiling} | {r.predicted_us:.1f} | "
              f"{replay_us(r.program, hw):.1f} |", flush=True)
    print(f"\nThe replay chose the declared order on {changed} of {n} shapes.")


if __name__ == "__main__":
    if sys.argv[1:2] == ["rank"]:
        rank()
    elif sys.argv[1:2] == ["decode"]:
        decode()
    else:
        R.cli(emit)
