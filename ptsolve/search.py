"""Joint search over tilings: bound every tiling, schedule the promising ones, keep the best.

Every tiling that fits the EU gets a lower bound (the resource / recurrence bound on ii and the
critical path on the span, put through the placement) and a greedy schedule (an upper bound). Exact
policies then solve tilings in order of their bound until the bound reaches the best schedule found:
the rest cannot win. Solves run in a process pool (or on Ray, or serially). ``decoupled=True`` is
the paper's ablation: pick the tiling by its roofline bound alone, then schedule only that one.
"""
from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import replace
from typing import Any

from . import checks
from .cost import check_grain
from .errors import InfeasibleError, PtsolveError, SolverError
from .hw import Hardware, load
from .ir import STaskGraph
from .ops.base import Operator
from .policies import SOLVERS
from .policies import greedy as greedy_mod
from .policies.model import Problem, build, fits, tiling_tie
from .program import SProgram
from .provenance import stamp
from .report import features
from .result import Result
from .simulate import claimed, replay
from .validate import check_valid

EXECUTORS = checks.EXECUTORS


def ends_lower_bound(P: Problem) -> tuple[int, int]:
    """Lower bounds on (pre, last) of every schedule (Problem.ends), grains: the longest path through the
    zero-distance precedences to each task plus its own duration, over the prologue / the other tasks."""
    order = P.graph.topo_order()
    est = dict.fromkeys(order, 0)
    for t in order:
        for u, v, d, lat in P.prec:
            if u == t and d == 0:
                est[v] = max(est[v], est[t] + lat)
    pre = max((est[t] + P.end(t) for t in order if P.phase[t] == "pre"), default=0)
    return pre, max(est[t] + P.end(t) for t in order if P.phase[t] != "pre")


def lower_bound(P: Problem) -> int:
    """No schedule of this tiling beats this many kernel cycles."""
    return P.objective(P.ii_lb, *ends_lower_bound(P)) * P.grain


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
              workers: int = 1, det_time: float | None = None) -> tuple[SProgram | None, dict[str, Any]]:
    """Run one policy on one tiling's problem; ``det_time`` (CP-SAT deterministic time) instead of ``time_limit``
    seconds makes the solve reproducible (solvers in DETERMINISTIC only)."""
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
        return orders.solve(P, time_limit=time_limit, num_workers=workers, det_time=det_time)
    raise SolverError(f"unknown solver {solver!r}; use one of {SOLVERS} (milp-highs, milp-cbc pick the backend)")


def _worker(graph_json: str, hw: Hardware, solver: str, time_limit: float, placement: str,
            hint_json: str | None, ii_max: int | None, registers: bool = True,
            det_time: float | None = None) -> tuple[str | None, dict[str, Any]]:
    P = build(STaskGraph.from_json(graph_json), hw, placement, registers=registers)
    hint = SProgram.from_json(hint_json) if hint_json else None
    prog, st = solve_one(P, solver, time_limit, hint, ii_max, **({} if det_time is None else {"det_time": det_time}))
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
    checks.solver(solver)


# policies that can run reproducibly (search's ``deterministic``): greedy and exhaustive have no time-dependent step
# (exhaustive's cap counts nodes), CP-SAT takes a deterministic time limit (policies.cpsat.cp_solver). HiGHS and CBC
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
    if checks.solver(solver) not in DETERMINISTIC:
        raise SolverError(f"solver {solver!r} cannot run deterministically: HiGHS and CBC stop on a wall-clock time "
                          f"limit only; use solver 'cpsat' (or greedy, cpsat-orders, exhaustive) with "
                          "deterministic=True / --deterministic, or drop deterministic for a MILP")
    if placement == "exact":
        raise SolverError("placement 'exact' cannot run deterministically: it places the CTAs with CP-SAT under a "
                          "wall-clock limit (ptsolve.placement.exact_loads); use placement 'even', 'lpt' or 'dynamic' "
                          "with deterministic=True / --deterministic")


def check_args(hw: Any, solver: str, time_limit: Any, placement: Any, executor: Any, jobs: Any, fix: Any,
               deterministic: Any = False) -> None:
    """Every argument of search() / optimize() checked before any cache lookup or solve (ptsolve.checks)."""
    checks.solver(solver)
    checks.time_limit(time_limit)
    checks.choice("placement", placement, checks.PLACEMENTS)
    checks.choice("executor", executor, EXECUTORS)
    checks.jobs(jobs)
    checks.fix(fix)
    checks.hw_spec(hw)
    check_deterministic(solver, placement, deterministic)
    check_grain()


