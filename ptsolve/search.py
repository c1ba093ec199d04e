"""Joint search over tilings: bound every tiling, schedule the promising ones, keep the best.

Every tiling that fits the EU gets a lower bound (the resource / recurrence bound on ii and the
critical path on the span, put through the placement) and a greedy schedule (an upper bound). Exact
policies then solve tilings in order of their bound until the bound reaches the best schedule found:
the rest cannot win. Solves run in a process pool (or on Ray, or serially). ``decoupled=True`` is
the paper's ablation: pick the tiling by its roofline bound alone, then schedule only that one.
"""
from __future__ import annotations

import json
import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, replace
from typing import Any

from . import arguments
from .cost import check_grain
from .errors import InfeasibleError, PtsolveError, SolverError
from .hw import Hardware, load
from .ir import STaskGraph
from .kernelcheck import KernelCheck
from .opspec import Operator
from .policies import SOLVERS
from .policies import greedy as greedy_mod
from .policies.model import Problem, build, ends_lower_bound, fits, lower_bound, tiling_tie
from .pools import terminate
from .program import SProgram
from .provenance import stamp
from .report import features
from .result import Result
from .simulate import claimed, replay
from .validate import check_valid, register_excess, register_refusal

EXECUTORS = arguments.EXECUTORS


def latency_lower_bound(P: Problem) -> int:
    """No schedule of this tiling has a busiest SM slot under this many cycles (ptsolve.simulate.claimed)."""
    return P.latency(P.ii_lb, *ends_lower_bound(P)) * P.grain


def replays(p: SProgram, hw: Hardware) -> bool:
    """Does the replay of the shortest and the longest CTA of ``p`` (simulate.replay) run with no instance late
    and end exactly when program.cta_time says? What an exact solver's answer must pass before it is reported."""
    for n in sorted({min(p.graph.row), max(p.graph.row)}):
        ev, late = replay(p, hw, n)
        if late or max(e.end for e in ev) != p.cta_cycles(n, hw):
            return False
    return True


def solve_one(P: Problem, solver: str, time_limit: float, hint: SProgram | None, ii_max: int | None,
              workers: int = 1, det_time: float | None = None,
              start: int | None = None) -> tuple[SProgram | None, dict[str, Any]]:
    """Run one policy on one tiling's problem; ``det_time`` (CP-SAT deterministic time) instead of ``time_limit``
    seconds makes the solve reproducible (solvers in DETERMINISTIC only). ``start`` (kernel cycles, cpsat-orders
    only): where its ladder of cutoffs starts, e.g. the tiling's proven optimum (policies.orders.solve's ``bound``)."""
    if solver == "greedy":
        return greedy_mod.solve(P)
    if solver == "cpsat":
        from .policies import cpsat
        return cpsat.solve(P, time_limit=time_limit, num_workers=workers, hint=hint, ii_max=ii_max, det_time=det_time)
    if solver.startswith("milp"):
        from .policies import milp
        backend = solver.split("-", 1)[1] if "-" in solver else "highs"
        return milp.solve(P, time_limit=time_limit, backend=backend, hint=hint, ii_max=ii_max)
    if solver == "exhaustive":
        from .policies import exhaustive
        # its node cap (exhaustive.MAX_NODES) is a deterministic budget; the wall clock only decides whether it gives up
        return exhaustive.solve(P, time_limit=None if det_time is not None else time_limit)
    if solver == "cpsat-orders":
        from .policies import orders
        return orders.solve(P, time_limit=time_limit, num_workers=workers, det_time=det_time, bound=start)
    raise SolverError(f"unknown solver {solver!r}; use one of {SOLVERS} (milp-highs, milp-cbc pick the backend)")


def _worker(graph_json: str, hw: Hardware, solver: str, time_limit: float, placement: str,
            hint_json: str | None, ii_max: int | None, registers: bool = True,
            det_time: float | None = None, start: int | None = None) -> tuple[str | None, dict[str, Any]]:
    P = build(STaskGraph.from_json(graph_json), hw, placement, registers=registers)
    hint = SProgram.from_json(hint_json) if hint_json else None
    kw = {k: v for k, v in (("det_time", det_time), ("start", start)) if v is not None}
    prog, st = solve_one(P, solver, time_limit, hint, ii_max, **kw)
    return (prog.to_json() if prog else None), st


def _fixed(op: Operator, fix: dict[str, int] | None, keep: Sequence[str] = ()) -> list[dict[str, int]]:
    """``op``'s tilings with the values ``fix`` names; an opt-in key (OpSpec.opt_in) keeps its default unless ``fix``
    or ``keep`` names it."""
    opt = op.spec.optional
    shut = [k for k in op.spec.opt_in if k not in (fix or {}) and k not in keep]
    tilings = [t for t in op.tilings() if all(t.get(k, opt[k]) == opt[k] for k in shut)]
    if not fix:
        return tilings
    keys = sorted(set().union(*tilings, op.spec.optional))
    unknown = sorted(set(fix) - set(keys))
    if unknown:
        raise PtsolveError(f"fix: {op.op} tilings have no key(s) {unknown}; they have {keys}")
    # a tiling without an optional key has its default; without a flag (persistent), 0
    out = [t for t in tilings if all(t.get(k, opt.get(k, 0)) == v for k, v in fix.items())]
    if not out:
        raise PtsolveError(f"fix {fix}: no tiling of {op.describe()} has these values; "
                           f"e.g. {', '.join(str(t) for t in tilings[:3])}")
    return out


def check_solver(solver: str) -> None:
    """Raise SolverError for a solver name ptsolve does not know."""
    arguments.solver(solver)


# policies that can run reproducibly (search's ``deterministic``): greedy and exhaustive have no time-dependent step
# (exhaustive's cap counts nodes), CP-SAT takes a deterministic time limit (ptsolve.cpsolver.cp_solver). HiGHS and CBC
# stop on the wall clock only: HiGHS 1.16's node and iteration limits leave its root node (presolve, cuts,
# heuristics) unbounded, and CBC has no deterministic limit either.
DETERMINISTIC = ("greedy", "cpsat", "cpsat-orders", "exhaustive")


