"""The pipeline protocol of an sTask-graph, defined once for the model and the kernels.

A buffer allocated in the loop is either
- a *ring*: shared memory a load task (the producer's TMA) fills; ``depth`` slots, a full/empty mbarrier
  pair per slot; or
- a *copy buffer*: registers (or shared memory a consumer writes itself, e.g. ChunkState's scaled x) that
  one warpgroup reuses every ``copies`` iterations.

Where a ring slot is free again (``Release``) follows from who reads it last:
- ``end``: the freeing task is synchronous (a vector task reading the slot) or a copy; the slot is free when
  it is done;
- ``wait``: the freeing task is an asynchronous wgmma; a later task of the same stream that depends on it
  waits for it (``wgmma.wait_group``) first thing and releases the slot right after that wait;
- ``commit``: nothing in the stream waits for the wgmma, so its next instance, right after it is issued,
  waits for the previous one and releases that one's slot (the GEMM / Mamba2 mainloops).
The model (``precedences``: capacity edges, mbarriers) and the lowering (``codegen.lower``: empty-barrier
arrivals, wgmma waits) both read this module, so a kernel frees a slot exactly where the schedule assumed.
"""
from __future__ import annotations

from dataclasses import dataclass

from .cost import Timing, edge_delay, grain
from .hw import Hardware
from .ir import STaskGraph

MODES = ("end", "wait", "commit")


@dataclass(frozen=True)
class Release:
    """The slot a freeing task ``freer`` reads in iteration ``it`` is free once ``task`` of iteration
    ``it + dist`` (same stream) has done ``mode`` (see the module doc)."""

    freer: str
    task: str
    dist: int
    mode: str


def ring_users(g: STaskGraph) -> dict[str, tuple[str, list[str]]]:
    """Loop-allocated buffer -> (allocating task, tasks that free it; its readers if none frees it)."""
    out = {}
    for t in g.phase("loop"):
        for b in t.allocs:
            out[b.name] = (t.name, sorted(u.name for u in g.tasks if b.name in u.frees) or
                           sorted(u.name for u in g.tasks if b.name in u.reads))
    return out


def is_ring(g: STaskGraph, buf: str) -> bool:
    """True for a loop buffer in shared memory that a load task fills (a producer ring)."""
    a, _ = ring_users(g)[buf]
    return g.buffers()[buf].space == "smem" and g.task[a].kind == "load"


def ring_depths(g: STaskGraph) -> dict[str, int]:
    """Ring buffer -> slots: the tiling's ``depth`` (2 when it has none)."""
    return {b: int(g.tiling.get("depth", 2)) for b in ring_users(g) if is_ring(g, b)}


def copy_buffers(g: STaskGraph) -> list[str]:
    """Loop buffers that are not rings (registers, consumer-written shared memory), sorted."""
    return sorted(b for b in ring_users(g) if not is_ring(g, b))


def _stream(t: object) -> int:
    return getattr(t, "group", -1)


def releases(g: STaskGraph) -> dict[str, tuple[Release, ...]]:
    """Ring buffer -> one Release per freeing task. For an asynchronous freer the waiting task is the
    same-stream loop successor with the smallest iteration distance (ties: by name)."""
    task = g.task
    out: dict[str, tuple[Release, ...]] = {}
    for b, (_, frees) in sorted(ring_users(g).items()):
        if not is_ring(g, b):
            continue
        rs = []
        for f in frees:
            ft = task[f]
            if not (ft.is_async and ft.kind == "mma"):  # a vector task, or a copy that completes on its own
                rs.append(Release(f, f, 0, "end"))
                continue
            cand = sorted((e.dist, e.dst) for e in g.succs(f) if e.dst != f and task[e.dst].phase == "loop"
                          and not task[e.dst].is_async and _stream(task[e.dst]) == _stream(ft))
            rs.append(Release(f, cand[0][1], cand[0][0], "wait") if cand else Release(f, f, 1, "commit"))
        out[b] = tuple(rs)
    return out


