"""Shape-generic kernels: one schedule and one binary per shape class, launched on any shape of that class.

A *shape class* is what changes the schedule or the binary: the operator, the dtype and, for attention, head_dim,
causal and the GQA ratio's bucket; for split-KV decode (seq_q <= ``DECODE_MAX_SEQ_Q``) head_dim, causal and the
consumer warpgroups its packed query tile needs; for Mamba2's chunk kernels head_dim, d_state and chunk
(``ShapeClass``). The
sizes that do not (batch, sequence lengths, heads; GEMM's M, N, K; Mamba2's batch, seq, heads and ngroups) are
kernel arguments (``lower(..., generic=True)``; ``OpKernel.sizes`` in ``codegen.cuda.skeleton``). The class's
schedule is solved once, on a representative shape (``representative``): the modulo schedule's initiation
interval and stages do not depend on the trip count. Split-KV decode's pieces per query tile (which do not change the
binary) and which binary runs (one or two CTAs per SM, or persistent CTAs; for more than 64 packed rows, one
warpgroup's or two's: ``decode_variants``) are chosen per shape by
the cost model: the solved programs re-timed on the shape's graph for every piece count (``decode_pick``). The
solved schedules ship as a table
(``codegen/schedule_table.json``, written by ``python3 -m codegen.generic table`` on a CPU machine with the
solvers); a class the table lacks is solved on first use where OR-Tools is installed, else it is a PtsolveError
naming the class and the command. The generic kernel is compiled once: its cubin is cached on disk by source hash
(``runtime.compile_kernel``), and the source of a class does not depend on the shape, so a second process, or a
new shape, runs no nvcc.

The launchers (``attention``, ``gemm``, ``chunk_scan``, ``chunk_state``) take torch tensors, build the tensor maps
and arguments of a shape once and keep the prepared launch keyed by the inputs' (addresses, shapes, strides) and the
scalars (the output's address is written into it per call): a warm call is a dict lookup and a ``cuLaunchKernel`` on
the current stream. ``ptsolve.torch`` is the user's front door over them.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import importlib.util
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ptsolve.errors import PtsolveError, ShapeError

from .plan import KernelPlan

HW = "h200"  # the table's hardware (sm_90a; an H100 runs the same binaries)
TABLE = Path(__file__).with_name("schedule_table.json")
DTYPES = ("fp16", "bf16")
HEAD_DIMS = (64, 128)
# GQA ratio (heads / kv_heads) buckets: (lowest ratio, name, the ratio the representative shape uses)
GQA_BUCKETS = ((1, "1", 1), (2, "2-4", 4), (5, "5+", 8))
# Mamba2's chunk kernels: classes by (head_dim, d_state, chunk); batch, seq, heads and ngroups are kernel arguments
MAMBA_OPS = ("mamba2_chunk_scan", "mamba2_chunk_state")
MAMBA_HEAD_DIMS, D_STATES, CHUNKS = (64,), (64, 128), (64, 128, 256)
SOLVE_TIME_LIMIT = 60.0  # seconds per class
# iterations of a piece replayed when a decode shape is re-timed, each further one adds the loop's period (a 128k
# cache re-timed in ~10 ms instead of ~0.5 s; the same prediction, tests/test_generic.py)
DECODE_REPLAY_TRIPS = 16
DECODE_REP_SPLITS = 16  # pieces of the decode classes' representative (1 batch x 8 kv heads: 128 piece CTAs)


@dataclass(frozen=True)
class ShapeClass:
    """What a schedule and a binary are chosen by. ``head_dim``: attention's and Mamba2's;
    ``causal``, ``gqa`` only attention's; ``d_state``, ``chunk`` only Mamba2's."""

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

    def __hash__(self) -> int:
        """Hashed once (a launcher's cache key hashes the class on every call)."""
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.op, self.dtype, self.head_dim, self.causal, self.gqa, self.d_state, self.chunk,
                      self.groups, self.ctas, self.persistent))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the cached hash (string hashes differ between processes)."""
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    @property
    def key(self) -> str:
        """The table's key, e.g. ``flash_attention/bf16/d128/causal/gqa2-4``, ``gemm/fp16`` or
        ``mamba2_chunk_scan/fp16/p64/n128/q256``."""
        if self.op == "gemm":
            return f"gemm/{self.dtype}"
        if self.op in MAMBA_OPS:
            return f"{self.op}/{self.dtype}/p{self.head_dim}/n{self.d_state}/q{self.chunk}"
        if self.op == "flash_decode":
            return (f"flash_decode/{self.dtype}/d{self.head_dim}/{'causal' if self.causal else 'full'}/wg{self.groups}"
                    + (f"/ctas{self.ctas}" if self.ctas > 1 else "") + ("/persistent" if self.persistent else ""))
        return f"{self.op}/{self.dtype}/d{self.head_dim}/{'causal' if self.causal else 'full'}/gqa{self.gqa}"


def gqa_bucket(heads: int, kv_heads: int) -> str:
    """The bucket of heads / kv_heads (ShapeError unless kv_heads divides heads)."""
    if kv_heads < 1 or heads % kv_heads:
        raise ShapeError(f"heads={heads} is not a multiple of kv_heads={kv_heads}; each kv head must serve a whole "
                         "group of query heads")
    r = heads // kv_heads
    return next(name for lo, name, _ in reversed(GQA_BUCKETS) if r >= lo)


def _dtype_ok(dtype: str) -> None:
    if dtype not in DTYPES:
        raise ShapeError(f"dtype {dtype!r}: ptsolve's kernels take {' or '.join(DTYPES)}; convert the tensors")


def attention_class(dtype: str, head_dim: int, causal: bool, heads: int, kv_heads: int) -> ShapeClass:
    """The attention class of a shape; ShapeError for a head_dim or dtype the kernels do not cover."""
    _dtype_ok(dtype)
    if head_dim not in HEAD_DIMS:
        raise ShapeError(f"head_dim={head_dim}: ptsolve's attention kernels cover head_dim {HEAD_DIMS}; pad the "
                         "head dimension or use another backend for this layer")
    return ShapeClass("flash_attention", dtype, int(head_dim), bool(causal), gqa_bucket(heads, kv_heads))


DECODE_MAX_SEQ_Q = 16  # query positions up to which attention runs the split-KV decode kernel


def decode_class(dtype: str, head_dim: int, causal: bool, heads: int, kv_heads: int, seq_q: int) -> ShapeClass:
    """The split-KV decode class of a shape (seq_q <= DECODE_MAX_SEQ_Q): one consumer warpgroup when a query tile
    packs at most 64 rows (the GQA group's heads times the positions), else two; ShapeError for a head_dim or dtype
    the kernels do not cover."""
    attention_class(dtype, head_dim, causal, heads, kv_heads)  # the same checks
    if not 1 <= seq_q <= DECODE_MAX_SEQ_Q:
        raise ShapeError(f"seq_q={seq_q}: the split-KV decode kernel takes 1..{DECODE_MAX_SEQ_Q} query positions")
    groups = 1 if heads // kv_heads * seq_q <= 64 else 2
    return ShapeClass("flash_decode", dtype, int(head_dim), bool(causal), groups=groups)


# head dims whose one-warpgroup decode class also has a two-CTAs-per-SM binary: with D 128 the output accumulator
# alone takes 64 of a thread's 128 registers and no such tiling compiles without spills or a serialised wgmma
DECODE_CTAS2_HEAD_DIMS = (64,)


def decode_variants(c: ShapeClass) -> list[ShapeClass]:
    """The binaries a decode class chooses from per shape (``decode_pick``): its own (one CTA per SM, the register
    file reallocated to the consumers) and
    - with one consumer warpgroup and a head dim of DECODE_CTAS2_HEAD_DIMS, two resident CTAs per SM (half the
      register file each: a CTA's fill and drain overlap the other's loop, and a grid of a few hundred short pieces
      fits one wave; results/torch_decode/mha_ctas.py);
    - with one consumer warpgroup, persistent CTAs (one per SM, each dealing itself (batch, kv head) tiles: the
      producer loads a tile's first K/V blocks while the consumers finish the previous one), for shapes whose tiles
      each take one piece and outnumber the SMs (batch-64 Llama: results/torch_decode/pers_ab.py);
    - with two consumer warpgroups (more than 64 packed rows), the one-warpgroup class's own binary, the rows cut
      into 64-row query tiles (twice the CTAs, each K/V tile read by both, the second from L2): Falcon-7B's 71 heads
      per kv head at short caches or batch 1 (results/torch_decode/pick_ab.py wg: b1 k1000 7.5 -> 6.2 us). Not its
      two-CTA binary: with two query tiles of one kv head the model's picks of it measured 11-17% slower than the
      two-warpgroup binary on 4 of 19 Falcon shapes (same run)."""
    if c.groups == 1 and c.ctas <= 1 and not c.persistent:
        return [c, *([dataclasses.replace(c, ctas=2)] if c.head_dim in DECODE_CTAS2_HEAD_DIMS else []),
                dataclasses.replace(c, persistent=1)]
    if c.groups == 2 and c.ctas <= 1 and not c.persistent:
        return [c, dataclasses.replace(c, groups=1)]
    return [c]


def gemm_class(dtype: str) -> ShapeClass:
    _dtype_ok(dtype)
    return ShapeClass("gemm", dtype)


def mamba_class(op: str, dtype: str, head_dim: int, d_state: int, chunk: int) -> ShapeClass:
    """The Mamba2 chunk-kernel class of a shape; ShapeError for sizes the table does not cover."""
    _dtype_ok(dtype)
    for name, v, ok in (("head_dim", head_dim, MAMBA_HEAD_DIMS), ("d_state", d_state, D_STATES),
                        ("chunk", chunk, CHUNKS)):
        if v not in ok:
            raise ShapeError(f"{op}: {name}={v}; ptsolve's Mamba2 kernels cover {name} in {ok}")
    return ShapeClass(op, dtype, int(head_dim), d_state=int(d_state), chunk=int(chunk))


def classes() -> list[ShapeClass]:
    """Every class the table covers."""
    out = [gemm_class(d) for d in DTYPES]
    out += [mamba_class(op, d, hd, n, q) for op in MAMBA_OPS for d in DTYPES for hd in MAMBA_HEAD_DIMS
            for n in D_STATES for q in CHUNKS]
    for d in DTYPES:
        for hd in HEAD_DIMS:
            for causal in (False, True):
                for _, name, _ in GQA_BUCKETS:
                    out.append(ShapeClass("flash_attention", d, hd, causal, name))
                for w in (1, 2):
                    # a two-warpgroup class's variants include the one-warpgroup class, listed already
                    out += [v for v in decode_variants(ShapeClass("flash_decode", d, hd, causal, groups=w))
                            if v not in out]
    return out


def representative(c: ShapeClass) -> dict[str, Any]:
    """The shape a class's schedule is solved on: long enough that the loop's steady state dominates."""
    if c.op == "gemm":
        return {"M": 4096, "N": 4096, "K": 4096, "dtype": c.dtype}
    if c.op in MAMBA_OPS:  # Mamba2-1.3b's heads at batch 4, seq 8k
        return {"batch": 4, "seq": 8192, "heads": 64, "head_dim": c.head_dim, "d_state": c.d_state,
                "chunk": c.chunk, "groups": 1, "dtype": c.dtype}
    if c.op == "flash_decode":  # a long cache few (batch, kv head) rows share, so the class's program splits keys;
        # a persistent class's: a batch whose tiles, one piece each, outnumber the SMs
        heads, kv, sq = (32, 8, 4 if c.causal else 1) if c.groups == 1 else (71, 1, 2 if c.causal else 1)
        batch, skv = (64, 2048) if c.persistent else (1, 16384)
        return {"batch": batch, "heads": heads, "kv_heads": kv, "seq_q": sq, "seq_kv": skv, "head_dim": c.head_dim,
                "causal": c.causal, "dtype": c.dtype}
    ratio = next(r for _, name, r in GQA_BUCKETS if name == c.gqa)
    return {"batch": 2, "heads": 32, "kv_heads": 32 // ratio, "seq_q": 4096, "seq_kv": 4096, "head_dim": c.head_dim,
            "causal": c.causal, "dtype": c.dtype}


# ---------------------------------------------------------------------------------------------- schedules


def class_fix(c: ShapeClass) -> dict[str, int] | None:
    """The tiling keys a class's solve pins (``optimize``'s ``fix``). GEMM: one K range (one generic kernel serves
    every M, N, K, and split-K's workspace is sized per shape). Attention: none (grid or persistent CTAs is the
    model's choice on the representative; persistent measured faster on 78 of 85 prefill shapes and never more than
    6% slower: results/torch_prefill). Split-KV decode: the class's warpgroups and CTAs per SM, and several pieces,
    so the program has the several-piece epilogue the generic kernel runs (a shape's pieces are chosen per shape,
    ``decode_splits``); a persistent class one piece."""
    if c.op == "gemm":
        return {"splits": 1}
    if c.op == "flash_decode":
        return ({"groups": c.groups, "splits": 1 if c.persistent else DECODE_REP_SPLITS, "ctas": max(1, c.ctas)}
                | ({"persistent": 1} if c.persistent else {}))
    return None


def solve(c: ShapeClass, time_limit: float = SOLVE_TIME_LIMIT, compile_check: bool | None = None
          ) -> dict[str, Any]:
    """Solve ``c`` on its representative shape with CP-SAT (``compile_check``: the compiler in the loop, as
    ``ptsolve.optimize``); the table entry: the KernelPlan and what the solve said."""
    import ptsolve

    from .plan import plan_from_program

    res = ptsolve.optimize(ptsolve.ops.make(c.op, **representative(c)), hw=HW, solver="cpsat",
                           time_limit=time_limit, compile_check=compile_check, fix=class_fix(c))
    plan = plan_from_program(res.program)
    out = {"plan": json.loads(plan.to_json()), "status": res.status, "predicted_us": round(res.predicted_us, 3),
           "solve_s": round(res.solve_s, 2), "representative": representative(c)}
    if c.op == "flash_decode":  # re-timed per shape to choose its pieces
        out["program"] = json.loads(res.program.to_json())
    return out


def table_path() -> Path:
    """``$PTSOLVE_SCHEDULE_TABLE`` (another table, e.g. one tuned on this GPU) or the shipped one."""
    return Path(os.environ.get("PTSOLVE_SCHEDULE_TABLE") or TABLE)


def load_table(path: Path | None = None) -> dict[str, Any]:
    """A schedule table (``{"classes": {key: entry}, ...}``; default ``table_path()``); an empty one when the file
    is absent."""
    path = table_path() if path is None else path
    if not path.exists():
        return {"classes": {}}
    try:
        d = json.loads(path.read_text())
        if not isinstance(d.get("classes"), dict):
            raise ValueError("no 'classes' object")
        return d
    except (OSError, ValueError) as e:
        raise PtsolveError(f"schedule table {path} is unreadable ({e}); rebuild it with "
                           "`python3 -m codegen.generic table`") from e


_SOLVED: dict[ShapeClass, dict[str, Any]] = {}
_TABLE: list[dict[str, Any]] = []


def _table() -> dict[str, Any]:
    """The table, read once per process."""
    if not _TABLE:
        _TABLE.append(load_table())
    return _TABLE[0]


def solvers_installed() -> bool:
    return importlib.util.find_spec("ortools") is not None


def _class_entry(c: ShapeClass, table: dict[str, Any] | None = None) -> dict[str, Any]:
    """The class's table entry: the shipped table's, else solved here (OR-Tools installed; ptsolve's schedule cache
    keeps it for the next process), else a PtsolveError naming the class and how to get one."""
    t = _table() if table is None else table
    entry = t["classes"].get(c.key)
    if entry is not None:
        return entry
    if c not in _SOLVED:
        if not solvers_installed():
            raise PtsolveError(f"no schedule for shape class {c.key}: it is not in {TABLE.name} and OR-Tools is not "
                               "installed to solve it here; run `python3 -m codegen.generic table` where the solvers "
                               "are (pip install ortools) and ship the file")
        _SOLVED[c] = solve(c)
    return _SOLVED[c]


def schedule(c: ShapeClass, table: dict[str, Any] | None = None) -> KernelPlan:
    """The class's schedule (``_class_entry``)."""
    return KernelPlan.from_json(json.dumps(_class_entry(c, table)["plan"]))


_PROGRAMS: dict[ShapeClass, Any] = {}


def class_program(c: ShapeClass) -> Any:
    """The SProgram a decode class's schedule came from (its table entry's ``program``)."""
    if c not in _PROGRAMS:
        from ptsolve.program import SProgram

        e = _class_entry(c)
        if "program" not in e:
            raise PtsolveError(f"the schedule table's entry {c.key} has no program to choose a shape's pieces with; "
                               "rebuild it with `python3 -m codegen.generic table --only flash_decode`")
        _PROGRAMS[c] = SProgram.from_dict(e["program"])
    return _PROGRAMS[c]


def _kv_bucket(blocks: int) -> int:
    """The key-block count a decode shape's pieces are chosen at: the next of 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14,
    16, 20, 24, 28, 32, 40, ... (four steps per doubling), so a cache that grows by a token per call is re-timed once
    every ~20% of length, not every call."""
    if blocks <= 8:
        return blocks
    step = 1 << (blocks.bit_length() - 3)  # a quarter of the power of two at or below blocks
    return -(-blocks // step) * step


_SPLITS: dict[tuple[Any, ...], tuple[float, int]] = {}


def decode_bucketed(c: ShapeClass, p: dict[str, Any]) -> dict[str, Any]:
    """Decode shape ``p`` with its cache length rounded up to ``_kv_bucket`` of class ``c``'s key blocks: the shape
    ``decode_splits`` re-times, so that a growing cache re-times rarely."""
    bn = class_program(c).graph.tiling["BN"]
    return dict(p, seq_kv=max(p["seq_kv"], _kv_bucket(-(-p["seq_kv"] // bn)) * bn))


def decode_retime(c: ShapeClass, p: dict[str, Any], splits: int, hw: Any) -> float:
    """Predicted µs of class ``c``'s binary on decode shape ``p`` (as given) in ``splits`` pieces on the hardware
    table ``hw``: the class's program re-timed on the shape's graph (``ptsolve.simulate``, timed mode: every task at
    its planned cycle or as soon as its inputs and units allow; a piece replayed for DECODE_REPLAY_TRIPS iterations
    and extended by the loop's period)."""
    from ptsolve.ops import make
    from ptsolve.simulate import simulate

    prog = class_program(c)
    g = make("flash_decode", **p).graph(dict(prog.graph.tiling, splits=splits), hw)
    return simulate(dataclasses.replace(prog, graph=g), hw, max_trips=DECODE_REPLAY_TRIPS).kernel_us


def _decode_best(c: ShapeClass, p: dict[str, Any]) -> tuple[float, int]:
    """(predicted µs, pieces) of ``decode_splits``."""
    from ptsolve.hw import load as load_hw
    from ptsolve.ops.decode import split_counts

    q = decode_bucketed(c, p)
    key = (c, p["batch"], p["heads"], p["kv_heads"], p["seq_q"], q["seq_kv"])
    got = _SPLITS.get(key)
    if got is None:
        t, hw = class_program(c).graph.tiling, load_hw(HW)  # the hardware read once, not per candidate
        best = None
        # a persistent binary has no merge CTAs: one piece per tile
        for s in [1] if c.persistent else split_counts(q, t["BM"], t["BN"]):
            us = decode_retime(c, q, s, hw)
            if best is None or us < best[0] - 1e-9:
                best = (us, s)
        assert best is not None
        if len(_SPLITS) >= 4096:
            _SPLITS.clear()
        got = _SPLITS[key] = best
    return got


def decode_splits(c: ShapeClass, p: dict[str, Any]) -> int:
    """Pieces of the longest query tile for decode shape ``p`` (``ptsolve.ops.decode`` parameters) on class ``c``'s
    binary: the piece count (``ptsolve.ops.decode.split_counts``) at which the class's program, re-timed on the
    shape's graph (``decode_retime``), predicts the shortest kernel; the fewer pieces on a tie. Evaluated at the
    shape's key blocks rounded up to ``_kv_bucket`` (``decode_bucketed``) and kept per (class, shape without
    seq_kv, bucket)."""
    return _decode_best(c, p)[1]


def decode_pick(c: ShapeClass, p: dict[str, Any]) -> tuple[ShapeClass, int]:
    """The binary (one of ``decode_variants(c)``) and pieces a decode shape runs with: the shortest kernel the
    re-timed programs predict (``decode_splits``), the class's own binary on a tie."""
    best = None
    for v in decode_variants(c):
        us, s = _decode_best(v, p)
        if best is None or us < best[0] - 1e-9:
            best = (us, v, s)
    assert best is not None
    return best[1], best[2]


# ---------------------------------------------------------------------------------------------- kernels


@dataclass
class ClassKernel:
    """A class's generic kernel: its KernelIR, source and (once a GPU is used) the loaded module."""

    cls: ShapeClass
    plan: KernelPlan
    ir: Any
    ks: Any
    loaded: Any = None

    def module(self) -> Any:
        if self.loaded is None:
            from .runtime import load
            self.loaded = load(self.ks)
        return self.loaded


_KERNELS: dict[ShapeClass, ClassKernel] = {}


def _build(c: ShapeClass, plan: KernelPlan) -> ClassKernel:
    from .cuda import emit_ir
    from .lower import lower

    ir = lower(plan, HW, generic=True)
    return ClassKernel(c, plan, ir, emit_ir(ir))


def kernel(c: ShapeClass) -> ClassKernel:
    """The generic kernel of ``c`` (schedule, lowering and source once per process; the cubin from disk)."""
    k = _KERNELS.get(c)
    if k is None:
        k = _KERNELS[c] = _build(c, schedule(c))
    return k


def compile_class(c: ShapeClass) -> dict[str, Any]:
    """Compile ``c``'s generic kernel (cached); its ptxas numbers."""
    from .runtime import compile_kernel
    rep = compile_kernel(kernel(c).ks).report
    return {k: rep.get(k) for k in ("registers", "spill_stores", "spill_loads", "wgmma_serialized")}


# ---------------------------------------------------------------------------------------------- launchers

_LAUNCHES: dict[tuple[Any, ...], Any] = {}
_MAX_LAUNCHES = 1024


def _remember(key: tuple[Any, ...], ln: Any) -> Any:
    if len(_LAUNCHES) >= _MAX_LAUNCHES:
        _LAUNCHES.clear()
    _LAUNCHES[key] = ln
    return ln


def _stream_fn() -> Any:
    import torch
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return lambda dev: raw(dev)
    return lambda dev: torch.cuda.current_stream(dev).cuda_stream


_STREAM: list[Any] = []


def current_stream(device: int) -> int:
    """The raw handle of torch's current CUDA stream on ``device``."""
    if not _STREAM:
        _STREAM.append(_stream_fn())
    return _STREAM[0](device)


def attention(q: Any, k: Any, v: Any, out: Any, c: ShapeClass, scale: float, cu_q: Any = None, cu_k: Any = None,
              max_q: int = 0, max_k: int = 0) -> None:
    """Launch ``c``'s kernel: dense q [B, Sq, H, D], k/v [B, Skv, Hkv, D], or varlen (``cu_q`` / ``cu_k`` int32
    [B+1]) q [Tq, H, D], k/v [Tk, Hkv, D] with ``max_q`` / ``max_k`` the longest sequences; ``out`` contiguous like
    q. Tensors: last dim contiguous, other strides multiples of 8 elements (the caller checks)."""
    attention_launch(q, k, v, c, scale, cu_q, cu_k, max_q, max_k)(current_stream(q.get_device()), out.data_ptr())


def attention_launch(q: Any, k: Any, v: Any, c: ShapeClass, scale: float, cu_q: Any = None, cu_k: Any = None,
                     max_q: int = 0, max_k: int = 0) -> Any:
    """The prepared launch (``runtime.Launch``) of ``attention`` for these inputs, kept per (addresses, shapes,
    strides, scalars); call it with the stream and the output's address."""
    varlen = cu_q is not None
    key = ("fa", c, q.data_ptr(), k.data_ptr(), v.data_ptr(), q.shape, q.stride(), k.shape, k.stride(), v.stride(),
           scale, cu_q.data_ptr() if varlen else 0, cu_k.data_ptr() if varlen else 0, max_q, max_k)
    ln = _LAUNCHES.get(key)
    if ln is None:
        ln = _remember(key, _attention_launch(q, k, v, c, scale, cu_q, cu_k, max_q, max_k))
    return ln


def _attention_launch(q: Any, k: Any, v: Any, c: ShapeClass, scale: float, cu_q: Any, cu_k: Any,
                      max_q: int, max_k: int) -> Any:
    from .cuda.attention import sizes, tensor_map

    ck = kernel(c)
    t = ck.ir.tiling
    D = c.head_dim
    if cu_q is not None:
        H, Hkv = q.shape[1], k.shape[1]
        B = cu_q.shape[0] - 1
        sq, skv = max_q, max_k
        lay = {"q": (q.shape[0], 1, (q.shape[0] * q.stride(0), q.stride(0), q.stride(1))),
               "k": (k.shape[0], 1, (k.shape[0] * k.stride(0), k.stride(0), k.stride(1))),
               "v": (v.shape[0], 1, (v.shape[0] * v.stride(0), v.stride(0), v.stride(1)))}
    else:
        B, sq, H = q.shape[0], q.shape[1], q.shape[2]
        skv, Hkv = k.shape[1], k.shape[2]
        lay = {n: (x.shape[1], x.shape[0], (x.stride(0), x.stride(1), x.stride(2)))
               for n, x in (("q", q), ("k", k), ("v", v))}
    maps = tuple(tensor_map(n, c.dtype, D, H if n == "q" else Hkv, rows, nb, st, t["BM"] if n == "q" else t["BN"])
                 for n, (rows, nb, st) in lay.items())
    sz = sizes({"batch": B, "heads": H, "kv_heads": Hkv, "seq_q": sq, "seq_kv": skv}, t)
    vals = {"q": q.data_ptr(), "k": k.data_ptr(), "v": v.data_ptr(), "o": 0,
            "cu_q": cu_q.data_ptr() if cu_q is not None else 0, "cu_k": cu_k.data_ptr() if cu_k is not None else 0,
            "scale_log2": scale * math.log2(math.e), **sz}
    return ck.module().prepare(vals, maps, sz["NTILES"], out="o")


def decode(q: Any, k: Any, v: Any, out: Any, c: ShapeClass, scale: float, seqlens: Any = None) -> None:
    """Launch decode class ``c``'s split-KV kernel: q [B, Sq, H, D] (Sq <= DECODE_MAX_SEQ_Q), k/v [B, Skv, Hkv, D],
    ``out`` contiguous like q (the tensors as ``attention`` takes them; the caller checks). ``seqlens`` (int32 [B] on
    the device, or None): sequence b attends to the first seqlens[b] keys of the cache (clamped to 0 .. Skv; read by
    the kernel, so one launch or CUDA graph serves a growing cache; its pieces are chosen for the whole cache,
    ``ptsolve.ops.decode.length_pieces``). The launch's scratch (partial results and counters) is shared by every
    decode launch of the class on the device: launches on one stream at a time."""
    decode_launch(q, k, v, c, scale, seqlens)(current_stream(q.get_device()), out.data_ptr())


def decode_launch(q: Any, k: Any, v: Any, c: ShapeClass, scale: float, seqlens: Any = None) -> Any:
    """The prepared launch of ``decode`` for these inputs, kept per (addresses, shapes, strides, scale); call it
    with the stream and the output's address."""
    key = ("fd", c, q.data_ptr(), k.data_ptr(), v.data_ptr(), q.shape, q.stride(), k.shape, k.stride(), v.stride(),
           scale, 0 if seqlens is None else seqlens.data_ptr())
    ln = _LAUNCHES.get(key)
    if ln is None:
        ln = _remember(key, _decode_launch(q, k, v, c, scale, seqlens))
    return ln


_SCRATCH: dict[tuple[int, str, str], list[Any]] = {}


def _scratch(device: Any, kernel_name: str, name: str, nbytes: int) -> int:
    """A zero-filled device buffer of at least ``nbytes`` for scratch ``name`` of a kernel, shared by its launches
    (the kernel leaves its counters at zero). Grown by allocating a larger one; the smaller ones are kept, since a
    prepared launch (or a captured CUDA graph) may still point into them."""
    import torch

    held = _SCRATCH.setdefault((device.index or 0, kernel_name, name), [])
    if not held or held[-1].numel() < nbytes:
        held.append(torch.zeros(max(nbytes, 2 * held[-1].numel() if held else 0, 1 << 12), dtype=torch.uint8,
                                device=device))
    return held[-1].data_ptr()


def _decode_launch(q: Any, k: Any, v: Any, c: ShapeClass, scale: float, seqlens: Any) -> Any:
    from .cuda import decode as cd

    (B, sq, H, D), skv, Hkv = q.shape, k.shape[1], k.shape[2]
    p = {"batch": B, "heads": H, "kv_heads": Hkv, "seq_q": sq, "seq_kv": skv, "head_dim": D, "causal": c.causal,
         "dtype": c.dtype}
    v_, splits = decode_pick(c, p)
    if v_.persistent and splits != 1:  # decode_pick offers a persistent binary one piece only
        raise PtsolveError(f"{v_.key}: a persistent binary launched with {splits} pieces; it has no merge CTAs")
    ck = kernel(v_)
    mod = ck.module()
    t = dict(ck.ir.tiling, splits=splits)
    err = cd.index_error(p, t)
    if err:
        raise ShapeError(err + ": split the batch")
    sz = cd.sizes(p, t, mod.sms)
    maps = cd.maps(p, t, {n: tuple(x.stride()[:3]) for n, x in (("q", q), ("k", k), ("v", v))})
    ws = {n: _scratch(q.device, ck.ks.name, n, b) for n, b in cd.generic_workspace(p, sz).items()}
    vals = {"q": q.data_ptr(), "k": k.data_ptr(), "v": v.data_ptr(), "o": 0, **ws,
            "scale_log2": scale * math.log2(math.e), "seqlens": 0 if seqlens is None else seqlens.data_ptr(), **sz}
    return mod.prepare(vals, maps, cd.grid(sz), out="o")


def gemm(a: Any, b: Any, out: Any, c: ShapeClass) -> None:
    """Launch ``c``'s kernel: out [M, N] (contiguous) = a [M, K] · b [N, K]ᵀ (rows contiguous, row strides
    multiples of 8 elements; the caller checks)."""
    gemm_launch(a, b, c)(current_stream(a.get_device()), out.data_ptr())


def gemm_launch(a: Any, b: Any, c: ShapeClass) -> Any:
    """The prepared launch of ``gemm`` for these inputs; call it with the stream and the output's address."""
    key = ("gemm", c, a.data_ptr(), b.data_ptr(), a.shape, a.stride(), b.shape, b.stride())
    ln = _LAUNCHES.get(key)
    if ln is None:
        ln = _remember(key, _gemm_launch(a, b, c))
    return ln


def _gemm_launch(a: Any, b: Any, c: ShapeClass) -> Any:
    from .cuda.common import TensorMapSpec
    from .cuda.gemm import c_map, sizes

    ck = kernel(c)
    t = ck.ir.tiling
    (M, K), N = a.shape, b.shape[0]
    maps = (TensorMapSpec("a", c.dtype, (K, M), (a.stride(0) * 2,), (64, t["BM"])),
            TensorMapSpec("b", c.dtype, (K, N), (b.stride(0) * 2,), (64, t["BN"])))
    if t.get("tma_store", 0):  # C [M, N], contiguous (the caller's new tensor), through its map: encoded per call
        maps += (c_map(c.dtype, M, N, t),)
    sz = sizes({"M": M, "N": N, "K": K}, t)
    vals = {"a": a.data_ptr(), "b": b.data_ptr(), "c": 0, **sz}
    return ck.module().prepare(vals, maps, sz["NTILES"], out="c")


# ---------------------------------------------------------------------------------------------- the table


def _shape_error(name: str, got: Any, want: tuple[int, ...], what: str) -> ShapeError:
    return ShapeError(f"{name}: {what} must be {want}, got {tuple(got)}")


def mamba_params(c: ShapeClass, x: Any, BC: Any, dt: Any, dA_cumsum: Any, cb: Any = None, states: Any = None
                 ) -> dict[str, Any]:
    """The operator parameters of a Mamba2 chunk-kernel call of class ``c`` (mamba_ssm's layouts: x (b, L, h, p),
    B / C (b, L, g, n), dt / dA_cumsum (b, h, nc, chunk); ChunkScan's cb (b, nc, g, chunk, chunk) and states
    (b, nc, h, p, n)), after checking every shape against them; ShapeError naming the tensor otherwise, or for a
    shape beyond the kernels' 32-bit indices."""
    from .cuda import chunk_scan as cs
    from .cuda import chunk_state as st

    b, L, h, p = x.shape
    g, n, Q = BC.shape[2], BC.shape[3], c.chunk
    nc = -(-L // Q)
    name = "mamba_chunk_scan" if c.op == "mamba2_chunk_scan" else "mamba_chunk_state"
    want = {"B/C": (BC, (b, L, g, n)), "dt": (dt, (b, h, nc, Q)), "dA_cumsum": (dA_cumsum, (b, h, nc, Q))}
    if cb is not None:
        want |= {"cb": (cb, (b, nc, g, Q, Q)), "states": (states, (b, nc, h, p, n))}
    for k, (t, shape) in want.items():
        if tuple(t.shape) != shape:
            raise _shape_error(name, t.shape, shape, f"{k}'s shape (x {tuple(x.shape)}, chunk {Q})")
    if g < 1 or h % g:
        raise ShapeError(f"{name}: heads={h} is not a multiple of ngroups={g}")
    params = {"batch": b, "seq": L, "heads": h, "head_dim": p, "d_state": n, "chunk": Q, "groups": g,
              "dtype": c.dtype}
    err = (cs if cb is not None else st).index_error(params)
    if err:
        raise ShapeError(err + ": split the batch")
    return params


def chunk_scan(cb: Any, x: Any, dt: Any, dA_cumsum: Any, C: Any, states: Any, out: Any, c: ShapeClass) -> Any:
    """Mamba2 ChunkScan with class ``c``'s generic kernel (mamba_ssm's layouts, see ``mamba_params``): cb, x, C,
    states and ``out`` (b, L, h, p) contiguous in the class's dtype, dt / dA_cumsum contiguous float32, all
    16-byte aligned (the caller converts and checks). Returns ``out``."""
    chunk_scan_launch(cb, x, dt, dA_cumsum, C, states, c)(current_stream(x.get_device()), out.data_ptr())
    return out


def chunk_scan_launch(cb: Any, x: Any, dt: Any, dA_cumsum: Any, C: Any, states: Any, c: ShapeClass) -> Any:
    """The prepared launch of ``chunk_scan`` for these inputs, kept per (addresses, shapes); call it with the
    stream and the output's address."""
    ts = (cb, x, dt, dA_cumsum, C, states)
    key = ("scan", c, *(t.data_ptr() for t in ts), *(t.shape for t in ts))
    ln = _LAUNCHES.get(key)
    if ln is None:
        from .cuda.chunk_scan import maps, sizes

        p = mamba_params(c, x, C, dt, dA_cumsum, cb, states)
        ck = kernel(c)
        sz = sizes(p, ck.ir.tiling)
        vals = {"cb": cb.data_ptr(), "x": x.data_ptr(), "c": C.data_ptr(), "states": states.data_ptr(),
                "dt": dt.data_ptr(), "dA": dA_cumsum.data_ptr(), "out": 0, **sz}
        ln = _remember(key, ck.module().prepare(vals, maps(p, ck.ir.tiling), sz["NTILES"], out="out"))
    return ln


def chunk_state(B: Any, x: Any, dt: Any, dA_cumsum: Any, out: Any, c: ShapeClass) -> Any:
    """Mamba2 ChunkState with class ``c``'s generic kernel: states ``out`` (b, nc, h, p, n) float32, contiguous,
    from x (b, L, h, p), B (b, L, g, n) contiguous in the class's dtype and dt / dA_cumsum (b, h, nc, chunk)
    contiguous float32 (the caller converts and checks). Returns ``out``."""
    chunk_state_launch(B, x, dt, dA_cumsum, c)(current_stream(x.get_device()), out.data_ptr())
    return out


def chunk_state_launch(B: Any, x: Any, dt: Any, dA_cumsum: Any, c: ShapeClass) -> Any:
    """The prepared launch of ``chunk_state`` for these inputs; call it with the stream and the output's address."""
    ts = (B, x, dt, dA_cumsum)
    key = ("state", c, *(t.data_ptr() for t in ts), *(t.shape for t in ts))
    ln = _LAUNCHES.get(key)
    if ln is None:
        from .cuda.chunk_state import maps, sizes

        p = mamba_params(c, x, B, dt, dA_cumsum)
        ck = kernel(c)
        sz = sizes(p, ck.ir.tiling)
        vals = {"x": x.data_ptr(), "b": B.data_ptr(), "dt": dt.data_ptr(), "da": dA_cumsum.data_ptr(), "out": 0,
                **sz}
        ln = _remember(key, ck.module().prepare(vals, maps(p, ck.ir.tiling), sz["NTILES"], out="out"))
    return ln


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def _picked(key: str, only: str) -> bool:
    """Whether a class key is among ``only``'s: every key when empty, else those containing one of its comma-separated
    parts."""
    return not only or any(x and x in key for x in only.split(","))


def build_table(out: Path = TABLE, time_limit: float = SOLVE_TIME_LIMIT, only: str = "") -> dict[str, Any]:
    """Solve every class (``only``: keys containing that text, or one of several comma-separated) and write the
    table, with each generic kernel's ptxas numbers where nvcc is installed. The solves run with the compiler in the
    loop (on the exact-shape kernel of the representative; the register model alone picks tilings that spill); the
    class's generic kernel is compiled too, and one that still spills or serialises is an error."""
    table = load_table(out) if out.exists() else {"classes": {}}
    solved: dict[ShapeClass, dict[str, Any]] = {}
    for c in classes():
        if not _picked(c.key, only):
            continue
        # the cost model does not tell fp16 from bf16 (both 2 bytes, same tensor-core rate): one solve serves both
        twin = dataclasses.replace(c, dtype=DTYPES[0])
        if twin in solved:
            entry = json.loads(json.dumps(solved[twin]))
            entry["plan"]["params"]["dtype"] = c.dtype
            entry["representative"]["dtype"] = c.dtype
            entry["solved_as"] = twin.key
        else:
            entry = solved[c] = solve(c, time_limit)
        plan = KernelPlan.from_json(json.dumps(entry["plan"]))
        _KERNELS[c] = _build(c, plan)
        try:
            rep = compile_class(c)
        except PtsolveError as e:  # no nvcc: the table still says what was solved
            rep = {"not compiled": str(e).splitlines()[0]}
        if rep.get("spill_stores") or rep.get("wgmma_serialized"):
            raise PtsolveError(f"{c.key}: the generic kernel of the solved schedule spills or serialises ({rep})")
        entry["generic_ptxas"] = rep
        table["classes"][c.key] = entry
        print(f"{c.key}: {entry['status']} {entry['predicted_us']} us tiling {plan.tiling} {rep}", flush=True)
    table["hw"] = HW
    table["made"] = (f"python3 -m codegen.generic table, {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC, "
                     f"commit {_commit()}")
    out.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    return table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m codegen.generic", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("table", help="solve every shape class and write the schedule table")
    t.add_argument("--out", type=Path, default=TABLE)
    t.add_argument("--time-limit", type=float, default=SOLVE_TIME_LIMIT)
    t.add_argument("--only", default="", help="only the classes whose key contains this text (or one of several, "
                   "comma-separated)")
    p = sub.add_parser("precompile", help="compile every class's generic kernel into $PTSOLVE_CACHE_DIR")
    p.add_argument("--only", default="")
    a = ap.parse_args(argv)
    if a.cmd == "table":
        build_table(a.out, a.time_limit, a.only)
    else:
        for c in classes():
            if _picked(c.key, a.only):
                print(c.key, compile_class(c), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
