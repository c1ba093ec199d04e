"""FlashAttention-4 as a peer: ``flash-attn-4`` (the CuTe-DSL kernels, ``flash_attn.cute``), an optional extra
(``pip install -e .[peers]``; the GPU machine gets it as wheels: ``bench/peers/wheels.sh``).

Three forms, each a closure over its inputs, layout (batch, seq, heads, head_dim) as ``ptsolve.torch``'s:

- ``prefill``: ``flash_attn_func(q, k, v, causal=...)``: dense, GQA / MQA, seq_q < seq_kv causal bottom-right;
- ``varlen``: ``flash_attn_varlen_func`` with ``cu_seqlens_q`` / ``cu_seqlens_k`` (packed [total, heads, head_dim]);
- ``decode``: a few query positions against a KV cache: ``flash_attn_varlen_func`` with ``seqused_k`` (the cache's
  used lengths on the device) where it takes that, else ``flash_attn_func`` on a cache that is used to its end.

FA4's API moves between betas, so the arguments are probed at run time (``inspect.signature``), and each form is
tried once before it is timed: where FA4 lacks the argument, refuses the shape (raises) or returns something of
another shape, the peer is *absent* (``(None, why)``), never a zero time. The module is imported lazily: this file
imports without flash_attn (or torch) installed.
"""
from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

MODULE = "flash_attn.cute"

Peer = tuple["Callable[[], Any] | None", str]  # (the timed call, a note on the form used) or (None, why absent)


def load(name: str = MODULE) -> tuple[Any, str]:
    """``(module, "")``, or ``(None, why)`` where it does not import (not installed, or its CUDA libraries fail)."""
    try:
        return importlib.import_module(name), ""
    except Exception as e:  # noqa: BLE001  (ImportError, or a native library that does not load: absent either way)
        return None, f"{name} not importable: {type(e).__name__}: {_first(e)}"


def version() -> str:
    """The installed flash-attn-4 version ('' when it is not installed)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as v
    try:
        return v("flash-attn-4")
    except PackageNotFoundError:
        return ""


def _first(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0][:200] if s else ""


def kwargs_for(fn: Any, wanted: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """The keyword arguments of ``wanted`` that ``fn`` takes (all of them where it has ``**kwargs``), or None where it
    lacks one of ``required`` or is no callable with a readable signature."""
    if not callable(fn):
        return None
    try:
        ps = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in ps.values()):
        return dict(wanted)
    if any(r not in ps for r in required):
        return None
    return {k: v for k, v in wanted.items() if k in ps}


def _output(r: Any) -> Any:
    """FA4 returns ``out`` or ``(out, lse)`` depending on the beta and ``return_lse``."""
    return r[0] if isinstance(r, (tuple, list)) else r


def tried(call: Callable[[], Any], shape: tuple[int, ...], note: str = "") -> Peer:
    """``(call, note)`` where one call runs and returns an output of ``shape``; ``(None, why)`` otherwise."""
    try:
        out = call()
    except Exception as e:  # noqa: BLE001  (a refusal: NotImplementedError, AssertionError, a compile error, ...)
        return None, f"refused: {type(e).__name__}: {_first(e)}"
    got = tuple(getattr(out, "shape", ()))
    if got != tuple(shape):
        return None, f"returned shape {got}, expected {tuple(shape)}"
    return call, note


def _fn(module: Any, name: str) -> tuple[Any, str]:
    if module is None:
        module, why = load()
        if module is None:
            return None, why
    fn = getattr(module, name, None)
    return (fn, "") if fn is not None else (None, f"{MODULE} has no {name}")


def prefill(q: Any, k: Any, v: Any, causal: bool, module: Any = None) -> Peer:
    """Dense attention: q [B, Sq, H, D], k / v [B, Skv, Hkv, D]; causal bottom-right (FA4's rule)."""
    fn, why = _fn(module, "flash_attn_func")
    kw = None if fn is None else kwargs_for(fn, {"causal": bool(causal)}, ("causal",))
    if kw is None:
        return None, why or "flash_attn_func takes no causal argument"
    return tried(lambda: _output(fn(q, k, v, **kw)), tuple(q.shape), "flash_attn_func")


def varlen(q: Any, k: Any, v: Any, cu_q: Any, cu_k: Any, max_q: int, max_k: int, causal: bool,
           module: Any = None) -> Peer:
    """Packed sequences: q [Tq, H, D], k / v [Tk, Hkv, D], int32 ``cu_q`` / ``cu_k`` [B+1] on the device."""
    fn, why = _fn(module, "flash_attn_varlen_func")
    want = {"cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k, "max_seqlen_q": int(max_q), "max_seqlen_k": int(max_k),
            "causal": bool(causal)}
    kw = None if fn is None else kwargs_for(fn, want, ("cu_seqlens_q", "cu_seqlens_k", "causal"))
    if kw is None:
        return None, why or "flash_attn_varlen_func takes no cu_seqlens_q / cu_seqlens_k / causal"
    return tried(lambda: _output(fn(q, k, v, **kw)), tuple(q.shape), "flash_attn_varlen_func")


def decode(q: Any, k_cache: Any, v_cache: Any, seqlens: Any, causal: bool, full: bool, module: Any = None) -> Peer:
    """q [B, Sq, H, D] (Sq of 1 to 16) against k_cache / v_cache [B, S, Hkv, D] of which sequence b uses its first
    ``seqlens[b]`` keys (int32 [B] on the device); ``full``: every sequence uses the whole cache, so the dense form
    may stand in where the ``seqused_k`` form is refused. The note says which form ran."""
    why = ""
    fn, why_fn = _fn(module, "flash_attn_varlen_func")
    want = {"seqused_k": seqlens, "max_seqlen_q": int(q.shape[1]), "max_seqlen_k": int(k_cache.shape[1]),
            "causal": bool(causal)}
    kw = None if fn is None else kwargs_for(fn, want, ("seqused_k", "causal"))
    if kw is not None:
        call, why = tried(lambda: _output(fn(q, k_cache, v_cache, **kw)), tuple(q.shape),
                          "flash_attn_varlen_func(seqused_k)")
        if call is not None:
            return call, why
    else:
        why = why_fn or "flash_attn_varlen_func takes no seqused_k"
    if not full:
        return None, why
    call, why2 = prefill(q, k_cache, v_cache, causal, module)
    return (call, why2 + " (dense cache)") if call is not None else (None, f"{why}; dense form {why2}")
