"""The one HIP gfx942 skeleton: any KernelIR lowered for an AMD table plus an operator's task bodies -> a
wave-specialised kernel.

The same KernelIR the CUDA skeleton emits decides everything about the pipeline, through the same walk
(``codegen.walk``; this module is its gfx942 ``Backend``): the roles (the producer and the consumer groups, four
waves each, one per SIMD), each role's prologue / software-pipelined loop / epilogue (``codegen.loop.emit_loop``),
the LDS rings (``depth`` slots at the KernelIR's offsets) with a full and an
empty semaphore per slot, the full waits at a ring's first reader, the empty arrivals at its release points
(``end`` / ``wait`` / ``commit``, and the ones past the last iteration at the end of a tile), the prologue's
buffers released at the end of a persistent tile, the tensor-core turns between consumer groups (with
``s_setprio``), the persistent tile loop. MFMA is synchronous for the issuing wave, so the KernelIR's wgmma waits
and commits need no code; a ring slot is still released exactly where the KernelIR says, which is where the model
assumed it.

The producer has no TMA: each load task's global reads are issued one of its iterations early into the producer's
registers (``stg_<task>``), and at the task's place in the order the producer waits for the slot's release,
writes the registers into LDS and arrives on the slot's full semaphore. The synchronisation sequence is the
KernelIR's, so ``codegen.sync_sim.check`` (the CPU deadlock simulator) covers this kernel too.

An operator (``OpKernel``) adds: constants, a tile decoder, the producer's staging registers and each load's
stage (global -> registers) and commit (registers -> LDS at ``dst_``) code, the consumers' declarations and task
bodies. A body sees ``it_`` (its reduction iteration), ``<buf>_cur`` (the LDS slot of each buffer it touches, as
``u8*``), ``lane``, ``wq`` (wave in its group), ``g`` (consumer group), ``ptid`` (producer lane 0..255).
"""
from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ptsolve.errors import CodegenError
from ptsolve.hw import load

from ..kernel_ir import KernelIR, Release, Ring, Role
from ..sync_sim import check as check_protocol
from ..walk import (
    Consumer,
    Parts,
    Task,
    Walk,
    cname,
    copies_note,
    facts,
    register_copies,
    slot_pointers,
    tile_loop,
    walk,
)
from .common import COMMON, GROUP_LANES, GROUP_WAVES, PRELUDE, PRELUDE_END, HipSource, check_dtype


@dataclass(frozen=True)
class OpKernel:
    """What one operator adds to the skeleton. ``signature``: (launch argument, C parameter) pairs; ``tiles(ir)`` ->
    (number of tiles, C++ that turns ``tile`` into the operator's coordinates and ``T``, the trip count, and may set
    ``skip_``); ``pdecls``: the producer's staging registers; ``stage(ir, task, it)``: global loads of ``task``'s
    iteration ``it`` into its staging registers; ``commit(ir, task)``: those registers into LDS at ``dst_``;
    ``decls(ir, role)``: a consumer group's registers; ``body(task)``: a consumer task; ``trips``: the trip count as
    an int when every tile has the same compile-time one."""

    op: str
    check: Callable[[KernelIR], None]
    consts: Callable[[KernelIR], str]
    signature: Callable[[KernelIR], tuple[tuple[str, str], ...]]
    tiles: Callable[[KernelIR], tuple[int, str]]
    pdecls: Callable[[KernelIR], str]
    stage: Callable[[KernelIR, str, str], str]
    commit: Callable[[KernelIR, str], str]
    decls: Callable[[KernelIR, Role], str]
    body: Callable[[Task], str]
    trips: Callable[[KernelIR], int | str] = lambda ir: "T"
    min_trips: int = 1
    info: Callable[[KernelIR], dict[str, Any]] = lambda ir: {}


REGISTRY: dict[str, OpKernel] = {}