def waits(g: STaskGraph, copies: dict[str, int]) -> dict[str, list[tuple[str, int]]]:
    """task -> [(async task, offset)]: iteration ``it`` of the task must see iteration ``it + offset`` of the
    wgmma task complete before it runs (after it is issued, for a task that is itself asynchronous):
    - a same-stream dependence on an asynchronous task's result (S before the softmax, O before the rescale);
    - a copy buffer written again while an asynchronous reader of an older copy may still run;
    - a ring slot released on a ``commit``.
    Loop tasks only; pre and post tasks wait for everything (``wgmma.wait_group 0``)."""
    task = g.task
    out: dict[str, set[tuple[str, int]]] = {}
    for e in g.edges:
        u, v = task[e.src], task[e.dst]
        if u.phase == v.phase == "loop" and u.is_async and u.kind == "mma" and not v.is_async \
                and _stream(u) == _stream(v):
            out.setdefault(v.name, set()).add((u.name, -e.dist))
    for b, (a, frees) in ring_users(g).items():
        if is_ring(g, b):
            for r in releases(g)[b]:
                if r.mode == "commit":
                    out.setdefault(r.freer, set()).add((r.freer, -1))
            continue
        c = copies.get(b, 1)
        for f in frees:
            if task[f].is_async and task[f].kind == "mma" and f != a:
                out.setdefault(a, set()).add((f, -c))
    return {t: sorted(v) for t, v in sorted(out.items())}


def min_slots(g: STaskGraph) -> dict[str, tuple[int, str]]:
    """Ring buffer -> (fewest slots that do not deadlock, the releasing task that needs them): a slot released
    by a task ``dist`` iterations later needs ``dist + 1`` slots."""
    return {b: max((r.dist + 1, r.task) for r in rs) for b, rs in releases(g).items() if rs}


def first_reuse(g: STaskGraph, rings: dict[str, int], copies: dict[str, int]) -> dict[str, int]:
    """Allocating task -> the first of its iterations that reuses a slot (ring depth or copies): earlier
    iterations fill fresh slots and wait for no release (what a replay from an empty pipeline needs)."""
    out: dict[str, int] = {}
    for b, (a, _) in ring_users(g).items():
        n = rings.get(b) if b in rings else copies.get(b)
        if n is not None:
            out[a] = min(out.get(a, n), n)
    return out


def issue_cycles(tm: dict[str, Timing], t: str) -> int:
    """Cycles task ``t`` holds its own stream (the issue of an asynchronous task)."""
    s = tm[t].stream
    return max((o + n for r, o, n in tm[t].uses if r == s), default=0)


def precedences(g: STaskGraph, tm: dict[str, Timing], hw: Hardware, rings: dict[str, int],
                copies: dict[str, int]) -> list[tuple[str, str, int, int, str]]:
    """Every precedence a schedule must honour: (src, dst, dist, cycles from src's start to dst's, kind).

    kind ``edge``: a graph edge (latency, + a barrier across streams). kind ``ring``: the slot a freeing task
    reads in iteration i is refilled D iterations later (ring depth or copies D), so the allocating task of
    i+D waits until the slot is released (``releases``): the freer is done and, for a ``wait`` / ``commit``
    release, the releasing task of i+dist has reached its wait (+ a barrier to the producer), + hw.ring_handoff
    (the refill's start after the release, which the fill never waits for). The costs are the graph's operator's
    (Hardware.for_op), as its tasks' timings are."""
    hw = hw.for_op(g.op)
    out = [(e.src, e.dst, e.dist, edge_delay(tm, e.src, e.dst, hw), "edge") for e in g.edges]
    rel = releases(g)
    bar = grain(hw.barrier_cycles)
    hand = grain(hw.ring_handoff) if hw.ring_handoff else 0
    for b, (a, frees) in ring_users(g).items():
        if b in rel:
            depth = rings.get(b)
            if depth is None:
                continue
            for r in rel[b]:
                out.append((r.freer, a, depth, edge_delay(tm, r.freer, a, hw) + hand, "ring"))
                if r.mode == "end":
                    continue
                d = depth - r.dist  # < 1 on a ring too shallow for its release (min_slots): check_valid says so
                delay = (issue_cycles(tm, r.task) if r.mode == "commit" else 0) + hand + \
                    (0 if tm[r.task].stream == tm[a].stream else bar)
                out.append((r.task, a, d, delay, "ring"))
        else:
            c = copies.get(b)
            if c is not None:
                out += [(f, a, c, edge_delay(tm, f, a, hw), "ring") for f in frees]
    return out


@dataclass(frozen=True)
class RingGroup:
    """Ring buffers that share one full/empty mbarrier pair per slot: filled by the same producer iteration,
    read and released by the same tasks. ``fills``: the load tasks (one arrival with its bytes each)."""

    name: str
    buffers: tuple[str, ...]
    depth: int
    fills: tuple[str, ...]
    readers: tuple[str, ...]
    releases: tuple[Release, ...]


