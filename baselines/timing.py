"""CUDA-event timing of one GPU callable, with an L2 flush between runs (DESIGN.md §6).

torch is imported inside the functions, so this module imports on a machine without torch.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

# H200 L2 is 60 MB (50 MB on H100); writing 256 MiB evicts all of it, with margin.
L2_FLUSH_BYTES = 256 * 1024 * 1024

_flush_buf: Any = None


def _flush_buffer() -> Any:
    """A device buffer larger than L2, allocated once and reused (allocation is not free)."""
    global _flush_buf
    import torch

    if _flush_buf is None:
        _flush_buf = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    return _flush_buf


def _quantile(sorted_ms: list[float], q: float) -> float:
    """Linear-interpolated quantile of an already sorted list."""
    if len(sorted_ms) == 1:
        return sorted_ms[0]
    pos = q * (len(sorted_ms) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_ms) - 1)
    return sorted_ms[lo] + (sorted_ms[hi] - sorted_ms[lo]) * (pos - lo)


def bench(
    fn: Callable[[], Any],
    *,
    warmup: int = 5,
    rep: int = 50,
    flush_l2: bool = True,
    max_total_ms: float | None = None,
) -> dict[str, float | int]:
    """Time ``fn`` (which launches GPU work on the current stream) with CUDA events.

    Runs ``fn`` ``warmup`` times untimed (compilation, autotuning, handle creation; at least twice), then
    ``rep`` times,
    each bracketed by its own pair of CUDA events. With ``flush_l2`` a 256 MiB buffer is overwritten
    before each timed run (outside the events), so every run starts from a cold L2 as in a real model
    step; the flush also keeps the GPU busy while the CPU enqueues ``fn``, hiding launch latency.
    ``max_total_ms`` caps the timed repetitions by an estimate from the warm-up (at least 5 kept),
    so that huge configs do not blow the time budget.

    Returns ``median_ms``, ``p20`` and ``p80`` (milliseconds per call of ``fn``) and ``n`` (timed runs).
    """
    import torch

    buf = _flush_buffer() if flush_l2 else None
    fn()  # first call apart: it may compile or autotune, which must not enter the per-call estimate
    torch.cuda.synchronize()
    t0 = torch.cuda.Event(enable_timing=True)
    t1 = torch.cuda.Event(enable_timing=True)
    n_warm = max(warmup - 1, 1)
    t0.record()
    for _ in range(n_warm):
        fn()
    t1.record()
    torch.cuda.synchronize()
    if max_total_ms is not None:
        per_call = t0.elapsed_time(t1) / n_warm
        rep = max(5, min(rep, int(max_total_ms / max(per_call, 1e-3))))

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(rep)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(rep)]
    for i in range(rep):
        if buf is not None:
            buf.zero_()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    return {
        "median_ms": statistics.median(times),
        "p20": _quantile(times, 0.2),
        "p80": _quantile(times, 0.8),
        "n": rep,
    }


def tflops(flops: int, ms: float) -> float:
    """TFLOP/s for ``flops`` floating-point operations done in ``ms`` milliseconds."""
    return flops / (ms * 1e9)