def check_target(ir: KernelIR) -> None:
    """CodegenError unless ``ir`` was lowered for an AMD gfx942 table and fits its LDS and workgroup limits."""
    hw = load(ir.target)
    if hw.vendor != "amd" or hw.arch != "gfx942":
        raise CodegenError(f"the HIP generator emits gfx942 kernels; this KernelIR was lowered for {ir.target!r} "
                           f"({hw.arch}): lower it with hw='mi300x'")
    if ir.smem_bytes > hw.smem_per_block:
        raise CodegenError(f"{ir.op}: {ir.smem_bytes} B of LDS exceed the {hw.smem_per_block} B a workgroup may "
                           "allocate on gfx942; use smaller tiles or a shallower ring")
    if GROUP_LANES * (ir.groups + 1) > hw.max_threads:
        raise CodegenError(f"{ir.op}: {ir.groups} consumer groups need {GROUP_LANES * (ir.groups + 1)} threads, over "
                           f"the {hw.max_threads} of a gfx942 workgroup; use at most "
                           f"{hw.max_threads // GROUP_LANES - 1}")
    if ir.profile:
        raise CodegenError("the HIP skeleton has no instrumented (profile) build; lower with profile=False")
    if ir.ctas != 1:
        raise CodegenError(f"{ir.op}: ctas={ir.ctas}; the HIP skeleton runs one workgroup per CU (ctas=1)")
    if ir.pingpong:
        raise CodegenError(f"{ir.op}: ping-pong (each consumer group its own tile, turns per tile) has no HIP build; "
                           "use pingpong=0")
    if ir.multicast:
        raise CodegenError(f"{ir.op}: a cluster's TMA multicast ({', '.join(ir.multicast)}) has no HIP build; "
                           "use cluster=1")
    if ir.tiling.get("tma_store", 0):
        raise CodegenError(f"{ir.op}: the TMA-store epilogue (tma_store=1) has no HIP build (gfx942 has no tensor "
                           "copy engine); use tma_store=0")


def emit_ir(ir: KernelIR, plan_id: str | None = None) -> HipSource:
    """HIP source and launch metadata of ``ir``; CodegenError when its operator has no HIP task bodies, the target is
    not gfx942, the operator refuses the shape, or the synchronisation could deadlock (``codegen.sync_sim.check``)."""
    if ir.op not in REGISTRY:
        raise CodegenError(f"the HIP generator emits {sorted(REGISTRY)}, not {ir.op!r}")
    check_target(ir)
    check_dtype(ir.params)
    opk = REGISTRY[ir.op]
    opk.check(ir)
    check_protocol(ir)
    w = facts(ir, opk, plan_id or hashlib.sha256(ir.to_json().encode()).hexdigest()[:8])
    src = tile_loop(_source(w, walk(w, BACKEND)), *_tile_loop(w))
    if not ir.persistent and w.ntiles >= 1 << 31:
        raise CodegenError(f"{ir.op}: {w.ntiles} workgroups exceed the grid's x limit (2^31 - 1)")
    W, nthreads = ir.groups, GROUP_LANES * (ir.groups + 1)
    grid = (min(w.ntiles, ir.sms), 1, 1) if ir.persistent else (w.ntiles, 1, 1)
    loop_rings = w.loop_rings
    return HipSource(source=src, name=_kernel_name(ir, w.pid), op=ir.op, params=dict(ir.params), grid=grid,
                     block=(nthreads, 1, 1), lds_bytes=ir.smem_bytes, args=tuple(a for a, _ in opk.signature(ir)),
                     persistent_tiles=w.ntiles if ir.persistent else 0,
                     info={"tiling": dict(ir.tiling), "rings": {r.name: r.depth for r in loop_rings},
                           "roles": [r.name for r in ir.roles], "groups": W, "waves": GROUP_WAVES * (W + 1),
                           "orders": {r.name: [list(x) for x in r.loop] for r in ir.roles},
                           "copies": dict(ir.copies), "tc_turns": None if w.tn is None else w.tn.handoffs,
                           "turns_note": ir.turns_note, **opk.info(ir)})


def _arrivals(r: Ring) -> int:
    """Arrivals that free one slot of ``r``: every wave of each releasing role."""
    return GROUP_WAVES * len({x.role for x in r.releases})


