"""Mamba2 SSD's parameters, shared by its two chunk kernels (the two the paper schedules), each an operator of its
own: ChunkScan (ptsolve.ops.chunk_scan) and ChunkState (ptsolve.ops.chunk_state).
"""
from __future__ import annotations

from typing import Any

from .. import arguments
from ..errors import ShapeError
from .base import WG_ROWS, cdiv, check_keys, dtype_ok, positive

KEYS = ("batch", "seq", "heads", "head_dim", "d_state", "chunk", "groups")
E = 2  # fp16/bf16 activations; dA cumsum and dt are fp32


def validate(p: dict[str, Any]) -> dict[str, Any]:
    """Mamba2 SSD's parameters with their defaults filled, checked (both chunk kernels take them)."""
    p = check_keys("mamba2", p, KEYS[:-1], {"groups": 1, "dtype": "fp16"})
    dtype_ok(p["dtype"])  # fp16 and bf16 move the same bytes: the model does not depend on which
    positive(**{k: p[k] for k in KEYS})
    if p["heads"] % p["groups"]:
        raise ShapeError(f"mamba2: heads={p['heads']} is not divisible by groups={p['groups']}")
    for k in ("head_dim", "d_state", "chunk"):
        if p[k] % 16:
            raise ShapeError(f"mamba2: {k}={p[k]} must be a multiple of 16 for the tensor cores")
    if p["chunk"] < 64:
        raise ShapeError(f"mamba2: chunk={p['chunk']} must be at least 64")
    blocks = max(cdiv(p["chunk"], WG_ROWS), cdiv(p["d_state"], WG_ROWS))  # CTAs per (batch, chunk, head), at most
    T = cdiv(p["chunk"], 32)
    arguments.size("mamba2", p["batch"] * cdiv(p["seq"], p["chunk"]) * p["heads"] * blocks,
                "batch·seq·heads (and chunk or d_state)", 20 * T * T, "chunk")
    return p
