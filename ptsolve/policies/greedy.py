"""The PipeThreader greedy policy (OSDI 2025, Fig. 9), on ptsolve's problem.

The paper's policy, in the words of DESIGN.md §4 (the project's record of Fig. 9): "even inter-EU split;
intra-EU time-stepped list scheduling that picks, among ready sTasks, asynchronous ones with high priority
(few unscheduled predecessors, many dependants), appends them if check_valid holds, otherwise waits for
memory to free." Made precise here, rule by rule (tests/ptsolve/policies/test_greedy.py checks each on a schedule
worked out by hand):

1. Inter-EU: the even split (the program's placement is ``even``).
2. Ready: a task is ready when all its zero-distance predecessors are placed; the phases are placed in
   order (prologue, loop, epilogue), a later phase only once the earlier ones are.
3. Priority among the ready tasks, in this order: (a) asynchronous before synchronous; (b) fewer
   unscheduled predecessors (loop-carried and ring edges included); (c) more dependants (tasks reachable
   through zero-distance edges); (d) then by name, so the policy is deterministic.
4. Time-stepped: at the current time ``now`` the tasks are tried in priority order; the first whose inputs
   are ready (latency, + a barrier across streams) and whose resources are free at ``now`` (modulo the
   initiation interval for loop tasks; a ring slot or register copy counts as a resource through its
   capacity edge) is appended at ``now``, and the ready set is recomputed. If none fits, time advances to the
   earliest moment at which one would ("waits for memory to free").
5. No look-ahead, no backtracking: a task once placed stays. The loop is scheduled once per candidate
   initiation interval, from the resource/recurrence bound upward; the first interval at which every task
   can be placed is kept.
"""
from __future__ import annotations

import time

from ..errors import InfeasibleError
from ..program import SProgram
from .model import Problem

RANK = {"pre": 0, "loop": 1, "post": 2}  # the order of the phases in a CTA


def _deps(P: Problem) -> tuple[dict[str, list[tuple[str, int, int]]], dict[str, list[tuple[str, int, int]]]]:
    ins: dict[str, list[tuple[str, int, int]]] = {t: [] for t in P.tasks}
    outs: dict[str, list[tuple[str, int, int]]] = {t: [] for t in P.tasks}
    for u, v, d, lat in P.prec:
        ins[v].append((u, d, lat))
        outs[u].append((v, d, lat))
    return ins, outs


def _dependants(P: Problem) -> dict[str, int]:
    """Number of tasks reachable through zero-distance edges (the paper's 'many dependants')."""
    succ: dict[str, set[str]] = {t: set() for t in P.tasks}
    for u, v, d, _ in P.prec:
        if d == 0:
            succ[u].add(v)
    memo: dict[str, set[str]] = {}

    def reach(t: str) -> set[str]:
        if t not in memo:
            memo[t] = set()
            memo[t] = set().union(*(reach(v) | {v} for v in succ[t])) if succ[t] else set()
        return memo[t]

    return {t: len(reach(t)) for t in P.tasks}


