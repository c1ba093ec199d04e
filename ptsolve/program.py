"""SProgram: a schedule of one CTA's sTask-graph, in the steady-state loop form.

A program fixes, for every task, its start time in cycles:
- ``pre`` tasks: from the CTA's start;
- ``loop`` tasks: iteration 0's start; iteration i starts ``i·ii`` later (a modulo schedule; the
  task's *stage* is ``start // ii``);
- ``post`` tasks: from ``(N-1)·ii``, N being the CTA's trip count.
So a CTA takes ``cta_time(N, ii, pre, last)`` = max(pre, (N-1)·ii + last) cycles (``SProgram.ends``): the
one objective that simulate() replays and every policy minimises. From the starts follow the per-stream issue
orders (what the code generator emits), the barrier-sTasks (mbarriers between streams, and the "empty" barriers of
each shared-memory ring), and the prologue / steady state / epilogue split.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from .cost import Timing, timings
from .errors import SchemaError
from .hw import Hardware
from .ir import SCHEMA_VERSION, STaskGraph, check_schema, loads
from .opspec import REGISTRY
from .protocol import copy_buffers, precedences, releases, ring_depths, ring_users

__all__ = ["Barrier", "SProgram", "make_program", "precedences", "required_barriers", "ring_users"]


def persistent(g: STaskGraph) -> bool:
    """Does ``g``'s kernel run persistent CTAs (tiling key ``persistent``: one CTA per SM slot deals itself the
    tiles, longest first, tile i to slot i mod slots)?"""
    return bool(g.tiling.get("persistent", 0))


def placement_of(g: STaskGraph, placement: str) -> str:
    """The CTA-to-SM rule ``g``'s kernel follows: a persistent kernel's own static deal, else ``placement``."""
    from .placement import STRIDED
    return STRIDED if persistent(g) else placement


def handover(g: STaskGraph, hw: Hardware) -> int:
    """Cycles of a tile that a persistent CTA hides under the previous tile's tail: the earliest any consumer loop
    task can start in a fresh CTA (the prologue's loads, the first ring fills: what the producer issues while the
    previous tile finishes); 0 for a grid launch. A lower bound on what the schedule's own first start hides."""
    if not persistent(g):
        return 0
    tm = timings(g, hw)
    asap: dict[str, int] = {}
    edges = [(u, v, lat) for u, v, d, lat, _ in precedences(g, tm, hw, ring_depths(g), {}) if d == 0]
    for t in g.topo_order():
        asap[t] = max((asap[u] + lat for u, v, lat in edges if v == t), default=0)
    cons = [t.name for t in g.phase("loop") if t.group >= 0]
    return min((asap[t] for t in cons), default=0)


def follow_tail(g: STaskGraph, hw: Hardware) -> int:
    """Cycles ``g``'s kernel takes after its grid's CTAs for its follow-up CTAs (OpSpec.follow): where the grid and
    the follow-ups exceed the SM slots (hw.sms · Tiling.slots), the follow-ups beyond them queue behind the grid, and
    the tail is the operator's hw.follow_cycles times the share of the slots they fill (all of it at most: a few
    queued ones start as the first CTAs of the grid leave); 0 when they are all resident beside the grid (their
    wait overlaps it, and the graph's own tasks charge their work) or there are none."""
    spec = REGISTRY.get(g.op)
    n = spec.follow(g.params, g.tiling, hw) if spec is not None and spec.follow is not None else 0
    slots = hw.sms * g.tiling.slots
    queued = min(n, g.n_ctas + n - slots)
    if queued <= 0:
        return 0
    return math.ceil(hw.for_op(g.op).follow_cycles * min(1.0, queued / slots))


def cta_time(trip: int, ii: int, pre: int, last: int) -> int:
    """Time of one CTA whose loop runs ``trip`` times: max(pre, (trip-1)·ii + last), in the unit of the
    arguments (cycles; grains in the solvers). ``pre``: when the prologue's last task ends; ``last``: when the
    last loop or epilogue task of a one-iteration CTA ends (each further iteration adds ii). A prologue task
    nothing waits for may end after the loop does; charging it inside the span would price such a CTA too high."""
    return max(pre, (trip - 1) * ii + last)


@dataclass(frozen=True)
class Barrier:
    """``dst`` of iteration i+dist waits until ``src`` of iteration i is done (an mbarrier).
    ``kind`` is ``data`` (a dependence between streams) or ``empty`` (a ring slot is free again)."""

    src: str
    dst: str
    dist: int = 0
    kind: str = "data"


