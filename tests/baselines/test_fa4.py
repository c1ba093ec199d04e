"""FlashAttention-4's peer (``baselines.fa4``) against stand-in modules: the arguments are probed from the signature,
and where FA4 lacks one, refuses the call or returns another shape, the peer is absent with a reason (never a time).
No torch, no flash_attn: the tensors are objects with a ``shape``."""
from __future__ import annotations

import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from baselines import fa4  # noqa: E402  (imports without flash_attn installed)


class T:
    """A stand-in tensor: a shape."""

    def __init__(self, *shape: int) -> None:
        self.shape = shape


Q, K, V = T(2, 128, 8, 64), T(2, 512, 2, 64), T(2, 512, 2, 64)


def module(**fns) -> types.SimpleNamespace:
    return types.SimpleNamespace(**fns)


def test_prefill_passes_only_what_the_signature_takes_and_unwraps_out_lse():
    seen = {}

    def flash_attn_func(q, k, v, softmax_scale=None, causal=False, window_size=(None, None)):
        seen.update(causal=causal, q=q)
        return T(*q.shape), "lse"

    call, note = fa4.prefill(Q, K, V, True, module(flash_attn_func=flash_attn_func))
    assert call is not None and note == "flash_attn_func"
    out = call()
    assert out.shape == Q.shape and seen == {"causal": True, "q": Q}


def test_prefill_is_absent_where_fa4_lacks_causal_refuses_or_returns_another_shape():
    call, why = fa4.prefill(Q, K, V, True, module(flash_attn_func=lambda q, k, v: T(*q.shape)))
    assert call is None and "causal" in why

    def refuses(q, k, v, causal=False):
        raise NotImplementedError("head_dim 64 with GQA 4 is not supported on SM90")

    call, why = fa4.prefill(Q, K, V, False, module(flash_attn_func=refuses))
    assert call is None and why.startswith("refused: NotImplementedError") and "SM90" in why
    call, why = fa4.prefill(Q, K, V, False, module(flash_attn_func=lambda q, k, v, causal=False: T(1, 2)))
    assert call is None and "returned shape (1, 2)" in why
    call, why = fa4.prefill(Q, K, V, False, module())
    assert call is None and "has no flash_attn_func" in why


def test_varlen_needs_cu_seqlens_and_takes_kwargs_functions_whole():
    q, k = T(300, 8, 64), T(300, 2, 64)
    call, why = fa4.varlen(q, k, k, "cuq", "cuk", 200, 200, True,
                           module(flash_attn_varlen_func=lambda q, k, v, cu_seqlens_q=None, causal=False: q))
    assert call is None and "cu_seqlens" in why
    got = {}

    def anything(q, k, v, **kw):
        got.update(kw)
        return q

    call, _ = fa4.varlen(q, k, k, "cuq", "cuk", 200, 190, False, module(flash_attn_varlen_func=anything))
    assert call is not None and call() is q
    assert got == {"cu_seqlens_q": "cuq", "cu_seqlens_k": "cuk", "max_seqlen_q": 200, "max_seqlen_k": 190,
                   "causal": False}


def test_decode_prefers_seqused_k_and_falls_back_to_the_dense_form_only_on_a_full_cache():
    q, kc = T(4, 1, 32, 128), T(4, 4096, 8, 128)

    def varlen_ok(q, k, v, cu_seqlens_q=None, seqused_k=None, max_seqlen_q=None, max_seqlen_k=None, causal=False):
        assert seqused_k == "lens" and max_seqlen_k == 4096
        return q, None

    def varlen_refuses(q, k, v, seqused_k=None, causal=False):
        raise AssertionError("seqused_k with 4-D q is not supported")

    dense = {"flash_attn_func": lambda q, k, v, causal=False: T(*q.shape)}
    call, note = fa4.decode(q, kc, kc, "lens", False, full=True, module=module(flash_attn_varlen_func=varlen_ok))
    assert call is not None and "seqused_k" in note and call().shape == q.shape
    call, note = fa4.decode(q, kc, kc, "lens", False, full=True,
                            module=module(flash_attn_varlen_func=varlen_refuses, **dense))
    assert call is not None and "dense cache" in note
    call, why = fa4.decode(q, kc, kc, "lens", False, full=False,
                           module=module(flash_attn_varlen_func=varlen_refuses, **dense))
    assert call is None and "refused" in why
    call, why = fa4.decode(q, kc, kc, "lens", False, full=True, module=module(
        flash_attn_varlen_func=varlen_refuses, flash_attn_func=lambda q, k, v: T(*q.shape)))
    assert call is None and "dense form" in why


def test_kwargs_for_and_load_never_raise():
    assert fa4.kwargs_for(None, {"causal": True}) is None
    assert fa4.kwargs_for(len, {"causal": True}, ("causal",)) is None  # no causal
    assert fa4.kwargs_for(lambda q, causal=False, x=1: q, {"causal": 1, "y": 2}) == {"causal": 1}
    mod, why = fa4.load("no_such_module_for_ptsolve_tests.cute")
    assert mod is None and "not importable" in why and "ModuleNotFoundError" in why