def _conflict(x: int, n: int, a: int, m: int, ii: int | None) -> int | None:
    """If [x, x+n) overlaps [a, a+m) (modulo ii), the earliest x' > x past that reservation, else None."""
    if ii is None:
        return a + m if x < a + m and a < x + n else None
    for k in (-1, 0, 1):
        base = a + ((x - a) // ii + k) * ii
        if x < base + m and base < x + n:
            return base + m
    return None


class _Table:
    """Reservations placed so far, per resource and phase."""

    def __init__(self, P: Problem, ii: int) -> None:
        self.P, self.ii = P, ii
        self.r: dict[str, list[tuple[int, int, str]]] = {}

    def earliest(self, t: str, x: int) -> int | None:
        """Earliest start >= x at which t's reservations fit; None if none within one ii (loop)."""
        P, ph = self.P, self.P.phase[t]
        x0 = x
        while True:
            moved = False
            for r, o, n in P.tm[t].uses:
                for a, m, q in self.r.get(r, []):
                    pq = P.phase[q]
                    if ph == pq:
                        nx = _conflict(x + o, n, a, m, self.ii if ph == "loop" else None)
                    elif RANK[pq] < RANK[ph]:  # q's phase runs first: t starts once q's reservation is over
                        nx = a + m if x + o < a + m else None
                    elif x + o + n > a:  # q's phase runs later: t cannot slide under q's reservation
                        return None
                    else:
                        nx = None
                    if nx is not None:
                        x, moved = nx - o, True
            if not moved:
                return x
            if ph == "loop" and x - x0 >= self.ii:
                return None

    def place(self, t: str, x: int) -> None:
        for r, o, n in self.P.tm[t].uses:
            self.r.setdefault(r, []).append((x + o, n, t))


def priority(t: str, asyn: dict[str, bool], unscheduled: dict[str, int], dep: dict[str, int]
             ) -> tuple[bool, int, int, str]:
    """Rule 3's sort key (smallest first): asynchronous first, then fewer unscheduled predecessors (edges, loop-carried
    and ring ones included: ``unscheduled``, kept by the list schedule as tasks are placed), then more dependants,
    then the name."""
    return not asyn[t], unscheduled[t], -dep[t], t


def schedule_at(P: Problem, ii: int, facts: tuple | None = None) -> dict[str, int] | None:
    """Greedy list schedule at initiation interval ``ii``; None if some task cannot be placed. ``facts``: what
    ``_facts(P)`` returns, when the caller tries many intervals of one problem."""
    tasks, ins, outs, dep, asyn, need0, left0, per_phase0 = facts or _facts(P)
    S: dict[str, int] = {}
    tab = _Table(P, ii)
    now = 0
    # kept as tasks are placed: zero-distance predecessors still unplaced (ready at 0), every predecessor edge still
    # unplaced (rule 3b), unplaced tasks per phase (rule 2)
    need, left, per_phase = dict(need0), dict(left0), list(per_phase0)
    while len(S) < len(tasks):
        ready = [t for t in tasks if t not in S and need[t] == 0]
        # a later phase waits until the earlier phases are placed (the program is prologue, loop, epilogue)
        low = next(r for r in range(3) if per_phase[r])
        ready = [t for t in ready if RANK[P.phase[t]] == low] or ready
        ready.sort(key=lambda t: priority(t, asyn, left, dep))
        nxt = None
        placed = False
        for t in ready:
            lo = max([now] + [S[u] + lat - d * ii for u, d, lat in ins[t] if u in S])
            hi = min([S[v] + d * ii - lat for v, d, lat in outs[t] if v in S], default=None)
            x = tab.earliest(t, lo)
            if x is None or (hi is not None and x > hi):
                return None  # no room within one ii, or a loop-carried deadline passes: this ii is too small
            if x == now:
                S[t] = x
                tab.place(t, x)
                per_phase[RANK[P.phase[t]]] -= 1
                for v, d, _ in outs[t]:
                    left[v] -= 1
                    need[v] -= d == 0
                placed = True
                break
            nxt = x if nxt is None else min(nxt, x)
        if not placed:
            if nxt is None:
                return None
            now = nxt
    return S


def _facts(P: Problem) -> tuple:
    """What the list schedule reads at every initiation interval: edges in and out, dependants, asynchrony."""
    ins, outs = _deps(P)
    tasks = P.tasks
    per_phase = [0, 0, 0]
    for t in tasks:
        per_phase[RANK[P.phase[t]]] += 1
    return (tasks, ins, outs, _dependants(P), {t.name: t.is_async for t in P.graph.tasks},
            {t: sum(d == 0 for _, d, _ in ins[t]) for t in tasks}, {t: len(ins[t]) for t in tasks}, per_phase)


def solve(P: Problem, time_limit: float | None = None, step: int | None = None) -> tuple[SProgram, dict]:
    """The greedy program of ``P`` and solver statistics (status FEASIBLE: greedy proves nothing)."""
    t0 = time.perf_counter()
    step = step or max(1, P.ii_lb // 256)
    ii = P.ii_lb
    tries = 0
    facts = _facts(P)
    while ii <= P.ii_ub + step:
        tries += 1
        S = schedule_at(P, ii, facts)
        if S is not None:
            prog = P.program(ii, S, "greedy")
            return prog, {"status": "FEASIBLE", "ii_tries": tries, "solve_s": time.perf_counter() - t0}
        ii += step
        if time_limit is not None and time.perf_counter() - t0 > time_limit:
            break
    raise InfeasibleError(f"greedy found no schedule of {P.graph.name} for ii in [{P.ii_lb}, {ii}]")

