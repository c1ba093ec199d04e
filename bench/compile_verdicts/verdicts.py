"""Schedule held-out configurations per tiling with each policy, compile the kernels for sm_90a, tabulate ptxas.

For every operator below, ``--tilings`` tilings (a seeded sample of those the generator builds) are scheduled by
greedy, CP-SAT and cpsat-orders (the operator's declared issue order, where it has one; both exact policies with 3 s
of CP-SAT deterministic time, so reproducibly), compile checks off; each schedule's kernel is emitted and compiled
with nvcc (cached cubins), and the registers, spills and the wgmma serialisation warning (with ptxas's reason) are
recorded. Writes ``verdicts.jsonl`` (every schedule with its program: raw, kept out of git) and ``schedules.md`` (one
line per schedule) into ``--out``; prints the summary table. ``--configs heldout --seed 1`` schedules the held-out
configurations instead (``--configs new --seed 2 --tilings 4``: the second held-out set); ``--rescore FILE``
re-predicts a recorded ``verdicts.jsonl`` with this commit's source check (nothing compiled), ``--compile-costs N``
with it times the check, ``nvcc -ptx`` and ``nvcc -cubin`` on N of its attention kernels.
"""
from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import time
from collections import Counter
from pathlib import Path

import ptsolve
from codegen.cuda import emit
from codegen.cuda.wgmma_check import hazards, refusals
from codegen.runtime import compile_kernel
from ptsolve.errors import PtsolveError
from ptsolve.hw import load

F = ptsolve.ops.flash_attention
# the development set: the configurations the source check's rules were studied on
OPS = [F(batch=1, heads=32, kv_heads=8, seq=1536, head_dim=128, causal=True),
       F(batch=4, heads=28, kv_heads=4, seq=3000, head_dim=128, causal=False),
       F(batch=16, heads=16, kv_heads=16, seq=512, head_dim=64, causal=False),
       F(batch=2, heads=32, kv_heads=8, seq=2048, head_dim=64, causal=True),
       ptsolve.ops.gemm(M=1000, N=4096, K=4096), ptsolve.ops.gemm(M=64, N=14336, K=4096),
       ptsolve.ops.mamba2_chunk_scan(batch=2, seq=2048, heads=32, head_dim=64, d_state=128, chunk=256, groups=1),
       ptsolve.ops.mamba2_chunk_state(batch=2, seq=2048, heads=32, head_dim=64, d_state=128, chunk=256, groups=1)]
# the held-out set: other head dims (64/96/128/256), GQA ratios, sequence lengths (ragged ones too), causal or not;
# never looked at while the rules were written (``--configs heldout --seed 1``)
HELDOUT = [F(batch=2, heads=16, kv_heads=16, seq=1024, head_dim=128, causal=False),
           F(batch=1, heads=32, kv_heads=4, seq=4096, head_dim=128, causal=True),
           F(batch=8, heads=8, kv_heads=2, seq=777, head_dim=64, causal=False),
           F(batch=1, heads=24, kv_heads=8, seq=2000, head_dim=96, causal=True),
           F(batch=4, heads=16, kv_heads=16, seq=640, head_dim=256, causal=False),
           F(batch=3, heads=12, kv_heads=4, seq=1536, head_dim=64, causal=True),
           ptsolve.ops.gemm(M=2048, N=2048, K=1024),
           ptsolve.ops.mamba2_chunk_scan(batch=1, seq=1024, heads=16, head_dim=64, d_state=64, chunk=128, groups=1)]
# a second held-out set (``--configs new --seed 2 --tilings 4``): compiled while the partial-rewrite, pressure and
# empty-entry rules were being written and not looked at until they were committed; head dims 64/96/128/192/256, GQA,
# causal, ragged lengths, GEMM shapes and both Mamba2 kernels the other sets do not have
NEW = [F(batch=1, heads=40, kv_heads=8, seq=2048, head_dim=128, causal=True),
       F(batch=2, heads=16, kv_heads=4, seq=1000, head_dim=96, causal=False),
       F(batch=1, heads=8, kv_heads=8, seq=3072, head_dim=256, causal=True),
       F(batch=4, heads=32, kv_heads=8, seq=900, head_dim=64, causal=True),
       F(batch=2, heads=12, kv_heads=12, seq=1280, head_dim=192, causal=False),
       F(batch=3, heads=20, kv_heads=4, seq=1111, head_dim=96, causal=True),
       ptsolve.ops.gemm(M=512, N=8192, K=2048), ptsolve.ops.gemm(M=4096, N=1024, K=4096),
       ptsolve.ops.mamba2_chunk_scan(batch=2, seq=2048, heads=8, head_dim=64, d_state=128, chunk=256, groups=1),
       ptsolve.ops.mamba2_chunk_state(batch=1, seq=4096, heads=24, head_dim=64, d_state=128, chunk=256, groups=1)]
