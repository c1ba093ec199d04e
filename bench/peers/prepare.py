"""CPU (nvcc 13, OR-Tools): every cubin the GPU run needs, so that the device only times.

(a) The user path's kernels: every fp16 shape class's generic kernel (``ptsolve.serve``'s ``precompile``: GEMM,
attention and the decode variants). (b) The exact-shape kernel of every prefill, decode and GEMM row:
``ptsolve.optimize`` for that shape on the H200 table (``--time-limit`` seconds, the command's default 30, compiler
in the loop), its plan emitted and compiled; the plans go to ``plans.json``, which ``run`` reads. Varlen rows have
no exact-shape kernel (the harness runs dense shapes only): absent there.

The solves run against a work cache (``--work``, schedules and every compile check's cubins); only the cubins the run
launches are copied into ``--out`` (``<out>/cubin/``, with ``plans.json``), packed as ``--pack`` (tar.xz) for the
device call. Rows already in ``plans.json`` are kept (``--force`` solves them again); their plans are emitted and
compiled again by the checkout's code generator (cached), so a pack made after the code moved on is current; a kept
plan whose kernel spills or serialises is solved again.

    python -m bench peers prepare [--only TEXT] [--limit N] [--time-limit 30]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

OUT = ROOT / ".cubin_peers"  # carried (git-ignored: /.cubin_*/)
WORK = ROOT / ".cubin_peers_work"  # the solves' cache, not carried
PACK = ROOT / ".cubin_peers_pack" / "cache.tar.xz"
CLASSES = "gemm/fp16,flash_attention/fp16,flash_decode/fp16"  # the user path's classes for fp16 inputs
EXACT_OP = {"prefill": "flash_attention", "decode": "flash_decode", "gemm": "gemm"}


def op_params(row: dict[str, Any]) -> dict[str, Any]:
    """The operator parameters of a row's exact shape (``ptsolve.ops.make``)."""
    s = row["shape"]
    if row["workload"] == "gemm":
        return {k: s[k] for k in ("M", "N", "K", "dtype")}
    return {k: s[k] for k in ("batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim", "causal", "dtype")}


def served(op: str, shape: dict[str, Any]) -> tuple[Any, dict[str, Any]] | None:
    """(shape class, parameters) under which ``ptsolve.torch`` keeps this row's exact answer, or None (decode and
    varlen rows: their classes serve them)."""
    from ptsolve import serve
    if op == "gemm":
        return serve.gemm_class(shape["dtype"], shape["N"]), {k: shape[k] for k in ("M", "N", "K", "dtype")}
    if op != "flash_attention" or shape.get("varlen"):
        return None
    p = {k: shape[k] for k in ("batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim", "causal", "dtype")}
    return serve.attention_class(p["dtype"], p["head_dim"], p["causal"], p["heads"], p["kv_heads"]), p


def solve(row: dict[str, Any], time_limit: float) -> dict[str, Any]:
    """The exact-shape plan of one row, a record for plans.json (``error`` where the solver or the compiler refused):
    for a row the user path keeps answers for, the serving layer's own solve (``serve.exact.solve_exact``: its first
    choice, which the harness times as ``exact_us``, and its other candidates, which ``ptsolve.torch`` races),
    else optimize's answer; the plan emitted and compiled."""
    import ptsolve
    from codegen.plan import KernelPlan, plan_from_program
    from codegen.runtime import _key, compile_kernel, emit_cached
    from ptsolve.serve import exact
    t0 = time.time()
    op = EXACT_OP[row["workload"]]
    extra: dict[str, Any] = {}
    try:
        cp = served(op, row["shape"])
        if cp is not None:
            entry = exact.solve_exact(*cp, time_limit)
            if "error" in entry:
                raise ptsolve.errors.PtsolveError(entry["error"])
            plan = KernelPlan.from_json(json.dumps(entry["plan"]))
            extra = {"candidates": entry["candidates"], "status": entry["status"],
                     "predicted_us": entry["predicted_us"]}
        else:
            res = ptsolve.optimize(ptsolve.ops.make(op, **op_params(row)), hw="h200", time_limit=time_limit)
            plan = plan_from_program(res.program, "h200")
            extra = {"status": res.status, "predicted_us": res.predicted_us,
                     "kernel_check": str(res.kernel_check)[:200]}
        ks = emit_cached(plan)
        rep = compile_kernel(ks).report
    except Exception as e:  # noqa: BLE001  (a refused shape is recorded: the row's exact_us is then absent)
        return {"op": op, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}",
                "solve_s": round(time.time() - t0, 1)}
    return {"op": op, "plan": json.loads(plan.to_json()), "tiling": dict(plan.tiling), **extra,
            "solve_s": round(time.time() - t0, 1), "cubin": _key(ks), "registers": rep.get("registers"),
            "spills": rep.get("spill_stores"), "serialized": rep.get("wgmma_serialized")}


def class_kernels(only: str = CLASSES) -> dict[str, str]:
    """Compile the user path's class kernels (cached); class key -> cubin key."""
    from codegen.runtime import _key
    from ptsolve.serve import classes, compile_class, kernel
    out = {}
    for c in classes():
        if any(x in c.key for x in only.split(",")):
            rep = compile_class(c)
            if rep.get("spill_stores") or rep.get("wgmma_serialized"):
                print(f"warning: class {c.key} spills or serialises: {rep}", flush=True)
            out[c.key] = _key(kernel(c).ks)
    return out


