"""The compiler in the loop, seen from ptsolve: a verdict on the kernel a schedule becomes.

ptsolve does not generate code (``codegen`` does, and ptsolve never imports it). A code generator registers a
checker for a target architecture under the entry-point group ``ptsolve.kernel_checkers`` (name: the hardware
table's ``arch``, e.g. ``sm_90a``); ``checker(hw)`` finds it. A checker lowers a program, emits and compiles its
kernel and says whether the compiler accepted it as the schedule assumes (no register spills, no serialised
tensor-core pipeline). Without a registered checker, or without the compiler, the answer is "not compile-checked":
never a guess.

A checker may carry two optional attributes: ``buildable(graph)`` (why the generator builds no schedule of a tiling,
or None: asked before the search solves it) and ``kernel_key(program, hw)`` (a string naming the kernel the program
becomes, or None: programs with one key get one verdict, so the search compiles that kernel once; ``kernel_key``),
and ``predict(program, hw)`` (a refusal named before the compiler runs, or None: the search takes it as the verdict
and compiles nothing; a predictor must not flag what the compiler builds, so it is attached where that was measured).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib.metadata import entry_points
from typing import Any

from .hw import Hardware

GROUP = "ptsolve.kernel_checkers"
RUNNERS = "ptsolve.kernel_runners"  # name: arch -> callable(programs, hw) -> kernel times (µs) on this machine
STATUSES = ("ok", "rejected", "unsupported", "not compile-checked")


@dataclass(frozen=True)
class KernelCheck:
    """``status``: ok (compiled as scheduled), rejected (the compiler spills or serialises: ``reason`` says what),
    unsupported (no code generator builds this tiling or order), not compile-checked (no compiler here, or the time
    limit ran out first). Registers are per thread as the compiler reports them; ``spill_bytes`` stores + loads;
    ``seconds`` of compilation. ``scope``: what an unsupported verdict is about: "schedule" (another tiling or order
    may build) or "operator" (no schedule of these operator parameters builds, e.g. a head_dim the generator lacks:
    the search stops asking). ``target``: the architecture compiled for (its words: wgmma on sm_90a, MFMA on
    gfx942)."""

    status: str
    reason: str = ""
    kernel: str = ""
    registers: int | None = None
    spill_bytes: int | None = None
    serialized: bool | None = None
    seconds: float = 0.0
    scope: str = "schedule"
    target: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def refused(self) -> bool:
        """The compiler (or the generator) will not build this schedule as scheduled."""
        return self.status in ("rejected", "unsupported")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


Checker = Callable[[Any, Hardware], KernelCheck]


def _plugin(group: str, hw: Hardware) -> Any:
    for ep in sorted(entry_points(group=group), key=lambda e: e.name):
        if ep.name == hw.arch:
            return ep.load()
    return None


def kernel_key(chk: Any, hw: Hardware) -> Callable[[Any], str | None] | None:
    """``chk``'s ``kernel_key`` bound to ``hw`` (program -> key or None), or None where the checker has none."""
    key = getattr(chk, "kernel_key", None)
    return None if key is None else (lambda program: key(program, hw))


def checker(hw: Hardware) -> Checker | None:
    """The registered checker for ``hw.arch``, or None."""
    return _plugin(GROUP, hw)


def runner(hw: Hardware) -> Callable[[Any, Hardware], Any] | None:
    """The registered runner that times kernels of ``hw.arch`` on this machine (ptsolve.tune), or None."""
    return _plugin(RUNNERS, hw)
