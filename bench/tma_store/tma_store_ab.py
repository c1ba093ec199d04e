"""The TMA-store epilogue (GEMM tiling key ``tma_store``) against the register store, same tilings (issue 13).

CPU (no GPU; nvcc fills $PTSOLVE_CACHE_DIR)::

    PTSOLVE_CACHE_DIR=$PWD/.cubin_ts python -m bench tma_store prepare --out results/tma_store/cands.json

For every shape of ``bench.gemm_space.SHAPES`` whose N is a multiple of 8: the fastest cooperative and the fastest
ping-pong plan of the last measured schedule-space run (``results/gemm_space_h200/pp2_run.json`` over its candidate
files), each as measured (``coop_reg``, ``ping_reg``) and with ``tma_store`` = 1 (``coop_tma``, ``ping_tma``; where
the staging does not fit beside the ring, one ring slot less, marked in the candidate's ``note``).

GPU: ``python -m bench gemm_space run results/tma_store/cands.json --out $OUT`` (checks every kernel at the full
shape, times them next to cuBLAS in one process); then ``report`` prints the per-shape TMA / register ratios, and
``report-model RUN LABEL...`` cuBLAS / ours per shape set for candidate labels of a run (the model's first choice,
``model``, of ``results/tma_store/cands_model.json`` next to the earlier first choice and tuned pick).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.gemm_space.gemm_space import SHAPES, _plans  # noqa: E402
from codegen.plan import KernelPlan  # noqa: E402

SPACE = ROOT / "results/gemm_space_h200"
RUN = SPACE / "pp2_run.json"
CANDS = ("cands_pp2.json", "cands_tune.json")


def with_tma_store(plan: KernelPlan) -> KernelPlan:
    """``plan`` with the TMA-store epilogue: the tiling key set and every ``store@g`` of the post phase renamed."""
    post = {r: [(("store_tma" + t[len("store"):]) if t.startswith("store@") else t, s) for t, s in ops]
            for r, ops in plan.order["post"].items()}
    return KernelPlan(plan.op, dict(plan.params), dict(plan.tiling, tma_store=1), dict(plan.order, post=post),
                      list(plan.tc_order), plan.ii, dict(plan.copies))


def fits(plan: KernelPlan) -> str | None:
    """None when ``plan`` lowers and emits (shared memory within the budget), else the CodegenError's message."""
    from codegen.cuda import emit
    from ptsolve.errors import PtsolveError
    try:
        emit(plan)  # the hardware bench.gemm_space.run emits for
    except PtsolveError as e:
        return str(e)
    return None


