"""Operator builders. Each returns an Operator: ``.tilings()``, ``.graph(tiling)``, ``.propagate(out_tile)``."""
from __future__ import annotations

import importlib
import pkgutil

from .base import REGISTRY, Operator, make

# Every module here registers its operator when imported (its last line): found, not listed, so a new operator is its
# file alone. Sorted, so the registry's order (and everything derived from it) is the same on every machine.
for _m in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_m}")


def gemm(M: int, N: int, K: int, dtype: str = "fp16") -> Operator:
    """C[M,N] = A[M,K]·B[K,N] with fp32 accumulation."""
    return make("gemm", M=M, N=N, K=K, dtype=dtype)


def flash_attention(batch: int, heads: int, kv_heads: int | None = None, seq_q: int | None = None,
                    seq_kv: int | None = None, head_dim: int = 128, causal: bool = False, dtype: str = "fp16",
                    seq: int | None = None) -> Operator:
    """FlashAttention forward; ``seq`` sets both sequence lengths; kv_heads < heads is GQA."""
    p = {"batch": batch, "heads": heads, "head_dim": head_dim, "causal": causal, "dtype": dtype}
    for k, v in (("kv_heads", kv_heads), ("seq_q", seq_q), ("seq_kv", seq_kv), ("seq", seq)):
        if v is not None:
            p[k] = v
    return make("flash_attention", **p)


def flash_decode(batch: int, heads: int, kv_heads: int | None = None, seq_q: int = 1, seq_kv: int | None = None,
                 head_dim: int = 128, causal: bool = False, dtype: str = "fp16", softcap: float = 0.0) -> Operator:
    """Split-KV attention (ptsolve.ops.decode): ``seq_q`` query positions (1-16 for decode; any for a
    low-occupancy prefill) against ``seq_kv`` keys, the GQA group's heads packed into one query tile and the
    keys split across CTAs with a combine step; the tiling key ``splits`` is the solver's choice. ``softcap`` > 0
    caps the scores (Gemma-2's softcap · tanh(s · scale / softcap))."""
    p = {"batch": batch, "heads": heads, "seq_q": seq_q, "head_dim": head_dim, "causal": causal, "dtype": dtype,
         "softcap": softcap}
    for k, v in (("kv_heads", kv_heads), ("seq_kv", seq_kv)):
        if v is not None:
            p[k] = v
    return make("flash_decode", **p)


def mamba2_chunk_scan(batch: int, seq: int, heads: int, head_dim: int, d_state: int, chunk: int,
                      groups: int = 1) -> Operator:
    """Mamba2 SSD ChunkScan (the output of each chunk from CB, x and the chunk states)."""
    return make("mamba2_chunk_scan", batch=batch, seq=seq, heads=heads, head_dim=head_dim, d_state=d_state,
                chunk=chunk, groups=groups)


def mamba2_chunk_state(batch: int, seq: int, heads: int, head_dim: int, d_state: int, chunk: int,
                       groups: int = 1) -> Operator:
    """Mamba2 SSD ChunkState (the state each chunk contributes)."""
    return make("mamba2_chunk_state", batch=batch, seq=seq, heads=heads, head_dim=head_dim, d_state=d_state,
                chunk=chunk, groups=groups)


__all__ = ["REGISTRY", "Operator", "flash_attention", "flash_decode", "gemm", "mamba2_chunk_scan",
           "mamba2_chunk_state", "make"]
