"""The register model against ptxas: what a kernel really needs per consumer thread, and what the model counts.

ptxas reports a setmaxnreg kernel's launch-bound allocation, not its consumers' demand; the demand is found by
compiling the kernel at setmaxnreg levels (multiples of 8) and taking the smallest at which ptxas neither spills,
serialises the wgmma pipeline nor ignores setmaxnreg (C7507). ``sample()`` lists representative tilings and orders
of every operator; ``main`` prints, per kernel, the model's count (ptsolve.validate.regs_per_thread: the buffers
plus the table's ``reg_overhead``), the measured demand and the difference, so the table's overhead and the
builders' working sets can be set from, and checked against, the compiler. ``--write`` stores each operator's
largest margin, rounded up to the allocation granule, as its ``reg_overcount`` (ptsolve.hw.Hardware): the search
leaves out a tiling whose estimate passes its budget by more (ptsolve.validate.register_refusal)::

    python -m bench regfit --out results/regfit_h100.md --rows ROWS.json --write     # ~10 minutes on 2 cores
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from codegen.cuda.skeleton import emit_ir
from codegen.kernel_ir import KernelIR
from codegen.lower import lower
from codegen.plan import KernelPlan, default_plan, fa3_order_plan
from codegen.runtime import compile_kernel
from ptsolve.errors import CodegenError, UnsupportedOperatorError

LEVELS = range(24, 248, 8)


def at(ir: KernelIR, regs: int) -> KernelIR:
    """``ir`` with its consumers' setmaxnreg level set to ``regs``."""
    return dataclasses.replace(ir, roles=tuple(dataclasses.replace(r, regs=regs) if r.group >= 0 else r
                                               for r in ir.roles))


def clean(ir: KernelIR, regs: int) -> bool:
    """Does ptxas compile ``ir`` at consumer level ``regs`` without spills, serialised wgmma or ignored setmaxnreg?"""
    try:
        rep = compile_kernel(emit_ir(at(ir, regs))).report
    except UnsupportedOperatorError:
        raise  # not a register verdict: the generator does not build this kernel at any level
    except CodegenError:
        return False  # e.g. "register allocation failed": far too few
    return rep["spill_stores"] == 0 and not rep["wgmma_serialized"] and not any("C7507" in w for w in rep["warnings"])


def demand(ir: KernelIR) -> int | None:
    """The smallest clean setmaxnreg level (registers per consumer thread), None if not even 240 is clean.
    Kernels without setmaxnreg (several CTAs per SM) are measured as if they had it: the demand is the code's."""
    if ir.roles[0].regs == 0:
        ir = dataclasses.replace(ir, ctas=1, roles=tuple(dataclasses.replace(r, regs=24 if r.group < 0 else 240)
                                                         for r in ir.roles))
    lo, hi = 16, max(LEVELS)
    if not clean(ir, hi):
        return None
    while hi - lo > 8:
        mid = (lo + hi) // 16 * 8
        lo, hi = (lo, mid) if clean(ir, mid) else (mid, hi)
    return hi


def sample() -> dict[str, KernelPlan]:
    """Representative kernels of every operator: the tilings of each operator's space with its hand orders."""
    fa = {"batch": 2, "heads": 8, "kv_heads": 2, "seq_q": 1000, "seq_kv": 1000, "head_dim": 128, "causal": True,
          "dtype": "bf16"}
    out: dict[str, KernelPlan] = {}
    for D in (64, 128):
        for BN in (64, 128, 176):
            t = {"BM": 128, "BN": BN, "depth": 2, "groups": 2}
            out[f"fa_d{D}_bn{BN}"] = default_plan("flash_attention", fa | {"head_dim": D}, t)
            out[f"fa_d{D}_bn{BN}_fa3"] = fa3_order_plan(fa | {"head_dim": D}, t)
    # the head dims and warpgroup counts the search also meets (Phi-3's 96, Gemma-2's 256; one and three consumer
    # warpgroups), so that the overcount written per operator (--write) is not of the two-warpgroup d64/d128 ones only
    for D, BM, BN, groups in ((96, 128, 128, 2), (96, 64, 128, 1), (256, 128, 64, 2), (256, 64, 64, 1),
                              (256, 128, 32, 2), (64, 192, 64, 3), (64, 192, 128, 3), (128, 192, 64, 3),
                              (64, 64, 176, 1)):
        t = {"BM": BM, "BN": BN, "depth": 2, "groups": groups}
        out[f"fa_d{D}_bm{BM}_bn{BN}_g{groups}"] = default_plan("flash_attention", fa | {"head_dim": D}, t)
    g = {"M": 2048, "N": 2048, "K": 1024, "dtype": "bf16"}
    for rows in (64, 128):
        for BN in (64, 128, 192, 256):
            if rows * BN <= 128 * 192:
                out[f"gemm_r{rows}_bn{BN}"] = default_plan("gemm", g, {"BM": 2 * rows, "BN": BN, "BK": 64, "depth": 3,
                                                                       "groups": 2})
    m = {"batch": 2, "seq": 1000, "heads": 8, "head_dim": 64, "d_state": 128, "chunk": 256, "groups": 1,
         "dtype": "bf16"}
    for BK in (32, 64, 128):
        for ov in (False, True):
            out[f"cs_bk{BK}{'_ov' if ov else ''}"] = default_plan("mamba2_chunk_scan", m, {"BM": 64, "BK": BK,
                                                                                          "depth": 2, "groups": 1}, ov)
    for P in (64, 128):
        for BM in (64, 128):
            out[f"st_p{P}_bm{BM}"] = default_plan("mamba2_chunk_state", m | {"head_dim": P},
                                                  {"BM": BM, "BK": 64, "depth": 2, "groups": 1}, True)
    return out


