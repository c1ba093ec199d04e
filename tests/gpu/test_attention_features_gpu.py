"""GPU tests of attention's features (issue "FlashAttention's interface"): softcap, sliding window (with and without
causal, seq_q < seq_kv and > seq_kv), varlen's ``seqused_q`` / ``seqused_k``, the log-sum-exp of each,
``attention_chunk`` (Llama-4's chunked local attention) and ``sm_margin``, through ``ptsolve.torch`` and
``ptsolve.flash_attn_interface``. FlashAttention's rule against an fp32 reference: max|out −
ref| ≤ 2·max|out_lowprec − ref| + 1e-3, out_lowprec the same PyTorch formula in the input dtype; the output's memory
is NaN-filled before each call, so a row the kernel does not write fails."""
from __future__ import annotations

import math

import pytest

from ptsolve.errors import ShapeError

pytestmark = pytest.mark.gpu  # the fixtures torch and pt: tests/conftest.py


def chunk_keep(torch, sq, skv, chunk, device):
    """FlashAttention-3's attention_chunk mask, bool [sq, skv]: query i at p = i + skv - sq sees keys
    floor(p / chunk)·chunk .. + chunk - 1 (floor division: a query with p < 0 sees none; hopper/mask.h, test_util's
    construct_chunk_mask)."""
    p = torch.arange(sq, device=device)[:, None] + skv - sq
    j = torch.arange(skv, device=device)[None, :]
    lo = torch.div(p, chunk, rounding_mode="floor") * chunk
    return (j >= lo) & (j < lo + chunk)


def ref(torch, q, k, v, causal, scale, dtype, softcap=0.0, window=(-1, -1), chunk=0):
    """(out [B, Sq, H, D] in ``dtype``, lse [B, H, Sq] in fp32: +inf where a row sees no key) of q [B, Sq, H, D];
    ``chunk`` > 0: FlashAttention-3's attention_chunk too."""
    q, k, v = (x.to(dtype).transpose(1, 2) for x in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = (q @ k.transpose(-1, -2)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    from codegen.harness.attention import keep_mask
    keep = keep_mask(q.shape[2], k.shape[2], causal, window, q.device)
    if chunk:
        keep &= chunk_keep(torch, q.shape[2], k.shape[2], chunk, q.device)
    s = s.float().masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, -1)
    lse = torch.where(torch.isneginf(lse), math.inf, lse)  # a row that sees no key: +inf, FlashAttention's
    p = torch.softmax(s, -1).nan_to_num(0.0).to(dtype)
    return (p @ v).transpose(1, 2), lse


def check(torch, out, q, k, v, causal, scale, softcap=0.0, window=(-1, -1), lse=None, chunk=0):
    r, rl = ref(torch, q, k, v, causal, scale, torch.float32, softcap, window, chunk)
    low = ref(torch, q, k, v, causal, scale, q.dtype, softcap, window, chunk)[0].float()
    err, lerr = (out.float() - r).abs().max().item(), (low - r).abs().max().item()
    assert not math.isnan(err), "NaN in the output (a row not written?)"
    assert err <= 2 * lerr + 1e-3, f"max err {err:.3g} > 2 * {lerr:.3g} + 1e-3"
    if lse is not None:
        fin = torch.isfinite(rl)
        assert torch.equal(torch.isfinite(lse), fin), "the rows that see no key differ"
        assert (lse[fin] - rl[fin]).abs().max().item() < 1e-2


def _inputs(torch, B, Sq, Skv, H, Hkv, D, dt, seed):
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dt]
    g = torch.Generator(device="cuda").manual_seed(seed)
    return tuple(torch.randn(B, s, h, D, device="cuda", dtype=dtype, generator=g)
                 for s, h in ((Sq, H), (Skv, Hkv), (Skv, Hkv)))


CASES = [  # B, Sq, Skv, H, Hkv, D, causal, dt, softcap, window
    (2, 333, 333, 8, 2, 128, True, "bf16", 30.0, (-1, -1)),
    (1, 1000, 1000, 8, 4, 256, False, "fp16", 50.0, (-1, -1)),
    (2, 257, 700, 4, 4, 64, True, "fp16", 20.0, (-1, -1)),
    (1, 2000, 2000, 8, 2, 128, True, "bf16", 0.0, (256, 0)),         # Mistral's: causal with a left window
    (2, 300, 1000, 4, 4, 64, False, "fp16", 0.0, (100, 50)),          # both edges, seq_q < seq_kv
    (1, 300, 100, 4, 2, 128, False, "bf16", 0.0, (10, 10)),           # seq_q > seq_kv: rows that see no key
    (1, 700, 700, 8, 8, 96, False, "fp16", 0.0, (-1, 64)),            # a right window alone
    (2, 1500, 1500, 8, 4, 256, True, "bf16", 50.0, (512, 0)),         # Gemma-2's local layers
    (1, 4, 3000, 8, 2, 128, True, "fp16", 0.0, (1000, -1)),           # a short query: the prefill kernel
    (1, 4096, 4096, 4, 1, 192, True, "fp16", 30.0, (1024, 0)),
]


