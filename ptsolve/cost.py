"""The cost model: how long each sTask holds which resources, and when its result can be used.

A task holds its *issuing stream* (the producer warp or one consumer warpgroup: one in-order
instruction stream) and, when it runs elsewhere, a shared *execution unit* of the SM: ``tma`` (bulk copy
engine), ``tc`` (tensor cores, shared by all warpgroups) or ``sfu`` (MUFU, shared). Occupancy (how long a
resource is busy) and latency (how long until a consumer may start) are modelled separately: a wgmma
holds its warpgroup for a few issue cycles, the tensor cores for its throughput time, and its result
is usable only after the pipeline drains.

All durations are integer cycles of the SM clock (``hw.clock_ghz``), rounded up to the model's grain
(``GRAIN`` cycles, 8 by default, ``PTSOLVE_GRAIN`` to change): the exact solvers then work in grains,
which keeps their domains small, and the cost model is nowhere near 8-cycle accurate anyway.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

from . import arguments
from .errors import ConfigError
from .hw import Hardware
from .ir import STask, STaskGraph

# An invalid PTSOLVE_GRAIN must not break ``import ptsolve`` (the CLI could not print its one-line error): it is
# kept here and raised by grain(), which every duration of the cost model goes through.
try:
    GRAIN = arguments.env_grain(os.environ.get("PTSOLVE_GRAIN"))
    GRAIN_ERROR: ConfigError | None = None
except ConfigError as _e:
    GRAIN, GRAIN_ERROR = arguments.GRAIN_DEFAULT, _e


def check_grain() -> int:
    """GRAIN, or the ConfigError of an invalid PTSOLVE_GRAIN."""
    if GRAIN_ERROR is not None:
        raise GRAIN_ERROR
    return GRAIN


def grain(x: float) -> int:
    """``x`` cycles rounded up to a whole number of grains, in cycles."""
    q = check_grain()
    return max(1, math.ceil(x / q)) * q


@dataclass(frozen=True)
class Timing:
    """Resources a task holds, as (resource, offset from start, length) in cycles, and its latency."""

    stream: str
    uses: tuple[tuple[str, int, int], ...]
    latency: int

    def busy(self, resource: str) -> int:
        return sum(n for r, _, n in self.uses if r == resource)


def stream_of(t: STask) -> str:
    """The instruction stream that issues ``t``: ``producer`` or ``wg<k>``."""
    return "producer" if t.group < 0 else f"wg{t.group}"


def load_cycles(nbytes: float, reuse: float, hw: Hardware, misaligned: bool = False, busy_sms: int = 0) -> int:
    """Copy-engine occupancy of one global->shared tile load, cycles.

    occ = max(DRAM bytes / DRAM share, bytes / L2 share), where DRAM bytes = bytes / reuse (the other
    ``reuse - 1`` readers of the tile hit in L2), DRAM share = hbm_bytes_per_s / clock / SMs [B/clk/SM]
    and L2 share = hw.l2_bytes_per_clk [B/clk/SM]: all SMs stream at once, each gets its share. A TMA multicast
    (``STask.multicast``) is charged the same: each SM still receives the whole tile, and its share of L2 -> SM
    bandwidth is what bounds it (clusters sharing B by multicast measured no faster, bench study gemm_skinny).
    ``misaligned`` rows (STask.misaligned) get misaligned_share(hw, busy_sms) of it.
    """
    dram = nbytes / max(reuse, 1.0)
    l2 = hw.l2_bytes_per_clk * (misaligned_share(hw, busy_sms) if misaligned else 1.0)
    return max(1, math.ceil(max(dram / hw.hbm_bytes_per_clk, nbytes / l2)))


def misaligned_share(hw: Hardware, busy_sms: int = 0) -> float:
    """Fraction of an SM's L2 share that loads of misaligned rows get when ``busy_sms`` SMs run the launch (0: all).
    The L2 serves misaligned rows at hw.misaligned_l2_factor of its rate over the whole chip (3000³, every SM
    loading: 0.45; bench study gemm_heldout), so a launch that keeps fewer SMs busy splits that among fewer (1000³ at
    64×128 ping-pong, 64 CTAs: 33% slower than at K = 1008; at 128×192 ping-pong, 24 CTAs: 4%), up to the aligned
    share."""
    busy = hw.sms if busy_sms <= 0 else min(busy_sms, hw.sms)
    return min(1.0, hw.misaligned_l2_factor * hw.sms / busy)


def task_timing(t: STask, hw: Hardware, turns: bool = False, ctas: int = 1, op: str = "", groups: int = 1,
                busy_sms: int = 0) -> Timing:
    """Occupancy and latency of one task on ``hw`` (see _raw_timing), every number rounded up to GRAIN; ``turns``:
    the graph's consumer warpgroups take turns on the tensor cores; ``ctas``: CTAs resident on one SM; ``op``: the
    graph's operator (its own fitted constants, Hardware.for_op, and the key of hw.task_extra) and ``groups`` its
    consumer warpgroups; ``busy_sms``: SMs the launch keeps busy (0: all; misaligned loads share the L2 among them)."""
    r = _raw_timing(t, hw.for_op(op), turns, ctas, op, groups, busy_sms)
    return Timing(r.stream, tuple((x, grain(o) if o else 0, grain(n)) for x, o, n in r.uses), grain(r.latency))


def task_key(op: str, t: STask, groups: int) -> str:
    """``op/task/groups``: the key of a task in hw.task_extra (warpgroup g's ``exp2@g`` is every warpgroup's ``exp2``;
    ``groups`` consumer warpgroups share the SM's SFU and issue slots, so the same task costs more with two)."""
    return f"{op}/{t.name.split('@')[0]}/{groups}"


def task_extra_of(hw: Hardware, op: str, t: STask, groups: int) -> int:
    """hw.task_extra of ``t`` with ``groups`` consumer warpgroups, cycles. A warpgroup count the fit has no entry for
    takes the entry of the nearest fitted count below it (more warpgroups share the SFU and issue slots at least as
    much), else above it: a tiling must not look cheaper only because nobody profiled its warpgroup count."""
    stem = task_key(op, t, groups).rsplit("/", 1)[0] + "/"
    have = {int(k[len(stem):]): v for k, v in hw.task_extra.items() if k.startswith(stem) and k[len(stem):].isdigit()}
    if not have:
        return 0
    below = [g for g in have if g <= groups]
    return have[max(below)] if below else have[min(have)]


def _raw_timing(t: STask, hw: Hardware, turns: bool = False, ctas: int = 1, op: str = "", groups: int = 1,
                busy_sms: int = 0) -> Timing:
    """Occupancy and latency of one task on ``hw``.

    load:   stream busy ``issue`` (TMA: hw.issue_cycles; cp.async: + bytes/2048 instructions),
            tma busy load_cycles(), latency = load_cycles + hw.mem_latency.
    store:  like a load, with all bytes to DRAM (no reuse); where the table has a store rate (from registers, or
            staged through shared memory for the copy engine: STask.staged) the tile leaves the SM at that rate:
            stream and copy path busy bytes / rate cycles (the copy path at least its DRAM share), latency after it.
    mma:    tc busy flops / (tc_flops_per_clk · tc_efficiency) + hw.tc_fixed (fence, commit, wait and pipeline
            fill of one wgmma group, which no other group overlaps); latency = that + hw.tc_latency;
            wgmma holds its warpgroup hw.issue_cycles, mma.sync (no wgmma) holds it the whole time; with ``turns``
            (two or more consumer warpgroups issue mma tasks) each also holds tc hw.tc_handoff cycles more.
    vector: stream busy flops / (fp32 lanes · vector_efficiency), lanes = fp32_flops_per_clk / 2, times
            1 + hw.coresident · (ctas − 1) when other CTAs share the SM's issue slots;
            exp2 also holds the shared sfu for sfu / sfu_per_clk cycles and the stream at least as long;
            plus hw.task_extra["op/task/groups"] cycles of stream and latency (what the profiler measured beyond that
            throughput estimate: reductions' dependent chains and shuffles, the SFU shared with the other warpgroups).
    barrier: stream busy hw.barrier_cycles.
    """
    s = stream_of(t)
    if t.kind in ("load", "store"):
        occ = load_cycles(t.bytes, t.reuse if t.kind == "load" else 1.0, hw, t.misaligned, busy_sms)
        issue = hw.issue_cycles + (0 if hw.has_tma else math.ceil(t.bytes / 2048))
        rate = (hw.staged_store_bytes_per_clk if t.staged else hw.reg_store_bytes_per_clk) if t.kind == "store" else 0
        out = math.ceil(t.bytes / rate) if rate else 0  # the tile leaving the SM, its stream busy all along
        return Timing(s, ((s, 0, issue + out), ("tma", 0, max(occ, out))), max(occ, out) + hw.mem_latency)
    if t.kind == "mma":
        occ = max(1, math.ceil(t.flops / (hw.tc_flops_per_clk * hw.tc_efficiency))) + hw.tc_fixed
        occ += hw.tc_handoff if turns else 0
        issue = hw.issue_cycles if hw.has_wgmma else occ
        return Timing(s, ((s, 0, issue), ("tc", 0, occ)), occ + hw.tc_latency)
    if t.kind == "vector":
        lanes = hw.fp32_flops_per_clk / 2 * hw.vector_efficiency / (1 + hw.coresident * (ctas - 1))
        vec = math.ceil(t.flops / lanes)
        extra = task_extra_of(hw, op, t, groups)
        if t.sfu:
            sfu = math.ceil(t.sfu / hw.sfu_per_clk)
            d = max(vec, sfu, 1) + extra
            return Timing(s, ((s, 0, d), ("sfu", 0, sfu)), d)
        d = max(vec, 1) + extra
        return Timing(s, ((s, 0, d),), d)
    return Timing(s, ((s, 0, hw.barrier_cycles),), hw.barrier_cycles)


def timings(g: STaskGraph, hw: Hardware) -> dict[str, Timing]:
    """Timing of every task of ``g`` on ``hw`` (the graph says whether warpgroups take turns on the tensor cores and
    how many CTAs share an SM)."""
    turns = len({t.group for t in g.tasks if t.kind == "mma" and t.group >= 0}) > 1
    ctas = int(g.tiling.get("ctas", 1))
    busy = -(-g.n_ctas // g.tiling.slots)  # SMs the launch keeps busy (task_timing caps it at hw.sms)
    hw = hw.for_op(g.op)  # once, not per task
    return {t.name: task_timing(t, hw, turns, ctas, g.op, g.groups, busy) for t in g.tasks}


def edge_delay(tm: dict[str, Timing], src: str, dst: str, hw: Hardware) -> int:
    """Cycles from ``src``'s start until ``dst`` may start: ``src``'s latency, plus hw.barrier_cycles when
    the two are issued by different streams (an mbarrier arrive/wait pair carries the dependence).

    A tensor-core task's edge to itself is an accumulation chain (the next iteration's MMA accumulates into the same
    registers): the tensor cores take dependent accumulating MMAs back to back, so the next one may start once the
    tensor cores are done with this one (its ``tc`` occupancy), without the pipeline drain (hw.tc_latency) that a
    reader of the result waits for. The kernels issue it so: a warpgroup keeps its previous wgmma group in flight
    (wait<1>) while it issues the next."""
    if src == dst:
        tc = [o + n for r, o, n in tm[src].uses if r == "tc"]
        if tc:
            return max(tc)
    return tm[src].latency + (0 if tm[src].stream == tm[dst].stream else grain(hw.barrier_cycles))


SHARED = ("sfu", "tc", "tma")  # execution units all resident CTAs of an SM share (streams are per CTA)


def shared_busy(tm: dict[str, Timing], phase: dict[str, str]) -> dict[str, tuple[int, int]]:
    """Per shared unit: (occupancy of one loop iteration, occupancy of the pre and post phases), in the
    unit of ``tm`` (cycles, or grains in a Problem)."""
    out: dict[str, list[int]] = {}
    for n, t in sorted(tm.items()):
        for r, _, d in t.uses:
            if r in SHARED:
                out.setdefault(r, [0, 0])[0 if phase[n] == "loop" else 1] += d
    return {r: (a, b) for r, (a, b) in sorted(out.items())}


def resources(tm: dict[str, Timing]) -> list[str]:
    """All resources any task holds, sorted."""
    return sorted({r for t in tm.values() for r, _, _ in t.uses})


def lower_bound_ii(tm: dict[str, Timing], loop: list[str]) -> int:
    """Resource bound on the initiation interval: the busiest resource's total per iteration, cycles."""
    busy: dict[str, int] = {}
    for n in loop:
        for r, _, d in tm[n].uses:
            busy[r] = busy.get(r, 0) + d
    return max(busy.values(), default=1)
