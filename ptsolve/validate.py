"""check_valid: is an SProgram legal on the hardware, and if not, what exactly is wrong.

Checked: every task scheduled; every dependence met with its latency (modulo ii across iterations)
and, across streams, carried by a barrier; every ring slot reused only after it was freed; no resource
(stream, copy engine, tensor cores, MUFU) holding two tasks at once, modulo ii; no cycle of barrier
waits and in-order issue that can never be satisfied (deadlock); shared memory and registers within
the EU's limits at the peak.
"""
from __future__ import annotations

from dataclasses import dataclass

from .cost import Timing, timings
from .hw import Hardware, Target, load
from .ir import STaskGraph
from .program import SProgram, precedences, required_barriers
from .protocol import is_ring, ring_depths, ring_users, smem_layout


@dataclass(frozen=True)
class Validity:
    """Truthy when the program is valid; ``violations`` says what to fix otherwise."""

    violations: tuple[str, ...]

    def __bool__(self) -> bool:
        return not self.violations

    def __str__(self) -> str:
        return "valid" if not self.violations else "invalid:\n  " + "\n  ".join(self.violations)


def smem_peak(g: STaskGraph, slots: dict[str, int], hw: Hardware) -> tuple[int, list[str]]:
    """Shared memory a CTA requests, bytes (ptsolve.protocol.smem_layout: alignment and mbarriers included),
    and the buffers behind it; ``slots``: ring depths and copies of the loop buffers."""
    lay = smem_layout(g, {b: n for b, n in slots.items() if b in ring_depths(g)}, slots, hw)
    return lay.total, list(lay.names)


def regs_per_thread(g: STaskGraph, copies: dict[str, int], group: int, hw: Hardware) -> tuple[int, list[str]]:
    """32-bit registers each thread of consumer warpgroup ``group`` needs, and the buffers behind them."""
    owner = {b.name: t for t in g.tasks for b in t.allocs}
    total, names = hw.reg_overhead, []
    for n, b in sorted(g.buffers().items()):
        t = owner[n]
        if b.space != "reg" or t.group != group:
            continue
        c = copies.get(n, 1) if t.phase == "loop" else 1
        total += c * b.regs_per_thread
        names.append(f"{n}={b.regs_per_thread}" + (f"x{c}" if c > 1 else ""))
    return total, names


def register_excess(g: STaskGraph, copies: dict[str, int], hw: Hardware) -> tuple[int, int, int, list[str]] | None:
    """The first consumer warpgroup whose estimated registers per thread (``regs_per_thread``) exceed what its
    kernel gives it (ptsolve.hw.Target.consumer_regs), as (group, need, budget, buffers); None when all fit. An
    estimate: ptxas often fits a kernel under the launch bound with fewer (optimize asks it: SProgram.registers)."""
    k = g.tiling.ctas
    budget = Target(hw).consumer_regs(g.tiling.kernel_groups(g.groups), k)
    for grp in range(g.groups):
        need, names = regs_per_thread(g, copies, grp, hw)
        if need > budget:
            return grp, need, budget, names
    return None


def register_refusal(g: STaskGraph, hw: Hardware) -> str | None:
    """Why no kernel of ``g``'s tiling can compile clean for want of registers, or None where one may: its estimate at
    one copy of every buffer (the least any schedule holds) past a consumer warpgroup's budget by more than the
    operator's measured overcount (Hardware.reg_overcount). Such a tiling spills or serialises its wgmma pipeline
    under ptxas whatever the schedule, so the search does not solve it or ask the compiler."""
    x = register_excess(g, {}, hw)
    slack = hw.for_op(g.op).reg_overcount
    if x is None or x[1] - x[2] <= slack:
        return None
    return (f"registers {x[1]}/thread > {x[2]} ({', '.join(x[3])}) by {x[1] - x[2]}, more than the {slack} the "
            f"model's estimate was measured above ptxas's need on {g.op} kernels (bench study regfit): ptxas cannot "
            "fit it")


def _overlap(a0: int, a1: int, b0: int, b1: int, ii: int | None) -> bool:
    """Do [a0, a1) and [b0, b1) intersect (modulo ii: two loop tasks of any stages)?"""
    if ii is None:
        return a0 < b1 and b0 < a1
    a0, a1, b0, b1 = a0 % ii, a0 % ii + (a1 - a0), b0 % ii, b0 % ii + (b1 - b0)
    return any(a0 < b1 + k * ii and b0 + k * ii < a1 for k in (-1, 0, 1))


