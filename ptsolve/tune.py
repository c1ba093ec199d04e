"""Measured selection: the model's K best distinct schedules, timed on the GPU, the fastest kept.

``candidates`` starts from ``optimize``'s own answer (the first choice, whatever its compiler in the loop kept),
then walks an operator's tilings in order of their lower bound, solves each (ptsolve.optimize on that tiling's
graph, so solves are cached), drops those whose kernel the compiler rejects (ptsolve.kernelcheck) and stops once K
compile-clean schedules are found and no remaining tiling's bound can beat the K-th: the K best distinct schedules.
With several policies (``solver="cpsat,greedy"``) each tiling also contributes every policy's schedule whose order
differs (the orders and stages that make a different kernel), so a measured selection can pick an order
the model ranks lower on the same tiling. ``tune`` times them with a ``runner`` (a code generator's:
codegen.tune_runner.runner compiles and times them in one process on this machine's GPU, or one worker per GPU) and
returns the measured best as a Result whose ``measured_us`` is set, cached (ptsolve.cache, keyed by operator, table,
K and policy) so the next ``tune`` of that shape times nothing. Without a GPU, ``--prepare`` writes the candidates for a
GPU machine to time (codegen.tune_runner) and ``finish`` turns its times into the same cached Result.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .errors import InfeasibleError, PtsolveError
from .hw import DEFAULT_HW, Hardware, load
from .kernelcheck import KernelCheck
from .kernelcheck import runner as find_runner
from .opspec import Operator
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


def order_key(p: Any) -> tuple:
    """What makes two schedules of one graph different kernels: each role's tasks in issue order with their
    stages, and the ring depths and copies (start times that keep all of these are the same kernel)."""
    from .cost import stream_of
    by = sorted(p.graph.tasks, key=lambda t: (stream_of(t), p.start[t.name] % p.ii if t.phase == "loop" else -1,
                                              p.start[t.name], t.name))
    return (tuple((stream_of(t), t.name, p.start[t.name] // p.ii if t.phase == "loop" else t.phase) for t in by),
            tuple(sorted(p.rings.items())), tuple(sorted(p.copies.items())))


@dataclass
class _Pool:
    """The candidates found so far, each kernel (tiling, order_key) once, with its compile check."""

    found: list[Result] = field(default_factory=list)
    checks: list[KernelCheck] = field(default_factory=list)
    have: set[tuple] = field(default_factory=set)

    def add(self, r: Result, c: KernelCheck) -> bool:
        """Keep ``r``; False where the same kernel is already kept (another policy's, or optimize's answer)."""
        i = (tuple(sorted(r.tiling.items())), order_key(r.program))
        if i in self.have:
            return False
        self.have.add(i)
        self.found.append(r)
        self.checks.append(c)
        return True


def _check_of(r: Result) -> KernelCheck:
    return KernelCheck(**r.kernel_check) if r.kernel_check else KernelCheck("not compile-checked", "check=False")


def _policies(solver: str, deterministic: bool) -> tuple[str, ...]:
    """The distinct comma-separated policies of ``solver``, each checked against ``deterministic`` before any solve
    (a MILP among them refuses it)."""
    from .search import check_deterministic

    solvers = tuple(dict.fromkeys(x.strip() for x in solver.split(",")))
    if not all(solvers):
        raise PtsolveError(f"tune: solver {solver!r} names an empty policy; give e.g. cpsat or cpsat,greedy")
    for pol in solvers:
        check_deterministic(pol, "even", deterministic)
    return solvers


def _bounded(op: Operator, hw: Hardware, fix: dict[str, int] | None) -> list[tuple[int, tuple, Any]]:
    """(lower bound, tie key, graph) of every tiling of ``op`` that fits ``hw``, best bound first."""
    from .search import _fixed, lower_bound

    bounded = []
    for t in _fixed(op, fix):
        g = op.graph(t, hw)
        if fits(g, hw) is None:
            P = build(g, hw)
            bounded.append((lower_bound(P), P.tie, g))
    if not bounded:
        raise InfeasibleError(f"no tiling of {op.describe()} fits {hw.name}")
    return sorted(bounded, key=lambda x: (x[0], x[1]))


def _per_structure(op: Operator, hw: str | Hardware, k: int, per: Sequence[str], fix: dict[str, int] | None,
                   **kw: Any) -> tuple[list[Candidate], list[tuple[dict, str]]]:
    """``candidates`` for every combination of the ``per`` keys' values, ranked together by prediction."""
    from .search import _fixed, answer_key

    opt = op.spec.optional
    combos = sorted({tuple(t.get(x, opt.get(x)) for x in per) for t in _fixed(op, fix, per)},
                    key=lambda v: tuple(-1 if x is None else x for x in v))
    got: list[Candidate] = []
    rej: list[tuple[dict, str]] = []
    for v in combos:
        try:
            cs, rs = candidates(op, hw, k, fix=(fix or {}) | dict(zip(per, v)), **kw)
        except InfeasibleError:
            continue  # no tiling of this structure fits
        got += cs
        rej += rs
    if not got:
        raise InfeasibleError(f"no tiling of {op.describe()} fits {load(hw).name}")
    got.sort(key=lambda c: answer_key(c.result.program, load(hw)))
    return [replace(c, rank=n) for n, c in enumerate(got)], rej