def prepare(out: Path) -> int:
    run = json.loads(RUN.read_text())
    plans = _plans([json.loads((SPACE / c).read_text()) for c in CANDS])
    doc: dict[str, Any] = {"hw": "h200", "tag": "tma_store",
                           "date": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime()),
                           "source": f"{RUN.relative_to(ROOT)} over {', '.join(CANDS)}", "shapes": {}}
    for name, M, N, K, kind in SHAPES:
        got = run["shapes"].get(name)
        if got is None or N % 8:
            continue
        us = {k: v for k, v in got["us"].items() if k in plans.get(name, {}) and got["checks"][k]["ok"]}
        cands: dict[str, Any] = {}
        for struct, want in (("coop", False), ("ping", True)):
            mine = [k for k in us if bool(plans[name][k].tiling.get("pingpong", 0)) == want
                    and int(plans[name][k].tiling.get("splits", 1)) == 1]
            if not mine:
                continue
            best = min(mine, key=lambda k: (us[k], k))
            base = plans[name][best]
            tma = with_tma_store(base)
            note = ""
            while (why := fits(tma)) and tma.tiling["depth"] > 2:
                note = f"depth {base.tiling['depth']} -> {tma.tiling['depth'] - 1}: {why.splitlines()[0][:120]}"
                tma = KernelPlan(tma.op, tma.params, dict(tma.tiling, depth=tma.tiling["depth"] - 1), tma.order,
                                 tma.tc_order, tma.ii, tma.copies)
            cands[f"{struct}_reg"] = {"tiling": base.tiling, "plan": base.to_json(), "from": best,
                                      "measured_us": us[best]}
            if fits(tma) is None:
                cands[f"{struct}_tma"] = {"tiling": tma.tiling, "plan": tma.to_json(), "note": note}
        doc["shapes"][name] = {"M": M, "N": N, "K": K, "set": kind, "cands": cands}
        print(name, {k: v["tiling"] for k, v in cands.items()}, flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    from bench.gemm_space.gemm_space import precompile
    t0 = time.time()
    n = precompile([doc])
    print(f"wrote {out}; compiled {n} plans in {time.time() - t0:.0f} s")
    return 0


def predict(cands: Path) -> int:
    """Write each candidate's predicted time on the current h200 table into ``cands`` (``predicted_us``; the
    schedule of its fixed tiling by the greedy policy, which on GEMM's two-task loop is CP-SAT's too), for the
    predicted-against-measured gain of bench/choices/choices_report.py."""
    import ptsolve
    from ptsolve.ops.base import REGISTRY
    from ptsolve.provenance import stamp
    doc = json.loads(cands.read_text())
    opt = REGISTRY["gemm"].optional
    for name, e in doc["shapes"].items():
        op = ptsolve.ops.gemm(M=e["M"], N=e["N"], K=e["K"])
        for c in e["cands"].values():
            fix = opt | {k: v for k, v in c["tiling"].items() if k != "persistent"}
            c["predicted_us"] = ptsolve.optimize(op, hw="h200", solver="greedy", cache=False, compile_check=False,
                                                 fix=fix).predicted_us
        print(name, {k: round(c["predicted_us"], 1) for k, c in e["cands"].items()}, flush=True)
    doc["predicted"] = f"greedy on the h200 table, {stamp()['date']}, commit {stamp()['commit']}"
    cands.write_text(json.dumps(doc, indent=1))
    return 0


def report(cands: Path, run: Path) -> str:
    c, r = json.loads(cands.read_text()), json.loads(run.read_text())
    lines = ["| shape | M×N×K | cuBLAS µs | coop reg µs | coop TMA µs | TMA/reg | ping reg µs | ping TMA µs "
             "| TMA/reg |",
             "|---|---|---|---|---|---|---|---|---|"]
    ratios: dict[str, list[float]] = {"coop": [], "ping": []}
    best: list[tuple[float, float]] = []
    for name, e in c["shapes"].items():
        got = r["shapes"].get(name)
        if got is None:
            continue
        us, ok = got["us"], got["checks"]
        row = [name, f"{e['M']}×{e['N']}×{e['K']}", f"{us['cublas']:.1f}"]
        for s in ("coop", "ping"):
            a, b = us.get(f"{s}_reg"), us.get(f"{s}_tma")
            bad = f"{s}_tma" in ok and not ok[f"{s}_tma"]["ok"]
            if a is None or b is None:
                row += [f"{a:.1f}" if a else "-", "FAILED" if bad else "-", "-"]
                continue
            ratios[s].append(a / b)
            depth = "" if not e["cands"][f"{s}_tma"].get("note") else f" (d{e['cands'][f'{s}_tma']['tiling']['depth']})"
            row += [f"{a:.1f}", f"{b:.1f}{depth}", f"{a / b:.3f}"]
        regs = [us[k] for k in us if k.endswith("_reg")]
        alls = [us[k] for k in us if k != "cublas"]
        if regs and alls:
            best.append((us["cublas"] / min(regs), us["cublas"] / min(alls)))
        lines.append("| " + " | ".join(row) + " |")

    def geo(xs: list[float]) -> str:
        return f"{math.exp(sum(map(math.log, xs)) / len(xs)):.3f}" if xs else "-"
    lines += ["", "| | shapes | geomean reg time / TMA time (>1: TMA faster) | min | max |", "|---|---|---|---|---|"]
    for s, xs in ratios.items():
        if xs:
            lines.append(f"| {s} | {len(xs)} | {geo(xs)} | {min(xs):.3f} | {max(xs):.3f} |")
    lines += ["", f"Best of the register-store kernels vs cuBLAS, geomean over {len(best)} shapes: "
              f"{geo([a for a, _ in best])}; best of all (either store): {geo([b for _, b in best])}."]
    return "\n".join(lines)


SETS = (("paper (GEMM0-3)", lambda n, e: e["set"] == "paper"),
        ("shapes.md (LLM, square, odd)", lambda n, e: e["set"] not in ("paper", "heldout")),
        ("held out (bench.gemm_space.HELDOUT)", lambda n, e: e["set"] == "heldout"),
        ("skinny M (1, 16, 128)", lambda n, e: e["M"] in (1, 16, 128)),
        ("M >= 1024 and square", lambda n, e: e["M"] >= 1024 and e["set"] not in ("paper", "heldout")),
        ("8192³ (GEMM3, sq8192)", lambda n, e: (e["M"], e["N"], e["K"]) == (8192, 8192, 8192)),
        ("all", lambda n, e: True),
        ("all without 4095×4097×1024", lambda n, e: n != "odd4095x4097x1024"))


def report_model(run: Path, labels: tuple[str, ...]) -> str:
    """cuBLAS time / ours, geomean per shape set, for each label (a candidate file's tag) of one run."""
    r = json.loads(run.read_text())

    def geo(xs: list[float]) -> str:
        return f"{math.exp(sum(map(math.log, xs)) / len(xs)):.3f}" if xs else "-"
    out = ["| geomean of cuBLAS time / ours | shapes | " + " | ".join(labels) + " |",
           "|---|---|" + "---|" * len(labels)]
    for title, pick in SETS:
        names = [n for n, e in r["shapes"].items() if pick(n, e)]
        cols = []
        for lab in labels:  # over the shapes that have the label (a structure may not exist for every shape)
            xs = [r["shapes"][n]["us"]["cublas"] / r["shapes"][n]["us"][lab] for n in names
                  if lab in r["shapes"][n]["us"]]
            cols.append(geo(xs) + ("" if len(xs) == len(names) else f" ({len(xs)})"))
        out.append(f"| {title} | {len(names)} | " + " | ".join(cols) + " |")
    out += ["", "| shape | M×N×K | cuBLAS µs | " + " | ".join(f"{lab} µs (×cuBLAS)" for lab in labels) + " |",
            "|---|---|---|" + "---|" * len(labels)]
    for n, e in r["shapes"].items():
        us = e["us"]
        out.append(f"| {n} | {e['M']}×{e['N']}×{e['K']} | {us['cublas']:.1f} | " + " | ".join(
            f"{us[lab]:.1f} ({us['cublas'] / us[lab]:.3f})" if lab in us else "-" for lab in labels) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--out", type=Path, default=ROOT / "results/tma_store/cands.json")
    q = sub.add_parser("report")
    q.add_argument("cands", type=Path)
    q.add_argument("run", type=Path)
    pr = sub.add_parser("predict", help="write each candidate's predicted time (current table) into the file")
    pr.add_argument("cands", type=Path)
    m = sub.add_parser("report-model", help="cuBLAS / ours per shape set for the labels of one run")
    m.add_argument("run", type=Path)
    m.add_argument("labels", nargs="+")
    a = ap.parse_args(argv)
    if a.cmd == "prepare":
        return prepare(a.out)
    if a.cmd == "predict":
        return predict(a.cands)
    if a.cmd == "report-model":
        print(report_model(a.run, tuple(a.labels)))
        return 0
    print(report(a.cands, a.run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