def _deadlock(p: SProgram, tm: dict[str, Timing], hw: Hardware) -> list[str]:
    """A cycle of waits whose iteration distances add up to <= 0 can never be released.

    Nodes are loop tasks; a barrier src->dst (dist d) says dst@i+d waits for src@i; in-order issue
    says consecutive tasks of one stream's body, (t1, stage s1) then (t2, stage s2), give
    t2@j-s2 after t1@j-s1, i.e. distance s1-s2, and the body wraps with distance 1 + s_last - s_first.
    Bellman-Ford with weight dist·K - 1 finds a cycle of total distance <= 0 as a negative cycle.
    """
    g = p.graph
    loop = {t.name for t in g.phase("loop")}
    arcs: list[tuple[str, str, int, str]] = []
    for b in p.barriers:
        if b.src in loop and b.dst in loop:
            arcs.append((b.src, b.dst, b.dist, f"barrier {b.src}->{b.dst} (dist {b.dist})"))
    for s, ops in p.streams(hw)["loop"].items():
        for (t1, s1), (t2, s2) in zip(ops, ops[1:]):
            arcs.append((t1, t2, s1 - s2, f"{s} issues {t1} before {t2}"))
        if len(ops) > 1:
            (tl, sl), (tf, sf) = ops[-1], ops[0]
            arcs.append((tl, tf, 1 + sl - sf, f"{s} wraps from {tl} to {tf}"))
    nodes = sorted(loop)
    K = len(nodes) + 1
    dist = dict.fromkeys(nodes, 0)
    pred: dict[str, tuple[str, str]] = {}
    last = None
    for _ in range(len(nodes)):
        last = None
        for u, v, d, why in arcs:
            w = d * K - 1
            if dist[u] + w < dist[v]:
                dist[v] = dist[u] + w
                pred[v] = (u, why)
                last = v
        if last is None:
            return []
    x = last
    for _ in range(len(nodes)):
        x = pred[x][0]
    cyc, y = [], x
    while True:
        u, why = pred[y]
        cyc.append(why)
        y = u
        if y == x:
            break
    return ["deadlock: a cycle of waits that can never be released: " + "; ".join(reversed(cyc))]


def _sync_problems(p: SProgram, tm: dict[str, Timing]) -> list[str]:
    """Missing barriers (a cross-stream dependence or a ring slot with no mbarrier is a race), barriers naming
    unknown tasks, and loop buffers without a ring depth or copy count."""
    g, v = p.graph, []
    have = set(p.barriers)
    for b in required_barriers(g, tm, p.rings, p.copies):
        if b not in have:
            what = "ring slot reuse" if b.kind == "empty" else f"dependency {b.src} -> {b.dst} (dist {b.dist})"
            v.append(f"{what} crosses streams {tm[b.src].stream} -> {tm[b.dst].stream} with no barrier; "
                     f"add Barrier({b.src!r}, {b.dst!r}, {b.dist}, {b.kind!r})")
    for b in p.barriers:
        if b.src not in g.task or b.dst not in g.task:
            v.append(f"barrier {b.src}->{b.dst} names an unknown task")
    for n in ring_users(g):
        d = p.rings.get(n) if is_ring(g, n) else p.copies.get(n)
        if d is None or d < 1:
            what = "ring depth" if is_ring(g, n) else "copy count"
            v.append(f"buffer {n!r} is allocated every iteration but has no {what} >= 1")
    return v


def _precedence_problems(p: SProgram, tm: dict[str, Timing], hw: Hardware) -> list[str]:
    """Dependencies whose latency the start times do not cover, and ring / register slots refilled before freed."""
    S, v = p.start, []
    for u, w, d, lat, kind in precedences(p.graph, tm, hw, p.rings, p.copies):
        if S[w] + d * p.ii >= S[u] + lat:
            continue
        if kind == "edge":
            v.append(f"dependency {u} -> {w} (dist {d}) not met: {w} starts at {S[w]}+{d}*{p.ii} but {u}'s result is "
                     f"ready at {S[u]}+{lat}; start {w} later or raise ii")
        else:
            v.append(f"over-full ring: {w} refills a slot {d} iterations later at {S[w]}+{d}*{p.ii}, but {u} "
                     f"frees it only at {S[u]}+{lat}; deepen the ring or raise ii")
    return v


