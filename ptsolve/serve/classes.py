"""Shape classes: what a schedule and a binary are chosen by, and the table of operators that have them.

Each operator the serving layer covers registers one ``OpClasses`` (its table key, representative shape, pinned
tiling keys and the classes the shipped table holds) from its own module (``gemm``, ``attention``, ``decode``,
``mamba2``): a new operator adds its module and one ``register`` line, and no code here names it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ptsolve.errors import PtsolveError, ShapeError

HW = "h200"  # the table's hardware (sm_90a; an H100 runs the same binaries)
DTYPES = ("fp16", "bf16")


@dataclass(frozen=True)
class ShapeClass:
    """What a schedule and a binary are chosen by. ``head_dim``: attention's and Mamba2's;
    ``causal``, ``gqa``, ``softcap``, ``window`` only attention's; ``d_state``, ``chunk`` only Mamba2's;
    ``epilogue`` ChunkScan's (a fused D skip / z gate, ``ptsolve.geometry.mamba2.EPILOGUES``) and GEMM's ("regs": C
    stored from registers, for N not a multiple of 8); ``cb_dtype`` only ChunkScan's ("fp32": CB read as float32, ''
    in the input dtype)."""

    op: str
    dtype: str
    head_dim: int = 0
    causal: bool = False
    gqa: str = ""
    d_state: int = 0
    chunk: int = 0
    groups: int = 0
    ctas: int = 0  # split-KV decode's resident CTAs per SM where not the default one (``decode_variants``)
    persistent: int = 0  # split-KV decode on persistent CTAs, one piece per query tile (``decode_variants``)
    softcap: bool = False  # attention's capped scores (the cap's value is a launch argument)
    window: bool = False  # attention's sliding window (its sizes are launch arguments)
    epilogue: str = ""  # ChunkScan's fused D skip and z gate (a variant: ``OpClasses.derived``); GEMM's "regs"
    cb_dtype: str = ""  # Mamba2 ChunkScan's CB operand: "fp32", or '' for the input dtype (a schedule of its own)

    def __hash__(self) -> int:
        """Hashed once (a launcher's cache key hashes the class on every call)."""
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.op, self.dtype, self.head_dim, self.causal, self.gqa, self.d_state, self.chunk,
                      self.groups, self.ctas, self.persistent, self.softcap, self.window, self.epilogue,
                      self.cb_dtype))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the cached hash (string hashes differ between processes)."""
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    @property
    def key(self) -> str:
        """The table's key, e.g. ``flash_attention/bf16/d128/causal/gqa2-4``, ``gemm/fp16`` or
        ``mamba2_chunk_scan/fp16/p64/n128/q256`` (the operator's ``OpClasses.key``)."""
        return op_classes(self.op).key(self)


def state_class(op: str, dtype: str, head_dim: int, d_state: int, head_dims: tuple[int, ...],
                d_states: tuple[int, ...], kernels: str) -> ShapeClass:
    """A class of an operator over Mamba2 states (head_dim × d_state), for the sizes its table covers; ShapeError
    naming the size and what ``kernels`` cover otherwise."""
    dtype_ok(dtype)
    for name, v, ok in (("head_dim", head_dim, head_dims), ("d_state", d_state, d_states)):
        if v not in ok:
            raise ShapeError(f"{op}: {name}={v}; {kernels} cover {name} in {ok}")
    return ShapeClass(op, dtype, int(head_dim), d_state=int(d_state))


def _no_fix(c: ShapeClass) -> dict[str, int] | None:
    return None


@dataclass(frozen=True)
class OpClasses:
    """One operator's shape classes. ``key``: the class's table key; ``representative``: the shape its schedule is
    solved on (long enough that the loop's steady state dominates: the modulo schedule's initiation interval and
    stages do not depend on the trip count); ``classes``: every class of the operator the shipped table holds;
    ``fix``: the tiling keys the class's solve pins (``optimize``'s ``fix``); ``keeps_program``: the table entry
    keeps the solved SProgram (re-timed per shape at launch, as split-KV decode's pieces are); ``derived``: for a
    variant class with no table entry of its own, the class whose schedule it runs and the parameters it adds to that
    schedule (ChunkScan's fused epilogue: after the loop, it leaves the schedule as it is), None for a table class;
    ``variants``: every variant class (``precompile`` compiles them, the table holds none)."""

    key: Callable[[ShapeClass], str]
    representative: Callable[[ShapeClass], dict[str, Any]]
    classes: Callable[[], list[ShapeClass]]
    fix: Callable[[ShapeClass], dict[str, int] | None] = _no_fix
    keeps_program: bool = False
    derived: Callable[[ShapeClass], tuple[ShapeClass, dict[str, Any]] | None] = lambda c: None
    variants: Callable[[], list[ShapeClass]] = list


OPS: dict[str, OpClasses] = {}


def register(op: str, spec: OpClasses) -> None:
    """Add operator ``op``'s shape classes to the serving layer (one line in the operator's module)."""
    OPS[op] = spec


def op_classes(op: str) -> OpClasses:
    """Operator ``op``'s ``OpClasses``; PtsolveError for an operator the serving layer has no kernels for."""
    spec = OPS.get(op)
    if spec is None:
        raise PtsolveError(f"the serving layer has no shape classes for operator {op!r}; it serves {sorted(OPS)}")
    return spec


def dtype_ok(dtype: str) -> None:
    """ShapeError for a dtype the kernels do not take."""
    if dtype not in DTYPES:
        raise ShapeError(f"dtype {dtype!r}: ptsolve's kernels take {' or '.join(DTYPES)}; convert the tensors")


def classes() -> list[ShapeClass]:
    """Every class the table covers, operator by operator in registration order."""
    return [c for spec in OPS.values() for c in spec.classes()]


def variants() -> list[ShapeClass]:
    """Every variant class (``OpClasses.variants``: no table entry, a table class's schedule), operator by operator."""
    return [c for spec in OPS.values() for c in spec.variants()]


def representative(c: ShapeClass) -> dict[str, Any]:
    """The shape a class's schedule is solved on (its operator's ``OpClasses.representative``)."""
    return op_classes(c.op).representative(c)


def class_fix(c: ShapeClass) -> dict[str, int] | None:
    """The tiling keys a class's solve pins (its operator's ``OpClasses.fix``; None: none)."""
    return op_classes(c.op).fix(c)
