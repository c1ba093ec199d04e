"""Where a decode step's attention call spends its host time (issue 37): one layer of Llama-3-8B's attention shapes
(32 heads, 8 kv heads, head_dim 128, bf16) on transformers' ``DynamicCache``, a step being the cache's update and the
attention call as transformers makes it (ptsolve's ``hf_attention``, or transformers' ``sdpa_attention_forward``
under SDPA's FLASH backend). The GPU keeps up with one layer's small kernels, so a loop of steps measures the host.

    python -m bench models decode_host --out DIR [--rows b1_k1024,b16_k4096] [--steps 400]

Prints µs per step (update + attention, and the update alone), the kernels' device µs per call (CUDA events, one
cache length), and writes DIR/decode_host.json and DIR/decode_host_profile.txt (cProfile of ptsolve's steps, by own
time).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

ROWS = {"b1_k1024": (1, 1024), "b1_k32768": (1, 32768), "b4_k8192": (4, 8192), "b16_k4096": (16, 4096)}
H, HKV, D = 32, 8, 128
_FIRST: list[float] = []  # ms of each run's first attention call (a new cache length: ptsolve prepares a launch)


class _Module:
    is_causal, num_key_value_groups, training = True, H // HKV, False


def _impls() -> dict[str, Any]:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    import ptsolve.torch as pt

    def sdpa(m: Any, q: Any, k: Any, v: Any) -> Any:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return sdpa_attention_forward(m, q, k, v, None, scaling=D ** -0.5)[0]
    return {"sdpa_flash": sdpa, "ptsolve": lambda m, q, k, v: pt.hf_attention(m, q, k, v, None, scaling=D ** -0.5)[0]}


def _steps(fn: Any, batch: int, ctx: int, n: int, attend: bool, prof: cProfile.Profile | None = None) -> float:
    """Host µs per decode step over ``n`` steps of a fresh cache of ``ctx`` keys (update, then attention)."""
    import torch
    from transformers import DynamicCache

    g = torch.Generator(device="cuda").manual_seed(0)
    kw = {"device": "cuda", "dtype": torch.bfloat16, "generator": g}
    cache = DynamicCache()
    cache.update(torch.randn(batch, HKV, ctx, D, **kw), torch.randn(batch, HKV, ctx, D, **kw), 0)
    q = torch.randn(batch, H, 1, D, **kw)
    kn, vn = torch.randn(batch, HKV, 1, D, **kw), torch.randn(batch, HKV, 1, D, **kw)
    m = _Module()
    for i in range(20):
        k, v = cache.update(kn, vn, 0)
        t = time.perf_counter()
        if attend:
            fn(m, q, k, v)
        if i == 0:
            torch.cuda.synchronize()
            _FIRST.append((time.perf_counter() - t) * 1e3)
    torch.cuda.synchronize()
    if prof:
        prof.enable()
    t = time.perf_counter()
    for _ in range(n):
        k, v = cache.update(kn, vn, 0)
        if attend:
            fn(m, q, k, v)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t) / n * 1e6
    if prof:
        prof.disable()
    return dt


def _device_us(fn: Any, batch: int, ctx: int) -> float:
    """Device µs per attention call at one cache length (CUDA events over 50 calls on the same tensors)."""
    import torch
    kw = {"device": "cuda", "dtype": torch.bfloat16}
    q, k, v = torch.randn(batch, H, 1, D, **kw), torch.randn(batch, HKV, ctx, D, **kw), torch.randn(
        batch, HKV, ctx, D, **kw)
    m = _Module()
    for _ in range(5):
        fn(m, q, k, v)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(50):
        fn(m, q, k, v)
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / 50 * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--steps", type=int, default=400)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    impls, res, prof = _impls(), [], cProfile.Profile()
    for name in a.rows.split(","):
        batch, ctx = ROWS[name]
        row = {"row": name, "update_only_us": round(_steps(None, batch, ctx, a.steps, False), 1)}
        for impl, fn in impls.items():
            row[f"{impl}_step_us"] = round(_steps(fn, batch, ctx, a.steps, True), 1)
            row[f"{impl}_first_ms"] = round(_FIRST[-1], 2)
            if impl == "ptsolve":  # profiled apart: the profiler's own cost would land on the timed steps
                _steps(fn, batch, ctx, a.steps, True, prof)
            row[f"{impl}_device_us"] = round(_device_us(fn, batch, ctx), 1)
        res.append(row)
        print(json.dumps(row), flush=True)
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(40)
    pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(40)
    (a.out / "decode_host_profile.txt").write_text(s.getvalue())
    (a.out / "decode_host.json").write_text(json.dumps(res, indent=1))
    print("\n".join(s.getvalue().splitlines()[:30]))
    print("\n".join(s.getvalue().splitlines()[-42:]))
    print("| row | update µs | SDPA FLASH step µs | ptsolve step µs | SDPA dev µs | ptsolve dev µs | SDPA first ms | "
          "ptsolve first ms |\n|---|---|---|---|---|---|---|---|")
    for r in res:
        print(f"| {r['row']} | {r['update_only_us']} | {r['sdpa_flash_step_us']} | {r['ptsolve_step_us']} | "
              f"{r['sdpa_flash_device_us']} | {r['ptsolve_device_us']} | {r['sdpa_flash_first_ms']} | "
              f"{r['ptsolve_first_ms']} |")

if __name__ == "__main__":
    main()
