"""``flash_attention_kvcache``'s general path on the CPU (FlashAttention-3's ``flash_attn_with_kvcache``): varlen
queries (``cu_seqlens_q``), new keys appended in place (dense or ``cu_seqlens_k_new``), rotary, ``cache_batch_idx``,
``cache_leftpad``, causal and windowed, against an independent per-sequence reference. The varlen kernel is replaced
by its semantics in PyTorch (seqused, each sequence's own bottom-right alignment: the GPU tests check the kernel
against them), so what is tested here is everything ptsolve builds around it: the packing, the offsets, the lengths,
the append and the rotation."""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture()
def pt(monkeypatch):
    import ptsolve.torch as pt
    monkeypatch.setattr(pt, "_same", lambda name, xs: None)  # CPU tensors stand in for the GPU's
    monkeypatch.setattr(pt, "_CHECKED", set())
    monkeypatch.setattr(pt, "_flash_attention_features_cuda", _varlen_kernel)
    return pt


def _varlen_kernel(q, k, v, cu_q, cu_k, used_q, used_k, max_q, max_k, causal, scale, softcap, wl, wr):
    """The varlen kernel's semantics: sequence b's queries rows cu_q[b] .. (used_q[b] of them, else to cu_q[b+1]),
    its keys rows cu_k[b] .. (used_k[b], else to cu_k[b+1]), masked bottom-right at those lengths."""
    from codegen.harness.attention import keep_mask
    T, H, D = q.shape
    out, lse = torch.full((T, H, D), math.nan), torch.full((H, T), math.nan)
    for b in range(cu_q.numel() - 1):
        q0, nq = int(cu_q[b]), int(cu_q[b + 1] - cu_q[b]) if used_q is None else int(used_q[b])
        k0, nk = int(cu_k[b]), int(cu_k[b + 1] - cu_k[b]) if used_k is None else int(used_k[b])
        s, o, ls = _attend(q[q0:q0 + nq], k[k0:k0 + nk], v[k0:k0 + nk], scale, softcap,
                           keep_mask(nq, nk, causal, (wl, wr), "cpu"))
        out[q0:q0 + nq], lse[:, q0:q0 + nq] = o, ls
    return out.to(q.dtype), lse


def _attend(q, k, v, scale, softcap, keep):
    """(scores, out [nq, H, D] fp32, lse [H, nq]) of one sequence: q [nq, H, D], k / v [nk, Hkv, D]."""
    rep = q.shape[1] // k.shape[1]
    kk, vv = k.float().repeat_interleave(rep, 1), v.float().repeat_interleave(rep, 1)
    s = torch.einsum("qhd,khd->hqk", q.float(), kk) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~keep, -math.inf)
    ls = torch.logsumexp(s, -1)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return s, torch.einsum("hqk,khd->qhd", p, vv), torch.where(torch.isneginf(ls), math.inf, ls)


