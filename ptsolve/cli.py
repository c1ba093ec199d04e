"""The ``ptsolve`` command line: optimize one operator, or compare the policies over a suite."""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Any

from .errors import PtsolveError
from .provenance import stamp

OPS = {"gemm": "gemm", "fa": "flash_attention", "flash_attention": "flash_attention",
       "chunk_scan": "mamba2_chunk_scan", "mamba2_chunk_scan": "mamba2_chunk_scan",
       "chunk_state": "mamba2_chunk_state", "mamba2_chunk_state": "mamba2_chunk_state"}


def _value(v: str) -> Any:
    if v.lower() in ("true", "false"):
        return v.lower() == "true"
    try:
        return int(v)
    except ValueError:
        return v


def parse_params(items: list[str]) -> dict[str, Any]:
    """``["batch=64", "causal=true"]`` -> {"batch": 64, "causal": True}."""
    out = {}
    for it in items:
        if "=" not in it:
            raise PtsolveError(f"parameter {it!r} is not key=value (e.g. batch=64)")
        k, v = it.split("=", 1)
        out[k] = _value(v)
    return out


def provenance() -> dict[str, str]:
    """Date, commit and machine (ptsolve.provenance), plus the command line, for every results file."""
    return stamp() | {"command": "ptsolve " + " ".join(sys.argv[1:])}


def cmd_optimize(a: argparse.Namespace) -> int:
    from . import ops, optimize
    from .hw import load
    from .report import gantt
    from .simulate import simulate

    if a.op not in OPS:
        raise PtsolveError(f"unknown operator {a.op!r}; use one of {sorted(OPS)}")
    op = ops.make(OPS[a.op], **parse_params(a.params))
    res = optimize(op, hw=a.hw, solver=a.solver, time_limit=a.time_limit, cache=not a.no_cache,
                   placement=a.placement, executor=a.executor, jobs=a.jobs, decoupled=a.decoupled,
                   fix=parse_params(a.fix) if a.fix else None,
                   progress=(lambda s: print(s, file=sys.stderr)) if a.verbose else None)
    hw = load(a.hw)
    print(res)
    for f in res.features:
        print("  " + f)
    print(res.program.summary(hw))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{res.program.graph.name}_{a.hw}_{a.solver}"
    stem.with_suffix(".json").write_text(res.to_json())
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(14, 4.5))
    gantt(simulate(res.program, hw), ax=ax, title=f"{res.program.graph.name} — {res.solver}, {res.predicted_us:.1f} µs")
    fig.tight_layout()
    fig.savefig(stem.with_suffix(".png"), dpi=110)
    print(f"wrote {stem}.json and {stem}.png")
    return 0


