"""Which structures the solver chooses, and the predicted against the measured gain of each (issue 13), from the
committed candidates and the device calls that timed them; no solver runs here.

    python -m bench choices > results/choices_h200.md

- GEMM, 45 shapes: the first choice (``results/depth_tie/cands_tie.json``) and, for the gain of a structure, the
  best-predicted and the best-measured candidate of each side among ``ptsolve tune --per pingpong -k 3``'s
  candidates (``cands_tune.json``), all timed in one process per shape (``device_tune/select``).
- GEMM's TMA-store epilogue: the first choices of ``results/tma_store/cands_model.json`` and the same tilings with
  either store (``cands.json``, predicted by ``bench/tma_store/tma_store_ab.py predict``), timed in
  ``results/tma_store/device``.
- Split-KV decode, 57 shapes: the free search's schedule (``split``) against the best with splits = 1 (``nosplit``),
  ``results/decode_h200/plans.json``, timed in ``results/decode_h200/decode.json`` (the run of those plans).
- Attention's issue order, 11 shapes: optimize's answer (``results/replay_orders/<config>_cpsat.json``) against the
  formula's pick (``results/first_choice``), the predicted gain by the asap replay (``ptsolve.simulate.replay_us``,
  what chose it), the measured one from ``results/replay_orders/device/run{1,2,3}.log``.
"""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DT = ROOT / "results/depth_tie"


def geo(xs: list[float]) -> float:
    return math.exp(statistics.mean(map(math.log, xs))) if xs else float("nan")


def gemm() -> list[str]:
    first = json.loads((DT / "cands_tie.json").read_text())["shapes"]
    cands = json.loads((DT / "cands_tune.json").read_text())["shapes"]
    run = json.loads((DT / "device_tune/select/gemm_space.json").read_text())
    out = [f"## GEMM (45 shapes; timed {run['date']}, {run['device']})", "",
           "| structure | first choice takes it on | shapes with both sides timed | predicted gain (geomean, "
           "range) | measured gain (geomean, range) | sign agrees |", "|---|---|---|---|---|---|"]
    sides = {"ping-pong consumer warpgroups (vs cooperative)": lambda t: bool(t.get("pingpong")),
             "split-K (vs one K range)": lambda t: t.get("splits", 1) > 1}
    for label, on in sides.items():
        taken = sorted(s for s, e in first.items() if on(e["cands"]["tie"]["tiling"]))
        pg, mg, agree = [], [], 0
        for s, e in sorted(cands.items()):
            us = run["shapes"].get(s, {}).get("us", {})
            both = [(on(v["tiling"]), v["predicted_us"], us[k]) for k, v in e["cands"].items()
                    if "tiling" in v and k in us]
            a, b = [x for x in both if x[0]], [x for x in both if not x[0]]
            if not a or not b:
                continue
            p = min(x[1] for x in b) / min(x[1] for x in a)
            m = min(x[2] for x in b) / min(x[2] for x in a)
            pg.append(p)
            mg.append(m)
            agree += (p > 1) == (m > 1)
        out.append(f"| {label} | {len(taken)} of 45 | {len(pg)} | {geo(pg):.3f} ({min(pg):.2f}-{max(pg):.2f}) | "
                   f"{geo(mg):.3f} ({min(mg):.2f}-{max(mg):.2f}) | {agree} of {len(pg)} |")
    deep = sorted(s for s, e in first.items() if e["cands"]["tie"]["tiling"]["depth"] >= 5)
    out += ["", "Gain = time without the structure / time with it (> 1: the structure is faster); each side is its "
            "best-predicted candidate for the predicted gain and its fastest for the measured one, among the tune "
            "candidates (the model's 3 best of each structure), so a side counts only where the model ranked it in "
            "its top 3.", f"First choice with ring depth 5 (the ring-depth tie-break on memory-bound loops): "
            f"{len(deep)} shapes."]
    return out


