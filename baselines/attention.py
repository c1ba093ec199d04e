"""FlashAttention forward baselines: PyTorch SDPA forced onto one backend.

Backends: ``flash`` = ``SDPBackend.FLASH_ATTENTION`` (FlashAttention-2 inside PyTorch) and ``cudnn`` =
``SDPBackend.CUDNN_ATTENTION`` (cuDNN's fused attention, FA3-class on Hopper).

GQA (more query heads than kv heads) is run in one of two modes: ``native`` passes K/V with ``kv_heads``
heads and ``enable_gqa=True``; ``expand`` repeats K/V to ``heads`` heads (``repeat_interleave``, outside the
timed region) for a backend that refuses ``enable_gqa``. ``gqa_mode`` probes which one a backend accepts
on the machine at hand, since that changes between PyTorch versions; the result is recorded with the numbers.
Layout is (batch, heads, seq, head_dim), contiguous.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from codegen.harness import rel_err

BACKENDS: tuple[str, ...] = ("flash", "cudnn")


def _backend(name: str) -> Any:
    from torch.nn.attention import SDPBackend

    return {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[name]


def make_inputs(
    batch: int, heads: int, kv_heads: int, seq: int, head_dim: int, dtype: Any, seed: int = 0
) -> tuple[Any, Any, Any]:
    """Random Q (B, H, S, D) and K, V (B, Hkv, S, D) on the GPU."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(batch, kv_heads, seq, head_dim, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(batch, kv_heads, seq, head_dim, device="cuda", dtype=dtype, generator=g)
    return q, k, v


def make_fn(backend: str, q: Any, k: Any, v: Any, causal: bool, gqa: str) -> Callable[[], Any]:
    """The timed call: one SDPA forward on ``backend``; ``gqa`` is ``native`` or ``expand``.

    In ``expand`` mode K/V are repeated here, once, so the copy is not timed (the kernel then reads
    ``heads/kv_heads`` times more K/V bytes than a native GQA kernel; attention at these sizes is
    compute-bound, so this costs the expanded baseline little).
    """
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    be = _backend(backend)
    rep = q.shape[1] // k.shape[1]
    if gqa == "expand" and rep > 1:
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    native = gqa == "native" and rep > 1

    def fn() -> Any:
        with sdpa_kernel([be]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=native)

    return fn


def reference(q: Any, k: Any, v: Any, causal: bool) -> Any:
    """Float32 attention: softmax(Q K^T / sqrt(D) + mask) V, GQA by repeating K/V heads."""
    import torch

    rep = q.shape[1] // k.shape[1]
    qf = q.float()
    kf = k.float().repeat_interleave(rep, dim=1)
    vf = v.float().repeat_interleave(rep, dim=1)
    s = (qf @ kf.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        n_q, n_k = s.shape[-2], s.shape[-1]
        mask = torch.ones(n_q, n_k, device=s.device, dtype=torch.bool).triu(1)
        s = s.masked_fill(mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ vf


def check(backend: str, gqa: str, causal: bool, dtype: Any, seq: int = 256, seed: int = 1) -> float:
    """Relative Frobenius error against :func:`reference` on a small GQA shape (batch 2, 8 q / 2 kv heads).

    Raises RuntimeError if the backend refuses the inputs (e.g. ``enable_gqa`` unsupported). Pass a
    ``seq`` that is not a multiple of the tile (300, say) for the ragged case.
    """
    q, k, v = make_inputs(2, 8, 2, seq, 128, dtype, seed)
    out = make_fn(backend, q, k, v, causal, gqa)()
    return rel_err(out, reference(q, k, v, causal))


def gqa_mode(backend: str, dtype: Any, tol: float = 2e-2) -> tuple[str, str]:
    """``("native", "")`` if ``backend`` runs ``enable_gqa=True`` correctly, else ``("expand", why)``."""
    try:
        err = check(backend, "native", causal=False, dtype=dtype)
    except RuntimeError as exc:  # "No available kernel" when the backend rejects GQA
        return "expand", f"enable_gqa refused: {str(exc).splitlines()[0][:200]}"
    if not err < tol:
        return "expand", f"enable_gqa wrong: rel_err {err:.3g}"
    return "native", ""


def sdpa(backend: str, q: Any, k: Any, v: Any, causal: bool) -> tuple[Callable[[], Any] | None, str]:
    """One SDPA forward forced onto ``backend`` (``flash`` or ``cudnn``) for (B, H, S, D) inputs, GQA through
    ``enable_gqa``, causal bottom-right where seq_q != seq_kv (``causal_lower_right``: FlashAttention's rule; SDPA's
    ``is_causal`` is top-left there), tried once: ``(fn, "")``, or ``(None, why)`` where the backend refuses the
    shape (a peer that refuses is absent, never a zero time)."""
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    be = _backend(backend)
    sq, skv = q.shape[2], k.shape[2]
    gqa = q.shape[1] != k.shape[1]
    mask = causal_lower_right(sq, skv) if causal and sq != skv else None

    def fn() -> Any:
        with sdpa_kernel([be]):
            if mask is not None:
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

    try:
        out = fn()
    except Exception as e:  # noqa: BLE001  (RuntimeError "No available kernel", a cuDNN refusal, ...)
        s = str(e).strip()
        return None, f"refused: {type(e).__name__}: {s.splitlines()[0][:200] if s else ''}"
    if tuple(out.shape) != tuple(q.shape):
        return None, f"returned shape {tuple(out.shape)}, expected {tuple(q.shape)}"
    return fn, ""
