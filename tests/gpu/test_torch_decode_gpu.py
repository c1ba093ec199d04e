"""GPU tests of decode through ``ptsolve.torch.flash_attention``: seq_q <= 16 runs the shape-generic split-KV
kernel (``ptsolve.serve.decode_launch``): GQA groups that are not powers of two (a query box of 7 or 71 heads),
several query tiles, causal speculative steps, one piece and many (the merge CTAs), strided caches as transformers
hands them over, a cache growing call by call, CUDA-graph capture; ``flash_attention_kvcache``'s per-sequence lengths
(one graph for a growing cache). Accuracy: FlashAttention's rule
(``test_torch_gpu.check``), the output's memory NaN-filled first."""
from __future__ import annotations

import math

import pytest
from test_torch_gpu import check, poison

pytestmark = pytest.mark.gpu  # the fixtures torch and pt: tests/conftest.py


def _params(q, k, causal):
    return {"batch": q.shape[0], "heads": q.shape[2], "kv_heads": k.shape[2], "seq_q": q.shape[1],
            "seq_kv": k.shape[1], "head_dim": q.shape[3], "causal": causal, "dtype": "fp16"}


def _qkv(torch, B, Sq, Skv, H, Hkv, D, dt, seed):
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dt]
    g = torch.Generator(device="cuda").manual_seed(seed)
    return tuple(torch.randn(B, s, h, D, device="cuda", dtype=dtype, generator=g)
                 for s, h in ((Sq, H), (Skv, Hkv), (Skv, Hkv)))


SHAPES = [  # B, Sq, Skv, H, Hkv, D, causal, dtype, pieces: ">1" / "1" / None (either)
    (1, 1, 1, 1, 1, 64, False, "fp16", "1"),
    (1, 1, 65, 8, 8, 128, False, "bf16", None),        # MHA, one key past a block
    (1, 1, 32768, 32, 8, 128, False, "fp16", ">1"),    # Llama-3-8B, long cache: split, merged
    (4, 1, 8192, 28, 4, 128, False, "bf16", ">1"),     # Qwen2.5-7B: groups of 7 heads
    (2, 1, 4097, 71, 1, 64, False, "fp16", ">1"),      # Falcon-7B MQA: 71 rows, two warpgroups
    (1, 16, 3000, 32, 8, 128, True, "bf16", ">1"),     # speculative: 16 positions x 4 heads, causal
    (3, 5, 777, 14, 2, 64, True, "fp16", None),        # 5 positions x 7 heads
    (1, 2, 5000, 71, 1, 64, True, "bf16", ">1"),       # two query tiles of 71 rows, causal
    (2, 16, 16, 8, 1, 128, True, "fp16", None),        # 128 rows, seq_q == seq_kv
    (64, 1, 1000, 32, 8, 128, False, "fp16", "1"),     # a large batch fills the GPU unsplit
]


@pytest.mark.parametrize("B,Sq,Skv,H,Hkv,D,causal,dt,split", SHAPES)
def test_decode_matrix(torch, pt, B, Sq, Skv, H, Hkv, D, causal, dt, split):
    from ptsolve import serve
    q, k, v = _qkv(torch, B, Sq, Skv, H, Hkv, D, dt, B * 1000 + Sq + Skv)
    assert pt._decodes(q, k, causal)
    c = pt._decode_class(q, k, causal)
    s = serve.decode_pick(c, _params(q, k, causal) | {"dtype": dt})[1]
    if split is not None:
        assert (s > 1) == (split == ">1"), s
    poison(torch, q.shape, q.dtype)
    out = pt.flash_attention(q, k, v, causal=causal)
    check(torch, out, q, k, v, causal, 1 / math.sqrt(D))
    again = pt.flash_attention(q, k, v, causal=causal)  # the counters were left at zero: the same merge
    torch.testing.assert_close(again, out, atol=0, rtol=0)


def test_strided_cache_and_scale(torch, pt):
    """transformers' layout: [B, H, S, D] tensors handed over transposed."""
    B, H, Hkv, S, D = 2, 32, 8, 3000, 128
    q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    k, v = (torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(2))
    check(torch, pt.flash_attention(q, k, v, softmax_scale=0.05), q, k, v, False, 0.05)


