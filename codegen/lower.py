"""lower: a schedule (an SProgram, or a hand-written KernelPlan) to the KernelIR a skeleton emits.

One path for every operator. The orders come from the schedule; the rings, their fill and release points,
the wgmma waits and the shared-memory layout from ``ptsolve.protocol`` (the definitions the model used to
prove the schedule); the register and shared-memory budgets from the hardware table's ``Target``. An order
that breaks a same-stream dependence of the graph, or a tiling the layout cannot fit, is a CodegenError.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ptsolve import protocol
from ptsolve.cost import timings
from ptsolve.errors import CodegenError, PtsolveError
from ptsolve.hw import DEFAULT_HW, Hardware, Target, load
from ptsolve.ir import STaskGraph
from ptsolve.opspec import make, spec_of
from ptsolve.program import SProgram

from .kernel_ir import KernelIR, Release, Ring, Role, Smem, TaskInfo
from .loop import LoopOrder, check_deps
from .plan import PHASES, KernelPlan, plan_from_program

CODEGEN_KEYS = {"persistent": (0, 1)}  # keys the code generator reads (the model too where the space has them)
WARPS = 4  # warps of a warpgroup: each warp's lane 0 arrives on an empty barrier


def graph_of(plan: KernelPlan, hw: Hardware) -> STaskGraph:
    """The sTask-graph a plan schedules (the operator rebuilt from its parameters and tiling)."""
    try:
        op = make(plan.op, **dict(plan.params))
        modelled = set().union(*op.tilings(), op.spec.optional)  # attention's space has persistent: the model's
        return op.graph({k: v for k, v in dict(plan.tiling).items() if k not in CODEGEN_KEYS or k in modelled}, hw)
    except PtsolveError as e:
        raise CodegenError(f"plan for {plan.op}: {e}") from e
    except TypeError as e:
        raise CodegenError(f"plan for {plan.op}: parameters or tiling are malformed ({e})") from e


def _roles(plan: KernelPlan, g: STaskGraph) -> list[str]:
    return ["producer"] + [f"wg{k}" for k in range(g.groups)]


def _check_order(plan: KernelPlan, g: STaskGraph) -> dict[str, dict[str, list[tuple[str, int]]]]:
    """phase -> role -> [(task, stage)]: every task of the graph exactly once, in its phase and on its stream."""
    tm = {t.name: ("producer" if t.group < 0 else f"wg{t.group}") for t in g.tasks}
    if not isinstance(plan.order, Mapping) or set(plan.order) - set(PHASES):
        raise CodegenError(f"plan.order must map phases {PHASES} to roles")
    roles = _roles(plan, g)
    out: dict[str, dict[str, list[tuple[str, int]]]] = {}
    for ph in PHASES:
        got = plan.order.get(ph, {})
        if not isinstance(got, Mapping) or set(got) - set(roles):
            raise CodegenError(f"plan.order[{ph!r}] must map roles {roles} to task lists, got {sorted(map(str, got))}")
        out[ph] = {}
        for r in roles:
            want = sorted(t.name for t in g.phase(ph) if tm[t.name] == r)
            seq = []
            for item in got.get(r, []):
                if not isinstance(item, (tuple, list)) or len(item) != 2 or not isinstance(item[0], str) \
                        or isinstance(item[1], bool) or not isinstance(item[1], int):
                    raise CodegenError(f"{ph}/{r}: entries must be (task name, stage), got {item!r}")
                if not 0 <= item[1] <= (7 if ph == "loop" else 0):
                    raise CodegenError(f"{ph}/{r}: stage of {item[0]!r} must be in [0, {7 if ph == 'loop' else 0}]")
                seq.append((item[0], item[1]))
            if sorted(n for n, _ in seq) != want:
                raise CodegenError(f"{ph}/{r}: tasks {[n for n, _ in seq]} must be exactly {want}, each once")
            if ph != "loop":  # the prologue and epilogue run once, in this order: it must respect the graph
                pos = {n: k for k, (n, _) in enumerate(seq)}
                for e in g.edges:
                    if e.src in pos and e.dst in pos and pos[e.src] > pos[e.dst]:
                        raise CodegenError(f"{ph}/{r}: {e.dst} is issued before {e.src}, which it depends on")
            out[ph][r] = seq
    return out


def _deps(g: STaskGraph, tm: dict[str, Any], hw: Hardware, rings: dict[str, int], copies: dict[str, int],
          role: str) -> dict[str, list[tuple[str, int]]]:
    """Same-stream precedences of the model among the role's loop tasks, as check_deps wants them:
    task -> [(task it needs issued before, iteration offset)]."""
    out: dict[str, list[tuple[str, int]]] = {}
    loop = {t.name for t in g.phase("loop")}
    for u, w, d, _, _ in protocol.precedences(g, tm, hw, rings, copies):
        if u in loop and w in loop and tm[u].stream == tm[w].stream == role and u != w:
            out.setdefault(w, []).append((u, -d))
    return out


def _order_ok(g: STaskGraph, tm: dict[str, Any], hw: Hardware, rings: dict[str, int], copies: dict[str, int],
              loops: dict[str, LoopOrder]) -> bool:
    try:
        for r, lo in loops.items():
            check_deps(r, lo, _deps(g, tm, hw, rings, copies, r))
    except CodegenError:
        return False
    return True


def _first(order: LoopOrder, tasks: set[str]) -> str | None:
    """The task of ``tasks`` that a role issues first for one (steady) iteration."""
    it = order.stages + 2
    for _, name, i in order.flatten(it + order.stages + 1):
        if i == it and name in tasks:
            return name
    return None


def _source(schedule: SProgram | KernelPlan, hw: str | Hardware | Target | None
            ) -> tuple[KernelPlan, STaskGraph, Hardware, dict[str, int]]:
    """(plan, graph, hardware, copies named by the schedule) of an SProgram or a KernelPlan."""
    if isinstance(hw, Target):
        hw = hw.hw
    if isinstance(schedule, SProgram):
        hwt = load(hw or schedule.hw)
        plan = plan_from_program(schedule, hwt)
        if graph_of(plan, hwt) != schedule.graph:  # the kernel's protocol must be the current model's
            raise CodegenError(f"{schedule.graph.op} {dict(schedule.graph.params)} {dict(schedule.graph.tiling)}: the "
                               "schedule's sTask graph differs from the one the operator builds now (solved with an "
                               "older model, or a graph edited by hand): solve it again with ptsolve optimize")
        return plan, schedule.graph, hwt, dict(plan.copies)
    if isinstance(schedule, KernelPlan):
        hwt = load(hw or DEFAULT_HW)
        return schedule, graph_of(schedule, hwt), hwt, dict(schedule.copies or {})
    raise CodegenError(f"lower() takes an SProgram or a KernelPlan, got {type(schedule).__name__}")


def _check_tiling(plan: KernelPlan, g: STaskGraph, copies: dict[str, int]) -> int:
    """CodegenError for tiling keys neither the model nor the generator reads, bad copies, or a ring too shallow
    for its release point; returns the persistent flag. Registers are the compiler's to judge (codegen.compile_check
    compiles and reads ptxas); the model's count goes into the KernelIR."""
    spec = spec_of(g.op)
    tiling = dict(plan.tiling)
    extra = sorted(set(tiling) - set(make(g.op, **g.params).tilings()[0]) - set(spec.optional) - set(CODEGEN_KEYS))
    if extra:
        raise CodegenError(f"{g.op}: unknown tiling key(s) {extra}")
    # split-K's reduce CTAs come after every split unit in a launched grid (codegen.cuda.gemm)
    pers = tiling.get("persistent", spec.persistent if tiling.get("splits", 1) == 1 else 0)
    if isinstance(pers, bool) or pers not in (0, 1):
        raise CodegenError(f"tiling persistent must be 0 or 1, got {pers!r}")
    bufs = protocol.copy_buffers(g)
    if set(copies) - set(bufs) or any(isinstance(c, bool) or not isinstance(c, int) or not 1 <= c <= 3
                                      for c in copies.values()):
        raise CodegenError(f"plan.copies {copies} must give 1-3 copies of the graph's copy buffers {bufs}")
    depth = protocol.ring_depths(g)
    for b, (n, who) in sorted(protocol.min_slots(g).items()):
        if depth[b] < n:
            raise CodegenError(f"{g.op}: ring {b!r} of depth {depth[b]} is released by {who} {n - 1} iteration(s) "
                               f"late; it needs {n} slots")
    return int(pers)


