"""Host overhead of warm ``ptsolve.torch`` calls on the GPU (issue 11: target under 10 µs): µs per call in a tight loop
on tiny shapes (the GPU keeps up, so the loop measures the host), best of 5 rounds of N calls, beside PyTorch's own
ops measured the same way in the same process. Runs against whichever ``ptsolve`` is on the path, so two checkouts
can be compared in one device call:

    PYTHONPATH=<checkout> python -m bench torch_ops host_overhead --label new --out DIR

Writes DIR/host_overhead_<label>.json and prints a Markdown table.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F


def host_us(fn, n: int = 2000) -> float:
    """Host µs per call of ``fn`` (best of 5 rounds of ``n`` calls after 50 warm-up calls)."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = math.inf
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t) / n * 1e6)
        torch.cuda.synchronize()
    return best


def parts(pt, q, k, v) -> dict:
    """The pieces of a warm ``flash_attention`` call, each timed alone: the cache key, the output allocation, the
    stream look-up, and the kept launch (cuLaunchKernel through cuda-python)."""
    from ptsolve import serve
    ln = serve.attention_launch(q, k, v, serve.attention_class("fp16", 64, True, 2, 2), 0.125)
    out = torch.empty_like(q)
    o, st = out.data_ptr(), pt._raw_stream(0)
    cf = torch.contiguous_format
    return {
        "part: cache key (3 tensors' addresses, shapes, strides, dtypes)": lambda: (
            q.data_ptr(), k.data_ptr(), v.data_ptr(), q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(),
            q.dtype, k.dtype, v.dtype, True, None),
        "part: torch.empty_like(q, memory_format=contiguous)": lambda: torch.empty_like(q, memory_format=cf),
        "part: raw stream of q's device": lambda: pt._raw_stream(q.get_device()),
        "part: kept launch (cuda-python cuLaunchKernel)": lambda: ln(st, o),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--label", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("-n", type=int, default=2000)
    ap.add_argument("--parts", action="store_true", help="also time the pieces of a warm flash_attention call")
    a = ap.parse_args()
    import ptsolve.torch as pt
    from codegen.harness import scan_inputs, state_inputs

    h = torch.float16
    q, k, v = (torch.randn(1, 64, 2, 64, device="cuda", dtype=h) for _ in range(3))
    x, w = torch.randn(64, 64, device="cuda", dtype=h), torch.randn(64, 64, device="cuda", dtype=h)
    p = {"batch": 1, "seq": 256, "heads": 4, "head_dim": 64, "d_state": 128, "chunk": 256, "groups": 1,
         "dtype": "fp16"}
    s, st = scan_inputs(p, seed=0), state_inputs(p, seed=1)
    scan = (s["cb"], s["x"], s["dt"], s["dA_cumsum"], s["C"], s["states"])
    state = (st["B"], st["x"], st["dt"], st["dA_cumsum"])
    calls = {
        "flash_attention (public API)": lambda: pt.flash_attention(q, k, v, causal=True),
        "torch.ops.ptsolve.flash_attention (dispatcher)": lambda: torch.ops.ptsolve.flash_attention(q, k, v, True,
                                                                                                    0.125),
        "gemm (public API)": lambda: pt.gemm(x, w),
        "torch.ops.ptsolve.gemm (dispatcher)": lambda: torch.ops.ptsolve.gemm(x, w),
        "mamba_chunk_scan (public API)": lambda: pt.mamba_chunk_scan(*scan),
        "mamba_chunk_state (public API)": lambda: pt.mamba_chunk_state(*state),
        "F.scaled_dot_product_attention (reference)": lambda: F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True),
        "F.linear (reference)": lambda: F.linear(x, w),
        "torch.empty_like (reference)": lambda: torch.empty_like(q),
    }
    if a.parts:
        calls |= parts(pt, q, k, v)
    res = {}
    for name, fn in calls.items():
        try:
            res[name] = round(host_us(fn, a.n), 2)
        except Exception as e:  # noqa: BLE001 - a call the checkout does not have is reported, not fatal
            res[name] = f"{type(e).__name__}: {str(e)[:120]}"
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"host_overhead_{a.label}.json").write_text(json.dumps(res, indent=1))
    print(f"| call ({a.label}) | µs |\n|---|---|")
    for name, us in res.items():
        print(f"| {name} | {us} |")


if __name__ == "__main__":
    main()
