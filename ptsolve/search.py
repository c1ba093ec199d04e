"""Joint search over tilings: bound every tiling, schedule the promising ones, keep the best.

Every tiling that fits the EU gets a lower bound (the resource / recurrence bound on ii and the
critical path on the span, put through the placement) and a greedy schedule (an upper bound). Exact
policies then solve tilings in order of their bound until the bound reaches the best schedule found:
the rest cannot win. Solves run in a process pool (or on Ray, or serially). ``decoupled=True`` is
the paper's ablation: pick the tiling by its roofline bound alone, then schedule only that one.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import replace
from typing import Any

from .errors import InfeasibleError, PtsolveError, SolverError
from .hw import Hardware, load
from .ir import STaskGraph
from .ops.base import Operator
from .policies import SOLVERS
from .policies import greedy as greedy_mod
from .policies.model import Problem, build, fits
from .program import SProgram
from .provenance import stamp
from .report import features
from .result import Result
from .simulate import claimed

EXECUTORS = ("process", "serial", "ray")


def span_lower_bound(P: Problem) -> int:
    """Longest path through the zero-distance precedences plus the last task's duration, cycles."""
    order = P.graph.topo_order()
    est = dict.fromkeys(order, 0)
    for t in order:
        for u, v, d, lat in P.prec:
            if u == t and d == 0:
                est[v] = max(est[v], est[t] + lat)
    return max(est[t] + P.end(t) for t in order)


def lower_bound(P: Problem) -> int:
    """No schedule of this tiling beats this many kernel cycles."""
    return P.objective(P.ii_lb, span_lower_bound(P)) * P.grain


def latency_lower_bound(P: Problem) -> int:
    """No schedule of this tiling has a busiest SM slot under this many cycles (ptsolve.simulate.claimed)."""
    return P.latency(P.ii_lb, span_lower_bound(P)) * P.grain


def solve_one(P: Problem, solver: str, time_limit: float, hint: SProgram | None, ii_max: int | None,
              workers: int = 1) -> tuple[SProgram | None, dict[str, Any]]:
    """Run one policy on one tiling's problem."""
    if solver == "greedy":
        return greedy_mod.solve(P)
    if solver == "cpsat":
        from .policies import cpsat
        return cpsat.solve(P, time_limit=time_limit, num_workers=workers, hint=hint, ii_max=ii_max)
    if solver.startswith("milp"):
        from .policies import milp
        backend = solver.split("-", 1)[1] if "-" in solver else "highs"
        return milp.solve(P, time_limit=time_limit, backend=backend, hint=hint, ii_max=ii_max)
    if solver == "exhaustive":
        from .policies import exhaustive
        return exhaustive.solve(P, time_limit=time_limit)
    raise SolverError(f"unknown solver {solver!r}; use one of {SOLVERS} (milp-highs, milp-cbc pick the backend)")


def _worker(graph_json: str, hw: Hardware, solver: str, time_limit: float, placement: str,
            hint_json: str | None, ii_max: int | None) -> tuple[str | None, dict[str, Any]]:
    P = build(STaskGraph.from_json(graph_json), hw, placement)
    hint = SProgram.from_json(hint_json) if hint_json else None
    prog, st = solve_one(P, solver, time_limit, hint, ii_max)
    return (prog.to_json() if prog else None), st


def _fixed(op: Operator, fix: dict[str, int] | None) -> list[dict[str, int]]:
    tilings = op.tilings()
    if not fix:
        return tilings
    keys = sorted(set().union(*tilings))
    unknown = sorted(set(fix) - set(keys))
    if unknown:
        raise PtsolveError(f"fix: {op.op} tilings have no key(s) {unknown}; they have {keys}")
    out = [t for t in tilings if all(t.get(k) == v for k, v in fix.items())]
    if not out:
        raise PtsolveError(f"fix {fix}: no tiling of {op.describe()} has these values; "
                           f"e.g. {', '.join(str(t) for t in tilings[:3])}")
    return out


def check_solver(solver: str) -> None:
    """Raise SolverError for a solver name ptsolve does not know."""
    if solver not in (*SOLVERS, "milp-highs", "milp-cbc"):
        raise SolverError(f"unknown solver {solver!r}; use one of greedy, cpsat, milp (= milp-highs), milp-cbc, "
                          "exhaustive")


