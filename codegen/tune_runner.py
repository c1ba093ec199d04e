"""Time candidate schedules on this machine's GPUs: the runner behind ``ptsolve.tune`` (entry point
``ptsolve.kernel_runners``: sm_90a) and its command line for candidates solved elsewhere.

Every candidate's kernel is first checked on a reduced shape with the same plan (codegen.harness.check: float32 /
float64 reference, output poisoned with NaN); a kernel that fails gets an infinite time and is never chosen. The
rest are timed at the full shape in one ``time_many`` call (interleaved rounds, rotating inputs, CUDA graphs), so
the comparison is within one process. With several GPUs the candidates are split over them, one worker process
per GPU (through Ray where it is installed)::

    ptsolve tune fa batch=1 heads=32 kv_heads=8 seq=4096 --hw h200 --top-k 5 --prepare cands.json   # CPU
    python3 -m codegen.tune_runner cands.json --out timed.json                                          # GPU
    ptsolve tune ... --finish timed.json                                                         # CPU: cache it
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ptsolve.hw import Hardware, load
from ptsolve.program import SProgram

from .plan import plan_from_program


def time_plans(plans: Sequence[Any], nsets: int = 2) -> list[float]:
    """Median µs per launch of each plan's kernel at its full shape on the current GPU (inf for a kernel that fails
    its reduced-shape check), interleaved in one time_many call."""
    import torch

    from .cuda import emit
    from .harness import check, random_args, time_many
    from .runtime import load as load_kernel

    ok = [bool(check(p.op, f"candidate {i}", p)["ok"]) for i, p in enumerate(plans)]
    kern = {i: load_kernel(emit(p)) for i, p in enumerate(plans) if ok[i]}
    if not kern:
        return [math.inf] * len(plans)
    first = next(iter(kern.values())).ks
    sets = [random_args(first, s) for s in range(nsets)]
    ptrs = [{k: t.data_ptr() for k, t in s.items()} for s in sets]

    def launch(k: Any) -> Any:
        return lambda i: k.launch(ptrs[i], int(torch.cuda.current_stream().cuda_stream))
    ms = time_many({i: launch(k) for i, k in kern.items()}, nsets, graphs=True)
    return [ms[i] * 1e3 if i in ms else math.inf for i in range(len(plans))]


def _worker(dev: int, plans_json: list[str]) -> list[float]:
    import torch

    from .plan import KernelPlan
    torch.cuda.set_device(dev)
    return time_plans([KernelPlan.from_json(s) for s in plans_json])


def split(n: int, gpus: int) -> list[list[int]]:
    """Candidate indices per GPU, round robin (the model's best spread over the GPUs)."""
    gpus = max(1, gpus)
    return [list(range(g, n, gpus)) for g in range(gpus)]


def runner(programs: Sequence[SProgram], hw: Hardware) -> list[float]:
    """Kernel times (µs) of ``programs`` on this machine: one GPU in this process, several in one worker each.
    (Kernels of one shape compete for the same GPU resources only within a worker; each GPU times its share.)"""
    import torch

    plans = [plan_from_program(p, hw) for p in programs]
    gpus = torch.cuda.device_count()
    if gpus <= 1 or len(plans) == 1:
        return time_plans(plans)
    parts = split(len(plans), gpus)
    payload = [[plans[i].to_json() for i in part] for part in parts]
    try:
        import ray  # noqa: F401
        if not ray.is_initialized():
            ray.init(num_gpus=gpus, include_dashboard=False, log_to_driver=False)
        remote = ray.remote(num_gpus=1)(lambda part: _worker(0, part))
        got = ray.get([remote.remote(p) for p in payload])
    except ImportError:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(max_workers=gpus, mp_context=mp.get_context("spawn")) as ex:
            got = list(ex.map(_worker, range(gpus), payload))
    out = [math.inf] * len(plans)
    for part, ts in zip(parts, got):
        for i, t in zip(part, ts):
            out[i] = t
    return out


def main(argv: list[str] | None = None) -> int:
    """python3 -m codegen.tune_runner CANDIDATES.json --out TIMED.json: time the candidates ``ptsolve tune --prepare``
    wrote (on a machine with a GPU and no solver) and write their kernel times."""
    ap = argparse.ArgumentParser(description="time the candidates of ptsolve tune --prepare on this GPU")
    ap.add_argument("candidates", help="JSON written by ptsolve tune --prepare")
    ap.add_argument("--out", help="where to write the times (JSON)")
    ap.add_argument("--compile-only", action="store_true",
                    help="no GPU: compile every kernel the timing launches into the cubin cache ($PTSOLVE_CACHE_DIR)")
    a = ap.parse_args(argv)
    d = json.loads(Path(a.candidates).read_text())
    progs = [SProgram.from_json(c["program"]) for c in d["candidates"]]
    if a.compile_only:
        from .harness import precompile, reduced
        plans = [plan_from_program(p, load(d["hw"])) for p in progs]
        precompile(plans + [reduced(p) for p in plans])
        print(f"compiled {2 * len(plans)} kernels (full and reduced shapes) of {len(plans)} candidates")
        return 0
    if not a.out:
        ap.error("--out is required unless --compile-only")
    import torch
    us = runner(progs, load(d["hw"]))
    Path(a.out).write_text(json.dumps(d | {"measured_us": us, "device": torch.cuda.get_device_name()}, indent=1))
    for c, u in zip(d["candidates"], us):
        print(f"rank {c['rank']}: {c['tiling']} predicted {c['predicted_us']:.1f} µs, measured {u:.1f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
