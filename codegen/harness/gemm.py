"""GEMM's harness: the exact-shape launch of a plan's kernel (``run_gemm``), its check against a float32 product,
its random inputs and the hand-written plan GEMM measurements compare against."""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from ..plan import KernelPlan, default_plan
from ..runtime import emit_cached, load
from .common import TOL, OpHarness, need, register, rel_err, stream, torch_dtype

# the 4-stage 128x256 tiling (0.96-1.01x cuBLAS, bench study codegen_bench): the hand plan and the benchmark's
GEMM_TILING = {"BM": 128, "BN": 256, "BK": 64, "depth": 4, "groups": 2}
REDUCED = {"M": 1000, "N": 768, "K": 1000}  # the shape a candidate is checked at


def run_gemm(a: Any, b: Any, plan: Any, out: Any = None) -> Any:
    """C = A · Bᵀ with A [M,K] and B [N,K] (row-major, "TN"), using the kernel emitted for ``plan``."""
    import torch

    ks = emit_cached(plan)
    p = ks.params
    need(a, "a", (p["M"], p["K"]), p["dtype"])
    need(b, "b", (p["N"], p["K"]), p["dtype"])
    c = out if out is not None else torch.empty(p["M"], p["N"], dtype=a.dtype, device=a.device)
    need(c, "out", (p["M"], p["N"]), p["dtype"])
    load(ks).launch({"a": a.data_ptr(), "b": b.data_ptr(), "c": c.data_ptr()}, stream())
    return c


def check_gemm(M: int, N: int, K: int, dtype: str, tiling: dict[str, int], plan: KernelPlan | None = None,
               trials: int = 2) -> dict[str, Any]:
    """Worst relative error of the generated GEMM over ``trials`` fresh inputs."""
    import torch

    plan = plan or default_plan("gemm", {"M": M, "N": N, "K": K, "dtype": dtype}, tiling)
    tdt = torch_dtype(dtype)
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


def _random_args(p: dict[str, Any], seed: int) -> dict[str, Any]:
    import torch

    torch.manual_seed(seed)
    t = torch_dtype(p["dtype"])
    return {"a": torch.randn(p["M"], p["K"], device="cuda", dtype=t),
            "b": torch.randn(p["N"], p["K"], device="cuda", dtype=t),
            "c": torch.full((p["M"], p["N"]), float("nan"), device="cuda", dtype=t)}


def _check(label: str, plan: Any) -> dict[str, Any]:
    small = dataclasses.replace(plan, params=_reduced(plan.params))
    return check_gemm(REDUCED["M"], REDUCED["N"], REDUCED["K"], plan.params["dtype"], plan.tiling, small, trials=1)


def _reduced(p: dict[str, Any]) -> dict[str, Any]:
    return p | REDUCED


def _hand(p: dict[str, Any]) -> Any:
    return default_plan("gemm", p, GEMM_TILING)


register("gemm", OpHarness(random_args=_random_args, check=_check, reduced=_reduced, hand=_hand))