def test_growing_cache(torch, pt):
    """A decode loop: one preallocated cache, each step attends to one more key (a new piece count at times)."""
    B, H, Hkv, D, cap = 1, 32, 8, 128, 1600
    kc, vc = (torch.randn(B, cap, Hkv, D, device="cuda", dtype=torch.float16) for _ in range(2))
    for n in range(1000, cap, 61):
        q = torch.randn(B, 1, H, D, device="cuda", dtype=torch.float16)
        check(torch, pt.flash_attention(q, kc[:, :n], vc[:, :n], causal=True), q, kc[:, :n], vc[:, :n], True,
              1 / math.sqrt(D))


@pytest.mark.parametrize("dt,B,H,Hkv,causal", [("bf16", 1, 32, 8, True), ("fp16", 3, 14, 2, False)])
def test_dynamic_cache_families(torch, pt, monkeypatch, dt, B, H, Hkv, causal):
    """transformers' dynamic cache: every step each layer's K/V are new tensors one key longer ([B, Hkv, S, D]
    concatenated, handed over transposed), the layers' launches one family re-targeted (its sizes, maps and
    addresses) while the keys stay in one bucket of ``decode_pick``'s: every output right across the buckets' edges,
    a family made per bucket only, not per step, and a step's output the same as a fresh launch's."""
    from ptsolve import serve

    made = []

    class Counting(serve.DecodeFamily):
        def __init__(self, *a, **kw):
            made.append(a[0].shape)
            super().__init__(*a, **kw)
    monkeypatch.setattr(serve, "DecodeFamily", Counting)
    pt._GROW.clear()
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dt]
    g = torch.Generator(device="cuda").manual_seed(7)
    D, layers, steps = 128, 2, 300
    kv = [[torch.randn(B, Hkv, 1000, D, device="cuda", dtype=dtype, generator=g) for _ in range(2)]
          for _ in range(layers)]
    for i in range(steps):
        for L in range(layers):
            new = torch.randn(B, Hkv, 2, D, device="cuda", dtype=dtype, generator=g)
            kv[L] = [torch.cat([kv[L][j], new[:, :, j:j + 1]], dim=2) for j in range(2)]
            q = torch.randn(B, H, 1, D, device="cuda", dtype=dtype, generator=g).transpose(1, 2)
            k, v = kv[L][0].transpose(1, 2), kv[L][1].transpose(1, 2)
            poison(torch, q.shape, q.dtype)
            out = pt.flash_attention(q, k, v, causal=causal)
            if i % 7 == 0 or i in (23, 24, 25, 279, 280, 281):  # bucket edges at 1024 and 1280 keys (BN 128)
                check(torch, out, q, k, v, causal, 1 / math.sqrt(D))
    buckets = {serve.decode_bucketed(pt._decode_class(q, k, causal), {**_params(q, k, causal), "seq_kv": n,
                                                                        "dtype": dt})["seq_kv"]
               for n in range(1001, 1001 + steps)}
    assert 2 <= len(made) <= len(buckets), (len(made), sorted(buckets))
    fresh = pt.flash_attention(q.contiguous(), k.contiguous(), v.contiguous(), causal=causal)
    torch.testing.assert_close(out, fresh, atol=0, rtol=0)


def test_decode_graph_capture(torch, pt):
    q = torch.randn(1, 1, 32, 128, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(1, 20000, 8, 128, device="cuda", dtype=torch.float16) for _ in range(2))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        pt.flash_attention(q, k, v)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = pt.flash_attention(q, k, v)
    for _ in range(3):
        for x in (q, k, v):
            x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        check(torch, out, q, k, v, False, 1 / math.sqrt(128))


def test_one_decode_binary_per_class(torch, pt):
    from codegen import runtime
    from ptsolve import serve
    q, k, v = _qkv(torch, 1, 1, 100, 32, 8, 128, "fp16", 1)
    pt.flash_attention(q, k, v)
    runs, kernels = runtime.NVCC_RUNS[0], len(serve.kernels._KERNELS)
    for B, Sq, Skv, H, Hkv in ((7, 1, 9000, 32, 8), (1, 3, 50, 16, 16), (2, 1, 70000, 8, 2)):
        q, k, v = _qkv(torch, B, Sq, Skv, H, Hkv, 128, "fp16", B)
        check(torch, pt.flash_attention(q, k, v), q, k, v, False, 1 / math.sqrt(128))
    assert runtime.NVCC_RUNS[0] == runs and len(serve.kernels._KERNELS) == kernels