def _loops(order: dict[str, dict[str, list[tuple[str, int]]]], roles: list[str]) -> dict[str, LoopOrder]:
    """Loop orders: the producer's stages shifted to start at 0, the consumers' by their common minimum (their
    alignment is what the tensor-core order refers to)."""
    cbase = min((s for r in roles[1:] for _, s in order["loop"][r]), default=0)
    out = {}
    for r in roles:
        base = min((x for _, x in order["loop"][r]), default=0) if r == "producer" else cbase
        out[r] = LoopOrder(tuple((n, s - base) for n, s in order["loop"][r]))
    return out


def _rings(g: STaskGraph, rings: dict[str, int], roles: list[str], loops: dict[str, LoopOrder],
           order: dict[str, dict[str, list[tuple[str, int]]]], stream: dict[str, str],
           any_shape: bool = False) -> tuple[Ring, ...]:
    """The loop's ring groups (ptsolve.protocol.ring_groups) with each role's first reader and release points,
    then the prologue's loads as one ring of depth 1 (released at the end of a tile). A fill delivers its task's
    bytes; in a generic build (``any_shape``) the whole tile it allocates: the shape's own box (e.g. GEMM's A of
    fewer rows than the tile, ptsolve.geometry.gemm.a_rows) would bake one shape into a kernel every shape of its
    class runs."""

    def nbytes(t: str) -> int:
        return sum(b.bytes for b in g.task[t].allocs if b.space == "smem") if any_shape else g.task[t].bytes

    out = []
    for grp in protocol.ring_groups(g, rings):
        rels, waiters = [], []
        for r in roles[1:]:
            mine = {t for t in grp.readers if stream[t] == r}
            if mine:
                waiters.append((r, _first(loops[r], mine)))
                generic = any(g.task[t].kind != "mma" for t in mine)
                rels += [Release(r, x.task, x.dist, x.mode, generic) for x in grp.releases if stream[x.freer] == r]
        out.append(Ring(grp.name, "loop", grp.buffers, grp.depth, tuple((f, nbytes(f)) for f in grp.fills),
                        tuple(waiters), tuple(rels), WARPS * len({x.role for x in rels})))
    pre = tuple(sorted(b.name for t in g.phase("pre") if t.kind == "load" for b in t.allocs))
    if pre:
        waiters, rels = [], []
        for r in roles[1:]:
            readers = {t.name for t in g.tasks if stream[t.name] == r and set(t.reads) & set(pre)}
            if readers:
                waiters.append((r, next((n for n, _ in order["pre"][r] if n in readers), "")))
                rels.append(Release(r, "", 0, "tile", any(g.task[t].kind != "mma" for t in readers)))
        fills = tuple((t.name, nbytes(t.name)) for t in g.phase("pre") if t.kind == "load")
        out.append(Ring("pre", "pre", pre, 1, fills, tuple(waiters), tuple(rels), WARPS * len(rels)))
    return tuple(out)


