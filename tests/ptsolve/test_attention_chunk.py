"""FlashAttention-3's ``attention_chunk`` (Llama-4's chunked local attention) and ``sm_margin`` through
``ptsolve.torch`` and ``ptsolve.flash_attn_interface``, on the CPU (issue "FlashAttention's interface").

The chunked calls cut each sequence into (sequence, chunk) pieces that the varlen kernel runs as sequences of their
own; here the kernel is replaced by a CPU model of what it computes (each piece its own attention, bottom-right
aligned at the piece's lengths, causal / window / softcap, LSE +inf where a row sees no key, only the rows a piece
uses written), and the results are compared with FlashAttention-3's chunk rule written out as a dense mask: query i
at p = i + sk − sq sees keys ⌊p / C⌋·C <= j < ⌊p / C⌋·C + C (floor: none for p < 0), and causal / the window as
usual. The GPU tests (tests/gpu/test_attention_features_gpu.py) run the kernels themselves."""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import test_torch_cpu  # noqa: E402 (tests/serve: its fake GPU, reused below)

import ptsolve.torch as pt  # noqa: E402
from ptsolve import flash_attn_interface as fai  # noqa: E402
from ptsolve.errors import ShapeError  # noqa: E402

NAN = float("nan")


def fa3_mask(sq: int, sk: int, causal: bool, window: tuple[int, int], chunk: int) -> torch.Tensor:
    """FlashAttention-3's mask, bool [sq, sk] (True: the query sees the key), written from its rule."""
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    p = i + sk - sq
    left, right = window
    keep = torch.ones(sq, sk, dtype=torch.bool)
    if causal:
        keep &= j <= p
    if right >= 0:
        keep &= j <= p + right
    if left >= 0:
        keep &= j >= p - left
    if chunk:
        lo = torch.div(p, chunk, rounding_mode="floor") * chunk  # floor, as FA3's div_floor: p < 0 sees no key
        keep &= (j >= lo) & (j < lo + chunk)
    return keep


def dense_ref(q, k, v, causal, scale, softcap=0.0, window=(-1, -1), chunk=0):
    """(out [B, Sq, H, D], lse [B, H, Sq]) in float64: zeros and +inf where a row sees no key."""
    B, sq, H, D = q.shape
    sk, rep = k.shape[1], H // k.shape[2]
    qd, kd, vd = (x.double().transpose(1, 2) for x in (q, k, v))
    kd, vd = kd.repeat_interleave(rep, 1), vd.repeat_interleave(rep, 1)
    s = (qd @ kd.transpose(-1, -2)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~fa3_mask(sq, sk, causal, window, chunk), -math.inf)
    lse = torch.logsumexp(s, -1)
    out = (torch.softmax(s, -1).nan_to_num(0.0) @ vd).transpose(1, 2)
    return out, torch.where(torch.isneginf(lse), math.inf, lse)


class VarlenModel:
    """What the varlen kernel computes (``_flash_attention_features_cuda``'s arguments), on the CPU: each sequence b
    its own attention over rows cu_q[b] .. + used_q[b] and keys cu_k[b] .. + used_k[b]; output rows no sequence uses
    stay NaN, so a row left unwritten fails the comparison. Checks what the kernel relies on: every sequence within
    max_q / max_k (its grid covers max_q rows), the window normalised (-1 or >= 0), cu_q's last entry the rows."""

    def __init__(self):
        self.calls = []

    def __call__(self, q, k, v, cu_q, cu_k, used_q, used_k, max_q, max_k, causal, scale, softcap, wl, wr,
                 sm_margin=0):
        self.calls.append({"q": q, "k": k, "cu_q": cu_q, "cu_k": cu_k, "used_q": used_q, "used_k": used_k,
                           "max_q": max_q, "max_k": max_k, "window": (wl, wr), "margin": sm_margin})
        assert cu_q.dtype == cu_k.dtype == torch.int32 and int(cu_q[-1]) == q.shape[0]
        out = torch.full(q.shape, NAN, dtype=torch.float64)
        lse = torch.full((q.shape[1], q.shape[0]), NAN, dtype=torch.float64)
        for b in range(cu_q.shape[0] - 1):
            q0, k0 = int(cu_q[b]), int(cu_k[b])
            nq = int(used_q[b]) if used_q is not None else int(cu_q[b + 1]) - q0
            nk = int(used_k[b]) if used_k is not None else int(cu_k[b + 1]) - k0
            assert 0 <= nq <= max_q and 0 <= nk <= max_k, (b, nq, nk, max_q, max_k)
            if nq == 0:
                continue
            o, s = dense_ref(q[None, q0:q0 + nq], k[None, k0:k0 + nk], v[None, k0:k0 + nk], causal, scale, softcap,
                             (wl, wr))
            out[q0:q0 + nq], lse[:, q0:q0 + nq] = o[0], s[0]
        return out, lse


