"""Ground truth for tiny graphs: exact enumeration of the schedules of the exact model.

The model is ptsolve.policies.cpsat's, stated directly on start times. Like every solver it works in
the Problem's grains (``P.grain`` cycles each, see ptsolve.policies.model); the returned program and the
reported objective and bound are in cycles. For every initiation interval ii from ``P.ii_lb`` up to
``P.ii_ub`` (or ``ii_max``) a schedule must meet:

- precedence (capacity edges included): s_v + dist·ii >= s_u + delay;
- loop reservations never overlap modulo ii (a loop reservation is at most ii long);
- prologue reservations end before every loop reservation on their resource starts (iteration 0),
  epilogue reservations start after every loop and every prologue reservation on it has ended (in the
  frame of the last iteration, the program's frame for epilogue tasks); pre/pre and post/post never overlap;
- every start lies in [0, P.horizon].

pre / last = the latest end of a prologue / of any other task (P.ends), minimising P.latency, the busiest slot's
Σ CTAs · max(pre, (trip-1)·ii + last) (ptsolve.program.cta_time; grains);
the reported objective is P.objective, P.total(latency).
Unlike CP-SAT and the MILP, no symmetry breaking is added: the enumeration checks those cuts too.

Two enumerations (see ``solve``): ``residues`` (default) branches on the loop tasks' slots modulo ii and
the order of shared once-reservations, then takes the least start times, which are optimal for those
choices; ``grid`` branches on every start of every task in topological order. Both prune only with
valid bounds (relaxed least starts, or the longest delay path to a sink, against the best objective so
far), so both are exact; the tests check them against each other. Refuses (SolverError) graphs of more
than ``MAX_TASKS`` tasks or horizons beyond ``MAX_HORIZON`` grains: it is for tests.
"""
from __future__ import annotations

import time
from itertools import product
from typing import Any

from ..errors import PtsolveError, SolverError
from ..program import SProgram
from . import greedy
from .model import Problem

MAX_TASKS = 8
MAX_HORIZON = 512      # grains; the tiny test hardware keeps horizons well below this
MAX_NODES = 2_000_000  # partial schedules visited before giving up (deterministic work limit)


def violations(P: Problem, ii: int, start: dict[str, int], symmetry: bool = False) -> list[str]:
    """Every constraint of the exact model that (ii, start), in grains, breaks; empty when feasible.

    Shared by the MILP (to re-check its rounded solution) and the tests. ``symmetry`` adds CP-SAT's
    symmetry cuts (s[x@g] <= s[x@g+1]), which only restrict the search space."""
    from .cpsat import _symmetry_task

    out: list[str] = []
    if not P.ii_lb <= ii:
        out.append(f"ii={ii} below the lower bound {P.ii_lb}")
    for t in P.tasks:
        if not 0 <= start[t] <= P.horizon:
            out.append(f"{t} starts at {start[t]}, outside [0, {P.horizon}]")
    for u, v, d, lat in P.prec:
        if start[v] + d * ii < start[u] + lat:
            out.append(f"precedence {u}->{v} (dist {d}, delay {lat}) broken at ii={ii}")
    for res, uses in P.res.items():
        for i, (t, o, n) in enumerate(uses):
            if P.phase[t] == "loop" and n > ii:
                out.append(f"{t} holds {res} {n} grains > ii={ii}")
            for u, ou, nu in uses[i + 1:]:
                if _clash(P.phase[t], start[t] + o, n, P.phase[u], start[u] + ou, nu, ii):
                    out.append(f"{t} and {u} collide on {res}")
    if symmetry:
        for a, b in _symmetry_task(P):
            if start[a] > start[b]:
                out.append(f"symmetry: {a} after {b}")
    return out


def latency_of(P: Problem, ii: int, start: dict[str, int]) -> int:
    """What the policies minimise for a schedule, grains (P.latency of P.ends)."""
    return P.latency(ii, *P.ends(start))


def objective_of(P: Problem, ii: int, start: dict[str, int]) -> int:
    """The kernel's time of a schedule, grains: P.objective."""
    return P.objective(ii, *P.ends(start))


