"""The operator vocabulary's registry: what an operator is to every layer above the builders.

``OpSpec`` is the protocol an operator file under ``ptsolve/ops/`` fills in (its parameters, its tilings, its graph
builder and the per-operator facts the lowering reads: default persistence, the textbook issue order, declared issue
orders, follow-up CTAs); ``register`` adds it to ``REGISTRY`` with one line. ``Operator`` is an instance: a kind and
validated parameters. The IR, the cost model, the checks, the solvers and the code generators reach operators only
through here, so they never import ``ptsolve.ops``; importing ``ptsolve`` registers the built-in operators.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .errors import SchemaError, ShapeError
from .hw import Hardware
from .hw import load as load_hw
from .ir import SCHEMA_VERSION, STaskGraph, check_schema, loads

# phase -> role -> [(task, stage)] in issue order (codegen.plan.KernelPlan.order)
Order = dict[str, dict[str, list[tuple[str, int]]]]


@dataclass(frozen=True)
class TextbookPlan:
    """An operator's textbook issue order for one tiling (codegen.plan.default_plan): per phase and role the tasks in
    issue order with their stages, the tensor cores' turn order and the copies of register buffers it keeps."""

    order: Order
    tc_order: list[str]
    copies: dict[str, int] = field(default_factory=dict)


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
    # (GEMM's ``cluster``, bench study gemm_skinny), so they are opt-in rather than picked on ties
    opt_in: tuple[str, ...] = ()
    # CTAs the kernel launches after the grid's CTAs that wait for them (split-KV's merge CTAs): (params, tiling, hw)
    # -> how many (ptsolve.program.follow_tail prices them)
    follow: Callable[[dict[str, Any], dict[str, int], Hardware | None], int] | None = None
    # names the ``ptsolve`` command accepts for this operator besides its own (``fa`` for flash_attention)
    aliases: tuple[str, ...] = ()
    # the code generator's ``persistent`` key where a tiling names none and does not split: 1 runs persistent CTAs
    # that deal themselves the tiles (GEMM), 0 launches a grid
    persistent: int = 0
    # (params, tiling, overlap) -> the textbook issue order (codegen.plan.default_plan); None: no hand plan
    plan: Callable[[dict[str, Any], dict[str, int], bool], TextbookPlan] | None = None
    # a function whose signature and docstring state the operator's parameters (what ``ptsolve ops`` lists) and which
    # returns its Operator; None: the function of the operator's name in ``ptsolve.ops``. An operator file that
    # carries its own needs no line in ``ptsolve/ops/__init__.py``
    builder: Callable[..., Operator] | None = None


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
        hardware ``hw`` (a table or its name; None: ``ptsolve.hw.DEFAULT_HW``'s, ``optimize``'s default)."""
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


def register(name: str, spec: OpSpec) -> OpSpec:
    """Add operator ``name`` to the registry (one line at the end of its file under ``ptsolve/ops/``)."""
    REGISTRY[name] = spec
    return spec


def spec_of(op: str) -> OpSpec:
    """The registered spec of operator ``op``; ShapeError naming the known ones otherwise."""
    if op not in REGISTRY:
        raise ShapeError(f"unknown operator {op!r}; known: {sorted(REGISTRY)}")
    return REGISTRY[op]


def aliases() -> dict[str, str]:
    """Every name an operator goes by (its own and its spec's aliases) -> its registered name."""
    return {a: name for name, sp in sorted(REGISTRY.items()) for a in (name, *sp.aliases)}
