"""GPU tests of softcap decode (Gemma-2's and Grok's capped scores) on the split-KV decode kernel's softcap variants:
``flash_attention`` with one or a few query positions, ``flash_attention_kvcache`` with per-sequence lengths, paged
and unpaged, and the FA3 interface, head_dim 64 and 128 (the decode kernel's; 256 runs the prefill kernel), GQA,
caches of 1k-64k keys, fp16 and bf16. Accuracy: FlashAttention's rule against an fp32 reference
(``test_attention_features_gpu.check``: at most twice the error of the same formula in PyTorch at the input precision,
plus 1e-3), the output's memory NaN-filled first. The queries are scaled up so that the cap changes the answer by far
more than the tolerance (checked): a kernel that skipped the tanh would fail."""
from __future__ import annotations

import pytest
from test_attention_features_gpu import check, paged, ref
from test_torch_gpu import poison

pytestmark = pytest.mark.gpu  # the fixtures torch and pt: tests/conftest.py

Q_GAIN = 8.0  # scores of std ~8: a cap of 30-50 bends the largest of them


def _inputs(torch, B, Sq, Skv, H, Hkv, D, dt, seed):
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dt]
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, Sq, H, D, device="cuda", dtype=dtype, generator=g) * Q_GAIN
    k, v = (torch.randn(B, Skv, Hkv, D, device="cuda", dtype=dtype, generator=g) for _ in range(2))
    return q, k, v


def _cap_matters(torch, q, k, v, causal, scale, softcap):
    """The capped and uncapped fp32 answers differ by much more than the test's tolerance."""
    capped = ref(torch, q, k, v, causal, scale, torch.float32, softcap)[0]
    plain = ref(torch, q, k, v, causal, scale, torch.float32)[0]
    low = ref(torch, q, k, v, causal, scale, q.dtype, softcap)[0].float()
    tol = 2 * (low - capped).abs().max().item() + 1e-3
    # (bf16 with large scores: the tolerance is wide, so a plain answer is only just outside it; still caught)
    assert (capped - plain).abs().max().item() > tol


def _params(q, k, causal, dt, softcap):
    return {"batch": q.shape[0], "heads": q.shape[2], "kv_heads": k.shape[2], "seq_q": q.shape[1],
            "seq_kv": k.shape[1], "head_dim": q.shape[3], "causal": causal, "dtype": dt, "softcap": softcap}


DENSE = [  # B, Sq, Skv, H, Hkv, D, causal, dtype, softcap, pieces: ">1" / "1" / None (either)
    (1, 1, 8192, 16, 8, 128, True, "bf16", 50.0, ">1"),     # Gemma-2-9B's heads, one query
    (1, 1, 65536, 32, 16, 128, False, "fp16", 50.0, ">1"),  # Gemma-2-27B's, a 64k cache
    (2, 1, 32768, 48, 8, 128, True, "bf16", 30.0, ">1"),    # Grok-1's 48 / 8 heads, cap 30
    (4, 4, 4096, 16, 8, 128, True, "fp16", 50.0, None),     # a speculative step: 4 positions x 2 heads
    (1, 1, 1000, 8, 1, 64, False, "bf16", 30.0, None),      # MQA, head_dim 64, a 1k cache
    (3, 2, 20000, 71, 1, 64, True, "fp16", 50.0, ">1"),     # 142 packed rows: two query tiles, causal
    (64, 1, 1024, 16, 8, 128, False, "bf16", 50.0, "1"),    # a large batch: one piece per tile
]