def to_grains(P: Problem, prog: SProgram) -> tuple[int, dict[str, int]] | None:
    """(ii, start) of a program in the Problem's grains; None if some time is not a whole number of grains."""
    q = P.grain
    if prog.ii % q or any(x % q for x in prog.start.values()):
        return None
    return prog.ii // q, {t: prog.start[t] // q for t in P.tasks}


def _clash(pa: str, xa: int, na: int, pb: str, xb: int, nb: int, ii: int) -> bool:
    """Do reservations [xa, xa+na) of a ``pa`` task and [xb, xb+nb) of a ``pb`` task break the model?"""
    if pa == pb == "loop":
        # residues modulo ii: [ra, ra+na) and [rb, rb+nb) must not meet, nor with one shifted by ii
        ra, rb = xa % ii, xb % ii
        return any(ra < rb + k * ii + nb and rb + k * ii < ra + na for k in (-1, 0, 1))
    if pa == pb:
        return xa < xb + nb and xb < xa + na
    if pa == "loop":
        pa, xa, na, pb, xb, nb = pb, xb, nb, pa, xa, na
    # now ``pa`` is pre or post and ``pb`` is later/earlier
    if pa == "pre" and pb == "loop":
        return xa + na > xb
    if pa == "post":
        return xa < xb + nb  # epilogue after the loop's (or prologue's) reservation
    return xb < xa + na      # pa == pre, pb == post: the post one starts after the pre one ends


def solve(P: Problem, time_limit: float | None = None, hint: SProgram | None = None, ii_max: int | None = None,
          method: str = "residues", max_nodes: int = MAX_NODES, **_: Any) -> tuple[SProgram | None, dict[str, Any]]:
    """Optimal program of a tiny ``P`` by enumeration. Returns (program or None, stats) like cpsat.solve:
    status OPTIMAL or INFEASIBLE (exhaustive never stops early with an answer: over ``max_nodes`` or
    ``time_limit`` it raises SolverError), objective and bound (cycles), solve_s, nodes. A valid ``hint``
    or greedy's program only seeds the incumbent; an optimum is returned, the seed itself if none is better.

    method ``residues`` (default) enumerates, per ii, every slot r_t in [0, ii) of the loop tasks (modulo
    no-overlap checked as they are placed) and every order of the prologue / epilogue reservations that
    share a resource; what is left is a system of lower bounds (s_v >= s_u + w, s_t ≡ r_t mod ii) whose
    least solution, found by fixed-point iteration, minimises every start at once and so the span: it is
    the best schedule with those slots and orders. Method ``grid`` tries every start of every task in
    [earliest, horizon] (plain branch and bound; slow when an ii admits no schedule)."""
    if method not in ("residues", "grid"):
        raise SolverError(f"exhaustive method {method!r} is not 'residues' or 'grid'")
    n = len(P.tasks)
    if n > MAX_TASKS:
        raise SolverError(f"exhaustive enumerates every schedule and refuses {n} tasks (at most {MAX_TASKS}); "
                          "use solver 'cpsat' or 'milp'")
    if P.horizon > MAX_HORIZON:
        raise SolverError(f"exhaustive refuses a horizon of {P.horizon} grains (at most {MAX_HORIZON}): every "
                          "start in it is tried; use a tiny hardware table or solver 'cpsat'")
    for res, uses in P.res.items():
        for t, o, _n in uses:
            if o and P.phase[t] == "loop":
                raise SolverError(f"exhaustive mirrors cpsat, which assumes reservations start with their task "
                                  f"({t} on {res})")
    t0 = time.perf_counter()
    ii_hi = max(P.ii_lb, min(P.ii_ub, ii_max or P.ii_ub))
    end = {t: P.end(t) for t in P.tasks}
    best: list[Any] = [None, None, None]  # objective (grains), ii, start
    # An incumbent only prunes (the optimum is still proven by enumeration): start from the hint and
    # greedy's program when they are solutions of the model.
    seeds = [hint] if hint is not None else []
    try:
        seeds.append(greedy.solve(P)[0])
    except PtsolveError:
        pass
    for p in seeds:
        h = to_grains(P, p)
        if h is not None and h[0] <= ii_hi and not violations(P, *h):
            if best[0] is None or latency_of(P, *h) < best[0]:
                best = [latency_of(P, *h), h[0], h[1]]
    # every schedule ends its prologue and its iteration no earlier than their longest task alone
    min_pre = max((end[t] for t in P.tasks if P.phase[t] == "pre"), default=0)
    min_last = max(end[t] for t in P.tasks if P.phase[t] != "pre")
    counter = [0]

    def tick() -> None:
        counter[0] += 1
        if counter[0] > max_nodes or (time_limit is not None and counter[0] % 4096 == 0
                                      and time.perf_counter() - t0 > time_limit):
            raise SolverError(f"exhaustive gave up on {P.graph.name} after {counter[0] - 1} nodes: the instance "
                              "is too large for enumeration; use solver 'cpsat'")

    for ii in range(P.ii_lb, ii_hi + 1):
        if best[0] is not None and P.latency(ii, min_pre, min_last) >= best[0]:
            break  # a larger ii only costs more (the latency is nondecreasing in ii, pre and last)
        if any(P.phase[t] == "loop" and n_ > ii for t in P.tasks for _, _, n_ in P.tm[t].uses):
            continue  # a loop reservation longer than ii collides with itself
        if method == "grid":
            _grid(P, ii, end, best, tick)
        else:
            _residues(P, ii, end, best, tick)

    stats: dict[str, Any] = {"solve_s": time.perf_counter() - t0, "nodes": counter[0], "method": method}
    if best[0] is None:
        return None, stats | {"status": "INFEASIBLE", "bound": None}
    ii, start = best[1], best[2]
    bad = violations(P, ii, start)
    if bad:  # pragma: no cover - would be a bug in this module
        raise SolverError(f"exhaustive produced an invalid schedule: {bad}")
    prog = P.program(ii, start, "exhaustive")
    obj = P.total(best[0]) * P.grain
    return prog, stats | {"status": "OPTIMAL", "objective": obj, "bound": obj}


