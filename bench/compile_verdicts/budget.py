"""What ptxas says about tilings past the model's register estimate: every attention configuration of the study's
development and held-out sets, each buildable tiling (depth 2, not persistent) whose estimate at one copy of every
buffer passes the consumer warpgroups' budget while it fits otherwise, its greedy schedule compile-checked as the
search checks it. Prints one JSON row per tiling (estimate, budget, verdict, tiling) and a table by excess.

    python -m bench compile_verdicts budget [--hw h100]

The evidence for and against pruning such tilings before the compiler (results/compile_verdicts: REG_SLACK,
tried and reverted).
"""
from __future__ import annotations

import argparse
import collections
import json
from concurrent.futures import ThreadPoolExecutor

import ptsolve
from ptsolve.errors import InfeasibleError
from ptsolve.hw import load
from ptsolve.policies.model import fits
from ptsolve.validate import register_excess

from .verdicts import HELDOUT, OPS


def _over(hw: object) -> list[tuple[object, dict, int, int]]:
    out = []
    for op in [o for o in OPS + HELDOUT if o.op == "flash_attention"]:
        for t in op.tilings():
            if t.get("persistent") or t.get("depth", 2) != 2:
                continue
            g = op.graph(t, hw)
            why = fits(g, hw)
            if why and why.startswith("registers") and fits(g, hw, registers=False) is None:
                x = register_excess(g, {}, hw)
                out.append((op, t, x[1], x[2]))
    return out


def _verdict(job: tuple[object, dict, int, int], hw: str) -> dict:
    op, t, est, budget = job
    row = {"estimate": est, "budget": budget, "tiling": t}
    try:
        r = ptsolve.optimize(op, hw=hw, solver="greedy", fix=t, compile_check=True, cache=False, executor="serial")
        return row | {"verdict": "clean", "registers": (r.kernel_check or {}).get("registers")}
    except InfeasibleError as e:
        msg = str(e)
        return row | {"verdict": "unbuildable" if msg.startswith("no tiling") else "refused", "why": msg[-160:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hw", default="h100")
    a = ap.parse_args()
    jobs = _over(load(a.hw))
    with ThreadPoolExecutor(2) as ex:
        rows = list(ex.map(lambda j: _verdict(j, a.hw), jobs))
    for r in rows:
        print(json.dumps(r, default=str))
    by = collections.Counter((next(b for b in (8, 16, 32, 1 << 30) if r["estimate"] - r["budget"] <= b), r["verdict"])
                             for r in rows if r["verdict"] != "unbuildable")
    print("\n| registers over the budget | clean | refused |\n|---|---|---|")
    for b, name in ((8, "1-8"), (16, "9-16"), (32, "17-32"), (1 << 30, "> 32")):
        print(f"| {name} | {by[(b, 'clean')]} | {by[(b, 'refused')]} |")


if __name__ == "__main__":
    main()
