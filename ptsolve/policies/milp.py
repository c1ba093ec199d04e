"""Exact policy: the modulo-scheduling model of ptsolve.policies.cpsat as a MILP, through PuLP.

Same variables and constraints as the CP-SAT model. Like every solver it works in the Problem's grains
(``P.grain`` cycles each, see ptsolve.policies.model); the returned program, objective and bound are in
cycles.

- ``ii`` integer in [ii_lb, ii_hi]; loop task t starts at s_t = r_t + k_t·ii with 0 <= r_t <= ii - 1.
  The product k_t·ii is linearised with a one-hot stage z_tj (k_t = Σ_j j·z_tj) and y_tj = ii·z_tj,
  exact under the McCormick inequalities because z_tj is binary and ii is bounded:
  ii_lb·z <= y <= ii_hi·z,  ii - ii_hi·(1-z) <= y <= ii - ii_lb·(1-z).
- precedence (capacity edges included): s_v + dist·ii >= s_u + delay.
- loop reservations on one resource never overlap modulo ii: per pair (t, u) one binary o;
  o = 1: r_t + n_t <= r_u and r_u + n_u <= r_t + ii; o = 0 the mirror (big-M = ii_hi + longest
  reservation); each loop reservation is at most ii long.
- pre/pre and post/post reservations on one resource: one binary per pair orders them (big-M = horizon +
  longest reservation). Prologue reservations end before every loop reservation starts; epilogue
  reservations start after every loop and prologue reservation has ended (same frame as cpsat).
- CP-SAT's symmetry cuts s[x@g] <= s[x@g+1].
- pre >= s_t + P.end(t) for prologue tasks, last >= s_t + P.end(t) for the others; per distinct trip count n,
  x_n >= pre and x_n >= (n-1)·ii + last (program.cta_time); minimise obj >= Σ CTAs · x_n for every slot of
  P.slots.

Back-ends: ``highs`` (HiGHS through highspy, pulp.HiGHS) and ``cbc`` (the CBC binary: a ``cbc`` on PATH
via pulp.COIN_CMD, e.g. from ``pip install pulp[cbc]`` or apt ``coinor-cbc``, else the binary bundled with
PuLP via pulp.PULP_CBC_CMD). The objective is integral, so an absolute gap below one grain proves
optimality; both back-ends are told so.

A greedy ``hint`` is handed to HiGHS as a starting solution (highspy ``setSolution``; PuLP's HiGHS class
has no warm start), and to CBC as a MIP start (PuLP ``warmStart``), with CBC's preprocessing off: with it on,
the CBC 2.10 bundled with PuLP has called worse schedules optimal (see _cbc_solver). With either back-end a
time-limited run never answers worse than the hint, and an "optimum" worse than the hint is returned as the
hint with status FEASIBLE and no bound (the back-end's proof is wrong, so none is claimed).

The best bound is HiGHS's MIP dual bound (``Highs.getInfo().mip_dual_bound``) and, for CBC, the
"Lower bound" its log reports (None when the log has none). The solution is rounded to integers,
re-checked against the exact constraints (ptsolve.policies.exhaustive.violations) and its objective
recomputed from the program, so the returned objective is exact whatever the solver's tolerances.
"""
from __future__ import annotations

import contextlib
import math
import os
import re
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from typing import Any

from ..errors import SolverError
from ..program import SProgram, cta_time
from .cpsat import _symmetry_task
from .exhaustive import latency_of, to_grains, violations
from .model import Problem

BACKENDS = ("highs", "cbc")


def _require_pulp() -> Any:
    try:
        import pulp
    except ImportError as e:  # pragma: no cover - depends on the install
        raise SolverError("solver 'milp' needs PuLP: pip install pulp highspy") from e
    return pulp


def _var(m: Any, name: str, lo: float | None = None, hi: float | None = None, cat: str = "Continuous") -> Any:
    """A variable of ``m``: prob.add_variable where PuLP has it (PuLP >= 3.3 deprecates bare LpVariable)."""
    add = getattr(m, "add_variable", None)
    if add is not None:
        return add(name, lo, hi, cat=cat)
    import pulp

    return pulp.LpVariable(name, lo, hi, cat=cat)


