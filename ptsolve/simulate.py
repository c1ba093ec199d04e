"""simulate: replay an SProgram under the cost model, one CTA per distinct trip count, then the kernel.

The replay walks every task instance (pre once, loop ``trip`` times, post once) in the program's
order and starts each at the earliest cycle at which (1) its inputs are ready (latency, plus a
barrier across streams), (2) every resource it holds is free — its issuing stream (in-order issue:
a synchronous task blocks its warpgroup, an async one only for its issue cycles), the copy engine,
the tensor cores, the MUFU — (3) the ring slot or register copy it fills has been freed, and, in
``timed`` mode, (4) its planned start. A valid program replays with no instance late, so the replay
reproduces the policy's claimed latency exactly; ``asap`` mode drops (4) and shows what the
dynamically-scheduled hardware would do with the same orders.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .cost import Timing, timings
from .errors import InfeasibleError
from .hw import Hardware, load
from .ir import STaskGraph
from .placement import sm_loads
from .program import SProgram, cta_time, follow_tail, handover, placement_of, precedences
from .protocol import first_reuse


@dataclass(frozen=True)
class Event:
    task: str
    stream: str
    iteration: int
    start: int      # cycles from the CTA's start
    end: int        # cycles: when the result is usable and no resource is held
    planned: int
    holds: tuple[tuple[str, int, int], ...] = ()  # (resource, from, to) cycles: stream, tma, tc, sfu


@dataclass(frozen=True)
class Timeline:
    """The replay of one CTA (the longest trip count) plus per-trip CTA cycles and the kernel latency."""

    events: tuple[Event, ...]
    cta_cycles: dict[int, int]
    kernel_cycles: int
    kernel_us: float
    tflops: float
    late: int                 # instances that started after their planned cycle (0 for a valid program)
    trip: int                 # trip count of ``events``
    placement: str = "even"
    sm_busy: tuple[int, ...] = field(default=(), repr=False)  # per SM slot: hw.sms · ctas entries

    @property
    def cta(self) -> int:
        return self.cta_cycles[self.trip]


def replay(p: SProgram, hw: Hardware, trip: int, mode: str = "timed",
           tm: dict[str, Timing] | None = None) -> tuple[list[Event], int]:
    """Replay one CTA of ``trip`` iterations; returns its events and how many started late."""
    if mode not in ("timed", "asap"):
        raise ValueError(f"mode must be 'timed' or 'asap', got {mode!r}")
    g = p.graph
    tm = tm or timings(g, hw)
    phase = {t.name: t.phase for t in g.tasks}
    S, ii = p.start, p.ii

    def planned(t: str, i: int) -> int:
        return S[t] + (i * ii if phase[t] == "loop" else (trip - 1) * ii if phase[t] == "post" else 0)

    inst = [(t.name, i) for t in g.tasks for i in (range(trip) if t.phase == "loop" else
                                                      [trip - 1 if t.phase == "post" else 0])]
    inst.sort(key=lambda x: (planned(*x), x[0], x[1]))
    preds: dict[str, list[tuple[str, int, int, str]]] = {t.name: [] for t in g.tasks}
    for u, w, d, lat, kind in precedences(g, tm, hw, p.rings, p.copies):
        preds[w].append((u, d, lat, kind))
    fresh = first_reuse(g, p.rings, p.copies)  # iterations below this fill fresh slots: no release to wait for

    def src_iter(u: str, w: str, i: int, d: int) -> int | None:
        if phase[u] == "pre":
            return 0
        if phase[u] == "post":
            return trip - 1
        j = (trip - 1 if phase[w] == "post" else i) - d
        return j if j >= 0 else None

    done: dict[tuple[str, int], int] = {}
    free: dict[str, int] = {}
    events, late = [], 0
    for t, i in inst:
        at = planned(t, i) if mode == "timed" else 0
        for u, d, lat, kind in preds[t]:
            j = src_iter(u, t, i, d)
            if j is None or (kind == "ring" and i < fresh.get(t, 0)):
                continue
            if (u, j) not in done:
                raise InfeasibleError(f"{t}@{i} waits for {u}@{j}, which the program issues later on its stream: "
                                      "the orders deadlock; run check_valid for details")
            at = max(at, done[(u, j)] + lat)
        for r, o, _ in tm[t].uses:
            at = max(at, free.get(r, 0) - o)
        for r, o, n in tm[t].uses:
            free[r] = at + o + n
        done[(t, i)] = at
        end = at + max(tm[t].latency, max(o + n for _, o, n in tm[t].uses))
        late += at > planned(t, i)
        events.append(Event(t, tm[t].stream, i, at, end, planned(t, i),
                            tuple((r, at + o, at + o + n) for r, o, n in tm[t].uses)))
    return events, late


def simulate(p: SProgram, hw: Hardware | str | None = None, mode: str = "timed",
             placement: str | None = None, max_trips: int = 0) -> Timeline:
    """Replay ``p`` for every distinct trip count of its grid and place the CTAs on the SMs.

    Returns the timeline of the longest CTA, the cycles of each CTA kind, and the kernel latency:
    busiest SM's cycles (placement ``p.placement`` unless given) + hw.launch_us. ``max_trips`` (> 0): a CTA of more
    iterations is replayed for ``max_trips`` of them and each further one adds ``p.ii`` (the loop's period; what a
    long cache's CTAs cost without replaying every iteration), and ``events`` is that shortened replay.
    """
    hw = load(hw or p.hw)
    tm = timings(p.graph, hw)
    g = p.graph
    cta: dict[int, int] = {}
    late = 0
    events: list[Event] = []
    for n in sorted(set(g.row)):
        m = min(n, max_trips) if max_trips > 0 else n
        ev, lt = replay(p, hw, m, mode, tm)
        cta[n] = max(e.end for e in ev) + (n - m) * p.ii
        late += lt
        if n == g.trip_count:
            events = ev
    pl = placement or p.placement
    kc, busy = kernel_cycles(g, hw, cta, pl, tm)
    us = hw.cycles_to_us(kc) + hw.launch_us
    return Timeline(tuple(events), cta, kc, us, g.useful_flops / (us * 1e-6) / 1e12, late, g.trip_count, pl,
                    tuple(int(x) for x in busy))


REPLAY_TRIPS = 64  # iterations replayed per CTA by replay_us; each further one adds the loop's ii


def replay_us(p: SProgram, hw: Hardware | str | None = None) -> float:
    """Kernel latency, µs, of ``p``'s issue orders run as the hardware runs them: the ``asap`` replay, every task as
    soon as its inputs, resources and ring slot allow rather than at its planned start (CTAs of more than
    REPLAY_TRIPS iterations: REPLAY_TRIPS replayed, ``p.ii`` per further one). The planned starts' formula
    (predicted_us, what the solvers minimise) lays one iteration out at its steady-state slots, so it charges the
    pipeline's fill and drain waits that only the steady state has; this replay does not. It ranked FlashAttention's
    declared FA3 order ahead of CP-SAT's free order of the same tiling on the eight H200 shapes where the formula
    ranked it 0.3-3.9% behind, and the GPU agreed on all eight (0.2-6.8% faster; bench study replay_orders)."""
    return simulate(p, hw, mode="asap", max_trips=REPLAY_TRIPS).kernel_us


def kernel_cycles(g: STaskGraph, hw: Hardware, cta: dict[int, int], placement: str,
                  tm: dict[str, Timing] | None = None) -> tuple[int, np.ndarray]:
    """(kernel cycles, busy cycles of each SM slot) for CTAs of ``cta[trip]`` cycles: the busiest of the
    hw.sms · Tiling.slots slots, or the SMs' shared-unit floor (ptsolve.placement.shared_floor) if higher, and
    the follow-up CTAs' tail (ptsolve.program.follow_tail) after it."""
    busy = sm_loads([cta[n] for n in g.row], g.rows, hw.sms * g.tiling.slots, placement_of(g, placement),
                    handover(g, hw))
    return max(int(busy.max()), unit_floor(g, hw, placement, tm)) + follow_tail(g, hw), busy


def unit_floor(g: STaskGraph, hw: Hardware, placement: str, tm: dict[str, Timing] | None = None) -> int:
    """The SMs' shared-unit floor of ``g``'s kernel, cycles (ptsolve.policies.model.floor_of; 0 with one CTA per
    SM); ``exact`` placement is approximated by longest-first's slots, as in the model."""
    if g.tiling.slots == 1:
        return 0  # one CTA per SM: the schedule already serialises the shared units (and claimed() stays cheap)
    from .policies.model import floor_of, ii_lower_bound
    tm = tm or timings(g, hw)
    phase = {t.name: t.phase for t in g.tasks}
    ii_lb = ii_lower_bound(g, hw) if g.tiling.pingpong else 0  # the ping-pong turns (policies.model.units)
    return floor_of(g, hw, tm, phase, ii_lb, placement)


def predicted_us(p: SProgram, hw: Hardware, placement: str | None = None) -> float:
    """Kernel latency the program claims, µs: claimed_cycles + hw.launch_us."""
    return hw.cycles_to_us(claimed_cycles(p, hw, placement)) + hw.launch_us


def claimed_cycles(p: SProgram, hw: Hardware, placement: str | None = None) -> int:
    """Kernel cycles (busiest SM, no launch overhead) that the program's formula claims:
    every CTA takes program.cta_time, max(pre end, (trip-1)·ii + loop/post end); CTAs placed on SM slots; at least the
    shared units' floor."""
    return claimed(p, hw, placement)[0]


def claimed(p: SProgram, hw: Hardware, placement: str | None = None) -> tuple[int, int]:
    """(claimed_cycles, the busiest SM slot's cycles): the second tells programs apart whose kernel time is
    the same shared-unit floor (the one with more slack under the floor is the safer bet)."""
    g = p.graph
    pre, last = p.ends(hw)
    cta = {n: cta_time(n, p.ii, pre, last) for n in set(g.row)}
    kc, busy = kernel_cycles(g, hw, cta, placement or p.placement)
    return kc, int(busy.max())
