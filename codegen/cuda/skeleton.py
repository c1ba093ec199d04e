"""The one CUDA sm_90a skeleton: any KernelIR plus an operator's task bodies -> a warp-specialised kernel.

Everything about the pipeline comes from the KernelIR (``codegen.lower``), walked by ``codegen.walk`` (this
module is its sm_90a ``Backend``): the shared-memory carve-up, the mbarriers and their counts, setmaxnreg, the role
split, each role's prologue / software-pipelined loop / epilogue (``codegen.loop.emit_loop``), the wgmma waits, the
full-barrier waits at a ring's first reader, the empty-barrier arrivals at its release points, the tensor-core
turns, the persistent tile loop. An operator
(``OpKernel``) adds only what differs: its device functions, constants, how a tile index becomes
coordinates and a trip count, its register declarations, the C++ of each task body and its tensor maps.

A task body sees, besides the operator's names: ``it_`` (its reduction iteration), ``<buf>_cur`` (the slot of
every shared-memory buffer it touches, as ``uint8_t*``), ``fbar_`` (a load's full barrier), ``lane``, ``w``
(warp in the warpgroup), ``g`` (consumer warpgroup), ``WG_BAR`` (a named barrier of its own warpgroup) and,
for a double-buffered register copy, the parity of its iteration (the ``parity`` argument).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ptsolve.errors import CodegenError
from ptsolve.tiling import cluster_of

from ..kernel_ir import KernelIR, Release, Ring, Role
from ..loop import LoopOrder
from ..sync_sim import check as check_protocol
from ..sync_sim import tile_turns
from ..walk import (
    Consumer,
    Parts,
    Task,
    Walk,
    block,
    copies_note,
    facts,
    register_copies,
    slot_pointers,
    tile_loop,
    walk,
)
from .common import CLUSTER_FNS, PRELUDE, PRELUDE_END, KernelSource, TensorMapSpec, persistent_grid, setup
from .schedule import early_writes, turn_code, wait_depths

Body = Callable[["Task"], str]


@dataclass(frozen=True)
class OpKernel:
    """What one operator adds to the skeleton (see the module doc). ``signature``: (launch argument kind:name,
    C parameter) pairs after the tensor maps; ``tiles(ir)`` -> (number of tiles, C++ that turns ``tile`` into
    the operator's coordinates and ``const int T`` (trip count) and may set ``skip_`` for a tile with nothing to
    do); ``trips(ir)``: the trip count as an int when every tile has the same compile-time one, else ``"T"``.
    ``sizes(params, tiling)``: the sizes that do not change the schedule (batch, lengths, heads; M, N, K) and the
    counts derived from them, ``NTILES`` among them, by their C names: ``constexpr int`` in an exact-shape build,
    ``int`` kernel arguments (``i32:<name>``) in a generic one (``KernelIR.generic``); the launcher of a generic
    kernel calls it with the actual shape, so each formula exists once. ``size_params``: the parameter names those
    sizes come from (left out of a generic kernel's plan id, so every shape of a class names the same binary)."""

    op: str
    check: Callable[[KernelIR], None]
    device: Callable[[KernelIR], str]
    consts: Callable[[KernelIR], str]
    maps: Callable[[KernelIR], tuple[TensorMapSpec, ...]]
    signature: Callable[[KernelIR], tuple[tuple[str, str], ...]]
    tiles: Callable[[KernelIR], tuple[int, str]]
    decls: Callable[[KernelIR, Role], str]
    body: Body
    trips: Callable[[KernelIR], int | str] = lambda ir: "T"
    min_trips: int = 1
    info: Callable[[KernelIR], dict[str, Any]] = field(default=lambda ir: {})
    # task -> an earlier task of the same iteration whose body may also do its write of the register buffer it
    # allocates (FlashAttention: exp2 packs the P fragments rowsum allocates), see early_writes
    early: Mapping[str, str] = field(default_factory=dict)
    # the aligned shared-memory base kept in the shared window (see _smem_base): measured per operator on an H200
    # (bench study ab, same schedules): ChunkScan 20% faster with it, ChunkState 9% slower
    shared_base: bool = False
    sizes: Callable[[Mapping[str, Any], Mapping[str, int]], dict[str, int]] | None = None
    size_params: tuple[str, ...] = ()
    # tiling keys a generic build takes per launch through its sizes (flash_decode's pieces): out of its plan id and
    # name, so the class's kernel is one binary whatever its representative's value
    launch_tiling: tuple[str, ...] = ()
    # an exact-shape build's sizes (and NTILES) are written by the operator's ``consts`` in its own layout, not by
    # ``size_decls``: the Mamba2 kernels' exact-shape sources (and so their cached cubins) stay what they were before
    # they had a generic build
    exact_consts: bool = False
    # C++ the whole CTA runs before the barriers are set up, and CTAs launched after the NTILES work units' (not with
    # persistent CTAs): flash_decode's merge CTAs and split-K's reduce CTAs run no pipeline and leave in ``entry``
    entry: Callable[[KernelIR], str] = lambda ir: ""
    extra_ctas: Callable[[KernelIR], int] = lambda ir: 0
    # (ir, load task) -> a C++ expression of the bytes its fill delivers where that is the launch's (a generic
    # flash_decode's query box), else None: the KernelIR ring's bytes
    fill_bytes: Callable[[KernelIR, str], str | None] = lambda ir, task: None
    # (operator parameters, tiling) -> CodegenError where no schedule of that tiling can be built, asked before the
    # search solves it (compile_check.cuda_buildable); None: only a schedule's emission tells
    tiling_check: Callable[[Mapping[str, Any], Mapping[str, int]], None] | None = None


def size_decls(ir: KernelIR, opk: OpKernel) -> str:
    """The op's sizes as ``constexpr int`` lines (exact-shape build; a generic build takes them as arguments)."""
    if opk.sizes is None or ir.generic or opk.exact_consts:
        return ""
    sz = opk.sizes(ir.params, ir.tiling)
    return "\n".join([*(f"  constexpr int {k} = {v};" for k, v in sz.items()),
                      "  " + " ".join(f"(void){k};" for k in sz)])


def size_args(ir: KernelIR, opk: OpKernel) -> tuple[tuple[str, str], ...]:
    """The op's sizes as (``i32:<name>``, ``const int <name>``) kernel parameters of a generic build."""
    if opk.sizes is None or not ir.generic:
        return ()
    return tuple((f"i32:{k}", f"const int {k}") for k in opk.sizes(ir.params, ir.tiling))


def generic_id(ir: KernelIR, opk: OpKernel) -> str:
    """The plan id of a generic build: the IR's hash without the sizes a generic kernel takes at launch."""
    d = json.loads(ir.to_json())
    d["params"] = {k: v for k, v in d["params"].items() if k not in opk.size_params}
    d["tiling"] = {k: v for k, v in d["tiling"].items() if k not in opk.launch_tiling}
    d.pop("trips", None)
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:8]