class _Model:
    """The PuLP problem and the variables needed to read a solution back or write a hint."""

    def __init__(self, P: Problem, ii_hi: int) -> None:
        pulp = _require_pulp()
        self.P, self.ii_hi = P, ii_hi
        m = pulp.LpProblem("ptsolve_modulo", pulp.LpMinimize)
        self.m = m
        # variables are created in a fixed order with deterministic names, so the solve is reproducible
        self.ii = _var(m, "ii", P.ii_lb, ii_hi, "Integer")
        self.kmax = P.horizon // max(P.ii_lb, 1)  # s_t = r_t + k_t·ii <= H bounds the stage
        self._timing_vars(pulp)
        s, ii = self.s, self.ii
        for e, (u, v, d, lat) in enumerate(P.prec):
            m += s[v] + d * ii >= s[u] + lat, f"prec_{e}"
        self.order: dict[tuple[str, int, int], Any] = {}  # (resource, i, j) -> order binary
        longest = max((n for us in P.res.values() for _, _, n in us), default=0)
        for ri, (res, uses) in enumerate(P.res.items()):
            loop = [(t, o, n) for t, o, n in uses if P.phase[t] == "loop"]
            self._loop_order(ri, res, loop, longest)
            self._once_order(ri, res, uses, loop, longest)
        for c, (a, b) in enumerate(_symmetry_task(P)):
            m += s[a] <= s[b], f"sym_{c}"
        self._objective(pulp)

    def _timing_vars(self, pulp: Any) -> None:
        """Start ``s`` of every task; a loop task's slot ``r`` and its stage as one-hot ``z`` with ``y_j`` = z_j·ii
        (McCormick), so s = r + sum j·y_j stays linear in the variable ii."""
        P, m, ii_hi = self.P, self.m, self.ii_hi
        self.s: dict[str, Any] = {}
        self.r: dict[str, Any] = {}
        self.z: dict[str, list[Any]] = {}
        self.y: dict[str, list[Any]] = {}
        for i, t in enumerate(P.tasks):
            self.s[t] = _var(m, f"s_{i}", 0, P.horizon, "Integer")
            if P.phase[t] != "loop":
                continue
            self.r[t] = _var(m, f"r_{i}", 0, ii_hi - 1, "Integer")
            m += self.r[t] <= self.ii - 1, f"slot_{i}"
            z = [_var(m, f"z_{i}_{j}", 0, 1, "Binary") for j in range(self.kmax + 1)]
            y = [_var(m, f"y_{i}_{j}", 0, ii_hi) for j in range(self.kmax + 1)]
            m += pulp.lpSum(z) == 1, f"onehot_{i}"
            for j in range(1, self.kmax + 1):  # y_t0 has coefficient 0: no need to tie it to ii
                m += y[j] <= ii_hi * z[j], f"mc1_{i}_{j}"
                m += y[j] >= P.ii_lb * z[j], f"mc2_{i}_{j}"
                m += y[j] <= self.ii - P.ii_lb * (1 - z[j]), f"mc3_{i}_{j}"
                m += y[j] >= self.ii - ii_hi * (1 - z[j]), f"mc4_{i}_{j}"
            m += self.s[t] == self.r[t] + pulp.lpSum(j * y[j] for j in range(1, self.kmax + 1)), f"start_{i}"
            self.z[t], self.y[t] = z, y

    def _loop_order(self, ri: int, res: str, loop: list[tuple[str, int, int]], longest: int) -> None:
        """Loop reservations of unit ``res`` never overlap modulo ii: an order binary per pair (big-M)."""
        m, ii = self.m, self.ii
        for t, o, _n in loop:
            if o:
                raise SolverError(f"milp model assumes reservations start with their task ({t} on {res})")
        M = self.ii_hi + longest
        for a, (t, _, n) in enumerate(loop):
            m += ii >= n, f"len_{ri}_{a}"
            for b in range(a + 1, len(loop)):
                u, _, nu = loop[b]
                x = _var(m, f"o_{ri}_{a}_{b}", 0, 1, "Binary")
                self.order[(res, a, b)] = x
                rt, ru = self.r[t], self.r[u]
                # x = 1: t's slot first, and u ends before t's next iteration; x = 0: the mirror
                m += rt + n <= ru + M * (1 - x), f"mo1_{ri}_{a}_{b}"
                m += ru + nu <= rt + ii + M * (1 - x), f"mo2_{ri}_{a}_{b}"
                m += ru + nu <= rt + M * x, f"mo3_{ri}_{a}_{b}"
                m += rt + n <= ru + ii + M * x, f"mo4_{ri}_{a}_{b}"

    def _once_order(self, ri: int, res: str, uses: list[tuple[str, int, int]], loop: list[tuple[str, int, int]],
                    longest: int) -> None:
        """Prologue and epilogue reservations of ``res``: ordered among themselves (order binaries), the prologue's
        before every loop reservation, the epilogue's after every loop and prologue one."""
        P, m, s = self.P, self.m, self.s
        M1 = P.horizon + longest
        for ph in ("pre", "post"):
            once = [(t, o, n) for t, o, n in uses if P.phase[t] == ph]
            for a, (t, o, n) in enumerate(once):
                for b in range(a + 1, len(once)):
                    u, ou, nu = once[b]
                    x = _var(m, f"p_{ph}_{ri}_{a}_{b}", 0, 1, "Binary")
                    self.order[(f"{ph}:{res}", a, b)] = x
                    m += s[t] + o + n <= s[u] + ou + M1 * (1 - x), f"po1_{ph}_{ri}_{a}_{b}"
                    m += s[u] + ou + nu <= s[t] + o + M1 * x, f"po2_{ph}_{ri}_{a}_{b}"
            for a, (t, o, n) in enumerate(once):
                for b, (u, ou, nu) in enumerate(loop):
                    if ph == "pre":
                        m += s[t] + o + n <= s[u] + ou, f"pl_{ri}_{a}_{b}"
                    else:
                        m += s[t] + o >= s[u] + ou + nu, f"lp_{ri}_{a}_{b}"
        pre = [(u, ou, nu) for u, ou, nu in uses if P.phase[u] == "pre"]
        post = [(t, o, n) for t, o, n in uses if P.phase[t] == "post"]
        for a, (t, o, _n) in enumerate(post):
            for b, (u, ou, nu) in enumerate(pre):
                m += s[t] + o >= s[u] + ou + nu, f"pp_{ri}_{a}_{b}"

    def _objective(self, pulp: Any) -> None:
        """The slots' latency, minimised."""
        P, m, s, ii, H = self.P, self.m, self.s, self.ii, self.P.horizon
        # program.cta_time per distinct trip count n: x_n >= pre, x_n >= (n-1)·ii + last (only positive
        # coefficients in the objective, so each x_n settles on that max)
        self.pre = _var(m, "pre", 0, 2 * H, "Integer")
        self.last = _var(m, "last", 0, 2 * H, "Integer")
        for i, t in enumerate(P.tasks):
            m += (self.pre if P.phase[t] == "pre" else self.last) >= s[t] + P.end(t), f"end_{i}"
        self.x = {}
        for n in P.trips:
            self.x[n] = _var(m, f"x_{n}", 0, (n - 1) * self.ii_hi + 2 * H, "Integer")
            m += self.x[n] >= self.pre, f"xpre_{n}"
            m += self.x[n] >= (n - 1) * ii + self.last, f"xlast_{n}"
        big = max(sum(c * ((n - 1) * self.ii_hi + 2 * H) for n, c in h) for h in P.slots)
        self.obj = _var(m, "obj", 0, big, "Integer")
        for c, h in enumerate(P.slots):
            m += self.obj >= pulp.lpSum(k * self.x[n] for n, k in h) - (sum(k for _, k in h) - 1) * P.handover, \
                f"obj_{c}"
        m += self.obj

    def hint_values(self, ii: int, S: dict[str, int]) -> dict[str, float] | None:
        """A complete assignment (variable name -> value) for the schedule (ii, S) in grains, or None if it
        is not a solution of the model (symmetry cuts included)."""
        P = self.P
        if not P.ii_lb <= ii <= self.ii_hi or violations(P, ii, S, symmetry=True):
            return None
        vals: dict[str, float] = {self.ii.name: ii}
        for t in P.tasks:
            vals[self.s[t].name] = S[t]
            if t in self.r:
                k = S[t] // ii
                if k > self.kmax:
                    return None
                vals[self.r[t].name] = S[t] % ii
                for j, (z, y) in enumerate(zip(self.z[t], self.y[t])):
                    vals[z.name] = float(j == k)
                    vals[y.name] = float(ii if j == k else 0)
        for res, uses in P.res.items():
            loop = [t for t, _, _ in uses if P.phase[t] == "loop"]
            for a, t in enumerate(loop):
                for b in range(a + 1, len(loop)):
                    vals[self.order[(res, a, b)].name] = float(S[t] % ii < S[loop[b]] % ii)
            for ph in ("pre", "post"):
                once = [t for t, _, _ in uses if P.phase[t] == ph]
                for a, t in enumerate(once):
                    for b in range(a + 1, len(once)):
                        vals[self.order[(f"{ph}:{res}", a, b)].name] = float(S[t] < S[once[b]])
        pre, last = P.ends(S)
        vals[self.pre.name], vals[self.last.name] = pre, last
        for n, x in self.x.items():
            vals[x.name] = cta_time(n, ii, pre, last)
        vals[self.obj.name] = P.latency(ii, pre, last)
        return vals