def ring_groups(g: STaskGraph, rings: dict[str, int]) -> list[RingGroup]:
    """The rings of ``g`` grouped by (depth, readers, releases), named after their first buffer, sorted."""
    rel = releases(g)
    users = ring_users(g)
    key: dict[tuple, list[str]] = {}
    for b in sorted(rel):
        if b not in rings:
            continue  # a program without this ring's depth (check_valid says so); nothing to group
        readers = tuple(sorted(t.name for t in g.tasks if b in t.reads))
        key.setdefault((rings[b], readers, rel[b]), []).append(b)
    out = [RingGroup(bs[0], tuple(bs), d, tuple(users[b][0] for b in bs), readers, rs)
           for (d, readers, rs), bs in key.items()]
    return sorted(out, key=lambda r: r.name)


@dataclass(frozen=True)
class Layout:
    """Shared memory of one CTA, bytes from a base aligned to ``hw.smem_tile_align``.

    offsets: buffer -> offset of its slot 0 (copy buffers: of copy 0); strides: buffer -> bytes between
    consecutive slots / copies; barriers: offset of the mbarrier area (``nbar`` 8-byte barriers);
    total: bytes to request (alignment slack of the dynamic allocation included)."""

    offsets: dict[str, int]
    strides: dict[str, int]
    barriers: int
    nbar: int
    total: int
    names: tuple[str, ...]


def _up(x: int, a: int) -> int:
    return -(-x // a) * a


def buffer_align(nbytes: int, hw: Hardware) -> int:
    """Alignment of a shared-memory buffer: a buffer of at least one swizzle atom is an operand tile (TMA /
    wgmma, ``hw.smem_tile_align``); smaller ones (fp32 vectors, scalars) 128 bytes (a TMA box)."""
    return hw.smem_tile_align if nbytes >= hw.smem_tile_align else min(128, hw.smem_tile_align)


def smem_layout(g: STaskGraph, rings: dict[str, int], copies: dict[str, int], hw: Hardware) -> Layout:
    """The shared-memory layout of a CTA: prologue buffers (for the whole CTA), then the ring groups
    (``depth`` slots each, a slot = its buffers) and the consumer-written copy buffers, overlaid by the
    epilogue's buffers (never live at once), then 2·depth mbarriers per ring group and two for the prologue
    loads. The model checks this total against the budget and the kernels use these offsets."""
    bufs = g.buffers()
    owner = {b.name: t for t in g.tasks for b in t.allocs}
    sm = {n: b for n, b in sorted(bufs.items()) if b.space == "smem"}
    off: dict[str, int] = {}
    stride: dict[str, int] = {}
    names: list[str] = []
    at = 0

    def place(n: str, start: int) -> int:
        a = buffer_align(sm[n].bytes, hw)
        off[n] = _up(start, a)
        return off[n] + sm[n].bytes

    for n in sm:
        if owner[n].phase == "pre":
            at = place(n, at)
            names.append(n)
    loop0 = at
    groups = ring_groups(g, rings)
    for r in groups:
        base, slot = _up(at, hw.smem_tile_align), 0
        for b in r.buffers:
            slot = place(b, base + slot) - base
        s = _up(slot, hw.smem_tile_align)
        for b in r.buffers:
            stride[b] = s
        at = base + r.depth * s
        names.append(f"{'+'.join(r.buffers)}x{r.depth}")
    for n in sm:
        if owner[n].phase == "loop" and n not in rings:
            c = copies.get(n, 1)
            end = place(n, at)
            stride[n] = _up(sm[n].bytes, buffer_align(sm[n].bytes, hw))
            at = end + (c - 1) * stride[n]
            names.append(f"{n}x{c}" if c > 1 else n)
    post_at = loop0
    for n in sm:
        if owner[n].phase == "post":
            post_at = place(n, post_at)
    if post_at > at:
        names = names[:len([n for n in sm if owner[n].phase == "pre"])] + [n for n in sm if owner[n].phase == "post"]
        at = post_at
    nbar = 2 + sum(2 * r.depth for r in groups)
    bar = _up(at, 16)
    return Layout(off, stride, bar, nbar, bar + 8 * nbar + hw.smem_tile_align, tuple(names))
