"""The sTask-graph IR: sTasks, buffers, loop-carried edges, and their JSON form.

A graph describes the work of one CTA (one output tile). Tasks are in one of three phases:
``pre`` (once before the reduction loop), ``loop`` (once per iteration, ``trip_count`` times) and
``post`` (once after it). Edges carry an iteration distance: 0 within an iteration, 1 for a
loop-carried dependence (running max, O accumulator). Tasks that belong to one consumer warpgroup
carry its index in ``group``; tasks shared by the CTA (TMA loads) have ``group = -1``.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from . import arguments
from .errors import GraphError, PtsolveError, SchemaError
from .tiling import Tiling

SCHEMA_VERSION = 1
KINDS = ("load", "store", "mma", "vector", "barrier")
PHASES = ("pre", "loop", "post")
SPACES = ("smem", "reg")
DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4, "fp8": 1}


@dataclass(frozen=True)
class Buffer:
    """An on-chip buffer. ``bytes`` is per CTA for ``smem`` and per warpgroup (128 threads) for ``reg``."""

    name: str
    space: str
    bytes: int

    @property
    def regs_per_thread(self) -> int:
        """32-bit registers each of the 128 threads of a warpgroup holds for this buffer."""
        return -(-self.bytes // (4 * 128)) if self.space == "reg" else 0


@dataclass(frozen=True)
class STask:
    """One tile-level operation.

    flops: floating-point operations (mma: 2·M·N·K; vector: element operations on the CUDA cores).
    bytes: bytes moved between global memory and the SM (load/store).
    sfu: special-function operations (exp2) on the MUFU units.
    reuse: how many CTAs read the same global tile (L2 reuse; 1 = no reuse).
    multicast: CTAs of a cluster that receive this load's tile from one L2 read (TMA multicast; 1 = none): each
    issues 1/multicast of the tile and receives all of it, so ``bytes`` stays what lands in its shared memory.
    misaligned: the load's rows start off the L2's 32-byte sectors (its global row pitch is not a multiple of 32
    bytes: GEMM with K = 8 mod 16), which the L2 delivers at ``Hardware.misaligned_l2_factor`` of its rate.
    staged: a store that goes through shared memory and the copy engine (a TMA store), not from registers.
    group: consumer warpgroup that issues the task, or -1 for the producer / shared work.
    allocs / reads / frees: buffer names; a buffer is allocated by exactly one task.
    """

    name: str
    kind: str
    phase: str = "loop"
    tile: tuple[int, ...] = ()
    dtype: str = "fp16"
    flops: int = 0
    bytes: int = 0
    sfu: int = 0
    reuse: float = 1.0
    is_async: bool = False
    group: int = -1
    allocs: tuple[Buffer, ...] = ()
    reads: tuple[str, ...] = ()
    frees: tuple[str, ...] = ()
    multicast: int = 1
    misaligned: bool = False
    staged: bool = False

    @property
    def units(self) -> tuple[str, ...]:
        """sEU kinds that can execute this task (the issuing stream is always used too)."""
        return {"load": ("tma",), "store": ("tma",), "mma": ("tc",), "barrier": ()}.get(
            self.kind, ("sfu", "cuda") if self.sfu else ("cuda",))


# STask fields the JSON leaves out at their defaults (they came after graphs were first written)
OPTIONAL_TASK_FIELDS: dict[str, Any] = {"multicast": 1, "misaligned": False, "staged": False}


@dataclass(frozen=True)
class Edge:
    """``dst`` of iteration i+dist needs ``src`` of iteration i."""

    src: str
    dst: str
    dist: int = 0


@dataclass(frozen=True)
class STaskGraph:
    """The sTask-graph of one CTA plus what the kernel needs around it.

    row: trip counts of the CTAs of one row of the grid, in launch order (causal attention and Mamba2
    chunks have unequal tiles); the grid is ``rows`` such rows. useful_flops: FLOPs the operator needs
    (causal: the kept pairs only), for TFLOP/s.
    tiling: the tile parameters this graph was built with (block sizes, ring depth, warpgroups).
    """

    name: str
    op: str
    params: dict[str, Any]
    tiling: Tiling  # a plain mapping given here becomes a Tiling
    tasks: tuple[STask, ...]
    edges: tuple[Edge, ...]
    row: tuple[int, ...]
    rows: int
    useful_flops: int
    schema: int = field(default=SCHEMA_VERSION)

    def __post_init__(self) -> None:
        if isinstance(self.tiling, dict) and not isinstance(self.tiling, Tiling):
            object.__setattr__(self, "tiling", Tiling(self.tiling))  # frozen: set once, before anything reads it
        self.verify()

    # -- queries -----------------------------------------------------------------------------
    @property
    def task(self) -> dict[str, STask]:
        return {t.name: t for t in self.tasks}

    @property
    def trip_count(self) -> int:
        """The largest trip count of any CTA."""
        return max(self.row)

    @property
    def n_ctas(self) -> int:
        return len(self.row) * self.rows

    @property
    def work(self) -> dict[int, int]:
        """{trip_count: number of CTAs}."""
        h: dict[int, int] = {}
        for n in self.row:
            h[n] = h.get(n, 0) + self.rows
        return dict(sorted(h.items()))

    @property
    def groups(self) -> int:
        """Number of consumer warpgroups (at least one: a graph with only producer tasks still has one)."""
        return max(1, 1 + max((t.group for t in self.tasks), default=0))

    def phase(self, p: str) -> list[STask]:
        return [t for t in self.tasks if t.phase == p]

    def buffers(self) -> dict[str, Buffer]:
        return {b.name: b for t in self.tasks for b in t.allocs}

    def preds(self, name: str) -> list[Edge]:
        return [e for e in self.edges if e.dst == name]

    def succs(self, name: str) -> list[Edge]:
        return [e for e in self.edges if e.src == name]

    # -- checks ------------------------------------------------------------------------------
    def verify(self) -> None:
        """Raise GraphError if the graph is malformed."""
        names = [t.name for t in self.tasks]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise GraphError(f"graph {self.name!r}: duplicate task names {dup}; every sTask needs a unique name")
        known = set(names)
        for t in self.tasks:
            _check_task(t)
            if t.kind not in KINDS:
                raise GraphError(f"task {t.name!r}: kind {t.kind!r} is not one of {KINDS}")
            if t.phase not in PHASES:
                raise GraphError(f"task {t.name!r}: phase {t.phase!r} is not one of {PHASES}")
            for b in t.allocs:
                if b.space not in SPACES or not _count(b.bytes) or b.bytes <= 0:
                    raise GraphError(f"task {t.name!r}: buffer {b.name!r} needs space in {SPACES} and bytes > 0")
        allocated = [b.name for t in self.tasks for b in t.allocs]
        if len(set(allocated)) != len(allocated):
            raise GraphError(f"graph {self.name!r}: a buffer is allocated by two tasks: {sorted(allocated)}")
        for t in self.tasks:
            for b in (*t.reads, *t.frees):
                if b not in allocated:
                    raise GraphError(f"task {t.name!r} uses buffer {b!r} that no task allocates")
        ph = {t.name: PHASES.index(t.phase) for t in self.tasks}
        for e in self.edges:
            if e.src not in known or e.dst not in known:
                raise GraphError(f"edge {e.src}->{e.dst}: unknown task (known: {sorted(known)})")
            if not _count(e.dist) or e.dist < 0:
                raise GraphError(f"edge {e.src}->{e.dst}: negative iteration distance {e.dist}")
            if e.dist and not (ph[e.src] == ph[e.dst] == 1):
                raise GraphError(f"edge {e.src}->{e.dst}: only loop tasks may have loop-carried edges")
            if ph[e.src] > ph[e.dst]:
                raise GraphError(f"edge {e.src}->{e.dst}: goes backwards from phase "
                                 f"{PHASES[ph[e.src]]} to {PHASES[ph[e.dst]]}")
        if (not self.row or not all(_count(n) and n >= 1 for n in self.row) or not _count(self.rows)
                or self.rows < 1):
            raise GraphError(f"graph {self.name!r}: needs at least one CTA, each with trip count >= 1 "
                             f"(row={self.row!r}, rows={self.rows!r})")
        if not self.phase("loop"):
            raise GraphError(f"graph {self.name!r}: has no loop task; a kernel's reduction loop needs at least one "
                             "task with phase 'loop'")
        if not _count(self.useful_flops) or self.useful_flops < 0:
            raise GraphError(f"graph {self.name!r}: useful_flops={self.useful_flops!r} must be an integer >= 0")
        bad = {k: v for k, v in self.tiling.items() if not _count(v) or v < 1}
        if bad:
            raise GraphError(f"graph {self.name!r}: tiling values {bad} must be integers >= 1")
        arguments.size(f"graph {self.name!r}", len(self.row) * self.rows, "len(row)·rows",
                    len(self.tasks) * sum(set(self.row)), "the trip counts in row")
        self.topo_order()

    def topo_order(self) -> list[str]:
        """Tasks ordered by the zero-distance edges; raises GraphError on a zero-distance cycle."""
        indeg = {t.name: 0 for t in self.tasks}
        out: dict[str, list[str]] = {t.name: [] for t in self.tasks}
        for e in self.edges:
            if e.dist == 0:
                indeg[e.dst] += 1
                out[e.src].append(e.dst)
        ready = sorted(n for n, d in indeg.items() if d == 0)
        order: list[str] = []
        while ready:
            n = ready.pop(0)
            order.append(n)
            for m in out[n]:
                indeg[m] -= 1
                if indeg[m] == 0:
                    ready.append(m)
            ready.sort()
        if len(order) != len(indeg):
            cyc = sorted(n for n in indeg if n not in order)
            raise GraphError(f"graph {self.name!r}: zero-distance cycle among {cyc}; a cycle needs at least one "
                             "loop-carried edge (dist >= 1)")
        return order

    # -- JSON --------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for t in d["tasks"]:  # the graphs written before these fields existed read back, and hash, the same
            for k, default in OPTIONAL_TASK_FIELDS.items():
                if t[k] == default:
                    del t[k]
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> STaskGraph:
        check_schema(d, "STaskGraph")
        try:
            seq = {"tile": tuple, "reads": tuple, "frees": tuple,
                   "allocs": lambda bs: tuple(_build(Buffer, b) for b in bs)}
            tasks = tuple(_build(STask, OPTIONAL_TASK_FIELDS | {k: seq[k](v) if k in seq else v for k, v in t.items()})
                          for t in d["tasks"])  # to_dict leaves these out at their defaults
            edges = tuple(_build(Edge, e) for e in d["edges"])
            return cls(name=d["name"], op=d["op"], params=dict(d["params"]), tiling=dict(d["tiling"]),
                       tasks=tasks, edges=edges, row=tuple(int(n) for n in d["row"]), rows=int(d["rows"]),
                       useful_flops=int(d["useful_flops"]))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            if isinstance(e, PtsolveError):
                raise
            raise SchemaError(f"STaskGraph JSON is malformed: {e!r}; write it with STaskGraph.to_json()") from e

    @classmethod
    def from_json(cls, s: str) -> STaskGraph:
        return cls.from_dict(loads(s, "STaskGraph"))


def loads(s: str, what: str) -> dict[str, Any]:
    """Parse JSON text into a dict, or raise SchemaError naming ``what``."""
    try:
        d = json.loads(s)
    except json.JSONDecodeError as e:
        raise SchemaError(f"{what}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from e
    if not isinstance(d, dict):
        raise SchemaError(f"{what}: expected a JSON object, got {type(d).__name__}")
    return d


def check_schema(d: dict[str, Any], what: str) -> None:
    v = d.get("schema")
    if v != SCHEMA_VERSION:
        raise SchemaError(f"{what}: schema version {v!r}, this ptsolve reads version {SCHEMA_VERSION}; "
                          "re-create the file with this version of ptsolve")


def _build(cls: type, d: dict[str, Any]) -> Any:
    """``cls`` from a JSON object that names every field (a missing number must not silently become 0)."""
    if not isinstance(d, dict):
        raise SchemaError(f"{cls.__name__}: expected a JSON object, got {d!r}")
    names = {f.name for f in fields(cls)}
    extra, missing = set(d) - names, names - set(d)
    if extra or missing:
        raise SchemaError(f"{cls.__name__} {d.get('name', '')!r}: unknown fields {sorted(extra)}, missing fields "
                          f"{sorted(missing)}; write it with STaskGraph.to_json()")
    return cls(**d)


def _count(v: Any) -> bool:
    """Is ``v`` an integer (not a bool)?"""
    return isinstance(v, int) and not isinstance(v, bool)


def _check_task(t: STask) -> None:
    """Types, signs and ranges of one task's fields: a negative byte count or FLOP count would change predictions."""
    for k in ("flops", "bytes", "sfu"):
        v = getattr(t, k)
        if not _count(v) or v < 0:
            raise GraphError(f"task {t.name!r}: {k}={v!r} must be an integer >= 0")
    if isinstance(t.reuse, bool) or not isinstance(t.reuse, (int, float)) or not math.isfinite(t.reuse) or t.reuse < 1:
        raise GraphError(f"task {t.name!r}: reuse={t.reuse!r} must be a number >= 1 (CTAs reading the same tile)")
    if not _count(t.multicast) or t.multicast < 1 or (t.multicast > 1 and t.kind != "load"):
        raise GraphError(f"task {t.name!r}: multicast={t.multicast!r} must be an integer >= 1, and > 1 only for a "
                         "load (a TMA multicast to the CTAs of a cluster)")
    if not isinstance(t.misaligned, bool) or (t.misaligned and t.kind != "load"):
        raise GraphError(f"task {t.name!r}: misaligned={t.misaligned!r} must be true or false, and true only for a "
                         "load (rows off the L2's 32-byte sectors)")
    if not isinstance(t.staged, bool) or (t.staged and t.kind != "store"):
        raise GraphError(f"task {t.name!r}: staged={t.staged!r} must be true or false, and true only for a store (a "
                         "TMA store from shared memory)")
    if not all(_count(x) and x > 0 for x in t.tile):
        raise GraphError(f"task {t.name!r}: tile={t.tile!r} must be positive integers")
    if t.dtype not in DTYPE_BYTES:
        raise GraphError(f"task {t.name!r}: dtype {t.dtype!r} is not one of {sorted(DTYPE_BYTES)}")
    if not isinstance(t.is_async, bool):
        raise GraphError(f"task {t.name!r}: is_async={t.is_async!r} must be true or false")
    if not _count(t.group) or t.group < -1:
        raise GraphError(f"task {t.name!r}: group={t.group!r} must be -1 (producer) or a warpgroup index >= 0")
    if not isinstance(t.name, str) or not t.name:
        raise GraphError(f"task name {t.name!r} must be a non-empty string")