REGISTRY: dict[str, OpKernel] = {}

# The instrumented build (KernelIR.profile, codegen.profile): PROF_CTAS sampled CTAs (the first tile of each), one
# region per (CTA, role): a header of PROF_HDR words (SM id, %globaltimer ns and clock64 when the role starts) and
# up to cap records of PROF_REC words (meta, clock64 before the task's waits, after them, after its body); meta =
# 1<<63 | phase<<56 | task index<<32 | iteration. One elected thread per role writes.
PROF_CTAS = 4
PROF_HDR = 4
PROF_REC = 4
PROF_CAP_MAX = 4096
PHASE_CODE = {"pre": 0, "loop": 1, "post": 2}


def prof_cap(ir: KernelIR) -> int:
    """Records per (sampled CTA, role): every task instance of the longest tile, at most PROF_CAP_MAX."""
    per = max(len(r.pre) + len(r.post) + len(r.loop) * ir.trips for r in ir.roles)
    return min(PROF_CAP_MAX, per)


def prof_words(ir: KernelIR) -> int:
    """uint64 words of the profile buffer of ``ir``'s instrumented kernel."""
    return PROF_CTAS * len(ir.roles) * (PROF_HDR + PROF_REC * prof_cap(ir))


PROF_FNS = r"""
__device__ __forceinline__ uint64_t pts_clock() {
  uint64_t t; asm volatile("mov.u64 %0, %%clock64;" : "=l"(t) :: "memory"); return t;
}
__device__ __forceinline__ uint64_t pts_gtime() {
  uint64_t t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t;
}
__device__ __forceinline__ uint32_t pts_smid() {
  uint32_t s; asm volatile("mov.u32 %0, %%smid;" : "=r"(s)); return s;
}
__device__ __forceinline__ void pts_rec(uint64_t* pr, int& n, int cap, uint64_t meta, uint64_t t0, uint64_t t1,
                                        uint64_t t2) {
  if (pr != nullptr && n < cap) {
    uint64_t* r = pr + 4 + 4 * n;
    r[0] = meta; r[1] = t0; r[2] = t1; r[3] = t2;
    ++n;
  }
}
"""


