"""The one HIP gfx942 skeleton: any KernelIR lowered for an AMD table plus an operator's task bodies -> a
wave-specialised kernel.

The same KernelIR the CUDA skeleton emits decides everything about the pipeline: the roles (the producer and the
consumer groups, four waves each, one per SIMD), each role's prologue / software-pipelined loop / epilogue through
``codegen.loop.emit_loop``, the LDS rings (``depth`` slots at the KernelIR's offsets) with a full and an
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

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ptsolve.errors import CodegenError
from ptsolve.hw import load

from ..kernel_ir import KernelIR, Ring, Role
from ..loop import emit_loop
from ..sync_sim import check as check_protocol
from ..sync_sim import loops, turns
from .common import COMMON, GROUP_LANES, GROUP_WAVES, PRELUDE, PRELUDE_END, HipSource, check_dtype


@dataclass(frozen=True)
class Task:
    """One task instance as a body sees it: ``name`` (graph name), ``base`` (without ``@g``), ``role``, ``it`` (C
    expression of its iteration), ``parity`` (0/1 for double-buffered registers, else None), ``phase``."""

    name: str
    role: Role
    it: str
    parity: int | None
    phase: str
    ir: KernelIR

    @property
    def base(self) -> str:
        return self.name.split("@")[0]


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


def _cname(buf: str) -> str:
    return buf.split("@")[0]


def _regbufs(ir: KernelIR, role: Role) -> int:
    """Register copies a role keeps of its loop buffers: 2 when any copy count is 2 (the loop is unrolled by two
    and each task picks its copy by the parity of its iteration)."""
    own = {b for n, _ in role.loop for b in ir.task(n).regs}
    n = max((ir.copies.get(b, 1) for b in own), default=1)
    if n > 2:
        raise CodegenError(f"{role.name}: {n} register copies of one buffer; the HIP skeleton keeps at most two "
                           "(reorder so that at most one stage separates a buffer's writer from its readers)")
    return n


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
    pid = plan_id or hashlib.sha256(ir.to_json().encode()).hexdigest()[:8]
    lo = loops(ir)
    tn = turns(ir, lo)
    W = ir.groups
    rings = {r.name: r for r in ir.rings}
    pre = rings.get("pre")
    loop_rings = [r for r in ir.rings if r.phase == "loop"]
    fill_of = {t: r for r in ir.rings for t, _ in r.fills}
    ring_of_buf = {b: r for r in loop_rings for b in r.buffers}
    trips = opk.trips(ir)
    ntiles, decode = opk.tiles(ir)

    def arrivals(r: Ring) -> int:
        return GROUP_WAVES * len({x.role for x in r.releases})

    def full_target(r: Ring, q: str) -> str:
        return f"(u32)(({q}) / {r.depth} + 1) * {len(r.fills) * GROUP_WAVES}u"

    def ptr(buf: str, slot: str | None) -> str:
        s = ir.buffer(buf)
        if slot is not None and s.slots > 1:
            return f"smem + {s.offset} + ({slot}) * {s.stride}"
        return f"smem + {s.offset}"

    def pointers(task: str, slot_expr: str) -> list[str]:
        out = []
        for b in ir.task(task).smem:
            r = ring_of_buf.get(b)
            if r is not None:
                out.append(f"  u8* const {_cname(b)}_cur = {ptr(b, f'({slot_expr}) % {r.depth}')}; "
                           f"(void){_cname(b)}_cur;")
            elif ir.buffer(b).slots > 1 or ir.buffer(b).role:
                out.append(f"  u8* const {_cname(b)}_cur = {ptr(b, f'(it_) % {ir.buffer(b).slots}')}; "
                           f"(void){_cname(b)}_cur;")
        return out

    def release(r: Ring, slot: str) -> str:
        return f"    sem_arrive(&{r.name}_empty[({slot}) % {r.depth}], lane);"

    # ---- producer: four waves; each load task's global reads run one of its iterations ahead in registers
    def prod_body(name: str, it: str, parity: int | None, waits: Any) -> str:
        r = fill_of[name]
        dst = ir.task(name).smem
        lines = [f"{{ const int it_ = {it}; const int q_ = rbase + it_; const int s_ = q_ % {r.depth};",
                 f"  sem_wait(&{r.name}_empty[s_], (u32)(q_ / {r.depth}) * {arrivals(r)}u);  "
                 f"// slot s_ released by the consumers of iteration it_ - {r.depth}",
                 *pointers(name, "q_"),
                 f"  u8* const dst_ = {_cname(dst[0])}_cur;",
                 opk.commit(ir, name),
                 f"  sem_arrive(&{r.name}_full[s_], lane);  // {', '.join(r.buffers)} of iteration it_ landed",
                 f"  if (it_ + 1 < {trips}) {{  // the next iteration's global reads, in flight while this one is used",
                 opk.stage(ir, name, "it_ + 1"), "  }", "}"]
        return "\n".join(lines)

    prod = ir.role("producer")
    loop_loads = [n for n, _ in prod.loop]
    prod_pre = []
    if pre is not None:
        prod_pre.append(f"if (PERSISTENT) sem_wait(pre_empty, (u32)lt * {arrivals(pre)}u);  // the previous tile is "
                        f"done with {', '.join(pre.buffers)}")
        for name, _ in prod.pre:
            if name in dict(pre.fills):
                buf = ir.task(name).smem[0]
                prod_pre.append(f"// pre: {name}\n{{ const int it_ = 0; (void)it_;\n"
                                f"  u8* const dst_ = {_cname(buf)}_s;\n{opk.stage(ir, name, '0')}\n"
                                f"{opk.commit(ir, name)}\n  sem_arrive(pre_full, lane);\n}}")
    first_loads = "\n".join(f"{{ const int it_ = 0; (void)it_;  // {n}: iteration 0's global reads\n"
                            f"{opk.stage(ir, n, '0')}\n}}" for n in loop_loads)
    prod_code = emit_loop(lo["producer"], trips, prod_body, 1, {}, min_trips=opk.min_trips)

    # ---- consumers: groups of four waves
    branches = []
    for role in (r for r in ir.roles if r.group >= 0):
        rn, loop = role.name, lo[role.name]
        names = {n for n, _ in role.loop}
        nbuf = _regbufs(ir, role)
        waiter_of = {t: [r for r in loop_rings if (rn, t) in r.waiters] for t in names}
        rel = {t: [(r, x) for r in loop_rings for x in r.releases if x.role == rn and x.task == t] for t in names}

        def body(name: str, it: str, parity: int | None, waits: Mapping[str, int] | None,
                 role: Role = role, waiter_of: dict = waiter_of, rel: dict = rel) -> str:  # noqa: B008
            lines = [f"{{ const int it_ = {it}; const int q_ = rbase + it_; (void)q_;"]
            for r, x in rel[name]:
                if x.mode == "wait":  # the KernelIR releases here, after the wgmma wait a Hopper kernel has
                    guard = f"if (it_ >= {x.dist}) " if x.dist else ""
                    lines.append(f"  {guard}{{  // {', '.join(r.buffers)} of iteration it-{x.dist} released\n"
                                 f"{release(r, f'q_ - {x.dist}')}\n  }}")
            for r in waiter_of[name]:
                lines.append(f"  sem_wait(&{r.name}_full[q_ % {r.depth}], {full_target(r, 'q_')});  "
                             f"// {', '.join(r.buffers)} of iteration it_ landed")
            lines += pointers(name, "q_")
            lines.append(opk.body(Task(name, role, "it_", parity, "loop", ir)))
            for r, x in rel[name]:
                if x.mode == "commit":
                    lines.append(f"  if (it_ >= 1) {{  // {', '.join(r.buffers)} of iteration it-1 released\n"
                                 f"{release(r, 'q_ - 1')}\n  }}")
                elif x.mode == "end":
                    lines.append(f"  {{  // {', '.join(r.buffers)} of this iteration released\n"
                                 f"{release(r, 'q_')}\n  }}")
            lines.append("}")
            return "\n".join(lines)

        order = ", ".join(f"{n}(stage {s})" for n, s in role.loop)
        code = [f"// ---- consumer group {role.group}: waves {GROUP_WAVES * (role.group + 1)}.."
                f"{GROUP_WAVES * (role.group + 2) - 1}; loop order {order}"
                + "".join(f"; {b}: {c} copies" for b, c in sorted(ir.copies.items())
                          if b.endswith(f"@{role.group}") and c > 1),
                "u32 turns_seen = 0; (void)turns_seen;", opk.decls(ir, role)]
        tile = []
        pw = dict(pre.waiters).get(rn) if pre is not None else None
        pre_wait = f"sem_wait(pre_full, (u32)(lt + 1) * {len(pre.fills) * GROUP_WAVES if pre else 0}u);  " \
                   "// the prologue's loads landed"
        for name, _ in role.pre:
            if pw == name:
                tile.append(pre_wait)
            tile.append(f"// pre: {name}\n{{ const int it_ = 0; (void)it_;\n"
                        f"{opk.body(Task(name, role, '0', None, 'pre', ir))}\n}}")
        if pw == "":
            tile.append(pre_wait)
        turn = None if tn is None else _turn_code(tn.ops.get(rn, {}))
        tile.append(emit_loop(loop, trips, body, nbuf, {}, set(), min_trips=opk.min_trips, turn=turn))
        for r in loop_rings:
            for x in r.releases:
                if x.role == rn and x.mode in ("wait", "commit"):
                    for k in range(1, x.dist + 1):
                        tile.append(f"if (T >= {k}) {{  // {', '.join(r.buffers)} of iteration T-{k}\n"
                                    f"{release(r, f'rbase + T - {k}')}\n}}")
        if pre is not None and pw is not None:
            tile.append("if (PERSISTENT) {  // the prologue's buffers are free for the next tile\n"
                        "  sem_arrive(pre_empty, lane);\n}")
        for name, _ in role.post:
            tile.append(f"// post: {name}\n{{ const int it_ = T - 1; (void)it_;\n"
                        f"{opk.body(Task(name, role, 'T - 1', None, 'post', ir))}\n}}")
        branches.append((role.group, "\n".join(code), "\n".join(tile)))

    first_turn = "" if tn is None or tn.first is None else (
        f"if (g == {int(tn.first[0][2:])}) sem_arrive(&turn_ctr[{tn.first[1] - 1}], lane);  // the first turn")
    cons = " else ".join(f"if (g == {gi}) {{\n{d}\nTILE_LOOP {{\n{t}\nTILE_END\n}}" for gi, d, t in branches)

    # ---- LDS: the KernelIR's buffers at its offsets, the semaphores in its barrier area
    sems, off = [], ir.barriers
    for r in loop_rings:
        sems.append(f"  u32* const {r.name}_full = reinterpret_cast<u32*>(smem + {off});  "
                    f"// ring {r.name}: {r.depth} LDS stages of {', '.join(r.buffers)}")
        sems.append(f"  u32* const {r.name}_empty = {r.name}_full + {r.depth}; (void){r.name}_empty;")
        off += 8 * r.depth
    sems.append(f"  u32* const pre_full = reinterpret_cast<u32*>(smem + {off}); (void)pre_full;")
    sems.append("  u32* const pre_empty = pre_full + 1; (void)pre_empty;")
    sems.append("  u32* const turn_ctr = pre_full + 2; (void)turn_ctr;  // one counter per consumer group")
    nsem = (off - ir.barriers) // 4 + 2 + W
    if ir.barriers + 4 * nsem > ir.smem_bytes:
        raise CodegenError(f"{ir.op}: the semaphores do not fit the KernelIR's barrier area ({ir.smem_bytes} B)")
    ring_lines = [f"//   ring {r.name}: {r.depth} LDS stages, buffers "
                  + ", ".join(f"{b} @{ir.buffer(b).offset} +{ir.buffer(b).stride}/stage" for b in r.buffers)
                  + f"; filled by {', '.join(t for t, _ in r.fills)}; read first by "
                  + ", ".join(f"{a}:{b}" for a, b in r.waiters) + "; released by "
                  + ", ".join(f"{x.role}:{x.task or 'end of tile'}({x.mode}{', +' + str(x.dist) if x.dist else ''})"
                              for x in r.releases) for r in ir.rings]
    pre_ptrs = [f"  u8* const {_cname(b)}_s = smem + {ir.buffer(b).offset}; (void){_cname(b)}_s;"
                for b in (pre.buffers if pre else ())]
    sig = [c for _, c in opk.signature(ir)]
    args = tuple(a for a, _ in opk.signature(ir))
    name = _kernel_name(ir, pid)
    nthreads = GROUP_LANES * (W + 1)
    if ir.persistent:
        head = ("for (int tile = block_id(), lt = 0, rbase = 0; tile < NTILES; tile += num_blocks(), ++lt) {\n"
                "  bool skip_ = false; (void)skip_;\n" + decode + "\n  if (skip_) continue;")
        end = "  rbase += T;  // ring position of the next tile's first iteration\n}"
    else:
        head = ("{\n  constexpr int lt = 0, rbase = 0; (void)lt;\n  const int tile = block_id();\n"
                "  bool skip_ = false; (void)skip_;\n" + decode + "\n  if (skip_) return;")
        end = "}"
    prod_order = ", ".join(f"{n}(stage {s})" for n, s in prod.loop)
    src = f"""// generated by ptsolve codegen.hip.skeleton ({ir.op}, plan {pid}) for gfx942; compile-verified, not run
