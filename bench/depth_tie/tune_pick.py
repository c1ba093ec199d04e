"""``ptsolve tune``'s measured selection for the 45 GEMM shapes, confirmed by a second timing: from a run of
``cands_tune.json`` (the candidates ``ptsolve tune --per pingpong -k 3`` times: the 3 best compile-clean tilings of
each structure), write the fastest candidate of each shape as label ``pick``, to be timed again next to cuBLAS in a
run of its own (the minimum of noisy timings is biased low; the second run is not).

    python -m bench depth_tie tune_pick RUN/gemm_space.json results/depth_tie/cands_tune.json OUT/cands_pick.json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def main(run: Path, cands: Path, out: Path) -> None:
    r, c = json.loads(run.read_text()), json.loads(cands.read_text())
    doc = {k: v for k, v in c.items() if k != "shapes"} | {"tag": "pick", "shapes": {}}
    for name, e in c["shapes"].items():
        us = r["shapes"].get(name, {}).get("us", {})
        timed = {k: us[k] for k in e["cands"] if k in us and "plan" in e["cands"][k]}
        if not timed:
            continue
        best = min(sorted(timed), key=lambda k: timed[k])
        doc["shapes"][name] = {k: v for k, v in e.items() if k != "cands"} | {
            "cands": {"pick": e["cands"][best] | {"picked": best, "selection_us": timed[best]}}}
        print(name, best, round(timed[best], 1), e["cands"][best]["tiling"])
    out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main(*map(Path, sys.argv[1:4]))