@pytest.mark.parametrize("B,Sq,Skv,H,Hkv,D,causal,dt,softcap,split", DENSE)
def test_softcap_decode_matrix(torch, pt, B, Sq, Skv, H, Hkv, D, causal, dt, softcap, split):
    """``flash_attention`` with a softcap and at most 16 positions runs the decode kernel's softcap variant (its
    pieces chosen on the capped graph), a repeat (the kept decode family) gives the same bits."""
    from ptsolve import serve
    q, k, v = _inputs(torch, B, Sq, Skv, H, Hkv, D, dt, B * 1000 + Sq + Skv)
    scale = D ** -0.5
    _cap_matters(torch, q, k, v, causal, scale, softcap)
    assert pt._decodes(q, k, causal)
    c = pt._decode_class(q, k, causal, softcap)
    assert c.softcap
    s = serve.decode_pick(c, _params(q, k, causal, dt, softcap))[1]
    if split is not None:
        assert (s > 1) == (split == ">1"), s
    poison(torch, q.shape, q.dtype)
    out = pt.flash_attention(q, k, v, causal=causal, softcap=softcap)
    check(torch, out, q, k, v, causal, scale, softcap)
    again = pt.flash_attention(q, k, v, causal=causal, softcap=softcap)
    torch.testing.assert_close(again, out, atol=0, rtol=0)


def test_head_dim_256_runs_the_prefill_kernel(torch, pt):
    """Gemma-2-2B's head_dim 256 is not the decode kernel's: a softcap decode step runs the softcap prefill class,
    right all the same."""
    q, k, v = _inputs(torch, 2, 1, 3000, 8, 4, 256, "bf16", 5)
    assert not pt._decodes(q, k, True)
    check(torch, pt.flash_attention(q, k, v, causal=True, softcap=50.0), q, k, v, True, 256 ** -0.5, 50.0)


@pytest.mark.parametrize("B,Sq,cap,H,Hkv,D,causal,dt,lens", [
    (3, 1, 16384, 16, 8, 128, True, "bf16", [16384, 1, 9000]),     # full, one key, ragged
    (2, 4, 8192, 32, 16, 128, True, "fp16", [5000, 4]),            # speculative: 4 positions, 4 keys
    (3, 1, 4096, 8, 1, 64, False, "fp16", [0, 4095, 9000]),        # empty; MQA; past the cache (clamped)
])
def test_softcap_kvcache_lengths(torch, pt, B, Sq, cap, H, Hkv, D, causal, dt, lens):
    """``flash_attention_kvcache`` with a softcap: the decode kernel's softcap variant with the lengths read on the
    device, each sequence against its own first lens[b] keys (a sequence of none: zeros)."""
    q, kc, vc = _inputs(torch, B, Sq, cap, H, Hkv, D, dt, B * 7 + cap)
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    poison(torch, q.shape, q.dtype)
    out = pt.flash_attention_kvcache(q, kc, vc, seqlens, causal=causal, softcap=50.0)
    for b, n in enumerate(lens):
        n = min(max(n, 0), cap)
        if n == 0:
            assert out[b].abs().max().item() == 0
            continue
        check(torch, out[b:b + 1], q[b:b + 1], kc[b:b + 1, :n], vc[b:b + 1, :n], causal, D ** -0.5, 50.0)


@pytest.mark.parametrize("page,D,dt,sq", [(16, 128, "bf16", 1), (64, 64, "fp16", 4), (256, 128, "fp16", 1)])
def test_softcap_paged_decode(torch, pt, page, D, dt, sq):
    """A paged cache (FA3's ``page_table``, through ``flash_attn_with_kvcache``) with a softcap: each sequence's keys
    in pages scattered through one pool, lengths that end mid-page and one that fills its pages; the output against
    the same sequences laid out densely."""
    from ptsolve.flash_attn_interface import flash_attn_with_kvcache
    B, H, Hkv, maxp = 3, 16, 8, 8
    lens = [page * maxp, 3 * page + 5, sq]
    q, kd, vd = _inputs(torch, B, sq, page * maxp, H, Hkv, D, dt, 71)
    kc, vc, table = paged(torch, kd, vd, page, 72)
    poison(torch, q.shape, q.dtype)
    out = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=torch.tensor(lens, dtype=torch.int32, device="cuda"),
                                  page_table=table, causal=True, softcap=50.0)
    for b in range(B):
        n = lens[b]
        check(torch, out[b:b + 1], q[b:b + 1], kd[b:b + 1, :n], vd[b:b + 1, :n], True, D ** -0.5, 50.0)