def check_deterministic(solver: str, placement: str, deterministic: Any) -> None:
    """Refuse ``deterministic`` that is not a bool, and a deterministic search that cannot be one: a MILP back-end
    (wall-clock limits only) or the ``exact`` placement (ptsolve.placement.exact_loads: CP-SAT under a wall-clock
    limit on every program's kernel time)."""
    if not isinstance(deterministic, bool):
        raise PtsolveError(f"deterministic must be True or False, got {deterministic!r}")
    if not deterministic:
        return
    if arguments.solver(solver) not in DETERMINISTIC:
        raise SolverError(f"solver {solver!r} cannot run deterministically: HiGHS and CBC stop on a wall-clock time "
                          f"limit only; use solver 'cpsat' (or greedy, cpsat-orders, exhaustive) with "
                          "deterministic=True / --deterministic, or drop deterministic for a MILP")
    if placement == "exact":
        raise SolverError("placement 'exact' cannot run deterministically: it places the CTAs with CP-SAT under a "
                          "wall-clock limit (ptsolve.placement.exact_loads); use placement 'even', 'lpt' or 'dynamic' "
                          "with deterministic=True / --deterministic")


def check_args(hw: Any, solver: str, time_limit: Any, placement: Any, executor: Any, jobs: Any, fix: Any,
               deterministic: Any = False) -> None:
    """Every argument of search() / optimize() checked before any cache lookup or solve (ptsolve.arguments)."""
    arguments.solver(solver)
    arguments.time_limit(time_limit)
    arguments.choice("placement", placement, arguments.PLACEMENTS)
    arguments.choice("executor", executor, EXECUTORS)
    arguments.jobs(jobs)
    arguments.fix(fix)
    arguments.hw_spec(hw)
    check_deterministic(solver, placement, deterministic)
    check_grain()


def search(op: Operator | STaskGraph, hw: Hardware | str, solver: str = "cpsat", time_limit: float = 30.0,
           placement: str = "even", executor: str = "process", jobs: int | None = None, decoupled: bool = False,
           fix: dict[str, int] | None = None, progress: Callable[[str], None] | None = None,
           exclude: tuple[dict[str, int], ...] = (), verify: Callable[[SProgram], KernelCheck] | None = None,
           buildable: Callable[[STaskGraph], str | None] | None = None, deterministic: bool = False,
           spare: Callable[[SProgram], Callable[[], None]] | None = None) -> Result:
    """Find the best (tiling, schedule) of ``op`` on ``hw`` with ``solver``; ``time_limit`` (s) bounds the solves, not
    the answer's compile checks; ``fix`` keeps only the tilings with those key values; ``exclude`` drops tilings, and
    ``buildable`` (the checker's: why the code generator builds no schedule of a tiling, or None) before any solve.
    A graph instead of an operator is scheduled as it is.

    ``verify`` (the compiler in the loop, ptsolve.kernelcheck): the answer is the best schedule whose kernel the
    compiler builds as scheduled. A refused schedule is not the end of its tiling: the tiling's next schedule (the
    operator's declared issue order, solved by cpsat-orders, then greedy's) takes its place, ranked by its own
    objective, and the tilings pruned against the refused one are searched again. The refused tiling's bound still
    counts, so OPTIMAL means optimal over compile-clean schedules; an answer whose better-predicted rivals the compiler
    refused is FEASIBLE (or TIME_LIMIT) with the gap. A tiling past the register estimate by at most the operator's
    measured overcount (Hardware.reg_overcount) is searched when it could win, admitted only by the compiler's yes.
    With a wall-clock limit the solves stop at VERIFY_SHARE of it, keeping the rest for compile checks, which the
    limit never cuts short: the answer is always one the compiler was asked about (refused schedules' successors'
    checks may run past it). A verdict about the operator itself (scope "operator": no generator builds these)
    stops the checks: the model's answer comes back with that verdict. ``spare``: the caller's work (_Search._check).

    ``deterministic``: a reproducible search, the same Result program, status and bound on any machine load and with
    any ``executor`` and ``jobs``. ``time_limit`` is then not wall-clock: the search spends at most ``time_limit``
    seconds of CP-SAT deterministic time (policies.cpsat.SEARCH_DET_PER_S per second; CP-SAT's unit, about a second
    of one core, 3-4 s on the reference machine), an equal share per tiling that fits (policies.cpsat.det_budget),
    each solve on one CP-SAT worker with a fixed seed and no wall-clock limit; no deadline cuts the tilings short or
    skips a compile check. For policies greedy, cpsat, cpsat-orders and exhaustive; a MILP back-end (wall-clock
    limits only) or placement ``exact`` is a SolverError. ``solved`` and ``solve_s`` still vary: a serial search
    prunes more.

    Status: OPTIMAL when the answer's kernel time meets the least bound over all tilings; TIME_LIMIT when the time
    limit (or deterministic budget) stopped a solve, or left tilings unsolved, whose bound is below the answer, or left
    the answer unchecked; FEASIBLE otherwise (greedy, which proves nothing, an exact back-end whose proof did not
    survive re-checking, or a better-predicted schedule the compiler refused)."""
    check_args(hw, solver, time_limit, placement, executor, jobs, fix, deterministic)
    hw, t0 = load(hw), time.perf_counter()
    s = _Search(op, hw, solver, time_limit, placement, executor, jobs, deterministic, progress, verify, t0, buildable,
                spare)
    s.collect(_graphs(op, hw, fix, exclude))
    if not s.cands:
        if not s.reasons and exclude:  # every tiling was excluded by the caller
            raise InfeasibleError(f"no tiling of {s.what} is left: the {len(exclude)} excluded were all it had")
        raise InfeasibleError(f"no tiling of {s.what} fits {hw.name}: " + "; ".join(s.reasons[:4])
                              + (f" (and {len(s.reasons) - 4} more)" if len(s.reasons) > 4 else ""))
    if solver == "exhaustive":
        _exhaustive_fits(list(s.cands.values()), s.what)
    # the paper's ablation (decoupled): the tiling with the least roofline bound, alone; where the compiler refuses
    # every schedule of it, the roofline's next
    order = sorted(s.cands.values(), key=lambda c: (c.lb, c.key)) if decoupled else []
    alts = s.alts
    s.say(f"{len(s.cands)} tilings fit; greedy best {min(c.g_obj for c in s.cands.values())} cycles")
    try:
        while True:
            if decoupled:
                first = order.pop(0)
                s.cands, s.alts = {first.key: first}, {first.key: alts[first.key]}
            try:
                prog, status, bound, kc = s.run(fix, exclude)
                break
            except InfeasibleError:
                if not (order and s.rejected and s.unbuildable is None):
                    raise
    except BaseException:
        _stop(s.pool)  # SIGINT (KeyboardInterrupt) or an error: no worker may outlive the search
        raise
    finally:
        s.close()
    obj = claimed(prog, hw)[0]
    if kc is not None and kc.ok and register_excess(prog.graph, prog.copies, hw):
        prog = replace(prog, registers=kc.registers or 0)  # ptxas, not the estimate, says it fits
    prog = _relabel(prog, solver, status)
    us = hw.cycles_to_us(obj) + hw.launch_us
    return Result(program=prog, solver=solver, status=status, objective=obj, bound=bound,
                  solve_s=time.perf_counter() - t0, predicted_us=us,
                  tflops=prog.graph.useful_flops / (us * 1e-6) / 1e12, hw=hw.name,
                  tiling=dict(prog.graph.tiling), tilings=len(s.cands), solved=s.n_solved,
                  features=tuple(features(prog, hw)), provenance=stamp(),
                  kernel_check=kc.to_dict() if kc is not None else None, rejected=tuple(s.rejected))


