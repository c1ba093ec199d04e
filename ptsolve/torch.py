"""PyTorch front door: ptsolve's shape-generic kernels as ``torch.library`` custom ops.

```python
import ptsolve.torch as pt
o = pt.flash_attention(q, k, v, causal=True)   # q [B, Sq, H, D], k / v [B, Skv, Hkv, D], fp16 or bf16, on an H100/H200
y = pt.gemm(x, w)                              # x [..., K] · wᵀ with w [N, K] (F.linear's layout)
out = pt.mamba_chunk_scan(cb, x, dt, dA_cumsum, C, states)   # mamba_ssm's layouts; also mamba_chunk_state
```

``flash_attention`` (dense), ``flash_attention_varlen`` (packed [total, H, D] with int32 ``cu_seqlens``, as
flash-attn's) and ``flash_attention_kvcache`` (decode against a preallocated cache, the lengths on the device) run
FlashAttention forward: softmax scale ``softmax_scale`` (default 1/sqrt(D)), causal masks
bottom-right aligned for any seq_q and seq_kv (a query row that sees no key is zeros, as FlashAttention returns),
GQA / MQA (heads a multiple of kv_heads), head_dim 64, 96, 128, 192 or 256. Dense attention of at most 16 query
positions (decode, speculative verification) with head_dim 64 or 128, with or without a softcap, runs the split-KV
decode kernel: a query
tile packs the GQA group's heads with the
positions, the keys are split across CTAs (how many pieces: the cost model per shape) and merged. The three
attention functions also take FlashAttention-3's ``attention_chunk`` (chunked local attention: each (sequence,
chunk) a sequence of the varlen kernel, ``_chunked``) and ``sm_margin`` (SMs left free: ``_margin``). ``gemm(a, b)`` is
a · bᵀ with K a multiple of 8 (N any: off the 16-byte pitch, a class that stores C from registers). Each call
picks its shape class's schedule (``ptsolve.serve``: the shipped table, or solved on first use where OR-Tools is
installed), compiles that class's kernel once (the cubin is cached
on disk, so a second process runs no nvcc) and launches it on ``torch.cuda.current_stream()``. The ops are
registered as ``torch.ops.ptsolve.*`` with fake (meta) implementations, so ``torch.compile(fullgraph=True)`` and
CUDA-graph capture work. Forward only (no autograd): an output never requires grad.

This module reaches the code generator only through the serving layer (``ptsolve.serve``), imported lazily inside
the ops' CUDA implementations: the rest of ptsolve stays the solver that never depends on its code generator; this
module is where a PyTorch user comes in. ``register_transformers()`` adds ``attn_implementation="ptsolve"`` to
Hugging Face transformers.
"""
from __future__ import annotations

import math
import weakref
from typing import Any, NamedTuple

import torch

from .errors import DeviceError, PtsolveError, ShapeError

__all__ = ["flash_attention", "flash_attention_varlen", "flash_attention_kvcache", "gemm", "mamba_chunk_scan",
           "mamba_chunk_scan_combined", "mamba_chunk_state", "register_transformers", "hf_attention"]

_DT = {torch.float16: "fp16", torch.bfloat16: "bf16"}


_GEN: list[Any] = []


def _gen() -> Any:
    """``ptsolve.serve``, imported on first use (kept: an import statement costs a warm call about a microsecond)."""
    if not _GEN:
        import ptsolve.serve as g  # the serving layer, where the code generator is reached (see the docstring)
        _GEN.append(g)
    return _GEN[0]


def _dtype(x: torch.Tensor, name: str) -> str:
    dt = _DT.get(x.dtype)
    if dt is None:
        raise ShapeError(f"{name} is {x.dtype}; ptsolve's kernels take torch.float16 or torch.bfloat16 "
                         f"(convert with {name}.half() or {name}.bfloat16())")
    return dt


def _same(name: str, xs: dict[str, torch.Tensor]) -> None:
    dts = {n: x.dtype for n, x in xs.items()}
    if len(set(dts.values())) > 1:
        raise ShapeError(f"{name}: the tensors' dtypes differ ({dts}); give them one dtype")
    devs = {n: str(x.device) for n, x in xs.items()}
    if len(set(devs.values())) > 1 or not next(iter(xs.values())).is_cuda:
        raise DeviceError(f"{name}: the tensors must be on one CUDA device, got {devs}")


def attention_class(q: torch.Tensor, k: torch.Tensor, causal: bool) -> Any:
    """The shape class of an attention call (q [..., H, D], k [..., Hkv, D])."""
    return _gen().attention_class(_dtype(q, "q"), q.shape[-1], causal, q.shape[-2], k.shape[-2])


_CHECKED: set[tuple[Any, ...]] = set()  # signatures (dtypes, devices, shapes, rank, causal) that passed the checks


def _check_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rank: int, causal: bool,
                     softmax_scale: float | None) -> float:
    """ShapeError / DeviceError for what the kernels cannot take; the softmax scale to use. A signature that passed
    once is not checked again (a model's prefill calls with new tensors of one signature every layer)."""
    sig = (q.dtype, k.dtype, v.dtype, q.device, k.device, v.device, q.shape, k.shape, v.shape, rank, causal)
    if sig not in _CHECKED:
        _check_signature(q, k, v, rank, causal)
        if len(_CHECKED) >= 4096:
            _CHECKED.clear()
        _CHECKED.add(sig)
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else float(softmax_scale)
    if not scale > 0 or math.isinf(scale):
        raise ShapeError(f"softmax_scale={softmax_scale!r}: the kernels take a finite scale > 0")
    return scale


def _check_signature(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rank: int, causal: bool) -> None:
    _same("flash_attention", {"q": q, "k": k, "v": v})
    what = "[B, S, H, D]" if rank == 4 else "[total, H, D]"
    if q.dim() != rank or k.dim() != rank or v.dim() != rank:
        raise ShapeError(f"q, k, v must be {what}; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape != v.shape:
        raise ShapeError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have one shape")
    if q.shape[-1] != k.shape[-1] or (rank == 4 and q.shape[0] != k.shape[0]):
        raise ShapeError(f"q {tuple(q.shape)} and k {tuple(k.shape)} disagree on batch or head_dim")
    attention_class(q, k, causal)  # head_dim, dtype and GQA are checked there


def _tma_ready(x: torch.Tensor) -> torch.Tensor:
    """``x`` when the tensor maps can describe it (last dim contiguous, other strides multiples of 16 bytes,
    16-byte aligned), else a contiguous copy."""
    return x if _ready(x) else x.contiguous()


# ---------------------------------------------------------------------------------------------- the ops
# Defined with torch.library's low-level API (a schema, a CUDA kernel, a fake kernel): torch.library.custom_op's
# wrapper costs ~25 µs a call on torch 2.11. In eager mode the public functions call the CUDA implementations
# directly (same code, no dispatcher: the host overhead the issue asks about); under torch.compile they go through
# the registered ops, whose fake kernels give the output's shape.

_LIB = torch.library.Library("ptsolve", "DEF")
# sm_margin (every attention op's last argument): SMs left free for other work, FlashAttention-3's (``_margin``)
_LIB.define("flash_attention(Tensor q, Tensor k, Tensor v, bool causal, float softmax_scale, float softcap=0.0, "
            "int sm_margin=0) -> Tensor")
_LIB.define("flash_attention_varlen(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
            "int max_seqlen_q, int max_seqlen_k, bool causal, float softmax_scale, int sm_margin=0) -> Tensor")
_LIB.define("flash_attention_kvcache(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cache_seqlens, bool causal, "
            "float softmax_scale, float softcap=0.0, int sm_margin=0) -> Tensor")
_LIB.define("flash_attention_paged(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cache_seqlens, Tensor page_table, "
            "bool causal, float softmax_scale, float softcap=0.0, int sm_margin=0) -> Tensor")
_LIB.define("flash_attention_lse(Tensor q, Tensor k, Tensor v, bool causal, float softmax_scale, int sm_margin=0) "
            "-> (Tensor, Tensor)")
_LIB.define("flash_attention_varlen_lse(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
            "int max_seqlen_q, int max_seqlen_k, bool causal, float softmax_scale, int sm_margin=0) "
            "-> (Tensor, Tensor)")
_LIB.define("flash_attention_features(Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, "
            "Tensor? seqused_q, Tensor? seqused_k, int max_seqlen_q, int max_seqlen_k, bool causal, "
            "float softmax_scale, float softcap, int window_left, int window_right, int sm_margin=0) "
            "-> (Tensor, Tensor)")
_LIB.define("gemm(Tensor a, Tensor b) -> Tensor")
_LIB.define("mamba_chunk_scan(Tensor cb, Tensor x, Tensor dt, Tensor dA_cumsum, Tensor C, Tensor states) -> Tensor")
_LIB.define("mamba_chunk_state(Tensor B, Tensor x, Tensor dt, Tensor dA_cumsum) -> Tensor")

_CLASSES: dict[tuple[Any, ...], Any] = {}


def _attn_class(q: torch.Tensor, k: torch.Tensor, causal: bool) -> Any:
    key = (q.dtype, q.shape[-1], causal, q.shape[-2], k.shape[-2])
    c = _CLASSES.get(key)
    if c is None:
        c = _CLASSES[key] = _gen().attention_class(_DT[q.dtype], q.shape[-1], causal, q.shape[-2], k.shape[-2])
    return c


def _decodes(q: torch.Tensor, k: torch.Tensor, causal: bool) -> bool:
    """Does dense attention of these shapes run the split-KV decode kernel: at most DECODE_MAX_SEQ_Q query positions
    (the GQA group's heads and the positions share one packed query tile, the keys are split across CTAs), every one
    of which sees a key?"""
    return q.shape[1] <= _gen().DECODE_MAX_SEQ_Q and not (causal and q.shape[1] > k.shape[1]) \
        and q.shape[-1] in _gen().DECODE_HEAD_DIMS


def _decode_class(q: torch.Tensor, k: torch.Tensor, causal: bool, softcap: float = 0.0) -> Any:
    """The split-KV decode class of these shapes (its softcap variant where ``softcap`` > 0)."""
    key = ("fd", q.dtype, q.shape[-1], causal, q.shape[-2], k.shape[-2], q.shape[1], softcap > 0)
    c = _CLASSES.get(key)
    if c is None:
        c = _CLASSES[key] = _gen().decode_class(_DT[q.dtype], q.shape[-1], causal, q.shape[-2], k.shape[-2],
                                                q.shape[1], softcap=softcap > 0)
    return c


def _flash_attention_cuda(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                          softmax_scale: float, softcap: float = 0.0, sm_margin: int = 0) -> torch.Tensor:
    out = _flash_attention_warm(q, k, v, causal, softmax_scale, softcap, sm_margin)
    return out if out is not None else _flash_attention_cold(q, k, v, causal, softmax_scale, softmax_scale, softcap,
                                                             sm_margin)


def _fast_key(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: Any,
              layout: tuple[Any, ...] | None = None, softcap: Any = 0.0, margin: int = 0) -> tuple[Any, ...]:
    """A kept launch's key (``_FAST``): the inputs' addresses and their layout (``_move_key``; given where the
    caller has it)."""
    return (q.data_ptr(), k.data_ptr(), v.data_ptr(), *(layout or _move_key(q, k, v, causal, scale, softcap, margin)))


def _flash_attention_warm(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                          scale: Any, softcap: Any = 0.0, margin: int = 0) -> torch.Tensor | None:
    """The output of a call that needs no preparing, else None: a decode step of a growing cache whose family is
    kept (``_GROW``: its launch re-targeted to the new keys; looked up first, since a decode step's inputs are new
    every step), or inputs whose launch is kept (``_FAST``). ``scale`` as the caller gave it (the keys hold the
    user's argument); ``softcap`` likewise (only a decode step has one here); ``margin``: the SMs the call leaves
    free (``_margin``), part of every key."""
    fam = _GROW.get(_grow_key(q, k, v, causal, scale, softcap, margin))
    if fam is not None and k.shape == v.shape:  # the family checks the tensors are TMA-ready
        out = _empty_like(q, memory_format=_CF)
        if fam(q, k, v, _raw_stream(q.get_device()), out.data_ptr()):
            return out
    layout = _move_key(q, k, v, causal, scale, softcap, margin)
    ln = _FAST.get(_fast_key(q, k, v, causal, scale, layout))
    if ln is not None:
        out = _empty_like(q, memory_format=_CF)
        ln(_raw_stream(q.get_device()), out.data_ptr())
        return out
    fam = _MOVE.get(layout)
    if fam is None:
        return None
    out = _empty_like(q, memory_format=_CF)
    return out if fam(q, k, v, _raw_stream(q.get_device()), out.data_ptr()) else None


def _move_key(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: Any,
              softcap: Any = 0.0, margin: int = 0) -> tuple[Any, ...]:
    """A dense call's layout (``_MOVE``; ``_fast_key`` adds the addresses): shapes, strides, dtypes, devices and the
    scalars as given (the SM margin among them: a launch leaving SMs free is not one that fills them)."""
    return (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype, v.dtype, q.get_device(),
            k.get_device(), v.get_device(), causal, scale, softcap, margin)


def _grow_key(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: Any,
              softcap: Any = 0.0, margin: int = 0) -> tuple[Any, ...]:
    """A decode family's key: the inputs but the keys' count, addresses and strides (``serve.DecodeFamily``)."""
    return (q.shape, q.stride(), k.shape[0], k.shape[2:], q.dtype, k.dtype, v.dtype, q.get_device(), k.get_device(),
            v.get_device(), causal, scale, softcap, margin)


def _ready(x: torch.Tensor) -> bool:
    """Can a tensor map describe ``x`` as it is (``_tma_ready``'s condition)?"""
    return x.data_ptr() % 16 == 0 and _gen().prepared.tma_strides(x.stride())


def _flash_attention_cold(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
                          given: Any, softcap: float = 0.0, margin: int = 0) -> torch.Tensor:
    """A call whose launch is not kept yet: prepare it, launch it, keep it (``_FAST``, or a decode step's family,
    ``_GROW``) where the inputs went to the kernel as they are (no copy); ``given``: the scale as the caller gave
    it (the keys'); ``softcap`` (> 0, validated): a decode step's, run by the split-KV kernel's softcap variant;
    ``margin``: SMs left free (``_margin``, validated), in every key."""
    out = _empty_like(q, memory_format=_CF)
    if out.numel() == 0:
        return out
    if k.shape[1] == 0:
        return out.zero_()  # no key at all: every row is zeros
    q2, k2, v2 = _tma_ready(q), _tma_ready(k), _tma_ready(v)
    dec = _decodes(q, k, causal)
    if softcap and not dec:  # flash_attention sends a softcap here only for a decode step
        raise PtsolveError(f"softcap={softcap} reached the dense path with q {tuple(q.shape)}, k {tuple(k.shape)}: "
                           "only a decode step runs it there; call ptsolve.torch.flash_attention")
    if dec and q2 is q and k2 is k and v2 is v:
        # a decode step: its launch becomes a family's that later steps of a growing cache re-target (a new launch
        # per step cost 125-247 us of host time, more than the kernel at short caches: bench study torch_decode)
        if len(_GROW) >= 4096:
            _GROW.clear()
        fam = _GROW[_grow_key(q, k, v, causal, given, softcap, margin)] = _gen().DecodeFamily(
            q, k, v, _decode_class(q, k, causal, softcap), scale, softcap, sm_margin=margin)
        if not fam(q, k, v, _raw_stream(q.get_device()), out.data_ptr()):
            raise PtsolveError(f"a decode family refused the call that made it: q {tuple(q.shape)}, k "
                               f"{tuple(k.shape)}")
        return out
    if dec:
        ln = _gen().decode_launch(q2, k2, v2, _decode_class(q, k, causal, softcap), scale, softcap=softcap,
                                  sm_margin=margin)
    else:
        ln = _gen().attention_launch(q2, k2, v2, _attn_class(q, k, causal), scale, sm_margin=margin)
    ln(_raw_stream(q.get_device()), out.data_ptr())
    if q2 is q and k2 is k and v2 is v:
        mk = _move_key(q, k, v, causal, given, softcap, margin)
        if _fast_put(_fast_key(q, k, v, causal, given, mk), ln) and not dec:
            _moving(q, k, v, causal, scale, mk, margin)
    return out


def _moving(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
            mk: tuple[Any, ...], margin: int = 0) -> None:
    """After a dense call of layout ``mk`` prepared a launch: the second layout to arrive at new addresses gets a
    family that later calls at new addresses re-point (``serve.AttentionFamily``; a model's prefill: new tensors every
    layer)."""
    if mk in _MOVE:
        return
    if mk not in _SEEN:
        if len(_SEEN) >= 4096:
            _SEEN.clear()
        _SEEN.add(mk)
        return
    fam = _gen().attention_family(q, k, v, _attn_class(q, k, causal), scale, margin)
    if fam is not None:
        if len(_MOVE) >= 1024:
            _MOVE.clear()
        _MOVE[mk] = fam


def _flash_attention_varlen_cuda(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                                 cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool,
                                 softmax_scale: float, sm_margin: int = 0) -> torch.Tensor:
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale, None,
                   sm_margin)


