"""One GPU round: do the schedules ptsolve found run as fast as predicted, and does exact beat greedy?

CPU side (needs ortools; writes Result JSON that travels with the repo)::

    python -m bench round prepare --hw h200 --out results/schedules_h200

GPU side (one device call; no solver needed; ``compile`` first on the CPU, carrying PTSOLVE_CACHE_DIR, leaves it
only checks and timing)::

    PTSOLVE_CACHE_DIR=$PWD/.cubin_round python -m bench round compile --schedules results/schedules_h200
    python -m bench round run --schedules results/schedules_h200 --out $OUT

For each configuration the greedy and the CP-SAT program become kernels (codegen.plan.plan_from_program),
next to a hand-picked plan (``codegen.harness.hand``: attention the FA3-order plan; Mamba2 the fastest tiling of our
own earlier sweeps, see ``codegen.harness.HAND``) and the library baselines (SDPA cuDNN / FLASH, cuBLAS, mamba_ssm's
Triton kernels, which need the wheel of baselines/build_mamba_wheel.sh on the path). Every kernel is first checked
against a float32/float64 reference on a reduced shape with the same plan (``codegen.harness.check``: batch 1, fewer
heads, the GQA ratio kept; outputs poisoned with NaN), then timed at the full shape with ``codegen.harness.time_many``
(interleaved rounds, rotating inputs, median); Mamba2 kernels are also compared with the Triton output at the full
shape. Prints a markdown table last.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from codegen.harness import FIXED, check, hand, reduced

# FA18c and FA19 have 2^31 elements per tensor: beyond the generated kernels' 32-bit indices
CONFIGS = ("FA2", "FA3", "FA3c", "FA8", "FA8c", "FA13c", "FA14", "FA17c", "GEMM1", "GEMM3")
MAMBA = ("CS0", "CS3", "CS5", "CS8", "CS9", "ST0", "ST3", "ST5", "ST8", "ST9")
SOLVERS = ("greedy", "cpsat")


def prepare(hw: str, out: Path, names: tuple[str, ...] = CONFIGS, time_limit: float = 60.0,
            fixed: bool = False) -> None:
    """Schedule every configuration with each policy on ``hw`` and write the Results as JSON; ``fixed``
    also schedules attention on FA3's tiling (``{name}_{solver}@fixed.json``), to separate the choice of
    tiling from the choice of order; Mamba2 configurations also get the best schedule with one CTA per SM
    (``{name}_{solver}@1cta.json``)."""
    from ptsolve import optimize
    from ptsolve.suites import operator, paper

    out.mkdir(parents=True, exist_ok=True)
    cfgs = {c["name"]: c for c in paper()}
    for n in names:
        op = operator(cfgs[n])
        for s in SOLVERS:
            r = optimize(op, hw=hw, solver=s, time_limit=time_limit)
            (out / f"{n}_{s}.json").write_text(r.to_json())
            print(f"{n} {s}: {r}", flush=True)
            if fixed and op.op == "flash_attention":
                r = optimize(op.graph(FIXED), hw=hw, solver=s, time_limit=time_limit)
                (out / f"{n}_{s}@fixed.json").write_text(r.to_json())
                print(f"{n} {s}@fixed: {r}", flush=True)
            if op.op.startswith("mamba2"):  # the best with one CTA per SM too: what co-residency buys
                r = optimize(op, hw=hw, solver=s, time_limit=time_limit, fix={"ctas": 1})
                (out / f"{n}_{s}@1cta.json").write_text(r.to_json())
                print(f"{n} {s}@1cta: {r}", flush=True)


def plans_of(schedules: Path, persistent: bool = False, only: tuple[str, ...] = ()
             ) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """The Results of ``schedules`` (config -> policy -> Result) and the plans a round runs for them (config -> label
    -> KernelPlan: each policy's, the hand plan, and with ``persistent`` the attention ones on persistent CTAs)."""
    from codegen.plan import plan_from_program
    from ptsolve.result import Result

    order = CONFIGS + MAMBA
    names = sorted({p.name.split("_", 1)[0] for p in schedules.glob("*.json")} & set(only or order),
                   key=lambda n: order.index(n) if n in order else 99)
    res = {n: {p.stem.split("_", 1)[1]: Result.from_json(p.read_text()) for p in sorted(schedules.glob(f"{n}_*.json"))}
           for n in names}
    plans: dict[str, dict[str, Any]] = {}
    for n, rs in res.items():
        pl = {s: plan_from_program(r.program, "h200") for s, r in rs.items()}
        g = rs["cpsat"].program.graph
        pl["hand"] = hand(g.op, dict(g.params))
        if g.op == "flash_attention":
            if persistent:  # the same schedules on persistent CTAs (one per SM, longest tiles first)
                pl |= {f"{k}+persistent": dataclasses.replace(v, tiling=v.tiling | {"persistent": 1})
                       for k, v in list(pl.items()) if k != "hand"}
        plans[n] = pl
    return res, plans


def compile_all(plans: dict[str, dict[str, Any]]) -> int:
    """nvcc (cached, in parallel) every kernel a round launches: each plan at its full shape and at the reduced
    shape ``check`` runs it at; the number of plans."""
    from codegen.harness import precompile
    every = [pl for d in plans.values() for pl in d.values()]
    precompile(every + [reduced(pl) for pl in every])
    return len(every)


def run(schedules: Path, out: Path, persistent: bool = False, only: tuple[str, ...] = ()) -> int:
    import torch

    dev = torch.cuda.get_device_name()
    rows, checks = [], []
    res, plans = plans_of(schedules, persistent, only)
    t0 = time.time()
    n_plans = compile_all(plans)
    print(f"compiled {n_plans} kernels (and their reduced-shape checks) in {time.time() - t0:.0f} s", flush=True)
    for n, pl in plans.items():
        g = res[n]["cpsat"].program.graph
        for label, plan in pl.items():
            c = check(g.op, label, plan)
            c["config"], c["label"] = n, label
            checks.append(c)
            print(f"check {n} {label}: rel err {c['rel_err']:.2e} {'PASS' if c['ok'] else 'FAIL'}", flush=True)
        ok = {c["label"] for c in checks if c["config"] == n and c["ok"]}
        row = {"config": n, "op": g.op, "params": g.params, "flops": g.useful_flops,
               **{f"pred_{s}_us": r.predicted_us for s, r in res[n].items()},
               **{f"{s}_tiling": r.tiling for s, r in res[n].items()}}
        row |= _time(g, {k: v for k, v in pl.items() if k in ok})
        rows.append(row)
        print(json.dumps(row, default=str), flush=True)
    stamp = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime())
    (out / "round.json").write_text(json.dumps({"device": dev, "torch": torch.__version__, "date": stamp,
                                                "rows": rows, "checks": checks}, indent=1, default=str))
    md = table(rows)
    (out / "round.md").write_text(md + "\n")
    print(md)
    return 0 if all(c["ok"] for c in checks) else 1