def candidates(op: Operator, hw: str | Hardware, k: int = 5, solver: str = "cpsat", time_limit: float = 30.0,
               check: bool = True, progress: Callable[[str], None] | None = None,
               fix: dict[str, int] | None = None, per: Sequence[str] = (),
               deterministic: bool = False, deadline: float | None = None
               ) -> tuple[list[Candidate], list[tuple[dict, str]]]:
    """The ``k`` best distinct compile-clean schedules of ``op`` (best predicted first) and the tilings the
    compiler rejected on the way, with why. ``solver``: one policy, or several comma-separated (each tiling then
    gives one schedule per distinct order, ``order_key``). ``check`` False (or no checker for ``hw.arch``) keeps
    every schedule, marked "not compile-checked". ``fix``: only the tilings with these values (as ``optimize``'s).
    ``per``: tiling keys that pick a kernel structure (GEMM: ``pingpong``): the ``k`` best of every combination of
    their values, ranked together by prediction, so a structure the model ranks below another still gets timed.
    ``deterministic``: reproducible solves (ptsolve.optimize's), ``time_limit`` CP-SAT deterministic time per tiling.
    ``deadline`` (``time.time()`` seconds, wall-clock runs only): no search runs past it, and the walk stops there
    with the candidates it has."""
    from .optimize import optimize
    from .search import answer_key

    if per:
        return _per_structure(op, hw, k, per, fix, solver=solver, time_limit=time_limit, check=check,
                              progress=progress, deterministic=deterministic, deadline=deadline)
    solvers = _policies(solver, deterministic)
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise PtsolveError(f"top_k must be a positive integer, got {k!r}")
    hw = load(hw)
    say = progress or (lambda s: None)
    bounded = _bounded(op, hw, fix)

    def limit() -> float:  # each search within what the deadline leaves
        if deadline is None or deterministic:
            return time_limit
        return min(time_limit, max(0.5, deadline - time.time()))

    pool, rejected = _Pool(), []
    deepened: dict[tuple, dict[str, int]] = {}  # deepened tiling -> the searched tiling it came from
    # optimize's own answer is a candidate: its compiler in the loop may keep a tiling the walk below drops (the
    # first rejected tiling with the operator's declared issue order, optimize._compiler_in_the_loop), and the first
    # choice must be among what is timed
    try:
        first = optimize(op, hw, solver=solvers[0], time_limit=limit(), compile_check=check, fix=fix,
                         deterministic=deterministic)
    except InfeasibleError:
        first = None
    if first is not None and (c := _check_of(first)).status not in ("rejected", "unsupported"):
        pool.add(first, c)
        say(f"optimize's answer {first.tiling} {first.program.policy}: {first.predicted_us:.1f} µs predicted")
    from .optimize import checker  # the one optimize asks, read now (tests replace it there)
    unbuilt = getattr(checker(hw) if check else None, "buildable", None) or (lambda g: None)
    for lb, _, g in bounded:
        if len(pool.found) >= k and lb >= sorted(r.objective for r in pool.found)[k - 1]:
            break
        why = unbuilt(g)
        if why:  # the code generator builds no schedule of it: not solved (optimize's search skips it too)
            rejected.append((dict(g.tiling), f"unsupported: {why}"))
            continue
        if pool.found and deadline is not None and not deterministic and time.time() > deadline:
            say(f"the time limit ran out with {len(pool.found)} candidate(s)")
            break
        for pol in solvers:
            r = optimize(g, hw, solver=pol, time_limit=limit(), compile_check=check, deterministic=deterministic)
            if "depth" not in (fix or {}):  # the ring optimize gives an operator's winner (a graph keeps its own)
                r = _deepened(r, hw, check)
                if deepened.setdefault(tuple(sorted(r.tiling.items())), g.tiling) != g.tiling:
                    continue  # a shallower twin's ring deepened to one a better-ranked candidate has already
            c = _check_of(r)
            if c.status in ("rejected", "unsupported"):
                rejected.append((dict(g.tiling), f"{c.status}: {c.reason}"))
                say(f"tiling {g.tiling}: {c.status} ({c.reason})")
                break  # the compiler judges the tiling's kernel, whichever policy ordered it
            if pool.add(r, c):
                say(f"tiling {g.tiling} {pol}: {r.predicted_us:.1f} µs predicted, {c.status}")
    found = pool.found
    order = sorted(range(len(found)), key=lambda i: (answer_key(found[i].program, hw),
                                                     solvers.index(found[i].program.policy)
                                                     if found[i].program.policy in solvers else 0))[:k]
    return [Candidate(n, found[i], pool.checks[i]) for n, i in enumerate(order)], rejected