class _Hip:
    """The gfx942 text of the walk's steps (``codegen.walk.Backend``): LDS semaphores for the rings and turns,
    the producer's loads staged one iteration ahead in registers, MFMA with nothing to wait for."""

    ptr = "u8*"

    def slot_pointer(self, buf: str, addr: str) -> str:
        return f"  u8* const {buf}_cur = {addr}; (void){buf}_cur;"

    def fill(self, w: Walk, name: str, it: str) -> str:
        r = w.fill_of[name]
        dst = w.ir.task(name).smem
        lines = [f"{{ const int it_ = {it}; const int q_ = rbase + it_; const int s_ = q_ % {r.depth};",
                 f"  sem_wait(&{r.name}_empty[s_], (u32)(q_ / {r.depth}) * {_arrivals(r)}u);  "
                 f"// slot s_ released by the consumers of iteration it_ - {r.depth}",
                 *slot_pointers(w, self, name, "q_"),
                 f"  u8* const dst_ = {cname(dst[0])}_cur;",
                 w.opk.commit(w.ir, name),
                 f"  sem_arrive(&{r.name}_full[s_], lane);  // {', '.join(r.buffers)} of iteration it_ landed",
                 f"  if (it_ + 1 < {w.trips}) {{  // the next iteration's global reads, in flight while this one is "
                 "used", w.opk.stage(w.ir, name, "it_ + 1"), "  }", "}"]
        return "\n".join(lines)

    def producer_pre(self, w: Walk) -> list[str]:
        pre, ir = w.pre, w.ir
        if pre is None:
            return []
        out = [f"if (PERSISTENT) sem_wait(pre_empty, (u32)lt * {_arrivals(pre)}u);  // the previous tile is "
               f"done with {', '.join(pre.buffers)}"]
        for name, _ in ir.role("producer").pre:
            if name in dict(pre.fills):
                buf = ir.task(name).smem[0]
                out.append(f"// pre: {name}\n{{ const int it_ = 0; (void)it_;\n"
                           f"  u8* const dst_ = {cname(buf)}_s;\n{w.opk.stage(ir, name, '0')}\n"
                           f"{w.opk.commit(ir, name)}\n  sem_arrive(pre_full, lane);\n}}")
        return out

    def consumer(self, w: Walk, role: Role, base: Consumer) -> Consumer:
        # MFMA is synchronous for the issuing wave: no commit groups, nothing to wait for
        return dataclasses.replace(base, nbuf=register_copies(
            w.ir, role, "the HIP skeleton keeps at most two (reorder so that at most one stage separates a "
            "buffer's writer from its readers)"))

    def full_wait(self, w: Walk, r: Ring) -> str:
        target = f"(u32)((q_) / {r.depth} + 1) * {len(r.fills) * GROUP_WAVES}u"
        return (f"  sem_wait(&{r.name}_full[q_ % {r.depth}], {target});  "
                f"// {', '.join(r.buffers)} of iteration it_ landed")

    def release(self, w: Walk, r: Ring, slot: str, x: Release) -> str:
        # a "wait" release sits where the KernelIR puts it, after the wgmma wait a Hopper kernel has there
        return f"    sem_arrive(&{r.name}_empty[({slot}) % {r.depth}], lane);"

    def wg_wait(self, depth: int) -> str:
        return ""

    def probe(self, w: Walk, var: str) -> str:
        return ""

    def record(self, w: Walk, task: str, phase: str, it: str) -> str:
        return ""

    def role_head(self, w: Walk, role: Role) -> list[str]:
        order = ", ".join(f"{n}(stage {s})" for n, s in role.loop)
        return [f"// ---- consumer group {role.group}: waves {GROUP_WAVES * (role.group + 1)}.."
                f"{GROUP_WAVES * (role.group + 2) - 1}; loop order {order}" + copies_note(w.ir, role),
                "u32 turns_seen = 0; (void)turns_seen;", w.opk.decls(w.ir, role)]

    def tile_head(self, w: Walk, role: Role) -> list[str]:
        return []

    def pre_wait(self, w: Walk) -> str:
        n = len(w.pre.fills) * GROUP_WAVES if w.pre else 0
        return f"sem_wait(pre_full, (u32)(lt + 1) * {n}u);  // the prologue's loads landed"

    def edge_task(self, w: Walk, role: Role, name: str, phase: str) -> list[str]:
        it = "0" if phase == "pre" else "T - 1"
        return [f"// {phase}: {name}\n{{ const int it_ = {it}; (void)it_;\n"
                f"{w.opk.body(Task(name, role, it, None, phase, w.ir))}\n}}"]

    def turns(self, w: Walk, role: Role) -> tuple[dict[str, tuple[str, str]] | None, list[str], list[str]]:
        return (None if w.tn is None else _turn_code(w.tn.ops.get(role.name, {}))), [], []

    def tile_done(self, w: Walk, role: Role) -> list[str]:
        return []

    def release_pre(self, w: Walk, role: Role) -> str:
        return "  sem_arrive(pre_empty, lane);"

    def first_turn(self, w: Walk) -> str:
        tn = w.tn
        if tn is None or tn.first is None:
            return ""
        return f"if (g == {int(tn.first[0][2:])}) sem_arrive(&turn_ctr[{tn.first[1] - 1}], lane);  // the first turn"