def test_causal_seq_q_beyond_keys_runs_attention(torch, pt):
    """Causal rows that see no key (seq_q > seq_kv) are FlashAttention's zeros: the generic attention kernel's."""
    q, k, v = _qkv(torch, 1, 8, 3, 4, 4, 64, "fp16", 3)
    assert not pt._decodes(q, k, True)
    out = pt.flash_attention(q, k, v, causal=True)
    check(torch, out, q, k, v, True, 1 / 8)
    assert out[:, :5].abs().max().item() == 0


def _llama_pair(torch, device="cuda"):
    """A small Hugging Face Llama (GQA 8 / 2, head_dim 64) in float32 and bf16 with the same random weights, a
    300-token prompt and 6 decode tokens, batch 2: (config, fp32 model, bf16 model, prompt, steps)."""
    pytest.importorskip("transformers")
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=512, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=8,
                      num_key_value_heads=2, head_dim=64, vocab_size=1000, max_position_embeddings=2048)
    torch.manual_seed(0)
    m32 = LlamaForCausalLM(cfg).to(device).eval()
    m16 = LlamaForCausalLM(cfg).to(device, torch.bfloat16).eval()
    m16.load_state_dict(m32.state_dict())
    ids = torch.randint(0, cfg.vocab_size, (2, 300), device=device)
    return cfg, m32, m16, ids, torch.randint(0, cfg.vocab_size, (2, 6), device=device)


def _use(model, impl):
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(impl)
    else:
        model.config._attn_implementation = impl


