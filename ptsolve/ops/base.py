"""Operators: a named shape, its candidate tilings, and the sTask-graph of one tiling."""
from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import SchemaError, ShapeError
from ..hw import Hardware, Target
from ..hw import load as load_hw
from ..ir import SCHEMA_VERSION, Buffer, STask, STaskGraph, check_schema, loads

# rows of one wgmma instruction and its K step (fp16/bf16): warpgroup tiles come in these units
WG_ROWS = 64
MMA_K = 16
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def positive(**dims: int) -> None:
    """Raise ShapeError naming the first dimension that is not a positive integer."""
    for k, v in dims.items():
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ShapeError(f"{k} must be a positive integer, got {v!r}")


def check_keys(op: str, p: dict[str, Any], required: tuple[str, ...], defaults: dict[str, Any]) -> dict[str, Any]:
    """Fill ``defaults``; raise ShapeError naming missing and unknown parameters."""
    p = {**defaults, **p}
    missing = [k for k in required if k not in p]
    unknown = sorted(set(p) - set(required) - set(defaults))
    if missing or unknown:
        what = ([f"missing {', '.join(missing)}"] if missing else []) + ([f"unknown {', '.join(unknown)}"] if unknown
                                                                          else [])
        raise ShapeError(f"{op}: {'; '.join(what)} (parameters: {', '.join(required)}"
                         + (f"; optional: {', '.join(defaults)}" if defaults else "") + ")")
    return p


def dtype_ok(dtype: str) -> None:
    if dtype not in ("fp16", "bf16"):
        raise ShapeError(f"dtype {dtype!r} is not supported; use 'fp16' or 'bf16'")


DEFAULT_HW = "h100"  # the table a graph is built for when the caller names none (optimize's default)


def sms_of(hw: Hardware | None) -> int:
    """SMs of the hardware a graph is built for (``DEFAULT_HW``'s when none is named): how many CTAs run at once,
    which bounds how often a tile is reread from L2 while it is resident."""
    return hw.sms if hw is not None else _default_sms()


@functools.cache
def _default_sms() -> int:
    from ..hw import load
    return load(DEFAULT_HW).sms


def ctas_of(tiling: dict[str, int]) -> int:
    """CTAs of the kernel resident on one SM at once (tiling key ``ctas``, default 1)."""
    return int(tiling.get("ctas", 1))


def pingpong_of(tiling: dict[str, int]) -> bool:
    """Whether two consumer warpgroups alternate tiles (tiling key ``pingpong``, default 0; GEMM): each runs its own
    tile with the graph's tasks, their main loops take the tensor cores in turn, and one's epilogue overlaps the
    other's main loop (CUTLASS's Hopper ping-pong kernel schedule)."""
    return bool(tiling.get("pingpong", 0))


def cluster_of(tiling: dict[str, int]) -> int:
    """CTAs of a thread-block cluster (tiling key ``cluster``, default 1; GEMM): the pair of M-neighbour tiles that
    share their B tile, each loading half of it by TMA multicast into both."""
    return int(tiling.get("cluster", 1))


def slots_of(tiling: dict[str, int]) -> int:
    """Work units an SM runs at once, each one after another in its own slot (ptsolve.placement): the co-resident
    CTAs (``ctas``), times the two warpgroups of a ping-pong kernel, which run their tiles as two slots sharing
    the SM's tensor cores, copy engine and MUFU (the shared-unit floor of ptsolve.placement.shared_floor)."""
    return ctas_of(tiling) * (2 if pingpong_of(tiling) else 1)


def kernel_groups(groups: int, tiling: dict[str, int]) -> int:
    """Consumer warpgroups of the kernel: the graph's ``groups`` (the warpgroups of one work unit), twice over for
    a ping-pong kernel (its registers and threads are those of both)."""
    return groups * (2 if pingpong_of(tiling) else 1)


def consumer_reg_budget(groups: int, hw: Hardware, ctas: int = 1) -> int:
    """Registers per consumer thread (ptsolve.hw.Target.consumer_regs): what the model budgets and the code
    generators grant."""
    return Target(hw).consumer_regs(groups, ctas)


def smem_budget(hw: Hardware, ctas: int = 1) -> int:
    """Dynamic shared memory of one CTA, bytes, when ``ctas`` CTAs share an SM (ptsolve.hw.Target.smem_budget)."""
    return Target(hw).smem_budget(ctas)


