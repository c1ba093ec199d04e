"""Policy ``cpsat-orders``: the best schedule with one of the operator's hand-known issue orders (OpSpec.orders,
e.g. FlashAttention-3's), on CP-SAT, instead of the best of all orders.

An issue order is cyclic: the first warpgroup keeps the declared rotation, every rotation of the others' is tried
(a rotation moves the first tasks to the end one stage earlier; the same steady state). The answer is the best
over orders and rotations, with one copy of each register buffer (``one_copy``); it proves nothing about the orders
it did not try (search's lower bounds still can).
"""
from __future__ import annotations

import itertools
import time
from typing import Any

from ..errors import SolverError
from ..opspec import REGISTRY
from ..program import SProgram
from .model import Problem

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


def solve(P: Problem, time_limit: float = 10.0, num_workers: int = 2, seed: int = 0,
          det_time: float | None = None) -> tuple[SProgram | None, dict[str, Any]]:
    """The best pinned schedule of ``P`` (see the module doc); stats as cpsat's, status FEASIBLE (the other orders
    are not searched) or INFEASIBLE / TIME_LIMIT when no pin gave a schedule. ``det_time`` (CP-SAT deterministic
    time, instead of ``time_limit`` seconds): each (order, rotation) gets an equal share, a reproducible solve.
    The pins are solved one after another, each told to beat the best so far (a cutoff CP-SAT refutes fast where it
    cannot); the winner is then solved again without one, so the schedule is the one its own solve finds."""
    t0 = time.perf_counter()
    ps = pins(P)
    P = one_copy(P)
    det = None if det_time is None else det_time / len(ps)  # fixed: each pin's budget depends on nothing but P
    best: tuple[int, int, SProgram] | None = None
    limited = False
    for i, (pin, cyc) in enumerate(ps):
        left = time_limit - (time.perf_counter() - t0)
        if det_time is None and left <= 0:
            limited = True
            break
        # a wall-clock share passes on what the earlier pins left
        prog, st = _pin(P, pin, cyc, left / (len(ps) - i), num_workers, seed, det, best[0] if best else None)
        limited |= st["status"] == "TIME_LIMIT"
        if prog is not None and (best is None or st["objective"] < best[0]):
            best = (st["objective"], i, prog)
    if best is not None and best[1] > 0:  # solved under a cutoff, which may steer CP-SAT to another of its optima
        left = max(0.2, time_limit - (time.perf_counter() - t0))
        prog, st = _pin(P, *ps[best[1]], left, num_workers, seed, det)
        if prog is not None and st["objective"] <= best[0]:
            best = (st["objective"], best[1], prog)
    stats: dict[str, Any] = {"solve_s": time.perf_counter() - t0, "bound": None, "pins": len(ps)}
    if best is None:
        return None, stats | {"status": "TIME_LIMIT" if limited else "INFEASIBLE"}
    return best[2], stats | {"status": "FEASIBLE", "objective": best[0]}


def _pin(P: Problem, pin: dict[str, list[tuple[str, int]]], cyc: list[str], time_limit: float, num_workers: int,
         seed: int, det_time: float | None, cutoff: int | None = None) -> tuple[SProgram | None, dict[str, Any]]:
    from . import cpsat
    return cpsat.solve(P, time_limit=time_limit, num_workers=num_workers, seed=seed, pin=pin, cycle=cyc or None,
                       det_time=det_time, cutoff=cutoff)