@pytest.fixture
def cpu(monkeypatch):
    """ptsolve.torch on CPU tensors: the device check off, the varlen kernel and the dense kernels replaced by CPU
    models (the dense one records the keys it was given)."""
    monkeypatch.setattr(pt, "_same", lambda name, xs: None)
    model = VarlenModel()
    monkeypatch.setattr(pt, "_flash_attention_features_cuda", model)
    dense = []

    def attend(q, k, v, causal, softmax_scale, return_lse, softcap, window_size, margin=0):
        dense.append({"k": k, "margin": margin})
        scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
        o, s = dense_ref(q, k, v, causal, scale, softcap, tuple(window_size))
        return (o, s) if return_lse else o

    monkeypatch.setattr(pt, "_attend", attend)
    model.dense = dense
    return model


def _qkv(B, sq, sk, H, Hkv, D=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, sq, H, D, generator=g, dtype=torch.float64).to(torch.bfloat16),
            torch.randn(B, sk, Hkv, D, generator=g, dtype=torch.float64).to(torch.bfloat16),
            torch.randn(B, sk, Hkv, D, generator=g, dtype=torch.float64).to(torch.bfloat16))


def _close(got, want):
    assert not torch.isnan(got).any(), "a row was not written"
    torch.testing.assert_close(got.double(), want.double(), rtol=1e-9, atol=1e-9)


# B, sq, sk, H, Hkv, chunk, causal, window, softcap
DENSE = [
    (2, 300, 300, 4, 2, 64, True, (-1, -1), 0.0),     # prefill, causal: Llama-4's local layers
    (2, 300, 300, 4, 4, 64, False, (-1, -1), 0.0),    # not causal: a query sees its whole chunk, later keys too
    (1, 100, 333, 4, 1, 64, True, (-1, -1), 0.0),     # sq < sk: queries aligned bottom-right, MQA
    (1, 100, 333, 4, 2, 64, False, (-1, -1), 0.0),    # sq < sk, not causal: the first chunk of queries is ragged
    (1, 333, 100, 4, 2, 64, False, (-1, -1), 0.0),    # sq > sk: rows with p < 0 see no key (zeros, LSE +inf)
    (1, 333, 100, 4, 2, 48, True, (-1, -1), 0.0),
    (2, 257, 257, 8, 2, 100, True, (30, 0), 0.0),     # window within the chunk: both masks
    (2, 200, 260, 4, 2, 64, False, (20, 10), 30.0),   # two-sided window + softcap, sq < sk
    (1, 129, 129, 2, 2, 128, True, (200, -1), 0.0),   # a window wider than the chunk: the chunk decides
    (1, 64, 1000, 4, 2, 16, False, (-1, 5), 0.0),     # many small chunks, a right window
]


@pytest.mark.parametrize("B,sq,sk,H,Hkv,chunk,causal,window,softcap", DENSE)
def test_dense_chunks_are_fa3s_mask(cpu, B, sq, sk, H, Hkv, chunk, causal, window, softcap):
    q, k, v = _qkv(B, sq, sk, H, Hkv, seed=sq + sk + chunk)
    out, lse = pt.flash_attention(q, k, v, causal=causal, return_lse=True, softcap=softcap, window_size=window,
                                  attention_chunk=chunk)
    want, wlse = dense_ref(q, k, v, causal, 64 ** -0.5, softcap, window, chunk)
    _close(out, want)
    _close(lse, wlse)
    call, = cpu.calls  # one varlen launch over every (sequence, chunk) piece, on views of q, k, v (no copy)
    assert call["q"].data_ptr() == q.data_ptr() and call["k"].data_ptr() == k.data_ptr()
    assert call["max_q"] <= chunk and call["max_k"] <= chunk
    assert (call["used_q"] > 0).all()  # dense: the exact pieces, none empty
    only = pt.flash_attention(q, k, v, causal=causal, softcap=softcap, window_size=window, attention_chunk=chunk)
    _close(only, want)  # without the LSE: the same pieces