def _arcs(P: Problem, ii: int) -> list[tuple[str, str, int]]:
    """Every constraint of the model except modulo no-overlap and the order of same-phase once-reservations, as
    s_v >= s_u + w: (u, v, w)."""
    arcs = [(u, v, lat - d * ii) for u, v, d, lat in P.prec]
    for uses in P.res.values():
        for t, o, n in uses:
            for u, ou, nu in uses:
                if P.phase[t] == "pre" and P.phase[u] == "loop":
                    arcs.append((t, u, o + n - ou))    # prologue ends before the loop's first use
                elif P.phase[t] == "post" and P.phase[u] in ("loop", "pre"):
                    arcs.append((u, t, ou + nu - o))   # epilogue starts after the loop's / prologue's last
    return arcs


def _least(P: Problem, ii: int, arcs: list[tuple[str, str, int]], slot: dict[str, int]) -> dict[str, int] | None:
    """Least starts >= 0 meeting every arc, loop task t (if in ``slot``) at a start ≡ slot[t] (mod ii);
    None if it exceeds the horizon (then no solution exists: every solution is at least the least one)."""
    S = {t: slot.get(t, 0) for t in P.tasks}
    while True:
        changed = False
        for u, v, w in arcs:
            need = S[u] + w
            if S[v] < need:
                if v in slot:
                    need += (slot[v] - need) % ii  # round up to v's slot
                if need > P.horizon:
                    return None
                S[v], changed = need, True
        if not changed:
            return S