BACKEND = _Hip()


def _semaphores(w: Walk) -> tuple[list[str], int]:
    """The semaphores in the KernelIR's barrier area: a full and an empty one per ring slot, the prologue's pair,
    one turn counter per consumer group; and how many words they take."""
    ir = w.ir
    sems, off = [], ir.barriers
    for r in w.loop_rings:
        sems.append(f"  u32* const {r.name}_full = reinterpret_cast<u32*>(smem + {off});  "
                    f"// ring {r.name}: {r.depth} LDS stages of {', '.join(r.buffers)}")
        sems.append(f"  u32* const {r.name}_empty = {r.name}_full + {r.depth}; (void){r.name}_empty;")
        off += 8 * r.depth
    sems.append(f"  u32* const pre_full = reinterpret_cast<u32*>(smem + {off}); (void)pre_full;")
    sems.append("  u32* const pre_empty = pre_full + 1; (void)pre_empty;")
    sems.append("  u32* const turn_ctr = pre_full + 2; (void)turn_ctr;  // one counter per consumer group")
    nsem = (off - ir.barriers) // 4 + 2 + ir.groups
    if ir.barriers + 4 * nsem > ir.smem_bytes:
        raise CodegenError(f"{ir.op}: the semaphores do not fit the KernelIR's barrier area ({ir.smem_bytes} B)")
    return sems, nsem


def _ring_notes(ir: KernelIR) -> list[str]:
    """One comment line per ring: its stages, buffers, fills, first readers and release points."""
    return [f"//   ring {r.name}: {r.depth} LDS stages, buffers "
            + ", ".join(f"{b} @{ir.buffer(b).offset} +{ir.buffer(b).stride}/stage" for b in r.buffers)
            + f"; filled by {', '.join(t for t, _ in r.fills)}; read first by "
            + ", ".join(f"{a}:{b}" for a, b in r.waiters) + "; released by "
            + ", ".join(f"{x.role}:{x.task or 'end of tile'}({x.mode}{', +' + str(x.dist) if x.dist else ''})"
                        for x in r.releases) for r in ir.rings]


def _tile_loop(w: Walk) -> tuple[str, str]:
    """The head and end of the tile loop: persistent workgroups stride over the tiles, else one tile each."""
    if w.ir.persistent:
        head = ("for (int tile = block_id(), lt = 0, rbase = 0; tile < NTILES; tile += num_blocks(), ++lt) {\n"
                "  bool skip_ = false; (void)skip_;\n" + w.decode + "\n  if (skip_) continue;")
        return head, "  rbase += T;  // ring position of the next tile's first iteration\n}"
    head = ("{\n  constexpr int lt = 0, rbase = 0; (void)lt;\n  const int tile = block_id();\n"
            "  bool skip_ = false; (void)skip_;\n" + w.decode + "\n  if (skip_) return;")
    return head, "}"