def _deepened(r: Result, hw: Hardware, check: bool) -> Result:
    """``r`` with its ring deepened as ``optimize`` deepens a search's winner (search._deepen: the same replay
    checks), its kernel re-checked: the candidates are the kernels optimize would return. ``r`` where nothing
    deepens or the compiler refuses the deeper ring."""
    from .kernelcheck import checker
    from .search import _deepen

    p = _deepen(r.program, hw, lambda s: None, ())
    if p is r.program:
        return r
    chk = checker(hw) if check else None
    kc = chk(p, hw) if chk is not None else None
    if kc is not None and kc.status in ("rejected", "unsupported"):
        return r
    return replace(r, program=p, tiling=dict(p.graph.tiling), **({"kernel_check": kc.to_dict()} if kc else {}))


def key(op: Operator, hw: Hardware, top_k: int, solver: str, per: Sequence[str] = (),
        deterministic: float | None = None) -> str:
    """The schedule-cache key of a measured selection (the measured best depends on the table's device);
    ``deterministic``: the time limit of deterministic candidate solves (their candidates are keyed apart)."""
    from . import cache
    return cache.key("tune", op.to_json(), hw.to_dict(), top_k, solver, *((tuple(per),) if per else ()),
                     *((f"deterministic={float(deterministic)!r}",) if deterministic is not None else ()))