// roles: producer waves 0..{GROUP_WAVES - 1}, {W} consumer group(s) of {GROUP_WAVES} waves; {nthreads} threads
// LDS {ir.smem_bytes} B (the KernelIR's layout):
{chr(10).join(ring_lines)}
// tensor-core turns: {'enforced: ' + ', '.join(ir.tc_order) if tn is not None else 'none (' + (ir.turns_note or
                                                                                            'one group') + ')'}
{PRELUDE}
{COMMON}
{PRELUDE_END}
PTS_KERNEL({nthreads})
{name}({', '.join(sig)}) {{
  using namespace pts;
{opk.consts(ir)}
  constexpr int NTILES = {ntiles}; (void)NTILES;
  constexpr bool PERSISTENT = {'true' if ir.persistent else 'false'}; (void)PERSISTENT;
  __shared__ __attribute__((aligned(16))) u8 smem[{ir.smem_bytes}];
{chr(10).join(pre_ptrs)}
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
{chr(10).join(prod_pre)}
{first_loads}
{prod_code}
    TILE_END
  }} else {{
    const int g = wave / {GROUP_WAVES} - 1;
    const int wq = wave % {GROUP_WAVES}; (void)wq;
{first_turn}
{cons}
  }}
}}
"""
    src = src.replace("TILE_LOOP {", head).replace("TILE_END", end)
    if not ir.persistent and ntiles >= 1 << 31:
        raise CodegenError(f"{ir.op}: {ntiles} workgroups exceed the grid's x limit (2^31 - 1)")
    grid = (min(ntiles, ir.sms), 1, 1) if ir.persistent else (ntiles, 1, 1)
    return HipSource(source=src, name=name, op=ir.op, params=dict(ir.params), grid=grid, block=(nthreads, 1, 1),
                     lds_bytes=ir.smem_bytes, args=args, persistent_tiles=ntiles if ir.persistent else 0,
                     info={"tiling": dict(ir.tiling), "rings": {r.name: r.depth for r in loop_rings},
                           "roles": [r.name for r in ir.roles], "groups": W, "waves": GROUP_WAVES * (W + 1),
                           "orders": {r.name: [list(x) for x in r.loop] for r in ir.roles},
                           "copies": dict(ir.copies), "tc_turns": None if tn is None else tn.handoffs,
                           "turns_note": ir.turns_note, **opk.info(ir)})


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