# with a compiler in the loop and a wall-clock limit, the share of it the solves may use: the rest is kept for the
# compile checks of the answer (and of the schedules that replace it where the compiler refuses one)
VERIFY_SHARE = 0.75


def _graphs(op: Operator | STaskGraph, hw: Hardware, fix: dict[str, int] | None,
            exclude: Sequence[dict[str, int]]) -> list[STaskGraph]:
    """The graphs to search: ``op`` itself, or one per tiling of ``op`` that ``fix`` keeps and ``exclude`` does not
    name (a graph's tiling, what a caller excludes, holds the optional keys' defaults; op.tilings() may not)."""
    if isinstance(op, STaskGraph):
        return [op]
    opt = op.spec.optional
    gone = [{**opt, **x} for x in exclude]
    return [op.graph(t, hw) for t in _fixed(op, fix) if {**opt, **t} not in gone]


@dataclass
class _Cand:
    """A tiling that fits, as the search sees it: its Problem, its lower bounds (kernel cycles, busiest-slot cycles)
    and greedy's schedule with that schedule's (kernel cycles, busiest-slot cycles)."""

    P: Problem
    lb: int
    lat_lb: int
    greedy: SProgram
    g_obj: int
    g_lat: int
    # the free optimum (kernel cycles) once a solve of this process has proven it (the _Cand is memoised, _PREPARED):
    # where cpsat-orders' ladder of cutoffs starts on this tiling (optimize's declared order, after the search)
    opt: int | None = None

    @property
    def tiling(self) -> dict[str, int]:
        return self.P.graph.tiling

    @property
    def key(self) -> tuple:
        return self.P.tie


# (graph, table, placement, register estimate, grain) -> its _Cand: the Problem, bounds and greedy schedule of a
# tiling depend on nothing else, and `compare` searches every configuration with several policies
_PREPARED: OrderedDict[tuple, _Cand] = OrderedDict()


def _prepare(g: STaskGraph, hw: Hardware, placement: str, registers: bool = True, key: tuple | None = None) -> _Cand:
    """A tiling's Problem, lower bounds and greedy schedule, from the process's memo when it has them (``key``: its
    memo key, when the caller has it)."""
    key = key or _key(g, hw, placement, registers)
    c = _PREPARED.get(key)
    if c is not None:
        _PREPARED.move_to_end(key)
        return c
    c = _build_cand(g, hw, placement, registers)
    _PREPARED[key] = c
    if len(_PREPARED) > 2048:
        _PREPARED.popitem(last=False)
    return c


def _build_cand(g: STaskGraph, hw: Hardware, placement: str, registers: bool) -> _Cand:
    P = build(g, hw, placement, registers=registers)
    gp = greedy_mod.solve(P)[0]
    return _Cand(P, lower_bound(P), latency_lower_bound(P), gp, *claimed(gp, hw))


def _prepare_many(items: list[tuple[STaskGraph, bool]], hw: Hardware, placement: str,
                  pool: Callable[[], Any]) -> list[_Cand]:
    """``_prepare`` of each (graph, register estimate), in order; the ones the memo lacks on the process pool
    ``pool()`` returns (None: here) when there are several: each is a function of its graph alone, so where it is
    built changes nothing, and a cold search spends a second of its 2-core budget on them (greedy's list
    schedules)."""
    keys = [_key(g, hw, placement, r) for g, r in items]
    missing = [i for i, k in enumerate(keys) if k not in _PREPARED]
    ex = pool() if len(missing) > 1 else None
    if isinstance(ex, ProcessPoolExecutor):
        futs = {i: ex.submit(_build_cand, items[i][0], hw, placement, items[i][1]) for i in missing}
        for i, f in futs.items():  # in order: the memo's eviction order does not depend on the pool
            _PREPARED[keys[i]] = f.result()
            if len(_PREPARED) > 2048:
                _PREPARED.popitem(last=False)
    return [_prepare(g, hw, placement, r, k) for (g, r), k in zip(items, keys)]


def _key(g: STaskGraph, hw: Hardware, placement: str, registers: bool) -> tuple:
    return (g.to_json(), json.dumps(hw.to_dict(), sort_keys=True, default=str), placement, registers, check_grain())