def _rope(x, cos, sin, pos, interleaved):
    """x [n, H, D] rotated on its first 2·cos.shape[1] dims at positions pos [n], as complex products."""
    rd = 2 * cos.shape[1]
    r = x[..., :rd].float()
    pairs = r.unflatten(-1, (-1, 2)) if interleaved else torch.stack((r[..., :rd // 2], r[..., rd // 2:]), -1)
    z = torch.view_as_complex(pairs.contiguous()) * torch.polar(torch.ones_like(cos[pos]), torch.atan2(
        sin[pos], cos[pos]))[:, None]
    w = torch.view_as_real(z)
    rot = w.flatten(-2) if interleaved else torch.cat((w[..., 0], w[..., 1]), -1)
    return torch.cat((rot.to(x.dtype), x[..., rd:]), -1)


CASES = {  # name: (q lengths or None for dense Sq=3, new-key lengths or None (none) or "dense" (2 each), options)
    "varlen_q": ([3, 0, 5], None, {}),
    "varlen_q_new_k": ([3, 1, 5], [2, 1, 0], {}),
    "varlen_q_new_k_rotary": ([2, 4, 1], [1, 3, 2], {"rotary": True}),
    "varlen_q_rotary_halves_batch_idx": ([2, 2, 3], [1, 0, 2], {"rotary": True, "interleaved": False, "idx": True}),
    "dense_q_varlen_new_k_window": (None, [2, 0, 3], {"window": (4, -1)}),
    "varlen_q_dense_new_k_leftpad": ([1, 3, 2], "dense", {"pad": True}),
}


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("case", sorted(CASES))
def test_kvcache_general_path_matches_a_per_sequence_reference(pt, case, causal):
    qlens, klens, opt = CASES[case]
    g = torch.Generator().manual_seed(7)
    B, H, Hkv, D, S = 3, 4, 2, 64, 24
    nb = 5 if opt.get("idx") else B  # with cache_batch_idx the cache holds more sequences than q
    h = torch.float16

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(h)
    kc, vc = rnd(nb, S, Hkv, D), rnd(nb, S, Hkv, D)
    kc0, vc0 = kc.clone(), vc.clone()
    lens = torch.tensor([6, 11, 3], dtype=torch.int32)
    idx = torch.tensor([4, 0, 2], dtype=torch.int32) if opt.get("idx") else None
    pad = torch.tensor([2, 0, 1], dtype=torch.int32) if opt.get("pad") else None
    kw = {"cache_batch_idx": idx, "cache_leftpad": pad, "window_size": opt.get("window", (-1, -1)),
          "return_lse": True}
    if qlens is None:
        q = rnd(B, 3, H, D)
        qs = list(q)
    else:
        cu = torch.tensor([0, *torch.tensor(qlens).cumsum(0).tolist()], dtype=torch.int32)
        q = rnd(int(cu[-1]), H, D)
        qs = [q[cu[b]:cu[b + 1]] for b in range(B)]
        kw |= {"cu_seqlens_q": cu, "max_seqlen_q": max(qlens)}
    news = [None] * B
    if klens == "dense":
        kn, vn = rnd(B, 2, Hkv, D), rnd(B, 2, Hkv, D)
        news = [(kn[b], vn[b]) for b in range(B)]
        kw |= {"k": kn, "v": vn}
    elif klens is not None:
        cuk = torch.tensor([0, *torch.tensor(klens).cumsum(0).tolist()], dtype=torch.int32)
        kn, vn = rnd(int(cuk[-1]), Hkv, D), rnd(int(cuk[-1]), Hkv, D)
        news = [(kn[cuk[b]:cuk[b + 1]], vn[cuk[b]:cuk[b + 1]]) for b in range(B)]
        kw |= {"k": kn, "v": vn, "cu_seqlens_k_new": cuk}
    if opt.get("rotary"):
        ang = torch.rand(64, 8, generator=g) * 6
        kw |= {"rotary_cos": ang.cos(), "rotary_sin": ang.sin(), "rotary_interleaved": opt.get("interleaved", True)}
    out, lse = pt.flash_attention_kvcache(q, kc, vc, lens.clone(), causal=causal, **kw)

    for b in range(B):
        row, n0 = (b if idx is None else int(idx[b])), int(lens[b])
        qb, (knb, vnb) = qs[b], news[b] if news[b] is not None else (kc0[0, :0], vc0[0, :0])
        if opt.get("rotary"):
            cos, sin, il = kw["rotary_cos"], kw["rotary_sin"], kw["rotary_interleaved"]
            steps = causal or kw["window_size"] != (-1, -1)
            qb = _rope(qb, cos, sin, n0 + (torch.arange(len(qb)) if steps else torch.zeros(len(qb), dtype=int)), il)
            knb = _rope(knb, cos, sin, n0 + torch.arange(len(knb)), il)
        # the cache after the call: the new keys at n0 .., the rest as it was
        assert torch.equal(kc[row, n0:n0 + len(knb)], knb) and torch.equal(vc[row, n0:n0 + len(vnb)], vnb)
        assert torch.equal(kc[row, :n0], kc0[row, :n0]) and torch.equal(kc[row, n0 + len(knb):],
                                                                        kc0[row, n0 + len(knb):])
        p0 = 0 if pad is None else int(pad[b])
        keys = torch.cat([kc0[row, p0:n0], knb]), torch.cat([vc0[row, p0:n0], vnb])
        wl, wr = kw["window_size"]
        from codegen.harness.attention import keep_mask
        keep = keep_mask(len(qb), len(keys[0]), causal, (wl, 0 if causal else wr), "cpu")
        _, ref, rl = _attend(qb, *keys, D ** -0.5, 0.0, keep)
        got = out[b] if qlens is None else out[kw["cu_seqlens_q"][b]:kw["cu_seqlens_q"][b + 1]]
        got_lse = lse[b] if qlens is None else lse[:, kw["cu_seqlens_q"][b]:kw["cu_seqlens_q"][b + 1]]
        assert (got.float() - ref).abs().max().item() < 1e-2 if len(qb) else got.numel() == 0
        assert torch.allclose(got_lse, rl, atol=1e-2) if len(qb) else True
    assert out.shape == q.shape and lse.shape == ((B, H, q.shape[1]) if qlens is None else (H, q.shape[0]))


def test_varlen_arguments_are_checked(pt):
    from ptsolve.errors import ShapeError
    q, kc = torch.zeros(5, 4, 64, dtype=torch.float16), torch.zeros(2, 16, 2, 64, dtype=torch.float16)
    lens, cu = torch.tensor([3, 4], dtype=torch.int32), torch.tensor([0, 2, 5], dtype=torch.int32)
    with pytest.raises(ShapeError, match="max_seqlen_q"):
        pt.flash_attention_kvcache(q, kc, kc, lens, cu_seqlens_q=cu)
    with pytest.raises(ShapeError, match=r"int32 \(3,\) offsets"):
        pt.flash_attention_kvcache(q, kc, kc, lens, cu_seqlens_q=cu.long(), max_seqlen_q=3)
    with pytest.raises(ShapeError, match="k and v together"):
        pt.flash_attention_kvcache(q, kc, kc, lens, cu_seqlens_q=cu, max_seqlen_q=3, cu_seqlens_k_new=cu)
    with pytest.raises(ShapeError, match=r"q \(5, 4, 64\) must be \[5, S, H, D\]"):
        pt.flash_attention_kvcache(q, kc, kc, lens, return_lse=True)
    with pytest.raises(ShapeError, match=r"k \(3, 2, 64\) must be \[2, S, H, D\]"):
        pt.flash_attention_kvcache(q[:2, None], kc, kc, lens, k=torch.zeros(3, 2, 64, dtype=torch.float16),
                                   v=torch.zeros(3, 2, 64, dtype=torch.float16), return_lse=True)