def _turns(plan: KernelPlan, g: STaskGraph, stream: dict[str, str], turns: bool) -> tuple[bool, str]:
    """Whether the tensor-core order is enforced, and why not when it is not."""
    known = {t.name for t in g.phase("loop") if t.kind == "mma"}
    tc = list(plan.tc_order)
    if any(x not in known for x in tc) or len(set(tc)) != len(tc):
        raise CodegenError(f"tc_order {tc} must list distinct loop mma tasks of {sorted(known)}")
    if len({stream[x] for x in tc}) < 2:
        return False, "one consumer warpgroup" if g.groups == 1 else "tc_order names fewer than two warpgroups"
    return (True, "") if turns else (False, "turns switched off (lower(..., turns=False))")


def _smem_copies(g: STaskGraph, loops: dict[str, LoopOrder], stream: dict[str, str], copies: dict[str, int],
                 cap: dict[str, int]) -> dict[str, int]:
    """Copies of the shared-memory copy buffers (a consumer writes them, its wgmma reads them, e.g. ChunkState's
    scaled x): an order that puts the asynchronous reader d stages behind the writer asks the writer to run d
    iterations ahead of the tensor cores, which takes d + 1 copies (else the writer waits for the wgmma it has
    just issued and vector and tensor-core work serialise). The schedule's start times may prove fewer enough
    (``plan.min_copies``), but those only cost registers for register buffers; a shared-memory copy costs shared
    memory, which ``_smem`` checks against the budget (the fewest are kept when it does not fit). For an SProgram,
    never more than it allocated (``cap``; a KernelPlan keeps its own copies). The old per-op emitters did the
    same (ChunkState: two xs buffers for the overlapped order, whatever the start times)."""
    bufs = g.buffers()
    out = dict(copies)
    for b in protocol.copy_buffers(g):
        if bufs[b].space != "smem":
            continue
        a, frees = protocol.ring_users(g)[b]
        st = dict(loops[stream[a]].ops)
        d = max((st[f] - st[a] for f in frees if f in st and g.task[f].is_async), default=0)
        out[b] = max(out[b], min(3, cap.get(b, 1), 1 + d))
    return out