def emit_ir(ir: KernelIR, plan_id: str | None = None) -> KernelSource:
    """CUDA C++ source and launch metadata of ``ir``; CodegenError when its operator has no task bodies here,
    the operator refuses the shape, or the synchronisation could deadlock (``codegen.sync_sim.check``)."""
    if ir.op not in REGISTRY:
        raise CodegenError(f"the CUDA generator emits {sorted(REGISTRY)}, not {ir.op!r}")
    opk = REGISTRY[ir.op]
    opk.check(ir)
    check_protocol(ir)
    if ir.generic and (opk.sizes is None or ir.profile):
        raise CodegenError(f"{ir.op}: no shape-generic build" + (" of the profiler" if ir.profile else
                                                                  " (its sizes are compile-time constants)"))
    pid = plan_id or (generic_id(ir, opk) if ir.generic else hashlib.sha256(ir.to_json().encode()).hexdigest()[:8])
    w = facts(ir, opk, pid)
    cl = cluster_of(ir.tiling)
    if (cl > 1) != bool(ir.multicast) or "pre" in _multicast_rings(ir):
        raise CodegenError(f"{ir.op}: cluster={cl} with multicast loads {list(ir.multicast)}: a cluster shares "
                           "loop loads by TMA multicast (and only those); the operator's graph must mark them")
    parts = walk(w, BACKEND)
    bars, inits = _barriers(w, cl)
    maps = opk.maps(ir)
    ntiles = w.ntiles
    grid_x = (persistent_grid(ntiles, ir.sms, cl) if ir.persistent else ntiles) if isinstance(ntiles, int) else 0
    if cl > 1 and (ir.generic or not isinstance(ntiles, int) or ntiles % cl or opk.extra_ctas(ir)):
        raise CodegenError(f"{ir.op}: a cluster of {cl} CTAs needs an exact build whose work units come in whole "
                           f"clusters ({ntiles} units) and no CTAs after them; use cluster=1")
    src = tile_loop(_source(w, parts, bars, inits, maps, grid_x, cl), *_tile_loop(w))
    # a generic kernel's grid follows the shape it is launched on (ptsolve.serve): (0, 1, 1) until then
    extra = opk.extra_ctas(ir)
    if extra and (ir.persistent or not isinstance(ntiles, int)):
        raise CodegenError(f"{ir.op}: {extra} CTAs after the work units need a launched grid of an exact build; "
                           "use persistent=0")
    grid_x += extra
    if not ir.persistent and grid_x >= 1 << 31:
        raise CodegenError(f"{ir.op}: {ntiles} tiles exceed the grid's x limit (2^31 - 1)")
    return _kernel_source(w, src, maps, (grid_x, 1, 1), cl)


