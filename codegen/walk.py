"""The one skeleton walk of a KernelIR, for every back end (``codegen.cuda``, ``codegen.hip``).

A kernel is a producer role that fills the KernelIR's rings and consumer roles that read them, each role running
its prologue tasks, its software-pipelined loop (``codegen.loop.emit_loop``) and its epilogue tasks, inside a tile
loop (persistent or one tile per block). The walk here decides, once for every target, what comes where: a ring's
full wait at its first reader, its releases at the KernelIR's release points (``wait`` before the task, ``commit``
and ``end`` after it, the ones past the last iteration at the end of the tile), the slot pointers a task sees, the
prologue's wait and release, the tensor-core turns around the loop's tasks. A ``Backend`` writes the text of each of
those steps in its target's instructions (mbarriers and wgmma waits on sm_90a, LDS semaphores on gfx942) and
assembles the kernel around the walk's parts; an operator's task bodies (the back end's ``OpKernel``) fill in the
rest.

A task body sees ``it_`` (its reduction iteration), ``q_`` (its ring position), ``<buf>_cur`` (the slot of every
shared-memory buffer it touches), and the names its back end documents.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ptsolve.errors import CodegenError

from .kernel_ir import KernelIR, Release, Ring, Role
from .loop import LoopOrder, Turns, emit_loop
from .sync_sim import loops, turns

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
class Walk:
    """What every step of the walk reads, derived once from the KernelIR: the roles' loop orders, the turns, the
    prologue ring and the loop rings, which ring each load fills and each buffer lives in, the operator's trip count
    and tile decoder (``opk``: the back end's OpKernel of the operator)."""

    ir: KernelIR
    opk: Any
    pid: str
    lo: dict[str, LoopOrder]
    tn: Turns | None
    pre: Ring | None
    loop_rings: list[Ring]
    fill_of: dict[str, Ring]
    ring_of_buf: dict[str, Ring]
    trips: int | str
    ntiles: int
    decode: str


def facts(ir: KernelIR, opk: Any, pid: str) -> Walk:
    """The Walk of ``ir`` with the operator's task bodies ``opk``."""
    lo = loops(ir)
    tn = turns(ir, lo)
    loop_rings = [r for r in ir.rings if r.phase == "loop"]
    trips = opk.trips(ir)
    ntiles, decode = opk.tiles(ir)
    return Walk(ir=ir, opk=opk, pid=pid, lo=lo, tn=tn, pre=next((r for r in ir.rings if r.name == "pre"), None),
                loop_rings=loop_rings, fill_of={t: r for r in ir.rings for t, _ in r.fills},
                ring_of_buf={b: r for r in loop_rings for b in r.buffers}, trips=trips, ntiles=ntiles, decode=decode)


@dataclass(frozen=True)
class Consumer:
    """One consumer role's loop as the walk emits it: the rings each task waits for first (``waiter_of``), the
    releases at each task (``rel``), the async tensor-core groups (``commits``), the waits each task needs on them
    (``needs``) and their steady-loop depths (``steady``), the tasks that take their early form, register copies."""

    role: Role
    waiter_of: dict[str, list[Ring]]
    rel: dict[str, list[tuple[Ring, Release]]]
    commits: set[str] = field(default_factory=set)
    needs: dict[str, list] = field(default_factory=dict)
    steady: dict[str, dict[str, int]] = field(default_factory=dict)
    early: set[str] = field(default_factory=set)
    nbuf: int = 1
    tail: str = ""  # code at the end of every steady iteration (emit_loop's ``tail``)


class Backend(Protocol):
    """The target's text for each step of the walk (``w``: the Walk; ``role`` a consumer Role)."""

    ptr: str  # the C type of a shared-memory byte pointer

    def slot_pointer(self, buf: str, addr: str) -> str:
        """The line that declares ``<buf>_cur`` at shared-memory address ``addr``."""

    def fill(self, w: Walk, task: str, it: str) -> str:
        """The producer's code for one instance of loop load ``task`` at iteration ``it``."""

    def producer_pre(self, w: Walk) -> list[str]:
        """The producer's prologue: its wait for the previous tile's release and its prologue loads."""

    def consumer(self, w: Walk, role: Role, base: Consumer) -> Consumer:
        """``base`` with the target's async tensor-core waits and register copies of ``role``'s loop."""

    def full_wait(self, w: Walk, r: Ring) -> str:
        """A consumer's wait for ring ``r``'s slot of ring position ``q_`` to be filled."""

    def release(self, w: Walk, r: Ring, slot: str, x: Release) -> str:
        """A consumer's release of ring ``r``'s slot of ring position ``slot`` (release point ``x``)."""

    def wg_wait(self, depth: int) -> str:
        """A task's wait until at most ``depth`` async tensor-core groups are in flight."""

    def probe(self, w: Walk, var: str) -> str:
        """A profiler clock stamp into ``var`` ("" unless the build is instrumented)."""

    def record(self, w: Walk, task: str, phase: str, it: str) -> str:
        """The profiler's record of one task instance ("" unless the build is instrumented)."""

    def role_head(self, w: Walk, role: Role) -> list[str]:
        """A consumer role's code before its tile loop: its header comment, constants and registers."""

    def tile_head(self, w: Walk, role: Role) -> list[str]:
        """A consumer role's code at the start of each tile."""

    def pre_wait(self, w: Walk) -> str:
        """A consumer's wait for the prologue's loads."""

    def edge_task(self, w: Walk, role: Role, task: str, phase: str) -> list[str]:
        """A prologue (``phase`` "pre") or epilogue ("post") task of a consumer, with what must precede it."""

    def turns(self, w: Walk, role: Role) -> tuple[dict[str, tuple[str, str]] | None, list[str], list[str]]:
        """The tensor-core turns: per loop task (code before, after), and code before and after the whole loop."""

    def tile_done(self, w: Walk, role: Role) -> list[str]:
        """A consumer's code after its loop, before the tile's remaining releases."""

    def release_pre(self, w: Walk, role: Role) -> str:
        """A consumer's release of the prologue's buffers at the end of a persistent tile."""

    def first_turn(self, w: Walk) -> str:
        """The one arrival per block that hands the very first tensor-core turn on ("" without turns)."""


@dataclass(frozen=True)
class Parts:
    """The walk's output the back end assembles its kernel around: the producer's prologue lines and loop, the
    consumers' branches (``TILE_LOOP {`` / ``TILE_END`` mark each tile loop), the first turn, the prologue buffers'
    pointers."""

    producer_pre: list[str]
    producer: str
    consumers: str
    first_turn: str
    pre_ptrs: list[str]


def walk(w: Walk, bk: Backend) -> Parts:
    """The roles of ``w``'s kernel in ``bk``'s text."""
    prod_pre = bk.producer_pre(w)
    prod = emit_loop(w.lo["producer"], w.trips, lambda name, it, parity, waits: bk.fill(w, name, it), 1, {},
                     min_trips=w.opk.min_trips)
    branches = []
    for role in (r for r in w.ir.roles if r.group >= 0):
        c = consumer(w, bk, role)
        branches.append((role.group, "\n".join(bk.role_head(w, role)), consumer_tile(w, bk, c)))
    cons = " else ".join(f"if (g == {gi}) {{\n{d}\nTILE_LOOP {{\n{t}\nTILE_END\n}}" for gi, d, t in branches)
    pre_ptrs = [f"  {bk.ptr} const {cname(b)}_s = smem + {w.ir.buffer(b).offset}; (void){cname(b)}_s;"
                for b in (w.pre.buffers if w.pre else ())]
    return Parts(prod_pre, prod, cons, bk.first_turn(w), pre_ptrs)


def cname(buf: str) -> str:
    """A buffer's name in C (without its ``@g``)."""
    return buf.split("@")[0]


def copies_note(ir: KernelIR, role: Role) -> str:
    """``; <buf>: <n> copies`` for each of ``role``'s buffers kept in more than one copy (a header comment's tail)."""
    return "".join(f"; {b}: {c} copies" for b, c in sorted(ir.copies.items())
                   if b.endswith(f"@{role.group}") and c > 1)


def tile_loop(src: str, head: str, end: str) -> str:
    """``src`` with every ``TILE_LOOP {`` / ``TILE_END`` replaced by the tile loop's head and end."""
    return src.replace("TILE_LOOP {", head).replace("TILE_END", end)


def block(*lines: str) -> str:
    """Lines joined, the empty ones (switched-off probes) left out."""
    return "\n".join(x for x in lines if x)


def register_copies(ir: KernelIR, role: Role, refusal: str) -> int:
    """Register copies a role keeps of its loop buffers: 2 when any copy count is 2 (the loop is unrolled by two and
    each task picks its copy by the parity of its iteration); more is a CodegenError (``refusal`` says why)."""
    own = {b for n, _ in role.loop for b in ir.task(n).regs}
    n = max((ir.copies.get(b, 1) for b in own), default=1)
    if n > 2:
        raise CodegenError(f"{role.name}: {n} register copies of one buffer; {refusal}")
    return n


def slot_pointers(w: Walk, bk: Backend, task: str, slot: str) -> list[str]:
    """The ``<buf>_cur`` lines of ``task``: a ring buffer's slot of ring position ``slot``, a multi-slot (or
    role-owned) buffer's slot of iteration ``it_``."""
    out = []
    for b in w.ir.task(task).smem:
        r = w.ring_of_buf.get(b)
        if r is not None:
            out.append(bk.slot_pointer(cname(b), _addr(w.ir, b, f"({slot}) % {r.depth}")))
        elif w.ir.buffer(b).slots > 1 or w.ir.buffer(b).role:
            out.append(bk.slot_pointer(cname(b), _addr(w.ir, b, f"(it_) % {w.ir.buffer(b).slots}")))
    return out


def _addr(ir: KernelIR, buf: str, slot: str | None) -> str:
    s = ir.buffer(buf)
    base = f"smem + {s.offset}"
    return f"{base} + ({slot}) * {s.stride}" if slot is not None and s.slots > 1 else base


def consumer(w: Walk, bk: Backend, role: Role) -> Consumer:
    """The Consumer of ``role``: its rings' waits and releases, with the back end's async waits."""
    names = {n for n, _ in role.loop}
    waiter_of = {t: [r for r in w.loop_rings if (role.name, t) in r.waiters] for t in names}
    rel = {t: [(r, x) for r in w.loop_rings for x in r.releases if x.role == role.name and x.task == t]
           for t in names}
    return bk.consumer(w, role, Consumer(role, waiter_of, rel))


def consumer_tile(w: Walk, bk: Backend, c: Consumer) -> str:
    """One consumer role's code per tile: the prologue tasks (the prologue's wait before the first reader), the
    loop between its turns, the releases past the last iteration, the prologue's release, the epilogue tasks."""
    role = c.role
    tile = bk.tile_head(w, role)
    pw = dict(w.pre.waiters).get(role.name) if w.pre is not None else None
    for name, _ in role.pre:
        if pw == name:
            tile.append(bk.pre_wait(w))
        tile += bk.edge_task(w, role, name, "pre")
    if pw == "":
        tile.append(bk.pre_wait(w))
    turn, before, after = bk.turns(w, role)
    tile += before
    tile.append(emit_loop(w.lo[role.name], w.trips,
                          lambda name, it, parity, waits: task_instance(w, bk, c, name, it, parity, waits),
                          c.nbuf, c.steady, c.commits, min_trips=w.opk.min_trips, turn=turn, tail=c.tail))
    tile += after
    tile += bk.tile_done(w, role)
    for r in w.loop_rings:
        for x in r.releases:
            if x.role == role.name and x.mode in ("wait", "commit"):
                for k in range(1, x.dist + 1):
                    tile.append(f"if (T >= {k}) {{  // {', '.join(r.buffers)} of iteration T-{k}\n"
                                f"{bk.release(w, r, f'rbase + T - {k}', x)}\n}}")
    if w.pre is not None and pw is not None:
        tile.append("if (PERSISTENT) {  // the prologue's buffers are free for the next tile\n"
                    f"{bk.release_pre(w, role)}\n}}")
    for name, _ in role.post:
        tile += bk.edge_task(w, role, name, "post")
    return "\n".join(tile)


def task_instance(w: Walk, bk: Backend, c: Consumer, name: str, it: str, parity: int | None,
                  waits: Mapping[str, int] | None) -> str:
    """One consumer loop task at iteration ``it``: its async waits, the ``wait`` releases it performs, the full
    waits of the rings it reads first, its slot pointers, the body, the ``commit`` and ``end`` releases."""
    lines = [f"{{ const int it_ = {it}; const int q_ = rbase + it_; (void)q_;", bk.probe(w, "p0_")]
    depth = (0 if waits is None else waits.get("depth")) if name in c.needs else None
    if depth is not None and name not in c.commits:
        lines.append(bk.wg_wait(depth))
    for r, x in c.rel[name]:
        if x.mode == "wait":
            guard = f"if (it_ >= {x.dist}) " if x.dist else ""
            lines.append(f"  {guard}{{  // {', '.join(r.buffers)} of iteration it-{x.dist} released\n"
                         f"{bk.release(w, r, f'q_ - {x.dist}', x)}\n  }}")
    lines += [bk.full_wait(w, r) for r in c.waiter_of[name]]
    lines += slot_pointers(w, bk, name, "q_")
    lines.append(bk.probe(w, "p1_"))
    body = w.opk.body(Task(name, c.role, "it_", parity, "loop", w.ir, name in c.early))
    # an "end" release goes where the body's last read of the slot is done (its LAST_READ marker), else after it
    ends = "\n".join(f"  {{  // {', '.join(r.buffers)} of this iteration released\n{bk.release(w, r, 'q_', x)}\n  }}"
                     for r, x in c.rel[name] if x.mode == "end")
    if LAST_READ in body:
        body, ends = body.replace(LAST_READ, ends), ""
    lines.append(body)
    if depth is not None and name in c.commits:
        lines.append(bk.wg_wait(depth))
    for r, x in c.rel[name]:
        if x.mode == "commit":
            lines.append(f"  if (it_ >= 1) {{  // {', '.join(r.buffers)} of iteration it-1 released\n"
                         f"{bk.release(w, r, 'q_ - 1', x)}\n  }}")
    lines += [ends, bk.record(w, name, "loop", "it_"), "}"]
    return block(*lines)