class _Search:
    """One search's state: the tilings that fit, each tiling's known schedules best first (``alts``: what the compiler
    is asked about, in that order), the bounds proven so far, the process pool."""

    def __init__(self, op: Operator | STaskGraph, hw: Hardware, solver: str, time_limit: float, placement: str,
                 executor: str, jobs: int | None, deterministic: bool, progress: Callable[[str], None] | None,
                 verify: Callable[[SProgram], KernelCheck] | None, t0: float,
                 buildable: Callable[[STaskGraph], str | None] | None = None,
                 spare: Callable[[SProgram], Callable[[], None]] | None = None) -> None:
        self.hw, self.solver, self.time_limit, self.placement = hw, solver, time_limit, placement
        self.executor, self.jobs, self.deterministic, self.verify = executor, max(1, jobs or os.cpu_count() or 1), \
            deterministic, verify
        self.graph = isinstance(op, STaskGraph)
        self.what = op.name if isinstance(op, STaskGraph) else op.describe()
        # an operator's declared issue orders (FlashAttention-3's) are a tiling's next schedule when CP-SAT's is refused
        self.declared = solver == "cpsat" and not self.graph and op.spec.orders is not None
        self.say = progress or (lambda s: None)
        self.buildable = buildable if verify is not None else None
        wall = not deterministic
        self.deadline = t0 + time_limit if wall else math.inf
        self.solve_deadline = t0 + time_limit * (VERIFY_SHARE if verify is not None else 1.0) if wall else math.inf
        self.cands: dict[tuple, _Cand] = {}
        self.reasons: list[str] = []
        self.compiled: set[tuple] = set()  # tilings the compiler admits over the register estimate: workers skip it
        self.over: set[tuple] = set()  # of them, those past the model's estimate (none of theirs built: not counted)
        self.out: set[tuple] = set()  # tilings every schedule of which the compiler was asked about refused
        self.alts: dict[tuple, list[tuple[int, int, SProgram]]] = {}
        self.lbs: dict[tuple, int] = {}
        self.lat_lbs: dict[tuple, int] = {}
        self.own: dict[tuple, int] = {}  # per tiling: the bound its solve proved, or its bound when pruned/unreached
        self.limited: set[tuple] = set()  # tilings the time limit stopped or left unsolved
        self.solved: set[tuple] = set()
        self.tried: set[tuple] = set()  # tilings whose declared-order schedule was solved
        self.fallback: set[tuple] = set()  # tilings one of whose schedules the compiler refused
        self.rejected: list[tuple[dict[str, int], str]] = []
        self.late_drops: set[tuple] = set()  # tilings past the register estimate dropped unasked for want of time
        self.unbuildable: KernelCheck | None = None  # a verdict about the operator: no kernel of it builds
        self.n_solved = 0
        self.det: float | None = None
        self.pool: Any = None
        self.vpool: _Compiles | None = None
        self.verdicts: dict[str, Any] = {}  # per kernel (_ask), the compiler's verdict as a future
        self.kernels: dict[int, tuple[SProgram, str]] = {}  # per program asked about, its kernel's key
        # the caller's work for a candidate answer while a lone compile check of it leaves a slot idle (_check)
        self.spare = spare

    # ------------------------------------------------------------------ the tilings
    def collect(self, graphs: list[STaskGraph]) -> None:
        """Every graph that fits becomes a candidate with its bounds and greedy schedule; one that fits but for the
        register estimate is asked of the compiler when it could beat the rest."""
        hw, fit, over = self.hw, [], []
        for g in graphs:
            # a tiling the code generator cannot build is out before any solve (the checker's ``buildable``; a
            # graph given as the problem is answered as it is, with the compiler's verdict)
            unbuilt = self.buildable(g) if self.buildable and not self.graph else None
            if unbuilt:
                self.reasons.append(f"{g.tiling}: {unbuilt}")
                continue
            why = fits(g, hw)
            if why and self.verify is not None and fits(g, hw, registers=False) is None:
                # past the estimate by more than it overcounts: ptxas refuses every schedule (no solve, no compile)
                refused = register_refusal(g, hw)
                if refused:
                    self.reasons.append(f"{g.tiling}: {refused}")
                    continue
                over.append((g, why))
            elif why:
                self.reasons.append(f"{g.tiling}: {why}")
            else:
                fit.append(g)
        items = [(g, True) for g in fit] + [(g, False) for g, _ in over]
        cands = _prepare_many(items, hw, self.placement,
                              lambda: self._pool(len(items)) if self.executor == "process" else None)
        for c in cands[:len(fit)]:
            self._add(c)
        best_greedy = min((c.g_obj for c in self.cands.values()), default=math.inf)
        for c, why in sorted(zip(cands[len(fit):], (w for _, w in over)), key=lambda x: (x[0].lb, x[0].key)):
            if c.lb > best_greedy:  # cannot win: not worth a compile
                self.reasons.append(f"{c.tiling}: {why}")
                continue
            # the compiler, not the estimate, decides: asked only if one of its schedules becomes the answer
            self.say(f"tiling {c.tiling}: {why} by the model's estimate; searched, the compiler decides")
            self.over.add(c.key)
            self.compiled.add(c.key)
            self._add(c)
        if self.deterministic and self.cands:
            from .policies.cpsat import det_budget
            self.det = det_budget(self.time_limit, len(self.cands))

    def _add(self, c: _Cand) -> None:
        self.cands[c.key] = c
        self.lbs[c.key], self.lat_lbs[c.key] = c.lb, c.lat_lb
        # greedy's program is not of the pinned orders: no schedule for cpsat-orders until it solves
        self.alts[c.key] = [] if self.solver == "cpsat-orders" else [(c.g_obj, c.g_lat, c.greedy)]

    def _inc(self) -> tuple:
        """(kernel cycles, busiest-slot cycles, tiling key) of the best schedule not refused, the order answers rank
        by (answer_key); (inf, inf, ()) when there is none."""
        # at equal time a schedule in hand goes before a place-holder (a declared order not solved yet)
        heads = [(a[0][0], a[0][1], a[0][2] is None, k) for k, a in self.alts.items() if a]
        obj, lat, _, k = min(heads, default=(math.inf, math.inf, False, ()))
        return obj, lat, k

    def _late(self) -> bool:
        return time.perf_counter() > self.deadline

    # ------------------------------------------------------------------ the solves
    def _pool(self, n: int) -> Any:
        """The pool for ``n`` solves (None: solve here). A process pool's workers are forked with CP-SAT already
        imported: each would otherwise import it before its first solve (0.4 s of a cold search on 2 cores)."""
        if self.pool is None and self.executor == "ray":
            self.pool = _RayPool()
        elif self.pool is None and self.executor == "process" and self.jobs > 1 and n > 1:
            if self.solver in ("cpsat", "cpsat-orders"):
                try:
                    import ortools.sat.python.cp_model  # noqa: F401
                except ImportError:  # the solve says so (policies.cpsat)
                    pass
            self.pool = ProcessPoolExecutor(max_workers=self.jobs)
        return self.pool

    def solve_all(self) -> None:
        """Solve, best bound first, every tiling not solved yet that could still beat the best schedule (deepest ring
        first among twins: a deeper ring only removes constraints, so its optimum bounds the shallower twins)."""
        if self.solver == "greedy":
            return
        todo = sorted((c for k, c in self.cands.items() if k not in self.solved),
                      key=lambda c: (c.lb, -c.tiling.get("depth", 0), c.key))
        pool = self._pool(len(todo))
        running: dict[Any, _Cand] = {}
        while todo or running:
            while todo and len(running) < (self.jobs if pool is not None else 1) \
                    and time.perf_counter() < self.solve_deadline:
                c = todo.pop(0)
                k = c.key
                # prune only what cannot win even the tie-break (time, slot latency, tiling key): a serial search,
                # which prunes more, and a parallel one then return the same program
                if (self.lbs[k], self.lat_lbs[k], k) > self._inc():
                    self.own[k] = self.lbs[k]
                    continue
                left = self.time_limit if self.deterministic else max(0.2, self.solve_deadline - time.perf_counter())
                # no cut-off at the incumbent: CP-SAT proves "no better than X" far slower than "optimum is Y"
                # a deterministic search's solves depend on nothing an earlier search of the process left behind
                args = (c.P.graph.to_json(), self.hw, self.solver, left, self.placement, c.greedy.to_json(), None,
                        k not in self.compiled, self.det, None if self.deterministic else c.opt)
                running[pool.submit(_worker, *args) if pool is not None else _Done(_worker(*args))] = c
            if not running:
                break
            for fut in _first_done(list(running), pool):
                c = running.pop(fut)
                self._take(c, *fut.result())
        for c in todo:  # not reached before the deadline
            self.own[c.key] = self.lbs[c.key]
            self.limited.add(c.key)

    def _take(self, c: _Cand, pj: str | None, st: dict[str, Any]) -> None:
        """Record one tiling's solve: its schedule among the tiling's schedules, the bound it proves for it and its
        shallower twins."""
        k, hw = c.key, self.hw
        self.n_solved += 1
        self.solved.add(k)
        prog = SProgram.from_json(pj) if pj else None
        obj, lat = claimed(prog, hw) if prog else (None, None)
        status = st["status"]
        if status == "OPTIMAL" and (st.get("objective") != obj or not replays(prog, hw)):
            # the optimum is of the model's number; if the replay disagrees, nothing is proven
            self.say(f"tiling {c.tiling}: {self.solver}'s optimum {st.get('objective')} cycles is not what the "
                     f"program replays to ({obj}); keeping it unproven")
            status = "FEASIBLE"
        inc = self._inc()[0]
        if obj is not None:
            _insert(self.alts[k], obj, lat, prog)
        # a tiling solved to optimality cannot beat its own optimum; otherwise its proven bound
        b = (obj if status == "OPTIMAL" and obj is not None else inc if status == "INFEASIBLE" else
             max(c.lb, st.get("bound") or 0) if status == "TIME_LIMIT" else c.lb)
        self.own[k] = b
        if status == "OPTIMAL" and obj is not None and self.solver != "cpsat-orders":
            c.opt = obj
        self.limited.discard(k)
        if status == "TIME_LIMIT":
            self.limited.add(k)
        for o in self.cands.values():
            if o.key not in self.solved and _twin(o.tiling, c.tiling) and o.tiling.get("depth", 0) < \
                    c.tiling.get("depth", 0):
                self.lbs[o.key] = max(self.lbs[o.key], b)
                if status == "OPTIMAL" and lat is not None:
                    self.lat_lbs[o.key] = max(self.lat_lbs[o.key], lat)
        self.say(f"tiling {c.tiling}: {status} in {st.get('solve_s', 0):.2f} s; best {self._inc()[0]} cycles")

    def status(self) -> tuple[str, int]:
        """(status, bound) of the best schedule not refused, over every tiling (refused ones too: a tiling whose
        better schedule the compiler refused may have compile-clean schedules between that one and the answer)."""
        inc = self._inc()[0]
        # a tiling past the model's register estimate is the model's only while the compiler builds one of its
        # schedules: once all it was asked about are refused, its bound is no longer the model's
        keys = [k for k in self.cands if not (k in self.over and k in self.out)]
        if self.solver == "greedy":
            return "FEASIBLE", min([*(self.lbs[k] for k in keys), inc])
        bounds, timed_out = _settle([(self.cands[k].tiling, k) for k in keys], self.own, self.limited, inc)
        bound = min([*bounds, inc])
        return ("OPTIMAL" if bound >= inc else "TIME_LIMIT" if timed_out else "FEASIBLE"), bound

    # ------------------------------------------------------------------ the answer
    def run(self, fix: dict[str, int] | None, exclude: Sequence[dict[str, int]]) -> tuple[SProgram, str, int,
                                                                                          KernelCheck | None]:
        """(program, status, bound, the compiler's verdict or None): solve, ask the compiler about the best schedule,
        and while it refuses, go on with the refused tiling's next schedule and whatever that lets back in."""
        while True:
            self.solve_all()
            obj, _, k = self._inc()
            if obj == math.inf:
                if self.rejected and self.late_drops:
                    raise InfeasibleError(f"the time limit ({self.time_limit:g} s) ran out before the compiler could "
                                          f"admit any tiling of {self.what} past the model's register estimate "
                                          f"({len(self.late_drops)} left unasked), and it refused the others: "
                                          + "; ".join(f"{t}: {w}" for t, w in self.rejected[:2])
                                          + "; raise time_limit")
                if self.rejected:
                    raise InfeasibleError(f"every tiling of {self.what} that fits {self.hw.name} was rejected by the "
                                          "compiler: " + "; ".join(f"{t}: {w}" for t, w in self.rejected[:4]))
                raise InfeasibleError(f"{self.solver} found no schedule of {self.what} within {self.time_limit:g} s"
                                      + (" of CP-SAT deterministic time" if self.deterministic else "")
                                      + "; raise time_limit")
            prog = self.alts[k][0][2]
            if prog is None:  # the declared order's turn: solved only now that it could be the answer
                self._declared(k)
                continue
            status, bound = self.status()
            if k in self.fallback and prog.policy == "greedy":
                prog = replace(prog, policy=f"{self.solver} (greedy's schedule: the compiler refused a better one)")
            if k in self.over and (self.unbuildable is not None or self._late()):
                if self.unbuildable is None:
                    self.late_drops.add(k)
                self._drop(k)  # past the model's register estimate, only the compiler's yes admits it: none to be had
                continue
            if self.verify is not None and self.unbuildable is None and self.jobs > 1 and self._doubtful(k):
                self._ask(prog)  # the compiler starts on the solver's schedule while it is polished and deepened
            final = self._finish(k, prog, status, fix, exclude)
            if self.verify is None or self.unbuildable is not None:
                return final, status, bound, self.unbuildable
            answer = self._check(k, (final, prog) if final is not prog else (final,), status, bound)
            if answer is not None:
                return answer

    def _check(self, k: tuple, variants: tuple[SProgram, ...], status: str,
               bound: int) -> tuple[SProgram, str, int, KernelCheck] | None:
        """Ask the compiler about tiling ``k``'s candidate answer, ``variants`` (the schedule as returned, then the
        solver's own): (program, status, bound, verdict) of the first it admits; None where it refuses them (the
        tiling's next schedule takes their place, or the tiling is out). The variants are asked side by side only
        where a refusal is likely (_doubtful: the second verdict is then ready when the first is a refusal);
        otherwise the second is asked only after the first is refused. Where the checks leave one of ``jobs``
        compile slots idle, the caller's ``spare(schedule)`` starts its work for the candidate (e.g. optimize's
        declared-order solve of its tiling) and returns what cancels it, called if the compiler refuses it; the
        work changes no answer."""
        asked = variants if self._doubtful(k) else variants[:1]
        for v in asked:
            self._ask(v)
        cancel = self._idle(k, asked)
        for v in variants:
            kc = self._verdict(v)
            if kc.refused and kc.scope == "operator":
                self.unbuildable = kc
            if k in self.over and not kc.ok and not (kc.refused and kc.scope == "schedule"):
                break  # no compiler's yes to be had (none here, or the operator is refused): the estimate stands
            if not kc.refused or kc.scope == "operator" or self.graph:  # a graph's verdict is reported as it is
                return v, status, bound, kc
            self.rejected.append((dict(v.graph.tiling), f"{kc.status}: {kc.reason} ({v.policy} schedule)"))
            self.say(f"tiling {v.graph.tiling}: the compiler {kc.status} its {v.policy} schedule ({kc.reason})")
        else:
            self._next(k)
            cancel()
            return None
        cancel()
        self._drop(k)
        return None

    def _doubtful(self, k: tuple) -> bool:
        """Whether the compiler is likely to refuse tiling ``k``'s candidate: past the model's register estimate
        (``over``; ptxas refused all 12 such tilings it was asked about in the five held-out attention configurations
        of issue 34, on h100) or a tiling it refused a schedule of already (``fallback``). Elsewhere the first
        candidate compiled clean, and a second compile beside it (the solver's schedule next to its polished twin)
        only took the core the declared-order solve (``spare``) needed: b1 h32/8 s1536 d128 causal, 2 cores."""
        return k in self.over or k in self.fallback

    def _idle(self, k: tuple, variants: tuple[SProgram, ...]) -> Callable[[], None]:
        """Put a compile slot the checks of ``variants`` (those asked) leave free to use (what cancels that work; a
        no-op where there is none). Where a refusal is likely (_doubtful), the compiler is asked ahead about the
        schedule that comes next if it refuses this one; otherwise the caller's ``spare`` work for the candidate
        starts. Neither changes the answer: a verdict is the same whenever it is asked."""
        # nothing to overlap once the verdicts are in (with one job the candidate's check holds the only slot)
        if sum(not f.done() for f in self.verdicts.values()) >= self.jobs or all(self._ask(v).done() for v in variants):
            return _nothing
        if self._doubtful(k):
            nxt = self._runner_up(k)
            if nxt is not None:
                self._ask(nxt)
            return _nothing
        return self.spare(variants[0]) if self.spare is not None else _nothing

    def _runner_up(self, k: tuple) -> SProgram | None:
        """The best schedule in hand other than tiling ``k``'s candidate (the head of its list), as run() will ask
        about it once the compiler refuses the candidate; a solve the refusal lets back in may still come first."""
        best: tuple | None = None
        for kk, a in self.alts.items():
            first = next(((obj, lat, p) for obj, lat, p in a[1 if kk == k else 0:] if p is not None), None)
            if first is not None and (best is None or (first[0], first[1], kk) < best[0]):
                best = ((first[0], first[1], kk), first[2])
        if best is None:
            return None
        kk, p = best[0][2], best[1]
        if (kk in self.fallback or kk == k) and p.policy == "greedy":  # as run() labels it (k joins the fallbacks)
            p = replace(p, policy=f"{self.solver} (greedy's schedule: the compiler refused a better one)")
        return p

    def _finish(self, k: tuple, prog: SProgram, status: str, fix: dict[str, int] | None,
                exclude: Sequence[dict[str, int]]) -> SProgram:
        """The schedule as returned: CP-SAT's optimum polished, the ring deepened where the table asks (neither
        changes the objective), never into a tiling the caller excluded or the compiler refused."""
        if self.solver == "cpsat" and status == "OPTIMAL":
            prog = _polish(prog, [self.cands[k].P], self.hw, self.say)
        if not self.graph and "depth" not in (fix or {}):  # a given graph or depth is the caller's
            prog = _deepen(prog, self.hw, self.say, [*exclude, *(t for t, _ in self.rejected)])
        return prog

    def _next(self, k: tuple) -> None:
        """Tiling ``k``'s best schedule was refused: its next one (the declared issue order, solved once) takes its
        place; with none left, the tiling is out."""
        obj, lat, _ = self.alts[k].pop(0)
        self.fallback.add(k)
        if self.declared and k not in self.tried:
            # the declared order's schedule is no better than the refused optimum: it waits in the queue at that
            # value and is solved when it comes first (run), not before (most never do)
            self.tried.add(k)
            _insert(self.alts[k], obj, lat, None)
        if not self.alts[k]:
            self.out.add(k)

    def _drop(self, k: tuple) -> None:
        """Tiling ``k`` is out: none of its schedules will be the answer."""
        self.alts[k].clear()
        self.out.add(k)

    def _declared(self, k: tuple) -> None:
        """Solve tiling ``k``'s declared-order schedule (policy cpsat-orders), in place of its place-holder. It can
        only matter if it ranks before the best schedule in hand (the rival; other place-holders are not schedules):
        under the even placement, whose model objective is the claimed one, it is asked only for schedules no slower
        than the rival (a cutoff CP-SAT refutes in milliseconds where it cannot), and where there are none the
        place-holder waits at the rival's time + 1, solved again only if it comes first again once the compiler has
        refused the rival (a lower bound throughout, so the schedules are taken in the same order as if every
        declared order were solved at once). A deterministic search solves it in full, from its own lower bound: the
        rival and the refused schedule may differ between a serial and a parallel search (what each pruned), and
        a solve its budget stops short is not the same under another cutoff."""
        from .policies import orders
        refused = self.alts[k].pop(0)[0]  # no declared-order schedule beats it: where cpsat-orders' ladder starts
        rival = min((x[0] for a in self.alts.values() for x in a if x[2] is not None), default=math.inf)
        cut = int(rival) + 1 if rival < math.inf and self.placement == "even" and not self.deterministic else None
        left = self.time_limit if self.deterministic else max(0.2, self.deadline - time.perf_counter())
        prog, st = orders.solve(self.cands[k].P, time_limit=left, num_workers=1, cutoff=cut,
                                bound=None if self.deterministic else refused,
                                **({} if self.det is None else {"det_time": self.det}))
        if prog is None and st.get("refuted"):
            _insert(self.alts[k], cut, 0, None)  # type: ignore[arg-type]
            self.say(f"tiling {self.cands[k].tiling}: no declared-order schedule beats the best one in hand ({rival} "
                     "cycles); it waits behind it")
            return
        if prog is not None:
            prog = replace(prog, policy="cpsat-orders")
            _insert(self.alts[k], *claimed(prog, self.hw), prog)
            self.say(f"tiling {self.cands[k].tiling}: its declared-order schedule, {claimed(prog, self.hw)[0]} "
                     "cycles, is next")
        if not self.alts[k]:
            self.out.add(k)

    def _verdict(self, prog: SProgram) -> KernelCheck:
        """The compiler's verdict on ``prog``, waited for past the deadline too: an answer the compiler was never
        asked about spilled or serialised in 18 of 41 served attention kernels (bench study peers, 4eecaf8), at
        1.5-2.8x the time of a compile-clean schedule, so the time limit bounds the solves, not the checks."""
        return self._ask(prog).result()

    def _ask(self, prog: SProgram) -> Any:
        """The compiler's verdict on ``prog``, as a future: asked once per kernel (``verify``'s ``kernel_key``, e.g.
        CP-SAT's optimum and its polished twin often emit one kernel; without one, once per schedule), on up to
        ``jobs`` threads (the compiler runs as a process of its own, so its runs overlap)."""
        if id(prog) not in self.kernels:  # kept with the program, so that its id is not reused
            same = getattr(self.verify, "kernel_key", None)
            self.kernels[id(prog)] = (prog, (same(prog) if same is not None else None) or prog.to_json())
        key = self.kernels[id(prog)][1]
        if key not in self.verdicts:
            if self.vpool is None:
                self.vpool = _Compiles(self.jobs)
            self.verdicts[key] = self.vpool.submit(self.verify, prog)  # type: ignore[arg-type]
        return self.verdicts[key]

    def close(self) -> None:
        if self.vpool is not None:  # a compile still running finishes on its own; nobody waits for it
            self.vpool.close()
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True) if not isinstance(self.pool, _RayPool) else self.pool.shutdown()