def _multicast_rings(ir: KernelIR) -> set[str]:
    """Rings a multicast load fills: a slot is free when the consumers of every CTA of the cluster released it."""
    return {r.name for r in ir.rings if any(f in ir.multicast for f, _ in r.fills)}


def _task_id(ir: KernelIR, name: str) -> int:
    return next(k for k, t in enumerate(ir.tasks) if t.name == name)



def _back_edge_wait(loop: LoopOrder, steady: dict[str, dict[str, int]], commits: set[str]) -> str:
    """The wait of a loop whose first task begins with a wgmma wait, again at the end of every steady iteration.

    Nothing runs between the two (the back edge, and the first task's turn and ring waits, which do not depend on this
    warpgroup's wgmma), so the kernel waits for the same groups at the same moment; but ptxas then sees every
    in-flight group's pipeline stage end inside the iteration that issued it. Left open across the back edge, ptxas
    serialised the whole wgmma pipeline (C7515) on attention orders whose last tasks issue the tensor-core work that
    the next iteration's first task reads (bench study compile_verdicts)."""
    first = loop.ops[0][0] if loop.ops else None
    depth = steady.get(first, {}).get("depth") if first is not None else None
    if depth is None or first in commits:  # a committing task waits after its own issue (walk.task_instance)
        return ""
    return f"wg_wait<{depth}>();  // {first}'s wait before the back edge: each wgmma stage ends in its iteration"