def choose(cands: Sequence[Result], us: Sequence[float], checks: Sequence[str],
           rejected: Sequence[tuple[dict, str]], solve_s: float) -> Result:
    """The fastest of ``cands`` (model's order; ties go to the model's earlier choice) as a Result with
    ``measured_us`` and every candidate's predicted and measured time in ``measured``."""
    if len(us) != len(cands):
        raise PtsolveError(f"tune: the runner returned {len(us)} times for {len(cands)} schedules")
    if not any(u < float("inf") for u in us):
        raise PtsolveError("tune: every candidate failed its correctness check on the GPU; see the runner's log")
    best = min(range(len(cands)), key=lambda i: (us[i], i))
    measured = tuple({"rank": i, "tiling": dict(r.tiling), "predicted_us": r.predicted_us, "measured_us": u,
                      "check": c} for i, (r, u, c) in enumerate(zip(cands, us, checks)))
    return replace(cands[best], measured_us=us[best], measured=measured, solve_s=solve_s,
                   rejected=tuple((t, why) for t, why in rejected))


def tune(op: Operator, hw: str | Hardware = DEFAULT_HW, top_k: int = 5, runner: Runner | None = None,
         solver: str = "cpsat", time_limit: float = 30.0, progress: Callable[[str], None] | None = None,
         cache: bool = True, per: Sequence[str] = (), deterministic: bool = False,
         deadline: float | None = None) -> Result:
    """The measured best of the model's ``top_k`` best compile-clean schedules. ``runner(programs, hw)`` returns
    their kernel times in µs (default: the code generator's, codegen.tune_runner.runner, which needs a GPU). The Result
    is the chosen schedule's, with ``measured_us`` and, in ``measured``, every candidate's predicted and measured
    time; the model's own first choice is candidate 0. A measured selection of the same shape, table, K and
    policy already in the schedule cache is returned without timing anything (``cache`` False times again).
    ``deterministic``: the candidates are solved reproducibly (``candidates``); the timing is the GPU's. ``hw``
    defaults to ptsolve.hw.DEFAULT_HW like every entry point; name the timing GPU's table (e.g. h200) to match it."""
    from . import cache as store

    hw = load(hw)
    k = key(op, hw, top_k, solver, per, time_limit if deterministic else None)
    if cache and (hit := store.get(k, time_limit)) is not None and hit.measured_us is not None:
        return hit
    t0 = time.perf_counter()
    cands, rejected = candidates(op, hw, top_k, solver, time_limit, progress=progress, per=per,
                                 deterministic=deterministic, deadline=deadline)
    if runner is None:
        runner = find_runner(hw)
        if runner is None:
            raise PtsolveError(f"tune: no kernel runner for {hw.arch} is installed (codegen registers one); time the "
                               "candidates elsewhere: ptsolve tune --prepare, then python3 -m codegen.tune_runner on "
                               "the GPU")
    us = list(runner([c.result.program for c in cands], hw))
    r = choose([c.result for c in cands], us, [c.check.status for c in cands], rejected, time.perf_counter() - t0)
    store.put(k, time_limit, r)
    return r


def finish(op: Operator, hw: str | Hardware, doc: dict[str, Any]) -> Result:
    """The measured selection of a ``--prepare`` document timed on a GPU machine (``measured_us`` added by
    ``python3 -m codegen.tune_runner``), cached as ``tune`` would have cached it."""
    from . import cache as store

    hw = load(hw)
    if doc.get("params") != op.params or doc.get("op") != op.op:
        raise PtsolveError(f"tune --finish: the file holds candidates of {doc.get('op')} {doc.get('params')}, not of "
                           f"{op.op} {op.params}")
    if "measured_us" not in doc:
        raise PtsolveError("tune --finish: the file has no measured_us; time it first: python3 -m "
                           "codegen.tune_runner FILE --out TIMED")
    cands = [Result.from_json(c["result"]) for c in doc["candidates"]]
    r = choose(cands, doc["measured_us"], [c["check"] for c in doc["candidates"]],
               [(t, why) for t, why in doc.get("rejected", [])], 0.0)
    store.put(key(op, hw, doc["top_k"], doc["solver"], doc.get("per", ()),
                  doc["time_limit"] if doc.get("deterministic") else None), doc["time_limit"], r)
    return r