def gemm_session11() -> list[str]:
    """Clusters (opt-in) and the ring deepening: results/gemm_skinny's runs of them."""
    sk = ROOT / "results/gemm_skinny"
    cl = json.loads((sk / "device/cluster/cluster.json").read_text())
    mg = [us[k] / us[k + "_cl2"] for r in cl["shapes"].values() for us in [r["us"]] for k in us
          if k + "_cl2" in us]
    flat = json.loads((sk / "cands_flat.json").read_text())["shapes"]
    deep = json.loads((sk / "cands_deepen.json").read_text())["shapes"]
    run = json.loads((sk / "device/deepen/gemm_space.json").read_text())
    pg, dg, n = [], [], 0
    for name, e in deep.items():
        a, b = flat[name]["cands"]["flat"], e["cands"]["deepen"]
        if a["tiling"] != b["tiling"]:
            n += 1
            pg.append(a["predicted_us"] / b["predicted_us"])
            us = run["shapes"][name]["us"]
            dg.append(us["flat"] / us["deepen"])
    return [f"## GEMM: clusters and ring deepening (`results/gemm_skinny`; {run['device']})", "",
            "| structure | first choice takes it on | shapes / tilings measured | predicted gain | measured gain "
            "(geomean, range) |", "|---|---|---|---|---|",
            f"| 2-CTA cluster, B multicast (vs the same tiling without) | 0 of 45 (opt-in: `--fix cluster=2`, `tune "
            f"--per cluster`) | {len(mg)} tilings ({cl['date']}) | none (each SM still receives the whole tile) | "
            f"{geo(mg):.3f} ({min(mg):.2f}-{max(mg):.2f}) |",
            f"| ring deepened past the space's depths (vs the searched depth) | {n} of 45 | {n} ({run['date']}) | "
            f"{geo(pg):.3f} (same schedule) | {geo(dg):.3f} ({min(dg):.2f}-{max(dg):.2f}) |"]


def gemm_store() -> list[str]:
    """The TMA-store epilogue: the model's first choices (results/tma_store/cands_model.json) and, per structure, the
    same tiling with either store, predicted (``python -m bench tma_store predict``) against measured (device/)."""
    ts = ROOT / "results/tma_store"
    ab = json.loads((ts / "cands.json").read_text())["shapes"]
    run = json.loads((ts / "device/gemm_space.json").read_text())
    first = json.loads((ts / "cands_model.json").read_text())["shapes"]
    taken = sum(bool(e["cands"]["model"]["tiling"].get("tma_store")) for e in first.values())
    out = [f"## GEMM: the TMA-store epilogue (`results/tma_store`; {run['device']}, {run['date']})", "",
           f"The first choice takes the TMA store on {taken} of {len(first)} shapes (the others: split-K, which "
           "stores partials, or N not a multiple of 8).", "",
           "| same tiling, TMA store vs register store | shapes | predicted gain (geomean, range) | measured gain "
           "(geomean, range) | predicted and measured agree on a gain over 1% |", "|---|---|---|---|---|"]
    for side, label in (("coop", "cooperative"), ("ping", "ping-pong")):
        pg, mg = [], []
        for n, e in ab.items():
            us = run["shapes"].get(n, {}).get("us", {})
            c = e["cands"]
            if f"{side}_tma" in c and f"{side}_tma" in us and "predicted_us" in c[f"{side}_tma"]:
                pg.append(c[f"{side}_reg"]["predicted_us"] / c[f"{side}_tma"]["predicted_us"])
                mg.append(us[f"{side}_reg"] / us[f"{side}_tma"])
        agree = sum((p > 1.01) == (m > 1.01) for p, m in zip(pg, mg))
        out.append(f"| {label} | {len(pg)} | {geo(pg):.3f} ({min(pg):.2f}-{max(pg):.2f}) | {geo(mg):.3f} "
                   f"({min(mg):.2f}-{max(mg):.2f}) | {agree} of {len(pg)} |")
    out += ["", "Predicted on the h200 table with the store rates the profiler measured "
            "(bench/tma_store/store_fit.py). Where a ping-pong warpgroup's epilogue runs beside the other's main "
            "loop the model hides either store and predicts a tie; the tie goes to the TMA store "
            "(policies.model.tie_key), measured faster there."]
    return out