class _Cuda:
    """The sm_90a text of the walk's steps (``codegen.walk.Backend``): mbarriers with TMA transaction counts for the
    rings, wgmma commit groups and waits, named barriers for the turns, the profiler's clock stamps."""

    ptr = "uint8_t*"

    def slot_pointer(self, buf: str, addr: str) -> str:
        return f"  uint8_t* const {buf}_cur = {addr};"

    def fill(self, w: Walk, name: str, it: str) -> str:
        ir, r = w.ir, w.fill_of[name]
        nbytes = w.opk.fill_bytes(ir, name) or dict(r.fills)[name]
        return block(f"{{ const int it_ = {it}; const int q_ = rbase + it_; const int s_ = q_ % {r.depth};",
                     self.probe(w, "p0_"), f"  mbar_wait(&{r.name}_empty[s_], ((q_ / {r.depth}) & 1) ^ 1);",
                     self.probe(w, "p1_"), f"  mbar_expect_tx(&{r.name}_full[s_], {nbytes});",
                     f"  uint64_t* const fbar_ = &{r.name}_full[s_];", *slot_pointers(w, self, name, "q_"),
                     w.opk.body(Task(name, ir.role("producer"), "it_", None, "loop", ir)),
                     self.record(w, name, "loop", "it_"), "}")

    def producer_pre(self, w: Walk) -> list[str]:
        pre, ir = w.pre, w.ir
        if pre is None:
            return []
        out = [f"if (PERSISTENT) mbar_wait(pre_empty, (lt & 1) ^ 1);  // the previous tile is done with "
               f"{', '.join(pre.buffers)}"]
        prod = ir.role("producer")
        for name, _ in prod.pre:
            if name in dict(pre.fills):
                nbytes = w.opk.fill_bytes(ir, name) or dict(pre.fills)[name]
                out.append(block(f"// pre: {name}", "{", self.probe(w, "p0_"), self.probe(w, "p1_"),
                                 f"  mbar_expect_tx(pre_full, {nbytes});", "  uint64_t* const fbar_ = pre_full;",
                                 w.opk.body(Task(name, prod, "0", None, "pre", ir)), self.record(w, name, "pre", "0"),
                                 "}"))
        return out

    def consumer(self, w: Walk, role: Role, base: Consumer) -> Consumer:
        loop = w.lo[role.name]
        names = {n for n, _ in role.loop}
        commits = {t for t in w.ir.commits if t in names}
        needs = {t: list(v) for t, v in w.ir.waits.items() if t in names}
        steady = wait_depths(loop, commits, needs)
        needs, steady, early = early_writes(w.opk, role, loop, commits, needs, steady)
        return dataclasses.replace(base, commits=commits, needs=needs, steady=steady, early=early,
                                   nbuf=register_copies(w.ir, role, "the skeleton double-buffers at most"),
                                   tail=_back_edge_wait(loop, steady, commits))

    def full_wait(self, w: Walk, r: Ring) -> str:
        return (f"  mbar_wait(&{r.name}_full[q_ % {r.depth}], (q_ / {r.depth}) & 1);  "
                f"// {', '.join(r.buffers)} of iteration it_ landed")

    def release(self, w: Walk, r: Ring, slot: str, x: Release) -> str:
        fence = '    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");\n' if x.generic else ""
        bar = f"&{r.name}_empty[({slot}) % {r.depth}]"
        arrive = (f"mbar_arrive_cluster({bar}, CLUSTER)" if r.name in _multicast_rings(w.ir)
                  else f"mbar_arrive({bar})")
        return f"{fence}    __syncwarp();\n    if (lane == 0) {arrive};"

    def wg_wait(self, depth: int) -> str:
        return f"  wg_wait<{depth}>();"

    def probe(self, w: Walk, var: str) -> str:
        return f"  const uint64_t {var} = pts_clock();" if w.ir.profile else ""

    def record(self, w: Walk, task: str, phase: str, it: str) -> str:
        if not w.ir.profile:
            return ""
        meta = f"(1ull << 63) | ({PHASE_CODE[phase]}ull << 56) | ({_task_id(w.ir, task)}ull << 32)"
        return (f"  {self.probe(w, 'p2_').strip()}\n"
                f"  pts_rec(pr_, pn_, PROF_CAP, {meta} | (uint32_t)({it}), p0_, p1_, p2_);")

    def role_head(self, w: Walk, role: Role) -> list[str]:
        return [f"// ---- consumer warpgroup {role.group}" + copies_note(w.ir, role),
                f"constexpr int WG_BAR = {w.ir.groups + 1 + role.group};  // a named barrier of this warpgroup alone",
                "(void)WG_BAR;", w.opk.decls(w.ir, role)]

    def tile_head(self, w: Walk, role: Role) -> list[str]:
        tile = [_prof_head(w.ir, role.name, "(threadIdx.x & 127) == 0")]
        if w.ir.pingpong:  # this warpgroup's tiles are every groups-th of the CTA's; the others only move the ring on
            tile.insert(0, f"if (lt % {w.ir.groups} != {role.group}) {{ rbase += T; ++lt; continue; }}  "
                        "// another warpgroup's tile (ping-pong)")
        return tile

    def pre_wait(self, w: Walk) -> str:
        return "mbar_wait(pre_full, lt & 1);  // the prologue's loads landed"

    def edge_task(self, w: Walk, role: Role, name: str, phase: str) -> list[str]:
        ir = w.ir
        it = "0" if phase == "pre" else "T - 1"
        out = []
        if phase == "pre" and any(ir.task(a).is_async and ir.task(a).phase == "pre" for a in ir.task(name).after):
            out.append("wg_wait<0>();  // the prologue's wgmma it reads is complete")
        out.append(block(f"// {phase}: {name}", "{", self.probe(w, "p0_"), self.probe(w, "p1_"),
                         w.opk.body(Task(name, role, it, None, phase, ir)), self.record(w, name, phase, it), "}"))
        return out

    def turns(self, w: Walk, role: Role) -> tuple[dict[str, tuple[str, str]] | None, list[str], list[str]]:
        tn, ir = w.tn, w.ir
        turn = None if tn is None or ir.pingpong else turn_code(tn, role.name, 256)
        sync, arrive = tile_turns(ir, tn, role.name) if ir.pingpong else (None, None)
        before = [] if sync is None else [
            f'asm volatile("bar.sync {sync}, 256;" ::: "memory");  // wait for the tensor cores\' turn']
        after = [] if arrive is None else [
            f'if (tile + (int)gridDim.x < NTILES) asm volatile("bar.arrive {arrive}, 256;" ::: "memory");'
            "  // the main loop's wgmmas are issued: the next tile's warpgroup takes the tensor cores"]
        return turn, before, after

    def tile_done(self, w: Walk, role: Role) -> list[str]:
        return ["wg_wait<0>();  // every wgmma of the tile is complete"]

    def release_pre(self, w: Walk, role: Role) -> str:
        x = next(x for x in w.pre.releases if x.role == role.name)
        fence = '  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");\n' if x.generic else ""
        return f"{fence}  __syncwarp();\n  if (lane == 0) mbar_arrive(pre_empty);"

    def first_turn(self, w: Walk) -> str:
        tn = w.tn
        if tn is None or tn.first is None:
            return ""
        return (f"if (g == {int(tn.first[0][2:])}) asm volatile(\"bar.arrive {tn.first[1]}, 256;\" ::: \"memory\");  "
                "// the first turn")


