"""FlashAttention-3's Hopper interface (``flash_attn_interface``) over ptsolve's kernels: change one import line.

```python
from ptsolve.flash_attn_interface import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
```

The three functions take FlashAttention-3's arguments, with its names, order and defaults, and return what it returns
(``out``; ``(out, softmax_lse)`` where it would). What ptsolve's kernels do not do yet is refused with a
``NotImplementedError`` naming the argument, before any work starts (issue "FlashAttention's interface"): FP8 inputs
(``q_descale`` / ``k_descale`` / ``v_descale``), ``qv`` (MLA's absorbed query: head_dim 64 with a head_dim_v of 512,
sizes ptsolve's kernels do not build), ``attention_chunk`` with a paged cache beyond one-query steps on pages that
divide the chunk, and the backward pass (inputs that require grad). ``num_splits``, ``pack_gqa``,
``deterministic`` and ``scheduler_metadata`` (FA3's precomputed tile schedule, ``get_scheduler_metadata``) are
FlashAttention-3's tuning knobs and ask nothing of the result: ptsolve chooses its own splits, packing and tile
order, and its forward pass is deterministic, so they are accepted and have no effect.
What runs is ``ptsolve.torch``: head_dim 64, 96, 128, 192 or 256, fp16 or bf16, causal masks bottom-right aligned,
GQA / MQA, ``softcap``, ``window_size`` (sliding window, with or without causal), varlen's ``seqused_q`` /
``seqused_k``; ``flash_attn_with_kvcache`` also appends ``k`` / ``v`` (with rotary) and takes ``cache_batch_idx``,
``cache_leftpad``, ``return_softmax_lse`` and varlen queries and new keys (``cu_seqlens_q`` with ``max_seqlen_q``,
``cu_seqlens_k_new``), and a paged cache (``page_table``, pages of 8–256 keys: decode steps only). Decode steps of
at most 16 positions at head_dim 64 / 128, paged or not, plain or with a softcap (Gemma-2's), run the split-KV decode
kernel; the rest the varlen kernel over the cache (``ptsolve.torch.flash_attention_kvcache``).

``attention_chunk`` (Llama-4's chunked local attention, FlashAttention-3's semantics) runs in all three: query i of a
sequence, at p = i + seqlen_k − seqlen_q (the bottom-right alignment), sees only keys ⌊p / C⌋·C .. ⌊p / C⌋·C + C − 1
of its sequence (counted from ``cache_leftpad`` in the kv-cache call; a query with p < 0 sees none), together with
``causal``, ``window_size`` and ``softcap``. The mask is block-diagonal, so each (sequence, chunk) runs as its own
sequence of the varlen kernel (no new kernel; a dense call whose queries all fall in one chunk, a decode step
mostly, runs the dense kernels on that chunk's keys, split-KV decode included). In the kv-cache call a chunk starts
at a key only the device knows, and the split-KV decode kernel reads keys from a sequence's first: a one-query decode
step runs it on a page table shifted to the chunk's first page (no key copied; ``page_table``'s, or a contiguous
cache seen as pages of 16–256 keys where one divides the cache and the chunk), the rest the varlen kernel over the
cache (no split-KV). Paged calls with a chunk of several queries (they may straddle a chunk's edge) or on pages that
do not divide the chunk are refused. No host sync: the pieces' offsets and tables are computed on the device.
``sm_margin`` (SMs left free for other work, e.g. communication kernels) runs in all three, as FlashAttention-3's:
the SM count the persistent kernels' grids fill and split-KV decode's pieces are chosen for is the device's less the
margin, for that call (its launches kept apart from those of calls without it; nothing is recompiled). A kernel of
one CTA per tile keeps its grid, so there, as in FlashAttention-3, the margin only changes the split heuristics.
A margin of the device's SM count or more is a ``ptsolve.errors.ShapeError``.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache"]

# the value of each refused argument that asks for nothing (the rest: None)
_WHY = {"qv": "FlashAttention-3's qv is MLA's absorbed query (head_dim 64 with a head_dim_v of 512), sizes "
              "ptsolve's kernels do not build",
        "q_descale": "FP8 (e4m3) attention is not built by ptsolve yet; give fp16 / bf16 inputs",
        "k_descale": "FP8 (e4m3) attention is not built by ptsolve yet; give fp16 / bf16 inputs",
        "v_descale": "FP8 (e4m3) attention is not built by ptsolve yet; give fp16 / bf16 inputs"}
_IDLE = {"window_size": (-1, -1), "attention_chunk": 0, "softcap": 0.0, "sm_margin": 0, "return_attn_probs": False,
         "return_softmax_lse": False}


def _refuse(fn: str, given: Mapping[str, Any]) -> None:
    """NotImplementedError for the first argument in ``given`` that asks for what ptsolve does not do."""
    for name, value in given.items():
        idle = _IDLE.get(name)
        asks = value is not None if idle is None else (tuple(value) if name == "window_size" else value) != idle
        if asks:
            why = f": {_WHY[name]}" if name in _WHY else ""
            raise NotImplementedError(f"{fn}: {name}={_show(value)} is not supported by ptsolve yet{why} (leave it "
                                      f"at {idle!r}; ptsolve.flash_attn_interface lists what runs)")


def _show(value: Any) -> str:
    shape = getattr(value, "shape", None)
    return f"<tensor {tuple(shape)}>" if shape is not None else repr(value)


def _no_grad(fn: str, **tensors: Any) -> None:
    for name, t in tensors.items():
        if getattr(t, "requires_grad", False):
            raise NotImplementedError(f"{fn}: {name} requires grad; ptsolve's attention is forward only (run it under "
                                      "torch.no_grad() or detach the inputs)")


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None, k_descale=None,
                    v_descale=None, window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1,
                    pack_gqa=None, deterministic=False, sm_margin=0, return_attn_probs=False):
    """softmax(q kᵀ · softmax_scale) v as FlashAttention-3's ``flash_attn_func``: q [B, Sq, H, D], k / v
    [B, Skv, Hkv, D] → out [B, Sq, H, D] (``ptsolve.torch.flash_attention``)."""
    _refuse("flash_attn_func", {"qv": qv, "q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale})
    _no_grad("flash_attn_func", q=q, k=k, v=v)
    from . import torch as pt

    return pt.flash_attention(q, k, v, causal=causal, softmax_scale=softmax_scale, return_lse=bool(return_attn_probs),
                              softcap=softcap, window_size=tuple(window_size), attention_chunk=attention_chunk,
                              sm_margin=sm_margin)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q=None,
                           seqused_k=None, softmax_scale=None, causal=False, qv=None, q_descale=None, k_descale=None,
                           v_descale=None, window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1,
                           pack_gqa=None, deterministic=False, sm_margin=0, return_attn_probs=False):
    """Packed variable-length batches as FlashAttention-3's ``flash_attn_varlen_func``: q [total_q, H, D], k / v
    [total_k, Hkv, D], int32 ``cu_seqlens_*`` [B + 1] (``ptsolve.torch.flash_attention_varlen``)."""
    _refuse("flash_attn_varlen_func", {"qv": qv, "q_descale": q_descale, "k_descale": k_descale,
                                       "v_descale": v_descale})
    _no_grad("flash_attn_varlen_func", q=q, k=k, v=v)
    from . import torch as pt

    return pt.flash_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
                                     softmax_scale=softmax_scale, return_lse=bool(return_attn_probs),
                                     seqused_q=seqused_q, seqused_k=seqused_k, softcap=softcap,
                                     window_size=tuple(window_size), attention_chunk=attention_chunk,
                                     sm_margin=sm_margin)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, page_table=None,
                            cu_seqlens_q=None, cu_seqlens_k_new=None, max_seqlen_q=None, rotary_seqlens=None,
                            q_descale=None, k_descale=None, v_descale=None, softmax_scale=None, causal=False,
                            window_size=(-1, -1), attention_chunk=0, softcap=0.0, rotary_interleaved=True,
                            scheduler_metadata=None, num_splits=0, pack_gqa=None, sm_margin=0,
                            return_softmax_lse=False):
    """Attention against a preallocated cache as FlashAttention-3's ``flash_attn_with_kvcache``: q [B, Sq, H, D]
    (or [total_q, H, D] with ``cu_seqlens_q`` and ``max_seqlen_q``), k_cache / v_cache [B_cache, S_cache, Hkv, D],
    ``cache_seqlens`` an int or int32 [B] (None: the whole cache), ``k`` / ``v`` appended into the cache (in place;
    packed by ``cu_seqlens_k_new`` where given) with ``rotary_cos`` / ``rotary_sin`` applied, ``cache_batch_idx``,
    ``cache_leftpad``, ``softcap``, ``window_size``, ``attention_chunk`` (with ``page_table``: one-query steps on
    pages that divide it), ``sm_margin`` and the LSE (``ptsolve.torch.flash_attention_kvcache``)."""
    _refuse("flash_attn_with_kvcache", {"qv": qv, "q_descale": q_descale, "k_descale": k_descale,
                                        "v_descale": v_descale})
    _no_grad("flash_attn_with_kvcache", q=q, k_cache=k_cache, v_cache=v_cache)
    from . import torch as pt

    cap = k_cache.shape[1] * (1 if page_table is None else page_table.shape[1])  # a paged cache: all its pages
    lens = cap if cache_seqlens is None else cache_seqlens
    return pt.flash_attention_kvcache(q, k_cache, v_cache, lens, causal=causal, softmax_scale=softmax_scale,
                                      softcap=softcap, window_size=tuple(window_size),
                                      return_lse=bool(return_softmax_lse), cache_batch_idx=cache_batch_idx,
                                      cache_leftpad=cache_leftpad, k=k, v=v, rotary_cos=rotary_cos,
                                      rotary_sin=rotary_sin, rotary_interleaved=rotary_interleaved,
                                      rotary_seqlens=rotary_seqlens, cu_seqlens_q=cu_seqlens_q,
                                      max_seqlen_q=max_seqlen_q, cu_seqlens_k_new=cu_seqlens_k_new,
                                      page_table=page_table, attention_chunk=attention_chunk, sm_margin=sm_margin)