@pytest.mark.parametrize("dt,D", [("bf16", 128), ("fp16", 64)])
def test_every_binary_of_a_softcap_decode_class(torch, pt, monkeypatch, dt, D):
    """Each binary ``decode_pick`` chooses among for a softcap class (its own, two CTAs per SM at head_dim 64,
    persistent) at its pieces gives FlashAttention's answer with the cap, dense and with per-sequence lengths."""
    from ptsolve import serve
    B, Sq, cap, H, Hkv = 24, 1, 900, 16, 8
    q, kc, vc = _inputs(torch, B, Sq, cap, H, Hkv, D, dt, B + cap + D)
    c = pt._decode_class(q, kc, True, 30.0)
    p = _params(q, kc, True, dt, 30.0)
    lens = [cap - 37 * b for b in range(B)]
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    variants = serve.decode_variants(c)
    assert all(v.softcap for v in variants) and any(v.persistent for v in variants)
    try:
        for v in variants:
            s = serve.decode._decode_best(v, p)[1]
            monkeypatch.setattr(serve.decode, "decode_pick", lambda c_, p_, margin=0, v=v, s=s: (v, s))
            serve.prepared.LAUNCHES.clear()  # every launch kept for these inputs is this binary's
            pt._GROW.clear()
            pt._FAST.clear()
            poison(torch, q.shape, q.dtype)
            check(torch, pt.flash_attention(q, kc, vc, causal=True, softcap=30.0), q, kc, vc, True, D ** -0.5, 30.0)
            out = pt.flash_attention_kvcache(q, kc, vc, seqlens, causal=True, softcap=30.0)
            for b in (0, B - 1):
                n = lens[b]
                check(torch, out[b:b + 1], q[b:b + 1], kc[b:b + 1, :n], vc[b:b + 1, :n], True, D ** -0.5, 30.0)
    finally:
        serve.prepared.LAUNCHES.clear()
        pt._GROW.clear()
        pt._FAST.clear()


def test_softcap_decode_graph_capture_and_growing_cache(torch, pt):
    """A Gemma-2 decode loop: one captured graph over a preallocated cache (lengths updated in place), and a dynamic
    cache's new K/V tensors one key longer every step (the decode family re-targeted), every output right."""
    B, H, Hkv, D, cap = 2, 16, 8, 128, 6000
    q, kc, vc = _inputs(torch, B, 1, cap, H, Hkv, D, "bf16", 9)
    seqlens = torch.tensor([700, 5000], dtype=torch.int32, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        pt.flash_attention_kvcache(q, kc, vc, seqlens, softcap=50.0)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = pt.flash_attention_kvcache(q, kc, vc, seqlens, softcap=50.0)
    for lens in ([700, 5000], [701, 5001], [2900, 6000]):
        seqlens.copy_(torch.tensor(lens, dtype=torch.int32))
        q.copy_(torch.randn_like(q) * Q_GAIN)
        graph.replay()
        torch.cuda.synchronize()
        for b, n in enumerate(lens):
            check(torch, out[b:b + 1], q[b:b + 1], kc[b:b + 1, :n], vc[b:b + 1, :n], False, D ** -0.5, 50.0)
    for n in range(1000, 1400, 37):  # new tensors every step, as transformers' dynamic cache hands them over
        k, v = kc[:, :n].clone(), vc[:, :n].clone()
        qs = torch.randn_like(q) * Q_GAIN
        poison(torch, qs.shape, qs.dtype)
        check(torch, pt.flash_attention(qs, k, v, causal=True, softcap=50.0), qs, k, v, True, D ** -0.5, 50.0)
