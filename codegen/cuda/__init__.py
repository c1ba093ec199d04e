"""CUDA sm_90a code generator: ``emit(plan) -> KernelSource``.

Warp-specialised kernels: warpgroup 0 is the TMA producer, warpgroups 1..W the wgmma consumers; the loop
of each role follows the plan's (task, stage) order (see ``codegen.cuda.schedule``).
"""
from __future__ import annotations

import hashlib

from codegen.plan import KernelPlan

from .common import KernelSource, TensorMapSpec
from .validate import validate

__all__ = ["KernelSource", "TensorMapSpec", "emit", "plan_id"]


def plan_id(plan: KernelPlan) -> str:
    """8 hex digits identifying the plan's order and tiling (part of the kernel name)."""
    return hashlib.sha256(plan.to_json().encode()).hexdigest()[:8]


def emit(plan: KernelPlan) -> KernelSource:
    """CUDA C++ source and launch metadata for ``plan``; raises CodegenError for a plan it cannot emit."""
    op = getattr(plan, "op", None)
    if op == "mamba2_chunk_scan":  # the Mamba2 emitters validate their own plans
        from .chunk_scan import emit_chunk_scan
        return emit_chunk_scan(plan)
    if op == "mamba2_chunk_state":
        from .chunk_state import emit_chunk_state
        return emit_chunk_state(plan)
    p, t, order = validate(plan)
    pid = plan_id(plan)
    if plan.op == "gemm":
        from .gemm import emit_gemm
        return emit_gemm(p, t, order, pid)
    from .attention import emit_attention
    return emit_attention(p, t, order, pid, list(plan.tc_order))
