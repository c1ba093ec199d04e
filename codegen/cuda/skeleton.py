"""The one CUDA sm_90a skeleton: any KernelIR plus an operator's task bodies -> a warp-specialised kernel.

Everything about the pipeline comes from the KernelIR (``codegen.lower``): the shared-memory carve-up, the
mbarriers and their counts, setmaxnreg, the role split, each role's prologue / software-pipelined loop /
epilogue (``schedule.emit_loop``), the wgmma waits, the full-barrier waits at a ring's first reader, the
empty-barrier arrivals at its release points, the tensor-core turns, the persistent tile loop. An operator
(``OpKernel``) adds only what differs: its device functions, constants, how a tile index becomes
coordinates and a trip count, its register declarations, the C++ of each task body and its tensor maps.

A task body sees, besides the operator's names: ``it_`` (its reduction iteration), ``<buf>_cur`` (the slot of
every shared-memory buffer it touches, as ``uint8_t*``), ``fbar_`` (a load's full barrier), ``lane``, ``w``
(warp in the warpgroup), ``g`` (consumer warpgroup), ``WG_BAR`` (a named barrier of its own warpgroup) and,
for a double-buffered register copy, the parity of its iteration (the ``parity`` argument).
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ptsolve.errors import CodegenError
from ptsolve.tiling import cluster_of

from ..kernel_ir import KernelIR, Ring, Role
from ..sync_sim import check as check_protocol
from ..sync_sim import loops, tile_turns, turns
from .common import CLUSTER_FNS, PRELUDE, PRELUDE_END, KernelSource, TensorMapSpec, persistent_grid, setup
from .schedule import emit_loop, wait_depths

Body = Callable[["Task"], str]
# A task body may mark where it has done its last read of the shared memory it frees: an "end" release (the slot is
# free once a synchronous task no longer reads it) is emitted there instead of after the whole body, so the
# producer can refill the slot while the task finishes work in registers.
LAST_READ = "  /*pts:last-read*/"


@dataclass(frozen=True)
class Task:
    """One task instance as a body sees it: ``name`` (graph name), ``base`` (without ``@g``), ``role``,
    ``it`` (C expression of its iteration), ``parity`` (0/1 for double-buffered registers, else None),
    ``phase``."""

    name: str
    role: Role
    it: str
    parity: int | None
    phase: str
    ir: KernelIR
    early: bool = False  # the register write moved from the later task to the earlier one (OpKernel.early)

    @property
    def base(self) -> str:
        return self.name.split("@")[0]


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
    # (results/ab/regress_ab_h200.log, same schedules): ChunkScan 20% faster with it, ChunkState 9% slower
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


def _cname(buf: str) -> str:
    return buf.split("@")[0]


def _regbufs(ir: KernelIR, role: Role) -> int:
    """Register buffers a role double-buffers: 2 when any of its register copies is 2 (loop unrolled by two)."""
    own = {b for n, _ in role.loop for b in ir.task(n).regs}
    n = max((ir.copies.get(b, 1) for b in own), default=1)
    if n > 2:
        raise CodegenError(f"{role.name}: {n} register copies of one buffer; the skeleton double-buffers at most")
    return n


def _ptr(ir: KernelIR, buf: str, slot: str | None) -> str:
    s = ir.buffer(buf)
    base = f"smem + {s.offset}"
    return f"{base} + ({slot}) * {s.stride}" if slot is not None and s.slots > 1 else base


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
    cl = cluster_of(ir.tiling)
    # rings a multicast load fills: a slot is free when the consumers of every CTA of the cluster released it
    mc_rings = {r.name for r in ir.rings if any(f in ir.multicast for f, _ in r.fills)}
    if (cl > 1) != bool(ir.multicast) or "pre" in mc_rings:
        raise CodegenError(f"{ir.op}: cluster={cl} with multicast loads {list(ir.multicast)}: a cluster shares "
                           "loop loads by TMA multicast (and only those); the operator's graph must mark them")

    def pointers(task: str, slot_expr: str) -> list[str]:
        out = []
        for b in ir.task(task).smem:
            r = ring_of_buf.get(b)
            if r is not None:
                out.append(f"  uint8_t* const {_cname(b)}_cur = {_ptr(ir, b, f'({slot_expr}) % {r.depth}')};")
            elif ir.buffer(b).slots > 1 or ir.buffer(b).role:
                out.append(f"  uint8_t* const {_cname(b)}_cur = {_ptr(ir, b, f'(it_) % {ir.buffer(b).slots}')};")
        return out

    task_id = {t.name: k for k, t in enumerate(ir.tasks)}

    def probe(var: str) -> str:
        return f"  const uint64_t {var} = pts_clock();" if ir.profile else ""

    def record(name: str, phase: str, it: str = "it_") -> str:
        if not ir.profile:
            return ""
        meta = f"(1ull << 63) | ({PHASE_CODE[phase]}ull << 56) | ({task_id[name]}ull << 32)"
        return (f"  {probe('p2_').strip()}\n"
                f"  pts_rec(pr_, pn_, PROF_CAP, {meta} | (uint32_t)({it}), p0_, p1_, p2_);")

    def release(r: Ring, slot: str, generic: bool) -> str:
        fence = '    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");\n' if generic else ""
        bar = f"&{r.name}_empty[({slot}) % {r.depth}]"
        arrive = f"mbar_arrive_cluster({bar}, CLUSTER)" if r.name in mc_rings else f"mbar_arrive({bar})"
        return f"{fence}    __syncwarp();\n    if (lane == 0) {arrive};"

    # ---- producer
    def prod_body(name: str, it: str, parity: int | None, waits: Any) -> str:
        r = fill_of[name]
        nbytes = opk.fill_bytes(ir, name) or dict(r.fills)[name]
        lines = [f"{{ const int it_ = {it}; const int q_ = rbase + it_; const int s_ = q_ % {r.depth};",
                 probe("p0_"), f"  mbar_wait(&{r.name}_empty[s_], ((q_ / {r.depth}) & 1) ^ 1);", probe("p1_"),
                 f"  mbar_expect_tx(&{r.name}_full[s_], {nbytes});",
                 f"  uint64_t* const fbar_ = &{r.name}_full[s_];", *pointers(name, "q_"),
                 opk.body(Task(name, ir.role("producer"), "it_", None, "loop", ir)), record(name, "loop"), "}"]
        return "\n".join(x for x in lines if x)

    prod = ir.role("producer")
    prod_pre = []
    if pre is not None:
        prod_pre.append(f"if (PERSISTENT) mbar_wait(pre_empty, (lt & 1) ^ 1);  // the previous tile is done with "
                        f"{', '.join(pre.buffers)}")
        for name, _ in prod.pre:
            if name in dict(pre.fills):
                nbytes = opk.fill_bytes(ir, name) or dict(pre.fills)[name]
                prod_pre.append(block(f"// pre: {name}", "{", probe("p0_"), probe("p1_"),
                                      f"  mbar_expect_tx(pre_full, {nbytes});",
                                      "  uint64_t* const fbar_ = pre_full;",
                                      opk.body(Task(name, prod, "0", None, "pre", ir)), record(name, "pre", "0"),
                                      "}"))
    prod_code = emit_loop(lo["producer"], trips, prod_body, 1, {}, min_trips=opk.min_trips)
    roles_idx = {r.name: k for k, r in enumerate(ir.roles)}

    def prof_head(role: str, recorder: str) -> str:
        """The role's profile region, when this CTA is sampled and this thread records (instrumented builds): the
        CTA's first tile, or a ping-pong warpgroup's own first one."""
        if not ir.profile:
            return ""
        first = ir.role(role).group if ir.pingpong and role != "producer" else 0
        return (f"uint64_t* pr_ = nullptr; int pn_ = 0;\n"
                f"if (lt == {first} && blockIdx.x % PROF_STRIDE == 0 && blockIdx.x / PROF_STRIDE < PROF_CTAS && "
                f"{recorder}) {{\n"
                f"  pr_ = prof + ((blockIdx.x / PROF_STRIDE) * {len(ir.roles)} + {roles_idx[role]}) * "
                f"({PROF_HDR} + {PROF_REC} * PROF_CAP);\n"
                "  pr_[0] = pts_smid(); pr_[1] = pts_gtime(); pr_[2] = pts_clock(); pr_[3] = tile;\n}")

    # ---- consumers
    branches = []
    for role in (r for r in ir.roles if r.group >= 0):
        rn, loop = role.name, lo[role.name]
        names = {n for n, _ in role.loop}
        commits = {t for t in ir.commits if t in names}
        needs = {t: list(v) for t, v in ir.waits.items() if t in names}
        steady = wait_depths(loop, commits, needs)
        needs, steady, early = early_writes(opk, role, loop, commits, needs, steady)
        nbuf = _regbufs(ir, role)
        waiter_of = {t: [r for r in loop_rings if (rn, t) in r.waiters] for t in names}
        rel = {t: [(r, x) for r in loop_rings for x in r.releases if x.role == rn and x.task == t] for t in names}

        def body(name: str, it: str, parity: int | None, waits: Mapping[str, int] | None,
                 role: Role = role, commits: set[str] = commits, needs: dict = needs,  # noqa: B008
                 waiter_of: dict = waiter_of, rel: dict = rel, early: set[str] = early) -> str:
            lines = [f"{{ const int it_ = {it}; const int q_ = rbase + it_; (void)q_;", probe("p0_")]
            depth = (0 if waits is None else waits.get("depth")) if name in needs else None
            if depth is not None and name not in commits:
                lines.append(f"  wg_wait<{depth}>();")
            for r, x in rel[name]:
                if x.mode == "wait":
                    guard = f"if (it_ >= {x.dist}) " if x.dist else ""
                    lines.append(f"  {guard}{{  // {', '.join(r.buffers)} of iteration it-{x.dist} released\n"
                                 f"{release(r, f'q_ - {x.dist}', x.generic)}\n  }}")
            for r in waiter_of[name]:
                lines.append(f"  mbar_wait(&{r.name}_full[q_ % {r.depth}], (q_ / {r.depth}) & 1);  "
                             f"// {', '.join(r.buffers)} of iteration it_ landed")
            lines += pointers(name, "q_")
            lines.append(probe("p1_"))
            body_ = opk.body(Task(name, role, "it_", parity, "loop", ir, name in early))
            # an "end" release goes where the body's last read of the slot is done (its LAST_READ marker), else after it
            ends = "\n".join(f"  {{  // {', '.join(r.buffers)} of this iteration released\n"
                              f"{release(r, 'q_', x.generic)}\n  }}" for r, x in rel[name] if x.mode == "end")
            if LAST_READ in body_:
                body_, ends = body_.replace(LAST_READ, ends), ""
            lines.append(body_)
            if depth is not None and name in commits:
                lines.append(f"  wg_wait<{depth}>();")
            for r, x in rel[name]:
                if x.mode == "commit":
                    lines.append(f"  if (it_ >= 1) {{  // {', '.join(r.buffers)} of iteration it-1 released\n"
                                 f"{release(r, 'q_ - 1', x.generic)}\n  }}")
            lines.append(ends)
            lines += [record(name, "loop"), "}"]
            return "\n".join(x for x in lines if x)

        code = [f"// ---- consumer warpgroup {role.group}"
                + "".join(f"; {b}: {c} copies" for b, c in sorted(ir.copies.items())
                          if b.endswith(f"@{role.group}") and c > 1),
                f"constexpr int WG_BAR = {W + 1 + role.group};  // a named barrier of this warpgroup alone",
                "(void)WG_BAR;", opk.decls(ir, role)]
        tile = [prof_head(rn, "(threadIdx.x & 127) == 0")]
        if ir.pingpong:  # this warpgroup's tiles are every groups-th of the CTA's; the others only move the ring on
            tile.insert(0, f"if (lt % {W} != {role.group}) {{ rbase += T; ++lt; continue; }}  "
                        "// another warpgroup's tile (ping-pong)")
        pw = dict(pre.waiters).get(rn) if pre is not None else None
        for name, _ in role.pre:
            if pw == name:
                tile.append("mbar_wait(pre_full, lt & 1);  // the prologue's loads landed")
            if any(ir.task(a).is_async and ir.task(a).phase == "pre" for a in ir.task(name).after):
                tile.append("wg_wait<0>();  // the prologue's wgmma it reads is complete")
            tile.append(block(f"// pre: {name}", "{", probe("p0_"), probe("p1_"),
                              opk.body(Task(name, role, "0", None, "pre", ir)), record(name, "pre", "0"), "}"))
        if pw == "":
            tile.append("mbar_wait(pre_full, lt & 1);  // the prologue's loads landed")
        turn = None if tn is None or ir.pingpong else tn.code(rn, 256)
        sync, arrive = tile_turns(ir, tn, rn) if ir.pingpong else (None, None)
        if sync is not None:
            tile.append(f'asm volatile("bar.sync {sync}, 256;" ::: "memory");  // wait for the tensor cores\' turn')
        tile.append(emit_loop(loop, trips, body, nbuf, steady, commits, min_trips=opk.min_trips, turn=turn))
        if arrive is not None:
            tile.append(f'if (tile + (int)gridDim.x < NTILES) asm volatile("bar.arrive {arrive}, 256;" ::: "memory");'
                        "  // the main loop's wgmmas are issued: the next tile's warpgroup takes the tensor cores")
        tail = ["wg_wait<0>();  // every wgmma of the tile is complete"]
        for r in loop_rings:
            for x in r.releases:
                if x.role == rn and x.mode in ("wait", "commit"):
                    for k in range(1, x.dist + 1):
                        tail.append(f"if (T >= {k}) {{  // {', '.join(r.buffers)} of iteration T-{k}\n"
                                    f"{release(r, f'rbase + T - {k}', x.generic)}\n}}")
        if pre is not None and pw is not None:
            tail.append("if (PERSISTENT) {  // the prologue's buffers are free for the next tile\n"
                        f"{release_pre(pre, rn)}\n}}")
        tile += tail
        for name, _ in role.post:
            tile.append(block(f"// post: {name}", "{", probe("p0_"), probe("p1_"),
                              opk.body(Task(name, role, "T - 1", None, "post", ir)), record(name, "post", "T - 1"),
                              "}"))
        branches.append((role.group, "\n".join(code), "\n".join(tile)))

    first_turn = "" if tn is None or tn.first is None else (
        f"if (g == {int(tn.first[0][2:])}) asm volatile(\"bar.arrive {tn.first[1]}, 256;\" ::: \"memory\");  "
        "// the first turn")
    cons = " else ".join(f"if (g == {gi}) {{\n{d}\nTILE_LOOP {{\n{t}\nTILE_END\n}}" for gi, d, t in branches)

    # ---- the kernel
    bars = []
    offs = ir.barriers
    inits = []
    for r in loop_rings:
        bars.append(f"  uint64_t* const {r.name}_full = reinterpret_cast<uint64_t*>(smem + {offs});")
        bars.append(f"  uint64_t* const {r.name}_empty = {r.name}_full + {r.depth};")
        inits.append(f"    for (int s = 0; s < {r.depth}; ++s) {{ mbar_init(&{r.name}_full[s], {len(r.fills)}); "
                     f"mbar_init(&{r.name}_empty[s], {r.arrivals * (cl if r.name in mc_rings else 1)}); }}")
        offs += 16 * r.depth
    bars.append(f"  uint64_t* const pre_full = reinterpret_cast<uint64_t*>(smem + {offs});")
    bars.append("  uint64_t* const pre_empty = pre_full + 1;")
    bars.append("  (void)pre_full; (void)pre_empty;")
    if pre is not None:
        inits.append(f"    mbar_init(pre_full, {len(pre.fills)}); mbar_init(pre_empty, {pre.arrivals});")
    pre_ptrs = [f"  uint8_t* const {_cname(b)}_s = smem + {ir.buffer(b).offset}; (void){_cname(b)}_s;"
                for b in (pre.buffers if pre else ())]
    maps = opk.maps(ir)
    extra = (("ptr:prof", "uint64_t* __restrict__ prof"),) if ir.profile else ()
    opsig = (*opk.signature(ir), *size_args(ir, opk))
    sig = [f"const __grid_constant__ CUtensorMap tm_{m.tensor}" for m in maps] + [c for _, c in opsig]
    sig += [c for _, c in extra]
    args = tuple(f"tmap:{m.tensor}" for m in maps) + tuple(a for a, _ in (*opsig, *extra))
    grid_x = (persistent_grid(ntiles, ir.sms, cl) if ir.persistent else ntiles) if isinstance(ntiles, int) else 0
    if cl > 1 and (ir.generic or not isinstance(ntiles, int) or ntiles % cl or opk.extra_ctas(ir)):
        raise CodegenError(f"{ir.op}: a cluster of {cl} CTAs needs an exact build whose work units come in whole "
                           f"clusters ({ntiles} units) and no CTAs after them; use cluster=1")
    prof_consts = (f"  constexpr int PROF_CTAS = {min(PROF_CTAS, grid_x)}, PROF_STRIDE = "
                   f"{max(1, grid_x // PROF_CTAS)}, PROF_CAP = {prof_cap(ir)};") if ir.profile else ""
    name = _kernel_name(ir, pid)
    prod_regs = next(r.regs for r in ir.roles if r.group < 0)
    cons_regs = next((r.regs for r in ir.roles if r.group >= 0), 0)
    dec = f'asm volatile("setmaxnreg.dec.sync.aligned.u32 {prod_regs};");' if prod_regs else ""
    inc = f'asm volatile("setmaxnreg.inc.sync.aligned.u32 {cons_regs};");' if cons_regs else ""
    if ir.persistent:
        # lt counts the tiles this CTA ran (the pre ring's phase): a skipped tile (skip_) is not one of them
        # skip_ is the same for a whole warp (the tile's), but a generic build derives it from loaded sizes (varlen
        # offsets): a branch ptxas cannot prove warp-uniform around the consumers' wgmma serialises them (C7520), so
        # it branches on lane 0's value (the producer's lone thread: its own)
        head = ("for (int tile = blockIdx.x, lt = 0, rbase = 0; tile < NTILES; tile += gridDim.x) {\n"
                "  bool skip_ = false; (void)skip_;\n" + decode +
                "\n  if (__shfl_sync(__activemask(), (int)skip_, 0)) continue;")
        end = "  rbase += T;  // ring position of the next tile's first iteration\n  ++lt;\n}"
    else:
        head = ("{\n  constexpr int lt = 0, rbase = 0; (void)lt;\n  const int tile = blockIdx.x;\n"
                "  bool skip_ = false; (void)skip_;\n" + decode + "\n  if (skip_) return;")
        end = "}"
    cluster_const = f"\n  constexpr int CLUSTER = {cl};" if cl > 1 else ""
    cluster_dims = f" __cluster_dims__({cl}, 1, 1)" if cl > 1 else ""
    # no CTA of a cluster leaves while its peers may still arrive on its barriers
    cluster_end = "\n  cluster_sync();" if cl > 1 else ""
    src = f"""// generated by ptsolve codegen.cuda.skeleton ({ir.op}, plan {pid}); see the KernelIR for the protocol
{PRELUDE}
{opk.device(ir)}{PROF_FNS if ir.profile else ""}{CLUSTER_FNS if cl > 1 else ""}
{PRELUDE_END}
extern "C" __global__ void __launch_bounds__({ir.threads}, {ir.ctas}){cluster_dims}
{name}({', '.join(sig)}) {{
  using namespace pts;
{size_decls(ir, opk)}
{opk.consts(ir)}
{"" if opk.sizes is not None and (ir.generic or not opk.exact_consts) else f"  constexpr int NTILES = {ntiles};"}
  (void)NTILES;
  constexpr bool PERSISTENT = {'true' if ir.persistent else 'false'};{cluster_const}
{prof_consts}
  extern __shared__ uint8_t smem_raw[];
  // swizzled TMA tiles need {ir.smem_bytes and 1024}-byte alignment; dynamic shared memory guarantees 16
{_smem_base(opk.shared_base)}
{chr(10).join(pre_ptrs)}
{chr(10).join(bars)}
{opk.entry(ir)}
{setup(chr(10).join(inits), tuple(m.tensor for m in maps), cl)}
  if (wg == 0) {{
    {dec}
    if (threadIdx.x == 0) {{
      TILE_LOOP {{
{prof_head("producer", "true")}
{chr(10).join(prod_pre)}
{prod_code}
      TILE_END
    }}
  }} else {{
    {inc}
    const int g = wg - 1;
    const int w = (threadIdx.x / 32) & 3;
    (void)w;
{first_turn}
{cons}
  }}{cluster_end}
}}
"""
    src = src.replace("TILE_LOOP {", head).replace("TILE_END", end)
    # a generic kernel's grid follows the shape it is launched on (codegen.generic): (0, 1, 1) until then
    extra = opk.extra_ctas(ir)
    if extra and (ir.persistent or not isinstance(ntiles, int)):
        raise CodegenError(f"{ir.op}: {extra} CTAs after the work units need a launched grid of an exact build; "
                           "use persistent=0")
    grid_x += extra
    grid = (grid_x, 1, 1)
    if not ir.persistent and grid_x >= 1 << 31:
        raise CodegenError(f"{ir.op}: {ntiles} tiles exceed the grid's x limit (2^31 - 1)")
    return KernelSource(source=src, name=name, op=ir.op, params=dict(ir.params), grid=grid, block=(ir.threads, 1, 1),
                        smem_bytes=ir.smem_bytes, tensor_maps=maps, args=args,
                        persistent_tiles=(ntiles if isinstance(ntiles, int) else 1) if ir.persistent else 0,
                        generic=ir.generic, cluster=cl,
                        info={"tiling": dict(ir.tiling), "consumer_regs": cons_regs, "copies": dict(ir.copies),
                              "profile_words": prof_words(ir) if ir.profile else 0,
                              "tc_turns": None if tn is None else tn.handoffs, "turns_note": ir.turns_note,
                              **opk.info(ir)})


def early_writes(opk: OpKernel, role: Role, loop: Any, commits: set[str], needs: dict[str, list],
                 steady: dict[str, dict[str, int]]) -> tuple[dict[str, list], dict[str, dict[str, int]], set[str]]:
    """Where an operator lets an earlier task of the iteration do a later task's write of the register buffer that
    task allocates (``OpKernel.early``), do it when that is free: the earlier task then needs what the later one
    waits for (the wgmma readers of the buffer's older copy complete, from the KernelIR's waits), and in the steady
    loop an earlier wait of the role must already cover it (no wait is added there; the prologue and epilogue wait
    for everything anyway). Where the later task runs a stage behind the earlier one the write moves into the
    previous emitted iteration, before the loop's back edge, which ptxas does not schedule across; left in the
    later task it lands between that task's tensor-core turn (``bar.sync``) and its wgmma issue, since ptxas moves
    register work across ``bar.sync`` towards its use (FlashAttention's second warpgroup: 32 F2FP there). Within
    one stage it moves too: one warpgroup packing early and the other late measured 1% slower on the H200 than
    both early (causal FA3c / FA13c, results/ab/regress_ab_h200.log). Returns (needs, steady wait depths, tasks
    whose bodies take the early form)."""
    stage = dict(loop.ops)
    tag = f"@{role.group}"
    early: set[str] = set()
    for late, first in opk.early.items():
        t, e = late + tag, first + tag
        if t not in stage or e not in stage or t not in needs or e in needs or stage[t] < stage[e]:
            continue
        aug = {**needs, e: list(needs[t])}
        try:
            st = wait_depths(loop, commits, aug)
        except CodegenError:
            continue  # a reader of the older copy is issued after the earlier task: not possible there
        if st.get(e) == {} and all(st.get(k) == v for k, v in steady.items()):
            needs, steady = aug, st
            early |= {t, e}
    return needs, steady, early


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


def block(*lines: str) -> str:
    """Lines joined, the empty ones (switched-off probes) left out."""
    return "\n".join(x for x in lines if x)


def release_pre(pre: Ring, role: str) -> str:
    x = next(x for x in pre.releases if x.role == role)
    fence = '  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");\n' if x.generic else ""
    return f"{fence}  __syncwarp();\n  if (lane == 0) mbar_arrive(pre_empty);"


def _kernel_name(ir: KernelIR, pid: str) -> str:
    """pts_<op>_<dtype>_<tiling>_<plan id>: only ints and known words reach the source."""
    skip = REGISTRY[ir.op].launch_tiling if ir.generic else ()
    t = "_".join(f"{k.lower()}{int(v)}" for k, v in sorted(ir.tiling.items()) if k not in skip)
    return f"pts_{ir.op}_{ir.params.get('dtype', 'fp16')}_{t}{'_p' if ir.persistent else ''}_{pid}"