def _nothing() -> None:
    """No work to cancel."""


class _Compiles:
    """A search's compile checks: at most ``jobs`` at once, each on a daemon thread (the compiler runs as a process
    of its own, so its runs overlap). A check asked ahead or of a variant the answer did not need may still run when
    the search returns; nobody waits for it, not even the interpreter's exit (a ThreadPoolExecutor's threads are
    joined there: a command line's answer waited up to a compile, 1.5-3.5 s, for a verdict nobody read)."""

    def __init__(self, jobs: int) -> None:
        self.slots = threading.BoundedSemaphore(jobs)
        self.waiting: list[Future] = []
        self.closed = False

    def submit(self, fn: Callable[[Any], Any], arg: Any) -> Future:
        fut: Future = Future()
        self.waiting.append(fut)

        def run() -> None:
            with self.slots:
                if self.closed or not fut.set_running_or_notify_cancel():
                    return
                try:
                    fut.set_result(fn(arg))
                except BaseException as e:  # the waiter (_verdict) raises it
                    fut.set_exception(e)
        threading.Thread(target=run, daemon=True).start()
        return fut

    def close(self) -> None:
        """Checks not started yet are cancelled; those running finish on their own."""
        self.closed = True
        for fut in self.waiting:
            fut.cancel()


def _insert(alts: list[tuple[int, int, SProgram | None]], obj: int, lat: int, prog: SProgram | None) -> None:
    """Into a tiling's schedules, best (kernel cycles, busiest slot) first, after any equal one (an equal solver
    schedule does not displace greedy's, which the search keeps as its incumbent). None: a schedule not solved yet,
    no better than (obj, lat)."""
    i = next((j for j, x in enumerate(alts) if (obj, lat) < (x[0], x[1])), len(alts))
    alts.insert(i, (obj, lat, prog))


