"""The launch cache: a shape's prepared launch (``codegen.runtime.Launch``) kept per inputs, torch's current stream as
a raw handle, and the scratch buffers that launches of one kernel share.

A launcher builds the tensor maps and arguments of a shape once and keeps the prepared launch keyed by the inputs'
(addresses, shapes, strides) and the scalars (the output's address is written into it per call): a warm call is a
dict lookup and a ``cuLaunchKernel`` on the current stream.
"""
from __future__ import annotations

from typing import Any

# (inputs' addresses, shapes, strides, scalars) -> the prepared launch; a launcher's warm call is one lookup here
LAUNCHES: dict[tuple[Any, ...], Any] = {}
_MAX_LAUNCHES = 1024


class Provisional:
    """A launch of a shape whose exact-shape schedule is still being solved (``exact``): it runs the class's kernel
    and is kept by nobody, so the call after the answer lands prepares the exact one."""

    __slots__ = ("ln",)

    def __init__(self, ln: Any):
        self.ln = ln

    def __call__(self, stream: int, out: int | None = None) -> None:
        self.ln(stream, out)


def keep(key: tuple[Any, ...], ln: Any, final: bool = True) -> Any:
    """Keep launch ``ln`` under ``key`` and return it (the cache is emptied when full: a model's layers re-prepare
    theirs once); a launch that is not ``final`` is returned as a ``Provisional`` and not kept."""
    if not final:
        return Provisional(ln)
    if len(LAUNCHES) >= _MAX_LAUNCHES:
        LAUNCHES.clear()
    LAUNCHES[key] = ln
    return ln


def _stream_fn() -> Any:
    import torch
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return lambda dev: raw(dev)
    return lambda dev: torch.cuda.current_stream(dev).cuda_stream


def tma_strides(strides: tuple[int, ...]) -> bool:
    """Can a tensor map describe a tensor of these element strides (fp16 / bf16: the last dim contiguous, the others
    positive multiples of 8 elements, 16 bytes)? Its address must also be 16-byte aligned, which the caller checks."""
    return strides[-1] == 1 and all(s > 0 and s % 8 == 0 for s in strides[:-1])


_STREAM: list[Any] = []


def current_stream(device: int) -> int:
    """The raw handle of torch's current CUDA stream on ``device``."""
    if not _STREAM:
        _STREAM.append(_stream_fn())
    return _STREAM[0](device)


_SCRATCH: dict[tuple[int, str, str], list[tuple[int, int]]] = {}


def scratch(device: Any, kernel_name: str, name: str, nbytes: int) -> int:
    """A zero-filled device buffer of at least ``nbytes`` for scratch ``name`` of a kernel, shared by its launches
    (the kernel leaves its counters at zero). Grown by allocating a larger one; the smaller ones are kept, since a
    prepared launch (or a captured CUDA graph) may still point into them. From the driver (``runtime.zeroed``), not
    torch's allocator: a first launch inside torch.compile's CUDA-graph warm-up must not leave a buffer in its pool."""
    import torch

    from codegen.runtime import zeroed

    held = _SCRATCH.setdefault((device.index or 0, kernel_name, name), [])
    if not held or held[-1][1] < nbytes:
        size = max(nbytes, 2 * held[-1][1] if held else 0, 1 << 12)
        with torch.cuda.device(device):
            held.append((zeroed(size, current_stream(device.index or 0)), size))
    return held[-1][0]