def test_transformers_llama_decode_steps(torch, pt):
    """A Hugging Face Llama (random weights, bf16) through ``attn_implementation="ptsolve"``: a 300-token prefill (the
    generic attention kernel), then 6 decode steps against its growing cache (transposed [B, S, Hkv, D] views, new
    addresses every step: the split-KV kernel), each step's logits within twice SDPA's error of a float32 model."""
    from ptsolve import serve
    from ptsolve.errors import ShapeError
    cfg, m32, m16, ids, steps = _llama_pair(torch)  # skips without transformers
    name = pt.register_transformers()

    def run(model, impl):
        _use(model, impl)
        out = model(ids, use_cache=True)
        cache, logits = out.past_key_values, [out.logits[:, -1].float()]
        for i in range(steps.shape[1]):
            out = model(steps[:, i:i + 1], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            logits.append(out.logits[:, -1].float())
        # a speculative step: 4 tokens against the cache (transformers' mask: bottom-right causal, checked)
        logits += list(model(steps[:, :4], past_key_values=cache, use_cache=True).logits.float().unbind(1))
        return torch.stack(logits)

    with torch.no_grad():
        ref, sdpa = run(m32, "sdpa"), run(m16, "sdpa")
        pt._GROW.clear()
        ours = run(m16, name)
        # the decode steps ran the split-KV kernel, one launch re-targeted as the cache moved (a decode family)
        assert any(k[0][1] == 1 and isinstance(f, serve.DecodeFamily) for k, f in pt._GROW.items())
        e_ours, e_sdpa = (ours - ref).abs().max().item(), (sdpa - ref).abs().max().item()
        assert e_ours <= 2 * e_sdpa + 1e-2, (e_ours, e_sdpa)
        pad = torch.ones_like(ids)
        pad[1, :5] = 0  # a left-padded second sequence: a mask the kernels do not apply
        with pytest.raises(ShapeError, match="flash_attention_varlen"):
            m16(ids, attention_mask=pad)


def _check_lengths(torch, out, q, kc, vc, lens, causal, scale):
    """Each sequence b against its first lens[b] keys (clamped to the cache); a sequence of none: zeros."""
    for b, n in enumerate(lens):
        n = min(max(n, 0), kc.shape[1])
        if n == 0:
            assert out[b].abs().max().item() == 0
            continue
        check(torch, out[b:b + 1], q[b:b + 1], kc[b:b + 1, :n], vc[b:b + 1, :n], causal, scale)


KVCACHE = [  # B, Sq, cap, H, Hkv, D, causal, dtype, lengths
    (4, 1, 4096, 32, 8, 128, False, "fp16", [4096, 1, 2500, 129]),          # full, one key, ragged, a block + 1
    (3, 1, 32768, 32, 8, 128, True, "bf16", [32768, 100, 9000]),            # split pieces, a short sequence
    (2, 4, 8192, 28, 4, 128, True, "fp16", [5000, 4]),                      # speculative: 4 positions, 4 keys
    (3, 1, 20000, 71, 1, 64, False, "bf16", [0, 19999, 40000]),             # empty; MQA; past the cache (clamped)
    (2, 2, 5000, 12, 12, 64, True, "fp16", [1, 3000]),                      # MHA; causal rows that see no key
]


@pytest.mark.parametrize("B,Sq,cap,H,Hkv,D,causal,dt,lens", KVCACHE)
def test_kvcache_lengths(torch, pt, B, Sq, cap, H, Hkv, D, causal, dt, lens):
    """``flash_attention_kvcache``: per-sequence lengths read on the device, against each sequence's own prefix."""
    q, kc, vc = _qkv(torch, B, Sq, cap, H, Hkv, D, dt, B * 7 + cap)
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    poison(torch, q.shape, q.dtype)
    out = pt.flash_attention_kvcache(q, kc, vc, seqlens, causal=causal)
    _check_lengths(torch, out, q, kc, vc, lens, causal, 1 / math.sqrt(D))


def test_kvcache_one_graph_serves_a_growing_cache(torch, pt):
    """A decode loop on a transposed [B, Hkv, cap, D] cache: one captured graph, the lengths and the cache updated in
    place between replays (one more key, then a jump past a piece boundary, then a sequence restarted)."""
    B, H, Hkv, D, cap = 2, 32, 8, 128, 6000
    q = torch.randn(B, 1, H, D, device="cuda", dtype=torch.bfloat16)
    kc, vc = (torch.randn(B, Hkv, cap, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(2))
    seqlens = torch.tensor([700, 5000], dtype=torch.int32, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        pt.flash_attention_kvcache(q, kc, vc, seqlens)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = pt.flash_attention_kvcache(q, kc, vc, seqlens)
    for lens in ([700, 5000], [701, 5001], [2900, 6000], [1, 17]):
        seqlens.copy_(torch.tensor(lens, dtype=torch.int32))
        q.copy_(torch.randn_like(q))
        kc[:, lens[0] - 1].normal_()  # the step's key, written into the cache in place
        graph.replay()
        torch.cuda.synchronize()
        _check_lengths(torch, out, q, kc, vc, lens, False, 1 / math.sqrt(D))


def test_kvcache_errors_and_int_lengths(torch, pt):
    from ptsolve.errors import ShapeError
    q, kc, vc = _qkv(torch, 2, 1, 3000, 8, 2, 64, "fp16", 5)
    with pytest.raises(ShapeError, match="int32"):
        pt.flash_attention_kvcache(q, kc, vc, torch.tensor([5, 6], device="cuda"))  # int64
    with pytest.raises(ShapeError, match=r"shape \(2,\)"):
        pt.flash_attention_kvcache(q, kc, vc, torch.tensor([5], dtype=torch.int32, device="cuda"))
    q17 = torch.randn(2, 17, 8, 64, device="cuda", dtype=torch.float16)
    # more positions than the decode kernel takes run the varlen kernel over the cache (FlashAttention-3's way)
    _check_lengths(torch, pt.flash_attention_kvcache(q17, kc, vc, 100, causal=True), q17, kc, vc, [100, 100], True,
                   1 / 8)
    out = pt.flash_attention_kvcache(q, kc, vc, 1234, causal=True)
    _check_lengths(torch, out, q, kc, vc, [1234, 1234], True, 1 / 8)
    dense = pt.flash_attention(q, kc[:, :1234], vc[:, :1234], causal=True)
    torch.testing.assert_close(out, dense, atol=2e-3, rtol=0)  # pieces may differ; the merge's rounding only


def test_transformers_llama_static_cache(torch, pt):
    """A Hugging Face Llama with a static cache (preallocated K/V, transformers' mask hiding the unfilled slots): the
    prefill (no mask: SDPA's top-left causal, run on the filled part), 6 decode steps and a 4-token speculative step
    (``flash_attention_kvcache`` on the whole cache, the lengths read from the mask), each step's logits within twice
    SDPA's error of a float32 model; after the first decode step no launch is prepared (the cache keeps its
    addresses, the lengths their buffer)."""
    from ptsolve import serve
    cfg, m32, m16, ids, steps = _llama_pair(torch)  # skips without transformers
    from transformers import StaticCache
    name = pt.register_transformers()
    prepared = []

    def run(model, impl):
        _use(model, impl)
        cache = StaticCache(config=cfg, max_cache_len=512)
        out = model(ids, past_key_values=cache, use_cache=True)
        logits = [out.logits[:, -1].float()]
        for i in range(steps.shape[1]):
            logits.append(model(steps[:, i:i + 1], past_key_values=cache, use_cache=True).logits[:, -1].float())
            prepared.append(len(serve.prepared.LAUNCHES))
        logits += list(model(steps[:, :4], past_key_values=cache, use_cache=True).logits.float().unbind(1))
        return torch.stack(logits)

    with torch.no_grad():
        ref, sdpa = run(m32, "sdpa"), run(m16, "sdpa")
        prepared.clear()
        ours = run(m16, name)
        e_ours, e_sdpa = (ours - ref).abs().max().item(), (sdpa - ref).abs().max().item()
        assert e_ours <= 2 * e_sdpa + 1e-2, (e_ours, e_sdpa)
        assert prepared[1:] == [prepared[0]] * (len(prepared) - 1), prepared  # one launch per layer, kept


def test_transformers_llama_compiled_static_cache(torch, pt):
    """``torch.compile(mode="reduce-overhead", fullgraph=True)`` over a static cache's decode steps with
    ``attn_implementation="ptsolve"`` (the prefill eager, as transformers' generate runs it): no graph break (the
    lengths read from the mask on the device), the steps replayed as CUDA graphs, each step's logits within twice
    SDPA's error of a float32 model."""
    cfg, m32, m16, ids, steps = _llama_pair(torch)  # skips without transformers
    from transformers import StaticCache
    name = pt.register_transformers()
    torch._dynamo.reset()

    def run(model, impl, compiled):
        _use(model, impl)
        cache = StaticCache(config=cfg, max_cache_len=512)
        logits = [model(ids, past_key_values=cache, use_cache=True).logits[:, -1].float()]
        fwd = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True) if compiled else model.forward
        for i in range(steps.shape[1]):
            torch.compiler.cudagraph_mark_step_begin()
            pos = torch.tensor([ids.shape[1] + i], device="cuda")
            out = fwd(steps[:, i:i + 1].clone(), past_key_values=cache, use_cache=True, cache_position=pos)
            logits.append(out.logits[:, -1].float().clone())
        return torch.stack(logits)

    from torch._dynamo.utils import counters
    with torch.no_grad():
        ref, sdpa = run(m32, "sdpa", False), run(m16, "sdpa", False)
        counters.clear()
        ours = run(m16, name, True)
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])  # the steps ran as CUDA graphs
    e_ours, e_sdpa = (ours - ref).abs().max().item(), (sdpa - ref).abs().max().item()
    assert e_ours <= 2 * e_sdpa + 1e-2, (e_ours, e_sdpa)