def _polish(prog: SProgram, problems: list[Problem], hw: Hardware, say: Callable[[str], None]) -> SProgram:
    """CP-SAT's optimum with the most idle time before each tensor-core issue (policies.cpsat.polish): the same
    objective and slot latency, so the answer and its proof stand; kept only if it replays to them."""
    from .policies import cpsat

    P = next(P for P in problems if P.graph.tiling == prog.graph.tiling)
    new = cpsat.polish(P, prog)
    if new is prog:
        return prog
    worse = set(check_valid(new, hw).violations) - set(check_valid(prog, hw).violations)
    if claimed(new, hw) != claimed(prog, hw) or not replays(new, hw) or worse:
        say(f"polish of {prog.graph.tiling} kept the solver's schedule (the polished one did not replay the same)")
        return prog
    return new


def _deepen(prog: SProgram, hw: Hardware, say: Callable[[str], None], exclude: Sequence[dict[str, int]]) -> SProgram:
    """The winner with a deeper ring where its operator's table asks for one (policies.model.deepen), none of the
    ``exclude``d tilings: the same schedule and objective, so the answer and its proof stand; kept only if it
    replays to them."""
    from .policies.model import deepen

    new = deepen(prog, hw, exclude)
    if new is prog:
        return prog
    if claimed(new, hw) != claimed(prog, hw) or not replays(new, hw) or check_valid(new, hw).violations:
        say(f"ring depth {new.graph.tiling['depth']} of {prog.graph.tiling} did not replay the same; kept "
            f"{prog.graph.tiling['depth']}")
        return prog
    say(f"ring deepened {prog.graph.tiling['depth']} -> {new.graph.tiling['depth']} (same schedule; the table's "
        "deep_ring_max)")
    return new