@dataclass(frozen=True)
class OpSpec:
    """How one operator kind validates its parameters, enumerates tilings and builds graphs."""

    validate: Callable[[dict[str, Any]], dict[str, Any]]
    tilings: Callable[[dict[str, Any]], Iterator[dict[str, int]]]
    build: Callable[[dict[str, Any], dict[str, int], Hardware | None], STaskGraph]  # hw: the table it builds for
    out_tile: Callable[[dict[str, int]], tuple[int, ...]]
    from_out_tile: Callable[[dict[str, Any], tuple[int, ...]], dict[str, int]]
    optional: dict[str, int] = field(default_factory=dict)  # tiling keys a caller may leave out, with defaults
    # hand-known issue orders of the loop, by name: groups -> {role: [(loop task, stage)] in issue order, and "tc":
    # the tensor cores' cyclic turn order} (policy cpsat-orders pins them; codegen's hand plans are built from them)
    orders: Callable[[int], dict[str, dict[str, list[tuple[str, int]]]]] | None = None
    # optional keys whose other values the search offers only when ``fix`` or tune's ``per`` names the key: structures
    # the code generator builds and the model describes, but measured not to pay where the model ranks them level
    # (GEMM's ``cluster``, results/gemm_skinny), so they are opt-in rather than picked on ties
    opt_in: tuple[str, ...] = ()
    # CTAs the kernel launches after the grid's CTAs that wait for them (split-KV's merge CTAs): (params, tiling, hw)
    # -> how many (ptsolve.program.follow_tail prices them)
    follow: Callable[[dict[str, Any], dict[str, int], Hardware | None], int] | None = None


REGISTRY: dict[str, OpSpec] = {}


@dataclass(frozen=True)
class Operator:
    """An operator instance: kind (``gemm``, ``flash_attention``, ...) and validated parameters."""

    op: str
    params: dict[str, Any] = field(hash=False)

    @property
    def spec(self) -> OpSpec:
        return REGISTRY[self.op]

    def tilings(self) -> list[dict[str, int]]:
        """Every candidate tiling (block sizes, ring depth, consumer warpgroups), sorted."""
        return sorted(self.spec.tilings(self.params), key=lambda t: sorted(t.items()))

    def graph(self, tiling: dict[str, int], hw: Hardware | str | None = None) -> STaskGraph:
        """The sTask-graph of one CTA under ``tiling`` (optional keys such as ``ctas`` take their defaults) for the
        hardware ``hw`` (a table or its name; None: the builder's default, the h100 table, ``optimize``'s)."""
        tiling = {**self.spec.optional, **tiling}
        missing = set(self.tilings()[0]) - set(tiling)
        if missing:
            raise ShapeError(f"{self.op}: tiling {tiling} lacks {sorted(missing)}")
        return self.spec.build(self.params, dict(tiling), None if hw is None else load_hw(hw))

    def propagate(self, out_tile: tuple[int, ...], **rest: int) -> dict[str, tuple[int, ...]]:
        """Tile shape of every sTask, inferred from the output tile (paper Fig. 8).
        ``rest`` fills the tiling parameters the output tile does not fix (ring depth, groups, K block)."""
        t = self.spec.from_out_tile(self.params, tuple(out_tile))
        # the first tiling with every optional key at its default (GEMM: cooperative, no split-K)
        opt = self.spec.optional
        base = next((x for x in self.tilings() if all(x.get(k, v) == v for k, v in opt.items())), self.tilings()[0])
        g = self.graph({**base, **t, **rest})
        return {x.name: x.tile for x in g.tasks}

    @property
    def useful_flops(self) -> int:
        return self.graph(self.tilings()[0]).useful_flops

    def describe(self) -> str:
        return self.op + "(" + ", ".join(f"{k}={v}" for k, v in sorted(self.params.items())) + ")"

    def to_json(self) -> str:
        return json.dumps({"schema": SCHEMA_VERSION, "op": self.op, "params": self.params}, sort_keys=True)

    @classmethod
    def from_json(cls, s: str) -> Operator:
        d = loads(s, "Operator")
        check_schema(d, "Operator")
        if d.get("op") not in REGISTRY:
            raise SchemaError(f"Operator: unknown op {d.get('op')!r}; known: {sorted(REGISTRY)}")
        return make(d["op"], **d["params"])


def make(op: str, **params: Any) -> Operator:
    if op not in REGISTRY:
        raise ShapeError(f"unknown operator {op!r}; known: {sorted(REGISTRY)}")
    return Operator(op, REGISTRY[op].validate(dict(params)))


def smem(name: str, nbytes: int) -> Buffer:
    return Buffer(name, "smem", int(nbytes))


def reg(name: str, nbytes: int) -> Buffer:
    return Buffer(name, "reg", int(nbytes))


def task(name: str, kind: str, **kw: Any) -> STask:
    return STask(name=name, kind=kind, **kw)
