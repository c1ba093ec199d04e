"""KernelIR: everything about a kernel's pipeline that follows from the schedule, as plain data.

``codegen.lower`` builds it from an SProgram (or a hand-written KernelPlan); ``codegen.cuda.skeleton`` (and
the HIP emitter) turn it into source with an operator's task bodies; ``codegen.sync_sim`` simulates its
synchronisation on the CPU. Nothing here is operator-specific: the roles, their (task, stage) orders, the
rings with their fill and release points, the wgmma waits, the tensor-core turns, the copies and the
shared-memory layout all come from the graph and the schedule (``ptsolve.protocol``).

Task names are the graph's (``mma_qk@1``); a role's orders list them with stages as ``codegen.plan`` does:
iteration j of a role's emitted loop runs task t at stage s for reduction iteration j - s.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from ptsolve.errors import SchemaError

SCHEMA = 1
Order = tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class Role:
    """One instruction stream: ``producer`` (one elected thread issues the loads) or a consumer warpgroup
    ``wg<g>``. ``regs``: setmaxnreg level (0: none). Orders per phase as (task, stage)."""

    name: str
    group: int
    regs: int
    pre: Order
    loop: Order
    post: Order


@dataclass(frozen=True)
class TaskInfo:
    """What a kernel needs to know of one sTask: ``kind`` (load / mma / vector / store), ``is_async`` (a TMA or
    a wgmma: completes after it is issued), ``smem``: shared-memory buffers it reads, writes or frees (its body
    gets a pointer to the right slot of each), ``regs``: register buffers it allocates, ``after``: tasks of its
    stream whose results it reads."""

    name: str
    kind: str
    phase: str
    role: str
    is_async: bool
    smem: tuple[str, ...]
    regs: tuple[str, ...]
    after: tuple[str, ...]


@dataclass(frozen=True)
class Release:
    """Role ``role`` frees the slot of iteration ``it`` of a ring in ``task`` of iteration ``it + dist``:
    ``end`` after the task, ``wait`` right after the task's wgmma wait, ``commit`` after the task's own
    post-issue wait (ptsolve.protocol). ``generic``: the role read the slot with ordinary loads, so the async
    proxy (the next TMA write) must be fenced first."""

    role: str
    task: str
    dist: int
    mode: str
    generic: bool


@dataclass(frozen=True)
class Ring:
    """Buffers filled together by the producer, ``depth`` slots, a full and an empty mbarrier per slot.
    ``fills``: (load task, bytes it delivers: one expect_tx arrival each). ``waiters``: (role, task) whose
    instance is the first of that role to read the slot (it waits on the full barrier). ``arrivals``: empty
    barrier count per phase (lane 0 of each warp of each releasing warpgroup). Pre-phase rings have depth 1;
    their slot is released at the end of the tile (persistent kernels only)."""

    name: str
    phase: str
    buffers: tuple[str, ...]
    depth: int
    fills: tuple[tuple[str, int], ...]
    waiters: tuple[tuple[str, str], ...]
    releases: tuple[Release, ...]
    arrivals: int


@dataclass(frozen=True)
class Smem:
    """One buffer in shared memory: byte offset of slot / copy 0 from the aligned base, bytes between slots,
    slots (ring depth or copies), the role that owns it ('' for shared buffers)."""

    name: str
    offset: int
    bytes: int
    stride: int
    slots: int
    role: str = ""


@dataclass(frozen=True)
class KernelIR:
    """A kernel's pipeline. ``waits[task]`` = [(async task, offset)] it must see complete (``waits`` of
    ptsolve.protocol); ``commits``: the tasks that commit a wgmma group; ``tc_order``: the order in which the
    tensor cores serve the consumers' mma tasks within one emitted iteration, enforced by named-barrier turns
    when ``turns`` (else ``turns_note`` says why not); ``copies``: register / consumer buffer -> copies the
    kernel keeps; ``barriers``: offset of the mbarrier area; ``smem_bytes``: dynamic shared memory to request.
    ``persistent``: one CTA per SM loops over tiles; ``ctas``: resident CTAs per SM (launch bounds)."""

    op: str
    params: dict[str, Any]
    tiling: dict[str, int]
    target: str
    roles: tuple[Role, ...]
    tasks: tuple[TaskInfo, ...]
    rings: tuple[Ring, ...]
    waits: dict[str, tuple[tuple[str, int], ...]]
    commits: tuple[str, ...]
    tc_order: tuple[str, ...]
    turns: bool
    turns_note: str
    copies: dict[str, int]
    smem: tuple[Smem, ...]
    barriers: int
    smem_bytes: int
    threads: int
    ctas: int
    persistent: bool
    sms: int
    predicted_ii: int = 0
    trips: int = 1  # the largest trip count of a tile (the profiler sizes its buffers by it)
    model_regs: int = 0  # registers per consumer thread the model counts (ptsolve.validate.regs_per_thread)
    profile: bool = False
    # shape-generic build: the sizes that do not change the schedule (batch, sequence lengths, heads; M, N, K) are
    # kernel arguments, not constants, so one binary serves every shape of its class (codegen.cuda.skeleton)
    generic: bool = False
    # ping-pong (GEMM tiling key ``pingpong``): the consumer warpgroups take a persistent CTA's tiles in turn (wg g
    # runs local tiles g, g + groups, ...), each with the roles' orders on its own tile; the tensor-core turns of
    # ``tc_order`` then pass once per tile (before a warpgroup's first mma of its tile, after its last one is
    # issued), and each ring slot is released by the one warpgroup whose tile it holds
    pingpong: bool = False
    # load tasks TMA-multicast to every CTA of the thread-block cluster (tiling key ``cluster``): their ring's slots
    # are freed only when every CTA's consumers released them (each arrives on all the cluster's empty barriers)
    multicast: tuple[str, ...] = ()
    schema: int = field(default=SCHEMA)

    @property
    def groups(self) -> int:
        return sum(1 for r in self.roles if r.group >= 0)

    def task(self, name: str) -> TaskInfo:
        return next(t for t in self.tasks if t.name == name)

    def role(self, name: str) -> Role:
        return next(r for r in self.roles if r.name == name)

    def buffer(self, name: str) -> Smem:
        return next(s for s in self.smem if s.name == name)

    def ring_of(self, buf: str) -> Ring | None:
        return next((r for r in self.rings if buf in r.buffers), None)

    def to_json(self) -> str:
        d = asdict(self)
        if not d["generic"]:
            del d["generic"]  # exact-shape IRs keep their JSON (and so their plan ids and cached cubins)
        if not d["pingpong"]:
            del d["pingpong"]  # so do cooperative ones
        if not d["multicast"]:
            del d["multicast"]  # and those without a cluster
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_json(cls, s: str) -> KernelIR:
        try:
            d = json.loads(s)
            if not isinstance(d, dict):
                raise SchemaError(f"KernelIR: expected a JSON object, got a {type(d).__name__}")
            if d.get("schema") != SCHEMA:
                raise SchemaError(f"KernelIR: schema {d.get('schema')!r}, this codegen reads {SCHEMA}")

            def order(x: Any) -> Order:
                return tuple((str(t), int(st)) for t, st in x)
            roles = tuple(Role(r["name"], int(r["group"]), int(r["regs"]), order(r["pre"]), order(r["loop"]),
                               order(r["post"])) for r in d["roles"])
            tasks = tuple(TaskInfo(t["name"], t["kind"], t["phase"], t["role"], bool(t["is_async"]),
                                   tuple(t["smem"]), tuple(t["regs"]), tuple(t["after"])) for t in d["tasks"])
            rings = tuple(Ring(r["name"], r["phase"], tuple(r["buffers"]), int(r["depth"]),
                               tuple((str(t), int(n)) for t, n in r["fills"]),
                               tuple((str(a), str(b)) for a, b in r["waiters"]),
                               tuple(Release(**x) for x in r["releases"]), int(r["arrivals"])) for r in d["rings"])
            return cls(op=d["op"], params=d["params"], tiling=d["tiling"], target=d["target"], roles=roles,
                       tasks=tasks, rings=rings,
                       waits={k: tuple((str(t), int(o)) for t, o in v) for k, v in d["waits"].items()},
                       commits=tuple(d["commits"]), tc_order=tuple(d["tc_order"]), turns=bool(d["turns"]),
                       turns_note=d["turns_note"], copies={k: int(v) for k, v in d["copies"].items()},
                       smem=tuple(Smem(**x) for x in d["smem"]), barriers=int(d["barriers"]),
                       smem_bytes=int(d["smem_bytes"]), threads=int(d["threads"]), ctas=int(d["ctas"]),
                       persistent=bool(d["persistent"]), sms=int(d["sms"]), predicted_ii=int(d["predicted_ii"]),
                       trips=int(d["trips"]), model_regs=int(d["model_regs"]), profile=bool(d["profile"]),
                       generic=bool(d.get("generic", False)), pingpong=bool(d.get("pingpong", False)),
                       multicast=tuple(str(t) for t in d.get("multicast", ())))
        except (KeyError, TypeError, ValueError, AttributeError, json.JSONDecodeError) as e:
            if isinstance(e, SchemaError):
                raise
            raise SchemaError(f"KernelIR JSON is malformed: {e!r}; write it with KernelIR.to_json()") from e