def _smem(g: STaskGraph, rings: dict[str, int], copies: dict[str, int], hw: Hardware, ctas: int
          ) -> tuple[tuple[Smem, ...], protocol.Layout]:
    """Every shared-memory buffer at the offset of the model's layout; CodegenError beyond the budget."""
    lay = protocol.smem_layout(g, rings, copies, hw)
    budget = Target(hw).smem_budget(ctas)
    if lay.total > budget:
        raise CodegenError(f"{g.op} tiling {g.tiling} needs {lay.total} B of shared memory, over the {budget} B of "
                           f"{ctas} CTA(s) per SM on {hw.name}")
    owner = {b.name: t for t in g.tasks for b in t.allocs}
    bufs = g.buffers()
    out = []
    for n, o in sorted(lay.offsets.items(), key=lambda x: (x[1], x[0])):
        t = owner[n]
        slots = rings.get(n, copies.get(n, 1)) if t.phase == "loop" else 1
        out.append(Smem(n, o, bufs[n].bytes, lay.strides.get(n, bufs[n].bytes), slots,
                        "" if t.group < 0 else f"wg{t.group}"))
    return tuple(out), lay


def _tasks(g: STaskGraph, stream: dict[str, str]) -> tuple[TaskInfo, ...]:
    bufs = g.buffers()
    return tuple(TaskInfo(t.name, t.kind, t.phase, stream[t.name], t.is_async,
                          tuple(sorted(b for b in {*t.reads, *t.frees, *(x.name for x in t.allocs)}
                                       if bufs[b].space == "smem")),
                          tuple(sorted(x.name for x in t.allocs if x.space == "reg")),
                          tuple(sorted(e.src for e in g.preds(t.name) if stream[e.src] == stream[t.name])))
                 for t in g.tasks)


def _renamed(name: str, g: int) -> str:
    """A warpgroup-0 name (``mma@0``, ``acc@0``) as warpgroup ``g``'s; shared names (``a``, ``load_a``) as they are."""
    return name[:-2] + f"@{g}" if name.endswith("@0") else name