def _source(w: Walk, parts: Parts) -> str:
    """The kernel's source around the walk's parts (``TILE_LOOP`` / ``TILE_END`` still to be replaced)."""
    ir, opk, tn, pid = w.ir, w.opk, w.tn, w.pid
    W = ir.groups
    sems, nsem = _semaphores(w)
    nthreads = GROUP_LANES * (W + 1)
    first_loads = "\n".join(f"{{ const int it_ = 0; (void)it_;  // {n}: iteration 0's global reads\n"
                            f"{opk.stage(ir, n, '0')}\n}}" for n, _ in ir.role("producer").loop)
    prod_order = ", ".join(f"{n}(stage {s})" for n, s in ir.role("producer").loop)
    turns_note = ('enforced: ' + ', '.join(ir.tc_order) if tn is not None else
                  'none (' + (ir.turns_note or 'one group') + ')')
    return f"""// generated by ptsolve codegen.hip.skeleton ({ir.op}, plan {pid}) for gfx942; compile-verified, not run
// roles: producer waves 0..{GROUP_WAVES - 1}, {W} consumer group(s) of {GROUP_WAVES} waves; {nthreads} threads
// LDS {ir.smem_bytes} B (the KernelIR's layout):
{chr(10).join(_ring_notes(ir))}
// tensor-core turns: {turns_note}
{PRELUDE}
{COMMON}
{PRELUDE_END}
PTS_KERNEL({nthreads})
{_kernel_name(ir, pid)}({', '.join(c for _, c in opk.signature(ir))}) {{
  using namespace pts;
{opk.consts(ir)}
  constexpr int NTILES = {w.ntiles}; (void)NTILES;
  constexpr bool PERSISTENT = {'true' if ir.persistent else 'false'}; (void)PERSISTENT;
  __shared__ __attribute__((aligned(16))) u8 smem[{ir.smem_bytes}];
{chr(10).join(parts.pre_ptrs)}
{chr(10).join(sems)}
  const int tid = thread_id();
  const int lane = tid & 63;
  const int wave = uniform(tid >> 6);
  for (int i = tid; i < {nsem}; i += {nthreads}) reinterpret_cast<u32*>(smem + {ir.barriers})[i] = 0u;
  block_sync();
  if (wave < {GROUP_WAVES}) {{  // ---- producer: loop order {prod_order}
    const int ptid = tid;
{opk.pdecls(ir)}
    TILE_LOOP {{
{chr(10).join(parts.producer_pre)}
{first_loads}
{parts.producer}
    TILE_END
  }} else {{
    const int g = wave / {GROUP_WAVES} - 1;
    const int wq = wave % {GROUP_WAVES}; (void)wq;
{parts.first_turn}
{parts.consumers}
  }}
}}
"""


def _turn_code(ops: Mapping[str, tuple[int | None, int | None]]) -> dict[str, tuple[str, str]]:
    """emit_loop's ``turn`` argument: wait for the turn (all four waves of the giving group arrived), raise this
    wave's issue priority while its MFMAs run, lower it and pass the turn on."""
    out = {}
    for task, (w, p) in ops.items():
        pre = "" if w is None else (f"turns_seen += {GROUP_WAVES}u; sem_wait(&turn_ctr[{w - 1}], turns_seen);  "
                                    f"// wait for the turn before {task}\nPTS_SETPRIO(1);")
        post = "" if p is None else (f"PTS_SETPRIO(0);\nsem_arrive(&turn_ctr[{p - 1}], lane);  "
                                     f"// {task} issued: pass the turn on")
        out[task] = (pre, post)
    return out


def _kernel_name(ir: KernelIR, pid: str) -> str:
    """pts_hip_<op>_<dtype>_<tiling>_<plan id>: only ints and known words reach the source."""
    t = "_".join(f"{k.lower()}{int(v)}" for k, v in sorted(ir.tiling.items()))
    return f"pts_hip_{ir.op}_{ir.params.get('dtype', 'fp16')}_{t}{'_p' if ir.persistent else ''}_{pid}"