def _highs_solver(pulp: Any, time_limit: float, threads: int, seed: int, start: dict[str, float] | None) -> Any:
    """pulp.HiGHS (the highspy API, not the HiGHS_CMD binary) with an optional starting solution."""
    import highspy

    class _HiGHS(pulp.HiGHS):  # type: ignore[misc,valid-type]
        def createAndConfigureSolver(self, lp: Any) -> None:
            with _quiet_stdout():  # the first highspy.Highs() of a process prints a banner from C++
                super().createAndConfigureSolver(lp)

        def callSolver(self, lp: Any) -> None:
            if start is not None:
                # PuLP's HiGHS has no warm start: hand the hint to highspy before it runs
                sol = highspy.HighsSolution()
                sol.col_value = [float(start.get(v.name, 0.0)) for v in lp.variables()]
                sol.value_valid = True
                lp.solverModel.setSolution(sol)
            lp.solverModel.run()

    if not _HiGHS().available():  # pragma: no cover - highspy missing
        raise SolverError("milp backend 'highs' needs highspy: pip install highspy")
    return _HiGHS(msg=False, timeLimit=float(time_limit), threads=int(threads), gapRel=0.0, gapAbs=0.999,
                  random_seed=int(seed), mip_feasibility_tolerance=1e-7)