def pingpong(ir: KernelIR, groups: int, regs: int, turns: bool) -> KernelIR:
    """The ping-pong kernel of a one-warpgroup tile's KernelIR (GEMM tiling key ``pingpong``): ``groups`` consumer
    warpgroups take the persistent CTA's tiles in turn, each running warpgroup 0's orders on its own tile with its
    own names (``mma@1``, ``acc@1``); the tensor cores serve their main loops in warpgroup order
    (``tc_order`` mma@0, mma@1, ... passed once per tile, ``codegen.sync_sim``), so one's epilogue overlaps the
    next one's main loop; a ring slot is released by the one warpgroup whose tile it holds (``arrivals``: its
    warps). A warpgroup-0 buffer outside the main loop is the graph's for all the kernel's warpgroups, sized so
    (GEMM's TMA-store staging ``cs@0``: each warpgroup its half). ``regs``: registers per consumer thread for
    ``groups`` warpgroups."""
    if not turns:
        raise CodegenError("gemm ping-pong: its warpgroups alternate on the tensor cores by their turns (the model's "
                           "protocol); lower it with turns=True")
    if not ir.persistent:
        raise CodegenError("gemm ping-pong: the warpgroups take turns over a persistent CTA's tiles; it needs "
                           "persistent=1")
    in_loop = {b for t in ir.tasks if t.phase == "loop" for b in t.smem}
    if any(r.phase == "pre" for r in ir.rings) or any(s.role and s.name in in_loop for s in ir.smem):
        raise CodegenError("ping-pong: the tile's prologue loads and per-warpgroup shared memory of the main loop are "
                           "not supported")
    wg0 = ir.role("wg0")
    roles = [ir.role("producer")] + [
        Role(f"wg{g}", g, regs, tuple((_renamed(n, g), s) for n, s in wg0.pre),
             tuple((_renamed(n, g), s) for n, s in wg0.loop), tuple((_renamed(n, g), s) for n, s in wg0.post))
        for g in range(groups)]
    tasks = list(ir.tasks)
    mine = [t for t in ir.tasks if t.role == "wg0"]
    for g in range(1, groups):
        tasks += [TaskInfo(_renamed(t.name, g), t.kind, t.phase, f"wg{g}", t.is_async, t.smem,
                           tuple(_renamed(b, g) for b in t.regs), tuple(_renamed(a, g) for a in t.after)) for t in mine]
    rings = tuple(dataclasses.replace(
        r, waiters=tuple((f"wg{g}", _renamed(t, g)) for g in range(groups) for rr, t in r.waiters if rr == "wg0"),
        releases=tuple(dataclasses.replace(x, role=f"wg{g}", task=_renamed(x.task, g))
                       for g in range(groups) for x in r.releases if x.role == "wg0"),
        arrivals=WARPS) for r in ir.rings)
    waits = {_renamed(t, g): tuple((_renamed(a, g), o) for a, o in v) for g in range(groups)
             for t, v in ir.waits.items()}
    mmas = [n for n, _ in wg0.loop if ir.task(n).kind == "mma"]
    return dataclasses.replace(
        ir, roles=tuple(roles), tasks=tuple(tasks), rings=rings, waits=waits,
        commits=tuple(sorted({_renamed(c, g) for g in range(groups) for c in ir.commits})),
        tc_order=tuple(_renamed(m, g) for g in range(groups) for m in mmas), turns=True, turns_note="",
        copies={_renamed(b, g): c for g in range(groups) for b, c in ir.copies.items()},
        threads=128 * (groups + 1), pingpong=True)