def search(op: Operator | STaskGraph, hw: Hardware | str, solver: str = "cpsat", time_limit: float = 30.0,
           placement: str = "even", executor: str = "process", jobs: int | None = None, decoupled: bool = False,
           fix: dict[str, int] | None = None, progress: Callable[[str], None] | None = None,
           exclude: tuple[dict[str, int], ...] = (),
           admit: Callable[[SProgram], str | None] | None = None, deterministic: bool = False) -> Result:
    """Find the best (tiling, schedule) of ``op`` on ``hw`` with ``solver``; ``time_limit`` in seconds
    bounds the whole search; ``fix`` keeps only the tilings with those key values; ``exclude`` drops tilings (those
    whose kernels the compiler rejected, ptsolve.optimize). A graph instead of an operator is scheduled as it is.
    ``admit`` (the compiler in the loop): a tiling that fits except for the model's register estimate is searched
    too when it could beat the tilings that fit (its bound is not above their best greedy schedule) and ``admit``
    of its greedy schedule says None (ptxas builds the kernel without spilling; else why not).

    ``deterministic``: a reproducible search, the same Result program, status and bound on any machine load and with
    any ``executor`` and ``jobs``. ``time_limit`` is then not wall-clock: the search spends at most ``time_limit``
    seconds of CP-SAT deterministic time (policies.cpsat.SEARCH_DET_PER_S per second; CP-SAT's unit, about a second
    of one core, 3-4 s on the reference machine), an equal share per tiling that fits (policies.cpsat.det_budget),
    each solve on one CP-SAT worker with a fixed seed and no wall-clock limit; no deadline cuts the tilings short.
    For policies greedy, cpsat, cpsat-orders and exhaustive; a MILP back-end (wall-clock limits only) or placement
    ``exact`` is a SolverError. ``solved`` and ``solve_s`` still vary: a serial search prunes more.

    Status: OPTIMAL when the best program's kernel time meets the least bound over all tilings; TIME_LIMIT
    when the time limit (or deterministic budget) stopped a solve, or left tilings unsolved, whose bound is below
    the answer; FEASIBLE otherwise (greedy, which proves nothing, or an exact back-end whose proof did not survive
    re-checking)."""
    check_args(hw, solver, time_limit, placement, executor, jobs, fix, deterministic)
    hw = load(hw)
    t0 = time.perf_counter()
    say = progress or (lambda s: None)
    cands: list[tuple[int, dict[str, int], Problem, SProgram, int]] = []
    reasons = []
    if isinstance(op, STaskGraph):
        graphs = [op]
    else:  # a graph's tiling (what a caller excludes) holds the optional keys' defaults; op.tilings() may not
        opt = op.spec.optional
        gone = [{**opt, **x} for x in exclude]
        graphs = [op.graph(t, hw) for t in _fixed(op, fix) if {**opt, **t} not in gone]
    over: list[tuple[Problem, str]] = []  # fit but for the register estimate: for ``admit`` to decide
    for g in graphs:
        t = g.tiling
        why = fits(g, hw)
        if why and admit is not None and fits(g, hw, registers=False) is None:
            over.append((build(g, hw, placement, registers=False), why))
            continue
        if why:
            reasons.append(f"{t}: {why}")
            continue
        P = build(g, hw, placement)
        gp, _ = greedy_mod.solve(P)
        cands.append((lower_bound(P), t, P, gp, *claimed(gp, hw), latency_lower_bound(P)))
    compiled: set[tuple] = set()  # tilings ptxas admitted: their workers skip the estimate too
    best_greedy = min((c[4] for c in cands), default=math.inf)
    for P, why in sorted(over, key=lambda x: (lower_bound(x[0]), x[0].tie)):
        t = P.graph.tiling
        if lower_bound(P) > best_greedy:  # cannot win: no compile
            reasons.append(f"{t}: {why}")
            continue
        gp, _ = greedy_mod.solve(P)
        no = admit(gp)
        say(f"tiling {t}: {why} by the model's estimate; the compiler " + (f"refuses it ({no})" if no else "fits it"))
        if no:
            reasons.append(f"{t}: {why}; the compiler: {no}")
            continue
        compiled.add(P.tie)
        cands.append((lower_bound(P), t, P, gp, *claimed(gp, hw), latency_lower_bound(P)))
    what = op.name if isinstance(op, STaskGraph) else op.describe()
    if not cands:
        if not reasons and exclude:  # every tiling was excluded by the caller (the compiler in the loop rejected all)
            raise InfeasibleError(f"no tiling of {what} is left: the {len(exclude)} excluded were all it had")
        raise InfeasibleError(f"no tiling of {what} fits {hw.name}: " + "; ".join(reasons[:4])
                              + (f" (and {len(reasons) - 4} more)" if len(reasons) > 4 else ""))
    if solver == "exhaustive":
        _exhaustive_fits(cands, what)
    cands.sort(key=lambda c: (c[0], c[2].tie))
    if decoupled:
        cands = cands[:1]
    say(f"{len(cands)} tilings fit; greedy best {min(c[4] for c in cands)} cycles")
    # ties in kernel time (a shared-unit floor) go to the smaller slot latency, then to the smaller tiling key
    best = min(cands, key=lambda c: (c[4], c[5], c[2].tie))
    inc_prog, inc_obj, inc_lat = best[3], best[4], best[5]
    inc_key = best[2].tie
    if solver == "cpsat-orders":  # greedy's program is not of the pinned orders: no incumbent from it
        inc_obj = inc_lat = math.inf
    bounds = [c[0] for c in cands]  # greedy proves nothing: the roofline bounds stand
    solved = len(cands)
    timed_out = False
    if solver != "greedy":
        solved = 0
        own: dict[tuple, int] = {}  # per tiling: the bound its solve proved, or its bound when pruned or unreached
        limited: set[tuple] = set()  # tilings the time limit stopped or left unsolved
        # deterministic: no deadline, and a per-tiling budget fixed before any solve (solve_one, det_time); solves
        # run with one CP-SAT worker each (solve_one's default): the pool runs ``jobs`` of them at once
        deadline = math.inf if deterministic else t0 + time_limit
        det = None
        if deterministic:
            from .policies.cpsat import det_budget
            det = det_budget(time_limit, len(cands))
        jobs = max(1, jobs or os.cpu_count() or 1)
        # a deeper ring only removes constraints, so a tiling's optimum bounds every shallower twin from below;
        # solve the deepest first and let its optimum prune the rest
        lbs = {c[2].tie: c[0] for c in cands}
        lat_lbs = {c[2].tie: c[6] for c in cands}
        todo = sorted(cands, key=lambda c: (c[0], -c[1].get("depth", 0), c[2].tie))
        pool: Any = None
        if executor == "ray":
            pool = _RayPool()
        elif executor == "process" and jobs > 1 and len(todo) > 1:
            pool = ProcessPoolExecutor(max_workers=jobs)
        running: dict[Any, tuple] = {}
        try:
            while todo or running:
                while todo and len(running) < (jobs if pool is not None else 1) and time.perf_counter() < deadline:
                    c = todo.pop(0)
                    # prune only what cannot win even the tie-break (time, slot latency, tiling key): a serial
                    # search, which prunes more, and a parallel one then return the same program
                    k = c[2].tie
                    if (lbs[k], lat_lbs[k], k) > (inc_obj, inc_lat, inc_key):
                        own[k] = lbs[k]
                        continue
                    left = time_limit if deterministic else max(0.2, deadline - time.perf_counter())
                    # no cut-off at the incumbent: CP-SAT proves "no better than X" far slower than "optimum is Y"
                    args = (c[2].graph.to_json(), hw, solver, left, placement, c[3].to_json(), None,
                            k not in compiled, *(() if det is None else (det,)))
                    running[pool.submit(_worker, *args) if pool is not None else _Done(_worker(*args))] = c
                if not running:
                    break
                done = _first_done(list(running), pool)
                for fut in done:
                    c = running.pop(fut)
                    pj, st = fut.result()
                    solved += 1
                    prog = SProgram.from_json(pj) if pj else None
                    obj, lat = claimed(prog, hw) if prog else (None, None)
                    status = st["status"]
                    if status == "OPTIMAL" and (st.get("objective") != obj or not replays(prog, hw)):
                        # the optimum is of the model's number; if the replay disagrees, nothing is proven
                        say(f"tiling {c[1]}: {solver}'s optimum {st.get('objective')} cycles is not what the "
                            f"program replays to ({obj}); keeping it unproven")
                        status = "FEASIBLE"
                    # equal objectives go to the smaller slot latency, then the smaller tiling key, so parallel
                    # solves finishing in any order give the same answer
                    if obj is not None and (obj, lat, c[2].tie) < (inc_obj, inc_lat, inc_key):
                        inc_prog, inc_obj, inc_lat, inc_key = prog, obj, lat, c[2].tie
                    # a tiling solved to optimality cannot beat its own optimum; otherwise its proven bound
                    b = (obj if status == "OPTIMAL" and obj is not None else
                         inc_obj if status == "INFEASIBLE" else
                         max(c[0], st.get("bound") or 0) if status == "TIME_LIMIT" else c[0])
                    own[c[2].tie] = b
                    if status == "TIME_LIMIT":
                        limited.add(c[2].tie)
                    for o in todo:
                        if _twin(o[1], c[1]) and o[1].get("depth", 0) < c[1].get("depth", 0):
                            lbs[o[2].tie] = max(lbs[o[2].tie], b)
                            if status == "OPTIMAL" and lat is not None:
                                lat_lbs[o[2].tie] = max(lat_lbs[o[2].tie], lat)
                    say(f"tiling {c[1]}: {status} in {st.get('solve_s', 0):.2f} s; best {inc_obj} cycles")
        except BaseException:
            _stop(pool)  # SIGINT (KeyboardInterrupt) or an error: no worker may outlive the search
            raise
        finally:
            if pool is not None:
                pool.shutdown(cancel_futures=True) if not isinstance(pool, _RayPool) else pool.shutdown()
        for c in todo:  # not reached before the deadline
            own[c[2].tie] = lbs[c[2].tie]
            limited.add(c[2].tie)
        bounds, timed_out = _settle([(c[1], c[2].tie) for c in cands], own, limited, inc_obj)
    if inc_obj == math.inf:
        raise InfeasibleError(f"{solver} found no schedule of {what} within {time_limit:g} s"
                              + (" of CP-SAT deterministic time" if deterministic else "") + "; raise time_limit")
    bound = min([*bounds, inc_obj])
    status = ("FEASIBLE" if solver == "greedy" else "OPTIMAL" if bound >= inc_obj else
              "TIME_LIMIT" if timed_out else "FEASIBLE")
    if solver == "cpsat" and status == "OPTIMAL":
        inc_prog = _polish(inc_prog, [c[2] for c in cands], hw, say)
    if not isinstance(op, STaskGraph) and "depth" not in (fix or {}):  # a given graph or depth is the caller's
        inc_prog = _deepen(inc_prog, hw, say, exclude)
    inc_prog = _relabel(inc_prog, solver, status)
    us = hw.cycles_to_us(inc_obj) + hw.launch_us
    return Result(program=inc_prog, solver=solver, status=status, objective=inc_obj, bound=bound,
                  solve_s=time.perf_counter() - t0, predicted_us=us,
                  tflops=inc_prog.graph.useful_flops / (us * 1e-6) / 1e12, hw=hw.name,
                  tiling=dict(inc_prog.graph.tiling), tilings=len(cands), solved=solved,
                  features=tuple(features(inc_prog, hw)), provenance=stamp())


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