BACKEND = _Cuda()


def _prof_head(ir: KernelIR, role: str, recorder: str) -> str:
    """The role's profile region, when this CTA is sampled and this thread records (instrumented builds): the
    CTA's first tile, or a ping-pong warpgroup's own first one."""
    if not ir.profile:
        return ""
    first = ir.role(role).group if ir.pingpong and role != "producer" else 0
    idx = next(k for k, r in enumerate(ir.roles) if r.name == role)
    return (f"uint64_t* pr_ = nullptr; int pn_ = 0;\n"
            f"if (lt == {first} && blockIdx.x % PROF_STRIDE == 0 && blockIdx.x / PROF_STRIDE < PROF_CTAS && "
            f"{recorder}) {{\n"
            f"  pr_ = prof + ((blockIdx.x / PROF_STRIDE) * {len(ir.roles)} + {idx}) * "
            f"({PROF_HDR} + {PROF_REC} * PROF_CAP);\n"
            "  pr_[0] = pts_smid(); pr_[1] = pts_gtime(); pr_[2] = pts_clock(); pr_[3] = tile;\n}")


def _barriers(w: Walk, cl: int) -> tuple[list[str], list[str]]:
    """The mbarriers in the KernelIR's barrier area (a full and an empty one per ring slot, the prologue's pair) and
    their initialisation (an empty barrier of a multicast ring counts the releases of every CTA of the cluster)."""
    bars, inits = [], []
    offs = w.ir.barriers
    mc = _multicast_rings(w.ir)
    for r in w.loop_rings:
        bars.append(f"  uint64_t* const {r.name}_full = reinterpret_cast<uint64_t*>(smem + {offs});")
        bars.append(f"  uint64_t* const {r.name}_empty = {r.name}_full + {r.depth};")
        inits.append(f"    for (int s = 0; s < {r.depth}; ++s) {{ mbar_init(&{r.name}_full[s], {len(r.fills)}); "
                     f"mbar_init(&{r.name}_empty[s], {r.arrivals * (cl if r.name in mc else 1)}); }}")
        offs += 16 * r.depth
    bars.append(f"  uint64_t* const pre_full = reinterpret_cast<uint64_t*>(smem + {offs});")
    bars.append("  uint64_t* const pre_empty = pre_full + 1;")
    bars.append("  (void)pre_full; (void)pre_empty;")
    if w.pre is not None:
        inits.append(f"    mbar_init(pre_full, {len(w.pre.fills)}); mbar_init(pre_empty, {w.pre.arrivals});")
    return bars, inits