@dataclass(frozen=True)
class SProgram:
    """A schedule of ``graph`` on ``hw``.

    ii: initiation interval, cycles. start: task -> start cycle (see module doc).
    rings: shared-memory buffer allocated in the loop -> slots (pipeline depth).
    copies: register buffer allocated in the loop -> copies held at once (2 = FA3's extra S tile).
    barriers: every cross-stream dependence and ring back-pressure, as mbarriers.
    placement: how CTAs go to SMs: ``even`` (the paper's even split), ``lpt`` (longest first), ``exact``.
    registers: per consumer thread, what ptxas gave the kernel where the compiler and not the model's estimate
    decided that the tiling fits (optimize's compiler in the loop); 0: the estimate (validate.regs_per_thread) stands.
    """

    graph: STaskGraph
    hw: str
    ii: int
    start: dict[str, int]
    rings: dict[str, int]
    copies: dict[str, int]
    barriers: tuple[Barrier, ...]
    placement: str = "even"
    policy: str = ""
    schema: int = field(default=SCHEMA_VERSION)
    registers: int = 0

    # -- derived views --------------------------------------------------------------------------
    def stage(self, task: str) -> int:
        return self.start[task] // self.ii if self.graph.task[task].phase == "loop" else 0

    def ends(self, hw: Hardware) -> tuple[int, int]:
        """(latest end of a pre task, latest end of a loop/post task in the frame of the last iteration),
        cycles; a task ends when its result is usable and it holds no resource."""
        tm = timings(self.graph, hw)
        e = {t.name: self.start[t.name] + max(tm[t.name].latency, max(o + n for _, o, n in tm[t.name].uses))
             for t in self.graph.tasks}
        pre = max((e[t.name] for t in self.graph.phase("pre")), default=0)
        return pre, max(e[t.name] for t in self.graph.tasks if t.phase != "pre")

    def cta_cycles(self, trip: int, hw: Hardware) -> int:
        """Predicted cycles of one CTA whose loop runs ``trip`` times: max(pre end, (trip-1)·ii + loop end)."""
        return cta_time(trip, self.ii, *self.ends(hw))

    def span(self, hw: Hardware) -> int:
        """Cycles of a CTA whose loop runs once."""
        return self.cta_cycles(1, hw)

    def streams(self, hw: Hardware) -> dict[str, dict[str, list[tuple[str, int]]]]:
        """phase -> stream -> [(task, stage)] in issue order (what each warp role executes)."""
        tm = timings(self.graph, hw)
        out: dict[str, dict[str, list[tuple[str, int]]]] = {"pre": {}, "loop": {}, "post": {}}
        for t in sorted(self.graph.tasks, key=lambda t: (self._slot(t.name), t.name)):
            out[t.phase].setdefault(tm[t.name].stream, []).append((t.name, self.stage(t.name)))
        return {ph: dict(sorted(d.items())) for ph, d in out.items()}

    def _slot(self, task: str) -> int:
        s = self.start[task]
        return s % self.ii if self.graph.task[task].phase == "loop" else s

    def summary(self, hw: Hardware) -> str:
        """The schedule per stream, one line each, for people."""
        lines = [f"{self.graph.name} tiling {self.graph.tiling} ii={self.ii} cycles, "
                 f"span={self.span(hw)} cycles, rings={self.rings}, copies={self.copies}, policy={self.policy}"]
        for ph, ss in self.streams(hw).items():
            for s, ops in ss.items():
                body = "  ".join(f"{t}" + (f"[s{st}]" if st else "") + f"@{self.start[t]}" for t, st in ops)
                lines.append(f"  {ph:4} {s:8} {body}")
        return "\n".join(lines)

    # -- JSON ---------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["graph"] = self.graph.to_dict()
        if not self.registers:  # the model's estimate: files written before the field stay byte-identical
            del d["registers"]
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SProgram:
        check_schema(d, "SProgram")
        try:
            g = STaskGraph.from_dict(d["graph"])
            return cls(graph=g, hw=str(d["hw"]), ii=int(d["ii"]), start={k: int(v) for k, v in d["start"].items()},
                       rings={k: int(v) for k, v in d["rings"].items()},
                       copies={k: int(v) for k, v in d["copies"].items()},
                       barriers=tuple(Barrier(**b) for b in d["barriers"]), placement=str(d["placement"]),
                       policy=str(d["policy"]), registers=int(d.get("registers", 0)))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            if isinstance(e, SchemaError):
                raise
            raise SchemaError(f"SProgram JSON is malformed: {e!r}; write it with SProgram.to_json()") from e

    @classmethod
    def from_json(cls, s: str) -> SProgram:
        return cls.from_dict(loads(s, "SProgram"))


def required_barriers(g: STaskGraph, tm: dict[str, Timing], rings: dict[str, int],
                      copies: dict[str, int]) -> list[Barrier]:
    """The mbarriers a program of ``g`` needs: one per cross-stream edge, and one ``empty`` barrier per ring
    release (ptsolve.protocol.releases) and per freeing task of a copy buffer."""
    out = {Barrier(e.src, e.dst, e.dist) for e in g.edges if tm[e.src].stream != tm[e.dst].stream}
    rel = releases(g)
    for b, (a, frees) in ring_users(g).items():
        if b in rel:
            if b in rings:
                out |= {Barrier(r.task, a, rings[b] - r.dist, "empty") for r in rel[b]}
        elif b in copies:
            out |= {Barrier(f, a, copies[b], "empty") for f in frees}
    return sorted(out, key=lambda b: (b.kind, b.src, b.dst, b.dist))


def make_program(g: STaskGraph, hw: Hardware, ii: int, start: dict[str, int], copies: dict[str, int] | None = None,
                 placement: str = "even", policy: str = "") -> SProgram:
    """An SProgram from a modulo schedule; rings take the tiling's ``depth``, barriers are derived."""
    tm = timings(g, hw)
    rings = ring_depths(g)
    cp = dict.fromkeys(copy_buffers(g), 1) | (copies or {})
    return SProgram(graph=g, hw=hw.name, ii=int(ii), start=dict(sorted(start.items())), rings=rings, copies=cp,
                    barriers=tuple(required_barriers(g, tm, rings, cp)), placement=placement, policy=policy)
