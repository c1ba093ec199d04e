"""Hardware tables: data files (one per target, every number with its source) and their loader.

``load("h100")`` reads ``h100.json`` beside this file; ``load(path)`` reads a user's own table.
A file ``<name>.calibrated.json`` in ``PTSOLVE_CALIBRATION_DIR`` (or beside the table) overlays
measured values on the datasheet ones.
"""
from __future__ import annotations

import functools
import os
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ..errors import HardwareError
from ..fileio import read_json

HERE = Path(__file__).parent
# The table every entry point uses when the caller names none (optimize, the op builders, the lowering, the
# ``ptsolve`` command). Entry points that measure on a GPU say in their docstrings which table they default to.
DEFAULT_HW = "h100"


@dataclass(frozen=True)
class Hardware:
    """One EU (SM / CU) and the device around it. Rates are per EU per clock unless named otherwise."""

    name: str
    vendor: str
    arch: str
    sms: int                      # EUs on the device
    clock_ghz: float              # sustained clock under load, GHz
    tc_flops_per_clk: float       # dense fp16/bf16 tensor-core FLOP/clk/SM
    fp32_flops_per_clk: float     # fp32 FLOP/clk/SM on the CUDA cores (FMA = 2)
    sfu_per_clk: float            # exp2 (MUFU) results/clk/SM
    hbm_bytes_per_s: float        # device memory bandwidth, B/s
    l2_bytes: int                 # L2 capacity, bytes
    l2_bytes_per_clk: float       # L2 -> one SM bandwidth, B/clk/SM
    smem_per_sm: int              # shared memory per SM, bytes
    smem_per_block: int           # largest dynamic shared memory of one block, bytes
    regs_per_sm: int              # 32-bit registers per SM
    regs_per_thread: int          # most 32-bit registers one thread may hold
    max_threads: int              # threads per block
    has_tma: bool                 # bulk tensor copy engine (Hopper)
    has_wgmma: bool               # warpgroup-wide asynchronous MMA (Hopper)
    mem_latency: int              # global load latency, cycles
    tc_latency: int               # MMA pipeline latency beyond its throughput time, cycles
    tc_fixed: int                 # tensor-core cycles per mma task that no other work overlaps, cycles
    barrier_cycles: int           # cost of crossing an mbarrier / named barrier between roles, cycles
    issue_cycles: int             # cycles an async instruction (TMA, wgmma) holds the issuing stream
    tc_efficiency: float          # achieved / peak tensor-core rate of the best library GEMM (measured)
    vector_efficiency: float      # fraction of the SM's fp32 rate one warpgroup reaches on its own
    launch_us: float              # kernel launch + tail overhead, µs
    producer_regs: int            # registers per producer thread after setmaxnreg.dec (0: no reallocation)
    max_consumer_regs: int        # most registers per consumer thread the code generator grants
    smem_reserved_per_cta: int    # shared memory the driver reserves per resident block, bytes
    smem_tile_align: int          # alignment of a swizzled operand tile in shared memory, bytes
    reg_overhead: int             # registers per consumer thread beyond its buffers (addresses, counters, phases)
    sources: dict[str, str]
    # costs a table may leave out (0: not charged); ptsolve calibrate fits them from profiles
    tc_handoff: int = 0           # extra tensor-core cycles per mma task when two or more warpgroups take turns on it
    coresident: float = 0.0       # vector-work slowdown per extra co-resident CTA (issue slots, register-file ports)
    ring_handoff: int = 0         # cycles from a ring slot's release to its refill beyond the barrier's (the producer
    # waking on the empty barrier, its refill queued behind other SMs' traffic): the ring recurrences only, not the fill
    # cycles a vector task holds its stream beyond the throughput estimate (dependent chains, shuffles, the shared
    # SFU's contention), keyed "op/task/groups" (the task's name without its @warpgroup, the graph's consumer
    # warpgroups); ptsolve.calibrate.task_extra fits them from the profiler's timelines
    task_extra: dict[str, int] = field(default_factory=dict)
    # entries of this table fitted on one operator's kernels, op -> {entry: value} (bench study gemm_model): they
    # replace the table's entries for that operator's graphs (for_op); one set of constants did not describe both
    # GEMM's main loops and attention's
    op_constants: dict[str, dict[str, float]] = field(default_factory=dict)
    # 1: where the model ties ring depths, a loop that streams memory takes the deeper ring (policies.model.tie_key);
    # an operator's measured preference (bench study depth_tie), set in op_constants: deeper rings measured faster for
    # GEMM and ChunkState on the H200 and slower for split-KV decode at large batch, which the model does not separate
    deep_ring_ties: int = 0
    # registers per consumer thread the model's estimate (ptsolve.validate.regs_per_thread) may count above what ptxas
    # needs for an operator's kernels: the largest margin measured (bench study regfit, the smallest clean setmaxnreg
    # level against the estimate), rounded up to the 8-register allocation granule. A tiling past its budget by more
    # cannot compile clean, so the search leaves it out before any solve (ptsolve.validate.register_refusal); set per
    # operator in op_constants by `python -m bench regfit --write`. The default, an SM's whole register file, rules
    # nothing out: where it was not measured, the compiler decides
    reg_overcount: int = 65536
    # > 0: a search's winner whose loop streams memory gets the deepest ring up to this that fits, with its schedule
    # unchanged (policies.model.deepen): the model's deterministic latency is hidden by the space's depths, but more
    # bytes in flight measured faster past them (GEMM on the H200: bench study gemm_skinny); set in op_constants
    deep_ring_max: int = 0
    # the L2 -> SM rate of loads whose global rows start off the L2's 32-byte sectors (STask.misaligned), as a
    # fraction of l2_bytes_per_clk (1: no difference); a property of the memory system, measured per table
    misaligned_l2_factor: float = 1.0
    # cycles a kernel's follow-up CTAs (OpSpec.follow: split-KV's merge CTAs) add after its grid when a whole wave of
    # them cannot be resident beside it (grid + follow-ups > SM slots; proportionally less when fewer queue):
    # dispatched only as the grid's CTAs leave, they wait for a slot, start, find their pieces done and merge
    # (ptsolve.program.follow_tail); fitted per operator, in op_constants
    follow_cycles: int = 0
    # B/clk/SM at which a tile stored by ordinary stores from registers leaves an SM (the accumulator fragment's
    # 16-byte row pieces; the warpgroup issues them all that time), and at which a TMA-store epilogue does (stmatrix
    # into the staging, fences, the copy engine's stores, waiting for a slot it still reads): STask.staged says which.
    # 0: not charged (the store costs its issue and the copy path only); fitted per operator from the profiler
    # (ptsolve.calibrate.store_rates), in op_constants
    reg_store_bytes_per_clk: float = 0.0
    staged_store_bytes_per_clk: float = 0.0

    @property
    def hbm_bytes_per_clk(self) -> float:
        """Device memory bandwidth share of one SM, B/clk/SM."""
        return self.hbm_bytes_per_s / (self.clock_ghz * 1e9) / self.sms

    def for_op(self, op: str) -> Hardware:
        """This table with ``op``'s own fitted entries (op_constants) in place of the shared ones: what the cost
        model prices ``op``'s graphs with. The result holds no op_constants, so applying it again costs nothing."""
        own = self.op_constants.get(op)
        return replace(self, **own, op_constants={}) if own else self

    def cycles_to_us(self, cycles: float) -> float:
        return cycles / (self.clock_ghz * 1e3)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Target:
    """The budgets of one kernel on ``hw``: what the model checks a tiling against and what the code
    generator grants (setmaxnreg levels, launch bounds, shared memory), in one place."""

    hw: Hardware

    @property
    def sms(self) -> int:
        return self.hw.sms

    def producer_regs(self, ctas: int = 1) -> int:
        """setmaxnreg.dec level of the producer warpgroup, registers/thread; 0 = no reallocation (several
        resident CTAs share the register file evenly, or the hardware has none)."""
        return self.hw.producer_regs if ctas == 1 else 0

    def consumer_regs(self, groups: int, ctas: int = 1) -> int:
        """Registers per consumer thread. One CTA per SM with reallocation: the SM's file minus the producer
        warpgroup's, split over ``groups`` consumer warpgroups (setmaxnreg.inc). Otherwise every thread of the
        ``ctas``·(groups + 1) warpgroups gets an even share. Rounded down to 8, at most max_consumer_regs and
        regs_per_thread."""
        hw = self.hw
        prod = self.producer_regs(ctas)
        if prod:
            per = (hw.regs_per_sm - 128 * prod) // (128 * groups)
        else:
            per = hw.regs_per_sm // (ctas * 128 * (groups + 1))
        return min(hw.regs_per_thread, hw.max_consumer_regs, per // 8 * 8)

    def smem_budget(self, ctas: int = 1) -> int:
        """Dynamic shared memory of one CTA, bytes, when ``ctas`` CTAs share an SM."""
        hw = self.hw
        return hw.smem_per_block if ctas == 1 else min(hw.smem_per_block,
                                                       hw.smem_per_sm // ctas - hw.smem_reserved_per_cta)


def sms_of(hw: Hardware | None) -> int:
    """SMs of the hardware a graph is built for (``DEFAULT_HW``'s when none is named): how many CTAs run at once,
    which bounds how often a tile is reread from L2 while it is resident."""
    return hw.sms if hw is not None else _default_sms()


@functools.cache
def _default_sms() -> int:
    return load(DEFAULT_HW).sms


def target(hw: str | os.PathLike[str] | Hardware) -> Target:
    """The Target of a hardware table (by name, path or object)."""
    return Target(load(hw))


def known() -> list[str]:
    """Names of the built-in tables."""
    return sorted(p.stem for p in HERE.glob("*.json") if "." not in p.stem)


def load(name_or_path: str | os.PathLike[str] | Hardware, calibrated: bool = True) -> Hardware:
    """Load a hardware table by name (``h100``, ``h200``, ``a100``, ``mi300x``) or by file path, with its
    ``<name>.calibrated.json`` overlay unless ``calibrated`` is False (a fit starts from the datasheet table)."""
    if isinstance(name_or_path, Hardware):
        return name_or_path
    p = Path(name_or_path)
    if p.suffix != ".json":
        if str(name_or_path).lower() not in known():
            raise HardwareError(f"unknown hardware {str(name_or_path)!r}; known: {', '.join(known())}, "
                                "or pass the path of a .json table")
        p = HERE / f"{str(name_or_path).lower()}.json"
    if not p.exists():
        raise HardwareError(f"hardware table {str(p)!r} does not exist; known names: {', '.join(known())}")
    raw = read_json(p, "hardware table", error=HardwareError)
    overlay = _calibration(p) if calibrated else {}
    return _from_raw(raw | overlay, str(p))


def overlay_path(table: Path) -> Path:
    """Where the calibration overlay of the table file ``table`` lives: ``<stem>.calibrated.json`` in
    $PTSOLVE_CALIBRATION_DIR, else beside the table (what load reads and ptsolve.calibrate.write writes)."""
    return Path(os.environ.get("PTSOLVE_CALIBRATION_DIR", table.parent)) / f"{table.stem}.calibrated.json"


def _calibration(p: Path) -> dict[str, Any]:
    c = overlay_path(p)
    return read_json(c, "calibration overlay (rewrite it with `ptsolve calibrate --write` or delete it)",
                     error=HardwareError) if c.exists() else {}


# fields the model divides by or sizes against: a table with 0 there describes no device
POSITIVE = ("sms", "clock_ghz", "tc_flops_per_clk", "fp32_flops_per_clk", "sfu_per_clk", "hbm_bytes_per_s",
            "l2_bytes_per_clk", "smem_per_sm", "smem_per_block", "regs_per_sm", "regs_per_thread", "max_threads",
            "tc_efficiency", "vector_efficiency")
_TYPES = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}


def _typed(name: str, kind: str, v: Any, where: str) -> None:
    """HardwareError unless ``v`` is of the field's declared type (an int is a float; a bool is no number)."""
    want = _TYPES.get(kind) or ((dict,) if kind.startswith("dict") else None)
    if want is None:
        return
    bad = not isinstance(v, want) or (isinstance(v, bool) and bool not in want)
    if bad:
        what = {"int": "a whole number", "float": "a number", "bool": "true or false", "str": "a string"}.get(
            kind, "an object")
        raise HardwareError(f"hardware table {where}: field {name!r} must be {what}, got {v!r}")


def _from_raw(raw: dict[str, Any], where: str) -> Hardware:
    vals: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for f in fields(Hardware):
        if f.name == "sources":
            continue
        if f.name not in raw and (f.default is not MISSING or f.default_factory is not MISSING):
            continue
        if f.name not in raw:
            raise HardwareError(f"hardware table {where}: missing field {f.name!r}")
        v = raw[f.name]
        # an entry with its source is {"value": ..., "source": ...}; the dict-valued fields (task_extra, op_constants)
        # may also come bare, as Hardware.to_dict writes them
        if isinstance(v, dict) and (not str(f.type).startswith("dict") or set(v) == {"value", "source"}):
            if "value" not in v or "source" not in v:
                raise HardwareError(f"hardware table {where}: field {f.name!r} needs 'value' and 'source'")
            sources[f.name] = v["source"]
            v = v["value"]
        _typed(f.name, str(f.type), v, where)
        vals[f.name] = v
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0:
            raise HardwareError(f"hardware table {where}: field {f.name!r} is negative ({v})")
    for k, v in vals.get("task_extra", {}).items():
        key_ok = isinstance(k, str) and k.count("/") == 2 and k.rsplit("/", 1)[1].isdigit()
        if not (key_ok and isinstance(v, int) and not isinstance(v, bool) and v >= 0):
            raise HardwareError(f"hardware table {where}: task_extra entry {k!r}: {v!r} must map 'op/task/groups' "
                                "(e.g. 'flash_attention/exp2/2') to cycles (an integer >= 0)")
    numeric = {f.name: f.type for f in fields(Hardware) if f.type in ("int", "float")}
    for op, own in vals.get("op_constants", {}).items():
        for k, v in (own.items() if isinstance(own, dict) else [(own, None)]):
            ok = k in numeric and isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 and \
                (numeric[k] == "float" or isinstance(v, int))
            if not ok:
                raise HardwareError(f"hardware table {where}: op_constants[{op!r}] entry {k!r}: {v!r} must name a "
                                    f"numeric field of the table ({', '.join(sorted(numeric))}) with a value >= 0 "
                                    "of its type")
    if not 0 < vals.get("misaligned_l2_factor", 1.0) <= 1:
        raise HardwareError(f"hardware table {where}: field 'misaligned_l2_factor' must be in (0, 1], got "
                            f"{vals['misaligned_l2_factor']} (the fraction of the L2 rate misaligned rows get)")
    for k in POSITIVE:
        if not vals[k] > 0:
            raise HardwareError(f"hardware table {where}: field {k!r} must be > 0, got {vals[k]}")
    if isinstance(raw.get("sources"), dict):  # Hardware.to_dict keeps them apart from the values
        sources = {str(k): str(v) for k, v in raw["sources"].items()} | sources
    return Hardware(**vals, sources=sources)