def search(op: Operator | STaskGraph, hw: Hardware | str, solver: str = "cpsat", time_limit: float = 30.0,
           placement: str = "even", executor: str = "process", jobs: int | None = None, decoupled: bool = False,
           fix: dict[str, int] | None = None, progress: Callable[[str], None] | None = None) -> Result:
    """Find the best (tiling, schedule) of ``op`` on ``hw`` with ``solver``; ``time_limit`` in seconds
    bounds the whole search; ``fix`` keeps only the tilings with those key values. A graph instead of an
    operator is scheduled as it is (one tiling)."""
    check_solver(solver)
    if not time_limit > 0:
        raise SolverError(f"time_limit must be > 0 seconds, got {time_limit!r}")
    if executor not in EXECUTORS:
        raise SolverError(f"unknown executor {executor!r}; use one of {EXECUTORS}")
    hw = load(hw)
    t0 = time.perf_counter()
    say = progress or (lambda s: None)
    cands: list[tuple[int, dict[str, int], Problem, SProgram, int]] = []
    reasons = []
    graphs = [op] if isinstance(op, STaskGraph) else [op.graph(t) for t in _fixed(op, fix)]
    for g in graphs:
        t = g.tiling
        why = fits(g, hw)
        if why:
            reasons.append(f"{t}: {why}")
            continue
        P = build(g, hw, placement)
        gp, _ = greedy_mod.solve(P)
        cands.append((lower_bound(P), t, P, gp, *claimed(gp, hw), latency_lower_bound(P)))
    if not cands:
        what = op.name if isinstance(op, STaskGraph) else op.describe()
        raise InfeasibleError(f"no tiling of {what} fits {hw.name}: " + "; ".join(reasons[:4])
                              + (f" (and {len(reasons) - 4} more)" if len(reasons) > 4 else ""))
    cands.sort(key=lambda c: (c[0], sorted(c[1].items())))
    if decoupled:
        cands = cands[:1]
    say(f"{len(cands)} tilings fit; greedy best {min(c[4] for c in cands)} cycles")
    # ties in kernel time (a shared-unit floor) go to the smaller slot latency, then to the smaller tiling key
    best = min(cands, key=lambda c: (c[4], c[5], _key(c[1])))
    inc_prog, inc_obj, inc_lat = best[3], best[4], best[5]
    bounds = [c[0] for c in cands]  # greedy proves nothing: the roofline bounds stand
    solved = len(cands)
    if solver != "greedy":
        bounds, solved = [], 0
        deadline = t0 + time_limit
        jobs = max(1, jobs or os.cpu_count() or 1)
        # a deeper ring only removes constraints, so a tiling's optimum bounds every shallower twin from below;
        # solve the deepest first and let its optimum prune the rest
        lbs = {_key(c[1]): c[0] for c in cands}
        lat_lbs = {_key(c[1]): c[6] for c in cands}
        todo = sorted(cands, key=lambda c: (c[0], -c[1].get("depth", 0), sorted(c[1].items())))
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
                    if (lbs[_key(c[1])], lat_lbs[_key(c[1])]) >= (inc_obj, inc_lat):
                        bounds.append(lbs[_key(c[1])])
                        continue
                    left = max(0.2, deadline - time.perf_counter())
                    # no cut-off at the incumbent: CP-SAT proves "no better than X" far slower than "optimum is Y"
                    args = (c[2].graph.to_json(), hw, solver, left, placement, c[3].to_json(), None)
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
                    # equal objectives go to the smaller slot latency, then the smaller tiling key, so parallel
                    # solves finishing in any order give the same answer
                    if obj is not None and (obj, lat, _key(c[1])) < (inc_obj, inc_lat, _key(inc_prog.graph.tiling)):
                        inc_prog, inc_obj, inc_lat = prog, obj, lat
                    # a tiling solved to optimality cannot beat its own optimum; otherwise its proven bound
                    b = (obj if st["status"] == "OPTIMAL" and obj is not None else
                         max(c[0], st.get("bound") or 0) if st["status"] != "INFEASIBLE" else inc_obj)
                    bounds.append(b)
                    for o in todo:
                        if _twin(o[1], c[1]) and o[1].get("depth", 0) < c[1].get("depth", 0):
                            lbs[_key(o[1])] = max(lbs[_key(o[1])], b)
                            if st["status"] == "OPTIMAL" and lat is not None:
                                lat_lbs[_key(o[1])] = max(lat_lbs[_key(o[1])], lat)
                    say(f"tiling {c[1]}: {st['status']} in {st.get('solve_s', 0):.2f} s; best {inc_obj} cycles")
        finally:
            if pool is not None:
                pool.shutdown(cancel_futures=True) if not isinstance(pool, _RayPool) else pool.shutdown()
        bounds += [lbs[_key(c[1])] for c in todo]  # pruned (bound >= incumbent) or not reached before the deadline
    bound = min([*bounds, inc_obj])
    status = "FEASIBLE" if solver == "greedy" else "OPTIMAL" if bound >= inc_obj else "TIME_LIMIT"
    inc_prog = _relabel(inc_prog, solver)
    us = hw.cycles_to_us(inc_obj) + hw.launch_us
    return Result(program=inc_prog, solver=solver, status=status, objective=inc_obj, bound=bound,
                  solve_s=time.perf_counter() - t0, predicted_us=us,
                  tflops=inc_prog.graph.useful_flops / (us * 1e-6) / 1e12, hw=hw.name,
                  tiling=dict(inc_prog.graph.tiling), tilings=len(cands), solved=solved,
                  features=tuple(features(inc_prog, hw)), provenance=stamp())


def _key(t: dict[str, int]) -> tuple:
    return tuple(sorted(t.items()))


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


def _relabel(p: SProgram, solver: str) -> SProgram:
    """Name the policy that returned ``p``: an exact solver may keep greedy's program, proven optimal."""
    return p if p.policy == solver else replace(p, policy=f"{solver} (greedy's schedule, proven optimal)" if
                                                   p.policy == "greedy" else solver)


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

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        ref = self.remote.remote(*args)
        ray = self.ray

        class _F:
            def result(self) -> Any:
                return ray.get(ref)
        return _F()

    def shutdown(self) -> None:
        pass