def _exhaustive_fits(cands: list[tuple], what: str) -> None:
    """Refuse, before any solve, an exhaustive search none of whose tilings is small enough to enumerate."""
    from .policies import exhaustive

    if not any(len(c[2].tasks) <= exhaustive.MAX_TASKS and c[2].horizon <= exhaustive.MAX_HORIZON for c in cands):
        n = min(len(c[2].tasks) for c in cands)
        raise SolverError(f"solver 'exhaustive' enumerates every schedule of graphs of at most {exhaustive.MAX_TASKS} "
                          f"tasks and a horizon of {exhaustive.MAX_HORIZON} grains (tests' tiny graphs); {what} has "
                          f"{n}+ tasks per CTA: use solver 'cpsat' or 'milp'")


def _stop(pool: Any) -> None:
    """End a pool's workers now (ProcessPoolExecutor.shutdown waits for running solves, up to their time limit)."""
    if isinstance(pool, _RayPool):
        pool.cancel()
    elif isinstance(pool, ProcessPoolExecutor):
        procs = list((getattr(pool, "_processes", None) or {}).values())  # no public API lists them
        for pr in procs:
            pr.terminate()
        for pr in procs:
            pr.join(5)


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
    """Name the policy that returned ``p``: an exact solver may keep greedy's program, proven optimal or not."""
    if p.policy == solver:
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