def decode() -> list[str]:
    plans = {s["name"]: s for s in json.loads((ROOT / "results/decode_h200/plans.json").read_text())["shapes"]}
    run = json.loads((ROOT / "results/decode_h200/decode.json").read_text())
    rows, pg, mg, agree, chosen = [], [], [], 0, 0
    for s in run["shapes"]:
        pl, us = plans[s["name"]]["plans"], s["us"]
        if "split" not in us or "nosplit" not in us:
            continue
        n = pl["split"]["tiling"]["splits"]
        p = pl["nosplit"]["predicted_us"] / pl["split"]["predicted_us"]
        m = us["nosplit"] / us["split"]
        if n > 1:
            chosen += 1
            pg.append(p)
            mg.append(m)
            agree += (p > 1) == (m > 1)
            rows.append(f"| {s['name']} | {n} | {p:.2f} | {m:.2f} |")
    return [f"## Split-KV decode (57 shapes; timed {run['date']}, {run['device']})", "",
            f"The free search split the keys on {chosen} of {len(run['shapes'])} shapes; predicted gain over "
            f"splits = 1 geomean {geo(pg):.2f} ({min(pg):.2f}-{max(pg):.2f}), measured {geo(mg):.2f} "
            f"({min(mg):.2f}-{max(mg):.2f}); "
            f"the sign agrees on {agree} of {len(pg)} (plans: `results/decode_h200/plans.json`, their commit's model).",
            "", "| shape | splits | predicted gain | measured gain |", "|---|---|---|---|", *rows]


def orders() -> list[str]:
    import re
    import sys
    sys.path.insert(0, str(ROOT))
    from ptsolve.hw import load
    from ptsolve.result import Result
    from ptsolve.simulate import predicted_us, replay_us
    hw = load("h200")
    ro = ROOT / "results/replay_orders"
    runs = [{m[1]: (float(m[2]), float(m[3])) for m in re.finditer(
        r"^(\w+) +hand_p [\d.]+ +first ([\d.]+) +formula ([\d.]+)", (ro / f"device/run{i}.log").read_text(), re.M)}
            for i in (1, 2, 3)]
    rows, taken = [], 0
    for f in sorted(ro.glob("*_cpsat.json")):
        name = f.name.removesuffix("_cpsat.json")
        new = Result.from_json(f.read_text()).program
        old = Result.from_json((ROOT / f"results/first_choice/{name}_cpsat_first.json").read_text()).program
        if new.graph.tiling != old.graph.tiling or not new.policy.startswith("cpsat-orders") or \
                old.policy.startswith("cpsat-orders"):
            continue
        taken += 1
        fg = predicted_us(old, hw) / predicted_us(new, hw)
        rg = replay_us(old, hw) / replay_us(new, hw)
        mg = [r[name][1] / r[name][0] for r in runs]
        rows.append(f"| {name} | {fg:.3f} | {rg:.3f} | {', '.join(f'{x:.3f}' for x in mg)} |")
    return ["## Attention: the issue order (`results/replay_orders`; NVIDIA H200, 2026-12-03)", "",
            f"optimize takes the declared FA3 order over CP-SAT's free order of the same tiling on {taken} of 11 "
            "shapes (the other three had it already); gain = the free order's time / the FA3 order's "
            "(> 1: FA3's faster). The formula ranks the free order ahead on all of them, the replay (which chose) "
            "the FA3 order; measured in three runs.", "",
            "| shape | gain by the formula | gain by the replay | measured gain (runs 1, 2, 3) |", "|---|---|---|---|",
            *rows]


def main() -> None:
    print("# The solver's choices among the kernel structures, predicted against measured (H200)\n")
    print("Made by `python -m bench choices` from committed candidates and device logs (each section names "
          "its call). Attention: the exact schedule takes persistent CTAs on all eight paper configurations "
          "(`results/sched_polish`; measured against a grid launch in `results/orders_ab/`); ring depths on ties: "
          "`results/depth_tie/README.md`.\n")
    print("\n".join(gemm()))
    print()
    print("\n".join(gemm_session11()))
    print()
    print("\n".join(gemm_store()))
    print()
    print("\n".join(decode()))
    print()
    print("\n".join(orders()))


if __name__ == "__main__":
    main()
