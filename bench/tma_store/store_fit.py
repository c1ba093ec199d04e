"""The store rates of the h200 table's GEMM constants (Hardware.reg_store_bytes_per_clk, staged_store_bytes_per_clk),
fitted from the profiler's timelines of results/tma_store/prof (the schedules of results/tma_store/sched, profiled by
python -m bench tma_store device) with ``ptsolve.calibrate.store_rates``.

    python -m bench tma_store store_fit            # print the observations and the fit
    python -m bench tma_store store_fit write      # store it as h200's GEMM constants (op_constants)
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[2] / "results/tma_store"  # the study's data
sys.path.insert(0, str(HERE.parents[1]))

from ptsolve.calibrate import store_rates, write_op  # noqa: E402
from ptsolve.hw import load  # noqa: E402
from ptsolve.provenance import stamp  # noqa: E402
from ptsolve.result import Result  # noqa: E402

KEYS = ("reg_store_bytes_per_clk", "staged_store_bytes_per_clk")


def fit() -> dict[str, dict]:
    pairs = []
    for p in sorted((HERE / "prof").glob("*.profile.json")):
        name = p.name[:-len(".profile.json")]
        res = Result.from_json((HERE / "sched" / f"{name}.json").read_text())
        pairs.append((json.loads(p.read_text()), res.program))
    return store_rates(pairs)


if __name__ == "__main__":
    got = fit()
    for k, v in got.items():
        print(f"{k}: {v['value']:.2f} B/clk/SM (median of {len(v['observations'])})")
        for kern, b, c in v["observations"]:
            print(f"  {kern}: {b} B in {c:.0f} cycles = {b / c:.1f} B/clk")
    if sys.argv[1:] == ["write"]:
        base = load("h200")
        fitted = dataclasses.replace(base.for_op("gemm"), **{k: round(got[k]["value"], 2) for k in KEYS})
        st = stamp()
        dev = (HERE / "device" / "summary.txt").read_text().splitlines()[0]
        p = write_op(fitted, base.for_op("gemm"), "gemm",
                     f"store rates fitted on the post-phase store tasks of 8 profiled GEMM kernels ({dev}, "
                     f"2026-12-03; fit {st['date']}, commit {st['commit']}); `python -m bench tma_store store_fit "
                     "write`", KEYS)
        print(f"wrote {p}")
