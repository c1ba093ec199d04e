"""FlashAttention-3's Hopper interface over ptsolve (ptsolve.flash_attn_interface): the same arguments, names, order
and defaults as FA3's ``flash_attn_interface``; what ptsolve does not do is refused with a NotImplementedError naming
the argument before any work (no tensor is touched); FA3's tuning knobs are accepted."""
from __future__ import annotations

import inspect
import sys
import types

import pytest

from ptsolve import flash_attn_interface as fai

# FlashAttention-3's signatures (hopper/flash_attn_interface.py, flash-attention 2.8 / FA3), as data: name -> default
_REQ = inspect.Parameter.empty
FA3 = {
    "flash_attn_func": {"q": _REQ, "k": _REQ, "v": _REQ, "softmax_scale": None, "causal": False, "qv": None,
                        "q_descale": None, "k_descale": None, "v_descale": None, "window_size": (-1, -1),
                        "attention_chunk": 0, "softcap": 0.0, "num_splits": 1, "pack_gqa": None,
                        "deterministic": False, "sm_margin": 0, "return_attn_probs": False},
    "flash_attn_varlen_func": {"q": _REQ, "k": _REQ, "v": _REQ, "cu_seqlens_q": _REQ, "cu_seqlens_k": _REQ,
                               "max_seqlen_q": _REQ, "max_seqlen_k": _REQ, "seqused_q": None, "seqused_k": None,
                               "softmax_scale": None, "causal": False, "qv": None, "q_descale": None,
                               "k_descale": None, "v_descale": None, "window_size": (-1, -1), "attention_chunk": 0,
                               "softcap": 0.0, "num_splits": 1, "pack_gqa": None, "deterministic": False,
                               "sm_margin": 0, "return_attn_probs": False},
    "flash_attn_with_kvcache": {"q": _REQ, "k_cache": _REQ, "v_cache": _REQ, "k": None, "v": None, "qv": None,
                                "rotary_cos": None, "rotary_sin": None, "cache_seqlens": None,
                                "cache_batch_idx": None, "cache_leftpad": None, "page_table": None,
                                "cu_seqlens_q": None, "cu_seqlens_k_new": None, "max_seqlen_q": None,
                                "rotary_seqlens": None, "q_descale": None, "k_descale": None, "v_descale": None,
                                "softmax_scale": None, "causal": False, "window_size": (-1, -1),
                                "attention_chunk": 0, "softcap": 0.0, "rotary_interleaved": True,
                                "scheduler_metadata": None, "num_splits": 0, "pack_gqa": None, "sm_margin": 0,
                                "return_softmax_lse": False},
}
POSITIONAL = {"flash_attn_func": 3, "flash_attn_varlen_func": 7, "flash_attn_with_kvcache": 3}
# the arguments that ask for what ptsolve does not do, with a value that asks
REFUSED = {"qv": "T", "q_descale": "T", "k_descale": "T", "v_descale": "T", "window_size": (128, 0),
           "attention_chunk": 256, "softcap": 30.0, "sm_margin": 4, "seqused_q": "T",
           "seqused_k": "T", "k": "T", "v": "T", "rotary_cos": "T", "rotary_sin": "T", "cache_batch_idx": "T",
           "cache_leftpad": "T", "page_table": "T", "cu_seqlens_q": "T", "cu_seqlens_k_new": "T", "max_seqlen_q": 7,
           "rotary_seqlens": "T", "return_softmax_lse": True}
# the ones ptsolve runs in some of the functions (the others still refuse them)
RUNS = {"flash_attn_func": {"window_size", "softcap", "attention_chunk", "sm_margin"},
        "flash_attn_varlen_func": {"window_size", "softcap", "seqused_q", "seqused_k", "attention_chunk", "sm_margin"},
        "flash_attn_with_kvcache": {"window_size", "softcap", "k", "v", "rotary_cos", "rotary_sin", "cache_batch_idx",
                                    "cache_leftpad", "rotary_seqlens", "return_softmax_lse", "cu_seqlens_q",
                                    "cu_seqlens_k_new", "max_seqlen_q", "page_table", "attention_chunk",
                                    "sm_margin"}}
KNOBS = {"num_splits": 3, "pack_gqa": True, "deterministic": True, "rotary_interleaved": False,
         "scheduler_metadata": "M"}


class _Tensor:
    """A stand-in that fails the test if the function touches it (no work may start before a refusal)."""

    shape = (2, 3)
    requires_grad = False

    def __getattr__(self, name):
        pytest.fail(f"the tensor was used ({name}) before the refusal")


@pytest.mark.parametrize("fn", sorted(FA3))
def test_the_signatures_are_fa3s(fn):
    params = inspect.signature(getattr(fai, fn)).parameters
    assert list(params) == list(FA3[fn])  # names and order: positional calls mean the same
    assert {n: p.default for n, p in params.items()} == FA3[fn]


@pytest.mark.parametrize("fn,name", [(f, n) for f in sorted(FA3) for n, d in FA3[f].items()
                                     if n in REFUSED and d is not _REQ and n not in RUNS.get(f, ())])
def test_what_ptsolve_does_not_do_is_refused_by_name_before_any_work(fn, name):
    args = [_Tensor() for _ in range(POSITIONAL[fn])]
    value = _Tensor() if REFUSED[name] == "T" else REFUSED[name]
    with pytest.raises(NotImplementedError, match=rf"{fn}: {name}="):
        getattr(fai, fn)(*args, **{name: value})


