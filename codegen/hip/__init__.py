"""HIP gfx942 (AMD Instinct MI300X) code generator: ``emit(schedule, hw="mi300x") -> HipSource`` and
``compile(src) -> HipReport``.

A schedule (an SProgram, a KernelPlan, or an already lowered KernelIR) goes through ``codegen.lower`` to the same
KernelIR the CUDA generator reads; the one HIP skeleton (``codegen.hip.skeleton``) emits it with an operator's task
bodies (``gemm``, ``attention``). ``compile`` builds a code object with Debian's clang-19 (no ROCm needed) and reads
the compiler's resource report and the ISA. Kernels are compile-verified here, not run: see README.md.
"""
from __future__ import annotations

from typing import Any

from codegen.kernel_ir import KernelIR
from codegen.plan import KernelPlan

from . import attention, gemm  # noqa: F401  (task bodies register themselves)
from .common import HipSource
from .compile import HipReport, clang_path, compile
from .skeleton import REGISTRY, emit_ir

__all__ = ["REGISTRY", "HipReport", "HipSource", "clang_path", "compile", "emit", "emit_ir"]


def emit(schedule: Any, hw: str = "mi300x", **lower_kw: Any) -> HipSource:
    """HIP source and launch metadata for an SProgram, KernelPlan or KernelIR (``lower_kw`` go to
    ``codegen.lower.lower``); CodegenError for a schedule the generator cannot emit."""
    from ptsolve.errors import CodegenError

    if isinstance(schedule, KernelIR):
        return emit_ir(schedule)
    from codegen.lower import lower
    if not isinstance(schedule, KernelPlan) and type(schedule).__name__ != "SProgram":
        raise CodegenError(f"emit() takes an SProgram, a KernelPlan or a KernelIR, got {type(schedule).__name__}")
    return emit_ir(lower(schedule, hw, **lower_kw))
