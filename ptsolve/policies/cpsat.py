"""Exact policy: the modulo-scheduling model of ptsolve.policies.model on OR-Tools CP-SAT.

Loop task t starts at s_t = r_t + k_t·ii with 0 <= r_t < ii (its slot in the steady-state kernel)
and stage k_t. On each resource, every loop reservation appears twice, [r_t, r_t+n) and
[r_t-ii, r_t-ii+n), in one no-overlap constraint: two reservations collide modulo ii exactly when one
of these pairs overlaps, so wrap-around is exact with a single copy of the iteration. Prologue
reservations end before the loop's first use of their resource, epilogue ones start after its last
(in the frame of the last iteration). ``ii`` is a variable; the objective is the busiest SM slot's
cycles, max over slots of Σ CTAs · max(pre, (trip-1)·ii + last) (ptsolve.program.cta_time). Greedy's program
is the hint.
"""
from __future__ import annotations

import time
from typing import Any

from ..cpsolver import cp_solver
from ..errors import SolverError
from ..program import SProgram
from .model import Problem


def _symmetry_task(P: Problem) -> list[tuple[str, str]]:
    """Pairs (x@g, x@g+1) of one loop task of each consumer warpgroup: the groups are interchangeable,
    so some optimum has them in group order."""
    g = P.graph
    if g.groups < 2:
        return []
    order = [n for n in g.topo_order() if P.phase[n] == "loop" and n.endswith("@0")]
    if not order:
        return []
    base = order[0][:-2]
    names = [f"{base}@{k}" for k in range(g.groups)]
    if not all(n in P.phase for n in names):
        return []
    return list(zip(names, names[1:]))


class _M:
    """A built CP-SAT model and the variables the callers read."""

    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


def _timing_vars(m: Any, P: Problem, ii: Any, ii_hi: int) -> tuple[dict, dict, dict, dict]:
    """Start ``s`` of every task; for a loop task its slot ``r`` in the initiation interval, its stage ``k`` and
    ``w`` = r - ii (the slot seen from the next interval, so a reservation wrapping past ii is two intervals)."""
    H = P.horizon
    kmax = H // max(P.ii_lb, 1) + 1
    s, r, k, w = {}, {}, {}, {}
    for t in P.tasks:
        s[t] = m.new_int_var(0, H, f"s_{t}")
        if P.phase[t] == "loop":
            r[t] = m.new_int_var(0, ii_hi - 1, f"r_{t}")
            k[t] = m.new_int_var(0, kmax, f"k_{t}")
            m.add(r[t] <= ii - 1)
            w[t] = m.new_int_var(-ii_hi, 0, f"w_{t}")
            m.add(w[t] == r[t] - ii)
            # stage as one-hot literals: z_j => s = r + j·ii stays linear in the variable ii
            zs = [m.new_bool_var(f"z_{t}_{j}") for j in range(kmax + 1)]
            m.add_exactly_one(zs)
            for j, z in enumerate(zs):
                m.add(s[t] == r[t] + j * ii).only_enforce_if(z)
                m.add(k[t] == j).only_enforce_if(z)
    return s, r, k, w


def _resources(m: Any, P: Problem, s: dict, r: dict, w: dict, ii_hi: int, guard_cap: int) -> dict[str, Any]:
    """No two reservations of a unit at once: loop tasks modulo ii (each as the intervals at r and at r - ii),
    prologue and epilogue tasks once, before and after every loop reservation. Returns the tensor-core guards
    (``_model``'s ``guard_cap``)."""
    guards: dict[str, Any] = {}
    for res, uses in P.res.items():
        loop = [(t, o, n) for t, o, n in uses if P.phase[t] == "loop"]
        ivs = []
        for t, o, n in loop:
            if o:
                raise SolverError(f"cpsat model assumes reservations start with their task ({t} on {res})")
            ivs.append(m.new_fixed_size_interval_var(r[t], n, f"a_{t}_{res}"))
            ivs.append(m.new_fixed_size_interval_var(w[t], n, f"b_{t}_{res}"))
        for ph in ("pre", "post"):
            once = [(t, o, n) for t, o, n in uses if P.phase[t] == ph]
            ivs_once = [m.new_fixed_size_interval_var(s[t] + o, n, f"{ph}_{t}_{res}") for t, o, n in once]
            if len(ivs_once) > 1:
                m.add_no_overlap(ivs_once)
            for t, o, n in once:
                for u, ou, nu in loop:
                    if ph == "pre":
                        m.add(s[t] + o + n <= s[u] + ou)
                    else:
                        m.add(s[t] + o >= s[u] + ou + nu)
        for t, o, _n in uses:
            if P.phase[t] == "post":
                for u, ou, nu in uses:
                    if P.phase[u] == "pre":
                        m.add(s[t] + o >= s[u] + ou + nu)
        if guard_cap > 0:  # the stream that issues a tensor-core task stays idle ``guards[t]`` before it
            for t, _o, _n in loop:
                if P.graph.task[t].kind == "mma" and P.tm[t].stream == res:
                    guards[t] = gt = m.new_int_var(0, guard_cap, f"guard_{t}")
                    for x, c in ((r[t], "a"), (w[t], "b")):
                        g0 = m.new_int_var(-2 * ii_hi - guard_cap, ii_hi, f"g{c}_{t}")
                        m.add(g0 == x - gt)
                        ivs.append(m.new_interval_var(g0, gt, x, f"gi{c}_{t}"))
        if ivs:
            m.add_no_overlap(ivs)
    return guards


