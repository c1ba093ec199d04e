"""What every operator's harness shares: the error measure every check uses (``rel_err``, ``TOL``), the interleaved
CUDA timing every measurement uses (``time_many``), the parallel nvcc of many plans (``precompile``), the checks of
a tensor against the shape a kernel was built for (``need``), and the table of operators that have a harness
(``register``: one line in each operator's module).

Correctness: every configuration is compared with a float32 (or float64) torch reference on fresh random inputs,
the output poisoned with NaN before the run (relative Frobenius error <= ``TOL``, NaN never passes). Timing
(``time_many``): warm-up, then 20 rounds in which every candidate (our schedules and the baselines, in the same
process) runs a block of back-to-back launches between CUDA events, inputs rotating over several sets so that
repeated runs do not hit L2; the median per-call time is reported.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ptsolve.errors import DeviceError

TOL = 1e-2


@dataclass(frozen=True)
class OpHarness:
    """One operator's harness. ``random_args(params, seed)``: fresh device tensors for every pointer its kernel takes,
    keyed by argument name (outputs poisoned with NaN); ``check(label, plan)``: the plan's kernel checked on the
    reduced shape (``{"rel_err", "ok", ...}``); ``reduced(params)``: that shape's parameters; ``hand(params)``: the
    hand-written plan measurements compare against."""

    random_args: Callable[[dict[str, Any], int], dict[str, Any]]
    check: Callable[[str, Any], dict[str, Any]] | None = None
    reduced: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    hand: Callable[[dict[str, Any]], Any] | None = None


HARNESS: dict[str, OpHarness] = {}


def register(op: str, h: OpHarness) -> None:
    """Give operator ``op`` its harness (one line in the operator's module)."""
    HARNESS[op] = h


def entry(op: str, what: str) -> Callable[..., Any]:
    """Operator ``op``'s harness function ``what``; DeviceError where it has none."""
    fn = getattr(HARNESS.get(op), what, None)
    if fn is None:
        raise DeviceError(f"operator {op!r} has no {what} in the kernel harness (codegen.harness)")
    return fn


def rel_err(out: Any, ref: Any, block: int = 1 << 26) -> float:
    """‖out − ref‖_F / ‖ref‖_F in float64; NaN if out has any NaN/Inf (so it never passes). Summed over blocks
    of ``block`` elements, so that a multi-GB output is not copied to float64 whole."""
    import torch
    if out.shape != ref.shape:
        raise ValueError(f"rel_err: output shape {tuple(out.shape)} differs from the reference's {tuple(ref.shape)}")
    o, r = out.reshape(-1), ref.reshape(-1)
    num = den = 0.0
    for i in range(0, o.numel(), block):
        ob, rb = o[i:i + block].double(), r[i:i + block].double()
        if not torch.isfinite(ob).all():
            return float("nan")
        num += float(((ob - rb) ** 2).sum())
        den += float((rb ** 2).sum())
    return (num / den) ** 0.5 if den else float("nan")


def time_ms(fn: Callable[[int], Any], nsets: int) -> float:
    """Median milliseconds per call of ``fn(i % nsets)`` (see ``time_many``)."""
    return time_many({"x": fn}, nsets)["x"]


def time_many(fns: dict[str, Callable[[int], Any]], nsets: int, warmup: int = 5, rounds: int = 20,
              ctxs: dict[str, Callable[[], Any]] | None = None, block_ms: float = 2.0,
              graphs: bool = False) -> dict[str, float]:
    """Median milliseconds per call of each ``fn(i % nsets)``.

    Candidates are interleaved round by round, in an order rotated each round (clock or temperature drift and
    position in the round hit all alike). In a round each
    candidate runs ``reps`` back-to-back launches between two CUDA events (``reps`` sized so that a block
    lasts about ``block_ms``), so host launch latency is hidden for kernels longer than it; inputs rotate over
    ``nsets`` sets. ``ctxs[k]()`` is a context entered around candidate k's block (e.g. an SDPA backend).
    ``graphs`` captures each block once as a CUDA graph and replays it, so that the Python cost of a launch
    (argument checks, a Triton wrapper's allocations) is not timed even where it exceeds the kernel's; the
    warm-up (compilation, autotuning) runs before the capture.
    """
    import contextlib

    import torch
    ctxs = ctxs or {}
    reps: dict[str, int] = {}
    for k, fn in fns.items():
        with ctxs.get(k, contextlib.nullcontext)():
            for i in range(warmup):
                fn(i % nsets)
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for i in range(3):
                fn(i % nsets)
            e1.record()
            e1.synchronize()
        reps[k] = max(1, min(100, int(block_ms / max(e0.elapsed_time(e1) / 3, 1e-3))))
    def block(k: str) -> None:
        for i in range(reps[k]):
            fns[k](i % nsets)

    blocks: dict[str, Callable[[], Any]] = {k: (lambda k=k: block(k)) for k in fns}
    if graphs:
        for k in fns:
            g = torch.cuda.CUDAGraph()
            with ctxs.get(k, contextlib.nullcontext)(), torch.cuda.graph(g):
                block(k)
            blocks[k] = g.replay
        torch.cuda.synchronize()
    times: dict[str, list[float]] = {k: [] for k in fns}
    keys = list(fns)
    for r in range(rounds):
        # the order rotates: a candidate is not always the one that follows the same neighbour (clock and
        # power state after a long kernel) or the host's synchronisation gap
        for k in keys[r % len(keys):] + keys[:r % len(keys)]:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with ctxs.get(k, contextlib.nullcontext)():
                e0.record()
                blocks[k]()
                e1.record()
            e1.synchronize()
            times[k].append(e0.elapsed_time(e1) / reps[k])
    return {k: sorted(v)[len(v) // 2] for k, v in times.items()}


def precompile(plans: list[Any]) -> None:
    """Compile (cached) many plans in parallel before timing, so nvcc does not run serially later."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    from ..cuda import emit
    from ..runtime import compile_kernel
    sources = {ks.source: ks for ks in map(emit, plans)}  # plans with equal kernels compile once
    with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 2)) as ex:
        list(ex.map(compile_kernel, sources.values()))


def torch_dtype(dt: str) -> Any:
    """The torch dtype of a kernel dtype name (fp16, bf16)."""
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16}[dt]


def need(t: Any, name: str, shape: tuple[int, ...], dt: str, convert: bool = False) -> Any:
    """``t`` checked against the shape and dtype the kernel was built for (DeviceError otherwise; ``convert``
    casts another float dtype instead) and 16-byte aligned for TMA / bulk copies; returns it."""
    import torch

    want = torch.float32 if dt == "fp32" else torch_dtype(dt)
    if not isinstance(t, torch.Tensor) or not t.is_cuda:
        raise DeviceError(f"{name} must be a CUDA torch tensor")
    if convert and t.dtype != want and t.dtype.is_floating_point:
        t = t.to(want)
    if tuple(t.shape) != shape or t.dtype != want or not t.is_contiguous():
        raise DeviceError(f"kernel was built for {name} of shape {shape} {dt} contiguous; got {tuple(t.shape)} "
                          f"{t.dtype}{'' if t.is_contiguous() else ' non-contiguous'}: emit a plan for this shape")
    if t.data_ptr() % 16:
        raise DeviceError(f"{name} must be 16-byte aligned (a view with an odd storage offset?); pass a copy")
    return t


def stream() -> int:
    """torch's current CUDA stream, as a raw handle."""
    import torch

    return int(torch.cuda.current_stream().cuda_stream)