def _signature(w: Walk, maps: tuple[TensorMapSpec, ...]) -> tuple[list[str], tuple[str, ...]]:
    """The kernel's C parameters and its launch arguments: the tensor maps, the operator's, a generic build's
    sizes, the profile buffer."""
    ir, opk = w.ir, w.opk
    extra = (("ptr:prof", "uint64_t* __restrict__ prof"),) if ir.profile else ()
    opsig = (*opk.signature(ir), *size_args(ir, opk))
    sig = [f"const __grid_constant__ pts_tmap tm_{m.tensor}" for m in maps] + [c for _, c in opsig]
    sig += [c for _, c in extra]
    return sig, tuple(f"tmap:{m.tensor}" for m in maps) + tuple(a for a, _ in (*opsig, *extra))


def _tile_loop(w: Walk) -> tuple[str, str]:
    """The head and end of the tile loop: persistent CTAs stride over the tiles, else one tile each."""
    if w.ir.persistent:
        # lt counts the tiles this CTA ran (the pre ring's phase): a skipped tile (skip_) is not one of them
        # skip_ is the same for a whole warp (the tile's), but a generic build derives it from loaded sizes (varlen
        # offsets): a branch ptxas cannot prove warp-uniform around the consumers' wgmma serialises them (C7520), so
        # it branches on lane 0's value (the producer's lone thread: its own)
        head = ("for (int tile = blockIdx.x, lt = 0, rbase = 0; tile < NTILES; tile += gridDim.x) {\n"
                "  bool skip_ = false; (void)skip_;\n" + w.decode +
                "\n  if (__shfl_sync(__activemask(), (int)skip_, 0)) continue;")
        return head, "  rbase += T;  // ring position of the next tile's first iteration\n  ++lt;\n}"
    head = ("{\n  constexpr int lt = 0, rbase = 0; (void)lt;\n  const int tile = blockIdx.x;\n"
            "  bool skip_ = false; (void)skip_;\n" + w.decode + "\n  if (skip_) return;")
    return head, "}"


def _source(w: Walk, parts: Parts, bars: list[str], inits: list[str], maps: tuple[TensorMapSpec, ...], grid_x: int,
            cl: int) -> str:
    """The kernel's source around the walk's parts (``TILE_LOOP`` / ``TILE_END`` still to be replaced)."""
    ir, opk = w.ir, w.opk
    sig, _ = _signature(w, maps)
    prof_consts = (f"  constexpr int PROF_CTAS = {min(PROF_CTAS, grid_x)}, PROF_STRIDE = "
                   f"{max(1, grid_x // PROF_CTAS)}, PROF_CAP = {prof_cap(ir)};") if ir.profile else ""
    prod_regs = next(r.regs for r in ir.roles if r.group < 0)
    cons_regs = next((r.regs for r in ir.roles if r.group >= 0), 0)
    dec = f'asm volatile("setmaxnreg.dec.sync.aligned.u32 {prod_regs};");' if prod_regs else ""
    inc = f'asm volatile("setmaxnreg.inc.sync.aligned.u32 {cons_regs};");' if cons_regs else ""
    cluster_const = f"\n  constexpr int CLUSTER = {cl};" if cl > 1 else ""
    cluster_dims = f" __cluster_dims__({cl}, 1, 1)" if cl > 1 else ""
    # no CTA of a cluster leaves while its peers may still arrive on its barriers
    cluster_end = "\n  cluster_sync();" if cl > 1 else ""
    ntiles = "" if opk.sizes is not None and (ir.generic or not opk.exact_consts) else \
        f"  constexpr int NTILES = {w.ntiles};"
    return f"""// generated by ptsolve codegen.cuda.skeleton ({ir.op}, plan {w.pid}); see the KernelIR for the protocol
{PRELUDE}
{opk.device(ir)}{PROF_FNS if ir.profile else ""}{CLUSTER_FNS if cl > 1 else ""}
{PRELUDE_END}
extern "C" __global__ void __launch_bounds__({ir.threads}, {ir.ctas}){cluster_dims}
{_kernel_name(ir, w.pid)}({', '.join(sig)}) {{
  using namespace pts;
{size_decls(ir, opk)}
{opk.consts(ir)}
{ntiles}
  (void)NTILES;
  constexpr bool PERSISTENT = {'true' if ir.persistent else 'false'};{cluster_const}
{prof_consts}
  extern __shared__ uint8_t smem_raw[];
  // swizzled TMA tiles need {ir.smem_bytes and 1024}-byte alignment; dynamic shared memory guarantees 16
{_smem_base(opk.shared_base)}
{chr(10).join(parts.pre_ptrs)}
{chr(10).join(bars)}
{opk.entry(ir)}
{setup(chr(10).join(inits), tuple(m.tensor for m in maps), cl)}
  if (wg == 0) {{
    {dec}
    if (threadIdx.x == 0) {{
      TILE_LOOP {{
{_prof_head(ir, "producer", "true")}
{chr(10).join(parts.producer_pre)}
{parts.producer}
      TILE_END
    }}
  }} else {{
    {inc}
    const int g = wg - 1;
    const int w = (threadIdx.x / 32) & 3;
    (void)w;
{parts.first_turn}
{parts.consumers}
  }}{cluster_end}
}}
"""