def _orders(m: Any, P: Problem, s: dict, r: dict, k: dict, pin: dict[str, list[tuple[str, int]]] | None,
            cycle: list[str] | None) -> None:
    """The pinned issue orders and stages, the cyclic order, or (with neither) warpgroup symmetry breaking."""
    for role, seq in sorted((pin or {}).items()):
        bad = [t for t, _ in seq if t not in r]
        if bad:
            raise SolverError(f"pin: {bad} of role {role!r} are not loop tasks of {P.graph.name}")
        for (a, _), (b, _) in zip(seq, seq[1:]):
            m.add(r[a] + 1 <= r[b])
        for t, st in seq[1:]:
            m.add(k[t] - k[seq[0][0]] == st - seq[0][1])
    if cycle:
        bad = [t for t in cycle if t not in r]
        if bad:
            raise SolverError(f"cycle: {bad} are not loop tasks of {P.graph.name}")
        # slots increase along the cycle with exactly one wrap (the last task before the first, or one pair)
        wraps = []
        for a, b in zip(cycle, cycle[1:] + cycle[:1]):
            x = m.new_bool_var(f"wrap_{a}_{b}")
            m.add(r[a] + 1 <= r[b]).only_enforce_if(~x)
            m.add(r[b] + 1 <= r[a]).only_enforce_if(x)
            wraps.append(x)
        m.add(sum(wraps) == 1)
    if not pin and not cycle:  # with an order pinned the warpgroups are no longer interchangeable
        for a, b in _symmetry_task(P):
            m.add(s[a] <= s[b])


def _objective(m: Any, P: Problem, s: dict, ii: Any, ii_hi: int) -> Any:
    """The slots' latency (the variable the model minimises)."""
    H = P.horizon
    # the CTA time of program.cta_time: x_n = max(pre, (n-1)·ii + last) per distinct trip count n (minimising
    # pushes each x_n down onto that max: it has only positive coefficients)
    pre = m.new_int_var(0, 2 * H, "pre")
    last = m.new_int_var(0, 2 * H, "last")
    for t in P.tasks:
        m.add((pre if P.phase[t] == "pre" else last) >= s[t] + P.end(t))
    x = {}
    for n in P.trips:
        x[n] = m.new_int_var(0, (n - 1) * ii_hi + 2 * H, f"x_{n}")
        m.add(x[n] >= pre)
        m.add(x[n] >= (n - 1) * ii + last)
    # minimise the slots' latency: the reported objective P.total(latency) is monotone in it, and among
    # schedules that tie at the floor this keeps the shortest
    big = max(sum(c * ((n - 1) * ii_hi + 2 * H) for n, c in h) for h in P.slots)
    obj = m.new_int_var(0, big, "obj")
    for h in P.slots:  # a persistent kernel's slot hides P.handover of each tile after its first (P.latency)
        m.add(obj >= sum(c * x[n] for n, c in h) - (sum(c for _, c in h) - 1) * P.handover)
    return obj