def _time(g: Any, plans: dict[str, Any]) -> dict[str, Any]:
    """Median µs of each plan's kernel and of the library baselines at the full shape."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from codegen.cuda import emit
    from codegen.harness import time_many
    from codegen.runtime import load
    if g.op.startswith("mamba2"):
        from baselines.mamba2 import compare
        r = compare(plans, nsets=2) if plans else {"ms": {}, "rel_err_vs_triton": {}, "triton_error": "no plan passed"}
        return ({f"{k}_us": v * 1e3 for k, v in r["ms"].items()}
                | {f"{k}_tflops": g.useful_flops / (v * 1e9) for k, v in r["ms"].items()}
                | {f"{k}_err_vs_triton": v for k, v in r["rel_err_vs_triton"].items()}
                | {f"{k}_err_last_batch": v for k, v in r["rel_err_last_batch"].items()}
                | {"triton_error": r["triton_error"]})
    p = g.params
    tdt = {"fp16": torch.float16, "bf16": torch.bfloat16}[p["dtype"]]
    stream = torch.cuda.current_stream().cuda_stream
    fns: dict[str, Any] = {}
    ctxs: dict[str, Any] = {}
    kern = {k: load(emit(v)) for k, v in plans.items()}
    if g.op == "gemm":
        M, N, K = p["M"], p["N"], p["K"]
        sets = [(torch.randn(M, K, device="cuda", dtype=tdt), torch.randn(N, K, device="cuda", dtype=tdt))
                for _ in range(3)]
        c = torch.empty(M, N, device="cuda", dtype=tdt)
        for k, kk in kern.items():
            fns[k] = lambda i, kk=kk: kk.launch({"a": sets[i][0].data_ptr(), "b": sets[i][1].data_ptr(),
                                                 "c": c.data_ptr()}, stream)
        fns["cublas"] = lambda i: torch.matmul(sets[i][0], sets[i][1].T)
        nsets = 3
    else:
        B, H, Hkv, D, S = p["batch"], p["heads"], p["kv_heads"], p["head_dim"], p["seq_q"]
        sets = [tuple(torch.randn(B, S, h, D, device="cuda", dtype=tdt) for h in (H, Hkv, Hkv)) for _ in range(2)]
        o = torch.empty_like(sets[0][0])
        for k, kk in kern.items():
            fns[k] = lambda i, kk=kk: kk.launch({"q": sets[i][0].data_ptr(), "k": sets[i][1].data_ptr(),
                                                 "v": sets[i][2].data_ptr(), "o": o.data_ptr()}, stream)
        bl = [(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)) for q, k, v in sets]
        for name, be in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
            fns[name] = lambda i: torch.nn.functional.scaled_dot_product_attention(*bl[i], is_causal=p["causal"],
                                                                                   enable_gqa=True)
            ctxs[name] = lambda be=be: sdpa_kernel(be)
        nsets = 2
    ms = time_many(fns, nsets, ctxs=ctxs)
    return {f"{k}_us": v * 1e3 for k, v in ms.items()} | {f"{k}_tflops": g.useful_flops / (v * 1e9)
                                                          for k, v in ms.items()}


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| config | greedy pred µs | exact pred µs | greedy µs | exact µs | exact / greedy (measured) | "
             "hand plan µs | library µs | exact TFLOP/s | library TFLOP/s | exact / library | other plans µs |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    std = {"greedy", "cpsat", "hand", "cublas", "sdpa_cudnn", "sdpa_flash", "triton"}
    for r in rows:
        lib = {"gemm": "cublas", "flash_attention": "sdpa_cudnn"}.get(r["op"], "triton")

        def f(k: str, r: dict[str, Any] = r) -> str:
            return f"{r[k]:.1f}" if k in r else "—"
        sp = f"{r['greedy_us'] / r['cpsat_us']:.3f}" if "greedy_us" in r and "cpsat_us" in r else "—"
        rel = f"{r[lib + '_us'] / r['cpsat_us']:.3f}" if "cpsat_us" in r and lib + "_us" in r else "—"
        lines.append(f"| {r['config']} | {r['pred_greedy_us']:.1f} | {r['pred_cpsat_us']:.1f} | {f('greedy_us')} | "
                     f"{f('cpsat_us')} | {sp} | {f('hand_us')} | {lib} {f(lib + '_us')} | "
                     f"{f('cpsat_tflops')} | {f(lib + '_tflops')} | {rel} | "
                     + ", ".join(f"{k[:-3]} {r[k]:.1f}" for k in sorted(r) if k.endswith("_us") and
                                 not k.startswith("pred_") and k[:-3] not in std) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("prepare")
    pr.add_argument("--hw", default="h200")
    pr.add_argument("--out", default="results/schedules_h200")
    pr.add_argument("--fixed", action="store_true", help="also schedule attention on FA3's tiling")
    pr.add_argument("--only", default="", help="comma-separated config names")
    ru = sub.add_parser("run")
    ru.add_argument("--schedules", default="results/schedules_h200")
    ru.add_argument("--out", default=".")
    ru.add_argument("--persistent", action="store_true", help="also time every attention plan on persistent CTAs")
    ru.add_argument("--only", default="", help="comma-separated config names (default: all in --schedules)")
    co = sub.add_parser("compile", help="CPU: nvcc every kernel `run` launches into PTSOLVE_CACHE_DIR, to carry")
    co.add_argument("--schedules", default="results/schedules_h200")
    co.add_argument("--persistent", action="store_true")
    co.add_argument("--only", default="")
    a = ap.parse_args(argv)
    only = tuple(a.only.split(",")) if a.only else ()
    if a.cmd == "prepare":
        prepare(a.hw, Path(a.out), only or CONFIGS + MAMBA, fixed=a.fixed)
        return 0
    if a.cmd == "compile":
        t0 = time.time()
        print(f"compiled {compile_all(plans_of(Path(a.schedules), a.persistent, only)[1])} plans' kernels "
              f"in {time.time() - t0:.0f} s", flush=True)
        return 0
    return run(Path(a.schedules), Path(a.out), a.persistent, only)


if __name__ == "__main__":
    sys.exit(main())