def _kernel_source(w: Walk, src: str, maps: tuple[TensorMapSpec, ...], grid: tuple[int, int, int],
                   cl: int) -> KernelSource:
    ir, ntiles = w.ir, w.ntiles
    cons_regs = next((r.regs for r in ir.roles if r.group >= 0), 0)
    return KernelSource(source=src, name=_kernel_name(ir, w.pid), op=ir.op, params=dict(ir.params), grid=grid,
                        block=(ir.threads, 1, 1), smem_bytes=ir.smem_bytes, tensor_maps=maps,
                        args=_signature(w, maps)[1],
                        persistent_tiles=(ntiles if isinstance(ntiles, int) else 1) if ir.persistent else 0,
                        generic=ir.generic, cluster=cl,
                        info={"tiling": dict(ir.tiling), "consumer_regs": cons_regs, "copies": dict(ir.copies),
                              "profile_words": prof_words(ir) if ir.profile else 0,
                              "tc_turns": None if w.tn is None else w.tn.handoffs, "turns_note": ir.turns_note,
                              **w.opk.info(ir)})


def _smem_base(shared: bool) -> str:
    """The aligned shared-memory base. ``shared``: the offset is added to the ``__shared__`` array itself, so the
    compiler keeps the shared address space for the consumers' ordinary loads and stores (LDS / STS; through a
    ``uintptr_t`` it loses it: generic LD / ST with 64-bit address arithmetic, 689 instead of 495 SASS instructions
    in ChunkScan's decay loop). Else the generic form: where only TMA and wgmma descriptors touch shared memory the
    shared form makes ptxas rematerialise the window's base in the loop (S2UR SR_CgaCtaId: FlashAttention's steady
    loop 9 instructions longer), and ChunkState's scale ran 9% slower with it. Which one an operator takes is its
    OpKernel's ``shared_base``, chosen by measuring both."""
    if shared:
        return ("  uint8_t* smem = smem_raw + ((1024u - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & "
                "1023u)) & 1023u);")
    return ("  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & "
            "~uintptr_t(1023));")


def _kernel_name(ir: KernelIR, pid: str) -> str:
    """pts_<op>_<dtype>_<tiling>_<plan id>: only ints and known words reach the source."""
    skip = REGISTRY[ir.op].launch_tiling if ir.generic else ()
    t = "_".join(f"{k.lower()}{int(v)}" for k, v in sorted(ir.tiling.items()) if k not in skip)
    return f"pts_{ir.op}_{ir.params.get('dtype', 'fp16')}_{t}{'_p' if ir.persistent else ''}_{pid}"