# a third held-out set (``--configs third --seed 4 --tilings 4``): compiled after every rule of the source check was
# committed (489a285) and scored once, unchanged
THIRD = [F(batch=8, heads=32, kv_heads=32, seq=2048, head_dim=64, causal=False),
         F(batch=2, heads=48, kv_heads=8, seq=1536, head_dim=128, causal=True),
         F(batch=4, heads=8, kv_heads=8, seq=2500, head_dim=96, causal=False),
         F(batch=1, heads=16, kv_heads=4, seq=2048, head_dim=192, causal=True),
         F(batch=2, heads=8, kv_heads=2, seq=1024, head_dim=256, causal=False),
         F(batch=3, heads=24, kv_heads=6, seq=777, head_dim=128, causal=True),
         ptsolve.ops.gemm(M=1024, N=1024, K=8192), ptsolve.ops.gemm(M=3000, N=5120, K=1024),
         ptsolve.ops.mamba2_chunk_scan(batch=1, seq=4096, heads=32, head_dim=64, d_state=64, chunk=128, groups=1),
         ptsolve.ops.mamba2_chunk_state(batch=2, seq=1024, heads=16, head_dim=64, d_state=64, chunk=128, groups=1)]
CONFIGS = {"dev": OPS, "heldout": HELDOUT, "new": NEW, "third": THIRD}
POLICIES = ("cpsat", "greedy", "cpsat-orders")
REASON = re.compile(r"due to (.*?) (?:of\s+a wgmma|for the|between)")


def verdict(op: object, tiling: dict, solver: str, hw: str) -> dict | None:
    """One schedule's row, or None where the policy or the generator refuses the tiling."""
    try:
        r = ptsolve.optimize(op, hw=hw, solver=solver, fix=tiling, compile_check=False, cache=False, time_limit=3,
                             executor="serial", deterministic=solver != "greedy")
        ks = emit(r.program, load(hw))
        rep = compile_kernel(ks).report
    except PtsolveError:
        return None
    why = [m.group(1) for w in rep["warnings"] if "serialized" in w for m in [REASON.search(w)] if m]
    return {"op": op.op, "desc": op.describe(), "tiling": r.tiling, "solver": solver, "objective": r.objective,
            "registers": rep["registers"], "spill": rep["spill_stores"] + rep["spill_loads"],
            "serialized": rep["wgmma_serialized"], "why": why[0] if why else "",
            "predicted": [f"{h.array}: {h.why}" for h in refusals(ks.source)],
            "stages": {str(ro): [[t.split("@")[0], s] for t, s in order] for ro, order in
                       sorted(r.program.streams(load(hw)).get("loop", {}).items())},
            "program": r.program.to_json()}


def rescore(path: Path, hw: str) -> list[dict]:
    """The rows of a recorded ``verdicts.jsonl`` with ``predicted`` recomputed by this commit's source check (each
    schedule re-emitted from its program; ptxas's recorded verdict kept), timing the check per kernel."""
    from ptsolve.program import SProgram

    rows, spent = [json.loads(line) for line in path.read_text().splitlines() if line.strip()], 0.0
    for r in rows:
        src = emit(SProgram.from_json(r["program"]), load(hw)).source
        t0 = time.perf_counter()
        r["predicted"] = [f"{h.array}: {h.why}" for h in refusals(src)]
        spent += time.perf_counter() - t0
    print(f"{len(rows)} schedules re-predicted from {path}: {1000 * spent / max(len(rows), 1):.0f} ms a kernel\n")
    return rows


def compile_costs(path: Path, hw: str, n: int) -> str:
    """Seconds a kernel for the first ``n`` attention schedules of a recorded ``verdicts.jsonl``: the source check,
    nvcc's front end alone (``-ptx``: cicc), and the whole compile the search runs (``-cubin``: cicc and ptxas), each
    compiled afresh (no cache); the median of each."""
    import statistics
    import tempfile

    from codegen.runtime import _nvcc
    from ptsolve.program import SProgram

    rows = [json.loads(line) for line in path.read_text().splitlines() if '"flash_attention"' in line][:n]
    spent: dict[str, list[float]] = {"source check": [], "nvcc -ptx (cicc)": [], "nvcc -cubin (cicc + ptxas)": []}
    with tempfile.TemporaryDirectory(prefix="verdicts_") as td:
        for r in rows:
            ks = emit(SProgram.from_json(r["program"]), load(hw))
            t0 = time.perf_counter()
            hazards(ks.source)
            spent["source check"].append(time.perf_counter() - t0)
            for key, flag in (("nvcc -ptx (cicc)", "-ptx"), ("nvcc -cubin (cicc + ptxas)", "-cubin")):
                t0 = time.perf_counter()
                _nvcc(ks, flag, Path(td) / "k.out")
                spent[key].append(time.perf_counter() - t0)
    return "\n".join(f"| {k} | {statistics.median(v):.2f} s |" for k, v in spent.items())


def table(rows: list[dict]) -> str:
    """Per operator and policy: schedules compiled, clean, serialised (by ptxas's reason), spilling."""
    out = ["| operator | policy | schedules | clean | wgmma serialised | spills |", "|---|---|---|---|---|---|"]
    for op in sorted({r["op"] for r in rows}):
        for pol in POLICIES:
            rs = [r for r in rows if r["op"] == op and r["solver"] == pol]
            if not rs:
                continue
            ser = Counter(r["why"] for r in rs if r["serialized"])
            out.append(f"| {op} | {pol} | {len(rs)} | {sum(not r['serialized'] and not r['spill'] for r in rs)} | "
                       + (", ".join(f"{n} ({w})" for w, n in sorted(ser.items())) or "0")
                       + f" | {sum(1 for r in rs if r['spill'])} |")
    return "\n".join(out)