@pytest.mark.parametrize("fn", sorted(FA3))
def test_fa3s_idle_values_and_tuning_knobs_pass_to_ptsolve_torch(fn, monkeypatch):
    """Defaults (and the idle values spelt out, a list window included) and the knobs reach ptsolve.torch's call."""
    seen = {}
    fake = types.SimpleNamespace(
        flash_attention=lambda q, k, v, causal, softmax_scale, return_lse, softcap, window_size, attention_chunk,
        sm_margin: seen.update(f="dense", causal=causal, lse=return_lse, softcap=softcap, window=window_size,
                               chunk=attention_chunk, margin=sm_margin),
        flash_attention_varlen=lambda *a, causal, softmax_scale, return_lse, seqused_q, seqused_k, softcap,
        window_size, attention_chunk, sm_margin: seen.update(f="varlen", n=len(a), lse=return_lse, softcap=softcap,
                                                             window=window_size, used=(seqused_q, seqused_k),
                                                             chunk=attention_chunk, margin=sm_margin),
        flash_attention_kvcache=lambda q, kc, vc, lens, causal, softmax_scale, **kw: seen.update(f="kvcache", lens=lens,
                                                                                                 kw=kw))
    monkeypatch.setitem(sys.modules, "ptsolve.torch", fake)
    monkeypatch.setattr(sys.modules["ptsolve"], "torch", fake, raising=False)
    t = types.SimpleNamespace(shape=(2, 4096, 8, 128), requires_grad=False)
    args = [t] * POSITIONAL[fn]
    idle = {"window_size": [-1, -1], "softcap": 0, "attention_chunk": 0, "sm_margin": 0}
    knobs = {k: v for k, v in KNOBS.items() if k in FA3[fn]}
    getattr(fai, fn)(*args, **idle, **knobs, causal=True)
    assert seen["f"] == {"flash_attn_func": "dense", "flash_attn_varlen_func": "varlen",
                         "flash_attn_with_kvcache": "kvcache"}[fn]
    if fn == "flash_attn_with_kvcache":
        assert seen["lens"] == 4096  # no cache_seqlens: the whole cache
        assert seen["kw"]["window_size"] == (-1, -1) and seen["kw"]["return_lse"] is False
        assert seen["kw"]["attention_chunk"] == 0 and seen["kw"]["sm_margin"] == 0
        getattr(fai, fn)(*args, k="K", v="V", rotary_cos="C", rotary_sin="S", cache_batch_idx="I", cache_leftpad="P",
                         softcap=5.0, window_size=[3, 0], return_softmax_lse=True, rotary_interleaved=False,
                         cu_seqlens_q="CQ", max_seqlen_q=9, cu_seqlens_k_new="CK", attention_chunk=64, sm_margin=4)
        assert seen["kw"] == {"softcap": 5.0, "window_size": (3, 0), "return_lse": True, "cache_batch_idx": "I",
                              "cache_leftpad": "P", "k": "K", "v": "V", "rotary_cos": "C", "rotary_sin": "S",
                              "rotary_interleaved": False, "rotary_seqlens": None, "cu_seqlens_q": "CQ",
                              "max_seqlen_q": 9, "cu_seqlens_k_new": "CK", "page_table": None,
                              "attention_chunk": 64, "sm_margin": 4}
    else:  # FA3 returns (out, softmax_lse) only where return_attn_probs asks
        assert seen["lse"] is False
        getattr(fai, fn)(*args, causal=True, return_attn_probs=True)
        assert seen["lse"] is True
        assert seen["softcap"] == 0 and seen["window"] == (-1, -1)  # a list window reaches ptsolve as a tuple
        getattr(fai, fn)(*args, causal=True, softcap=30.0, window_size=[128, 0],
                         **({"seqused_q": "uq", "seqused_k": "uk"} if fn == "flash_attn_varlen_func" else {}))
        assert seen["softcap"] == 30.0 and seen["window"] == (128, 0)
        assert seen.get("used", ("uq", "uk")) == ("uq", "uk")
        assert (seen["chunk"], seen["margin"]) == (0, 0)
        getattr(fai, fn)(*args, causal=True, attention_chunk=8192, sm_margin=16)  # Llama-4's chunk, 16 SMs left free
        assert (seen["chunk"], seen["margin"]) == (8192, 16)


def test_inputs_that_require_grad_are_refused():
    t = types.SimpleNamespace(shape=(1, 2, 3, 64), requires_grad=True)
    with pytest.raises(NotImplementedError, match="q requires grad.*forward only"):
        fai.flash_attn_func(t, t, t)


@pytest.mark.parametrize("fn", sorted(FA3))
def test_qvs_refusal_says_why(fn):
    """FA3's qv is MLA's absorbed query (head_dim 64, head_dim_v 512): the refusal names it and the sizes."""
    args = [_Tensor() for _ in range(POSITIONAL[fn])]
    with pytest.raises(NotImplementedError, match=rf"{fn}: qv=.*MLA's absorbed query \(head_dim 64 with a head_dim_v "
                                                  r"of 512\), sizes ptsolve's kernels do not build"):
        getattr(fai, fn)(*args, qv=_Tensor())