def test_rows_that_see_no_key_are_zeros_with_lse_inf(cpu):
    """sq > sk, not causal: FA3's floor puts p = −1 in chunk −1, which holds no key; round-toward-zero would give
    it chunk 0's keys. The first sq − sk rows are zeros with LSE +inf."""
    q, k, v = _qkv(1, 50, 20, 2, 2)
    out, lse = pt.flash_attention(q, k, v, return_lse=True, attention_chunk=8)
    assert (out[0, :30] == 0).all() and torch.isinf(lse[0, :, :30]).all()
    assert (lse[0, :, 30:] < math.inf).all()


def test_a_wrong_alignment_is_caught(cpu, monkeypatch):
    """The comparison fails when the pieces follow another rule (chunks counted on query positions, top-left): the
    tests above check FA3's rule, not whatever the pieces do."""
    def top_left(nq, nk, chunk, pieces):
        q0, qn, k0, kn = right_pieces(nk, nk, chunk, pieces)  # as if sq == sk: p = i
        return torch.minimum(q0, nq[:, None]), torch.minimum(qn, (nq[:, None] - q0).clamp(min=0)), k0, kn
    right_pieces = pt._chunk_pieces
    monkeypatch.setattr(pt, "_chunk_pieces", top_left)
    q, k, v = _qkv(1, 100, 333, 4, 2)
    out = pt.flash_attention(q, k, v, causal=False, attention_chunk=64)
    want = dense_ref(q, k, v, False, 64 ** -0.5, chunk=64)[0]
    with pytest.raises(AssertionError):
        _close(out, want)


@pytest.mark.parametrize("sq,sk,chunk", [(1, 1000, 256), (1, 1024, 256), (4, 1000, 256), (16, 8192, 8192),
                                         (300, 300, 512)])
def test_queries_of_one_chunk_run_dense_on_its_keys(cpu, sq, sk, chunk):
    """Every query in one chunk (a decode step, speculative verification, a prefill shorter than a chunk): the dense
    kernels (split-KV decode for a step) on the chunk's keys, a view k[:, cC:], no varlen launch."""
    q, k, v = _qkv(2, sq, sk, 4, 2)
    out = pt.flash_attention(q, k, v, causal=True, attention_chunk=chunk)
    _close(out, dense_ref(q, k, v, True, 64 ** -0.5, chunk=chunk)[0])
    assert not cpu.calls
    start = (sk - sq) // chunk * chunk
    assert cpu.dense[0]["k"].data_ptr() == k[:, start:].data_ptr() and cpu.dense[0]["k"].shape[1] == sk - start


def test_dense_pieces_under_compile_are_the_device_rule():
    """_dense_pieces (the graph constants a torch.compile'd dense call uses) gives the same cu_seqlens and counts as
    _chunk_pieces' device arithmetic, for batches, seq_q < seq_kv, seq_q > seq_kv and ragged chunks."""
    for B, sq, sk, chunk in ((1, 1000, 1000, 256), (3, 7, 20, 4), (2, 20, 7, 3), (2, 5, 5, 1), (1, 9, 30, 8)):
        first = (sk - sq) // chunk
        P = (sk - 1) // chunk - first + 1
        q0, qn, k0, kn = pt._chunk_pieces(torch.full((B,), sq), torch.full((B,), sk), chunk, P)
        cu_q = torch.cat([(torch.arange(B)[:, None] * sq + q0).flatten(), torch.tensor([B * sq])])
        cu_k = torch.cat([(torch.arange(B)[:, None] * sk + k0).flatten(), torch.tensor([B * sk])])
        want = [x.tolist() for x in (cu_q, cu_k, qn.flatten(), kn.flatten())]
        assert [x.tolist() for x in pt._dense_pieces(B, sq, sk, chunk, P, "cpu")] == want, (B, sq, sk, chunk)