def agreement(rows: list[dict], truth: str = "serialized") -> str:
    """The source check (codegen.cuda.wgmma_check.refusals) against ptxas's verdict, per operator and policy;
    ``truth`` "serialized": the wgmma pipeline serialised, "rejected": serialised or spilling (what the search
    refuses)."""
    def bad(r: dict) -> bool:
        return bool(r["serialized"] or (truth == "rejected" and r["spill"]))

    out = [f"| operator | policy | schedules | agree | {truth}, predicted | {truth}, missed | clean, flagged |",
           "|---|---|---|---|---|---|---|"]
    keys = sorted({(r["op"], r["solver"]) for r in rows})
    for op, pol in [*keys, ("all", "all")]:
        rs = [r for r in rows if op == "all" or (r["op"], r["solver"]) == (op, pol)]
        hit = [(bad(r), bool(r["predicted"])) for r in rs]
        agree = sum(a == b for a, b in hit)
        out.append(f"| {op} | {pol} | {len(rs)} | {agree} ({100 * agree / max(len(rs), 1):.1f} %) | "
                   f"{hit.count((True, True))} | {hit.count((True, False))} | {hit.count((False, True))} |")
    return "\n".join(out)


def schedules(rows: list[dict], head: str) -> str:
    """Every schedule on one line after ``head`` (what made them): configuration, tiling, policy, each consumer
    stream's loop order with stages, registers and ptxas's verdict."""
    out = [head, "", "| configuration | tiling | policy | loop orders (task:stage) | registers | verdict |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        orders = "; ".join(f"{k}: " + " ".join(f"{t}:{s}" for t, s in v) for k, v in r["stages"].items())
        verdict = (f"serialised ({r['why']})" if r["serialized"] else "") + (f" {r['spill']} B spilled"
                                                                              if r["spill"] else "")
        out.append(f"| {r['desc']} | {r['tiling']} | {r['solver']} | {orders} | {r['registers']} | "
                   f"{verdict.strip() or 'clean'} |")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hw", default="h100")
    ap.add_argument("--out", type=Path, default=Path("results/compile_verdicts"))
    ap.add_argument("--tilings", type=int, default=6, help="tilings per operator that some policy builds")
    ap.add_argument("--configs", choices=sorted(CONFIGS), default="dev", help="the configurations to schedule")
    ap.add_argument("--seed", type=int, default=0, help="the seed of the tilings' sample")
    ap.add_argument("--rescore", type=Path, help="a verdicts.jsonl to re-predict (the source check at this commit "
                                                  "against its recorded ptxas verdicts; nothing is compiled)")
    ap.add_argument("--compile-costs", type=int, default=0, metavar="N",
                    help="with --rescore: also time the check, nvcc -ptx and nvcc -cubin on N attention kernels")
    a = ap.parse_args()
    if a.rescore and a.compile_costs:
        print("| step | seconds a kernel (median) |\n|---|---|\n" + compile_costs(a.rescore, a.hw, a.compile_costs))
    if a.rescore:
        rows = rescore(a.rescore, a.hw)
        print(agreement(rows) + "\n\n" + agreement(rows, "rejected"))
        return
    a.out.mkdir(parents=True, exist_ok=True)
    # the commit of the code that runs, read before it runs
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True).stdout.strip()
    rng, rows, t0 = random.Random(a.seed), [], time.time()
    for op in CONFIGS[a.configs]:
        tilings, kept = op.tilings(), 0
        rng.shuffle(tilings)
        for t in tilings:
            if kept == a.tilings:
                break
            got = [r for r in (verdict(op, t, pol, a.hw) for pol in POLICIES) if r is not None]
            kept += bool(got)  # a tiling no generator builds is not counted
            for row in got:
                rows.append(row)
                print(row["op"], row["tiling"], row["solver"], row["registers"], row["serialized"], row["why"],
                      flush=True)
    (a.out / "verdicts.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))  # raw
    opts = "" if a.configs == "dev" and a.seed == 0 and a.tilings == 6 else \
        f" --configs {a.configs} --seed {a.seed} --tilings {a.tilings}"
    (a.out / "schedules.md").write_text(schedules(rows, f"# Every schedule of `python -m bench compile_verdicts --hw "
                                                        f"{a.hw}{opts}` (CPU, nvcc; {time.strftime('%Y-%m-%d')}, "
                                                        f"commit {commit})"))
    print(f"\n{len(rows)} schedules, {time.time() - t0:.0f} s, hw {a.hw}, commit {commit}\n")
    print(table(rows))
    print("\nThe source check before ptxas (codegen.cuda.wgmma_check):\n")
    print(agreement(rows) + "\n\n" + agreement(rows, "rejected"))


if __name__ == "__main__":
    main()
