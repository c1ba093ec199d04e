"""Policy ``cpsat-orders``: the best schedule with one of the operator's hand-known issue orders (OpSpec.orders,
e.g. FlashAttention-3's), on CP-SAT, instead of the best of all orders.

An issue order is cyclic: the first warpgroup keeps the declared rotation, every rotation of the others' is tried
(a rotation moves the first tasks to the end one stage earlier; the same steady state). The answer is the best
over orders and rotations, with one copy of each register buffer (``one_copy``); it proves nothing about the orders
it did not try (search's lower bounds still can).
"""
from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..errors import SolverError
from ..opspec import REGISTRY
from ..program import SProgram
from .model import Problem, lower_bound

MAX_SOLVES = 64  # orders x rotations per tiling (FlashAttention, 3 warpgroups: 36)


def rotate(seq: list[tuple[str, int]], m: int) -> list[tuple[str, int]]:
    """The same cyclic issue order started at its ``m``-th task: the tasks moved to the end run one stage earlier."""
    return seq[m:] + [(t, st - 1) for t, st in seq[:m]]


def pins(P: Problem) -> list[tuple[dict[str, list[tuple[str, int]]], list[str]]]:
    """Every (order, rotation) of ``P``'s operator: (pinned warpgroup orders, cyclic tensor-core turn order);
    SolverError if it declares none."""
    spec = REGISTRY.get(P.graph.op)
    if spec is None or spec.orders is None:
        raise SolverError(f"solver 'cpsat-orders': operator {P.graph.op!r} declares no issue orders; use cpsat")
    out = []
    for _, order in sorted(spec.orders(P.graph.groups).items()):
        roles = sorted(r for r in order if r != "tc")
        for rot in itertools.product(*(range(len(order[r])) for r in roles[1:])):
            pin = {roles[0]: order[roles[0]]} | {r: rotate(order[r], m) for r, m in zip(roles[1:], rot)}
            out.append((pin, [t for t, _ in order.get("tc", [])]))
    if len(out) > MAX_SOLVES:
        raise SolverError(f"solver 'cpsat-orders': {len(out)} order rotations of {P.graph.name} exceed {MAX_SOLVES}")
    return out


def one_copy(P: Problem) -> Problem:
    """``P`` with one copy of every loop register buffer: a hand order's kernel keeps one and waits before reusing
    it (FlashAttention-3 packs P into the same registers each iteration), where two would cost registers ptxas
    spills. The CTA slots and floor stay ``P``'s (the placement it was built with)."""
    from dataclasses import replace

    from .model import build
    one = {b: 1 for b in P.copies}
    if one == P.copies:
        return P
    Q = build(P.graph, P.hw, copies=one, registers=False)  # P's tiling was admitted (by the estimate or ptxas)
    return replace(Q, slots=P.slots, floor=P.floor, tail=P.tail)


# The ladder of cutoffs (``_ladder``): rungs LADDER_STEP of the pins' lower bound apart up to LADDER_LINEAR steps
# above it, then twice as far each, the last one open. A pin or relaxation whose optimum lies above a rung is refuted
# by CP-SAT's presolve in a few ms, where solving it without a cutoff proves its (poor) optimum in up to seconds
# (FlashAttention-3's unrotated order on BM128/BN128: 1-1.5 s on 2 cores, against 0.06 s refuted); a solve under a
# cutoff far above its optimum costs nearly as much, hence the small steps (a refuted rung costs one relaxation).
LADDER_STEP = 0.01
LADDER_LINEAR = 16
LADDER_RUNGS = 18  # bounded rungs: 1 %, 2 %, ... 16 %, 32 %, 64 % above the bound, then the open one


def rung(bound: int, j: int) -> int | None:
    """The ``j``-th cutoff of the ladder above ``bound`` (kernel cycles), j = 1, 2, ...; None: the open rung."""
    if j > LADDER_RUNGS:
        return None
    return int(bound * (1 + LADDER_STEP * min(j, LADDER_LINEAR) * 2 ** max(0, j - LADDER_LINEAR))) + 1


class _Unproven(Exception):
    """A solve of the ladder stopped before its proof: the pins are solved in turn instead (``_in_turn``)."""