@pytest.mark.parametrize("B,Sq,Skv,H,Hkv,D,causal,dt,softcap,window", CASES)
def test_softcap_and_window(torch, pt, B, Sq, Skv, H, Hkv, D, causal, dt, softcap, window):
    q, k, v = _inputs(torch, B, Sq, Skv, H, Hkv, D, dt, B * 1000 + Sq + Skv)
    torch.full(q.shape, float("nan"), dtype=q.dtype, device="cuda")  # freed: the output's block comes back NaN
    out, lse = pt.flash_attention(q, k, v, causal=causal, return_lse=True, softcap=softcap, window_size=window)
    check(torch, out, q, k, v, causal, 1 / math.sqrt(D), softcap, window, lse)
    again = pt.flash_attention(q, k, v, causal=causal, softcap=softcap, window_size=window)
    assert torch.equal(again, out)  # without the log-sum-exp: the same kernel, the same numbers


def test_a_window_over_every_key_is_no_window(torch, pt):
    """FlashAttention-3's normalisation: a window that covers every key runs the plain kernel, bit for bit."""
    q, k, v = _inputs(torch, 1, 500, 800, 4, 2, 128, "bf16", 7)
    plain = pt.flash_attention(q, k, v, causal=True)
    assert torch.equal(pt.flash_attention(q, k, v, causal=True, window_size=(799, 5)), plain)


@pytest.mark.parametrize("softcap,window,causal", [(0.0, (-1, -1), False), (0.0, (-1, -1), True),
                                                   (30.0, (128, 0), True), (0.0, (64, 64), False)])