def _varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor, max_q: int,
            max_k: int, causal: bool, scale: float, lse: torch.Tensor | None, margin: int = 0) -> torch.Tensor:
    """Varlen attention's output, and the rows' log-sum-exp into ``lse`` where given (+inf where no key is seen);
    ``margin``: SMs left free."""
    out = q.new_empty(q.shape)
    empty = out.numel() == 0 or cu_q.shape[0] < 2
    if empty or max_k == 0 or k.shape[0] == 0:
        if lse is not None:
            lse.fill_(math.inf)
        return out if empty else out.zero_()
    _gen().attention.attention(_tma_ready(q), _tma_ready(k), _tma_ready(v), out, _attn_class(q, k, causal), scale,
                               cu_q.contiguous(), cu_k.contiguous(), max(1, max_q), max_k, lse=lse, sm_margin=margin)
    return out


def _flash_attention_lse_cuda(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                              softmax_scale: float, sm_margin: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense attention and the rows' log-sum-exp, float32 [B, H, Sq]: the class's prefill kernel, at any seq_q."""
    out = _empty_like(q, memory_format=_CF)
    lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
    if out.numel() == 0:
        return out, lse
    if k.shape[1] == 0:
        return out.zero_(), lse.fill_(math.inf)
    _gen().attention.attention(_tma_ready(q), _tma_ready(k), _tma_ready(v), out, _attn_class(q, k, causal),
                               softmax_scale, lse=lse, sm_margin=sm_margin)
    return out, lse


def _flash_attention_varlen_lse_cuda(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                                     cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool,
                                     softmax_scale: float, sm_margin: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Varlen attention and the rows' log-sum-exp, float32 [H, total_q] (FlashAttention-3's layout)."""
    lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale, lse,
                   sm_margin), lse


def _flash_attention_features_cuda(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor | None,
                                   cu_k: torch.Tensor | None, used_q: torch.Tensor | None, used_k: torch.Tensor | None,
                                   max_q: int, max_k: int, causal: bool, scale: float, softcap: float, wl: int,
                                   wr: int, sm_margin: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense or varlen attention with a softcap, a sliding window or varlen's ``seqused``, and the rows'
    log-sum-exp: the softcap / window class's prefill kernel at any seq_q (features normalised by the caller)."""
    varlen = cu_q is not None
    out = q.new_empty(q.shape) if varlen else _empty_like(q, memory_format=_CF)
    lse = q.new_empty((q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1]),
                      dtype=torch.float32)
    if out.numel() == 0 or (varlen and cu_q.shape[0] < 2):
        return out, lse
    if (max_k if varlen else k.shape[1]) == 0 or k.shape[-3] == 0:
        return out.zero_(), lse.fill_(math.inf)
    c = _gen().attention_class(_DT[q.dtype], q.shape[-1], causal, q.shape[-2], k.shape[-2], softcap=softcap > 0,
                               window=(wl, wr) != (-1, -1))
    vl = {"cu_q": cu_q.contiguous(), "cu_k": cu_k.contiguous(), "max_q": max(1, max_q), "max_k": max_k} \
        if varlen else {}
    _gen().attention.attention(_tma_ready(q), _tma_ready(k), _tma_ready(v), out, c, scale, lse=lse, used_q=used_q,
                               used_k=used_k, softcap=softcap, window=(wl, wr), sm_margin=sm_margin, **vl)
    return out, lse


def _features(name: str, seq_q: int, seq_kv: int, causal: bool, softcap: Any, window_size: Any
              ) -> tuple[float, int, int]:
    """(softcap, window_left, window_right) as the kernel takes them: FlashAttention-3's normalisation (causal is
    a right window of 0; a window that covers every key is none; -1 unbounded), ShapeError for bad values."""
    from .ops.attention import features
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise ShapeError(f"{name}: window_size={window_size!r} must be a pair (left, right) of ints, -1 unbounded"
                         ) from None
    f = features({"seq_q": seq_q, "seq_kv": seq_kv, "causal": causal}, softcap=softcap, window_left=left,
                 window_right=right)
    return f.get("softcap", 0.0), f.get("window_left", -1), f.get("window_right", -1)


def _kvcache_key(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: torch.Tensor, causal: bool,
                 scale: float | None, softcap: Any = 0.0, margin: int = 0) -> tuple[Any, ...]:
    """The kept launch's key: the cache's and the lengths' addresses, not q's (a decode loop makes a new q every step;
    the launch's q map is re-pointed per call, ``runtime.Launch.repoint``), and the SMs left free."""
    return ("kvc", k.data_ptr(), v.data_ptr(), lens.data_ptr(), q.shape, q.stride(), k.shape, k.stride(), v.shape,
            v.stride(), lens.shape, q.dtype, k.dtype, v.dtype, lens.dtype, causal, scale, softcap, margin)


def _kvcache_warm(q: torch.Tensor, key: tuple[Any, ...]) -> torch.Tensor | None:
    """The kept launch of ``key`` on this step's q (its map re-pointed), or None where there is none or q's address
    is one TMA cannot take."""
    ln = _FAST.get(key)
    if ln is None or q.data_ptr() % 16:
        return None
    out = _empty_like(q, memory_format=_CF)
    ln.repoint("q", q.data_ptr())
    ln(_raw_stream(q.get_device()), out.data_ptr())
    return out


def _flash_attention_kvcache_cuda(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                  cache_seqlens: torch.Tensor, causal: bool, softmax_scale: float,
                                  softcap: float = 0.0, sm_margin: int = 0) -> torch.Tensor:
    key = _kvcache_key(q, k_cache, v_cache, cache_seqlens, causal, softmax_scale, softcap, sm_margin)
    out = _kvcache_warm(q, key)
    return out if out is not None else _kvcache_cold(q, k_cache, v_cache, cache_seqlens, causal, softmax_scale, key,
                                                     softcap=softcap, margin=sm_margin)


def _kvcache_cold(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: torch.Tensor, causal: bool, scale: float,
                  key: tuple[Any, ...], table: torch.Tensor | None = None, softcap: float = 0.0,
                  margin: int = 0) -> torch.Tensor:
    """As ``_flash_attention_cold``, for the decode kernel reading the sequences' lengths from ``lens`` (and a paged
    cache's pages from ``table``); ``softcap`` (> 0, validated): its softcap variant; ``margin``: SMs left free."""
    out = _empty_like(q, memory_format=_CF)
    if out.numel() == 0:
        return out
    if k.shape[1] == 0 or (table is not None and table.shape[1] == 0):
        return out.zero_()
    q2, k2, v2, l2 = _tma_ready(q), _tma_ready(k), _tma_ready(v), lens.contiguous()
    t2 = None if table is None else table.contiguous()
    kd = k if table is None else k[:1].expand(q.shape[0], *k.shape[1:])  # the class sees one cache per sequence
    ln = _gen().decode_launch(q2, k2, v2, _decode_class(q, kd, causal, softcap), scale, l2, page_table=t2,
                              softcap=softcap, sm_margin=margin)
    ln.repoint("q", q2.data_ptr())  # kept launches are re-pointed per call: this one may point at another q now
    ln(_raw_stream(q.get_device()), out.data_ptr())
    if q2 is q and k2 is k and v2 is v and l2 is lens and t2 is table:
        _fast_put(key, ln)
    return out


