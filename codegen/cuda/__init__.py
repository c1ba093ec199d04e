"""CUDA sm_90a code generator: ``emit(schedule) -> KernelSource``.

A schedule (an SProgram, a KernelPlan, or an already lowered KernelIR) goes through ``codegen.lower`` to a
KernelIR, which the one skeleton (``codegen.cuda.skeleton``) emits with the operator's task bodies
(every module of this package, found by ``pkgutil``): warpgroup 0 is the TMA producer, warpgroups
1..W the wgmma consumers, every role's loop following its (task, stage) order.
"""
from __future__ import annotations

import hashlib
import importlib
import pkgutil
from typing import Any

from codegen.kernel_ir import KernelIR
from codegen.plan import KernelPlan

from .common import KernelSource, TensorMapSpec
from .skeleton import REGISTRY, emit_ir

# An operator's task-body module registers itself when imported: found, not listed, so a new operator's bodies are
# its file alone (the skeleton's helper modules import harmlessly). Sorted: the same registry order everywhere.
for _m in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_m}")

__all__ = ["REGISTRY", "KernelSource", "TensorMapSpec", "emit", "emit_ir", "plan_id"]


def plan_id(plan: KernelPlan | KernelIR) -> str:
    """8 hex digits identifying a plan's (or KernelIR's) order and tiling (part of the kernel name)."""
    return hashlib.sha256(plan.to_json().encode()).hexdigest()[:8]


def emit(schedule: Any, hw: str = "h100", **lower_kw: Any) -> KernelSource:
    """CUDA C++ source and launch metadata for an SProgram, KernelPlan or KernelIR (``lower_kw`` go to
    ``codegen.lower.lower``); CodegenError for a schedule the generator cannot emit."""
    from ptsolve.errors import CodegenError

    if isinstance(schedule, KernelIR):
        return emit_ir(schedule)
    from codegen.lower import lower
    if not isinstance(schedule, KernelPlan) and type(schedule).__name__ != "SProgram":
        raise CodegenError(f"emit() takes an SProgram, a KernelPlan or a KernelIR, got {type(schedule).__name__}")
    return emit_ir(lower(schedule, hw, **lower_kw))
