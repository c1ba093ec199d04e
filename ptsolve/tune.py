"""Measured selection: the model's K best distinct schedules, timed on the GPU, the fastest kept.

``candidates`` walks an operator's tilings in order of their lower bound, solves each (ptsolve.optimize on that
tiling's graph, so solves are cached), drops those whose kernel the compiler rejects (ptsolve.kernelcheck) and
stops once K compile-clean schedules are found and no remaining tiling's bound can beat the K-th: the K best
distinct schedules (one per tiling). ``tune`` times them with a ``runner`` (a code generator's: codegen.tune.runner
compiles and times them in one process on this machine's GPU, or one worker per GPU) and returns the measured best
as a Result whose ``measured_us`` is set; it is cached like any Result. Without a GPU, ``candidates`` and
``--prepare`` write the candidates for a GPU machine to time (codegen.tune).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .errors import InfeasibleError, PtsolveError
from .hw import Hardware, load
from .kernelcheck import KernelCheck
from .kernelcheck import runner as find_runner
from .ops.base import Operator
from .policies.model import build, fits
from .result import Result

Runner = Callable[[Sequence[Any], Hardware], Sequence[float]]


@dataclass(frozen=True)
class Candidate:
    """One schedule the model ranks ``rank``-th (0 = its first choice), with its compile check."""

    rank: int
    result: Result
    check: KernelCheck

    @property
    def tiling(self) -> dict[str, int]:
        return dict(self.result.tiling)


def candidates(op: Operator, hw: str | Hardware, k: int = 5, solver: str = "cpsat", time_limit: float = 30.0,
               check: bool = True, progress: Callable[[str], None] | None = None) -> tuple[list[Candidate],
                                                                                         list[tuple[dict, str]]]:
    """The ``k`` best distinct compile-clean schedules of ``op`` (one per tiling, best predicted first) and the
    tilings the compiler rejected on the way, with why. ``check`` False (or no checker for ``hw.arch``) keeps
    every schedule, marked "not compile-checked"."""
    from .search import lower_bound

    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise PtsolveError(f"top_k must be a positive integer, got {k!r}")
    hw = load(hw)
    say = progress or (lambda s: None)
    bounded = []
    for t in op.tilings():
        g = op.graph(t)
        if fits(g, hw) is None:
            bounded.append((lower_bound(build(g, hw)), sorted(t.items()), g))
    if not bounded:
        raise InfeasibleError(f"no tiling of {op.describe()} fits {hw.name}")
    bounded.sort(key=lambda x: (x[0], x[1]))
    from .optimize import optimize
    found: list[Result] = []
    checks: list[KernelCheck] = []
    rejected: list[tuple[dict, str]] = []
    for lb, _, g in bounded:
        if len(found) >= k and lb >= sorted(r.objective for r in found)[k - 1]:
            break
        r = optimize(g, hw, solver=solver, time_limit=time_limit, compile_check=check)
        c = KernelCheck(**r.kernel_check) if r.kernel_check else KernelCheck("not compile-checked", "check=False")
        if c.status in ("rejected", "unsupported"):
            rejected.append((dict(g.tiling), f"{c.status}: {c.reason}"))
            say(f"tiling {g.tiling}: {c.status} ({c.reason})")
            continue
        found.append(r)
        checks.append(c)
        say(f"tiling {g.tiling}: {r.predicted_us:.1f} µs predicted, {c.status}")
    order = sorted(range(len(found)), key=lambda i: (found[i].objective, sorted(found[i].tiling.items())))[:k]
    return [Candidate(n, found[i], checks[i]) for n, i in enumerate(order)], rejected


def tune(op: Operator, hw: str | Hardware = "h200", top_k: int = 5, runner: Runner | None = None,
         solver: str = "cpsat", time_limit: float = 30.0, progress: Callable[[str], None] | None = None) -> Result:
    """The measured best of the model's ``top_k`` best compile-clean schedules. ``runner(programs, hw)`` returns
    their kernel times in µs (default: the code generator's, codegen.tune.runner, which needs a GPU). The Result
    is the chosen schedule's, with ``measured_us`` and, in ``measured``, every candidate's predicted and measured
    time; the model's own first choice is candidate 0."""
    hw = load(hw)
    t0 = time.perf_counter()
    cands, rejected = candidates(op, hw, top_k, solver, time_limit, progress=progress)
    if runner is None:
        runner = find_runner(hw)
        if runner is None:
            raise PtsolveError(f"tune: no kernel runner for {hw.arch} is installed (codegen registers one); time the "
                               "candidates elsewhere: ptsolve tune --prepare, then python3 -m codegen.tune on the GPU")
    us = list(runner([c.result.program for c in cands], hw))
    if len(us) != len(cands):
        raise PtsolveError(f"tune: the runner returned {len(us)} times for {len(cands)} schedules")
    best = min(range(len(cands)), key=lambda i: (us[i], i))
    measured = tuple({"rank": c.rank, "tiling": c.tiling, "predicted_us": c.result.predicted_us, "measured_us": u,
                      "check": c.check.status} for c, u in zip(cands, us))
    r = cands[best].result
    return replace(r, measured_us=us[best], measured=measured, rejected=tuple((t, why) for t, why in rejected),
                   solve_s=time.perf_counter() - t0)