def test_chunk_pieces_cover_each_query_once():
    """_chunk_pieces at many lengths: each query in exactly one piece, whose keys are its chunk's (within the
    sequence), whose last query sits on its last key (the bottom-right alignment the proof uses), and the bound
    _chunk_count holds."""
    for chunk in (1, 3, 8):
        for nq in range(0, 20):
            for nk in range(0, 20):
                P = pt._chunk_count(nq, chunk)
                q0, qn, k0, kn = (x[0].tolist() for x in pt._chunk_pieces(torch.tensor([nq]), torch.tensor([nk]),
                                                                          chunk, P))
                seen = [i for a, n in zip(q0, qn) for i in range(a, a + n)]
                assert seen == list(range(nq)), (chunk, nq, nk)
                for a, n, b, m in zip(q0, qn, k0, kn):
                    if n == 0:
                        continue
                    c = (a + nk - nq) // chunk  # the chunk of the piece's first query
                    assert all((i + nk - nq) // chunk == c for i in range(a, a + n))
                    assert (b, m) == (max(c * chunk, 0), max(0, min(c * chunk + chunk, nk) - max(c * chunk, 0)))
                    if m:
                        assert a + n - 1 + nk - nq == b + m - 1  # the last query on the last key


def _cu(lens):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)


@pytest.mark.parametrize("causal,window,used", [(True, (-1, -1), False), (False, (-1, -1), True),
                                                (True, (40, 0), True), (False, (10, 10), False)])
def test_varlen_chunks_follow_each_sequence(cpu, causal, window, used):
    """Packed sequences of their own lengths (and seqused's): each sequence chunked at its own lengths, sq < sk,
    sq > sk and one shorter than a chunk among them; rows past seqused_q not written (FA3's)."""
    lq, lk = [70, 1, 130, 40, 0], [200, 90, 130, 10, 33]
    uq, uk = ([60, 1, 130, 33, 0], [200, 50, 99, 10, 30]) if used else (lq, lk)
    q, k, v = _qkv(1, sum(lq), sum(lk), 4, 2, seed=3)
    q, k, v = q[0], k[0], v[0]
    cq, ck = _cu(lq), _cu(lk)
    u = {"seqused_q": torch.tensor(uq, dtype=torch.int32), "seqused_k": torch.tensor(uk, dtype=torch.int32)} \
        if used else {}
    out, lse = fai.flash_attn_varlen_func(q, k, v, cq, ck, max(lq), max(lk), causal=causal, window_size=window,
                                          attention_chunk=32, return_attn_probs=True, **u)
    for b in range(len(lq)):
        qs, ks = slice(int(cq[b]), int(cq[b]) + uq[b]), slice(int(ck[b]), int(ck[b]) + uk[b])
        want, wlse = dense_ref(q[None, qs], k[None, ks], v[None, ks], causal, 64 ** -0.5, window=window, chunk=32)
        _close(out[qs], want[0])
        _close(lse[:, qs], wlse[0])
        assert torch.isnan(out[int(cq[b]) + uq[b]:int(cq[b + 1])]).all()  # past seqused_q: not written
    call, = cpu.calls
    assert call["max_q"] == 32 and call["used_q"].shape[0] == 5 * pt._chunk_count(max(lq), 32)


@pytest.mark.parametrize("sq,varlen", [(1, False), (5, False), (40, False), (None, True)])
def test_kvcache_chunks_count_keys_from_the_leftpad(cpu, sq, varlen):
    """flash_attn_with_kvcache with attention_chunk: each sequence's keys are cache rows leftpad[b] ..
    cache_seqlens[b] + appended, picked by cache_batch_idx, chunked from the leftpad (FA3's test reference subtracts
    it); new keys appended in place first. The varlen kernel over the cache: no host sync, no split-KV."""
    B, S, H, Hkv, D, C = 3, 300, 4, 2, 64, 48
    q, kc, vc = _qkv(4, 1, S, H, Hkv, seed=9)
    lens, pad, idx = [250, 17, 120], [0, 5, 100], [3, 0, 1]
    ql = [sq] * B if not varlen else [30, 1, 70]
    q = _qkv(1, sum(ql), 1, H, Hkv, seed=10)[0][0]
    if not varlen:
        q = q.view(B, sq, H, D)
    kn, vn = (x[0, :2 * B].view(B, 2, Hkv, D) for x in _qkv(1, 1, 2 * B, H, Hkv, seed=11)[1:])
    it = lambda x: torch.tensor(x, dtype=torch.int32)  # noqa: E731
    kw = {"cu_seqlens_q": _cu(ql), "max_seqlen_q": max(ql)} if varlen else {}
    k0 = kc.clone()
    out, lse = fai.flash_attn_with_kvcache(q, kc, vc, k=kn, v=vn, cache_seqlens=it(lens), cache_batch_idx=it(idx),
                                           cache_leftpad=it(pad), causal=True, attention_chunk=C,
                                           return_softmax_lse=True, **kw)
    cq = _cu(ql)
    for b in range(B):
        c, n = idx[b], lens[b] + 2
        assert torch.equal(kc[c, lens[b]:n], kn[b]) and torch.equal(kc[c, :lens[b]], k0[c, :lens[b]])
        rows = q.view(-1, H, D)[int(cq[b]):int(cq[b + 1])]
        want, wlse = dense_ref(rows[None], kc[c:c + 1, pad[b]:n], vc[c:c + 1, pad[b]:n], True, D ** -0.5, chunk=C)
        got = out.view(-1, H, D)[int(cq[b]):int(cq[b + 1])]
        _close(got, want[0])
        _close(lse[:, int(cq[b]):int(cq[b + 1])] if varlen else lse[b], wlse[0])
    assert len(cpu.calls) == 1 and cpu.calls[0]["max_q"] <= C