def test_varlen_seqused(torch, pt, softcap, window, causal):
    """Packed sequences whose used rows (seqused) are fewer than cu_seqlens gives: each used part is its own
    attention; padding keys are never attended to (their scores would be huge here) and padding rows never written.
    The padding must be finite: a block past the used keys is loaded and masked, P = 0 times NaN being NaN."""
    dtype, H, Hkv, D = torch.bfloat16, 8, 2, 128
    lq, lk = [300, 17, 1000, 64], [500, 40, 1000, 700]
    uq, uk = [200, 17, 999, 1], [450, 40, 1, 700]
    cq = torch.tensor([0, *torch.tensor(lq).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    ck = torch.tensor([0, *torch.tensor(lk).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn(sum(lq), H, D, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(sum(lk), Hkv, D, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(sum(lk), Hkv, D, device="cuda", dtype=dtype, generator=g)
    for b in range(4):  # the unused keys would take all of a row's weight, with values far off
        k[ck[b] + uk[b]: ck[b + 1]] = 30.0
        v[ck[b] + uk[b]: ck[b + 1]] = 1000.0
    used = [torch.tensor(u, dtype=torch.int32, device="cuda") for u in (uq, uk)]
    out, lse = pt.flash_attention_varlen(q, k, v, cq, ck, max(lq), max(lk), causal=causal, return_lse=True,
                                         seqused_q=used[0], seqused_k=used[1], softcap=softcap, window_size=window)
    for b in range(4):
        qs, ks = slice(int(cq[b]), int(cq[b]) + uq[b]), slice(int(ck[b]), int(ck[b]) + uk[b])
        check(torch, out[qs][None], q[qs][None], k[ks][None], v[ks][None], causal, 1 / math.sqrt(D), softcap,
              window, lse[:, qs][None])


def test_fa3_interface_passes_the_features(torch, pt):
    from ptsolve.flash_attn_interface import flash_attn_func, flash_attn_varlen_func
    q, k, v = _inputs(torch, 2, 600, 600, 8, 4, 128, "fp16", 11)
    out = flash_attn_func(q, k, v, causal=True, softcap=30.0, window_size=(200, 0))
    check(torch, out, q, k, v, True, 1 / math.sqrt(128), 30.0, (200, 0))
    cu = torch.tensor([0, 600, 1200], dtype=torch.int32, device="cuda")
    used = torch.tensor([600, 300], dtype=torch.int32, device="cuda")
    o2 = flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu, 600, 600,
                                seqused_q=used, seqused_k=used, causal=True, softcap=30.0, window_size=(200, 0))
    assert torch.equal(o2[:600], out[0].reshape(600, 8, 128))
    check(torch, o2[600:900][None], q[1:, :300], k[1:, :300], v[1:, :300], True, 1 / math.sqrt(128), 30.0, (200, 0))


def test_features_under_torch_compile(torch, pt):
    q, k, v = _inputs(torch, 1, 512, 512, 4, 2, 64, "bf16", 5)

    def f(q, k, v):
        return pt.flash_attention(q, k, v, causal=True, softcap=20.0, window_size=(128, 0))
    torch._dynamo.reset()
    got = torch.compile(f, fullgraph=True)(q, k, v)
    assert torch.equal(got, f(q, k, v))


KV_CASES = [  # Sq, D, softcap, window, causal, lse
    (1, 128, 30.0, (-1, -1), True, False),
    (4, 64, 0.0, (256, 0), True, True),
    (40, 128, 0.0, (-1, -1), True, True),     # more positions than the decode kernel takes
    (1, 256, 50.0, (511, 0), True, False),    # Gemma-2's head_dim, softcap and local window
    (3, 96, 0.0, (-1, -1), False, True),
]


@pytest.mark.parametrize("Sq,D,softcap,window,causal,lse", KV_CASES)
def test_kvcache_features(torch, pt, Sq, D, softcap, window, causal, lse):
    """A cache filled to different lengths, through the varlen kernel: each sequence is its own attention over its
    first cache_seqlens[b] keys (bottom-right causal and window at that length); the LSE is [B, H, Sq]."""
    B, S, H, Hkv = 3, 2048, 8, 2
    q, kc, vc = _inputs(torch, B, Sq, S, H, Hkv, D, "bf16", Sq + D)
    lens = [2048, 1000, 57]
    got = pt.flash_attention_kvcache(q, kc, vc, torch.tensor(lens, dtype=torch.int32, device="cuda"), causal=causal,
                                     softcap=softcap, window_size=window, return_lse=lse)
    out, ls = got if lse else (got, None)
    for b, n in enumerate(lens):
        check(torch, out[b:b + 1], q[b:b + 1], kc[b:b + 1, :n], vc[b:b + 1, :n], causal, D ** -0.5, softcap, window,
              None if ls is None else ls[b:b + 1])


def _rope(torch, x, cos, sin, pos, interleaved):
    """RoPE written as complex rotation (interleaved pairs) or halves, positions pos [B, S]: the test's own."""
    rd = 2 * cos.shape[1]
    ang = torch.polar(torch.ones_like(cos[pos].float()), torch.atan2(sin[pos].float(), cos[pos].float()))[:, :, None]
    xr = x[..., :rd].float()
    if interleaved:
        z = torch.view_as_complex(xr.reshape(*xr.shape[:-1], rd // 2, 2).contiguous()) * ang
        r = torch.view_as_real(z).flatten(-2)
    else:
        z = torch.complex(xr[..., : rd // 2], xr[..., rd // 2:]) * ang
        r = torch.cat((z.real, z.imag), -1)
    return torch.cat((r.to(x.dtype), x[..., rd:]), -1)


@pytest.mark.parametrize("interleaved", [True, False])
def test_kvcache_append_rotary_batch_idx(torch, pt, interleaved):
    """FA3's flash_attn_with_kvcache with new keys appended into the cache (rotated), q rotated at its positions,
    sequences picked from a larger cache by cache_batch_idx: the cache is written in place, the output is attention
    over each sequence's cache_seqlens[b] + 2 keys."""
    from ptsolve.flash_attn_interface import flash_attn_with_kvcache
    B, NB, S, H, Hkv, D, new = 2, 4, 1024, 8, 2, 128, 2
    q, kc, vc = _inputs(torch, NB, 2, S, H, Hkv, D, "fp16", 21)
    q = q[:B]
    knew, vnew = (x[:B, :new] * 0.5 for x in _inputs(torch, NB, 2, new, Hkv, Hkv, D, "fp16", 22)[1:])
    ang = torch.arange(S, device="cuda")[:, None] / (10000 ** (torch.arange(32, device="cuda") / 32))[None]
    cos, sin = ang.cos().half(), ang.sin().half()
    lens, idx = torch.tensor([700, 5], dtype=torch.int32, device="cuda"), torch.tensor([3, 1], device="cuda",
                                                                                       dtype=torch.int32)
    k0, v0 = kc.clone(), vc.clone()
    out = flash_attn_with_kvcache(q, kc, vc, k=knew, v=vnew, rotary_cos=cos, rotary_sin=sin, cache_seqlens=lens,
                                  cache_batch_idx=idx, causal=True, rotary_interleaved=interleaved)
    for b in range(B):
        n, c = int(lens[b]), int(idx[b])
        pos = torch.arange(n, n + new, device="cuda")[None]
        kr = _rope(torch, knew[b:b + 1], cos, sin, pos, interleaved)
        assert torch.allclose(kc[c, n:n + new].float(), kr[0].float(), atol=1e-2)  # appended in place, rotated
        assert torch.equal(kc[c, :n], k0[c, :n]) and torch.equal(vc[c, :n], v0[c, :n])
        assert torch.equal(vc[c, n:n + new], vnew[b])
        qr = _rope(torch, q[b:b + 1], cos, sin, pos, interleaved)
        check(torch, out[b:b + 1], qr, kc[c:c + 1, :n + new], vc[c:c + 1, :n + new], True, D ** -0.5)
    assert torch.equal(kc[0], k0[0]) and torch.equal(kc[2], k0[2])  # rows no sequence picked are untouched


def test_kvcache_leftpad(torch, pt):
    B, S, H, Hkv, D = 2, 1024, 4, 4, 64
    q, kc, vc = _inputs(torch, B, 1, S, H, Hkv, D, "bf16", 31)
    lens, pad = (torch.tensor(x, dtype=torch.int32, device="cuda") for x in ([1000, 500], [100, 0]))
    out = pt.flash_attention_kvcache(q, kc, vc, lens, causal=True, cache_leftpad=pad)
    for b in range(B):
        s = slice(int(pad[b]), int(lens[b]))
        check(torch, out[b:b + 1], q[b:b + 1], kc[b:b + 1, s], vc[b:b + 1, s], True, D ** -0.5)


@pytest.mark.parametrize("causal", [True, False])
def test_kvcache_varlen_queries_and_new_keys(torch, pt, causal):
    """FA3's flash_attn_with_kvcache with varlen queries (``cu_seqlens_q``: chunked prefill against a cache) and
    varlen new keys (``cu_seqlens_k_new``) appended in place: each sequence's queries attend to its cache_seqlens[b]
    + new keys, bottom-right aligned at its own lengths; out [total_q, H, D], lse [H, total_q]."""
    from ptsolve.flash_attn_interface import flash_attn_with_kvcache
    B, S, H, Hkv, D = 3, 512, 8, 2, 128
    ql, kl, lens = [37, 1, 200], [5, 0, 130], [300, 17, 90]
    _, kc, vc = _inputs(torch, B, 1, S, H, Hkv, D, "bf16", 41)
    q = _inputs(torch, 1, sum(ql), 1, H, Hkv, D, "bf16", 42)[0][0]
    kn, vn = (x[0] * 0.5 for x in _inputs(torch, 1, 1, sum(kl), H, Hkv, D, "bf16", 43)[1:])
    cu = [torch.tensor([0, *torch.tensor(x).cumsum(0).tolist()], dtype=torch.int32, device="cuda") for x in (ql, kl)]
    k0, v0 = kc.clone(), vc.clone()
    out, lse = flash_attn_with_kvcache(q, kc, vc, k=kn, v=vn, cache_seqlens=torch.tensor(lens, dtype=torch.int32,
                                       device="cuda"), cu_seqlens_q=cu[0], max_seqlen_q=max(ql), cu_seqlens_k_new=cu[1],
                                       causal=causal, return_softmax_lse=True)
    assert out.shape == q.shape and lse.shape == (H, q.shape[0])
    for b in range(B):
        n, m, qs = lens[b], kl[b], slice(int(cu[0][b]), int(cu[0][b + 1]))
        assert torch.equal(kc[b, n:n + m], kn[cu[1][b]:cu[1][b + 1]]) and torch.equal(kc[b, :n], k0[b, :n])
        assert torch.equal(vc[b, n:n + m], vn[cu[1][b]:cu[1][b + 1]]) and torch.equal(vc[b, n + m:], v0[b, n + m:])
        check(torch, out[None, qs], q[None, qs], kc[b:b + 1, :n + m], vc[b:b + 1, :n + m], causal, D ** -0.5,
              lse=lse[None, :, qs])


@pytest.mark.parametrize("skv,window,causal", [(5000, (1023, 0), True), (300, (4095, -1), False), (777, (0, 0), True),
                                                (4096, (100, 50), False)])
def test_decode_step_with_a_window(torch, pt, skv, window, causal):
    """One query with a sliding window runs the dense split-KV decode kernel on the keys it sees (a view): right at
    every length, including a window wider than the cache and a window of one key; repeated steps on a growing
    cache (the decode family re-targeted) stay right."""
    q, k, v = _inputs(torch, 2, 1, skv + 3, 8, 2, 128, "bf16", 51)
    for n in (skv, skv + 1, skv + 3):
        out = pt.flash_attention(q, k[:, :n], v[:, :n], causal=causal, window_size=window)
        check(torch, out, q, k[:, :n], v[:, :n], causal, 128 ** -0.5, window=(window[0], 0 if causal else window[1]))


def paged(torch, kd, vd, page, seed):
    """(k pool, v pool, page table) holding the dense caches kd / vd [B, maxp·page, Hkv, D] in pages of ``page`` keys
    scattered through a pool four times the size (a seeded permutation), the other pages noise: vLLM's layout."""
    B, S, Hkv, D = kd.shape
    maxp, pool = S // page, 4 * B * (S // page)
    perm = torch.randperm(pool, device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed))
    table = perm[:B * maxp].view(B, maxp).int()
    kc = torch.randn(pool, page, Hkv, D, device="cuda", dtype=kd.dtype)  # pages no table names: noise
    vc = torch.randn_like(kc)
    kc[table.long().flatten()] = kd.reshape(B * maxp, page, Hkv, D)
    vc[table.long().flatten()] = vd.reshape(B * maxp, page, Hkv, D)
    return kc, vc, table


@pytest.mark.parametrize("page,D,dt,sq", [(16, 128, "bf16", 1), (64, 64, "fp16", 4), (256, 128, "fp16", 1),
                                           (32, 128, "bf16", 16)])
def test_paged_kv_decode(torch, pt, page, D, dt, sq):
    """vLLM's paged cache (FA3's ``page_table``): each sequence's keys in pages scattered through one pool, in the
    table's order, lengths that end mid-page and one that fills its pages; the split-KV decode kernel loads each key
    block from its pages. The output against the same sequences laid out densely."""
    from ptsolve.flash_attn_interface import flash_attn_with_kvcache
    B, H, Hkv, maxp = 3, 8, 2, 6
    lens = [page * maxp, 3 * page + 5, sq]
    q, kd, vd = _inputs(torch, B, sq, page * maxp, H, Hkv, D, dt, 61)
    kc, vc, table = paged(torch, kd, vd, page, 62)
    out = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=torch.tensor(lens, dtype=torch.int32, device="cuda"),
                                  page_table=table, causal=True)
    for b in range(B):
        n = lens[b]
        check(torch, out[b:b + 1], q[b:b + 1], kd[b:b + 1, :n], vd[b:b + 1, :n], True, D ** -0.5)


def test_transformers_gemma2_softcap_and_sliding_window(torch, pt):
    """A Hugging Face Gemma-2 (random weights; every other layer a 64-key sliding window, attention logits capped at
    50) through ``attn_implementation="ptsolve"``: a 200-token prefill and 4 decode steps with the dynamic cache,
    the logits within twice the error of the eager bf16 model (which applies softcap and window) against float32."""
    pytest.importorskip("transformers")
    from transformers import Gemma2Config, Gemma2ForCausalLM
    cfg = Gemma2Config(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=64, sliding_window=64,
                       attn_logit_softcapping=50.0, final_logit_softcapping=None, max_position_embeddings=1024)
    torch.manual_seed(0)
    m32 = Gemma2ForCausalLM(cfg).cuda().eval()
    m16 = Gemma2ForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    m16.load_state_dict(m32.state_dict())
    ids = torch.randint(0, 1000, (2, 200), device="cuda")
    steps = torch.randint(0, 1000, (2, 4), device="cuda")
    name = pt.register_transformers()

    def run(model, impl):
        if hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation(impl)
        else:
            model.config._attn_implementation = impl
        out = model(ids, use_cache=True)
        cache, logits = out.past_key_values, [out.logits[:, -1].float()]
        for i in range(steps.shape[1]):
            out = model(steps[:, i:i + 1], past_key_values=cache, use_cache=True)
            cache, logits = out.past_key_values, logits + [out.logits[:, -1].float()]
        return torch.stack(logits)

    with torch.no_grad():
        ref, eager, ours = run(m32, "eager"), run(m16, "eager"), run(m16, name)
    e_ours, e_eager = (ours - ref).abs().max().item(), (eager - ref).abs().max().item()
    assert e_ours <= 2 * e_eager + 1e-2, (e_ours, e_eager)


CHUNK_CASES = [  # B, Sq, Skv, H, Hkv, D, causal, dt, softcap, window, chunk
    (2, 3000, 3000, 8, 2, 128, True, "bf16", 0.0, (-1, -1), 1024),    # Llama-4's local layers, a ragged last chunk
    (1, 1000, 2500, 8, 1, 128, True, "fp16", 0.0, (-1, -1), 512),     # seq_q < seq_kv: aligned bottom-right, MQA
    (1, 1000, 2500, 4, 2, 64, False, "bf16", 0.0, (-1, -1), 768),     # not causal: a query sees all of its chunk
    (1, 700, 300, 4, 2, 64, False, "bf16", 0.0, (-1, -1), 128),       # seq_q > seq_kv: rows that see no key
    (2, 1500, 1500, 8, 4, 256, True, "bf16", 30.0, (300, 0), 512),    # causal window + softcap inside chunks
    (1, 2048, 2048, 4, 4, 96, False, "fp16", 0.0, (100, 100), 256),   # a two-sided window
    (1, 4096, 4096, 4, 1, 192, True, "fp16", 0.0, (-1, -1), 8192),    # one chunk: the plain kernel
    (2, 8, 5000, 8, 2, 128, True, "bf16", 0.0, (-1, -1), 4096),       # a short query in one chunk: split-KV decode
    (1, 1, 8193, 8, 2, 64, True, "fp16", 0.0, (-1, -1), 8192),        # a decode step on a chunk's first key
]


@pytest.mark.parametrize("B,Sq,Skv,H,Hkv,D,causal,dt,softcap,window,chunk", CHUNK_CASES)
def test_attention_chunk(torch, pt, B, Sq, Skv, H, Hkv, D, causal, dt, softcap, window, chunk):
    """flash_attention / flash_attn_func with attention_chunk against FA3's rule (chunk mask and causal / window),
    within FlashAttention's tolerance; the LSE too; the FA3 interface's output the same computation's."""
    from ptsolve.flash_attn_interface import flash_attn_func
    q, k, v = _inputs(torch, B, Sq, Skv, H, Hkv, D, dt, B * 7 + Sq + Skv + chunk)
    out, lse = pt.flash_attention(q, k, v, causal=causal, return_lse=True, softcap=softcap, window_size=window,
                                  attention_chunk=chunk)
    check(torch, out, q, k, v, causal, D ** -0.5, softcap, window, lse, chunk)
    o2 = flash_attn_func(q, k, v, causal=causal, softcap=softcap, window_size=window, attention_chunk=chunk)
    check(torch, o2, q, k, v, causal, D ** -0.5, softcap, window, chunk=chunk)


@pytest.mark.parametrize("causal,window", [(True, (-1, -1)), (False, (-1, -1)), (True, (200, 0))])
def test_attention_chunk_varlen(torch, pt, causal, window):
    """Packed sequences, each chunked at its own (seqused) lengths: seq_q < seq_kv, > seq_kv, one sequence shorter
    than a chunk and one empty; the LSE [H, total_q]."""
    from ptsolve.flash_attn_interface import flash_attn_varlen_func
    dtype, H, Hkv, D, C = torch.bfloat16, 8, 2, 128, 512
    lq, lk = [1500, 40, 2000, 300, 0], [3000, 40, 1100, 2100, 64]
    uq, uk = [1400, 40, 2000, 299, 0], [3000, 33, 1100, 2100, 60]
    cq, ck = ([0, *torch.tensor(x).cumsum(0).tolist()] for x in (lq, lk))
    g = torch.Generator(device="cuda").manual_seed(81)
    q = torch.randn(sum(lq), H, D, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(sum(lk), Hkv, D, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(sum(lk), Hkv, D, device="cuda", dtype=dtype, generator=g)
    it = lambda x: torch.tensor(x, dtype=torch.int32, device="cuda")  # noqa: E731
    out, lse = flash_attn_varlen_func(q, k, v, it(cq), it(ck), max(lq), max(lk), seqused_q=it(uq), seqused_k=it(uk),
                                      causal=causal, window_size=window, attention_chunk=C, return_attn_probs=True)
    for b in range(len(lq)):
        if uq[b] == 0:
            continue
        qs, ks = slice(cq[b], cq[b] + uq[b]), slice(ck[b], ck[b] + uk[b])
        check(torch, out[qs][None], q[qs][None], k[ks][None], v[ks][None], causal, D ** -0.5, window=window,
              lse=lse[:, qs][None], chunk=C)


def test_attention_chunk_kvcache(torch, pt):
    """flash_attn_with_kvcache with attention_chunk: decode steps at lengths around a chunk's edges (the contiguous
    cache seen as pages where a page size divides it and the chunk, else the varlen kernel), then a
    chunked prefill of varlen queries appending new keys, with cache_batch_idx and cache_leftpad (the chunks counted
    from the leftpad, FA3's). The varlen kernel over the cache."""
    from ptsolve.flash_attn_interface import flash_attn_with_kvcache
    B, NB, S, H, Hkv, D, C = 4, 5, 4096, 8, 2, 128, 1024
    q, kc, vc = _inputs(torch, NB, 1, S, H, Hkv, D, "bf16", 91)
    q = q[:B]
    it = lambda x: torch.tensor(x, dtype=torch.int32, device="cuda")  # noqa: E731
    lens = [4096, 1024, 1025, 1]
    for c in (C, 1000):  # a chunk 256-key pages divide: split-KV over its pages (_as_pages); 1000: the varlen kernel
        out = flash_attn_with_kvcache(q, kc[:B], vc[:B], cache_seqlens=it(lens), causal=True, attention_chunk=c)
        for b, n in enumerate(lens):
            check(torch, out[b:b + 1], q[b:b + 1], kc[b:b + 1, :n], vc[b:b + 1, :n], True, D ** -0.5, chunk=c)
    ql, kl, lens, pad, idx = [700, 1, 1500], [700, 1, 3], [1000, 2047, 300], [0, 30, 100], [4, 0, 2]
    cu = [it([0, *torch.tensor(x).cumsum(0).tolist()]) for x in (ql, kl)]
    qv = _inputs(torch, 1, sum(ql), 1, H, Hkv, D, "bf16", 92)[0][0]
    kn, vn = (x[0] * 0.5 for x in _inputs(torch, 1, 1, sum(kl), H, Hkv, D, "bf16", 93)[1:])
    out, lse = flash_attn_with_kvcache(qv, kc, vc, k=kn, v=vn, cache_seqlens=it(lens), cache_batch_idx=it(idx),
                                       cache_leftpad=it(pad), cu_seqlens_q=cu[0], max_seqlen_q=max(ql),
                                       cu_seqlens_k_new=cu[1], causal=True, attention_chunk=C,
                                       return_softmax_lse=True)
    for b in range(3):
        c, n, qs = idx[b], lens[b] + kl[b], slice(int(cu[0][b]), int(cu[0][b + 1]))
        check(torch, out[None, qs], qv[None, qs], kc[c:c + 1, pad[b]:n], vc[c:c + 1, pad[b]:n], True, D ** -0.5,
              lse=lse[None, :, qs], chunk=C)


@pytest.mark.parametrize("page", [16, 64, 256])
def test_attention_chunk_paged_decode(torch, pt, page):
    """vLLM's paged cache with attention_chunk: a decode step runs the split-KV decode kernel on the page table
    shifted to its chunk's first page (no key copied), lengths on a chunk's edge, past it and inside the first
    chunk; two query positions are refused (they may straddle a chunk's edge)."""
    from ptsolve.flash_attn_interface import flash_attn_with_kvcache
    B, H, Hkv, D, C, S = 4, 8, 2, 128, 1024, 4096
    q, kd, vd = _inputs(torch, B, 1, S, H, Hkv, D, "bf16", 121)
    kc, vc, table = paged(torch, kd, vd, page, 122)
    lens = torch.tensor([4096, 1024, 1025, 7], dtype=torch.int32, device="cuda")
    out = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, page_table=table, causal=True, attention_chunk=C)
    for b, n in enumerate(lens.tolist()):
        check(torch, out[b:b + 1], q[b:b + 1], kd[b:b + 1, :n], vd[b:b + 1, :n], True, D ** -0.5, chunk=C)
    with pytest.raises(NotImplementedError, match="2 query positions"):
        flash_attn_with_kvcache(torch.cat([q, q], 1), kc, vc, cache_seqlens=lens, page_table=table, causal=True,
                                attention_chunk=C)


def test_attention_chunk_under_torch_compile(torch, pt):
    q, k, v = _inputs(torch, 1, 1000, 1000, 4, 2, 64, "bf16", 95)

    def f(q, k, v):
        return pt.flash_attention(q, k, v, causal=True, attention_chunk=256)
    torch._dynamo.reset()
    got = torch.compile(f, fullgraph=True)(q, k, v)
    assert torch.equal(got, f(q, k, v))


def _launch_of(ln):
    return getattr(ln, "ln", ln)  # a Provisional (exact-shape schedule pending) wraps the class kernel's launch


@pytest.mark.parametrize("margin", [16, 100])
def test_sm_margin_prefill(torch, pt, monkeypatch, margin):
    """sm_margin: the same output, bit for bit (each tile is computed alike whatever the grid); a persistent kernel's
    grid at most the SMs left (a kernel of one CTA per tile keeps its grid); the launches of calls without a margin
    are not disturbed (their kept launch is the same object before and after)."""
    from ptsolve import serve
    monkeypatch.setenv("PTSOLVE_EXACT", "off")  # the class kernel both ways
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    q, k, v = _inputs(torch, 4, 4096, 4096, 16, 8, 128, "bf16", 101)
    full = pt.flash_attention(q, k, v, causal=True)
    kept = pt._FAST.get(pt._fast_key(q, k, v, True, None))
    less = pt.flash_attention(q, k, v, causal=True, sm_margin=margin)
    assert torch.equal(less, full)
    assert torch.equal(pt.flash_attention(q, k, v, causal=True), full)
    assert pt._FAST.get(pt._fast_key(q, k, v, True, None)) is kept
    c, scale = pt.attention_class(q, k, True), 128 ** -0.5
    ln0 = _launch_of(serve.attention_launch(q, k, v, c, scale))
    ln = _launch_of(serve.attention_launch(q, k, v, c, scale, sm_margin=margin))
    assert ln is not ln0 and (ln0.margin, ln.margin) == (0, margin)
    if ln0.cap is not None:  # persistent: one CTA per SM left at most, fewer than without the margin
        assert ln.grid[0] <= max(sms - margin, ln.cap[1]) < ln0.grid[0] <= sms
    else:
        assert ln.grid == ln0.grid
    o, lse = pt.flash_attention(q, k, v, causal=True, return_lse=True, sm_margin=margin)
    assert torch.equal(o, full) or check(torch, o, q, k, v, True, scale) is None
    cu = torch.arange(5, dtype=torch.int32, device="cuda") * 4096
    flat = [x.flatten(0, 1) for x in (q, k, v)]
    o2 = pt.flash_attention_varlen(*flat, cu, cu, 4096, 4096, causal=True, sm_margin=margin)
    assert torch.equal(o2, pt.flash_attention_varlen(*flat, cu, cu, 4096, 4096, causal=True))
    with pytest.raises(ShapeError, match=f"sm_margin={sms}"):
        pt.flash_attention(q, k, v, causal=True, sm_margin=sms)


@pytest.mark.parametrize("margin", [8, 120])
def test_sm_margin_decode(torch, pt, margin):
    """A split-KV decode step with a margin: its pieces and merge grid chosen for the SMs left (the numbers may
    differ by the merge order: FlashAttention's tolerance), a persistent binary's grid capped; the kv-cache call and
    a decode family (a growing cache) too."""
    from ptsolve import serve
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    q, k, v = _inputs(torch, 1, 1, 32768, 32, 8, 128, "fp16", 111)
    for n in (32768, 32767):
        out = pt.flash_attention(q, k[:, :n], v[:, :n], sm_margin=margin)
        check(torch, out, q, k[:, :n], v[:, :n], False, 128 ** -0.5)
    c = pt._decode_class(q, k, False)
    ln = _launch_of(serve.decode_launch(q, k, v, c, 128 ** -0.5, sm_margin=margin))
    assert ln.margin == margin and (ln.cap is None or ln.grid[0] <= sms - margin)
    lens = torch.tensor([20000], dtype=torch.int32, device="cuda")
    out = pt.flash_attention_kvcache(q, k, v, lens, sm_margin=margin)
    check(torch, out, q, k[:, :20000], v[:, :20000], False, 128 ** -0.5)