def measure(plans: dict[str, KernelPlan], hw: str = "h100", jobs: int = 2) -> list[dict[str, Any]]:
    """Per kernel: the model's registers per consumer thread, the measured demand, their difference."""
    def one(item: tuple[str, KernelPlan]) -> dict[str, Any]:
        name, plan = item
        ir = lower(plan, hw)
        d = demand(ir)
        return {"kernel": name, "op": ir.op, "tiling": ir.tiling, "copies": ir.copies, "model": ir.model_regs,
                "demand": d, "margin": None if d is None else ir.model_regs - d}
    with ThreadPoolExecutor(max_workers=jobs) as ex:
        return list(ex.map(one, sorted(plans.items())))


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| kernel | op | model regs | ptxas demand | model − demand |", "|---|---|---|---|---|"]
    lines += [f"| {r['kernel']} | {r['op']} | {r['model']} | {r['demand'] if r['demand'] else '> 240'} | "
              f"{r['margin'] if r['margin'] is not None else '—'} |" for r in rows]
    return "\n".join(lines)


def overcounts(rows: list[dict[str, Any]]) -> dict[str, tuple[int, int, int]]:
    """Per operator: (its Hardware.reg_overcount, the largest margin measured, kernels measured). The overcount is the
    largest margin rounded up to the 8-register granule ptxas allocates setmaxnreg levels in, at least one granule:
    an estimate past a budget by more cannot fit under it."""
    out: dict[str, tuple[int, int, int]] = {}
    for op in sorted({r["op"] for r in rows}):
        m = [r["margin"] for r in rows if r["op"] == op and r["margin"] is not None]
        if m:
            out[op] = (max(8, -(-max(m) // 8) * 8), max(m), len(m))
    return out


def write(rows: list[dict[str, Any]], commit: str, tables: tuple[str, ...] = ("h100", "h200")) -> list[Path]:
    """Store each operator's overcount (``overcounts``) in the sm_90 tables' overlays (ptsolve.calibrate.write_op):
    the same compiler decides on both devices."""
    from dataclasses import replace

    from ptsolve.calibrate import write_op
    from ptsolve.hw import load
    paths = []
    for name in tables:
        base = load(name, calibrated=False)
        for op, (over, most, n) in overcounts(rows).items():
            note = (f"reg_overcount measured by `python -m bench regfit --write` (nvcc 13.0 sm_90a, {n} {op} kernels, "
                    f"largest margin {most}; {time.strftime('%Y-%m-%d')}, commit {commit})")
            paths.append(write_op(replace(base, reg_overcount=over), base, op, note, ["reg_overcount"]))
    return sorted(set(paths))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hw", default="h100")
    ap.add_argument("--out", help="write a markdown report here")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--rows", help="JSON of the rows (read when it exists, else written after measuring)")
    ap.add_argument("--write", action="store_true",
                    help="store each operator's reg_overcount in ptsolve/hw/{h100,h200}.calibrated.json")
    a = ap.parse_args(argv)
    t0 = time.time()
    if a.rows and Path(a.rows).exists():
        rows = json.loads(Path(a.rows).read_text())
    else:
        rows = measure(sample(), a.hw, a.jobs)
        if a.rows:
            Path(a.rows).write_text(json.dumps(rows, indent=1) + "\n")
    md = table(rows)
    under = [r for r in rows if r["margin"] is not None and r["margin"] < 0]
    summary = (f"{len(rows)} kernels; model below the demand on {len(under)}; margins "
               f"{min(r['margin'] for r in rows if r['margin'] is not None)}.."
               f"{max(r['margin'] for r in rows if r['margin'] is not None)} registers; {time.time() - t0:.0f} s")
    over = overcounts(rows)
    summary += "; overcount per operator (reg_overcount): " + ", ".join(f"{op} {v[0]} (largest margin {v[1]}, {v[2]} "
                                                                         "kernels)" for op, v in over.items())
    print(md + "\n\n" + summary)
    import subprocess
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    if a.write:
        for p in write(rows, commit):
            print(f"wrote {p}")
    if a.out:
        Path(a.out).write_text(f"# Register model vs ptxas ({a.hw} table, nvcc sm_90a)\n\n- command: "
                               f"`python -m bench regfit {' '.join(argv if argv is not None else sys.argv[1:])}` "
                               "(the measured rows: --rows; no GPU, nvcc 13.0 on a 2-core CPU machine)\n"
                               f"- date: {time.strftime('%Y-%m-%d')}\n"
                               f"- commit: {commit}\n\n{summary}\n\n{md}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