def lower(schedule: SProgram | KernelPlan, hw: str | Hardware | Target | None = None, *,
          persistent: bool | None = None, turns: bool = True, profile: bool = False, generic: bool = False
          ) -> KernelIR:
    """The KernelIR of an SProgram (copies trimmed to what its start times use, ``plan.min_copies``) or of a
    KernelPlan (its own copies; the fewest its order needs where it names none). ``persistent`` overrides the
    plan's tiling key; ``turns`` False leaves the consumers' tensor-core order unenforced; ``profile`` asks for
    the instrumented build (codegen.profile); ``generic`` for the shape-generic build (the schedule's shape is only
    its representative: sizes become kernel arguments)."""
    from ptsolve.validate import regs_per_thread

    plan, g, hwt, copies = _source(schedule, hw)
    pers = _check_tiling(plan, g, copies)
    pers = pers if persistent is None else int(persistent)
    tgt = Target(hwt)
    order = _check_order(plan, g)
    tm = timings(g, hwt)
    stream = {t: tm[t].stream for t in tm}
    rings = protocol.ring_depths(g)
    roles = _roles(plan, g)
    ctas, W = int(g.tiling.get("ctas", 1)), g.groups
    loops = _loops(order, roles)
    for b in protocol.copy_buffers(g):  # a hand plan that names no copies gets the fewest its order needs
        if b not in copies:
            copies[b] = next((c for c in (1, 2, 3) if _order_ok(g, tm, hwt, rings, copies | {b: c}, loops)), 3)
    fewest = dict(copies)
    if isinstance(schedule, SProgram):  # a KernelPlan's copies are its own (named, or the fewest its order needs)
        # at most what the program allocated (programs of an older model listed shared copy buffers as rings)
        cap = {b: int(schedule.copies.get(b) or schedule.rings.get(b) or 1) for b in protocol.copy_buffers(g)}
        copies = _smem_copies(g, loops, stream, copies, cap)
    for r in roles:
        check_deps(r, loops[r], _deps(g, tm, hwt, rings, copies, r))
    enforce, note = _turns(plan, g, stream, turns)
    try:
        smem, lay = _smem(g, rings, copies, hwt, ctas)
    except CodegenError:
        if copies == fewest:
            raise
        copies = fewest  # the staggered copies do not fit: the fewest the schedule needs
        smem, lay = _smem(g, rings, copies, hwt, ctas)
    prod_regs = tgt.producer_regs(ctas)
    out_roles = tuple(Role(r, -1 if r == "producer" else int(r[2:]),
                           (prod_regs if r == "producer" else tgt.consumer_regs(W, ctas)) if prod_regs else 0,
                           tuple(order["pre"][r]), loops[r].ops, tuple(order["post"][r])) for r in roles)
    ir = KernelIR(
        op=g.op, params=make(g.op, **g.params).params,  # the operator's defaults for graphs that predate them
        tiling={k: v for k, v in plan.tiling.items() if k not in CODEGEN_KEYS} | {"ctas": ctas}, target=hwt.name,
        roles=out_roles, tasks=_tasks(g, stream), rings=_rings(g, rings, roles, loops, order, stream, generic),
        waits={t: tuple(v) for t, v in protocol.waits(g, copies).items() if g.task[t].phase == "loop"},
        commits=tuple(sorted(t.name for t in g.phase("loop") if t.kind == "mma" and t.is_async)),
        tc_order=tuple(plan.tc_order), turns=enforce, turns_note=note,
        copies={b: copies[b] for b in protocol.copy_buffers(g)}, smem=smem, barriers=lay.barriers,
        smem_bytes=lay.total, threads=128 * (W + 1), ctas=ctas, persistent=bool(pers), sms=hwt.sms,
        predicted_ii=int(plan.ii), trips=g.trip_count,
        model_regs=max(regs_per_thread(g, copies, k, hwt)[0] for k in range(W)),
        profile=profile, generic=generic, multicast=tuple(sorted(t.name for t in g.tasks if t.multicast > 1)))
    if g.tiling.pingpong:
        kg = g.tiling.kernel_groups(W)
        return pingpong(ir, kg, tgt.consumer_regs(kg, ctas) if prod_regs else 0, turns)
    return ir