@contextlib.contextmanager
def _quiet_stdout() -> Iterator[None]:
    """Silence file descriptor 1 (C-level prints that sys.stdout redirection cannot catch)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def _cbc_solver(pulp: Any, time_limit: float, threads: int, log: str, warm: bool) -> Any:
    """CBC: a cbc on PATH (pulp.COIN_CMD), else the binary bundled with PuLP (pulp.PULP_CBC_CMD), with its
    preprocessing off and, when ``warm``, the variables' initial values as a MIP start."""
    # No random seed option: CBC 2.10.3 with ``randomCbcSeed`` set has reported a worse solution as optimal,
    # and its default run is already deterministic (one thread, fixed default seed).
    # CBC 2.10's preprocessing loses better solutions of this big-M model and then calls a worse one optimal
    # (FA b1 h2 s256 d64, BM=128 BN=64 depth=3 groups=2: "optimal" 1416 or 1098 grains, the optimum is 1061); with
    # it off CBC proves the true optimum, with or without a MIP start.
    opts = dict(msg=False, timeLimit=float(time_limit), threads=int(threads), gapRel=0.0, gapAbs=0.999, logPath=log,
                warmStart=warm, options=["preprocess off"])
    coin = pulp.COIN_CMD(**opts)
    if coin.available():
        return coin
    bundled = getattr(pulp, "PULP_CBC_CMD", None)
    if bundled is not None:
        with warnings.catch_warnings():
            # deprecated in PuLP 3 in favour of COIN_CMD; still the only CBC where none is installed
            warnings.simplefilter("ignore", DeprecationWarning)
            cbc = bundled(**opts)
        if cbc.available():
            return cbc
    raise SolverError("milp backend 'cbc' needs the CBC binary: apt install coinor-cbc, or pip install 'pulp[cbc]' "
                      "(or use backend='highs')")