def _exhaustive_fits(cands: list[_Cand], what: str) -> None:
    """Refuse, before any solve, an exhaustive search none of whose tilings is small enough to enumerate."""
    from .policies import exhaustive

    if not any(len(c.P.tasks) <= exhaustive.MAX_TASKS and c.P.horizon <= exhaustive.MAX_HORIZON for c in cands):
        n = min(len(c.P.tasks) for c in cands)
        raise SolverError(f"solver 'exhaustive' enumerates every schedule of graphs of at most {exhaustive.MAX_TASKS} "
                          f"tasks and a horizon of {exhaustive.MAX_HORIZON} grains (tests' tiny graphs); {what} has "
                          f"{n}+ tasks per CTA: use solver 'cpsat' or 'milp'")


def _stop(pool: Any) -> None:
    """End a pool's workers now (ProcessPoolExecutor.shutdown waits for running solves, up to their time limit)."""
    if isinstance(pool, _RayPool):
        pool.cancel()
    elif isinstance(pool, ProcessPoolExecutor):
        terminate(pool)


def answer_key(p: SProgram, hw: Hardware) -> tuple:
    """How answers rank, best first: kernel cycles, then the busiest slot's latency, then the tiling's tie key
    (policies.model.tie_key). The order search keeps its incumbent by; optimize and tune rank Results by it too."""
    return (*claimed(p, hw), tiling_tie(p.graph, hw))


