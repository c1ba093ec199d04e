"""FlashAttention forward in the serving layer: classes by dtype, head_dim, causal and the GQA ratio's bucket (batch,
sequence lengths and heads are kernel arguments), dense and varlen launchers."""
from __future__ import annotations

import math
from typing import Any

from ptsolve.errors import ShapeError

from . import exact, prepared
from .classes import DTYPES, OpClasses, ShapeClass, dtype_ok, register
from .kernels import kernel

# FlashAttention-3's head dims; 96 runs in padded 128-column tiles (ptsolve.geometry.attention.head_cols)
HEAD_DIMS = (64, 96, 128, 192, 256)
# GQA ratio (heads / kv_heads) buckets: (lowest ratio, name, the ratio the representative shape uses)
GQA_BUCKETS = ((1, "1", 1), (2, "2-4", 4), (5, "5+", 8))


def gqa_bucket(heads: int, kv_heads: int) -> str:
    """The bucket of heads / kv_heads (ShapeError unless kv_heads divides heads)."""
    if kv_heads < 1 or heads % kv_heads:
        raise ShapeError(f"heads={heads} is not a multiple of kv_heads={kv_heads}; each kv head must serve a whole "
                         "group of query heads")
    r = heads // kv_heads
    return next(name for lo, name, _ in reversed(GQA_BUCKETS) if r >= lo)


def attention_class(dtype: str, head_dim: int, causal: bool, heads: int, kv_heads: int, softcap: bool = False,
                    window: bool = False) -> ShapeClass:
    """The attention class of a shape (``softcap`` / ``window``: the kernel caps scores / has a sliding window);
    ShapeError for a head_dim or dtype the kernels do not cover."""
    dtype_ok(dtype)
    if head_dim not in HEAD_DIMS:
        raise ShapeError(f"head_dim={head_dim}: ptsolve's attention kernels cover head_dim {HEAD_DIMS}; pad the "
                         "head dimension or use another backend for this layer")
    return ShapeClass("flash_attention", dtype, int(head_dim), bool(causal), gqa_bucket(heads, kv_heads),
                      softcap=bool(softcap), window=bool(window))


def _key(c: ShapeClass) -> str:
    feat = ("/softcap" if c.softcap else "") + ("/window" if c.window else "")
    return f"{c.op}/{c.dtype}/d{c.head_dim}/{'causal' if c.causal else 'full'}/gqa{c.gqa}{feat}"