def solve(P: Problem, time_limit: float = 10.0, num_workers: int = 1, seed: int = 0, hint: SProgram | None = None,
          ii_max: int | None = None, backend: str = "highs") -> tuple[SProgram | None, dict[str, Any]]:
    """Solve ``P`` exactly as a MILP within ``time_limit`` seconds on ``backend`` (``highs`` or ``cbc``).

    Returns (program or None, stats): status OPTIMAL / TIME_LIMIT / INFEASIBLE; objective (cycles, exact,
    recomputed from the returned program) and bound (cycles, the back-end's best bound rounded up, or
    None when it reports none) when a program is returned; gap = (objective - bound) / objective; solve_s.
    A time-limited run returns its incumbent (or the hint, if better) with status TIME_LIMIT, or None if it
    has neither.
    ``num_workers`` is the back-end's thread count; 1 (the default) keeps CBC deterministic. ``seed`` is
    HiGHS's random_seed; CBC runs with its default seed (see _cbc_solver)."""
    if backend not in BACKENDS:
        raise SolverError(f"unknown milp backend {backend!r}; use one of {BACKENDS}")
    pulp = _require_pulp()
    t0 = time.perf_counter()
    ii_hi = max(P.ii_lb, min(P.ii_ub, ii_max or P.ii_ub))
    M = _Model(P, ii_hi)
    h = to_grains(P, hint) if hint is not None else None
    start = M.hint_values(*h) if h is not None else None
    if start is None:
        h = None  # a hint off the grain or outside the model is ignored
    log = None
    if backend == "highs":
        solver = _highs_solver(pulp, time_limit, num_workers, seed, start)
    else:
        if start is not None:  # the MIP start: PuLP writes the variables' initial values for CBC
            for v in M.m.variables():
                v.setInitialValue(start.get(v.name, 0.0))
        fd, log = tempfile.mkstemp(prefix="ptsolve_cbc_", suffix=".log")
        os.close(fd)
        solver = _cbc_solver(pulp, time_limit, num_workers, log, start is not None)
    try:
        M.m.solve(solver)
        has_sol, status, bound = (_read_highs(M.m) if backend == "highs" else _read_cbc(pulp, M.m, log or ""))
    except pulp.PulpSolverError as e:
        raise SolverError(f"milp backend {backend!r} failed on {P.graph.name}: {e}") from e
    finally:
        if log:
            os.unlink(log)
    raw = f"{M.m.status}/{M.m.sol_status} {getattr(M.m, 'ptsolve_result', '')}".strip()
    # PuLP's status codes (and CBC's result line) are kept for diagnosis
    stats: dict[str, Any] = {"solve_s": time.perf_counter() - t0, "backend": backend, "solver_status": raw}
    if status == "INFEASIBLE":
        if h is not None:
            raise SolverError(f"milp ({backend}) calls {P.graph.name} infeasible, but the hint is a solution "
                              "(a ptsolve bug)")
        return None, stats | {"status": status, "bound": None}
    sol: tuple[int, dict[str, int]] | None = None
    if has_sol:
        ii = int(round(M.ii.varValue))
        S = {t: int(round(M.s[t].varValue)) for t in P.tasks}
        bad = violations(P, ii, S)
        if bad:
            raise SolverError(f"milp ({backend}) solution of {P.graph.name} breaks the model after rounding "
                              f"(a ptsolve bug or a solver tolerance problem): {bad[:3]}")
        sol = ii, S
    note = None
    if h is not None:
        if sol is None or latency_of(P, *h) < latency_of(P, *sol):
            if status == "OPTIMAL":
                # re-verified against the hint: a back-end that calls a worse schedule optimal has proven nothing
                note = (f"{backend} called a schedule of {latency_of(P, *sol) if sol else None} grains optimal, but "
                        f"the hint has {latency_of(P, *h)}: its proof is not trusted")
                status, bound = "FEASIBLE", None
            sol = h  # a time-limited run never answers worse than the hint it was given
    if sol is None:
        return None, stats | {"status": "TIME_LIMIT", "bound": None if bound is None else P.total(bound) * P.grain}
    ii, S = sol
    prog = P.program(ii, S, f"milp-{backend}")
    obj = latency_of(P, ii, S)
    if status == "TIME_LIMIT" and bound is not None and bound >= obj:
        status = "OPTIMAL"  # the bound proves it (CBC reports a run stopped on the gap as merely feasible)
    if status == "OPTIMAL":
        bound = obj if bound is None else min(obj, bound)
    # reported: P.total(latency), monotone in the latency the model minimises
    obj, bound = P.total(obj), None if bound is None else P.total(bound)
    gap = (obj - bound) / obj if bound is not None and obj else None
    q = P.grain
    return prog, stats | {"status": status, "objective": obj * q, "bound": None if bound is None else bound * q,
                          "gap": gap} | ({"note": note} if note else {})