@pytest.mark.parametrize("S,chunk,page", [(512, 128, 128), (4096, 1024, 256), (480, 96, 32), (500, 128, 0),
                                          (512, 100, 0)])
def test_kvcache_decode_step_with_a_chunk(cpu, monkeypatch, S, chunk, page):
    """A decode step (one query) with cache_seqlens on the device: the query sees its chunk, the cache rows from
    ⌊(len − 1) / C⌋·C to len − 1; lengths on a chunk's edge, past it, 1 and 0. Where a page size (a power of two
    from 16 to 256) divides the cache and the chunk, the contiguous cache runs as a paged one (split-KV over the
    chunk: ``_as_pages``), else the varlen kernel over the cache."""
    seen = []
    monkeypatch.setattr(pt, "_flash_attention_paged_cuda", lambda *a: seen.append(a) or paged_decode_model(*a))
    q, kc, vc = _qkv(5, 1, S, 8, 2, seed=12)
    lens = torch.tensor([S, chunk, chunk + 1, 1, 0], dtype=torch.int32)
    out = pt.flash_attention_kvcache(q, kc, vc, lens, causal=True, attention_chunk=chunk)
    for b, n in enumerate(lens.tolist()):
        s = max(n - 1, 0) // chunk * chunk
        _close(out[b:b + 1], dense_ref(q[b:b + 1], kc[b:b + 1, s:n], vc[b:b + 1, s:n], True, 64 ** -0.5)[0])
    assert (len(seen), len(cpu.calls)) == ((1, 0) if page else (0, 1))
    if page:  # pages of the cache, views; the shifted table of one chunk's pages
        assert seen[0][1].shape[1] == page and seen[0][1].data_ptr() == kc.data_ptr()
        assert seen[0][4].shape[1] == min(S, chunk) // page