# what a softcap or window class is solved with: the cap's value changes no cost; a band of a quarter of the
# representative's keys (Mistral's 4096-key window over 16k) sets the trip counts the schedule is timed on
REP_SEQ = 4096
REP_FEATURES = {"softcap": 30.0, "window_left": REP_SEQ // 4}


def _representative(c: ShapeClass) -> dict[str, Any]:
    ratio = next(r for _, name, r in GQA_BUCKETS if name == c.gqa)
    return {"batch": 2, "heads": 32, "kv_heads": 32 // ratio, "seq_q": REP_SEQ, "seq_kv": REP_SEQ,
            "head_dim": c.head_dim, "causal": c.causal, "dtype": c.dtype} \
        | ({"softcap": REP_FEATURES["softcap"]} if c.softcap else {}) \
        | ({"window_left": REP_FEATURES["window_left"], "window_right": -1 if c.causal else REP_SEQ // 4}
           if c.window else {})


def _classes() -> list[ShapeClass]:
    # the plain classes first, then those with a softcap, a window or both (the table's order: plain ones unchanged)
    return [ShapeClass("flash_attention", d, hd, causal, name, softcap=sc, window=w)
            for sc, w in ((False, False), (True, False), (False, True), (True, True)) for d in DTYPES
            for hd in HEAD_DIMS for causal in (False, True) for _, name, _ in GQA_BUCKETS]


# no pinned keys: grid or persistent CTAs is the model's choice on the representative (persistent measured faster on
# 78 of 85 prefill shapes and never more than 6% slower: bench study torch_prefill)
register("flash_attention", OpClasses(key=_key, representative=_representative, classes=_classes))


def attention(q: Any, k: Any, v: Any, out: Any, c: ShapeClass, scale: float, cu_q: Any = None, cu_k: Any = None,
              max_q: int = 0, max_k: int = 0, lse: Any = None, **feat: Any) -> None:
    """Launch ``c``'s kernel: dense q [B, Sq, H, D], k/v [B, Skv, Hkv, D], or varlen (``cu_q`` / ``cu_k`` int32
    [B+1]) q [Tq, H, D], k/v [Tk, Hkv, D] with ``max_q`` / ``max_k`` the longest sequences; ``out`` contiguous like
    q. Tensors: last dim contiguous, other strides multiples of 8 elements (the caller checks). ``lse``: float32
    [B, H, Sq] (varlen [H, Tq]) for the rows' softmax log-sum-exp (natural log, +inf where a row sees no key), or
    None. ``feat``: ``attention_launch``'s features (seqused, softcap, window) and ``sm_margin``."""
    ln = attention_launch(q, k, v, c, scale, cu_q, cu_k, max_q, max_k, lse is not None, **feat)
    if lse is not None:
        ln.ptrs["lse"].value = lse.data_ptr()
    ln(prepared.current_stream(q.get_device()), out.data_ptr())


def attention_launch(q: Any, k: Any, v: Any, c: ShapeClass, scale: float, cu_q: Any = None, cu_k: Any = None,
                     max_q: int = 0, max_k: int = 0, with_lse: bool = False, used_q: Any = None, used_k: Any = None,
                     softcap: float = 0.0, window: tuple[int, int] = (-1, -1), sm_margin: int = 0) -> Any:
    """The prepared launch (``runtime.Launch``) of ``attention`` for these inputs, kept per (addresses, shapes,
    strides, scalars, SM margin); call it with the stream and the output's address. ``with_lse``: a launch of the
    class's kernel whose ``lse`` pointer (``ptrs["lse"]``) the caller sets before each call; the others' is null.
    ``used_q`` / ``used_k``: varlen's int32 [B] rows that count per sequence (FlashAttention's ``seqused_*``);
    ``softcap`` (> 0, a softcap class's) and ``window`` ((left, right) keys, -1 unbounded, a window class's).
    ``sm_margin``: SMs left free (``runtime.Launch.leave_free``): a persistent kernel's grid fills the others; a
    kernel of one CTA per tile keeps its grid. Part of the key, so calls without one keep their own launches."""
    if bool(softcap) != c.softcap or (window != (-1, -1)) != c.window:
        raise ShapeError(f"attention class {c.key} runs softcap={softcap!r}, window={window!r}: the class and the "
                         "call must agree on softcap and window (ptsolve.torch chooses the class)")
    key = ("fa", c, q.data_ptr(), k.data_ptr(), v.data_ptr(), q.shape, q.stride(), k.shape, k.stride(), v.stride(),
           scale, _ptr(cu_q), _ptr(cu_k), max_q, max_k, with_lse, _ptr(used_q), _ptr(used_k), softcap, window,
           sm_margin)
    ln = prepared.LAUNCHES.get(key)
    if ln is not None:
        return ln
    return prepared.keep(key, *_prepare(q, k, v, c, scale, cu_q, cu_k, max_q, max_k, with_lse, used_q, used_k,
                                        softcap, window, sm_margin))


class AttentionFamily:
    """Dense attention calls of one layout (shapes, strides, dtypes, class, scale) at any addresses: one private
    prepared launch whose q, k and v tensor maps a call encodes in place (``runtime.MapSlot``) before launching. A
    model's prefill makes new q / k / v every layer and every forward, so the launches kept by address
    (``attention_launch``) miss there, and preparing one costs more host time than the kernel at short prompts
    (bench models prefill_host). The launch is nobody else's: re-pointing it changes no kept launch."""

    __slots__ = ("ln", "specs")

    def __init__(self, ln: Any):
        self.ln = ln
        self.specs = tuple(ln.spec(n) for n in ("q", "k", "v"))

    def __call__(self, q: Any, k: Any, v: Any, stream: int, out: int) -> bool:
        """Launch on these inputs (of the family's layout: the caller's key); False, launching nothing, where one is
        not 16-byte aligned (a tensor map cannot describe it)."""
        qp, kp, vp = q.data_ptr(), k.data_ptr(), v.data_ptr()
        if (qp | kp | vp) % 16:
            return False
        ln, (sq, sk, sv) = self.ln, self.specs
        ln.repoint("q", qp, sq)
        ln.repoint("k", kp, sk)
        ln.repoint("v", vp, sv)
        ln(stream, out)
        return True


def attention_family(q: Any, k: Any, v: Any, c: ShapeClass, scale: float,
                     sm_margin: int = 0) -> AttentionFamily | None:
    """A family for these dense inputs' layout, running the kernel ``attention_launch`` runs for them (leaving
    ``sm_margin`` SMs free: the caller keys families by it); None while that choice is not final (the shape's
    exact-shape schedule is on its way: ``exact``) or where the kernel does not take q, k and v by tensor map."""
    ln, final = _prepare(q, k, v, c, scale, None, None, 0, 0, False, None, None, 0.0, (-1, -1), sm_margin)
    try:
        return AttentionFamily(ln) if final else None
    except KeyError:  # a kernel that takes one of q, k, v otherwise than by tensor map: calls keep preparing
        return None


def _prepare(q: Any, k: Any, v: Any, c: ShapeClass, scale: float, cu_q: Any, cu_k: Any, max_q: int, max_k: int,
             with_lse: bool, used_q: Any, used_k: Any, softcap: float, window: tuple[int, int],
             sm_margin: int = 0) -> tuple[Any, bool]:
    """(a new prepared launch of these inputs, leaving ``sm_margin`` SMs free, whether its kernel is the final
    choice for them)."""
    varlen = cu_q is not None
    ck, final = None, True
    # a dense shape runs the kernel solved and built for it once there is one (``exact``), whose softmax scale is
    # the default one (a build constant); the log-sum-exp and the features are the generic build's alone
    if not (varlen or with_lse or c.softcap or c.window) and math.isclose(scale, c.head_dim ** -0.5, rel_tol=1e-9):
        params = {"batch": q.shape[0], "heads": q.shape[2], "kv_heads": k.shape[2], "seq_q": q.shape[1],
                  "seq_kv": k.shape[1], "head_dim": c.head_dim, "causal": c.causal, "dtype": c.dtype}
        ck, final = exact.serving(c, params, lambda x: _attention_launch(q, k, v, c, x, scale, None, None, 0, 0),
                                  lambda: q.new_empty(q.shape))
    ln = _attention_launch(q, k, v, c, ck or kernel(c), scale, cu_q, cu_k, max_q, max_k,
                           {"used_q": _ptr(used_q), "used_k": _ptr(used_k), "wl": window[0], "wr": window[1]}
                           | ({"softcap_pre": scale / softcap, "scale_log2": softcap * math.log2(math.e)}
                              if softcap else {}))
    if sm_margin:
        ln.leave_free(sm_margin)  # a new launch, nobody else's: the grid of the SMs left (the same binary)
    return ln, final


def _ptr(x: Any) -> int:
    """A tensor's address, 0 for an absent one (a null pointer argument)."""
    return 0 if x is None else x.data_ptr()


def _attention_launch(q: Any, k: Any, v: Any, c: ShapeClass, ck: Any, scale: float, cu_q: Any, cu_k: Any,
                      max_q: int, max_k: int, extra: dict[str, Any] | None = None) -> Any:
    from codegen.cuda.attention import sizes, tensor_map

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
            "cu_q": _ptr(cu_q), "cu_k": _ptr(cu_k),
            "scale_log2": scale * math.log2(math.e), "lse": 0, "used_q": 0, "used_k": 0, **(extra or {}), **sz}
    return ck.prepare(vals, maps, sz["NTILES"], out="o")
