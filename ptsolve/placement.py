"""Inter-EU placement: which SM runs which CTA, and the kernel's latency that follows.

CTAs run one at a time per SM slot, and an SM has ``ctas`` slots (tiling key ``ctas``, default 1: a
warp-specialized kernel holds a whole SM's registers). A slot's time is the sum of its CTAs' latencies;
co-resident slots overlap each other's latency but share the SM's execution units (``shared_floor``). The
kernel's time is the busiest slot's or SM's (wave quantization included). Functions here take the number
of slots (hw.sms · ctas) as ``sms``.
"""
from __future__ import annotations

import heapq

import numpy as np

from . import cpsolver
from .arguments import PLACEMENTS as POLICIES
from .errors import PtsolveError

STRIDED = "strided"  # not a user's choice: how a persistent kernel deals its tiles (ptsolve.program.persistent)


def sm_loads(row_cycles: list[int], rows: int, sms: int, policy: str = "even", handover: int = 0) -> np.ndarray:
    """Cycles each SM is busy. ``row_cycles``: CTA latencies of one grid row, in launch order.

    even: the paper's split — CTA k of T (launch order) goes to SM k // ceil(T / sms).
    lpt:  longest first, each CTA to the least-loaded SM (a persistent kernel with a sorted tile list).
    dynamic: the GPU's block scheduler: CTAs in launch order, each to the SM that frees first.
    exact: the makespan-optimal assignment (exact_loads), proven by CP-SAT or by meeting lower_bound.
    strided: a persistent kernel's static deal: the tiles longest first, tile i to SM i mod sms.
    ``handover``: cycles of each CTA after an SM's first that the previous one hides (a persistent CTA loads its
    next tile under the current one's tail): they cost that much less (with ``exact``, not applied).
    """
    if policy not in (*POLICIES, STRIDED):
        raise PtsolveError(f"unknown placement {policy!r}; use one of {POLICIES}")
    if policy == "exact":
        return exact_loads(row_cycles, rows, sms)[0]
    costs = np.tile(np.asarray(row_cycles, dtype=np.int64), rows)
    if policy == STRIDED:
        srt = np.sort(costs)[::-1]
        loads = np.zeros(sms, dtype=np.int64)
        np.add.at(loads, np.arange(len(srt)) % sms, srt)
        n = np.bincount(np.arange(len(srt)) % sms, minlength=sms)
        return loads - np.maximum(n - 1, 0) * handover
    if policy == "even":
        k = -(-len(costs) // sms)
        pad = np.zeros(sms * k, dtype=np.int64)
        pad[: len(costs)] = costs
        n = np.minimum(np.maximum(len(costs) - np.arange(sms) * k, 0), k)
        return pad.reshape(sms, k).sum(axis=1) - np.maximum(n - 1, 0) * handover
    heap = [(0, s) for s in range(sms)]
    loads = np.zeros(sms, dtype=np.int64)
    order = costs.tolist() if policy == "dynamic" else sorted(costs.tolist(), reverse=True)
    for c in order:
        load, s = heapq.heappop(heap)
        loads[s] = load + c - (handover if load else 0)
        heapq.heappush(heap, (int(loads[s]), s))
    return loads


def lower_bound(row_cycles: list[int], rows: int, sms: int) -> int:
    """No placement finishes sooner than the average SM load or the longest CTA, cycles."""
    total = sum(row_cycles) * rows
    return max(-(-total // sms), max(row_cycles))


def shared_floor(sm_pairs: list[tuple[int, int]], ctas: int, busy: dict[str, tuple[int, int]]) -> int:
    """Lower bound on an SM's time from its shared units when ``ctas`` slots (co-resident CTAs, ping-pong warpgroups)
    share it: an SM whose units have pair (Σ(trip-1), n units) (``sm_pairs``: per_sm_pairs over the SMs, each SM's
    units together, however its slots split them) keeps each shared unit busy (Σ(trip-1) + n)·loop + n·(pre + post).
    An SM that runs one unit shares nothing and a single slot never exceeds its own latency (the schedule already
    serialises the units), so the floor binds only for ``ctas`` > 1 and SMs of two units or more (the GPU spreads
    work over the SMs first: a kernel of no more units than SMs shares nothing)."""
    if ctas == 1 or not busy or max((n for _, n in sm_pairs), default=0) <= 1:
        return 0
    return max(max((a + b) * lp + b * pp for lp, pp in busy.values()) for a, b in sm_pairs)


def per_sm_trips(row: list[int] | tuple[int, ...], rows: int, sms: int, policy: str = "even",
                 ratio: float = 0.25) -> list[tuple[tuple[int, int], ...]]:
    """The CTAs of every SM slot that runs any, as ((trip count, CTAs), ...) sorted by trip count: the slot's
    cycles are Σ CTAs · program.cta_time(trip, ...) for any schedule. ``even``: the paper's split (CTA k of T,
    in launch order, to slot k // ceil(T / sms)). ``dynamic``: the GPU's block scheduler, CTAs in launch order each
    to the slot that frees first. ``lpt`` (and ``exact``, approximated by LPT here) gives the
    CTAs longest first to the least-loaded slot, a CTA weighing (trip-1) + ratio, i.e. as if span = ii / ratio;
    the kernel's latency is always re-evaluated with the true costs (sm_loads)."""
    if policy not in (*POLICIES, STRIDED):
        raise PtsolveError(f"unknown placement {policy!r}; use one of {POLICIES}")
    trips = np.tile(np.asarray(row, dtype=np.int64), rows)
    if policy == STRIDED:
        srt = np.sort(trips)[::-1]
        return [tuple((int(v), int(c)) for v, c in zip(*np.unique(srt[s::sms], return_counts=True)))
                for s in range(min(sms, len(srt)))]
    if policy == "even":
        k = -(-len(trips) // sms)
        return [tuple((int(v), int(c)) for v, c in zip(*np.unique(trips[i:i + k], return_counts=True)))
                for i in range(0, len(trips), k)]
    heap = [(0.0, s) for s in range(sms)]
    acc: list[dict[int, int]] = [{} for _ in range(sms)]
    if policy == "dynamic":  # launch order, each CTA to the slot that frees first
        for v in trips.tolist():
            load, s = heapq.heappop(heap)
            acc[s][v] = acc[s].get(v, 0) + 1
            heapq.heappush(heap, (load + v - 1 + ratio, s))
        return [tuple(sorted(a.items())) for a in acc if a]
    vals, counts = np.unique(trips, return_counts=True)
    for v, m in sorted(zip(vals.tolist(), counts.tolist()), reverse=True):  # longest first
        for _ in range(m):
            load, s = heapq.heappop(heap)
            acc[s][v] = acc[s].get(v, 0) + 1
            heapq.heappush(heap, (load + v - 1 + ratio, s))
    return [tuple(sorted(a.items())) for a in acc if a]


def busiest(slots: list[tuple[tuple[int, int], ...]]) -> tuple[tuple[tuple[int, int], ...], ...]:
    """The slots that may be the busiest for some schedule, sorted: a slot is dropped when another has, for every
    trip count n, at least as many CTAs of trip >= n (a CTA's time never falls as its trip count grows, so that
    other slot is at least as busy whatever the schedule)."""
    uniq = sorted(set(slots))
    ns = np.array(sorted({n for h in uniq for n, _ in h}), dtype=np.int64)
    # cum[i, j]: CTAs of slot i whose trip count is >= ns[j]
    cum = np.array([[sum(c for n, c in h if n >= m) for m in ns.tolist()] for h in uniq], dtype=np.int64)
    ge = (cum[:, None, :] >= cum[None, :, :]).all(axis=2)  # ge[j, i]: slot j at least as busy as slot i
    np.fill_diagonal(ge, False)
    keep = [h for i, h in enumerate(uniq) if not ge[:, i].any()]  # distinct slots never tie on every count
    return tuple(keep)


def per_sm_pairs(row: list[int] | tuple[int, ...], rows: int, sms: int, policy: str = "even",
                 ratio: float = 0.25) -> list[tuple[int, int]]:
    """(Σ (trip-1), number of CTAs) of every SM slot (per_sm_trips): the slot's cycles when every CTA takes
    (trip-1)·ii + span; what the shared-unit floor counts."""
    return [(sum(c * (n - 1) for n, c in h), sum(c for _, c in h)) for h in per_sm_trips(row, rows, sms, policy, ratio)]


def exact_loads(row_cycles: list[int] | tuple[int, ...], rows: int, sms: int,
                time_limit: float = 10.0, deterministic: bool = False) -> tuple[np.ndarray, bool]:
    """Makespan-optimal placement of the CTAs on identical SMs: (loads per SM, proven optimal).

    LPT first; if it meets lower_bound it is optimal. Otherwise CP-SAT over how many CTAs of each
    distinct latency each SM runs (SMs sorted by load to break their symmetry), LPT as the hint.
    ``deterministic``: ``time_limit`` is CP-SAT deterministic time, one worker (ptsolve.cpsolver.cp_solver): the same
    answer and proof under any load; else wall-clock seconds, two workers.
    """
    lpt = sm_loads(row_cycles, rows, sms, "lpt")
    lb = lower_bound(list(row_cycles), rows, sms)
    if int(lpt.max()) <= lb:
        return lpt, True
    from ortools.sat.python import cp_model

    vals, counts = np.unique(np.tile(np.asarray(row_cycles, dtype=np.int64), rows), return_counts=True)
    m = cp_model.CpModel()
    x = [[m.new_int_var(0, int(c), f"x{s}_{v}") for v, c in zip(vals, counts)] for s in range(sms)]
    cap = m.new_int_var(int(lb), int(lpt.max()), "cmax")
    loads = []
    for s in range(sms):
        load = sum(int(v) * x[s][i] for i, v in enumerate(vals))
        m.add(load <= cap)
        loads.append(load)
    for i, c in enumerate(counts):
        m.add(sum(x[s][i] for s in range(sms)) == int(c))
    for s in range(sms - 1):
        m.add(loads[s] >= loads[s + 1])
    m.minimize(cap)
    m.add_hint(cap, int(lpt.max()))
    sv = (cpsolver.cp_solver(cp_model, 1, det_time=time_limit) if deterministic
          else cpsolver.cp_solver(cp_model, 2, time_limit=time_limit))
    st = sv.solve(m)
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE) or sv.objective_value >= lpt.max():
        return lpt, st == cp_model.OPTIMAL
    out = np.array([sum(int(v) * sv.value(x[s][i]) for i, v in enumerate(vals)) for s in range(sms)])
    return out, st == cp_model.OPTIMAL
