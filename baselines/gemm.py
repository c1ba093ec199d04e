"""cuBLAS GEMM baseline through ``torch.matmul`` (fp16 and bf16 in, same dtype out, fp32 accumulation)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from codegen.harness import rel_err


def make_inputs(m: int, n: int, k: int, dtype: Any, seed: int = 0) -> tuple[Any, Any]:
    """Random A (M x K) and B (K x N), both row-major, on the GPU. Not zeros: zeros run faster."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", dtype=dtype, generator=g)
    b = torch.randn(k, n, device="cuda", dtype=dtype, generator=g)
    return a, b


def make_fn(a: Any, b: Any) -> Callable[[], Any]:
    """The timed call: one ``torch.matmul`` (a cuBLAS/cuBLASLt kernel); output allocation is cached."""
    import torch

    return lambda: torch.matmul(a, b)


def check(dtype: Any, m: int = 512, n: int = 384, k: int = 1024, seed: int = 1) -> float:
    """Relative Frobenius error of ``torch.matmul`` against a float32 product of the same inputs."""
    import torch

    a, b = make_inputs(m, n, k, dtype, seed)
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # a true fp32 reference, not tf32
    try:
        ref = a.float() @ b.float()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    return rel_err(make_fn(a, b)(), ref)