def _flash_attention_paged_cuda(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                cache_seqlens: torch.Tensor, page_table: torch.Tensor, causal: bool,
                                softmax_scale: float, softcap: float = 0.0, sm_margin: int = 0) -> torch.Tensor:
    key = (*_kvcache_key(q, k_cache, v_cache, cache_seqlens, causal, softmax_scale, softcap, sm_margin),
           page_table.data_ptr(), page_table.shape, page_table.stride())
    out = _kvcache_warm(q, key)
    return out if out is not None else _kvcache_cold(q, k_cache, v_cache, cache_seqlens, causal, softmax_scale, key,
                                                     page_table, softcap, sm_margin)


def _kvcache_paged(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lens: torch.Tensor | int,
                   causal: bool, softmax_scale: float | None, table: torch.Tensor, asked: dict[str, Any],
                   softcap: Any = 0.0, margin: int = 0) -> torch.Tensor:
    """``flash_attention_kvcache`` on a paged cache (see there): the split-KV decode kernel (its softcap variant
    where ``softcap`` > 0), each key block loaded from its page. ``asked``: the other arguments that ask for
    something, refused with a paged cache, but for attention_chunk (``_paged_chunk``); ``margin``: SMs left free
    (validated)."""
    asked = dict(asked)
    chunk = asked.pop("attention_chunk", 0)
    if asked:
        raise NotImplementedError(f"flash_attention_kvcache: page_table with {', '.join(sorted(asked))} is not "
                                  "supported by ptsolve yet (a paged cache runs decode steps, a softcap allowed)")
    B = q.shape[0]
    if q.dim() != 4 or q.shape[1] > _gen().DECODE_MAX_SEQ_Q or q.shape[-1] not in _gen().DECODE_HEAD_DIMS:
        raise NotImplementedError(f"flash_attention_kvcache: page_table with q {tuple(q.shape)}; a paged cache runs "
                                  f"steps of at most {_gen().DECODE_MAX_SEQ_Q} positions at head_dim "
                                  f"{_gen().DECODE_HEAD_DIMS}")
    if isinstance(lens, int):
        lens = torch.full((B,), lens, dtype=torch.int32, device=q.device)
    if table.dtype != torch.int32 or table.dim() != 2 or table.shape[0] != B or table.device != q.device:
        raise ShapeError(f"page_table must be torch.int32 [{B}, max_pages] on {q.device} (page numbers of each "
                         f"sequence's keys, in order), got {table.dtype} {tuple(table.shape)} on {table.device}")
    if chunk:
        _per_sequence("cache_seqlens", lens, B, q.device)
        lens, table = _paged_chunk(q, lens, table, k_cache.shape[1], chunk)
    causal = bool(causal)
    scale = _check_attention(q, k_cache[:1].expand(B, *k_cache.shape[1:]), v_cache[:1].expand(B, *v_cache.shape[1:]),
                             4, causal, softmax_scale)
    _per_sequence("cache_seqlens", lens, B, q.device)
    sc = _features("flash_attention_kvcache", q.shape[1], k_cache.shape[1], causal, softcap, (-1, -1))[0]
    if _compiling():
        return torch.ops.ptsolve.flash_attention_paged(q, k_cache, v_cache, lens, table, causal, scale, sc, margin)
    return _flash_attention_paged_cuda(q, k_cache, v_cache, lens, table, causal, scale, sc, margin)