def _resource_problems(p: SProgram, tm: dict[str, Timing]) -> list[str]:
    """Two reservations of one unit at once (loop tasks modulo ii), or a loop task holding a unit longer than ii."""
    S, v = p.start, []
    res: dict[str, list[tuple[int, int, str, str]]] = {}
    for t in p.graph.tasks:
        for r, o, n in tm[t.name].uses:
            res.setdefault(r, []).append((S[t.name] + o, S[t.name] + o + n, t.name, t.phase))
    for r, xs in sorted(res.items()):
        for i, (a0, a1, an, ap) in enumerate(xs):
            if ap == "loop" and a1 - a0 > p.ii:
                v.append(f"{an} holds {r} for {a1 - a0} cycles, longer than ii={p.ii}")
            for b0, b1, bn, bp in xs[i + 1:]:
                kinds = {ap, bp}
                if kinds == {"loop"}:
                    bad = _overlap(a0, a1, b0, b1, p.ii)
                elif "loop" in kinds:
                    (l0, l1, _), (o0, o1, op) = sorted(((a0, a1, ap), (b0, b1, bp)), key=lambda x: x[2] != "loop")
                    bad = o1 > l0 if op == "pre" else o0 < l1
                else:
                    bad = _overlap(a0, a1, b0, b1, None) if ap == bp else (ap == "post" and a0 < b1) or (
                        bp == "post" and b0 < a1)
                if bad:
                    v.append(f"{r} holds {an} [{a0},{a1}) and {bn} [{b0},{b1}) at once"
                             + (f" (modulo ii={p.ii})" if kinds == {"loop"} else ""))
    return v


def _capacity_problems(p: SProgram, hw: Hardware) -> list[str]:
    """Shared memory over the CTA's budget, and registers over the consumer warpgroups' (the compiler's count where
    the program carries one, else the model's)."""
    g, v = p.graph, []
    k = g.tiling.ctas
    sm, names = smem_peak(g, p.rings | p.copies, hw)
    smem_cap = Target(hw).smem_budget(k)
    if sm > smem_cap:
        v.append(f"shared memory {sm} B exceeds {smem_cap} B per block with {k} CTA(s) per SM on {hw.name} "
                 f"({', '.join(names)}); use smaller tiles, a shallower ring or fewer CTAs per SM")
    kg = g.tiling.kernel_groups(g.groups)
    budget = Target(hw).consumer_regs(kg, k)
    if p.registers > budget:
        v.append(f"the compiled kernel holds {p.registers} registers per thread but {kg} consumer warpgroups get "
                 f"{budget} each on {hw.name}")
    elif not p.registers and (x := register_excess(g, p.copies, hw)):
        grp, need, budget, names = x
        v.append(f"warpgroup {grp} needs {need} registers per thread ({', '.join(names)}, +{hw.reg_overhead}) but "
                 f"{kg} consumer warpgroups get {budget} each on {hw.name}; use fewer rows per warpgroup or "
                 "fewer live copies")
    return v


def check_valid(p: SProgram, hw: Hardware | str | None = None) -> Validity:
    """Check ``p`` on ``hw`` (a table or its name; default the program's); the result is truthy iff valid
    and lists each violation otherwise."""
    hw = load(hw or p.hw)
    g, v = p.graph, []
    tm = timings(g, hw)
    missing = sorted(set(g.task) - set(p.start))
    if missing:
        return Validity((f"tasks not scheduled: {missing}; give every task a start time",))
    extra = sorted(set(p.start) - set(g.task))
    if extra:
        v.append(f"start times for unknown tasks {extra}")
    if p.ii < 1:
        return Validity((f"initiation interval ii={p.ii} must be >= 1 cycle",))
    neg = sorted(t for t, s in p.start.items() if s < 0)
    if neg:
        v.append(f"negative start times for {neg}")
    v += _sync_problems(p, tm) + _precedence_problems(p, tm, hw) + _resource_problems(p, tm)
    v += _capacity_problems(p, hw)
    if not v:
        v += _deadlock(p, tm, hw)
    return Validity(tuple(v))