def paged_decode_model(q, k_cache, v_cache, lens, table, causal, scale, softcap=0.0, sm_margin=0):
    """What the paged split-KV decode kernel computes (``_flash_attention_paged_cuda``'s arguments): sequence b's key
    j at page table[b, j // PAGE], row j % PAGE, its first min(lens[b], MAXP·PAGE) keys, bottom-right aligned."""
    page, out = k_cache.shape[1], []
    for b in range(q.shape[0]):
        n = max(0, min(int(lens[b]), table.shape[1] * page))
        j = torch.arange(n)
        rows = (table[b].long()[j // page], j % page)
        out.append(dense_ref(q[b:b + 1], k_cache[rows][None], v_cache[rows][None], causal, scale, softcap)[0])
    return torch.cat(out)


@pytest.mark.parametrize("page,maxp", [(16, 40), (64, 10), (128, 2)])
def test_paged_decode_step_runs_on_its_chunks_pages(monkeypatch, page, maxp):
    """A paged decode step with a chunk: the split-KV decode kernel on a page table shifted to the chunk's first page
    (page numbers gathered, no key copied) and the length from there; against FA3's rule on the dense sequence.
    Lengths on a chunk's edge, past it, inside the first chunk and 0 (zeros); a table of fewer pages than a chunk."""
    monkeypatch.setattr(pt, "_same", lambda name, xs: None)
    seen = []
    monkeypatch.setattr(pt, "_flash_attention_paged_cuda", lambda *a: seen.append(a) or paged_decode_model(*a))
    B, H, Hkv, D, C = 5, 4, 2, 64, 256
    g = torch.Generator().manual_seed(5)
    q = torch.randn(B, 1, H, D, generator=g, dtype=torch.float64).to(torch.bfloat16)
    pool = torch.randn(4 * B * maxp, page, Hkv, D, generator=g, dtype=torch.float64).to(torch.bfloat16)
    vpool = torch.randn(pool.shape, generator=g, dtype=torch.float64).to(torch.bfloat16)
    table = torch.randperm(pool.shape[0], generator=g)[:B * maxp].view(B, maxp).int()
    cap = maxp * page
    lens = torch.tensor([cap, 256, 257, 3, 0], dtype=torch.int32).clamp(max=cap)
    out = fai.flash_attn_with_kvcache(q, pool, vpool, cache_seqlens=lens, page_table=table, causal=True,
                                      attention_chunk=C)
    assert seen[0][4].shape[1] == min(maxp, C // page)  # the pieces are chosen for one chunk, not the cache
    for b in range(B):
        n = int(lens[b])
        j = torch.arange(n)
        rows = (table[b].long()[j // page], j % page)
        want = dense_ref(q[b:b + 1], pool[rows][None], vpool[rows][None], True, D ** -0.5, chunk=C)[0]
        _close(out[b:b + 1], want)


@pytest.mark.parametrize("sq,page,why", [(2, 16, "2 query positions"), (1, 64, "64-key pages")])
def test_a_paged_chunk_that_cannot_run_is_refused_with_the_reason(monkeypatch, sq, page, why):
    monkeypatch.setattr(pt, "_same", lambda name, xs: None)
    q, k = torch.zeros(1, sq, 2, 64, dtype=torch.float16), torch.zeros(4, page, 2, 64, dtype=torch.float16)
    with pytest.raises(NotImplementedError, match=rf"page_table with attention_chunk=96.*{why}"):
        fai.flash_attn_with_kvcache(q, k, k, cache_seqlens=torch.ones(1, dtype=torch.int32),
                                    page_table=torch.zeros(1, 4, dtype=torch.int32), attention_chunk=96)


@pytest.mark.parametrize("bad", [-1, 2.5, True, "64"])
def test_a_bad_chunk_names_the_value(bad):
    t = torch.zeros(1, 4, 2, 64)
    with pytest.raises(ShapeError, match=rf"attention_chunk={bad!r}"):
        pt.flash_attention(t, t, t, attention_chunk=bad)


# ---------------------------------------------------------------------------------------------- sm_margin


def _launch(cap):
    from codegen.runtime import Launch
    ln = Launch(None, None, None, (1, 1, 1), (384, 1, 1), 0, (), 0, "k", {})
    ln.sms, ln.cap = 132, cap
    ln.regrid(1000)
    return ln


def test_a_margin_caps_a_persistent_grid_and_not_a_tiled_one():
    ln = _launch((132, 1))
    assert ln.grid[0] == 132
    ln.leave_free(32)
    assert ln.grid[0] == 100 and ln.margin == 32
    ln.regrid(50)  # a re-targeted launch (a decode family's) keeps the margin
    assert ln.grid[0] == 50
    ln.regrid(400)
    assert ln.grid[0] == 100
    ln.leave_free(0)
    assert ln.grid[0] == 132
    ln.leave_free(131)  # never below one SM
    assert ln.grid[0] == 1
    pair = _launch((132, 2))
    pair.leave_free(131)  # never below one cluster
    assert pair.grid[0] == 2
    tiled = _launch(None)  # one CTA per tile: the grid is the tiles', margin or not
    tiled.leave_free(100)
    assert tiled.grid[0] == 1000


@pytest.mark.parametrize("bad", [132, 500, -1, 1.5, True])
def test_a_margin_the_device_cannot_leave_names_the_value(bad):
    from codegen.runtime import usable_sms
    with pytest.raises(ShapeError, match=rf"sm_margin={bad!r}"):
        usable_sms(132, bad)
    with pytest.raises(ShapeError, match=rf"sm_margin={bad!r}"):
        _launch((132, 1)).leave_free(bad)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "4"])
def test_the_front_door_checks_the_margin(bad):
    t = torch.zeros(1, 4, 2, 64)
    for f in (lambda: pt.flash_attention(t, t, t, sm_margin=bad),
              lambda: fai.flash_attn_func(t, t, t, sm_margin=bad),
              lambda: pt.flash_attention_kvcache(t, t, t, 4, sm_margin=bad)):
        with pytest.raises(ShapeError, match=rf"sm_margin={bad!r}"):
            f()


def test_a_margin_is_part_of_every_kept_launchs_key():
    """The launches kept for calls with a margin are never those of calls without (and the reverse)."""
    q, k, v = _qkv(1, 4, 4, 2, 2)
    lens = torch.ones(1, dtype=torch.int32)
    for key in (pt._move_key, pt._grow_key):
        assert key(q, k, v, True, None, 0.0, 8) != key(q, k, v, True, None, 0.0, 0) == key(q, k, v, True, None)
    assert pt._kvcache_key(q, k, v, lens, True, None, 0.0, 8) != pt._kvcache_key(q, k, v, lens, True, None)
    assert pt._fast_key(q, k, v, True, None, margin=8) != pt._fast_key(q, k, v, True, None)


def test_the_margin_reaches_the_kernels(cpu):
    """A margin given to the FA3 interface reaches the launch (varlen pieces; the dense kernels on a chunk)."""
    q, k, v = _qkv(1, 300, 300, 2, 2)
    fai.flash_attn_func(q, k, v, causal=True, attention_chunk=64, sm_margin=16)
    fai.flash_attn_func(q[:, :1], k, v, causal=True, attention_chunk=64, sm_margin=8)
    assert cpu.calls[0]["margin"] == 16 and cpu.dense[0]["margin"] == 8


fake_gpu = test_torch_cpu.fake_gpu  # the fixture (tests/conftest.py puts every test folder on the path)


@pytest.fixture(name="pt")
def _pt():
    """ptsolve.torch without a GPU (the conftest's ``pt`` needs one): for ``fake_gpu``."""
    return pt


@pytest.fixture
def capped_gpu(fake_gpu, monkeypatch):
    """tests/serve/test_torch_cpu.py's fake GPU (the launch path runs, kernels do not) whose modules lay out a
    persistent kernel's grid as runtime.Loaded.prepare does: at most one CTA per SM (132), whole clusters."""
    _FakeModule = test_torch_cpu._FakeModule

    from codegen import runtime
    from ptsolve import serve

    class Capped(_FakeModule):
        def prepare(self, values, maps, grid, out=""):
            ln = super().prepare(values, maps, grid, out)
            ln.sms, ln.cap = self.sms, (self.sms, self.ks.cluster) if self.ks.persistent_tiles else None
            ln.regrid(grid)
            return ln
    monkeypatch.setattr(serve.ClassKernel, "module", lambda self: Capped(self.ks, fake_gpu))
    monkeypatch.setattr(runtime.MapSlot, "encode", lambda self, spec, ptr: None)  # a decode family's maps
    monkeypatch.setattr(pt, "_GROW", {})
    return fake_gpu


def test_a_margin_gets_its_own_launch_and_leaves_the_others(pt, capped_gpu):
    """Through ptsolve.torch's launch path (fake GPU): a call with sm_margin prepares its own launch, whose persistent
    grid fills the SMs left; the call without one keeps its launch (not re-prepared, the same grid), and the margin's
    launch is kept too. Split-KV decode with a margin: its own family, the margin recorded on the launch."""
    from ptsolve import serve
    log = capped_gpu
    q, k = torch.randn(4, 2048, 8, 64, dtype=torch.float16), torch.randn(4, 2048, 4, 64, dtype=torch.float16)
    persistent = bool(serve.kernel(pt._attn_class(q, k, True)).ks.persistent_tiles)
    grids = []
    for margin in (0, 100, 0, 100):
        pt.flash_attention(q, k, k, causal=True, sm_margin=margin)
        grids.append(log["launches"][-1][0])
    assert log["prepared"] == 2 and grids[0] == grids[2] and grids[1] == grids[3]
    if persistent:  # 4 · 8 heads · 2048 / BM tiles > 132: the whole device, then 32 SMs
        assert grids[0] == 132 and grids[1] == 32
    else:
        assert grids[0] == grids[1]
    qd, kd = torch.randn(1, 1, 32, 128, dtype=torch.float16), torch.randn(1, 8192, 8, 128, dtype=torch.float16)
    pt.flash_attention(qd, kd, kd)
    before = log["prepared"]
    pt.flash_attention(qd, kd, kd, sm_margin=120)
    assert log["prepared"] == before + 1
    fam = pt._GROW[pt._grow_key(qd, kd, kd, False, None, 0.0, 120)]
    assert fam.sms == 12 and fam.ln.margin == 120
    assert pt._GROW[pt._grow_key(qd, kd, kd, False, None)].sms == 132