class Stopped(Exception):
    """A cpsat-orders solve was cancelled (``stopping``): its caller no longer needs the answer. Not a PtsolveError,
    so that nothing takes it for a verdict on the problem (optimize's declared-order memo keeps no answer for it)."""


_STOP = threading.local()


@contextmanager
def stopping(stop: threading.Event) -> Iterator[None]:
    """Within it, this thread's cpsat-orders solves raise Stopped before their next CP-SAT call once ``stop`` is set
    (a CP-SAT call itself runs to its end: a pinned one takes 0.01-0.5 s)."""
    old = getattr(_STOP, "event", None)
    _STOP.event = stop
    try:
        yield
    finally:
        _STOP.event = old


@dataclass
class _Pins:
    """One cpsat-orders solve: the one-copy problem ``Q``, its pins, the CP-SAT settings and the clock (s)."""

    Q: Problem
    ps: list[tuple[dict[str, list[tuple[str, int]]], list[str]]]
    workers: int
    seed: int
    det: float | None  # CP-SAT deterministic time of each solve (None: wall clock)
    t0: float
    time_limit: float

    def left(self) -> float:
        return self.time_limit - (time.perf_counter() - self.t0)

    def solve(self, pin: dict[str, list[tuple[str, int]]], cyc: list[str], time_limit: float,
              cutoff: int | None) -> tuple[SProgram | None, dict[str, Any]]:
        from . import cpsat
        stop = getattr(_STOP, "event", None)
        if stop is not None and stop.is_set():
            raise Stopped
        return cpsat.solve(self.Q, time_limit=max(time_limit, 0.01), num_workers=self.workers, seed=self.seed,
                           pin=pin, cycle=cyc or None, det_time=self.det, cutoff=cutoff)

    def blocks(self) -> list[tuple[dict[str, list[tuple[str, int]]], list[str], list[int]]]:
        """Consecutive pins that share their first role's sequence and their turn order (the rotations of one
        declared order, ``pins``), as (that role pinned alone, the turn order, the pins' indices): a relaxation of
        every pin of the block, whose optimum none of them beats."""
        out: list[tuple[dict[str, list[tuple[str, int]]], list[str], list[int]]] = []
        for i, (pin, cyc) in enumerate(self.ps):
            r0 = min(pin)
            if out and out[-1][0] == {r0: pin[r0]} and out[-1][1] == cyc:
                out[-1][2].append(i)
            else:
                out.append(({r0: pin[r0]}, cyc, [i]))
        return out


def _least(*xs: int | None) -> int | None:
    return min((x for x in xs if x is not None), default=None)


def solve(P: Problem, time_limit: float = 10.0, num_workers: int = 2, seed: int = 0,
          det_time: float | None = None, cutoff: int | None = None,
          bound: int | None = None) -> tuple[SProgram | None, dict[str, Any]]:
    """The best pinned schedule of ``P`` (see the module doc); stats as cpsat's, status FEASIBLE (the other orders
    are not searched) or INFEASIBLE / TIME_LIMIT when no pin gave a schedule. ``det_time`` (CP-SAT deterministic
    time, instead of ``time_limit`` seconds): each (order, rotation) gets an equal share, a reproducible solve.
    ``cutoff`` (kernel cycles): only schedules strictly faster count; none is INFEASIBLE with ``refuted`` True in the
    stats (what search asks where the declared order matters only if it beats a rival). ``bound`` (kernel cycles):
    where the ladder of cutoffs starts, best a lower bound close to the pins' optimum (e.g. the tiling's proven free
    optimum; P's own lower bound when None); a start above a pin only costs time. Neither changes the schedule
    returned below the cutoff.

    The answer is the first pin (in ``pins``' order) of least objective, solved again on its own without a cutoff,
    so the schedule is the one its own solve finds whatever the path to it. The path: a ladder of cutoffs rising
    from ``bound`` (``_ladder``), each rung first asking each order's relaxation (its first role and turn order
    pinned, the other roles free) whether any of its rotations can be under the rung, then its pins, each under the
    best so far; where a solve of the ladder stops unproven, the pins one after another, each under the best so
    far (``_in_turn``), as before the ladder."""
    t0 = time.perf_counter()
    ps = pins(P)
    Q = one_copy(P)
    det = None if det_time is None else det_time / len(ps)  # fixed: each pin's budget depends on nothing but P
    run = _Pins(Q, ps, num_workers, seed, det, t0, time_limit)
    limited = False
    try:
        best = _ladder(run, cutoff, lower_bound(Q) if bound is None else bound)
    except _Unproven:
        best, limited = _in_turn(run, cutoff)
    if best is not None and best[3]:  # solved under a cutoff, which may steer CP-SAT to another of its optima
        prog, st = run.solve(*ps[best[1]], max(0.2, run.left()), None)
        if prog is not None and st["objective"] <= best[0]:
            best = (st["objective"], best[1], prog, False)
    stats: dict[str, Any] = {"solve_s": time.perf_counter() - t0, "bound": None, "pins": len(ps)}
    if best is None:
        return None, stats | {"status": "TIME_LIMIT" if limited else "INFEASIBLE",
                              "refuted": cutoff is not None and not limited}
    return best[2], stats | {"status": "FEASIBLE", "objective": best[0]}