def _read_highs(m: Any) -> tuple[bool, str, int | None]:
    """(has an incumbent, status, best bound rounded up) from the highspy model behind pulp.HiGHS."""
    import highspy

    h = m.solverModel
    ms = h.getModelStatus()
    info = h.getInfo()
    has = info.primal_solution_status == highspy.SolutionStatus.kSolutionStatusFeasible
    bound = _ceil(info.mip_dual_bound)
    MS = highspy.HighsModelStatus
    if ms == MS.kOptimal:
        return True, "OPTIMAL", bound
    if ms in (MS.kInfeasible, MS.kUnboundedOrInfeasible):
        return False, "INFEASIBLE", None
    if ms in (MS.kTimeLimit, MS.kInterrupt, MS.kIterationLimit, MS.kSolutionLimit, MS.kObjectiveBound,
              MS.kObjectiveTarget):
        return has, "TIME_LIMIT", bound
    raise SolverError(f"HiGHS returned {h.modelStatusToString(ms)}: the model is malformed (a ptsolve bug)")


def _read_cbc(pulp: Any, m: Any, log: str) -> tuple[bool, str, int | None]:
    """(has an incumbent, status, best bound) from PuLP's CBC statuses and log.

    PuLP reports a time-limited CBC run that has an incumbent as status Optimal with sol_status
    IntegerFeasible, so the solution status, not ``m.status``, says whether optimality was proven."""
    c = pulp.constants
    text = ""
    if os.path.exists(log):
        with open(log) as f:
            text = f.read()
    found = re.findall(r"Lower bound:\s*([-+0-9.eE]+)", text)
    bound = _ceil(float(found[-1])) if found else None
    result = re.findall(r"Result - (.*)", text)
    m.ptsolve_result = result[-1].strip() if result else ""  # CBC's own words, kept for diagnosis
    if m.sol_status == c.LpSolutionOptimal:
        return True, "OPTIMAL", bound
    if m.sol_status == c.LpSolutionIntegerFeasible:
        return True, "TIME_LIMIT", bound
    if m.status == c.LpStatusInfeasible or m.sol_status == c.LpSolutionInfeasible:
        if "Stopped" in text or "time limit" in text.lower():
            return False, "TIME_LIMIT", bound
        return False, "INFEASIBLE", None
    if m.status == c.LpStatusNotSolved:
        return False, "TIME_LIMIT", bound
    raise SolverError(f"CBC returned {c.LpStatus.get(m.status)} / {c.LpSolution.get(m.sol_status)}: "
                      "the model is malformed (a ptsolve bug)")


def _ceil(x: float | None) -> int | None:
    """The bound as whole grains: the objective is integral, so a fractional bound rounds up."""
    if x is None or not math.isfinite(x):
        return None
    return int(math.ceil(x - 1e-6))