@pytest.mark.parametrize("B,Sq,cap,H,Hkv,D,causal,dt", [
    (40, 1, 700, 32, 8, 128, False, "fp16"),   # 320 one-piece tiles: the persistent binary deals them over the SMs
    (24, 3, 900, 14, 2, 64, True, "bf16"),     # d64, causal, 3 positions x 7 heads: three binaries
])
def test_every_binary_of_a_decode_class(torch, pt, monkeypatch, B, Sq, cap, H, Hkv, D, causal, dt):
    """Each binary ``decode_pick`` chooses among (the class's own, two CTAs per SM, persistent) at its pieces gives
    FlashAttention's answer, on the dense path and with per-sequence lengths (a persistent CTA's tiles of different
    lengths: its ring position carries over from one to the next)."""
    from ptsolve import serve
    q, kc, vc = _qkv(torch, B, Sq, cap, H, Hkv, D, dt, B + cap)
    c = pt._decode_class(q, kc, causal)
    p = _params(q, kc, causal) | {"dtype": dt}
    variants = serve.decode_variants(c)
    assert any(v.persistent for v in variants)
    lens = [cap - 37 * b for b in range(B)]
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    for v in variants:
        s = serve.decode._decode_best(v, p)[1]
        monkeypatch.setattr(serve.decode, "decode_pick", lambda c_, p_, margin=0, v=v, s=s: (v, s))
        serve.prepared.LAUNCHES.clear()
        poison(torch, q.shape, q.dtype)
        check(torch, pt.flash_attention(q, kc, vc, causal=causal), q, kc, vc, causal, 1 / math.sqrt(D))
        poison(torch, q.shape, q.dtype)
        _check_lengths(torch, pt.flash_attention_kvcache(q, kc, vc, seqlens, causal=causal), q, kc, vc, lens, causal,
                       1 / math.sqrt(D))
    serve.prepared.LAUNCHES.clear()
