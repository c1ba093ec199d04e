"""Check and time generated kernels: the float32 references and error measure (``rel_err``, ``TOL``), the
correctness checks of a GEMM / FlashAttention plan (``check_gemm``, ``check_fa``), the interleaved CUDA timing every
measurement uses (``time_many``) and the parallel nvcc of many plans (``precompile``).

Correctness: every configuration is compared with a float32 torch reference on fresh random inputs, the output
poisoned with NaN before the run (relative Frobenius error <= 1e-2, NaN never passes). Timing (``time_many``):
warm-up, then 20 rounds in which every candidate (our schedules and the baselines, in the same process) runs a block
of back-to-back launches between CUDA events, inputs rotating over several sets so that repeated runs do not hit L2;
the median per-call time is reported. The benchmark that times the kernels next to cuBLAS and SDPA is
``python -m bench codegen_bench`` (bench/codegen_bench).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from codegen.plan import KernelPlan, default_plan

TOL = 1e-2
GEMM_TILING = {"BM": 128, "BN": 256, "BK": 64, "depth": 4, "groups": 2}
FA_TILING = {"BM": 128, "BN": 128, "depth": 2, "groups": 2}


def rel_err(out: Any, ref: Any, block: int = 1 << 26) -> float:
    """‖out − ref‖_F / ‖ref‖_F in float64; NaN if out has any NaN/Inf (so it never passes). Summed over blocks
    of ``block`` elements, so that a multi-GB output is not copied to float64 whole."""
    import torch
    if out.shape != ref.shape:
        raise ValueError(f"rel_err: output shape {tuple(out.shape)} differs from the reference's {tuple(ref.shape)}")
    o, r = out.reshape(-1), ref.reshape(-1)
    num = den = 0.0
    for i in range(0, o.numel(), block):
        ob, rb = o[i:i + block].double(), r[i:i + block].double()
        if not torch.isfinite(ob).all():
            return float("nan")
        num += float(((ob - rb) ** 2).sum())
        den += float((rb ** 2).sum())
    return (num / den) ** 0.5 if den else float("nan")


def attention_ref(q: Any, k: Any, v: Any, causal: bool) -> Any:
    """float32 reference, q [B,Sq,H,D], k/v [B,Skv,Hkv,D]; causal bottom-right aligned."""
    import torch
    B, Sq, H, D = q.shape
    Skv, Hkv = k.shape[1], k.shape[2]
    qf = q.float().transpose(1, 2)
    kf = k.float().transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
    vf = v.float().transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
    s = (qf @ kf.transpose(-1, -2)) / math.sqrt(D)
    if causal:
        i = torch.arange(Sq, device=q.device)[:, None]
        j = torch.arange(Skv, device=q.device)[None, :]
        s = s.masked_fill(j > i + (Skv - Sq), float("-inf"))
    return (torch.softmax(s, dim=-1) @ vf).transpose(1, 2)


def time_ms(fn: Callable[[int], Any], nsets: int) -> float:
    """Median milliseconds per call of ``fn(i % nsets)`` (see ``time_many``)."""
    return time_many({"x": fn}, nsets)["x"]


def time_many(fns: dict[str, Callable[[int], Any]], nsets: int, warmup: int = 5, rounds: int = 20,
              ctxs: dict[str, Callable[[], Any]] | None = None, block_ms: float = 2.0,
              graphs: bool = False) -> dict[str, float]:
    """Median milliseconds per call of each ``fn(i % nsets)``.

    Candidates are interleaved round by round, in an order rotated each round (clock or temperature drift and
    position in the round hit all alike). In a round each
    candidate runs ``reps`` back-to-back launches between two CUDA events (``reps`` sized so that a block
    lasts about ``block_ms``), so host launch latency is hidden for kernels longer than it; inputs rotate over
    ``nsets`` sets. ``ctxs[k]()`` is a context entered around candidate k's block (e.g. an SDPA backend).
    ``graphs`` captures each block once as a CUDA graph and replays it, so that the Python cost of a launch
    (argument checks, a Triton wrapper's allocations) is not timed even where it exceeds the kernel's; the
    warm-up (compilation, autotuning) runs before the capture.
    """
    import contextlib

    import torch
    ctxs = ctxs or {}
    reps: dict[str, int] = {}
    for k, fn in fns.items():
        with ctxs.get(k, contextlib.nullcontext)():
            for i in range(warmup):
                fn(i % nsets)
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for i in range(3):
                fn(i % nsets)
            e1.record()
            e1.synchronize()
        reps[k] = max(1, min(100, int(block_ms / max(e0.elapsed_time(e1) / 3, 1e-3))))
    def block(k: str) -> None:
        for i in range(reps[k]):
            fns[k](i % nsets)

    blocks: dict[str, Callable[[], Any]] = {k: (lambda k=k: block(k)) for k in fns}
    if graphs:
        for k in fns:
            g = torch.cuda.CUDAGraph()
            with ctxs.get(k, contextlib.nullcontext)(), torch.cuda.graph(g):
                block(k)
            blocks[k] = g.replay
        torch.cuda.synchronize()
    times: dict[str, list[float]] = {k: [] for k in fns}
    keys = list(fns)
    for r in range(rounds):
        # the order rotates: a candidate is not always the one that follows the same neighbour (clock and
        # power state after a long kernel) or the host's synchronisation gap
        for k in keys[r % len(keys):] + keys[:r % len(keys)]:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with ctxs.get(k, contextlib.nullcontext)():
                e0.record()
                blocks[k]()
                e1.record()
            e1.synchronize()
            times[k].append(e0.elapsed_time(e1) / reps[k])
    return {k: sorted(v)[len(v) // 2] for k, v in times.items()}


def check_gemm(M: int, N: int, K: int, dtype: str, tiling: dict[str, int], plan: KernelPlan | None = None,
               trials: int = 2) -> dict[str, Any]:
    """Worst relative error of the generated GEMM over ``trials`` fresh inputs."""
    import torch

    from codegen.runtime import run_gemm
    plan = plan or default_plan("gemm", {"M": M, "N": N, "K": K, "dtype": dtype}, tiling)
    tdt = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    worst = 0.0
    for _ in range(trials):
        a = torch.randn(M, K, device="cuda", dtype=tdt)
        b = torch.randn(N, K, device="cuda", dtype=tdt)
        c = torch.full((M, N), float("nan"), device="cuda", dtype=tdt)
        run_gemm(a, b, plan, out=c)
        torch.cuda.synchronize()
        e = rel_err(c, a.float() @ b.float().T)
        worst = e if math.isnan(e) else max(worst, e)
        if math.isnan(worst):
            break
    return {"op": "gemm", "M": M, "N": N, "K": K, "dtype": dtype, "tiling": tiling, "rel_err": worst,
            "ok": (not math.isnan(worst)) and worst <= TOL}


def check_fa(p: dict[str, Any], tiling: dict[str, int], plan: KernelPlan | None = None, trials: int = 2,
             label: str = "default") -> dict[str, Any]:
    import torch

    from codegen.runtime import run_attention
    plan = plan or default_plan("flash_attention", p, tiling)
    tdt = {"fp16": torch.float16, "bf16": torch.bfloat16}[p["dtype"]]
    B, H, Hkv, D = p["batch"], p["heads"], p["kv_heads"], p["head_dim"]
    worst = 0.0
    for _ in range(trials):
        q = torch.randn(B, p["seq_q"], H, D, device="cuda", dtype=tdt)
        k = torch.randn(B, p["seq_kv"], Hkv, D, device="cuda", dtype=tdt)
        v = torch.randn(B, p["seq_kv"], Hkv, D, device="cuda", dtype=tdt)
        o = torch.full_like(q, float("nan"))
        run_attention(q, k, v, plan, out=o)
        torch.cuda.synchronize()
        e = rel_err(o, attention_ref(q, k, v, p["causal"]))
        worst = e if math.isnan(e) else max(worst, e)
        if math.isnan(worst):
            break
    return {"op": "flash_attention", **p, "tiling": tiling, "order": label, "rel_err": worst,
            "ok": (not math.isnan(worst)) and worst <= TOL}


def precompile(plans: list[KernelPlan]) -> None:
    """Compile (cached) many plans in parallel before timing, so nvcc does not run serially later."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    from codegen.cuda import emit
    from codegen.runtime import compile_kernel
    sources = {ks.source: ks for ks in map(emit, plans)}  # plans with equal kernels compile once
    with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 2)) as ex:
        list(ex.map(compile_kernel, sources.values()))