def _residues(P: Problem, ii: int, end: dict[str, int], best: list[Any], tick: Any) -> None:
    """Every slot assignment of the loop tasks and every order of shared once-reservations at ``ii``."""
    loop = [t for t in P.graph.topo_order() if P.phase[t] == "loop"]
    pairs = []  # same-phase once-reservations on one resource: either may go first
    for uses in P.res.values():
        once = [(t, o, n) for t, o, n in uses if P.phase[t] != "loop"]
        for a, (t, o, n) in enumerate(once):
            for u, ou, nu in once[a + 1:]:
                if P.phase[t] == P.phase[u]:
                    # either order as an arc s_v >= s_u + w: t's reservation ends before u's starts, or the mirror
                    pairs.append(((t, u, o + n - ou), (u, t, ou + nu - o)))
    base = _arcs(P, ii)
    slot: dict[str, int] = {}
    placed: dict[str, list[tuple[str, int, int]]] = {}

    def leaf() -> None:
        for pick in product((0, 1), repeat=len(pairs)):
            tick()
            S = _least(P, ii, base + [pr[k] for pr, k in zip(pairs, pick)], slot)
            if S is None:
                continue
            obj = latency_of(P, ii, S)
            if best[0] is None or obj < best[0]:
                best[0], best[1], best[2] = obj, ii, S

    def dfs(i: int) -> None:
        if i == len(loop):
            leaf()
            return
        if best[0] is not None:
            # relaxation: the least starts with only the slots placed so far bound every completion from below
            S = _least(P, ii, base, slot)
            if S is None or latency_of(P, ii, S) >= best[0]:
                return
        t = loop[i]
        for r in range(ii):
            tick()
            if any(_clash("loop", r + o, m, "loop", xu, nu, ii)
                   for res, o, m in P.tm[t].uses for _, xu, nu in placed.get(res, ())):
                continue
            slot[t] = r
            for res, o, m in P.tm[t].uses:
                placed.setdefault(res, []).append((t, r + o, m))
            dfs(i + 1)
            for res, _, _ in P.tm[t].uses:
                placed[res].pop()
            del slot[t]

    dfs(0)


def _grid(P: Problem, ii: int, end: dict[str, int], best: list[Any], tick: Any) -> None:
    """Every start of every task in [earliest, horizon], in topological order, at ``ii``."""
    tail = _tails(P, ii, end)
    if tail is None:
        return  # a loop-carried cycle needs more than dist·ii: no schedule at this ii
    order = P.graph.topo_order()
    pos = {t: i for i, t in enumerate(order)}
    # arcs touching task t whose other end comes earlier in the order: checked when t is placed
    before_in: dict[str, list[tuple[str, int, int]]] = {t: [] for t in order}   # (u, dist, delay): u -> t
    before_out: dict[str, list[tuple[str, int, int]]] = {t: [] for t in order}  # (v, dist, delay): t -> v
    for u, v, d, lat in P.prec:
        if u == v or pos[u] < pos[v]:
            before_in[v].append((u, d, lat))
        else:
            before_out[u].append((v, d, lat))
    S: dict[str, int] = {}
    placed: dict[str, list[tuple[str, int, int]]] = {}

    def dfs(i: int, pre: int, last: int) -> None:
        if i == len(order):
            obj = P.latency(ii, pre, last)
            if best[0] is None or obj < best[0]:
                best[0], best[1], best[2] = obj, ii, dict(S)
            return
        t = order[i]
        if any(d * ii < lat for u, d, lat in before_in[t] if u == t):
            return
        lo = max([0] + [S[u] + lat - d * ii for u, d, lat in before_in[t] if u != t])
        hi = min([P.horizon] + [S[v] + d * ii - lat for v, d, lat in before_out[t]])
        for s in range(lo, hi + 1):
            pre_t = max(pre, s + end[t]) if P.phase[t] == "pre" else pre
            if best[0] is not None and P.latency(ii, pre_t, max(last, s + tail[t])) >= best[0]:
                return  # every later start is at least as bad
            tick()
            if any(_clash(P.phase[t], s + o, m, P.phase[u], xu, nu, ii)
                   for r, o, m in P.tm[t].uses for u, xu, nu in placed.get(r, ())):
                continue
            S[t] = s
            for r, o, m in P.tm[t].uses:
                placed.setdefault(r, []).append((t, s + o, m))
            dfs(i + 1, pre_t, max(last, s + end[t]) if P.phase[t] != "pre" else last)
            for r, _, _ in P.tm[t].uses:
                placed[r].pop()
            del S[t]

    dfs(0, 0, 0)


def _tails(P: Problem, ii: int, end: dict[str, int]) -> dict[str, int] | None:
    """For each task t, a lower bound on last - s_t (P.ends): the longest delay path from t (weights delay -
    dist·ii) to some loop or epilogue task v, plus v's end (a large negative number when there is none). None
    if a cycle has positive weight (ii below the recurrence bound)."""
    none = -(1 << 40)
    tail = {t: end[t] if P.phase[t] != "pre" else none for t in P.tasks}
    for _ in range(len(tail) + 1):
        changed = False
        for u, v, d, lat in P.prec:
            w = lat - d * ii + tail[v]
            if w > tail[u]:
                tail[u] = w
                changed = True
        if not changed:
            return tail
    return None