def _as_pages(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, chunk: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """A contiguous cache [B, S, Hkv, D] seen as a paged one, for a decode step of one query with a chunk (split-KV
    over the chunk, ``_paged_chunk``, where the varlen kernel would give each sequence's chunk one CTA per head): (k
    pages, v pages [B·S / PAGE, PAGE, Hkv, D], views; the page table [B, S / PAGE], sequence b's pages in order, made
    on the device), PAGE the largest power of two from 256 down to 16 (the paged decode kernel's tested pages) that
    divides S and the chunk. None where the step is not one query at a decode head_dim, or no page size fits, or the
    cache's batches do not follow each other in memory (no view): the varlen kernel then runs it."""
    B, S = k_cache.shape[:2]
    page = next((p for p in (256, 128, 64, 32, 16) if S % p == 0 and chunk % p == 0), 0)
    if q.dim() != 4 or q.shape[1] != 1 or q.shape[-1] not in _gen().DECODE_HEAD_DIMS or not page \
            or k_cache.shape != v_cache.shape or k_cache.dim() != 4 or B != q.shape[0]:
        return None
    try:
        kp, vp = (x.view(B * S // page, page, *x.shape[2:]) for x in (k_cache, v_cache))
    except RuntimeError:  # strides that merge no batch into the sequence
        return None
    n = S // page
    table = (torch.arange(B, device=q.device, dtype=torch.int32)[:, None] * n
             + torch.arange(n, device=q.device, dtype=torch.int32))
    return kp, vp, table


def _paged_chunk(q: torch.Tensor, lens: torch.Tensor, table: torch.Tensor, page: int, chunk: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """A paged decode step's chunk as a paged cache of its own, no key copied: (lengths, page table) whose keys are
    each sequence's chunk. One query at p = len − 1 sees keys ⌊(len − 1) / C⌋·C .. len − 1 (none where len = 0);
    with pages dividing the chunk, that first key starts a page, so the table from that page on (a gather of page
    numbers, on the device: no host sync) holds the chunk from its key 0, and len − first is its length. At most C /
    PAGE pages: the split-KV pieces are chosen for the chunk, not the whole cache. NotImplementedError for more than
    one query (they may straddle a chunk's edge at lengths only the device knows: one decode launch aligns them all
    bottom-right at one length) or pages that do not divide the chunk (its first key would start mid-page)."""
    if q.shape[1] != 1 or chunk % page:
        raise NotImplementedError(
            f"flash_attention_kvcache: page_table with attention_chunk={chunk} runs decode steps of one query on pages "
            f"that divide the chunk; got {q.shape[1]} query positions and {page}-key pages (queries may straddle a "
            "chunk's edge at a length only the device knows, and a chunk must start a page; give a contiguous cache "
            "for these)")
    first = torch.div(lens.long() - 1, chunk, rounding_mode="floor").clamp(min=0) * chunk
    pages = min(table.shape[1], chunk // page)
    at = ((first // page)[:, None] + torch.arange(pages, device=q.device)).clamp(max=table.shape[1] - 1)
    return (lens.long() - first).to(torch.int32), table.gather(1, at)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor,
            interleaved: bool) -> torch.Tensor:
    """x [T, H, D] with its first 2·cos.shape[1] dims rotated at positions pos [T] (in float32)."""
    rd = 2 * cos.shape[1]
    c, sn = cos[pos.long()].float()[:, None], sin[pos.long()].float()[:, None]
    xr = x[..., :rd].float()
    x1, x2 = (xr[..., 0::2], xr[..., 1::2]) if interleaved else (xr[..., : rd // 2], xr[..., rd // 2:])
    a, b = x1 * c - x2 * sn, x1 * sn + x2 * c
    o = torch.stack((a, b), -1).flatten(-2) if interleaved else torch.cat((a, b), -1)
    return torch.cat((o.to(x.dtype), x[..., rd:]), -1)


class _Rows(NamedTuple):
    """A kv-cache call's queries or new keys as packed rows: x [T, H, D], the sequence of each row (int64 [T]), its
    index within that sequence (int64 [T]), the rows per sequence (int [B] tensor), the cumulative offsets
    (int32 [B + 1]) and the longest sequence."""

    x: torch.Tensor
    seq: torch.Tensor
    idx: torch.Tensor
    count: torch.Tensor
    cu: torch.Tensor
    longest: int


def _rows(name: str, x: torch.Tensor, cu: torch.Tensor | None, longest: int | None, batch: int) -> _Rows:
    """``x`` [B, S, H, D] (``cu`` None), or [T, H, D] packed by ``cu`` (int32 [B + 1], FlashAttention's
    ``cu_seqlens_*``, read on the device: not checked for order) with ``longest`` rows at most in a sequence."""
    dev = x.device
    if cu is None:
        if x.dim() != 4 or x.shape[0] != batch:
            raise ShapeError(f"{name} {tuple(x.shape)} must be [{batch}, S, H, D] (or [total, H, D] with its "
                             "cu_seqlens)")
        s = x.shape[1]
        ar = torch.arange(batch * s, device=dev)
        return _Rows(x.reshape(batch * s, *x.shape[2:]), ar // max(s, 1), ar % max(s, 1),
                     torch.full((batch,), s, device=dev), torch.arange(batch + 1, dtype=torch.int32, device=dev) * s,
                     s)
    if x.dim() != 3 or cu.dtype != torch.int32 or tuple(cu.shape) != (batch + 1,) or cu.device != dev:
        raise ShapeError(f"{name} {tuple(x.shape)} with its cu_seqlens {cu.dtype} {tuple(cu.shape)} on {cu.device}: "
                         f"give [total, H, D] rows and int32 ({batch + 1},) offsets on {dev}")
    if not isinstance(longest, int) or longest < 0:
        raise ShapeError(f"{name}: max_seqlen_q={longest!r} must be given with cu_seqlens_q, an int >= 0 (the "
                         "longest query sequence)")
    count = cu.diff().long()
    seq = torch.repeat_interleave(torch.arange(batch, device=dev), count, output_size=x.shape[0])
    return _Rows(x, seq, torch.arange(x.shape[0], device=dev) - cu.long()[seq], count, cu, longest)


def _kvcache_append(q: _Rows, k_cache: torch.Tensor, v_cache: torch.Tensor, lens: torch.Tensor, k: _Rows | None,
                    v: torch.Tensor | None, rope: tuple[Any, ...], batch_idx: torch.Tensor | None,
                    leftpad: torch.Tensor | None, q_steps: bool) -> tuple[_Rows, torch.Tensor]:
    """``flash_attention_kvcache``'s rotary and append (see there) on packed rows: (the queries, rotated where
    asked; the lengths the attention then sees). ``rope``: (cos, sin, interleaved, rotary_seqlens)."""
    cos, sin, interleaved, ro_lens = rope
    if (cos is None) != (sin is None):
        raise ShapeError("flash_attention_kvcache: give rotary_cos and rotary_sin together")
    if cos is not None and leftpad is not None:
        raise NotImplementedError("flash_attention_kvcache: rotary_cos with cache_leftpad is not supported by ptsolve "
                                  "yet (leave cache_leftpad at None)")
    if cos is not None:
        if cos.shape != sin.shape or cos.dim() != 2 or 2 * cos.shape[1] > q.x.shape[-1] or (2 * cos.shape[1]) % 16:
            raise ShapeError(f"rotary_cos {tuple(cos.shape)} / rotary_sin {tuple(sin.shape)} must be one [S_ro, R/2] "
                             f"shape with R a multiple of 16 up to head_dim {q.x.shape[-1]}")
        base = (lens if ro_lens is None else ro_lens).long()
        q = q._replace(x=_rotate(q.x, cos, sin, base[q.seq] + (q.idx if q_steps else 0), interleaved))
    if k is None:
        return q, lens
    if v is None or k.x.shape != v.shape or k.x.shape[1:] != k_cache.shape[2:]:
        raise ShapeError(f"k {tuple(k.x.shape)} and v {tuple(getattr(v, 'shape', ()))} must be one shape, with the "
                         f"cache's heads and head_dim {tuple(k_cache.shape[2:])}")
    kx = k.x if cos is None else _rotate(k.x, cos, sin, base[k.seq] + k.idx, interleaved)
    row = k.seq if batch_idx is None else batch_idx.long()[k.seq]
    pos = lens.long()[k.seq] + k.idx
    k_cache[row, pos] = kx.to(k_cache.dtype)
    v_cache[row, pos] = v.to(v_cache.dtype)
    return q, (lens + k.count).to(torch.int32)


def _per_sequence(name: str, t: torch.Tensor | None, batch: int, device: torch.device) -> None:
    """ShapeError unless ``t`` (None: absent) is one int32 value per sequence on ``device``."""
    if t is not None and (t.dtype != torch.int32 or tuple(t.shape) != (batch,) or t.device != device):
        raise ShapeError(f"{name} must be a torch.int32 tensor of shape ({batch},) on {device} (one value per "
                         f"sequence), got {t.dtype} {tuple(t.shape)} on {t.device} (convert with .int())")


def _kvcache_general(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lens: torch.Tensor | int,
                     causal: bool, softmax_scale: float | None, feats: tuple[float, Any, bool], new: tuple[Any, ...],
                     rope: tuple[Any, ...], batch_idx: torch.Tensor | None, leftpad: torch.Tensor | None,
                     cu_q: torch.Tensor | None, max_q: int | None, chunk: int = 0, margin: int = 0) -> Any:
    """``flash_attention_kvcache``'s checks, rotary and append (``_kvcache_append``), then ``_kvcache_packed``; a
    chunked layer's plain decode step (one query, nothing else asked) instead runs split-KV decode over its chunk's
    pages of the cache (``_as_pages``). ``feats``: (softcap, window_size, return_lse); ``new``: (k, v,
    cu_seqlens_k_new); ``rope``: (rotary_cos, rotary_sin, rotary_interleaved, rotary_seqlens); ``chunk``:
    attention_chunk; ``margin``: SMs left free (both validated)."""
    causal, (softcap, window_size, return_lse), (k, v, cu_new) = bool(causal), feats, new
    plain = all(x is None for x in (k, v, cu_new, rope[0], rope[1], batch_idx, leftpad, cu_q))
    pages = _as_pages(q, k_cache, v_cache, chunk) if chunk and plain and not return_lse \
        and tuple(window_size) == (-1, -1) else None
    if pages is not None:  # a decode step of a chunked layer: split-KV over the chunk's pages of the cache
        return _kvcache_paged(q, pages[0], pages[1], lens, causal, softmax_scale, pages[2], {"attention_chunk": chunk},
                              softcap, margin)
    B = q.shape[0] if cu_q is None else cu_q.shape[0] - 1
    rows = _rows("q", q, cu_q, max_q, B)
    if isinstance(lens, int):
        lens = torch.full((B,), lens, dtype=torch.int32, device=q.device)
    if batch_idx is None and k_cache.shape[0] != B:
        raise ShapeError(f"k_cache has {k_cache.shape[0]} sequences for q's {B}; give cache_batch_idx to pick them")
    for n, t in (("cache_seqlens", lens), ("cache_batch_idx", batch_idx), ("cache_leftpad", leftpad)):
        _per_sequence(n, t, B, q.device)
    if cu_q is None:  # with cache_batch_idx the cache may hold more sequences than q: the checks see one per q's
        kv = (k_cache, v_cache) if batch_idx is None else (k_cache[:1].expand(B, *k_cache.shape[1:]),
                                                           v_cache[:1].expand(B, *v_cache.shape[1:]))
        scale = _check_attention(q, *kv, 4, causal, softmax_scale)
    else:
        scale = _check_attention(q, k_cache[0], v_cache[0], 3, causal, softmax_scale)
    if (k is None) != (v is None) or (cu_new is not None and k is None):
        raise ShapeError("flash_attention_kvcache: give k and v together (and cu_seqlens_k_new only with them)")
    knew = None if k is None else _rows("k", k, cu_new, k.shape[0] if cu_new is not None else None, B)
    vnew = None if v is None else v.reshape(-1, *v.shape[-2:])
    rows, lens = _kvcache_append(rows, k_cache, v_cache, lens, knew, vnew, rope, batch_idx, leftpad,
                                 causal or tuple(window_size) != (-1, -1))
    feat = _features("flash_attention_kvcache", rows.longest, k_cache.shape[1], causal, softcap, window_size)
    if rows.x.numel() == 0 or k_cache.shape[1] == 0:
        out, lse = torch.zeros_like(rows.x), rows.x.new_full((q.shape[-2], rows.x.shape[0]), math.inf,
                                                              dtype=torch.float32)
    else:
        out, lse = _kvcache_packed(rows, k_cache, v_cache, lens, causal, scale, feat, batch_idx, leftpad, chunk,
                                   margin)
    if cu_q is None:
        out, lse = out.view(q.shape), lse.view(q.shape[2], B, q.shape[1]).permute(1, 0, 2)
    return (out, lse) if return_lse else out


def _kvcache_packed(q: _Rows, k_cache: torch.Tensor, v_cache: torch.Tensor, lens: torch.Tensor, causal: bool,
                    scale: float, feat: tuple[float, int, int], batch_idx: torch.Tensor | None,
                    leftpad: torch.Tensor | None, chunk: int = 0, margin: int = 0
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """A kv-cache call as the varlen kernel runs it, FlashAttention-3's own reduction: the packed queries against the
    cache [B_cache·S, Hkv, D] (a copy where its strides cannot be viewed so), sequence b's keys from row
    batch_idx[b]·S + leftpad[b], ``lens[b] − leftpad[b]`` of them (``seqused_k``). (out [T, H, D], lse [H, T]).
    Any number of query positions, a softcap and a window; one CTA per (sequence, head, query block): no split-KV,
    so a long cache with few sequences runs slower than ``flash_attention_kvcache``'s decode kernel. ``chunk`` > 0:
    each sequence cut into its chunks' pieces at the lengths on the device (``_chunk_attend``: key positions count
    from the sequence's leftpad, FlashAttention-3's), here even for a decode step: the split-KV decode kernel reads
    keys from 0, and a chunk starts at a key only the device knows; ``margin``: SMs left free."""
    B = q.cu.shape[0] - 1
    nb, S, Hkv, D = k_cache.shape
    dev = q.x.device
    idx = torch.arange(B, device=dev, dtype=torch.int32) if batch_idx is None else batch_idx.to(torch.int32)
    pad = 0 if leftpad is None else leftpad.to(torch.int32)
    cu_k = torch.cat([idx * S + pad, torch.full((1,), nb * S, dtype=torch.int32, device=dev)])  # last: not read
    used_k = (lens.clamp(0, S) - pad).clamp(min=0).to(torch.int32)  # the decode kernel's clamp
    kv = (k_cache.reshape(nb * S, Hkv, D), v_cache.reshape(nb * S, Hkv, D))
    if chunk:
        return _chunk_attend("flash_attention_kvcache", (q.x, *kv), (q.cu, cu_k), (q.count, used_k),
                             (q.longest, S), _chunk_count(q.longest, chunk), causal, scale, feat, chunk, margin)
    return _run_features((q.x, *kv, q.cu, cu_k, None, used_k, max(1, q.longest), S, causal, scale, *feat), margin)


def _run_features(args: tuple[Any, ...], margin: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of ``flash_attention_features`` on ``args`` (its arguments but the margin), through the op under
    torch.compile; ``margin`` appended only where one is given, so a call without one passes the op's arguments of
    before sm_margin (its default is 0)."""
    fa = (*args, margin) if margin else args
    return torch.ops.ptsolve.flash_attention_features(*fa) if _compiling() else _flash_attention_features_cuda(*fa)


# ---------------------------------------------------------------------------------------------- attention_chunk
# Llama-4's chunked local attention (FlashAttention-3's ``attention_chunk`` = C): with query i of a sequence of sq
# queries and sk keys at the diagonal position p = i + sk − sq (the bottom-right alignment causal and the window use),
# the query sees only keys j of its own chunk, ⌊p / C⌋·C <= j < ⌊p / C⌋·C + C (floor division: a query with p < 0,
# sq > sk, sees none), on top of causal and the window (FA3's mask: the chunk's band and the window's, both applied;
# FA3 also clips the window to C − 1 keys each side, which the chunk implies). The mask is block-diagonal, so each
# (sequence, chunk) is its own sequence of the varlen kernel, which runs causal, the window, softcap, the LSE and
# seqused as it does for any sequence; no new kernel.
#
# Why a piece's own bottom-right alignment is FA3's (any sq, sk; sq < sk in particular). Let chunk c hold the queries
# whose p lies in [cC, cC + C) and the keys j in [cC, cC + C); the queries' p also lie in [sk − sq, sk), so the piece
# has keys [ks, ke) = [cC, min(cC + C, sk)) and queries with p in [max(cC, sk − sq), ke): the piece's last query has
# p = ke − 1, its last key is ke − 1. The kernel aligns a piece of sq' queries and sk' = ke − ks keys bottom-right: its
# query i' (i' = i − first query) sits at p' = i' + sk' − sq', and since both ends meet at ke − 1, p' = p − ks for
# every query of the piece; its key j' is key j = j' + ks. Causal (j <= p) and the window (p − left <= j <= p + right)
# compare j − p = j' − p', so the piece's masks are the sequence's; the chunk's mask is the piece itself. A chunk with
# p < 0 (sq > sk) gets no key (ke <= ks): its queries are zeros with LSE +inf, as FA3 returns them. Each p belongs to
# one chunk, so the pieces cover every query once. tests/ptsolve/test_attention_chunk.py checks this against the
# dense mask.


def _chunk(name: str, attention_chunk: Any) -> int:
    """``attention_chunk`` as an int (0: no chunks); ShapeError naming ``name`` for a negative or non-integer one."""
    if isinstance(attention_chunk, bool) or not isinstance(attention_chunk, int) or attention_chunk < 0:
        raise ShapeError(f"{name}: attention_chunk={attention_chunk!r} must be an int >= 0 (keys per chunk, e.g. "
                         "Llama-4's 8192; 0: no chunks)")
    return attention_chunk


def _chunk_count(longest_q: int, chunk: int) -> int:
    """Pieces per sequence that cover any sequence of at most ``longest_q`` queries: their positions p are that many
    consecutive integers, which meet at most ⌈(longest_q − 1) / C⌉ + 1 chunks."""
    return (max(int(longest_q), 1) + chunk - 2) // chunk + 1


def _chunk_pieces(nq: torch.Tensor, nk: torch.Tensor, chunk: int, pieces: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The pieces of sequences of nq queries and nk keys (int64 [B], on the device: no host sync), ``pieces`` per
    sequence from the chunk of its first query on: (first query, queries, first key, keys), each int64 [B, pieces],
    offsets within the sequence; pieces past its last query are empty. See the proof above."""
    off = (nk - nq)[:, None]  # p − i
    c = torch.div(off, chunk, rounding_mode="floor") + torch.arange(pieces, device=nq.device)  # chunk of each piece
    lo, hi, nq2, nk2 = c * chunk, (c + 1) * chunk, nq[:, None], nk[:, None]
    q0 = torch.minimum((lo - off).clamp(min=0), nq2)
    q1 = torch.minimum((hi - off).clamp(min=0), nq2)
    k0 = torch.minimum(lo.clamp(min=0), nk2)
    k1 = torch.minimum(hi.clamp(min=0), nk2)
    return q0, q1 - q0, k0, k1 - k0


def _dense_pieces(B: int, sq: int, sk: int, chunk: int, pieces: int, dev: Any) -> tuple[torch.Tensor, ...]:
    """(cu_q, cu_k, queries, keys) of a dense batch's pieces (``_chunk_pieces``' rule on host ints: every sequence has
    sq queries and sk keys), int32 on ``dev``. Under torch.compile they are the graph's constants: Inductor failed on
    the device arithmetic of the same offsets (torch 2.11: "The argument '256*((0))' is not comparable")."""
    off = sk - sq
    c0 = off // chunk
    q0 = [min(max((c0 + i) * chunk - off, 0), sq) for i in range(pieces)]
    q1 = [min(max((c0 + i + 1) * chunk - off, 0), sq) for i in range(pieces)]
    k0 = [min(max((c0 + i) * chunk, 0), sk) for i in range(pieces)]
    k1 = [min(max((c0 + i + 1) * chunk, 0), sk) for i in range(pieces)]
    cu_q = [b * sq + x for b in range(B) for x in q0] + [B * sq]
    cu_k = [b * sk + x for b in range(B) for x in k0] + [B * sk]
    qn, kn = [b - a for a, b in zip(q0, q1)] * B, [b - a for a, b in zip(k0, k1)] * B
    return tuple(torch.tensor(x, device=dev, dtype=torch.int32) for x in (cu_q, cu_k, qn, kn))


def _chunk_attend(name: str, qkv: tuple[torch.Tensor, ...], starts: tuple[torch.Tensor, torch.Tensor],
                  lens: tuple[torch.Tensor, torch.Tensor], longest: tuple[int, int], pieces: int, causal: bool,
                  scale: float, feat: tuple[Any, Any, Any], chunk: int, margin: int,
                  given: tuple[torch.Tensor, ...] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked attention of packed rows as the varlen kernel runs it: q [Tq, H, D], k / v [Tk, Hkv, D] (``qkv``),
    sequence b's queries at rows starts[0][b] .., its keys at rows starts[1][b] .. (int32 [B + 1], the last entry
    cu_seqlens' total: the LSE's row stride), lens[0][b] / lens[1][b] of them (int [B], on the device), at most
    ``longest`` (host ints); ``pieces`` per sequence (``_chunk_count``, or the exact count). Each piece is a sequence
    (its rows from its start, ``seqused``: rows past a sequence's used ones are neither read nor written).
    ``feat``: (softcap, window_left, window_right), normalised here against the pieces' longest. ``given``: the
    pieces' (cu_q, cu_k, queries, keys) where the caller has them (``_dense_pieces``). (out [Tq, H, D], lse [H, Tq])."""
    if given is None:
        (cq, ck), (nq, nk) = starts, lens
        q0, qn, k0, kn = _chunk_pieces(nq.long(), nk.long(), chunk, pieces)
        given = (torch.cat([(cq[:-1].long()[:, None] + q0).flatten(), cq[-1:].long()]).to(torch.int32),
                 torch.cat([(ck[:-1].long()[:, None] + k0).flatten(), ck[-1:].long()]).to(torch.int32),
                 qn.flatten().to(torch.int32), kn.flatten().to(torch.int32))
    mq, mk = min(chunk, int(longest[0])), min(chunk, int(longest[1]))
    sc, wl, wr = _features(name, mq, mk, causal, feat[0], (feat[1], feat[2]))
    return _run_features((*qkv, *given, max(1, mq), mk, causal, scale, sc, wl, wr), margin)


def _chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, softmax_scale: float | None,
             return_lse: bool, softcap: Any, window_size: Any, chunk: int, margin: int) -> Any:
    """``flash_attention`` with ``attention_chunk`` = ``chunk`` (validated, > 0; see the proof above). Where every
    query's p falls in one chunk (a decode step, or a prefill within a chunk), the call is dense attention over that
    chunk's keys, a view k[:, cC:] (sk' = sk − cC keeps every query's p' = p − cC): the dense kernels, split-KV decode
    included. Otherwise the varlen kernel over the batch's pieces: q, k, v viewed as [B·S, H, D] rows (no copy when
    their batch and sequence dims merge), the pieces' offsets made on the device from the shapes (no host sync)."""
    B, sq, sk = q.shape[0], q.shape[1], k.shape[1]
    first = (sk - sq) // chunk  # the chunk of query 0 (floor: negative where sq > sk)
    if sq == 0 or sk == 0 or first == (sk - 1) // chunk:
        s = max(first, 0) * chunk
        return _attend(q, k[:, s:], v[:, s:], causal, softmax_scale, return_lse, softcap, window_size, margin)
    scale = _check_attention(q, k, v, 4, causal, softmax_scale)
    dev = q.device
    rows = tuple(x.reshape(B * x.shape[1], *x.shape[2:]) for x in (q, k, v))
    pieces = (sk - 1) // chunk - first + 1
    starts = tuple(torch.arange(B + 1, device=dev, dtype=torch.int32) * n for n in (sq, sk))
    lens = tuple(torch.full((B,), n, device=dev, dtype=torch.int64) for n in (sq, sk))
    given = _dense_pieces(B, sq, sk, chunk, pieces, dev) if _compiling() else None
    out, lse = _chunk_attend("flash_attention", rows, starts, lens, (sq, sk), pieces, causal,
                             scale, (softcap, *_window(window_size)), chunk, margin, given)
    out = out.view(q.shape)
    return (out, lse.view(q.shape[2], B, sq).permute(1, 0, 2)) if return_lse else out


def _window(window_size: Any) -> tuple[Any, Any]:
    """(left, right) of ``window_size``; ShapeError unless it is a pair."""
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise ShapeError(f"window_size={window_size!r} must be a pair (left, right) of ints, -1 unbounded") from None
    return left, right


_SMS: dict[int, int] = {}


def _margin(name: str, sm_margin: Any, x: torch.Tensor) -> int:
    """FlashAttention-3's ``sm_margin`` (SMs left free for other work, e.g. communication kernels) as an int, checked
    against the SM count of ``x``'s device: ShapeError unless 0 <= sm_margin < SMs. A persistent kernel's grid then
    fills the SMs left and split-KV decode chooses its pieces for them (``serve.decode_launch``); a kernel of one CTA
    per tile keeps its grid. The launches made for a margin are kept under keys that hold it, apart from the
    others; nothing is recompiled."""
    if isinstance(sm_margin, bool) or not isinstance(sm_margin, int) or sm_margin < 0:
        raise ShapeError(f"{name}: sm_margin={sm_margin!r} must be an int >= 0 (SMs left free for other work; 0: "
                         "use them all)")
    if sm_margin and x.is_cuda and not _compiling():  # traced: the launch's own check (runtime.usable_sms)
        dev = x.get_device()
        sms = _SMS.get(dev)
        if sms is None:
            sms = _SMS[dev] = torch.cuda.get_device_properties(dev).multi_processor_count
        if sm_margin >= sms:
            raise ShapeError(f"{name}: sm_margin={sm_margin} leaves no SM of this device's {sms} (give at most "
                             f"{sms - 1})")
    return sm_margin


_GEMM_CLASSES: dict[tuple[torch.dtype, bool], Any] = {}  # (dtype, N a multiple of 8) -> class


def _gemm_cuda(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    key = ("gemm", a.data_ptr(), b.data_ptr(), a.shape, a.stride(), b.shape, b.stride(), a.dtype, b.dtype)
    hit = _FAST.get(key)
    if hit is not None:  # the dispatcher's warm path
        out = _empty_like(hit[1], memory_format=_CF)
        hit[0](_raw_stream(a.get_device()), out.data_ptr())
        return out
    return _gemm_cold(a, b, (a.shape[0], b.shape[0]), key)


def _gemm_cold(a: torch.Tensor, b: torch.Tensor, shape: tuple[int, ...], key: tuple[Any, ...] | None
               ) -> torch.Tensor:
    """a [M, K] · b [N, K]ᵀ into a new contiguous tensor of ``shape`` (M·N elements: [M, N] or a's leading dims and
    N); the launch is kept under ``key`` (None: not kept) where a and b went to the kernel as they are."""
    out = a.new_empty(shape)
    if out.numel() == 0:
        return out
    if a.shape[1] == 0:
        return out.zero_()
    ck = (a.dtype, b.shape[0] % 8 == 0)
    c = _GEMM_CLASSES.get(ck)
    if c is None:
        c = _GEMM_CLASSES[ck] = _gen().gemm_class(_DT[a.dtype], b.shape[0])
    a2, b2 = _tma_ready(a), _tma_ready(b)
    ln = _gen().gemm_launch(a2, b2, c)
    ln(_raw_stream(a.get_device()), out.data_ptr())
    if key is not None and a2 is a and b2 is b:
        _fast_put(key, (ln, a.new_empty(()).expand(shape)))  # expand: an output template of one element
    return out


_MAMBA_CLASSES: dict[tuple[Any, ...], Any] = {}


def _mamba_class(op: str, x: torch.Tensor, BC: torch.Tensor, dt: torch.Tensor, cb_dtype: str | None = None) -> Any:
    key = (op, x.dtype, x.shape[-1], BC.shape[-1], dt.shape[-1], cb_dtype)
    c = _MAMBA_CLASSES.get(key)
    if c is None:
        c = _MAMBA_CLASSES[key] = _gen().mamba_class(op, _dtype(x, "x"), x.shape[-1], BC.shape[-1], dt.shape[-1],
                                                     cb_dtype=cb_dtype)
    return c


def _operand(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` in ``dtype`` (mamba_ssm may hand over float32 cb / states: a wgmma operand), contiguous and 16-byte
    aligned."""
    if t.dtype != dtype and t.dtype.is_floating_point:
        t = t.to(dtype)
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def _scan_key(cb: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, dA_cumsum: torch.Tensor, C: torch.Tensor,
              states: torch.Tensor) -> tuple[Any, ...]:
    ts = (cb, x, dt, dA_cumsum, C, states)
    return ("scan", *[t.data_ptr() for t in ts], *[t.shape for t in ts], *[t.stride() for t in ts],
            *[t.dtype for t in ts])


def _state_key(B: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, dA_cumsum: torch.Tensor) -> tuple[Any, ...]:
    ts = (B, x, dt, dA_cumsum)
    return ("state", *[t.data_ptr() for t in ts], *[t.shape for t in ts], *[t.stride() for t in ts],
            *[t.dtype for t in ts])


def _mamba_chunk_scan_cuda(cb: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, dA_cumsum: torch.Tensor,
                           C: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    key = _scan_key(cb, x, dt, dA_cumsum, C, states)
    ln = _FAST.get(key)
    if ln is not None:
        out = _empty_like(x, memory_format=_CF)
        ln(_raw_stream(x.get_device()), out.data_ptr())
        return out
    return _scan_cold(cb, x, dt, dA_cumsum, C, states, key)


def _scan_cold(cb: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, dA_cumsum: torch.Tensor, C: torch.Tensor,
               states: torch.Tensor, key: tuple[Any, ...]) -> torch.Tensor:
    """ChunkScan whose launch is not kept yet: the operands converted where needed (``_operand``), the launch
    prepared (shapes checked there) and kept under ``key`` where no operand needed a conversion."""
    out = _empty_like(x, memory_format=_CF)
    if out.numel() == 0:
        return out
    d = x.dtype
    # the class that reads cb as it is: float32 (mamba_ssm's _bmm_chunk_fwd output) or x's dtype; else the default
    cbd = "fp32" if cb.dtype == torch.float32 else _dtype(x, "x") if cb.dtype == d else None
    c = _mamba_class("mamba2_chunk_scan", x, C, dt, cbd)
    ins = (cb, x, dt, dA_cumsum, C, states)
    cbt = torch.float32 if c.cb_dtype else d
    ops = tuple(_operand(t, f) for t, f in zip(ins, (cbt, d, torch.float32, torch.float32, d, d)))
    ln = _gen().chunk_scan_launch(*ops, c)
    ln(_raw_stream(x.get_device()), out.data_ptr())
    if all(a is b for a, b in zip(ops, ins)):
        _fast_put(key, ln)
    return out


def _mamba_chunk_state_cuda(B: torch.Tensor, x: torch.Tensor, dt: torch.Tensor,
                            dA_cumsum: torch.Tensor) -> torch.Tensor:
    key = _state_key(B, x, dt, dA_cumsum)
    hit = _FAST.get(key)
    if hit is not None:
        out = _empty_like(hit[1], memory_format=_CF)
        hit[0](_raw_stream(x.get_device()), out.data_ptr())
        return out
    return _state_cold(B, x, dt, dA_cumsum, key)


def _state_cold(B: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, dA_cumsum: torch.Tensor,
                key: tuple[Any, ...]) -> torch.Tensor:
    """ChunkState whose launch is not kept yet (as ``_scan_cold``); the states are float32."""
    b, L, h, p = x.shape
    shape = (b, dt.shape[2], h, p, B.shape[-1])
    out = x.new_empty(shape, dtype=torch.float32)
    if out.numel() == 0:
        return out
    c = _mamba_class("mamba2_chunk_state", x, B, dt)
    d = x.dtype
    ins = (B, x, dt, dA_cumsum)
    ops = tuple(_operand(t, f) for t, f in zip(ins, (d, d, torch.float32, torch.float32)))
    ln = _gen().chunk_state_launch(*ops, c)
    ln(_raw_stream(x.get_device()), out.data_ptr())
    if all(a is b for a, b in zip(ops, ins)):
        _fast_put(key, (ln, x.new_empty((), dtype=torch.float32).expand(shape)))
    return out


_LIB.impl("flash_attention", _flash_attention_cuda, "CUDA")
_LIB.impl("flash_attention_varlen", _flash_attention_varlen_cuda, "CUDA")
_LIB.impl("flash_attention_kvcache", _flash_attention_kvcache_cuda, "CUDA")
_LIB.impl("flash_attention_paged", _flash_attention_paged_cuda, "CUDA")
_LIB.impl("flash_attention_lse", _flash_attention_lse_cuda, "CUDA")
_LIB.impl("flash_attention_varlen_lse", _flash_attention_varlen_lse_cuda, "CUDA")
_LIB.impl("flash_attention_features", _flash_attention_features_cuda, "CUDA")
_LIB.impl("gemm", _gemm_cuda, "CUDA")
_LIB.impl("mamba_chunk_scan", _mamba_chunk_scan_cuda, "CUDA")
_LIB.impl("mamba_chunk_state", _mamba_chunk_state_cuda, "CUDA")


@torch.library.register_fake("ptsolve::flash_attention", lib=_LIB)
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, softmax_scale: float,
      softcap: float = 0.0, sm_margin: int = 0) -> torch.Tensor:
    return q.new_empty(q.shape)


@torch.library.register_fake("ptsolve::flash_attention_varlen", lib=_LIB)
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
      max_seqlen_q: int, max_seqlen_k: int, causal: bool, softmax_scale: float, sm_margin: int = 0) -> torch.Tensor:
    return q.new_empty(q.shape)


@torch.library.register_fake("ptsolve::flash_attention_kvcache", lib=_LIB)
def _(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor, causal: bool,
      softmax_scale: float, softcap: float = 0.0, sm_margin: int = 0) -> torch.Tensor:
    return q.new_empty(q.shape)


@torch.library.register_fake("ptsolve::flash_attention_paged", lib=_LIB)
def _(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
      page_table: torch.Tensor, causal: bool, softmax_scale: float, softcap: float = 0.0,
      sm_margin: int = 0) -> torch.Tensor:
    return q.new_empty(q.shape)


@torch.library.register_fake("ptsolve::flash_attention_lse", lib=_LIB)
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
      softmax_scale: float, sm_margin: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    return q.new_empty(q.shape), q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)


@torch.library.register_fake("ptsolve::flash_attention_varlen_lse", lib=_LIB)
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
      max_seqlen_q: int, max_seqlen_k: int, causal: bool, softmax_scale: float,
      sm_margin: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    return q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


@torch.library.register_fake("ptsolve::flash_attention_features", lib=_LIB)
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor | None,
      cu_seqlens_k: torch.Tensor | None, seqused_q: torch.Tensor | None, seqused_k: torch.Tensor | None,
      max_seqlen_q: int, max_seqlen_k: int, causal: bool, softmax_scale: float, softcap: float, window_left: int,
      window_right: int, sm_margin: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    lse = (q.shape[1], q.shape[0]) if cu_seqlens_q is not None else (q.shape[0], q.shape[2], q.shape[1])
    return q.new_empty(q.shape), q.new_empty(lse, dtype=torch.float32)


@torch.library.register_fake("ptsolve::gemm", lib=_LIB)
def _(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.new_empty((a.shape[0], b.shape[0]))


@torch.library.register_fake("ptsolve::mamba_chunk_scan", lib=_LIB)
def _(cb: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, dA_cumsum: torch.Tensor, C: torch.Tensor,
      states: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape)


@torch.library.register_fake("ptsolve::mamba_chunk_state", lib=_LIB)
def _(B: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, dA_cumsum: torch.Tensor) -> torch.Tensor:
    return x.new_empty((x.shape[0], dt.shape[2], x.shape[2], x.shape[3], B.shape[-1]), dtype=torch.float32)


_compiling = torch.compiler.is_compiling
_empty_like = torch.empty_like
_CF = torch.contiguous_format
# torch's current CUDA stream on a device, as a raw handle (the private binding skips building a Stream object)
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda dev: torch.cuda.current_stream(dev).cuda_stream)
# warm path: (input addresses, shapes, strides, dtypes, scalars) -> the prepared launch (codegen.runtime.Launch; with
# an output template where the output's shape is not an input's) of inputs that were checked and that the kernel took
# as they are; a hit allocates the output and launches: ~1 µs of Python besides the allocation and cuLaunchKernel
_FAST: dict[tuple[Any, ...], Any] = {}
_GROW: dict[tuple[Any, ...], Any] = {}  # _grow_key -> serve.DecodeFamily
_MOVE: dict[tuple[Any, ...], Any] = {}  # _move_key -> serve.AttentionFamily (dense calls of one layout, any address)
_SEEN: set[tuple[Any, ...]] = set()  # _move_key of dense calls prepared once


def _fast_put(key: tuple[Any, ...], ln: Any) -> bool:
    """Keep ``ln`` under ``key``; False where it is not kept (a provisional launch)."""
    if isinstance(ln[0] if isinstance(ln, tuple) else ln, _gen().prepared.Provisional):
        return False  # the shape's exact-shape schedule is on its way (ptsolve.serve.exact): the next call looks again
    if len(_FAST) >= 4096:
        _FAST.clear()
    _FAST[key] = ln
    return True


# ---------------------------------------------------------------------------------------------- the API


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    softmax_scale: float | None = None, return_lse: bool = False, softcap: float = 0.0,
                    window_size: tuple[int, int] = (-1, -1), attention_chunk: int = 0, sm_margin: int = 0) -> Any:
    """softmax(q kᵀ · scale [+ causal mask]) v: q [B, Sq, H, D], k / v [B, Skv, Hkv, D] → [B, Sq, H, D] (contiguous).
    ``causal``: bottom-right aligned (query i sees keys ≤ i + Skv − Sq; rows that see none are zeros).
    ``return_lse``: also the rows' softmax log-sum-exp, float32 [B, H, Sq] (natural log of Σ exp(q·k · scale); +inf
    for a row that sees no key), as FlashAttention-3 returns it: ``(out, lse)``, from the class's prefill kernel at
    any seq_q (the split-KV decode and exact-shape kernels do not write it). ``softcap`` > 0: scores become
    softcap · tanh(q·k · scale / softcap) (Gemma-2's); ``window_size`` (left, right): query i sees keys
    i + Skv − Sq − left .. i + Skv − Sq + right (-1 unbounded; causal sets right to 0), FlashAttention's sliding
    window. Either runs the class's prefill kernel built with it, at any seq_q; a decode step (at most 16 query
    positions, head_dim 64 or 128) with a softcap and no window runs the split-KV decode kernel's softcap variant.
    ``attention_chunk`` = C > 0 (Llama-4's chunked local attention, FlashAttention-3's): query i, at p = i + Skv − Sq,
    also sees only keys of its chunk, ⌊p / C⌋·C .. ⌊p / C⌋·C + C − 1 (a row with p < 0 sees none), with causal, the
    window and the softcap as given: every query in one chunk runs the dense kernels on that chunk's keys (a view),
    otherwise each (sequence, chunk) is a sequence of the varlen kernel (``_chunked``; the LSE then a [B, H, Sq]
    view). ``sm_margin``: SMs left free for other work (``_margin``); ShapeError from the device's SM count on."""
    if attention_chunk or sm_margin:
        sm_margin = _margin("flash_attention", sm_margin, q) if sm_margin else 0
        if _chunk("flash_attention", attention_chunk):
            return _chunked(q, k, v, bool(causal), softmax_scale, return_lse, softcap, window_size, attention_chunk,
                            sm_margin)
    return _attend(q, k, v, causal, softmax_scale, return_lse, softcap, window_size, sm_margin)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, softmax_scale: float | None,
            return_lse: bool, softcap: Any, window_size: Any, margin: int = 0) -> Any:
    """``flash_attention`` without a chunk (see there); ``margin``: SMs left free (validated)."""
    if softcap or tuple(window_size) != (-1, -1):
        if not (_compiling() or return_lse) and tuple(window_size) == (-1, -1) and isinstance(softcap, (int, float)):
            out = _flash_attention_warm(q, k, v, causal, softmax_scale, softcap, margin)  # a softcap decode step
            if out is not None:
                return out
        causal = bool(causal)
        scale = _check_attention(q, k, v, 4, causal, softmax_scale)
        feat = _features("flash_attention", q.shape[1], k.shape[1], causal, softcap, window_size)
        windowed = tuple(window_size) != (-1, -1)
        if windowed and q.shape[1] == 1 and k.shape[1]:
            # one query with a window sees keys skv - 1 - left .. skv - 1: attention over that view, whose dense
            # kernels (split-KV for a decode step, capped or not: a sliding-window model's decode on a long cache,
            # Gemma-2's local layers) need no mask
            start = max(0, k.shape[1] - 1 - feat[1]) if feat[1] >= 0 else 0
            return _attend(q, k[:, start:], v[:, start:], False, scale, return_lse, feat[0], (-1, -1), margin)
        if not (windowed or return_lse) and _decodes(q, k, causal):  # a capped decode step: the split-KV kernel
            if _compiling():
                return torch.ops.ptsolve.flash_attention(q, k, v, causal, scale, feat[0], margin)
            return _flash_attention_cold(q, k, v, causal, scale, softmax_scale, feat[0], margin)
        out, lse = _run_features((q, k, v, None, None, None, None, q.shape[1], k.shape[1], causal, scale, *feat),
                                 margin)
        return (out, lse) if return_lse else out
    if return_lse:
        causal = bool(causal)
        scale = _check_attention(q, k, v, 4, causal, softmax_scale)
        if _compiling():
            return torch.ops.ptsolve.flash_attention_lse(q, k, v, causal, scale, margin)
        return _flash_attention_lse_cuda(q, k, v, causal, scale, margin)
    if not _compiling():
        out = _flash_attention_warm(q, k, v, causal, softmax_scale, 0.0, margin)
        if out is not None:
            return out
    causal = bool(causal)
    scale = _check_attention(q, k, v, 4, causal, softmax_scale)
    if _compiling():
        return torch.ops.ptsolve.flash_attention(q, k, v, causal, scale, 0.0, margin)
    return _flash_attention_cold(q, k, v, causal, scale, softmax_scale, 0.0, margin)


def flash_attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                           softmax_scale: float | None = None, return_lse: bool = False,
                           seqused_q: torch.Tensor | None = None, seqused_k: torch.Tensor | None = None,
                           softcap: float = 0.0, window_size: tuple[int, int] = (-1, -1), attention_chunk: int = 0,
                           sm_margin: int = 0) -> Any:
    """Variable-length batches, packed as flash-attn's: q [total_q, H, D], k / v [total_k, Hkv, D], sequence b
    at rows cu_seqlens[b] .. cu_seqlens[b+1] (int32 [B+1] on the device); ``max_seqlen_*`` the longest ones.
    ``return_lse``: ``(out, lse)`` with the rows' log-sum-exp, float32 [H, total_q] (``flash_attention``'s).
    ``seqused_q`` / ``seqused_k`` (int32 [B] on the device, FlashAttention-3's): sequence b is only its first
    seqused[b] rows from cu_seqlens[b] (at most the rows cu_seqlens gives it, not checked on the device); output
    and log-sum-exp rows past seqused_q are not written, as FlashAttention-3's; keys past seqused_k are never
    attended to but must be finite (their block is loaded and masked: P = 0 times NaN is NaN). ``softcap``,
    ``window_size``: ``flash_attention``'s (normalised against ``max_seqlen_*``). ``attention_chunk``:
    ``flash_attention``'s, per sequence at its own lengths (seqused's where given): each (sequence, chunk) is a
    sequence of the varlen kernel, their offsets made on the device from cu_seqlens / seqused, at most
    ⌈(max_seqlen_q − 1) / C⌉ + 1 pieces per sequence (``max_seqlen_q`` must bound every sequence's queries: rows
    beyond it would not be written). ``sm_margin``: ``flash_attention``'s."""
    causal = bool(causal)
    sm_margin = _margin("flash_attention_varlen", sm_margin, q) if sm_margin else 0
    chunk = _chunk("flash_attention_varlen", attention_chunk)
    scale = _check_attention(q, k, v, 3, causal, softmax_scale)
    for n, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if cu.dtype != torch.int32 or cu.dim() != 1 or cu.device != q.device:
            raise ShapeError(f"{n} must be a 1-D torch.int32 tensor on {q.device}, got {cu.dtype} "
                             f"{tuple(cu.shape)} on {cu.device}")
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise ShapeError(f"cu_seqlens_q {tuple(cu_seqlens_q.shape)} and cu_seqlens_k {tuple(cu_seqlens_k.shape)} "
                         "must both have batch + 1 entries")
    if min(max_seqlen_q, max_seqlen_k) < 0:
        raise ShapeError(f"max_seqlen_q={max_seqlen_q}, max_seqlen_k={max_seqlen_k} must be >= 0")
    B = cu_seqlens_q.shape[0] - 1
    for n, u in (("seqused_q", seqused_q), ("seqused_k", seqused_k)):
        _per_sequence(n, u, B, q.device)
    if chunk:
        lens = tuple(cu.diff() if u is None else u for cu, u in ((cu_seqlens_q, seqused_q), (cu_seqlens_k, seqused_k)))
        out, lse = _chunk_attend("flash_attention_varlen", (q, k, v), (cu_seqlens_q, cu_seqlens_k), lens,
                                 (int(max_seqlen_q), int(max_seqlen_k)), _chunk_count(max_seqlen_q, chunk), causal,
                                 scale, (softcap, *_window(window_size)), chunk, sm_margin)
        return (out, lse) if return_lse else out
    if softcap or tuple(window_size) != (-1, -1) or seqused_q is not None or seqused_k is not None:
        fa = (q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, int(max_seqlen_q), int(max_seqlen_k), causal,
              scale, *_features("flash_attention_varlen", max_seqlen_q, max_seqlen_k, causal, softcap, window_size))
        out, lse = _run_features(fa, sm_margin)
        return (out, lse) if return_lse else out
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), causal, scale, sm_margin)
    if return_lse:
        return torch.ops.ptsolve.flash_attention_varlen_lse(*args) if _compiling() else \
            _flash_attention_varlen_lse_cuda(*args)
    if _compiling():
        return torch.ops.ptsolve.flash_attention_varlen(*args)
    return _flash_attention_varlen_cuda(*args)


def flash_attention_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            cache_seqlens: torch.Tensor | int, causal: bool = False,
                            softmax_scale: float | None = None, softcap: float = 0.0,
                            window_size: tuple[int, int] = (-1, -1), return_lse: bool = False,
                            cache_batch_idx: torch.Tensor | None = None,
                            cache_leftpad: torch.Tensor | None = None, k: torch.Tensor | None = None,
                            v: torch.Tensor | None = None, rotary_cos: torch.Tensor | None = None,
                            rotary_sin: torch.Tensor | None = None, rotary_interleaved: bool = True,
                            rotary_seqlens: torch.Tensor | None = None, cu_seqlens_q: torch.Tensor | None = None,
                            max_seqlen_q: int | None = None, cu_seqlens_k_new: torch.Tensor | None = None,
                            page_table: torch.Tensor | None = None, attention_chunk: int = 0,
                            sm_margin: int = 0) -> Any:
    """Decode against a preallocated KV cache, as flash-attn's ``flash_attn_with_kvcache`` without appending:
    q [B, Sq, H, D] with Sq <= 16, k_cache / v_cache [B, S_cache, Hkv, D] (any strides with the last dim
    contiguous, e.g. a [B, Hkv, S_cache, D] cache transposed), ``cache_seqlens`` int32 [B] on q's device (or one
    int for all): sequence b attends to its first cache_seqlens[b] keys (clamped to 0 .. S_cache; a row that sees
    none is zeros). ``causal``: bottom-right aligned at that length (query i of Sq sees keys <= i + len − Sq). The
    kernel reads the lengths on the device: write the step's keys into the cache, update ``cache_seqlens`` in place,
    and the same launch (or captured CUDA graph) serves every step. The keys are split across CTAs as for the whole
    cache (``ptsolve.ops.decode.length_pieces``). ``softcap`` (``flash_attention``'s) alone runs the decode kernel's
    softcap variant. ``window_size`` (``flash_attention``'s, the window bottom-right at each length), ``return_lse``
    ((out, lse), lse float32 [B, H, Sq]), ``cache_batch_idx`` (int32 [B]: sequence b reads cache row
    cache_batch_idx[b]), ``cache_leftpad`` (int32 [B]: its keys start there,
    ending at cache_seqlens[b]), more than 16 query positions and head_dim 96, 192, 256 run the varlen kernel on the
    cache (``_kvcache_packed``: FlashAttention-3's semantics; no split-KV). ``k`` / ``v`` [B, S_new, Hkv, D]: written
    into the cache at rows cache_seqlens[b] .. + S_new first (the cache is updated in place, ``cache_seqlens`` is
    not), attention then sees cache_seqlens[b] + S_new keys; ``rotary_cos`` / ``rotary_sin`` [S_ro, R/2]: the new
    keys, and q, rotated on their first R dims at positions ``rotary_seqlens`` (default cache_seqlens) + i (q all
    at that position unless causal or windowed), pairs interleaved or halves (``rotary_interleaved``); both in
    PyTorch on the host's stream before the kernel, as FlashAttention-3's arguments mean. Varlen, as
    FlashAttention-3: ``cu_seqlens_q`` (int32 [B + 1]) with q [total_q, H, D] and ``max_seqlen_q`` (its longest
    sequence) → out [total_q, H, D] (lse [H, total_q]); ``cu_seqlens_k_new`` (int32 [B + 1]) with k / v
    [total_new, Hkv, D]; each sequence's queries bottom-right aligned at its own length (the varlen kernel). A paged
    cache (vLLM's): ``page_table`` int32 [B, max_pages] with k_cache / v_cache [pages, PAGE, Hkv, D], sequence b's
    key j in page page_table[b, j // PAGE] at row j % PAGE; PAGE a power of two from 16 to 256 (8 or more that
    divides the kernel's key block or that it divides); decode steps with or without a softcap only (the split-KV
    decode kernel, each key block loaded from its pages). ``attention_chunk``: ``flash_attention``'s at each
    sequence's lengths on the device (keys counted from the leftpad, FA3's): a one-query decode step runs split-KV
    over its chunk's pages (``_as_pages``, ``_paged_chunk``), the rest the varlen kernel over the cache
    (``_kvcache_packed``). ``sm_margin``: ``flash_attention``'s."""
    softcap, chunk = softcap or 0.0, _chunk("flash_attention_kvcache", attention_chunk)
    sm_margin = _margin("flash_attention_kvcache", sm_margin, q) if sm_margin else 0
    if not isinstance(softcap, (int, float)):  # the kept launches' keys hash it: a ShapeError naming it first
        _features("flash_attention_kvcache", q.shape[1], k_cache.shape[1], causal, softcap, (-1, -1))
    if page_table is not None:
        asked = {n: x for n, x in (("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad), ("k", k),
                                   ("v", v), ("rotary_cos", rotary_cos), ("cu_seqlens_q", cu_seqlens_q),
                                   ("cu_seqlens_k_new", cu_seqlens_k_new)) if x is not None}
        asked |= {n: x for n, x in (("return_lse", return_lse), ("window_size", tuple(window_size) != (-1, -1)),
                                    ("attention_chunk", chunk)) if x}
        return _kvcache_paged(q, k_cache, v_cache, cache_seqlens, causal, softmax_scale, page_table, asked, softcap,
                              sm_margin)
    rope = (rotary_cos, rotary_sin, rotary_interleaved, rotary_seqlens)
    general = cu_seqlens_q is not None or cu_seqlens_k_new is not None or tuple(window_size) != (-1, -1) \
        or return_lse or cache_batch_idx is not None or cache_leftpad is not None or k is not None or v is not None
    if general or chunk or q.dim() != 4 or q.shape[1] > _gen().DECODE_MAX_SEQ_Q \
            or q.shape[-1] not in _gen().DECODE_HEAD_DIMS:
        return _kvcache_general(q, k_cache, v_cache, cache_seqlens, causal, softmax_scale,
                                (softcap, window_size, return_lse), (k, v, cu_seqlens_k_new), rope, cache_batch_idx,
                                cache_leftpad, cu_seqlens_q, max_seqlen_q, chunk, sm_margin)
    if isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((q.shape[0],), cache_seqlens, dtype=torch.int32, device=q.device)
    if rotary_cos is not None:  # q rotated, then the split-KV decode kernel as without
        _per_sequence("cache_seqlens", cache_seqlens, q.shape[0], q.device)
        q = _kvcache_append(_rows("q", q, None, None, q.shape[0]), k_cache, v_cache, cache_seqlens, None, None, rope,
                            None, None, bool(causal))[0].x.view(q.shape)
    if not _compiling():
        key = _kvcache_key(q, k_cache, v_cache, cache_seqlens, causal, softmax_scale, softcap, sm_margin)
        out = _kvcache_warm(q, key)
        if out is not None:
            return out
    causal = bool(causal)
    scale = _check_attention(q, k_cache, v_cache, 4, causal, softmax_scale)
    _per_sequence("cache_seqlens", cache_seqlens, q.shape[0], q.device)
    sc = _features("flash_attention_kvcache", q.shape[1], k_cache.shape[1], causal, softcap, (-1, -1))[0]
    if _compiling():
        return torch.ops.ptsolve.flash_attention_kvcache(q, k_cache, v_cache, cache_seqlens, causal, scale, sc,
                                                         sm_margin)
    return _kvcache_cold(q, k_cache, v_cache, cache_seqlens, causal, scale, key, softcap=sc, margin=sm_margin)


def gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a · bᵀ: a [..., K], b [N, K] (F.linear(a, b)'s layout) → [..., N]; fp32 accumulation. K a multiple of 8 (the
    16-byte rows TMA loads); N any (not a multiple of 8: the class whose kernel stores C from registers)."""
    if not _compiling():
        key = ("gemm", a.data_ptr(), b.data_ptr(), a.shape, a.stride(), b.shape, b.stride(), a.dtype, b.dtype)
        hit = _FAST.get(key)
        if hit is not None:
            out = _empty_like(hit[1], memory_format=_CF)
            hit[0](_raw_stream(a.get_device()), out.data_ptr())
            return out
    _same("gemm", {"a": a, "b": b})
    _dtype(a, "a")
    if a.dim() < 1 or b.dim() != 2 or a.shape[-1] != b.shape[1]:
        raise ShapeError(f"gemm takes a [..., K] and b [N, K]; got {tuple(a.shape)} and {tuple(b.shape)}")
    K, N = b.shape[1], b.shape[0]
    if K % 8:
        raise ShapeError(f"gemm: K={K} must be a multiple of 8 (the 16-byte rows TMA loads of a and b); pad K "
                         "with zeros")
    a2 = a.reshape(-1, K)
    if _compiling():
        out = torch.ops.ptsolve.gemm(a2, b)
        return out if a.dim() == 2 else out.reshape(*a.shape[:-1], N)
    # the launch is kept under the caller's key only where a2 is a view of a (not a copy reshape made)
    return _gemm_cold(a2, b, (*a.shape[:-1], N), key if a2.data_ptr() == a.data_ptr() else None)


# ---------------------------------------------------------------------------------------------- transformers


def hf_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
                 scaling: float | None = None, dropout: float = 0.0, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """An attention function for transformers' ``AttentionInterface``: query [B, H, Sq, D], key / value
    [B, Hkv, Skv, D] → ([B, Sq, H, D], None). Causal when the module is (bottom-right aligned, which is also what
    a KV cache's prefill, chunked prefill, speculative steps and decode need). No mask means what it means to
    transformers' SDPA path: with one query every key, with more queries SDPA's top-left causal (a static cache's
    prefill), run on the first Sq keys. A mask transformers built (its SDPA mask, ``register_transformers``) must be
    that causal mask on each sequence's first n_b keys
    (``_mask_lengths``): all of them (a dynamic cache), or the filled part of a static cache, whose decode steps run
    ``flash_attention_kvcache`` on the whole cache (its addresses fixed: the launch is kept from step to step) and
    whose prefill runs on the filled part. Other masks (a padded batch) are a ShapeError (run padded batches through
    ``flash_attention_varlen``). No dropout (inference). A module's ``softcap`` (Gemma-2's
    ``attn_logit_softcapping``) and ``sliding_window`` (keys q − sliding_window + 1 .. q, transformers' sliding mask)
    run ``flash_attention``'s softcap and window (the mask then checked as the sliding one; a static cache's steps
    through ``flash_attention_kvcache``: the decode kernel's softcap variant, the varlen path with a window), a window
    except under torch.compile with a mask (ShapeError)."""
    if dropout:
        raise ShapeError(f"dropout={dropout}: ptsolve's attention is forward-only inference; use model.eval()")
    causal = bool(kwargs.get("is_causal", getattr(module, "is_causal", True)))
    sw, cap = kwargs.get("sliding_window"), kwargs.get("softcap")
    feat = {"softcap": float(cap or 0.0), "window_size": (int(sw) - 1, -1) if sw else (-1, -1)} if sw or cap else {}
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    if attention_mask is None:
        sq, skv = q.shape[1], k.shape[1]
        if causal and 1 < sq < skv:
            # no mask means SDPA's is_causal, top-left aligned: query i sees keys <= i (a static cache's prefill: the
            # slots past the prompt are empty), i.e. bottom-right causal on the first sq keys
            k, v = k[:, :sq], v[:, :sq]
        elif causal and sq > skv:
            raise ShapeError(f"attn_implementation='ptsolve': {sq} queries against {skv} keys with no mask means "
                             "top-left causal attention, which leaves the last queries more keys than ptsolve's "
                             "bottom-right mask; pass the mask")
        return flash_attention(q, k, v, causal=causal, softmax_scale=scaling, **feat), None
    if _compiling():
        if sw:
            raise ShapeError(f"attn_implementation='ptsolve' under torch.compile: sliding_window={sw!r} with a "
                             "masked (static) cache; ptsolve's kv-cache decode kernel has no window yet")
        return _hf_compiled(q, k, v, attention_mask, causal, scaling, float(cap or 0.0)), None
    got = _mask_lengths(attention_mask, causal, q.shape[1], k.shape[1], q.shape[0], int(sw) - 1 if sw else -1)
    if got is None:
        raise ShapeError(f"attn_implementation='ptsolve': the model's attention mask {tuple(attention_mask.shape)} "
                         "is not the causal mask on each sequence's first keys (a padded batch?); ptsolve's kernels "
                         "apply no other: use unpadded batches, or ptsolve.torch.flash_attention_varlen for padded "
                         "ones")
    lens, n = got
    if min(n) == k.shape[1]:  # every key: the mask is the one the kernel applies anyway
        return flash_attention(q, k, v, causal=causal, softmax_scale=scaling, **feat), None
    if q.shape[1] <= _gen().DECODE_MAX_SEQ_Q or feat:  # a static cache's decode or speculative step: the whole cache
        return flash_attention_kvcache(q, k, v, lens, causal=causal, softmax_scale=scaling, **feat), None
    if len(set(n)) > 1:
        raise ShapeError(f"attn_implementation='ptsolve': a {q.shape[1]}-position step against a static cache filled "
                         f"to different lengths {sorted(set(n))}: ptsolve runs such steps (more than "
                         f"{_gen().DECODE_MAX_SEQ_Q} positions) on equal lengths only")
    return flash_attention(q, k[:, :n[0]], v[:, :n[0]], causal=causal, softmax_scale=scaling, **feat), None


_MASKS: dict[tuple[int, bool, int], tuple[Any, Any]] = {}
_LENS: dict[tuple[str, int], list[Any]] = {}  # (device, batch) -> [the buffer, the mask whose lengths it holds]


def _mask_shaped(mask: Any, sq: int, skv: int, batch: int) -> bool:
    """Is ``mask`` a tensor of transformers' attention-mask shape [batch or 1, 1, Sq, Skv]?"""
    return (isinstance(mask, torch.Tensor) and mask.dim() == 4 and mask.shape[0] in (1, batch)
            and mask.shape[1] == 1 and tuple(mask.shape[-2:]) == (sq, skv))


def _mask_prefix(mask: torch.Tensor, causal: bool, sq: int, skv: int, left: int = -1
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """On the device: (n, ok) of a transformers mask [batch or 1, 1, Sq, Skv] (bool, True attends, or additive
    float, 0 attends): n one past the last key its last query position sees per sequence, ok whether the mask is
    the kernel's on each sequence's first n keys (key j seen by query i iff j < n and, with ``causal``,
    j <= i + n - Sq; with a window ``left`` >= 0 also j >= i + n - Sq - left: transformers' sliding mask)."""
    keep = (mask if mask.dtype == torch.bool else mask == 0)[:, 0]  # [batch or 1, Sq, Skv]
    j = torch.arange(skv, device=mask.device)[None, :]
    n = (keep[:, -1] * (j + 1)).amax(-1)  # the last query position sees its sequence's last key
    i = torch.arange(sq, device=mask.device)[:, None]
    edge = n[:, None, None] - (sq - 1 - i)[None] if causal else n[:, None, None]
    want = j[None] < edge
    if left >= 0:
        want &= j[None] >= n[:, None, None] - (sq - i)[None] - left
    return n, (keep == want).all()


def _hf_compiled(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, causal: bool,
                 scale: float | None, softcap: float = 0.0) -> torch.Tensor:
    """``hf_attention`` with a mask inside a compiled graph (torch.compile, e.g. ``mode="reduce-overhead"`` over a
    static cache's decode steps): the lengths come from the mask on the device, with no host synchronisation and so
    no graph break, and the step runs ``flash_attention_kvcache`` on the whole cache (at most DECODE_MAX_SEQ_Q
    positions). The mask's shape is checked while tracing; that it is the causal mask on each sequence's first keys
    (``_mask_lengths``' check, which needs the host) is checked on the device, and a step whose mask is not (a padded
    batch) returns NaN rather than a wrong answer. ``softcap``: the module's (the decode kernel's softcap variant)."""
    sq, skv, batch = q.shape[1], k.shape[1], q.shape[0]
    if not _mask_shaped(mask, sq, skv, batch):
        raise ShapeError(f"attn_implementation='ptsolve' under torch.compile: an attention mask of shape "
                         f"{tuple(getattr(mask, 'shape', ()))}; ptsolve takes transformers' [batch, 1, {sq}, {skv}] "
                         "mask of a causal model")
    if sq > _gen().DECODE_MAX_SEQ_Q:
        raise ShapeError(f"attn_implementation='ptsolve' under torch.compile: a {sq}-position step against a masked "
                         f"(static) cache; compiled steps take at most {_gen().DECODE_MAX_SEQ_Q} positions (run the "
                         "prefill eagerly, as transformers' generate does)")
    n, ok = _mask_prefix(mask, causal, sq, skv)
    out = flash_attention_kvcache(q, k, v, n.to(torch.int32).expand(batch).contiguous(), causal=causal,
                                  softmax_scale=scale, softcap=softcap)
    return torch.where(ok, out, torch.full_like(out, math.nan))


def _mask_lengths(mask: Any, causal: bool, sq: int, skv: int, batch: int, left: int = -1
                  ) -> tuple[torch.Tensor, list[int]] | None:
    """Is a transformers attention mask ([batch or 1, 1, Sq, Skv]; bool, True attends, or additive float, 0 attends)
    the kernel's mask on each sequence's first n_b keys: key j seen by query i iff j < n_b and, with ``causal``,
    j <= i + n_b - Sq (n_b = Skv: a dynamic cache's mask; n_b < Skv: a static cache's unfilled slots)? Then the
    lengths, as an int32 [batch] tensor on the mask's device and as a host list, else None. Checked on the device once
    per mask object (transformers builds one per forward and every layer passes it: one synchronisation a step), kept
    by identity through a weak reference. The tensor is one buffer per (device, batch), filled with the lengths of the
    mask last asked about, so the launches that read it stay the same from step to step (``flash_attention_kvcache``'s
    kept launch); a buffer filled by another mask since is filled again (a device copy, in stream order).
    ``left``: a sliding window's left size (``_mask_prefix``)."""
    if not _mask_shaped(mask, sq, skv, batch):
        return None
    key = (id(mask), causal, batch, left)
    hit = _MASKS.get(key)
    if hit is None or hit[0]() is not mask:
        n, ok = _mask_prefix(mask, causal, sq, skv, left)
        got = torch.cat([ok.view(1).to(torch.int64), n.to(torch.int64)]).tolist()  # the one synchronisation
        lens = got[1:] * (batch // len(got[1:]))
        out = (n.to(torch.int32).expand(batch).contiguous(), lens) if got[0] else None
        if len(_MASKS) >= 1024:
            _MASKS.clear()
        hit = _MASKS[key] = (weakref.ref(mask), out)
    if hit[1] is None:
        return None
    held = _LENS.get((str(mask.device), batch))
    if held is None:
        held = _LENS[(str(mask.device), batch)] = [torch.empty(batch, dtype=torch.int32, device=mask.device), None]
    if held[1] is None or held[1]() is not mask:
        held[0].copy_(hit[1][0])
        held[1] = weakref.ref(mask)
    return held[0], hit[1][1]


def _check_mamba(name: str, x: torch.Tensor, BC: torch.Tensor, dt: torch.Tensor, dA_cumsum: torch.Tensor) -> None:
    _same(name, {"x": x, "B/C": BC})
    if x.dim() != 4 or BC.dim() != 4 or dt.dim() != 4:
        raise ShapeError(f"{name}: x (b, L, h, p), B/C (b, L, g, n), dt (b, h, nc, chunk) expected; got "
                         f"{tuple(x.shape)}, {tuple(BC.shape)}, {tuple(dt.shape)}")
    if dt.dtype != torch.float32 or dA_cumsum.dtype != torch.float32:
        raise ShapeError(f"{name}: dt and dA_cumsum must be torch.float32 (mamba_ssm's), got {dt.dtype}, "
                         f"{dA_cumsum.dtype}")
    _gen().mamba_class("mamba2_chunk_scan", _dtype(x, "x"), x.shape[-1], BC.shape[-1], dt.shape[-1])


def mamba_chunk_scan(cb: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, dA_cumsum: torch.Tensor, C: torch.Tensor,
                     states: torch.Tensor) -> torch.Tensor:
    """Mamba2 SSD ChunkScan with mamba_ssm's argument layout (``_chunk_scan_fwd`` without D, z, seq_idx):
    cb (b, nc, g, chunk, chunk), x (b, L, h, p), dt / dA_cumsum (b, h, nc, chunk) float32, C (b, L, g, n), states
    (b, nc, h, p, n) → out (b, L, h, p) in x's dtype. A float32 cb (mamba_ssm's ``_bmm_chunk_fwd`` output) is read
    as it is (the class with ``cb_dtype`` "fp32": P = CB·decay rounded once), a cb in x's dtype too. Shape-generic:
    one kernel per class (dtype, head_dim p, d_state n, chunk, cb dtype), batch, seq, heads and ngroups are its
    arguments (the cubin is cached on disk)."""
    if not _compiling():
        key = _scan_key(cb, x, dt, dA_cumsum, C, states)
        ln = _FAST.get(key)
        if ln is not None:
            out = _empty_like(x, memory_format=_CF)
            ln(_raw_stream(x.get_device()), out.data_ptr())
            return out
    _check_mamba("mamba_chunk_scan", x, C, dt, dA_cumsum)
    if _compiling():
        return torch.ops.ptsolve.mamba_chunk_scan(cb, x, dt, dA_cumsum, C, states)
    return _scan_cold(cb, x, dt, dA_cumsum, C, states, key)


def mamba_chunk_state(B: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, dA_cumsum: torch.Tensor) -> torch.Tensor:
    """Mamba2 SSD ChunkState with mamba_ssm's argument layout (``_chunk_state_fwd(B, x, dt, dA_cumsum)``, states
    in float32): B (b, L, g, n), x (b, L, h, p), dt / dA_cumsum (b, h, nc, chunk) float32 → states
    (b, nc, h, p, n) float32. Shape-generic, as ``mamba_chunk_scan``."""
    if not _compiling():
        key = _state_key(B, x, dt, dA_cumsum)
        hit = _FAST.get(key)
        if hit is not None:
            out = _empty_like(hit[1], memory_format=_CF)
            hit[0](_raw_stream(x.get_device()), out.data_ptr())
            return out
    _check_mamba("mamba_chunk_state", x, B, dt, dA_cumsum)
    if _compiling():
        return torch.ops.ptsolve.mamba_chunk_state(B, x, dt, dA_cumsum)
    return _state_cold(B, x, dt, dA_cumsum, key)


def register_transformers(name: str = "ptsolve") -> str:
    """Register ``hf_attention`` with transformers under ``name`` (then ``attn_implementation=name``), with
    transformers' SDPA mask builder beside it where transformers has the mask interface: it builds no mask where
    none is needed (decode, unpadded prefill), and one that ``hf_attention`` checks otherwise. Returns ``name``."""
    import transformers

    transformers.AttentionInterface.register(name, hf_attention)
    masks = getattr(transformers, "AttentionMaskInterface", None)
    if masks is not None:
        from transformers.masking_utils import sdpa_mask
        masks.register(name, sdpa_mask)
    return name


from .ssd import mamba_chunk_scan_combined  # noqa: E402  (Mamba2's whole SSD forward, beside its two chunk kernels)
