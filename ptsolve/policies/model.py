"""The scheduling problem every policy solves, as plain data (one model, several back-ends).

For one sTask-graph on one EU: choose the initiation interval ``ii`` and a start cycle for every task
(see ptsolve.program) so that
  1. precedence: start[v] + dist·ii >= start[u] + delay(u, v)  (latency, + a barrier across streams);
  2. capacity:   start[alloc] + depth·ii >= start[free] + delay   (ring slots, register copies);
  3. resources:  reservations on one resource never overlap, loop tasks modulo ii; prologue tasks end
                 before the loop's first use of the resource, epilogue tasks start after its last;
  4. in-order issue: each stream is a resource (an async task holds it only for its issue cycles);
  5. memory:     shared memory and registers fit (fixed by the tiling and ``copies``; checked up front);
minimising the kernel latency: max over SM slots of Σ_CTA cta_time(trip, ii, pre, last) (ptsolve.program: a
CTA takes max(pre, (trip-1)·ii + last), pre = when the prologue is done, last = when one iteration and the
epilogue are; the formula simulate() replays), and at least ``floor``: with ``ctas`` co-resident CTAs per SM
(tiling key) an SM has that many slots, which share its tensor cores, copy engine and MUFU
(ptsolve.placement.shared_floor; 0 with one CTA per SM). This module builds that data and its bounds; greedy, cpsat,
milp and exhaustive read it, and check_valid / simulate verify what they return.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property

from ..cost import GRAIN, SHARED, Timing, check_grain, lower_bound_ii, shared_busy, timings
from ..errors import InfeasibleError, PtsolveError
from ..hw import Hardware, Target
from ..ir import STaskGraph
from ..opspec import make
from ..placement import busiest, per_sm_pairs, per_sm_trips, shared_floor
from ..program import SProgram, cta_time, follow_tail, handover, make_program, placement_of, precedences
from ..protocol import copy_buffers, min_slots, ring_depths
from ..validate import register_excess, regs_per_thread, smem_peak


@dataclass(frozen=True)
class Problem:
    """Scheduling data of one graph on one EU. Every time here is in grains of ``grain`` cycles
    (ptsolve.cost.GRAIN): solvers work in grains, ``program()`` turns their answer into cycles."""

    graph: STaskGraph
    hw: Hardware
    tm: dict[str, Timing]
    phase: dict[str, str]
    prec: tuple[tuple[str, str, int, int], ...]       # (u, v, dist, delay), capacity edges included
    res: dict[str, tuple[tuple[str, int, int], ...]]  # resource -> (task, offset, length)
    copies: dict[str, int]
    rings: dict[str, int]
    slots: tuple[tuple[tuple[int, int], ...], ...]    # objective: max over slots of Σ CTAs·cta_time(trip, ...)
    ii_lb: int
    ii_ub: int
    horizon: int
    grain: int = GRAIN
    floor: int = 0                                    # grains; the SM's shared units, see shared_floor
    handover: int = 0                                 # grains a persistent CTA hides per later tile (program.handover)
    tail: int = 0                                     # grains after the grid: follow-up CTAs (program.follow_tail)

    def program(self, ii: int, start: dict[str, int], policy: str) -> SProgram:
        """The SProgram of a solution given in grains (ii and start times)."""
        q = self.grain
        return make_program(self.graph, self.hw, ii * q, {t: x * q for t, x in start.items()}, self.copies,
                            policy=policy)

    @property
    def tasks(self) -> list[str]:
        return [t.name for t in self.graph.tasks]

    @property
    def trips(self) -> list[int]:
        """The distinct trip counts of the CTAs in ``slots``, ascending."""
        return sorted({n for h in self.slots for n, _ in h})

    def latency(self, ii: int, pre: int, last: int) -> int:
        """Busiest SM slot's time for a schedule with this ii, prologue end ``pre`` and one-iteration end ``last``
        (ptsolve.program.cta_time), in the unit of its arguments (grains in the solvers). What every policy
        minimises; nondecreasing in each argument. A persistent kernel's slot hides ``handover`` of every tile after
        its first."""
        return max(sum(c * cta_time(n, ii, pre, last) for n, c in h) - (sum(c for _, c in h) - 1) * self.handover
                   for h in self.slots)

    def objective(self, ii: int, pre: int, last: int) -> int:
        """The kernel's time: total(latency); monotone in the latency, so a schedule of least latency
        is optimal for it, and a bound on the latency bounds it."""
        return self.total(self.latency(ii, pre, last))

    def total(self, latency: int) -> int:
        """The kernel's time for slots of ``latency``: max(floor, latency) and the follow-up CTAs' ``tail`` after
        it (constant per graph: it ranks tilings, not the schedules of one)."""
        return max(self.floor, latency) + self.tail

    def ends(self, start: dict[str, int]) -> tuple[int, int]:
        """(pre, last) of a schedule given by its starts: the latest end of a prologue task (0 if none) and of
        a loop or epilogue task (SProgram.ends, in this Problem's unit)."""
        pre = max((start[t] + self.end(t) for t in self.tasks if self.phase[t] == "pre"), default=0)
        return pre, max(start[t] + self.end(t) for t in self.tasks if self.phase[t] != "pre")

    def end(self, t: str) -> int:
        """Cycles from the start of ``t`` until it is done (result usable, resources released)."""
        return max(self.tm[t].latency, max(o + n for _, o, n in self.tm[t].uses))

    @cached_property  # search's sorts and prunes read it many times
    def tie(self) -> tuple:
        """This tiling's place in the last tie-break between schedules of equal time (``tie_key``)."""
        deep = bool(self.hw.for_op(self.graph.op).deep_ring_ties)
        return tie_key(self.graph.tiling, deep and streams_memory(self.tm, self.phase, self.graph.tiling.ctas))


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


def streams_memory(tm: dict[str, Timing], phase: dict[str, str], ctas: int = 1) -> bool:
    """True when the copy engine is the loop's busiest resource: its demand per iteration, for the ``ctas`` CTAs that
    share an SM's units, is at least that of every other unit and of every warp stream (in the unit of ``tm``)."""
    busy: dict[str, int] = {}
    for n, t in tm.items():
        if phase[n] == "loop":
            for r, _, d in t.uses:
                busy[r] = busy.get(r, 0) + d * (ctas if r in SHARED else 1)
    return busy.get("tma", 0) > 0 and busy["tma"] >= max(busy.values())


def tie_key(tiling: dict[str, int], deep: bool) -> tuple:
    """A tiling as a sortable tuple, the last tie-break between schedules of equal predicted time, so that serial,
    process-pool and Ray searches return the same program whatever order the solves finish in: the smaller key wins,
    but with ``deep`` (an operator whose loop streams memory, ``streams_memory``, and whose table says
    ``deep_ring_ties``) the deeper of two rings the model cannot tell apart. The deterministic model hides a load
    once the ring covers its mean latency; whether more bytes in flight pay beyond that is measured per operator
    (bench study depth_tie: GEMM and ChunkState yes, compute-bound loops and split-KV decode at large batch no).
    Between a GEMM tiling and its TMA-store twin (``tma_store``) the model cannot tell apart, the TMA store: where a
    ping-pong warpgroup's epilogue hides under the other's main loop the model charges neither store, but the
    register store measured slower on 41 of 44 shapes (geomean 2.6%, up to 10.6%; never more than 0.8% faster,
    bench study tma_store): its stores contend with the other warpgroup's loop in ways the model does not see."""
    keyed = {**tiling, "tma_store": -int(tiling.get("tma_store", 0))} if "BM" in tiling else tiling
    return tuple(sorted((k, -v if k == "depth" and deep else v) for k, v in keyed.items()))


def deepen(prog: SProgram, hw: Hardware, skip: Sequence[dict[str, int]] = ()) -> SProgram:
    """``prog`` with the deepest ring up to its operator's ``deep_ring_max`` (Hardware, 0: none) that fits, where its
    loop streams memory (``streams_memory``); the same ii and start times, so the same objective: a deeper ring only
    removes constraints (the producer may run further ahead), and the model, whose latency is deterministic, already
    hides its loads at the space's depths. What the GPU gains is the extra bytes in flight (bench study gemm_skinny).
    ``prog`` itself where nothing deeper fits, the loop does not stream memory, or the table asks for nothing.
    ``skip``: tilings not to take (the compiler rejected them): the deepening stops below the first."""
    g = prog.graph
    cap, d0 = hw.for_op(g.op).deep_ring_max, g.tiling.get("depth")
    if not cap or d0 is None or d0 >= cap:
        return prog
    P = build(g, hw, registers=False)
    if not streams_memory(P.tm, P.phase, g.tiling.ctas):
        return prog
    q, op = P.grain, make(g.op, **g.params)
    start = {t: x // q for t, x in prog.start.items()}
    obj = P.objective(prog.ii // q, *P.ends(start))
    best = prog
    for d in range(d0 + 1, cap + 1):
        t = dict(g.tiling) | {"depth": d}
        if t in skip:
            break
        try:
            g2 = op.graph(t, hw)
            P2 = build(g2, hw, registers=False)  # the registers do not depend on the ring depth
        except PtsolveError:  # shared memory holds no deeper ring
            break
        if P2.objective(prog.ii // q, *P2.ends(start)) > obj:
            break
        best = P2.program(prog.ii // q, start, prog.policy)
    return best


def tiling_tie(g: STaskGraph, hw: Hardware) -> tuple:
    """``tie_key`` of a scheduled graph ``g`` on ``hw``: its Problem's ``tie`` (the register estimate aside: a
    solved tiling fits, by the estimate or by the compiler)."""
    return build(g, hw, registers=False).tie


def max_copies(g: STaskGraph, hw: Hardware, cap: int = 2) -> dict[str, int]:
    """Register copies of each loop-allocated register buffer: buffers are raised to ``cap`` copies one
    at a time (sorted by name) while every warpgroup stays within its register budget. Two copies of
    FA's S tile is what FA3's intra-warpgroup overlap costs."""
    loop = copy_buffers(g)
    k = g.tiling.ctas
    budget = Target(hw).consumer_regs(g.tiling.kernel_groups(g.groups), k)
    rings = ring_depths(g)
    out = dict.fromkeys(loop, 1)
    # symmetric warpgroups raise the same buffer together (s@0 and s@1)
    for base in sorted({n.split("@")[0] for n in loop}):
        trial = out | {n: cap for n in loop if n.split("@")[0] == base}
        if all(regs_per_thread(g, trial, grp, hw)[0] <= budget for grp in range(g.groups)) and \
                smem_peak(g, rings | trial, hw)[0] <= Target(hw).smem_budget(k):
            out = trial
    return out


def fits(g: STaskGraph, hw: Hardware, registers: bool = True) -> str | None:
    """None if the tiling fits the EU with one copy of every register buffer, else why not. ``registers``: check the
    model's register estimate (False: the compiler decides, see search's ``admit``)."""
    rings = ring_depths(g)
    for b, (n, who) in sorted(min_slots(g).items()):
        if rings[b] < n:
            return f"ring {b!r} of depth {rings[b]} is released by {who} {n - 1} iteration(s) late: it needs {n} slots"
    if g.tiling.pingpong and not (hw.has_wgmma and hw.has_tma):
        return (f"ping-pong consumer warpgroups take turns on asynchronous warpgroup MMAs fed by TMA, which {hw.name} "
                "lacks (and no code generator builds them there); use pingpong=0")
    if g.tiling.cluster > 1 and not hw.has_tma:
        return (f"a cluster of {g.tiling.cluster} CTAs shares tiles by TMA multicast, which {hw.name} lacks (and "
                "no code generator builds clusters there); use cluster=1")
    if g.tiling.get("tma_store", 0) and not hw.has_tma:
        return (f"the TMA-store epilogue hands each staged chunk to the copy engine, which {hw.name} lacks (and no "
                "code generator builds it there); use tma_store=0")
    k = g.tiling.ctas
    sm, names = smem_peak(g, rings, hw)
    smem_cap = Target(hw).smem_budget(k)
    if sm > smem_cap:
        return f"shared memory {sm} B > {smem_cap} B of {k} CTA(s) per SM ({', '.join(names)})"
    if registers and (x := register_excess(g, {}, hw)):
        return f"registers {x[1]}/thread > {x[2]} ({', '.join(x[3])})"
    if g.tiling.kernel_groups(g.groups) * 128 + 128 > hw.max_threads:
        return f"{g.tiling.kernel_groups(g.groups)} consumer warpgroups + producer exceed {hw.max_threads} threads"
    return None


def objective_slots(g: STaskGraph, hw: Hardware, placement: str,
                    ratio: float = 0.25) -> tuple[tuple[tuple[int, int], ...], ...]:
    """The SM slots that may be the busiest, each as ((trip count, CTAs), ...) (ptsolve.placement.per_sm_trips and
    busiest). The even split does not depend on the schedule, so its slots are exact. LPT's assignment does: it
    is fixed here for span ≈ ii / ``ratio`` and the final latency is re-evaluated with the true values."""
    return busiest(per_sm_trips(g.row, g.rows, hw.sms * g.tiling.slots, placement_of(g, placement), ratio))


def build(g: STaskGraph, hw: Hardware, placement: str = "even", copies: dict[str, int] | None = None,
          registers: bool = True) -> Problem:
    """The scheduling problem of ``g`` on ``hw``; raises InfeasibleError when the tiling cannot fit (``registers``:
    as in ``fits``)."""
    why = fits(g, hw, registers)
    if why:
        raise InfeasibleError(f"{g.name} tiling {g.tiling} does not fit {hw.name}: {why}")
    q = check_grain()
    cyc = timings(g, hw)
    cp = copies if copies is not None else max_copies(g, hw)
    rings = ring_depths(g)
    prec = [(u, v, d, lat // q) for u, v, d, lat, _ in precedences(g, cyc, hw, rings, cp)]
    tm = {t: Timing(x.stream, tuple((r, o // q, n // q) for r, o, n in x.uses), x.latency // q) for t, x in cyc.items()}
    res: dict[str, list[tuple[str, int, int]]] = {}
    for t in g.tasks:
        for r, o, n in tm[t.name].uses:
            res.setdefault(r, []).append((t.name, o, n))
    loop = [t.name for t in g.phase("loop")]
    phase = {t.name: t.phase for t in g.tasks}
    ii_lb = max(lower_bound_ii(tm, loop), _recurrence_bound(prec, phase))
    total = sum(max(o + n for _, o, n in tm[t].uses) + tm[t].latency for t in tm)
    ii_ub = max(ii_lb, sum(max(o + n for _, o, n in tm[t].uses) + tm[t].latency for t in loop))
    slots = objective_slots(g, hw, placement)
    floor = floor_of(g, hw, tm, phase, ii_lb, placement, q)
    return Problem(g, hw, tm, phase, tuple(prec), {r: tuple(v) for r, v in sorted(res.items())}, cp, rings,
                   slots, ii_lb, ii_ub, total + ii_ub, q, floor, handover(g, hw) // q, -(-follow_tail(g, hw) // q))


def floor_of(g: STaskGraph, hw: Hardware, tm: dict[str, Timing], phase: dict[str, str], ii_lb: int, placement: str,
             q: int = 1) -> int:
    """The kernel's floor from what an SM's slots share, in the unit of ``tm`` (``q`` cycles; ``ii_lb`` in it too):
    0 with one slot per SM (the schedule already serialises its units), else the SMs' shared units
    (ptsolve.placement.shared_floor over ``units``). A task's DRAM share is one SM's (ptsolve.cost.load_cycles):
    the rate one copy stream (a CTA's ring) measured, whatever the other SMs do. Co-resident CTAs (tiling key
    ``ctas`` > 1) are one stream each, and a grid of fewer than ``ctas`` per SM leaves SMs idle whose share the busy
    ones take: their copy engine is charged DRAM split over the SMs the launch keeps busy (as misaligned L2 loads
    are, ptsolve.cost.misaligned_share) -- one SM's share per CTA summed over an SM's CTAs priced a second resident
    CTA as no extra bandwidth (GPT-2 decode, 192 CTAs at two per SM: 118.6 us predicted, ~102 measured;
    bench study torch_decode). With every SM busy, the share is one SM's either way."""
    k = g.tiling.slots
    if k == 1:
        return 0
    busy = units(g, tm, phase, ii_lb)
    sms = -(-g.n_ctas // k)
    if g.tiling.ctas > 1 and sms < hw.sms and "tma" in busy:  # the same timings, DRAM over ``sms`` shares
        wide = replace(hw, hbm_bytes_per_s=hw.hbm_bytes_per_s * hw.sms / sms)
        busy["tma"] = tuple(math.ceil(x / q) for x in shared_busy(timings(g, wide), phase)["tma"])
    return shared_floor(per_sm_pairs(g.row, g.rows, hw.sms, placement_of(g, placement)), k, busy)


def units(g: STaskGraph, tm: dict[str, Timing], phase: dict[str, str], ii_lb: int) -> dict[str, tuple[int, int]]:
    """The SM's shared units as ptsolve.placement.shared_floor takes them, in the unit of ``tm``: the tensor cores,
    copy engine and MUFU (ptsolve.cost.shared_busy) and, for a ping-pong kernel, the tensor-core turn: the turns
    serialise the two warpgroups' main loops (``tc_order`` passed once per tile), so every iteration of either holds
    the turn for at least the loop's lower bound ``ii_lb`` (its busiest resource or its ring / register capacity
    recurrence); only the epilogues overlap."""
    busy = shared_busy(tm, phase)
    return busy | {"turn": (ii_lb, 0)} if g.tiling.pingpong else busy


def ii_lower_bound(g: STaskGraph, hw: Hardware, copies: dict[str, int] | None = None) -> int:
    """The lower bound on ``g``'s initiation interval on ``hw``, cycles: its busiest resource per iteration or its
    loop-carried recurrences (latency over ring slots and register copies), as ``build`` computes it."""
    q = check_grain()
    cyc = timings(g, hw)
    cp = copies if copies is not None else max_copies(g, hw)
    prec = [(u, v, d, lat // q) for u, v, d, lat, _ in precedences(g, cyc, hw, ring_depths(g), cp)]
    tm = {t: Timing(x.stream, tuple((r, o // q, n // q) for r, o, n in x.uses), x.latency // q) for t, x in cyc.items()}
    phase = {t.name: t.phase for t in g.tasks}
    return max(lower_bound_ii(tm, [t.name for t in g.phase("loop")]), _recurrence_bound(prec, phase)) * q


def _recurrence_bound(prec: list[tuple[str, str, int, int]], phase: dict[str, str]) -> int:
    """Smallest ii for which no loop-carried cycle needs more than dist·ii cycles (max cycle ratio),
    found by bisection with Bellman-Ford on weights delay - dist·ii."""
    arcs = [(u, v, d, lat) for u, v, d, lat in prec if phase[u] == phase[v] == "loop"]
    nodes = sorted({x for a in arcs for x in a[:2]})

    def positive_cycle(ii: int) -> bool:
        dist = dict.fromkeys(nodes, 0)
        for _ in range(len(nodes) + 1):
            changed = False
            for u, v, d, lat in arcs:
                w = lat - d * ii
                if dist[u] + w > dist[v]:
                    dist[v] = dist[u] + w
                    changed = True
            if not changed:
                return False
        return True

    lo, hi = 1, max((lat for *_, lat in arcs), default=1) * max(len(nodes), 1) + 1
    while lo < hi:
        mid = (lo + hi) // 2
        if positive_cycle(mid):
            lo = mid + 1
        else:
            hi = mid
    return lo