def _model(cp_model: Any, P: Problem, ii_hi: int, pin: dict[str, list[tuple[str, int]]] | None = None,
           cycle: list[str] | None = None, guard_cap: int = 0) -> _M:
    """The CP-SAT model of ``P`` (module doc) with ii <= ``ii_hi``; ``guard_cap`` > 0 adds, per loop tensor-core task
    t, the variable ``guards[t]`` (0..guard_cap grains): t's issuing stream holds no other task for that long before
    t (``polish``). Built in a fixed order (variables, precedences, resources, orders, objective): CP-SAT's search,
    and so a time-limited answer, depends on it."""
    m = cp_model.CpModel()
    ii = m.new_int_var(P.ii_lb, ii_hi, "ii")
    s, r, k, w = _timing_vars(m, P, ii, ii_hi)
    for u, v, d, lat in P.prec:
        m.add(s[v] + d * ii >= s[u] + lat)
    guards = _resources(m, P, s, r, w, ii_hi, guard_cap)
    _orders(m, P, s, r, k, pin, cycle)
    obj = _objective(m, P, s, ii, ii_hi)
    return _M(m=m, ii=ii, s=s, r=r, k=k, obj=obj, guards=guards)


def _hint(M: _M, P: Problem, prog: SProgram) -> None:
    """``prog``'s ii, starts, slots and stages as the model's hint."""
    q, hii = P.grain, prog.ii // P.grain
    M.m.add_hint(M.ii, hii)
    for t in P.tasks:
        M.m.add_hint(M.s[t], prog.start[t] // q)
        if t in M.r:
            M.m.add_hint(M.r[t], prog.start[t] // q % hii)
            M.m.add_hint(M.k[t], prog.start[t] // q // hii)


def solve(P: Problem, time_limit: float = 10.0, num_workers: int = 2, seed: int = 0,
          hint: SProgram | None = None, ii_max: int | None = None,
          pin: dict[str, list[tuple[str, int]]] | None = None,
          cycle: list[str] | None = None, det_time: float | None = None,
          cutoff: int | None = None) -> tuple[SProgram | None, dict[str, Any]]:
    """Solve ``P`` exactly (within ``time_limit`` seconds, or, given ``det_time``, within that much CP-SAT
    deterministic time and no wall-clock limit: reproducible, cp_solver). Returns (program or None, stats) where stats
    has status OPTIMAL / FEASIBLE / TIME_LIMIT / INFEASIBLE, objective and bound (cycles), solve_s; a solve the
    limit stopped before its proof is TIME_LIMIT, never OPTIMAL.

    ``pin``: role -> [(loop task, stage)], the issue order of that role's loop tasks within one initiation
    interval (slots strictly increasing, as ``SProgram.streams`` reads them back) and their stages relative to
    the first: the best schedule with a given order (a hand plan's, e.g. codegen.plan.fa3_order_plan) instead
    of the best of all orders. A cyclic rotation of an order is the same steady state: rotate it (the tasks
    moved to the end one stage earlier) to pin that one. ``cycle``: loop tasks whose slots follow this cyclic order
    (any rotation; e.g. the tensor cores' turn order), stages free. ``cutoff`` (kernel cycles): only schedules
    predicted strictly faster count; none is INFEASIBLE (a quick proof where another solve already did better)."""
    try:
        from ortools.sat.python import cp_model
    except ImportError as e:  # pragma: no cover - depends on the install
        raise SolverError("solver 'cpsat' needs OR-Tools: pip install ortools") from e
    t0 = time.perf_counter()
    ii_hi = max(P.ii_lb, min(P.ii_ub, ii_max or P.ii_ub))
    M = _model(cp_model, P, ii_hi, pin, cycle)
    m, ii, s, obj = M.m, M.ii, M.s, M.obj
    if cutoff is not None:  # total(latency) = max(floor, latency) + tail < cutoff, in grains
        most = -(-cutoff // P.grain) - 1 - P.tail
        if P.floor > most:
            return None, {"solve_s": time.perf_counter() - t0, "bound": None, "branches": 0, "status": "INFEASIBLE"}
        m.add(obj <= most)
    m.minimize(obj)
    if hint is not None:
        _hint(M, P, hint)
    sv = cp_solver(cp_model, num_workers, seed, time_limit=None if det_time is not None else time_limit,
                   det_time=det_time)
    st = sv.solve(m)
    name = sv.status_name(st)
    stats = {"solve_s": time.perf_counter() - t0, "bound": P.total(int(sv.best_objective_bound)) * P.grain
             if name in ("OPTIMAL", "FEASIBLE") else None, "branches": sv.num_branches}
    if name == "INFEASIBLE":
        return None, stats | {"status": "INFEASIBLE"}
    if name not in ("OPTIMAL", "FEASIBLE"):
        if name == "UNKNOWN":
            return None, stats | {"status": "TIME_LIMIT"}
        raise SolverError(f"CP-SAT returned {name} for {P.graph.name}: the model is malformed (a ptsolve bug)")
    iiv, start = int(sv.value(ii)), {t: int(sv.value(s[t])) for t in P.tasks}
    prog = P.program(iiv, start, "cpsat")
    # the objective of the returned schedule itself: CP-SAT's objective_value can lag its solution by a grain
    obj = P.objective(iiv, *P.ends(start)) * P.grain
    status = "OPTIMAL" if name == "OPTIMAL" else "TIME_LIMIT"
    return prog, stats | {"status": status, "objective": obj, "bound": min(stats["bound"], obj)}


POLISH_DET_S = 2.0  # CP-SAT deterministic time of one polish (its own unit, about seconds; reproducible)
# CP-SAT deterministic time a deterministic search (ptsolve.search, deterministic=True) spends per second of its
# time_limit, over all its tilings: each tiling gets an equal share (det_budget), so the whole search stays within
# time_limit deterministic seconds however many tilings pruning skips. The unit is CP-SAT's, "as close as possible to
# a second"; on the 2-core reference machine a second of it took 3-4 s of one core (small attention and decode models).
SEARCH_DET_PER_S = 1.0


def det_budget(time_limit: float, tilings: int) -> float:
    """CP-SAT deterministic time of each of a deterministic search's ``tilings`` solves under ``time_limit`` (s):
    time_limit · SEARCH_DET_PER_S / tilings. Fixed before any solve, so it does not depend on which tilings the
    incumbent prunes (which differs between a serial and a parallel search) nor on the order solves finish in."""
    return time_limit * SEARCH_DET_PER_S / max(1, tilings)


def polish(P: Problem, prog: SProgram, det_time: float = POLISH_DET_S) -> SProgram:
    """The schedule of ``prog``'s initiation interval and objective (``P``'s optimum) whose warp streams leave the
    longest idle time before each loop tensor-core issue: among the model's optima, the one least sensitive to a
    late result. The model is deterministic and indifferent among its optima; on the GPU a stream that issues work
    up to the instant its next wgmma is due (e.g. a rescale that waits for the previous wgmma right before the
    softmax) stretches the tensor cores' turn whenever a latency runs long. Solved with the objective and ii fixed,
    from ``prog`` as the hint, within ``det_time`` of CP-SAT's deterministic time; ``prog`` itself when nothing
    better is found. Every other constraint of the model holds, so the result is an optimum of ``P`` too."""
    from ortools.sat.python import cp_model

    q = P.grain
    iiv = prog.ii // q
    start = {t: prog.start[t] // q for t in P.tasks}
    lat = P.latency(iiv, *P.ends(start))  # the slots' latency, not max(floor, it): search's tie-break reads it too
    cap = max((n for t in P.tasks if P.graph.task[t].kind == "mma" and P.phase[t] == "loop"
               for res, _, n in P.tm[t].uses if res == "tc"), default=0)
    if cap == 0:
        return prog
    M = _model(cp_model, P, iiv, guard_cap=cap)
    M.m.add(M.ii == iiv)
    M.m.add(M.obj <= lat)
    _hint(M, P, prog)
    g = list(M.guards.values())
    low = M.m.new_int_var(0, cap, "guard_min")
    for x in g:
        M.m.add(low <= x)
    M.m.maximize(len(g) * low + sum(g))  # the shortest guard first, then all of them
    sv = cp_solver(cp_model, 1, det_time=det_time)
    if sv.solve(M.m) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return prog
    new = {t: int(sv.value(M.s[t])) for t in P.tasks}
    if P.latency(iiv, *P.ends(new)) > lat:
        return prog
    return P.program(iiv, new, prog.policy)


def tc_guards(P: Problem, prog: SProgram) -> dict[str, int]:
    """Per loop tensor-core task of ``prog``, grains its issuing stream is idle before it in the steady state (what
    ``polish`` maximises): the distance, modulo ii, from the end of the stream's previous reservation to its start."""
    q, ii = P.grain, prog.ii // P.grain
    r = {t: prog.start[t] // q % ii for t in P.tasks if P.phase[t] == "loop"}
    out = {}
    for t in sorted(r):
        if P.graph.task[t].kind != "mma":
            continue
        ends = [r[u] + o + n for u in r for res, o, n in P.tm[u].uses if res == P.tm[t].stream]
        out[t] = min((r[t] - e) % ii for e in ends)
    return out