_Best = tuple[int, int, SProgram, bool]  # (objective, pin index, schedule, found under a cutoff)


def _in_turn(run: _Pins, cutoff: int | None) -> tuple[_Best | None, bool]:
    """(the first best pin, whether the time limit stopped a solve): the pins one after another, each under the best
    so far (and ``cutoff``) as a cutoff; a wall-clock share passes on what the earlier pins left."""
    best: _Best | None = None
    limited = False
    n = len(run.ps)
    for i, (pin, cyc) in enumerate(run.ps):
        left = run.left()
        if run.det is None and left <= 0:
            return best, True
        cut = _least(cutoff, best[0] if best else None)
        prog, st = run.solve(pin, cyc, left / (n - i), cut)
        limited |= st["status"] == "TIME_LIMIT"
        if prog is not None and (best is None or st["objective"] < best[0]):
            best = (st["objective"], i, prog, cut is not None)
    return best, limited


def _ladder(run: _Pins, cutoff: int | None, bound: int) -> _Best | None:
    """The first best pin, every pin solved under a cutoff: the rungs above ``bound`` (``rung``, capped at
    ``cutoff``) one after another until one holds a pin; None when no pin beats ``cutoff``. _Unproven where a solve
    stops before its proof (a time limit or deterministic budget): the pins below a rung are then not known."""
    relaxed: dict[int, int] = {}  # per block: its relaxation's optimum, once a rung above it has found it
    for j in range(1, LADDER_RUNGS + 2):
        top = _least(rung(bound, j), cutoff)
        best = _rung(run, top, relaxed)
        if best is not None or (top is not None and top == cutoff):
            return best
    return None


def _rung(run: _Pins, top: int | None, relaxed: dict[int, int]) -> _Best | None:
    """The first best pin strictly under ``top`` cycles (None: any), or None: each block's relaxation under the
    cutoff first (INFEASIBLE: none of its pins is under it; its optimum, once found, is kept in ``relaxed``), then its
    pins under the best so far; a block's pins stop once one meets the relaxed optimum (the later ones cannot beat
    it)."""
    share = run.time_limit / len(run.ps)  # a solve of the ladder that needs more than a pin's share is unproven
    best: _Best | None = None
    for b, (first, cyc, idx) in enumerate(run.blocks()):
        cut = _least(top, best[0] if best else None)
        if b not in relaxed and cut is not None:  # an open relaxation would prove its optimum from scratch: slow
            prog, st = run.solve(first, cyc, min(share, run.left()), cut)
            if st["status"] == "TIME_LIMIT":
                raise _Unproven
            if prog is not None:
                relaxed[b] = st["objective"]
        if cut is not None and relaxed.get(b, cut) >= cut:
            continue
        for i in idx:
            cut = _least(top, best[0] if best else None)
            prog, st = run.solve(*run.ps[i], min(share, run.left()), cut)
            if st["status"] == "TIME_LIMIT":
                raise _Unproven
            if prog is not None:  # under the cutoff, so better than the best so far
                best = (st["objective"], i, prog, cut is not None)
            if best is not None and best[0] == relaxed.get(b):
                break
    return best
