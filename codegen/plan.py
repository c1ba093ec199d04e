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

PHASES = ("pre", "loop", "post")


@dataclass(frozen=True)
class KernelPlan:
    op: str                                   # "gemm" | "flash_attention" | "mamba2_chunk_scan" | ...
    params: dict[str, Any]                    # the operator's shape parameters (see ptsolve.ops)
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
    """The textbook order for ``op`` (every consumer task at stage 0; FA with ``overlap`` puts the
    softmax and PV one stage behind QK, FA3's intra-warpgroup overlap). For tests and baselines."""
    W = int(tiling["groups"])
    if op == "gemm":
        pre = {f"wg{g}": [(f"zero@{g}", 0)] for g in range(W)}
        loop: dict[str, list[tuple[str, int]]] = {"producer": [("load_a", 0), ("load_b", 0)]}
        loop |= {f"wg{g}": [(f"mma@{g}", 0)] for g in range(W)}
        post = {f"wg{g}": [(f"epilogue@{g}", 0), (f"store@{g}", 0)] for g in range(W)}
        tc = [f"mma@{g}" for g in range(W)]
    elif op == "flash_attention":
        s = 1 if overlap else 0
        pre = {"producer": [("load_q", 0)]} | {f"wg{g}": [(f"init@{g}", 0)] for g in range(W)}
        loop = {"producer": [("load_k", 0), ("load_v", 0)]}
        loop |= {f"wg{g}": [(f"mma_qk@{g}", 0), (f"rowmax@{g}", s), (f"exp2@{g}", s), (f"rowsum@{g}", s),
                            (f"rescale@{g}", s), (f"mma_pv@{g}", s)] for g in range(W)}
        post = {f"wg{g}": [(f"normalize@{g}", 0), (f"store@{g}", 0)] for g in range(W)}
        # no enforced turns: with this order, turns would serialise the warpgroups' softmaxes
        tc = []
    else:
        raise ValueError(f"no default plan for {op!r}")
    return KernelPlan(op, dict(params), dict(tiling), {"pre": pre, "loop": loop, "post": post}, tc)


def plan_from_program(program: Any, hw: Any = None) -> KernelPlan:
    """The KernelPlan of a ptsolve SProgram: its per-role issue orders with stages, and the order in which
    the tensor cores serve the mma tasks within one initiation interval."""
    from ptsolve.hw import load

    hwt = load(hw or program.hw)
    g = program.graph
    streams = program.streams(hwt)
    base = min((s for ops in streams["loop"].values() for _, s in ops), default=0)  # the first stage is 0
    order = {ph: {r: [(t, int(s) - (base if ph == "loop" else 0)) for t, s in ops] for r, ops in roles.items()}
             for ph, roles in streams.items()}
    mma = sorted((t.name for t in g.phase("loop") if t.kind == "mma"),
                 key=lambda n: (program.start[n] % program.ii, n))
    return KernelPlan(g.op, dict(g.params), dict(g.tiling), order, mma, int(program.ii), dict(program.copies))