def cmd_compare(a: argparse.Namespace) -> int:
    from . import optimize
    from .hw import load
    from .simulate import claimed_cycles, simulate
    from .suites import SUITES, operator

    if a.suite not in SUITES:
        raise PtsolveError(f"unknown suite {a.suite!r}; use one of {sorted(SUITES)}")
    hw = load(a.hw)
    solvers = [s.strip() for s in a.solvers.split(",") if s.strip()]
    cfgs = [c for c in SUITES[a.suite]() if not a.only or any(c["name"].startswith(x) for x in a.only.split(","))]
    try:
        from tqdm import tqdm
        it = tqdm(cfgs, desc="compare", unit="config", file=sys.stderr)
    except ImportError:  # pragma: no cover
        it = cfgs
    rows = []
    for c in it:
        op = operator(c)
        row: dict[str, Any] = {"config": c["name"], "op": c["op"], "params": json.dumps(c["params"], sort_keys=True)}
        for s in solvers:
            if hasattr(it, "set_postfix_str"):
                it.set_postfix_str(f"{c['name']} {s}")
            r = optimize(op, hw=hw, solver=s, time_limit=a.time_limit, cache=not a.no_cache, jobs=a.jobs)
            tl = simulate(r.program, hw)
            if tl.kernel_cycles != claimed_cycles(r.program, hw) or tl.late:
                raise PtsolveError(f"{c['name']} {s}: simulate() gives {tl.kernel_cycles} cycles but the policy "
                                   f"claims {r.objective}: a ptsolve bug, please report it")
            row |= {f"{s}_us": round(r.predicted_us, 3), f"{s}_tflops": round(r.tflops, 1), f"{s}_status": r.status,
                    f"{s}_gap": round(r.gap, 4) if r.gap is not None else "", f"{s}_solve_s": round(r.solve_s, 2),
                    f"{s}_tiling": json.dumps(r.tiling, sort_keys=True), f"{s}_solved": f"{r.solved}/{r.tilings}"}
            if s != "greedy":
                row[f"{s}_features"] = "; ".join(f.split(":")[0] for f in r.features)
        if a.decoupled:
            r = optimize(op, hw=hw, solver="cpsat", time_limit=a.time_limit, cache=not a.no_cache, decoupled=True)
            row |= {"decoupled_us": round(r.predicted_us, 3), "decoupled_tiling": json.dumps(r.tiling, sort_keys=True)}
        if "greedy" in solvers:
            for s in solvers:
                if s != "greedy":
                    row[f"speedup_{s}"] = round(row["greedy_us"] / row[f"{s}_us"], 4)
        rows.append(row)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"compare_{a.hw}"
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(stem.with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    prov = provenance()
    stem.with_suffix(".md").write_text(compare_markdown(rows, solvers, a, prov))
    _bar_chart(rows, solvers, stem.with_suffix(".png"), a.hw)
    print(stem.with_suffix(".md").read_text())
    return 0


def cmd_placement(a: argparse.Namespace) -> int:
    """Inter-EU placement of the exact schedules of every suite entry with unequal CTAs."""
    from . import optimize
    from .hw import load
    from .ops.base import ctas_of
    from .placement import exact_loads, lower_bound, sm_loads
    from .simulate import unit_floor
    from .suites import SUITES, operator

    hw = load(a.hw)
    prov = provenance()
    lines = [f"# Inter-EU placement on {a.hw}: even split vs longest-first vs exact (predicted)", "",
             f"- command: `{prov['command']}`", f"- date: {prov['date']}", f"- commit: {prov['commit']}",
             f"- machine: {prov['machine']}", "",
             "Kernel latency (µs, busiest SM + launch) of the CP-SAT schedule of each configuration whose CTAs have "
             "unequal trip counts, placed three ways over the SM slots (SMs × resident CTAs). `exact`: CP-SAT over how "
             f"many CTAs of each latency each slot runs ({a.time_limit:.0f} s limit), proven = optimal; `bound`: "
             "max(average slot load, longest CTA). With co-resident CTAs every column is at least the SMs' shared-unit "
             "floor.", "",
             "| config | CTAs | even µs | lpt µs | exact µs | exact proven | bound µs | even / lpt |",
             "|---|---|---|---|---|---|---|---|"]
    for c in SUITES[a.suite]():
        op = operator(c)
        r = optimize(op, hw=hw, solver="cpsat", time_limit=30, cache=not a.no_cache)
        g, p = r.program.graph, r.program
        if len(set(g.row)) < 2:
            continue
        costs = [p.cta_cycles(n, hw) for n in g.row]
        slots = hw.sms * ctas_of(g.tiling)
        fl = {x: unit_floor(g, hw, x) for x in ("even", "lpt")}
        floor = fl["lpt"]  # exact is approximated by longest-first's slots (as in the model)
        even, lpt = (max(fl[x], int(sm_loads(costs, g.rows, slots, x).max())) for x in ("even", "lpt"))
        ex, proven = exact_loads(costs, g.rows, slots, time_limit=a.time_limit)
        us = [hw.cycles_to_us(x) + hw.launch_us for x in (even, lpt, max(floor, int(ex.max())),
                                                          max(floor, lower_bound(costs, g.rows, slots)))]
        lines.append(f"| {c['name']} | {g.n_ctas} | {us[0]:.2f} | {us[1]:.2f} | {us[2]:.2f} | {proven} | {us[3]:.2f} "
                     f"| {even / lpt:.3f} |")
        print(lines[-1], flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"placement_{a.hw}.md").write_text("\n".join(lines) + "\n")
    return 0


def compare_markdown(rows: list[dict[str, Any]], solvers: list[str], a: argparse.Namespace,
                     prov: dict[str, str]) -> str:
    lines = [f"# Greedy vs exact schedules, {a.suite} suite on {a.hw} (predicted by the ptsolve cost model)", "",
             f"- command: `{prov['command']}`", f"- date: {prov['date']}", f"- commit: {prov['commit']}",
             f"- machine: {prov['machine']}", f"- time limit per configuration and solver: {a.time_limit} s", "",
             "Latencies are the cost model's predictions (µs), not GPU measurements; `simulate()` replayed every "
             "schedule and reproduced its claimed latency. Speedup = greedy latency / exact latency.", ""]
    head = ["config"] + [f"{s} µs" for s in solvers] + [f"{s} status/gap" for s in solvers if s != "greedy"]
    head += [f"{s} solve s" for s in solvers] + [f"speedup {s}" for s in solvers if s != "greedy"]
    head += (["decoupled µs"] if a.decoupled else []) + ["exact tiling", "schedule"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ex = next((s for s in solvers if s != "greedy"), solvers[0])
    for r in rows:
        cells = [r["config"]] + [f"{r[f'{s}_us']:.2f}" for s in solvers]
        cells += [f"{r[f'{s}_status']} {100 * r[f'{s}_gap']:.1f}%" if r[f"{s}_gap"] != "" else r[f"{s}_status"]
                  for s in solvers if s != "greedy"]
        cells += [f"{r[f'{s}_solve_s']:.2f}" for s in solvers]
        cells += [f"{r[f'speedup_{s}']:.3f}" for s in solvers if s != "greedy" and f"speedup_{s}" in r]
        cells += ([f"{r['decoupled_us']:.2f}"] if a.decoupled else [])
        cells += [r[f"{ex}_tiling"].replace('"', ""), r.get(f"{ex}_features", "")]
        lines.append("| " + " | ".join(str(x) for x in cells) + " |")
    for s in solvers:
        if s == "greedy":
            continue
        sp = [r[f"speedup_{s}"] for r in rows if f"speedup_{s}" in r]
        st = [r[f"{s}_solve_s"] for r in rows]
        opt = sum(r[f"{s}_status"] == "OPTIMAL" for r in rows)
        if sp:
            lines += ["", f"**{s}**: speedup over greedy mean {sum(sp) / len(sp):.3f}×, max {max(sp):.3f}×, min "
                      f"{min(sp):.3f}×; proven optimal {opt}/{len(rows)}; solve time median "
                      f"{sorted(st)[len(st) // 2]:.2f} s, max {max(st):.2f} s."]
    return "\n".join(lines) + "\n"


def _bar_chart(rows: list[dict[str, Any]], solvers: list[str], path: Path, hw: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    ex = [s for s in solvers if s != "greedy" and f"speedup_{s}" in rows[0]]
    if not ex:
        return
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.28), 4))
    x = np.arange(len(rows))
    w = 0.8 / len(ex)
    for i, s in enumerate(ex):
        ax.bar(x + i * w, [r[f"speedup_{s}"] for r in rows], w, label=s)
    ax.axhline(1.0, color="black", lw=0.6)
    ax.set_xticks(x + 0.4 - w / 2, [r["config"] for r in rows], rotation=90, fontsize=7)
    ax.set_ylabel("predicted speedup over greedy")
    ax.set_title(f"exact vs greedy schedules on {hw} (cost model)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="ptsolve", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    o = sub.add_parser("optimize", help="schedule one operator; print the schedule, write its JSON and a Gantt PNG")
    o.add_argument("op", help=f"operator: {', '.join(sorted(OPS))}")
    o.add_argument("params", nargs="*", help="shape as key=value, e.g. batch=64 heads=32 kv_heads=8 seq=4096")
    c = sub.add_parser("compare", help="greedy vs exact over a suite; writes CSV, markdown and a bar chart")
    c.add_argument("--suite", default="paper")
    c.add_argument("--solvers", default="greedy,cpsat,milp")
    c.add_argument("--only", default="", help="comma-separated config name prefixes (e.g. FA1,GEMM)")
    c.add_argument("--no-decoupled", dest="decoupled", action="store_false",
                   help="skip the decoupled (tile by roofline, then schedule) ablation column")
    c.add_argument("--out", default="results")
    pl = sub.add_parser("placement", help="even vs longest-first vs exact CTA placement for unequal tiles")
    pl.add_argument("--suite", default="paper")
    pl.add_argument("--out", default="results")
    for q in (o, c, pl):
        q.add_argument("--hw", default="h100")
        q.add_argument("--time-limit", type=float, default=30.0, help="seconds per search (default 30)")
        q.add_argument("--no-cache", action="store_true")
        q.add_argument("--jobs", type=int, default=None, help="parallel solves (default: all cores)")
    o.add_argument("--solver", default="cpsat")
    o.add_argument("--placement", default="even")
    o.add_argument("--executor", default="process", help="process | serial | ray")
    o.add_argument("--decoupled", action="store_true")
    o.add_argument("--fix", nargs="*", default=[], metavar="KEY=VALUE",
                   help="search only tilings with these values, e.g. --fix ctas=1")
    o.add_argument("--out", default=".")
    o.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args(argv)
    try:
        return {"optimize": cmd_optimize, "compare": cmd_compare, "placement": cmd_placement}[a.cmd](a)
    except PtsolveError as e:
        print(f"ptsolve: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