def refresh(plans: dict[str, Any]) -> int:
    """Every kept plan emitted and compiled by this checkout's code generator (cached: instant where nothing changed),
    its cubin key updated, so that a pack made after the code moved on still holds what the run launches; the
    number of plans."""
    from codegen.plan import KernelPlan
    from codegen.runtime import _key, compile_kernel, emit_cached
    n = 0
    for rec in plans["rows"].values():
        if "plan" in rec:
            ks = emit_cached(KernelPlan.from_json(json.dumps(rec["plan"])))  # as the run loads it: from the JSON
            compile_kernel(ks)
            rec["cubin"] = _key(ks)
            n += 1
    return n


def exact_store(plans: dict[str, Any]) -> int:
    """The user path's exact-shape answers (``ptsolve.serve.exact``): each dense prefill and GEMM row's plan kept where
    ``ptsolve.torch`` looks for it, and its exact-shape kernel compiled as the serving layer builds it, so the run's
    user path launches what the solver picked for that shape (the GPU has no OR-Tools to solve it there); the number
    kept."""
    from codegen.plan import KernelPlan
    from codegen.runtime import _key, compile_kernel
    from ptsolve.serve import exact
    from ptsolve.serve.kernels import build
    n, keys = 0, []
    for rec in plans["rows"].values():
        cp = served(rec["op"], rec.get("shape", {})) if "plan" in rec else None
        if cp is None:
            continue
        c, params = cp
        for p in (rec["plan"], *rec.get("candidates", ())):
            ks = build(c, KernelPlan.from_json(json.dumps(p)), generic=False).ks
            compile_kernel(ks)
            keys.append(_key(ks))
        exact.write_entry(exact.store() / f"{exact.shape_key(c, params)}.json",
                          {"params": params, "plan": rec["plan"], "candidates": rec.get("candidates", []),
                           "status": rec.get("status", "")})
        n += 1
    plans["exact_cubins"] = sorted(set(keys))
    return n


def pack(plans: dict[str, Any], work: Path, out: Path, pack_to: Path) -> tuple[int, int]:
    """Copy the cubins the run launches (and their ptxas reports) from ``work`` into ``out/cubin``, write
    ``out/plans.json`` and tar.xz ``out`` into ``pack_to``; (cubins, packed bytes)."""
    keys = set(plans["classes"].values()) | {r["cubin"] for r in plans["rows"].values() if "cubin" in r}
    keys |= set(plans.get("exact_cubins", ()))
    dst = out / "cubin"
    if out.exists():
        shutil.rmtree(out)
    dst.mkdir(parents=True)
    if (work / "exact").is_dir():  # the serving layer's kept answers (exact_store)
        shutil.copytree(work / "exact", out / "exact")
    for k in sorted(keys):
        for ext in (".cubin", ".json"):
            shutil.copy2(work / "cubin" / f"{k}{ext}", dst / f"{k}{ext}")
    (out / "plans.json").write_text(json.dumps(plans, indent=1, sort_keys=True))
    pack_to.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(pack_to, "w:xz", preset=6) as tf:
        tf.add(out, arcname=out.name)
    return len(keys), pack_to.stat().st_size


def main(argv: list[str] | None = None) -> int:
    from bench.peers.suite import rows, select
    ap = argparse.ArgumentParser(prog="python -m bench peers prepare", description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="")
    ap.add_argument("--limit", type=int, default=0, help="at most N rows of each workload")
    ap.add_argument("--time-limit", type=float, default=30.0, help="optimize's limit per shape (its default: 30 s)")
    ap.add_argument("--work", type=Path, default=WORK)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--pack", type=Path, default=PACK)
    ap.add_argument("--force", action="store_true", help="solve rows already in plans.json again")
    a = ap.parse_args(argv)
    os.environ["PTSOLVE_CACHE_DIR"] = str(a.work)  # the solves' schedules and every compiled cubin
    a.work.mkdir(parents=True, exist_ok=True)
    saved = a.work / "plans.json"
    plans = json.loads(saved.read_text()) if saved.exists() else {"rows": {}, "classes": {}}
    from ptsolve.provenance import stamp
    t0 = time.time()
    plans["classes"] = class_kernels()
    print(f"{len(plans['classes'])} class kernels compiled ({time.time() - t0:.0f} s)", flush=True)
    for row in select(rows(), a.only, a.limit):
        kept = plans["rows"].get(row["name"])
        # a kept plan whose kernel spills or serialises was never asked of the compiler (the time limit once cut the
        # checks short): solved again
        if row["workload"] not in EXACT_OP or (kept and not a.force and not kept.get("spills")
                                               and not kept.get("serialized")):
            continue
        rec = plans["rows"][row["name"]] = {"shape": row["shape"], **solve(row, a.time_limit)}
        print(row["name"], rec.get("status", rec.get("error")), rec.get("tiling", ""), rec.get("predicted_us", ""),
              f"{rec['solve_s']} s", flush=True)
        saved.write_text(json.dumps(plans, indent=1, sort_keys=True))  # after every row: a stop keeps the work
    t1 = time.time()
    print(f"{refresh(plans)} exact-shape plans compiled for this checkout ({time.time() - t1:.0f} s)", flush=True)
    print(f"{exact_store(plans)} answers kept for the user path (ptsolve.serve.exact)", flush=True)
    plans["provenance"] = stamp()
    plans["time_limit"] = a.time_limit
    plans["solve_s"] = round(sum(r.get("solve_s", 0) for r in plans["rows"].values()), 1)  # every run's solves
    plans["last_run_s"] = round(time.time() - t0, 1)
    saved.write_text(json.dumps(plans, indent=1, sort_keys=True))
    n, size = pack(plans, a.work, a.out, a.pack)
    print(f"{n} cubins in {a.out} ({sum(f.stat().st_size for f in a.out.rglob('*')) / 2**20:.1f} MiB), "
          f"packed {a.pack} ({size / 2**20:.1f} MiB); this run {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