def _settle(tilings: list[tuple[dict[str, int], tuple]], own: dict[tuple, int], limited: set[tuple],
            inc: float) -> tuple[list[int], bool]:
    """(each tiling's bound, whether the time limit is why ``inc`` is unproven) once the solves are done.
    ``tilings``: (tiling, tie key); ``own``: per tie key, the bound its solve proved, or its bound when pruned or
    unreached; ``limited``: the tie keys the time limit stopped or left unsolved. A tiling's bound is the largest of
    its own and its deeper twins' (a deeper ring's bound bounds the shallower one too, solved, pruned or unreached),
    and the time limit counts only where a stopped tiling's bound is below ``inc``. Taken over all tilings at the end,
    not as solves finish, so that a serial search (which prunes more) and a parallel one (which solves more, in any
    order) agree on every bound below the answer, hence on the search's bound and status: a tiling one prunes and
    the other solves either has its own bound >= ``inc`` or inherits one from a deeper twin."""
    bounds = [max([own[k]] + [own[j] for u, j in tilings if _twin(u, t) and u.get("depth", 0) > t.get("depth", 0)])
              for t, k in tilings]
    return bounds, any(b < inc and k in limited for b, (_, k) in zip(bounds, tilings))


def _twin(a: dict[str, int], b: dict[str, int]) -> bool:
    """Same tiling but for the ring depth."""
    return {k: v for k, v in a.items() if k != "depth"} == {k: v for k, v in b.items() if k != "depth"}


def _first_done(futs: list[Any], pool: Any) -> list[Any]:
    if pool is None or isinstance(pool, _RayPool):
        return futs[:1]
    done, _ = wait(futs, return_when=FIRST_COMPLETED)
    return sorted(done, key=futs.index)


class _Done:
    def __init__(self, value: Any) -> None:
        self.value = value

    def result(self) -> Any:
        return self.value


def _relabel(p: SProgram, solver: str, status: str) -> SProgram:
    """Name the policy that returned ``p``: an exact solver may keep greedy's program, proven optimal or not. A
    schedule that stands in for a refused one (the declared order's, greedy's) keeps the name it was given."""
    if p.policy == solver or (p.policy != solver and p.policy.startswith(("cpsat-orders", f"{solver} ("))):
        return p
    if p.policy != "greedy":
        return replace(p, policy=solver)
    why = "proven optimal" if status == "OPTIMAL" else f"not improved, status {status}"
    return replace(p, policy=solver if solver == "greedy" else f"{solver} (greedy's schedule, {why})")


class _RayPool:
    """The same sweep on a Ray cluster (``pip install ray``; local mode when no cluster is running)."""

    def __init__(self) -> None:
        try:
            import ray
        except ImportError as e:
            raise SolverError("executor 'ray' needs Ray: pip install 'ptsolve[ray]'") from e
        if not ray.is_initialized():
            # joins a running cluster (RAY_ADDRESS) or starts a local one on this machine
            ray.init(ignore_reinit_error=True, include_dashboard=False, log_to_driver=False,
                     num_cpus=None if os.environ.get("RAY_ADDRESS") else (os.cpu_count() or 1))
        self.ray = ray
        self.remote = ray.remote(_worker)
        self.refs: list[Any] = []

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        ref = self.remote.remote(*args)
        self.refs.append(ref)
        ray = self.ray

        class _F:
            def result(self) -> Any:
                return ray.get(ref)
        return _F()

    def shutdown(self) -> None:
        pass

    def cancel(self) -> None:
        for ref in self.refs:
            self.ray.cancel(ref, force=True)

