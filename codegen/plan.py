"""KernelPlan: the part of an SProgram a code generator needs, as plain data.

Role names: ``producer`` (the TMA warp) and ``wg0``, ``wg1``, ... (consumer warpgroups).
For each phase (``pre``, ``loop``, ``post``) and role, the plan lists the sTasks in issue order as
(task name, stage). In the loop body, iteration j of the emitted loop runs task t for reduction
iteration j - stage: a task with stage 1 works one iteration behind those with stage 0 (this is how
FA3's intra-warpgroup overlap appears: ``mma_qk`` at stage 0 issued before ``exp2`` at stage 1).
``tc_order`` is the order in which the tensor cores serve the consumer warpgroups' mma tasks inside one
loop body (e.g. ping-pong: wg0's GEMMs, then wg1's); a code generator may enforce it with named barriers.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from ptsolve.opspec import REGISTRY

PHASES = ("pre", "loop", "post")


@dataclass(frozen=True)
class KernelPlan:
    op: str                                   # "gemm" | "flash_attention" | "mamba2_chunk_scan" | ...
    params: dict[str, Any]                    # the operator's shape parameters (ptsolve.opspec.Operator.params)
    tiling: dict[str, int]                    # BM, BN (, BK), depth, groups
    order: dict[str, dict[str, list[tuple[str, int]]]]  # phase -> role -> [(task, stage), ...]
    tc_order: list[str] = field(default_factory=list)
    ii: int = 0                               # predicted initiation interval, cycles (informational)
    # register buffer -> copies the program was scheduled with (its register budget); an emitter that would
    # keep more copies for this order (ChunkScan's W fragments) keeps these and waits instead
    copies: dict[str, int] = field(default_factory=dict)

    @property
    def groups(self) -> int:
        return int(self.tiling["groups"])

    def stages(self) -> int:
        """Number of pipeline stages of the loop body (1 + the largest stage)."""
        return 1 + max((s for ops in self.order.get("loop", {}).values() for _, s in ops), default=0)

    def to_json(self) -> str:
        d = asdict(self)
        if not d["copies"]:
            del d["copies"]  # plans without it keep their JSON (and kernel names)
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_json(cls, s: str) -> KernelPlan:
        d = json.loads(s)
        order = {ph: {r: [(str(t), int(st)) for t, st in ops] for r, ops in roles.items()}
                 for ph, roles in d["order"].items()}
        return cls(d["op"], d["params"], d["tiling"], order, list(d.get("tc_order", [])), int(d.get("ii", 0)),
                   dict(d.get("copies", {})))


def default_plan(op: str, params: dict[str, Any], tiling: dict[str, int], overlap: bool = False) -> KernelPlan:
    """The textbook order for ``op``, every consumer task at stage 0. ``overlap`` puts the second half of each
    consumer's loop one stage behind the first: FA's softmax and PV behind QK (FA3's intra-warpgroup overlap,
    two score buffers), Mamba2's mma behind the vector task that feeds it (ChunkScan's decay, ChunkState's scale:
    two copies of what they hand over), so the tensor cores work on iteration j-1 while the CUDA cores prepare j.
    The consumers' mma tasks are served in warpgroup order (``tc_order``) except for attention without
    overlap, where turns would serialise the warpgroups' softmaxes. Each operator states its own (OpSpec.plan,
    in its file under ptsolve/ops). For tests, baselines and hand plans."""
    spec = REGISTRY.get(op)
    if spec is None or spec.plan is None:
        raise ValueError(f"no default plan for {op!r}")
    tb = spec.plan(dict(params), dict(tiling), overlap)
    return KernelPlan(op, dict(params), dict(tiling), tb.order, tb.tc_order, copies=dict(tb.copies))


def fa3_order_plan(params: dict[str, Any], tiling: dict[str, int]) -> KernelPlan:
    """FA3's intra-warpgroup overlap as a plan: QK of j issued, then PV of j-1, then the softmax of j; ping-pong:
    each warpgroup issues QK(j) and PV(j-1) in one turn, then hands the tensor cores on."""
    base = default_plan("flash_attention", params, tiling)
    loop: dict[str, list[tuple[str, int]]] = {"producer": [("load_k", 0), ("load_v", 0)]}
    fa3 = REGISTRY["flash_attention"].orders(tiling["groups"])["fa3"]
    loop |= {r: seq for r, seq in fa3.items() if r != "tc"}
    turns = [x for g in range(tiling["groups"]) for x in (f"mma_qk@{g}", f"mma_pv@{g}")]
    return KernelPlan(base.op, base.params, base.tiling, {**base.order, "loop": loop}, turns)


def min_copies(p: Any, hw: Any) -> dict[str, int]:
    """The copies of each copy buffer (ptsolve.protocol) the kernel keeps. A register buffer gets the fewest, at
    most the program's, for which the program's capacity precedences still hold: more would only cost registers.
    A shared-memory buffer keeps the program's copies: their bytes were budgeted with the tiling, so fewer buy
    nothing and turn the model's slack into a wait on the tensor core's completion (ChunkState's xs with one
    copy: 2.7% slower on the H200, bench study ab). A program that names no count for a copy buffer (saved before
    that buffer was one) gets what the model builds by default (``max_copies``)."""
    from ptsolve import protocol
    from ptsolve.cost import timings
    from ptsolve.policies.model import max_copies

    g = p.graph
    tm = timings(g, hw)
    out = max_copies(g, hw) | dict(p.copies)
    space = {b: x.space for b, x in g.buffers().items()}
    for b in protocol.copy_buffers(g):
        if space[b] != "reg":
            continue
        alloc = protocol.ring_users(g)[b][0]
        for c in range(1, out[b] + 1):
            prec = [x for x in protocol.precedences(g, tm, hw, p.rings, out | {b: c})
                    if x[4] == "ring" and x[1] == alloc]
            if all(p.start[w] + d * p.ii >= p.start[u] + lat for u, w, d, lat, _ in prec):
                out[b] = c
                break
    return out


def same_rotation(loop: dict[str, list[tuple[str, int]]], tc: list[str],
                  entry: dict[str, str] | None = None) -> dict[str, list[tuple[str, int]]]:
    """Each consumer warpgroup's loop started at a fixed task: ``entry[role]`` where the operator declares an issue
    order (its first task: FlashAttention's QK), else, for a warpgroup whose loop is a rotation of warpgroup 0's
    (the same tasks in the same cyclic order, a different first task: the model's slots start each role's loop
    wherever its ii window cuts it), warpgroup 0's first task. A task moved from the front to the end runs one stage
    earlier, and every role's stages are shifted alike if one would fall below 0. Each warpgroup still issues the
    same task instances in the same order: only where the emitted loop begins and which iterations the prologue and
    epilogue peel change. ptxas serialises the wgmma pipeline of FlashAttention's second warpgroup in the rotated
    form of FA3's order (QK(j+1) and PV(j) at the end of the loop body) and not in wg0's, and the GPU ran the
    solver's FA3-order schedules up to 24% slower when their warpgroups entered the loop elsewhere
    (bench study first_choice).
    Only where the tensor cores' turn order ``tc`` still serves every warpgroup's mma tasks in its new issue order."""
    from ptsolve.policies.orders import rotate
    out = dict(loop)
    ref = [t.split("@")[0] for t, _ in loop.get("wg0", [])]
    for r in sorted(k for k in loop if k.startswith("wg")):
        names = [t.split("@")[0] for t, _ in loop[r]]
        if entry and r in entry:
            m = next((i for i, (t, _) in enumerate(loop[r]) if t == entry[r]), 0)
        elif r == "wg0" or len(names) != len(ref) or names == ref or sorted(names) != sorted(ref):
            continue
        else:
            m = next((m for m in range(1, len(names)) if names[m:] + names[:m] == ref), 0)
        if not m:
            continue
        seq = rotate(loop[r], m)
        if [t for t, _ in seq if t in tc] == [t for t in tc if any(t == x for x, _ in seq)]:
            out[r] = seq
    low = min((s for seq in out.values() for _, s in seq), default=0)
    return {r: [(t, s - low) for t, s in seq] for r, seq in out.items()} if low < 0 else out


def entries(op: str, groups: int) -> dict[str, str] | None:
    """Where each consumer warpgroup's loop starts, from the operator's declared issue order (OpSpec.orders: the
    first order by name, its first task per warpgroup), or None when it declares none."""
    spec = REGISTRY.get(op)
    if spec is None or spec.orders is None:
        return None
    declared = spec.orders(groups)
    first = declared[sorted(declared)[0]]
    return {r: seq[0][0] for r, seq in sorted(first.items()) if r.startswith("wg") and seq}


def plan_from_program(program: Any, hw: Any = None) -> KernelPlan:
    """The KernelPlan of a ptsolve SProgram: its per-role issue orders with stages, the order in which the tensor
    cores serve the mma tasks within one initiation interval, and the copies its start times use (min_copies)."""
    from ptsolve.hw import load

    hwt = load(hw or program.hw)
    g = program.graph
    streams = program.streams(hwt)
    base = min((s for ops in streams["loop"].values() for _, s in ops), default=0)  # the first stage is 0
    order = {ph: {r: [(t, int(s) - (base if ph == "loop" else 0)) for t, s in ops] for r, ops in roles.items()}
             for ph, roles in streams.items()}
    mma = sorted((t.name for t in g.phase("loop") if t.kind == "mma"),
                 key=lambda n: (program.start[n] % program.ii, n))
    order["loop"] = same_rotation(order["loop"], mma, entries(g.op, g.groups))
    return KernelPlan(g.op, dict(g.params), dict(g.tiling), order, mma, int(program.ii), min_copies(program, hwt))
