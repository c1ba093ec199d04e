"""Each shape class's generic kernel: its schedule lowered with ``generic=True`` (the sizes that do not change the
schedule or the binary are kernel arguments), emitted once per process and compiled once: the cubin is cached on disk
by source hash (``codegen.runtime.compile_kernel``), and the source of a class does not depend on the shape, so a
second process, or a new shape, runs no nvcc.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from codegen.plan import KernelPlan

from .classes import HW, ShapeClass
from .table import schedule


@dataclass
class ClassKernel:
    """A class's generic kernel: its KernelIR, source and (once a GPU is used) the loaded module."""

    cls: ShapeClass
    plan: KernelPlan
    ir: Any
    ks: Any
    loaded: Any = None

    def prepare(self, values: dict[str, Any], maps: tuple[Any, ...], ntiles: int, out: str) -> Any:
        """The prepared launch (``runtime.Loaded.prepare``): a shape-generic kernel over ``ntiles`` work units; an
        exact-shape one (``exact``) on the grid it was built for, with its scratch buffers (split-K's)."""
        if not self.ks.generic:
            from codegen.runtime import workspace_ptrs
            values = {**values, **workspace_ptrs(self.ks)}
            ntiles = self.ks.persistent_tiles or self.ks.grid[0]
        return self.module().prepare(values, maps, ntiles, out=out)

    def module(self) -> Any:
        """The loaded cubin (``codegen.runtime.load``: compiled or read from the disk cache on first use)."""
        if self.loaded is None:
            from codegen.runtime import load
            self.loaded = load(self.ks)
        return self.loaded


_KERNELS: dict[ShapeClass, ClassKernel] = {}


def build(c: ShapeClass, plan: KernelPlan, generic: bool = True) -> ClassKernel:
    """Lower and emit ``plan`` as a kernel of class ``c``: its generic kernel (not kept: ``kernel`` keeps the table's),
    or with ``generic=False`` the exact-shape kernel of the plan's own shape (``exact``)."""
    from codegen.cuda import emit_ir
    from codegen.lower import lower

    ir = lower(plan, HW, generic=generic)
    return ClassKernel(c, plan, ir, emit_ir(ir))


def kernel(c: ShapeClass) -> ClassKernel:
    """The generic kernel of ``c`` (schedule, lowering and source once per process; the cubin from disk)."""
    k = _KERNELS.get(c)
    if k is None:
        k = _KERNELS[c] = build(c, schedule(c))
    return k


def keep(c: ShapeClass, ck: ClassKernel) -> None:
    """Make ``ck`` class ``c``'s kernel in this process (a table being built, a kernel under study)."""
    _KERNELS[c] = ck


def compile_class(c: ShapeClass) -> dict[str, Any]:
    """Compile ``c``'s generic kernel (cached); its ptxas numbers."""
    from codegen.runtime import compile_kernel
    rep = compile_kernel(kernel(c).ks).report
    return {k: rep.get(k) for k in ("registers", "spill_stores", "spill_loads", "wgmma_serialized")}
