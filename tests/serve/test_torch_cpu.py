"""ptsolve.torch without a GPU (skipped where torch is not installed): the ops' schemas and fake implementations
(meta tensors: output shapes and dtypes), and the front door's errors for what the kernels cannot take; on the fake
GPU (the launch path, kernels not run), the launches it prepares, and ptsolve.ssd's."""
from __future__ import annotations

import sys

import pytest

from ptsolve.errors import DeviceError, ShapeError

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def pt():
    import ptsolve.torch as pt
    return pt


def _meta(*shape, dtype=None):
    return torch.empty(*shape, device="meta", dtype=dtype or torch.float16)


def test_fake_shapes(pt):
    q, k = _meta(2, 100, 8, 128), _meta(2, 37, 2, 128)
    o = torch.ops.ptsolve.flash_attention(q, k, k, True, 0.1)
    assert o.shape == q.shape and o.dtype == q.dtype and o.is_contiguous()
    lens = torch.empty(2, device="meta", dtype=torch.int32)
    for o in (torch.ops.ptsolve.flash_attention(q, k, k, True, 0.1, 30.0),  # a softcap decode step's ops
              torch.ops.ptsolve.flash_attention_kvcache(q, k, k, lens, True, 0.1, 30.0),
              torch.ops.ptsolve.flash_attention_paged(q, k, k, lens, lens.view(2, 1), True, 0.1, 30.0)):
        assert o.shape == q.shape and o.dtype == q.dtype
    cu = torch.empty(3, device="meta", dtype=torch.int32)
    o = torch.ops.ptsolve.flash_attention_varlen(_meta(50, 4, 64), _meta(70, 1, 64), _meta(70, 1, 64), cu, cu, 30,
                                                 40, False, 0.125)
    assert o.shape == (50, 4, 64)
    o = torch.ops.ptsolve.gemm(_meta(33, 64, dtype=torch.bfloat16), _meta(72, 64, dtype=torch.bfloat16))
    assert o.shape == (33, 72) and o.dtype == torch.bfloat16


def test_front_door_errors(pt):
    with pytest.raises(DeviceError, match="CUDA"):
        pt.flash_attention(*(torch.zeros(1, 4, 2, 64, dtype=torch.float16) for _ in range(3)))
    with pytest.raises(DeviceError, match="CUDA"):
        pt.gemm(torch.zeros(4, 8, dtype=torch.float16), torch.zeros(8, 8, dtype=torch.float16))
    with pytest.raises(ShapeError, match="dtypes differ"):
        pt.gemm(torch.zeros(4, 8, dtype=torch.float16), torch.zeros(8, 8, dtype=torch.bfloat16))


def test_hf_attention_refuses_dropout(pt):
    q = torch.zeros(1, 2, 4, 64, dtype=torch.float16)
    with pytest.raises(ShapeError, match="dropout"):
        pt.hf_attention(None, q, q, q, None, dropout=0.1)


def test_hf_attention_masks_are_causal_prefixes(pt):
    """transformers' mask must be what the kernels apply: bottom-right causal on each sequence's first n_b keys (all of
    them: a dynamic cache; the filled slots of a static cache: n_b < Skv). A padded batch's is a ShapeError, not a
    silently unmasked result."""
    sq, skv = 3, 7
    i, j = torch.arange(sq)[:, None], torch.arange(skv)[None, :]
    causal = (j <= i + skv - sq).expand(2, 1, sq, skv)
    assert pt._mask_lengths(causal, True, sq, skv, 2)[1] == [7, 7]
    assert pt._mask_lengths(torch.where(causal, 0.0, float("-inf")), True, sq, skv, 2)[1] == [7, 7]  # additive
    assert pt._mask_lengths(causal, False, sq, skv, 2) is None
    assert pt._mask_lengths(torch.ones(1, 1, sq, skv, dtype=torch.bool), False, sq, skv, 3)[1] == [7, 7, 7]
    assert pt._mask_lengths(causal[..., :-1], True, sq, skv - 1, 2) is None  # top-left, not bottom-right
    padded = causal.clone()
    padded[1, :, :, :2] = False  # the second sequence is left-padded by two
    assert pt._mask_lengths(padded, True, sq, skv, 2) is None
    static = torch.stack([j <= i + 3, j <= i + 1])[:, None]  # a static cache filled to 6 and 4 of 7 slots
    lens, n = pt._mask_lengths(static, True, sq, skv, 2)
    assert n == [6, 4] and lens.tolist() == [6, 4] and lens.dtype == torch.int32
    assert pt._mask_lengths(static[:, :, :, :6], True, sq, 6, 2)[1] == [6, 4]  # another mask: the buffer refilled
    again = pt._mask_lengths(static, True, sq, skv, 2)
    assert again[0] is lens and lens.tolist() == [6, 4]  # one buffer per (device, batch), holding this mask's
    m = causal.clone()
    assert pt._mask_lengths(m, True, sq, skv, 2) is not None
    m.data[1, :, :, :2] = False  # the storage edited behind m's version counter
    assert pt._mask_lengths(m, True, sq, skv, 2) is not None  # the same object keeps its verdict (never edited)
    assert pt._mask_lengths(m.view(m.shape), True, sq, skv, 2) is None  # another object at that address: anew
    q, k = torch.zeros(2, 4, sq, 64, dtype=torch.float16), torch.zeros(2, 4, skv, 64, dtype=torch.float16)
    with pytest.raises(ShapeError, match="flash_attention_varlen"):
        pt.hf_attention(None, q, k, k, padded)


def test_hf_attention_runs_a_static_cache(pt, monkeypatch):
    """With transformers' own SDPA mask of a static cache: a decode step runs ``flash_attention_kvcache`` on the whole
    cache with the filled lengths, a prefill the dense kernel on the filled part, a dynamic cache's step the dense one
    on everything; without a mask, what SDPA's is_causal means (top-left: the static cache's prefill, which
    transformers sends maskless)."""
    masking = pytest.importorskip("transformers.masking_utils")
    calls = []
    monkeypatch.setattr(pt, "flash_attention", lambda q, k, v, **kw: calls.append(("dense", k.shape[1], kw)) or q)
    monkeypatch.setattr(pt, "flash_attention_kvcache",
                        lambda q, k, v, lens, **kw: calls.append(("kvcache", k.shape[1], lens.tolist(), kw)) or q)
    B, H, D, cap = 2, 4, 64, 16
    k = torch.zeros(B, 2, cap, D, dtype=torch.float16)
    for sq, offset in ((1, 9), (4, 9), (20, 0)):
        mask = masking.sdpa_mask(batch_size=B, q_length=sq, kv_length=cap if sq < 20 else 32, q_offset=offset,
                                 allow_is_causal_skip=False)
        kv = k if sq < 20 else torch.zeros(B, 2, 32, D, dtype=torch.float16)
        pt.hf_attention(None, torch.zeros(B, H, sq, D, dtype=torch.float16), kv, kv, mask, scaling=0.1)
    assert calls[0] == ("kvcache", cap, [10, 10], {"causal": True, "softmax_scale": 0.1})  # position 9: 10 keys
    assert calls[1] == ("kvcache", cap, [13, 13], {"causal": True, "softmax_scale": 0.1})  # positions 9..12
    assert calls[2] == ("dense", 20, {"causal": True, "softmax_scale": 0.1})  # a 20-token prefill: the filled part
    mask = masking.sdpa_mask(batch_size=B, q_length=1, kv_length=cap, q_offset=cap - 1, allow_is_causal_skip=False)
    pt.hf_attention(None, torch.zeros(B, H, 1, D, dtype=torch.float16), k, k, mask)
    assert calls[3][:2] == ("dense", cap)  # every key: the dynamic cache's call
    # no mask: transformers' SDPA convention (is_causal, top-left) for several queries, every key for one
    for sq, skv in ((20, 32), (1, 32), (32, 32)):
        kv = torch.zeros(B, 2, skv, D, dtype=torch.float16)
        pt.hf_attention(None, torch.zeros(B, H, sq, D, dtype=torch.float16), kv, kv, None)
    assert [c[1] for c in calls[4:]] == [20, 32, 32]  # a static cache's prefill: its first 20 slots
    kv = torch.zeros(B, 2, 8, D, dtype=torch.float16)
    with pytest.raises(ShapeError, match="top-left"):
        pt.hf_attention(None, torch.zeros(B, H, 20, D, dtype=torch.float16), kv, kv, None)


class _FakeModule:
    """A class kernel's loaded module without a GPU: ``prepare`` counts the launches it prepares and returns a real
    ``runtime.Launch`` (its parameter array laid out as the runtime lays it out: a tensor map argument's entry is
    the fake map's address, which stands for the address it describes) whose driver call records the grid and the
    output address it finds through the parameters."""

    sms = 132

    def __init__(self, ks, log):
        self.ks, self.log = ks, log

    def prepare(self, values, maps, grid, out=""):
        import ctypes

        from codegen import runtime
        self.log["prepared"] += 1
        self.log.setdefault("prepares", []).append((self.ks, values))
        self.log.setdefault("prepares_maps", []).append({m.tensor: m for m in maps})
        args = [a.split(":") for a in self.ks.args]
        buf = ctypes.create_string_buffer(8 * len(args))
        spec = {m.tensor: m for m in maps}
        addrs, slots = [], {}
        for i, (kind, name) in enumerate(args):
            if kind == "tmap":
                addrs.append(int(values[name]) if name != out else 0)
            else:
                slots[name] = (8 * i, runtime._SCALAR[kind])
                addrs.append(ctypes.addressof(buf) + 8 * i)
        arr = self.log["maps"] = (ctypes.c_void_p * len(addrs))(*addrs)
        ptrs = {n: ctypes.c_uint64.from_buffer(buf, slots[n][0]) for k, n in args if k == "ptr"}
        pos = {n: i for i, (_, n) in enumerate(args)}
        by_map = out not in ptrs  # a TMA-store GEMM's C: the output's address is its tensor map's
        log = self.log

        def launch(func, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
            got = (ctypes.c_void_p * len(args)).from_address(params)
            at = got[pos[out]]
            log["launches"].append((gx, at if by_map else ctypes.c_uint64.from_address(at).value))
            return (0,)
        tmaps = {n: (i, spec[n]) for i, (k, n) in enumerate(args) if k == "tmap"}
        ln = runtime.Launch(launch, 0, 0, (grid, 1, 1), self.ks.block, self.ks.smem_bytes, (buf, arr),
                            ctypes.addressof(arr), self.ks.name, ptrs, ptrs.get(out), (arr, tmaps),
                            out if by_map else "")
        ln.buf, ln.slots = buf, slots
        ln.set({n: values[n] for n in slots})
        return ln


@pytest.fixture()
def fake_gpu(pt, monkeypatch):
    """ptsolve.torch's eager path on CPU tensors: the device checks pass, the stream is 0, kernels do not run."""
    from codegen import runtime
    from ptsolve import serve
    log = {"prepared": 0, "launches": []}
    monkeypatch.setenv("PTSOLVE_EXACT", "off")  # the class kernels' launches (an exact answer's would be Provisional)
    monkeypatch.setattr(serve.ClassKernel, "module", lambda self: _FakeModule(self.ks, log))
    monkeypatch.setattr(runtime, "_cu_stream", lambda h: h)
    monkeypatch.setattr(serve.prepared, "current_stream", lambda dev: 0)
    monkeypatch.setattr(pt, "_raw_stream", lambda dev: 0)
    monkeypatch.setattr(pt, "_same", lambda name, xs: None)
    monkeypatch.setattr(pt, "_FAST", {})
    monkeypatch.setattr(pt, "_CHECKED", set())  # signatures passed with the device check off: not for other tests
    monkeypatch.setattr(pt, "_MOVE", {})
    monkeypatch.setattr(pt, "_SEEN", set())
    monkeypatch.setattr(serve.prepared, "LAUNCHES", {})
    monkeypatch.setattr(serve.prepared, "scratch", lambda device, kernel, name, nbytes: 1 << 20)  # driver memory

    class _Map:  # a tensor map: its address in the parameters stands for the address it describes
        def __init__(self, spec, ptr):
            self.ptr = ptr

        def getPtr(self):
            return self.ptr
    monkeypatch.setattr(runtime, "tensor_map", _Map)
    return log


def test_warm_path_keeps_one_launch_per_pointers_shapes_strides(pt, fake_gpu):
    """A repeated call launches the kept launch into a new output; a view at the same address with another shape or
    strides, another scale or causal flag is prepared anew; inputs the kernel cannot take as they are (a copy) are
    never kept."""
    log = fake_gpu
    q, k = torch.randn(2, 64, 4, 64, dtype=torch.float16), torch.randn(2, 80, 2, 64, dtype=torch.float16)
    outs = [pt.flash_attention(q, k, k, causal=True) for _ in range(3)]
    assert log["prepared"] == 1 and len(log["launches"]) == 3
    assert [a for _, a in log["launches"]] == [o.data_ptr() for o in outs]
    assert all(o.is_contiguous() and o.shape == q.shape for o in outs)
    pt.flash_attention(q[:1], k[:1], k[:1], causal=True)  # same addresses, batch 1: another grid
    pt.flash_attention(q, k, k, causal=True, softmax_scale=0.5)
    pt.flash_attention(q, k, k, causal=False)
    assert log["prepared"] == 4 and log["launches"][3][0] * 2 == log["launches"][0][0]
    for _ in range(2):  # the dispatcher's CUDA implementation (no CPU one to dispatch to here) keeps its own entry
        pt._flash_attention_cuda(q, k, k, True, 0.125)
    assert log["prepared"] == 4  # ... of the launch generic kept for these inputs and scale
    qt = torch.randn(2, 4, 64, 64, dtype=torch.float16).transpose(1, 2)  # strided: TMA takes it as it is
    for _ in range(2):
        assert pt.flash_attention(qt, k, k).is_contiguous()
    assert log["prepared"] == 5
    a, w = torch.randn(3, 5, 64, dtype=torch.float16), torch.randn(72, 64, dtype=torch.float16)
    y = [pt.gemm(a, w) for _ in range(2)]
    assert y[1].shape == (3, 5, 72) and y[1].is_contiguous() and log["prepared"] == 6
    # each call's output reaches the kernel (through C's tensor map where the class's kernel stores by TMA)
    assert [addr for _, addr in log["launches"][-2:]] == [t.data_ptr() for t in y]
    ap = torch.randn(64, 3, 5, dtype=torch.float16).permute(1, 2, 0)  # reshape copies it: never kept
    kept = len(pt._FAST)
    for _ in range(2):
        assert pt.gemm(ap, w).shape == (3, 5, 72)
    assert len(pt._FAST) == kept and len(log["launches"]) == 14


def test_attention_checks_a_signature_once(pt, monkeypatch):
    """A model's prefill calls with new tensors of one signature every layer: the checks run once per signature
    (dtypes, devices, shapes, causal), a failing one every time (an error is never remembered)."""
    from ptsolve.errors import ShapeError
    calls = []
    real = pt._check_signature
    monkeypatch.setattr(pt, "_CHECKED", set())
    monkeypatch.setattr(pt, "_same", lambda name, xs: None)
    monkeypatch.setattr(pt, "_check_signature", lambda *a: calls.append(a[3:]) or real(*a))
    q, k = torch.randn(1, 8, 4, 64, dtype=torch.float16), torch.randn(1, 8, 2, 64, dtype=torch.float16)
    assert [pt._check_attention(q, k, k, 4, True, s) for s in (None, 0.5, None)] == [0.125, 0.5, 0.125]
    assert len(calls) == 1
    pt._check_attention(q, k, k, 4, False, None)
    pt._check_attention(q[:, :4], k, k, 4, True, None)
    assert calls == [(4, True), (4, False), (4, True)]
    bad = torch.randn(1, 8, 4, 40, dtype=torch.float16)
    for _ in range(2):
        with pytest.raises(ShapeError, match="head_dim"):
            pt._check_attention(bad, bad, bad, 4, True, None)
    with pytest.raises(ShapeError, match="softmax_scale"):
        pt._check_attention(q, k, k, 4, True, -1.0)
    assert len(calls) == 5


def test_new_tensors_of_one_layout_re_point_a_family(pt, fake_gpu, monkeypatch):
    """A model's prefill makes new q / k / v every layer: the first call of a layout prepares (and keeps its launch by
    address), the second at new addresses prepares again and makes the layout a family (``AttentionFamily``: a
    private launch), and every later call at new addresses re-points the family's q, k and v maps in place and
    launches it, preparing nothing; the first tensors keep their own launch; another layout prepares."""
    from codegen import runtime
    log, enc = fake_gpu, []
    monkeypatch.setattr(runtime.MapSlot, "encode", lambda self, spec, ptr: enc.append((spec.tensor, ptr)))
    mk = [(torch.randn(1, 96, 8, 64, dtype=torch.float16), torch.randn(1, 96, 2, 64, dtype=torch.float16))
          for _ in range(5)]
    outs = [pt.flash_attention(q, k, k, causal=True) for q, k in mk]
    assert log["prepared"] == 3 and len(pt._MOVE) == 1  # two calls' launches and the family's
    assert [a for _, a in log["launches"]] == [o.data_ptr() for o in outs]
    assert enc == [(n, x.data_ptr()) for q, k in mk[2:] for n, x in (("q", q), ("k", k), ("v", k))]
    o = pt.flash_attention(mk[0][0], mk[0][1], mk[0][1], causal=True)  # the first tensors: their own kept launch
    assert log["prepared"] == 3 and log["launches"][-1][1] == o.data_ptr() and len(enc) == 9
    for other in ({"causal": False}, {"causal": True, "softmax_scale": 0.5}):  # another layout prepares
        pt.flash_attention(mk[4][0], mk[4][1], mk[4][1], **other)
    pt.flash_attention(mk[4][0][:, :64], mk[4][1], mk[4][1], causal=True)
    assert log["prepared"] == 6 and len(enc) == 9
    mis = torch.randn(1, 96 * 8 * 64 + 4, dtype=torch.float16)[:, 4:].view(1, 96, 8, 64)  # the layout, 8 bytes off
    pt.flash_attention(mis, mk[4][1], mk[4][1], causal=True)  # the family refuses it: prepared as it is
    assert log["prepared"] == 7


def test_one_query_with_a_window_runs_dense_over_its_keys(pt, fake_gpu, monkeypatch):
    """A decode step with a sliding window (Mistral, Gemma's local layers) sees only the last left + 1 keys: it runs
    the dense decode kernel (split-KV) on that view of the cache, with no mask, and with a softcap too (Gemma-2's
    local layers: the decode kernel's softcap variant on the view); more queries run the window class's kernel."""
    from codegen import runtime
    log = fake_gpu
    monkeypatch.setattr(runtime.MapSlot, "encode", lambda self, spec, ptr: None)
    q, k = torch.randn(1, 2, 8, 64, dtype=torch.float16), torch.randn(1, 40, 2, 64, dtype=torch.float16)
    pt.flash_attention(q[:, :1], k, k, causal=True, window_size=(7, 0))
    ks, vals = log["prepares"][-1]
    assert "decode" in ks.name and vals["k"] == k[:, 32:].data_ptr() and vals["SKV"] == 8
    pt.flash_attention(q[:, :1], k, k, causal=False, window_size=(100, 3))  # covers every key: all 40
    fam = next(iter(pt._GROW.values()))  # the decode family of the first call, re-targeted
    assert fam.skv == 40 and fam.ln._at["k"][0] == k.data_ptr() and len(log["prepares"]) == 1
    pt.flash_attention(q[:, :1], k, k, causal=True, softcap=30.0, window_size=(7, 0))
    ks, vals = log["prepares"][-1]
    assert "decode" in ks.name and "fast_tanh" in ks.source and vals["k"] == k[:, 32:].data_ptr()
    assert vals["SKV"] == 8 and vals["softcap_pre"] == pytest.approx(64 ** -0.5 / 30)
    for kw in ({"window_size": (7, 0)}, {"softcap": 30.0, "window_size": (7, 0)}):
        pt.flash_attention(q[:, :2], k, k, causal=True, **kw)
        assert "decode" not in log["prepares"][-1][0].name and log["prepares"][-1][1]["wl"] == 7


@pytest.mark.parametrize("page", [16, 64, 256])
def test_a_paged_cache_runs_the_decode_kernel_on_its_pages(pt, fake_gpu, page):
    """vLLM's paged cache through ``flash_attention_kvcache(page_table=...)``: the split-KV decode kernel with the
    table's address, its page size and pages per sequence, k / v mapped as [pages, PAGE, Hkv, D] in boxes of
    min(PAGE, BN) keys, the pieces chosen for the table's capacity; a repeated step keeps the launch; what a paged
    cache does not run is refused by name, and a page size the kernel's blocks do not tile is a ShapeError."""
    from ptsolve.errors import ShapeError
    log = fake_gpu
    B, H, Hkv, D, pages, maxp = 3, 8, 2, 128, 40, 5
    kc = torch.randn(pages, page, Hkv, D, dtype=torch.float16)
    table = torch.randperm(pages)[:B * maxp].view(B, maxp).int()
    lens = torch.tensor([3, page * maxp, page + 1], dtype=torch.int32)
    q = torch.randn(B, 1, H, D, dtype=torch.float16)
    for _ in range(2):
        pt.flash_attention_kvcache(q, kc, kc, lens, causal=True, page_table=table)
    ks, vals = log["prepares"][-1]
    assert log["prepared"] == 1 and "decode" in ks.name and len(log["launches"]) == 2
    assert vals["page_table"] == table.data_ptr() and vals["PAGE"] == page and vals["MAXP"] == maxp
    assert vals["SKV"] == page * maxp and vals["seqlens"] == lens.data_ptr()
    km = log["prepares_maps"][-1]["k"]
    assert km.dims == (D, Hkv, page, pages) and km.box[2] == min(page, 64)
    with pytest.raises(NotImplementedError, match="page_table with k, v, window_size"):
        pt.flash_attention_kvcache(q, kc, kc, lens, page_table=table, window_size=(5, 0), k=q, v=q)
    with pytest.raises(ShapeError, match="24-key pages"):
        k24 = torch.randn(pages, 24, Hkv, D, dtype=torch.float16)
        pt.flash_attention_kvcache(q, k24, k24, lens, page_table=table)
    with pytest.raises(ShapeError, match=r"page_table must be torch.int32 \[3, max_pages\]"):
        pt.flash_attention_kvcache(q, kc, kc, lens, page_table=table.long())


def test_kvcache_keeps_one_launch_and_repoints_q(pt, fake_gpu):
    """``flash_attention_kvcache`` in a decode loop: a new q every step (as a model makes), the cache, the lengths and
    the shapes the same: one launch prepared, its q map re-pointed to each step's q; another lengths tensor or cache
    is a new launch."""
    log = fake_gpu
    kc = torch.randn(2, 300, 2, 64, dtype=torch.float16)
    lens = torch.tensor([100, 7], dtype=torch.int32)
    qs = [torch.randn(2, 1, 8, 64, dtype=torch.float16) for _ in range(3)]
    for q in qs:
        pt.flash_attention_kvcache(q, kc, kc, lens)
        assert log["maps"][0] == q.data_ptr()  # q's map is the first argument: now this step's q
    assert log["prepared"] == 1 and len(log["launches"]) == 3
    pt.flash_attention_kvcache(qs[0], kc, kc, lens.clone())
    pt.flash_attention_kvcache(qs[0], kc.clone(), kc, lens)
    assert log["prepared"] == 3 and log["maps"][0] == qs[0].data_ptr()


def test_decode_family_follows_a_growing_cache(pt, fake_gpu, monkeypatch):
    """transformers' dynamic cache: each step's K/V are new tensors one key longer. One launch per bucket of key
    counts is prepared (a ``DecodeFamily``), and every step re-targets it: the key count (SKV) and the grid of that
    count's sizes, k's and v's maps encoded for the step's tensors (their count and strides), q re-pointed; the
    output each step's own."""
    import struct

    from codegen import runtime
    from codegen.cuda import decode as cd
    from ptsolve import serve
    log, enc = fake_gpu, []
    monkeypatch.setattr(runtime.MapSlot, "encode", lambda self, spec, ptr: enc.append((spec, ptr)))
    monkeypatch.setattr(pt, "_GROW", {})
    B, H, Hkv, D = 2, 16, 4, 128
    k = torch.randn(B, Hkv, 1000, D, dtype=torch.float16)
    steps = []
    for n in range(1001, 1300, 3):
        k = torch.cat([k, torch.randn(B, Hkv, 3 if n > 1001 else 1, D, dtype=torch.float16)], dim=2)
        q = torch.randn(B, H, 1, D, dtype=torch.float16).transpose(1, 2)
        kt, vt = k.transpose(1, 2), k.transpose(1, 2)
        out = pt.flash_attention(q, kt, vt, causal=True)
        fam = next(iter(pt._GROW.values()))
        p = {"batch": B, "heads": H, "kv_heads": Hkv, "seq_q": 1, "seq_kv": k.shape[2], "head_dim": D,
             "causal": True, "dtype": "fp16"}
        off, fmt = fam.ln.slots["SKV"]
        assert struct.unpack_from(fmt, fam.ln.buf, off)[0] == k.shape[2]
        assert fam.ln.grid[0] == cd.grid(cd.sizes(p, fam.t, 132)) == log["launches"][-1][0]
        assert log["launches"][-1][1] == out.data_ptr()
        if len(steps) and log["prepared"] == steps[-1]:  # re-targeted: both maps encoded for this step's tensors
            spec = cd.kv_map(p, fam.t, "k", kt.stride()[:3])
            assert enc[-2:] == [(spec, kt.data_ptr()), (cd.kv_map(p, fam.t, "v", kt.stride()[:3]), vt.data_ptr())]
        steps.append(log["prepared"])
    c = pt._decode_class(q, kt, True)
    buckets = {serve.decode_bucketed(c, dict(p, seq_kv=n))["seq_kv"] for n in range(1001, 1300, 3)}
    assert log["prepared"] == len(buckets) >= 2 and len(log["launches"]) == len(steps)


def test_compiled_hf_attention_reads_lengths_on_the_device(pt, monkeypatch):
    """``hf_attention`` inside a compiled graph (``_hf_compiled``): a static cache's mask gives each sequence's length
    without a host synchronisation and the step runs ``flash_attention_kvcache`` on them; a mask that is not the
    causal mask on each sequence's first keys (left padding) turns the output into NaN, not a wrong answer; a prefill
    longer than the decode kernel takes is a ShapeError naming the fix."""
    from ptsolve.errors import ShapeError
    got, caps = [], []
    monkeypatch.setattr(pt, "flash_attention_kvcache", lambda q, k, v, lens, causal, softmax_scale, softcap:
                        got.append(lens.tolist()) or caps.append(softcap) or torch.ones_like(q))
    B, H, Hkv, D, sq, cap = 2, 8, 2, 64, 2, 40
    q, kv = torch.zeros(B, sq, H, D), torch.zeros(B, cap, Hkv, D)
    lens = torch.tensor([17, 30])
    i, j = torch.arange(sq)[:, None], torch.arange(cap)[None, :]
    mask = (j[None] <= (i[None] + lens[:, None, None] - sq))[:, None]  # bool, True attends: [B, 1, Sq, cap]
    out = pt._hf_compiled(q, kv, kv, mask, True, None)
    assert got == [[17, 30]] and not out.isnan().any()
    additive = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    assert not pt._hf_compiled(q, kv, kv, additive, True, None).isnan().any() and got[-1] == [17, 30]
    padded = mask.clone()
    padded[1, :, :, :3] = False  # the second sequence left-padded by 3
    assert pt._hf_compiled(q, kv, kv, padded, True, None).isnan().all()
    pt._hf_compiled(q, kv, kv, mask, True, None, 30.0)  # a softcap model's (Gemma-2's global layers): passed on
    assert caps == [0.0, 0.0, 0.0, 30.0] and got[-1] == [17, 30]
    with pytest.raises(ShapeError, match="prefill eagerly"):
        pt._hf_compiled(torch.zeros(B, 17, H, D), kv, kv, torch.ones(B, 1, 17, cap, dtype=torch.bool), True, None)


def test_mamba_warm_path_and_conversions(pt, fake_gpu):
    """Mamba2's chunk ops: a repeated call reuses the launch; float32 states (mamba_ssm's) are converted per call
    and not kept; a new batch or seq at the same addresses is a new launch of the same class kernel."""
    from ptsolve import serve
    log = fake_gpu
    b, L, h, g, n, q, nc = 2, 300, 4, 2, 128, 256, 2
    x, C = torch.randn(b, L, h, 64, dtype=torch.float16), torch.randn(b, L, g, n, dtype=torch.float16)
    dt, dA = torch.rand(b, h, nc, q), torch.rand(b, h, nc, q)
    cb, states = torch.randn(b, nc, g, q, q, dtype=torch.float16), torch.randn(b, nc, h, 64, n, dtype=torch.float16)
    args = (cb, x, dt, dA, C, states)
    for _ in range(3):
        out = pt.mamba_chunk_scan(*args)
    assert log["prepared"] == 1 and len(log["launches"]) == 3 and out.shape == x.shape
    kept = len(pt._FAST)
    for _ in range(2):
        pt.mamba_chunk_scan(*args[:5], states.float())
    assert len(pt._FAST) == kept and len(log["launches"]) == 5
    for _ in range(2):
        out = pt.mamba_chunk_state(C, x, dt, dA)
    assert len(pt._FAST) == kept + 1 and out.dtype == torch.float32 and out.shape == (b, nc, h, 64, n)
    prepared = log["prepared"]
    kernels = len(serve.kernels._KERNELS)
    half = (C[:1], x[:1], dt[:1], dA[:1])  # batch 1 at the same addresses
    pt.mamba_chunk_state(*half)
    assert log["prepared"] == prepared + 1 and len(serve.kernels._KERNELS) == kernels
    assert log["launches"][-1][0] * 2 == log["launches"][-2][0]  # half the CTAs
    with pytest.raises(ShapeError, match="dt"):
        pt.mamba_chunk_state(C, x, dt[:, :, :1], dA[:, :, :1])


def test_softcap_window_and_seqused_reach_the_kernel(pt, fake_gpu):
    """A softcap or a window runs its class's kernel (built with it) with the values as launch arguments, after
    FlashAttention-3's normalisation; a window over every key runs the plain kernel; varlen's seqused pointers reach
    the kernel; bad values are ShapeErrors naming them."""
    import math
    log = fake_gpu
    q, k = torch.randn(1, 64, 4, 128, dtype=torch.float16), torch.randn(1, 200, 2, 128, dtype=torch.float16)
    out, lse = pt.flash_attention(q, k, k, causal=True, softcap=30.0, window_size=(100, 7), return_lse=True)
    assert out.shape == q.shape and lse.shape == (1, 4, 64)
    ks, vals = log["prepares"][-1]
    assert "fast_tanh" in ks.source and "T0 + it_" in ks.source
    assert (vals["wl"], vals["wr"]) == (100, -1)  # causal: the right edge is the diagonal
    assert vals["softcap_pre"] == pytest.approx(128 ** -0.5 / 30) and vals["scale_log2"] == pytest.approx(
        30 * math.log2(math.e))
    pt.flash_attention(q, k, k, causal=False, window_size=(-1, 3))
    ks, vals = log["prepares"][-1]
    assert "fast_tanh" not in ks.source and "T0 + it_" in ks.source and (vals["wl"], vals["wr"]) == (-1, 3)
    pt.flash_attention(q, k, k, causal=True, window_size=(199, 0))  # covers every key
    ks, vals = log["prepares"][-1]
    assert "T0" not in ks.source and "fast_tanh" not in ks.source
    cu = torch.tensor([0, 30, 64], dtype=torch.int32)
    cuk = torch.tensor([0, 100, 200], dtype=torch.int32)
    used_q, used_k = torch.tensor([20, 34], dtype=torch.int32), torch.tensor([90, 100], dtype=torch.int32)
    pt.flash_attention_varlen(q[0], k[0], k[0], cu, cuk, 34, 100, seqused_q=used_q, seqused_k=used_k)
    ks, vals = log["prepares"][-1]
    assert (vals["used_q"], vals["used_k"]) == (used_q.data_ptr(), used_k.data_ptr()) and "T0" not in ks.source
    for kw, what in (({"window_size": (3,)}, "window_size=\\(3,\\)"), ({"softcap": -2.0}, "softcap=-2.0"),
                     ({"window_size": (-3, 0)}, "window_left=-3")):
        with pytest.raises(ShapeError, match=what):
            pt.flash_attention(q, k, k, **kw)
    with pytest.raises(ShapeError, match="seqused_k must be a torch.int32 tensor of shape \\(2,\\)"):
        pt.flash_attention_varlen(q[0], k[0], k[0], cu, cuk, 34, 100, seqused_k=used_k.long())


def test_kvcache_features_run_the_varlen_kernel_and_append_in_place(pt, fake_gpu):
    """flash_attention_kvcache with a softcap, the LSE, appended keys and cache_batch_idx: the new keys land in the
    picked cache rows at cache_seqlens (others untouched), and the call launches the softcap class's varlen kernel
    with the lengths read on the device (used_k)."""
    log = fake_gpu
    q = torch.randn(2, 3, 4, 128, dtype=torch.float16)
    kc, vc = torch.zeros(3, 64, 2, 128, dtype=torch.float16), torch.zeros(3, 64, 2, 128, dtype=torch.float16)
    lens, idx = torch.tensor([10, 20], dtype=torch.int32), torch.tensor([2, 0], dtype=torch.int32)
    new = torch.ones(2, 2, 2, 128, dtype=torch.float16)
    out, lse = pt.flash_attention_kvcache(q, kc, vc, lens, causal=True, softcap=10.0, return_lse=True, k=new,
                                          v=2 * new, cache_batch_idx=idx)
    assert out.shape == q.shape and lse.shape == (2, 4, 3)
    assert kc[2, 10:12].eq(1).all() and vc[0, 20:22].eq(2).all() and kc[1].eq(0).all() and kc[2, 12:].eq(0).all()
    assert lens.tolist() == [10, 20]  # FA3 leaves cache_seqlens to the caller
    ks, vals = log["prepares"][-1]
    assert "fast_tanh" in ks.source and vals["used_k"] != 0 and vals["cu_k"] != 0 and vals["used_q"] == 0
    with pytest.raises(ShapeError, match="3 sequences for q's 2; give cache_batch_idx"):
        pt.flash_attention_kvcache(q, kc, vc, lens, softcap=10.0, return_lse=True)
    with pytest.raises(ShapeError, match="cache_leftpad must be a torch.int32 tensor of shape \\(2,\\)"):
        pt.flash_attention_kvcache(q, kc, vc, lens, cache_batch_idx=idx, cache_leftpad=lens.long())


def test_hf_sliding_masks_are_checked_as_sliding(pt):
    """transformers' sliding-window mask (key j seen by query i iff p - W < j <= p, p = i's position, bottom-right on
    each sequence's n keys) is the kernel's with window (W - 1, 0); the plain causal check refuses it, and a mask
    whose window differs is refused."""
    sq, skv, W = 4, 9, 3
    j = torch.arange(skv)[None, :]

    def sliding(n, w=W):  # the mask of a sequence filled to n keys of skv slots
        p = torch.arange(sq)[:, None] + n - sq
        return (j <= p) & (j > p - w)
    full = sliding(skv).expand(2, 1, sq, skv)
    assert pt._mask_lengths(full, True, sq, skv, 2, left=W - 1)[1] == [9, 9]
    assert pt._mask_lengths(full, True, sq, skv, 2) is None
    assert pt._mask_lengths(full, True, sq, skv, 2, left=W) is None
    static = torch.stack([sliding(9), sliding(6)])[:, None]  # a static cache filled to 9 and 6 of its slots
    lens, n = pt._mask_lengths(static, True, sq, skv, 2, left=W - 1)
    assert n == [9, 6] and lens.tolist() == [9, 6]
    assert pt._mask_lengths(torch.stack([sliding(9), sliding(6, W + 1)])[:, None], True, sq, skv, 2, left=W - 1) is None


def test_ssd_launches_the_variant_with_its_pointers(fake_gpu):
    """On the fake GPU: ``ptsolve.ssd``'s kernels
    run ChunkState's class kernel, then ChunkScan's fused variant whose D, z and x-residual arguments are the tensors
    given (D per (head, p), z as it is), or the plain kernel where neither is given."""
    import ssd_torch as kt

    from ptsolve import ssd

    a = kt.inputs(2, 300, 4, 64, 128, 2, torch.float16, D="hp", z=True, init=True, seqs=2)
    pos = [a[k] for k in ("x", "dt", "A", "B", "C")]
    ssd.ssd_forward(*pos, 256, ssd.PTSOLVE_KERNELS, D=a["D"], z=a["z"], dt_bias=a["dt_bias"],
                    initial_states=a["initial_states"], seq_idx=a["seq_idx"], dt_softplus=True)
    (ks0, v0), (ksp, vp), (ks1, v1) = fake_gpu["prepares"]
    assert ks0.op == "mamba2_chunk_state" and ksp.op == "mamba2_state_passing" and ks1.op == "mamba2_chunk_scan"
    assert ks1.params["epilogue"] == "Dpz" and ks1.params["d_state"] == 128 and ks1.params["chunk"] == 256
    assert v1["xres"] == v1["x"] == a["x"].data_ptr()
    assert v1["D"] == a["D"].data_ptr() and v1["z"] == a["z"].data_ptr()
    assert v1["B_"] == 2 and v1["SEQ"] == 300 and v1["H"] == 4 and v1["G"] == 2 and v1["NC"] == 2
    ssd.ssd_forward(*pos, 256, ssd.PTSOLVE_KERNELS, D=a["D"][:, 0].contiguous(), dt_bias=a["dt_bias"])
    assert fake_gpu["prepares"][-1][0].params["epilogue"] == "D"
    ssd.ssd_forward(*pos, 256, ssd.PTSOLVE_KERNELS, dt_bias=a["dt_bias"])
    assert "epilogue" not in fake_gpu["prepares"][-1][0].params and "d_skip" not in fake_gpu["prepares"][-1][0].source


@pytest.mark.parametrize("D", [64, 128])
def test_softcap_decode_steps_run_the_split_kv_kernel(pt, fake_gpu, monkeypatch, D):
    """A Gemma-2 / Grok decode step (one or a few positions, a softcap, no window) runs the split-KV decode kernel's
    softcap variant, not the prefill kernel with no split: its source caps the scores (``fast_tanh``), the cap reaches
    it as launch arguments (SOFTCAP_PRE = scale / softcap, SCALE_LOG2 = softcap · log2 e), a long cache of few kv
    heads in several pieces; through ``flash_attention`` (a decode family kept: a repeat prepares nothing),
    ``flash_attention_kvcache`` (lengths on the device), a paged cache and the FA3 interface. Another cap is another
    launch; with the log-sum-exp a softcap still runs the prefill kernel (the decode kernel writes none)."""
    import math

    from codegen import runtime
    from ptsolve.flash_attn_interface import flash_attn_with_kvcache
    log = fake_gpu
    monkeypatch.setattr(runtime.MapSlot, "encode", lambda self, spec, ptr: None)
    monkeypatch.setattr(pt, "_GROW", {})
    B, H, Hkv, S, scale = 1, 16, 8, 8192, 0.0625  # Gemma-2-9B: 16 query / 8 kv heads, query_pre_attn_scalar 256

    def last(kind: str = "decode", cap: float = 50.0) -> dict:
        ks, vals = log["prepares"][-1]
        assert kind in ks.name and "fast_tanh(sacc" in ks.source and "f32:softcap_pre" in ks.args, ks.name
        assert vals["softcap_pre"] == pytest.approx(scale / cap)
        assert vals["scale_log2"] == pytest.approx(cap * math.log2(math.e))
        return vals
    for sq in (1, 4):
        q, k = torch.randn(B, sq, H, D, dtype=torch.float16), torch.randn(B, S, Hkv, D, dtype=torch.float16)
        n = log["prepared"]
        outs = [pt.flash_attention(q, k, k, causal=True, softmax_scale=scale, softcap=50.0) for _ in range(2)]
        assert last()["NSP"] > 1 and log["prepared"] == n + 1 and len(log["launches"]) == 2 * (sq > 1) + 2
        assert [a for _, a in log["launches"][-2:]] == [o.data_ptr() for o in outs]
        assert pt._decode_class(q, k, True, 50.0).key.endswith("/softcap")
    pt.flash_attention(q, k, k, causal=True, softmax_scale=scale, softcap=30.0)
    last(cap=30.0)
    assert log["prepared"] == 3
    pt.flash_attention(q, k, k, causal=True, softmax_scale=scale)  # no cap: the plain decode kernel
    assert "fast_tanh" not in log["prepares"][-1][0].source and "decode" in log["prepares"][-1][0].name
    pt.flash_attention(q, k, k, causal=True, softmax_scale=scale, softcap=50.0, return_lse=True)
    assert "decode" not in log["prepares"][-1][0].name and last("flash_attention")
    lens = torch.tensor([5000], dtype=torch.int32)
    q1 = q[:, :1].contiguous()
    for _ in range(2):
        pt.flash_attention_kvcache(q1, k, k, lens, causal=True, softmax_scale=scale, softcap=50.0)
    assert last()["seqlens"] == lens.data_ptr() and log["prepared"] == 6
    flash_attn_with_kvcache(q1, k, k, cache_seqlens=lens, causal=True, softmax_scale=scale, softcap=50.0)
    assert log["prepared"] == 6  # the same call: the kept launch
    pages = torch.randn(S // 64, 64, Hkv, D, dtype=torch.float16)
    table = torch.randperm(S // 64).view(1, -1).int()
    pt.flash_attention_kvcache(q1, pages, pages, lens, causal=True, softmax_scale=scale, softcap=50.0,
                               page_table=table)
    assert last()["page_table"] == table.data_ptr()
    for bad in (-1.0, "50", [50.0]):  # named, not hashed into a key first
        with pytest.raises(ShapeError, match=f"softcap={bad!r}".replace("[", r"\[").replace("]", r"\]")):
            pt.flash_attention_kvcache(q1, k, k, lens, softcap=bad)
        with pytest.raises(ShapeError, match="softcap="):
            pt.flash_attention(q1, k, k, softcap=bad)


@pytest.mark.parametrize("dtype, cb", [(torch.bfloat16, "fp32"), (torch.float16, "fp16")])
def test_ssd_hands_chunk_scan_the_cb_of_its_class(fake_gpu, dtype, cb):
    """On the fake GPU: ``ptsolve.ssd`` gives ChunkScan CB in the dtype's default (``DEFAULT_CB_DTYPE``: float32 for
    bf16, fp16 for fp16), the kernel built for it (``cb_dtype`` in its parameters) with the cb tensor map of that
    dtype, at the address of the tensor chunk_bmm made."""
    import ssd_torch as kt

    from ptsolve import ssd

    made = []
    real = ssd.chunk_bmm
    a = kt.inputs(2, 300, 4, 64, 128, 2, dtype, D="h", z=True, seqs=2)
    pos = [a[k] for k in ("x", "dt", "A", "B", "C")]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ssd, "chunk_bmm", lambda *args, **kw: made.append(real(*args, **kw)) or made[-1])
        ssd.ssd_forward(*pos, 256, ssd.PTSOLVE_KERNELS, D=a["D"], z=a["z"], dt_bias=a["dt_bias"],
                        seq_idx=a["seq_idx"], dt_softplus=True)
    ks, vals = fake_gpu["prepares"][-1]
    cb_map = fake_gpu["prepares_maps"][-1]["cb"]
    assert ks.op == "mamba2_chunk_scan" and ks.params.get("cb_dtype", ks.params["dtype"]) == cb
    assert cb_map.dtype == cb and cb_map.strides_bytes == (256 * (4 if cb == "fp32" else 2),)
    assert made[0].dtype == (torch.float32 if cb == "fp32" else dtype) and vals["cb"] == made[0].data_ptr()


def test_mamba_chunk_scan_reads_a_float32_cb_as_it_is(pt, fake_gpu):
    """ptsolve.torch's ChunkScan with mamba_ssm's float32 cb runs the float32-CB class on it (no conversion: the
    launch is kept), with a cb in x's dtype the plain class; another float cb is converted to the default's."""
    log = fake_gpu
    b, L, h, g, n, q, nc = 1, 300, 4, 1, 128, 256, 2
    x, C = torch.randn(b, L, h, 64, dtype=torch.bfloat16), torch.randn(b, L, g, n, dtype=torch.bfloat16)
    dt, dA = torch.rand(b, h, nc, q), torch.rand(b, h, nc, q)
    states = torch.randn(b, nc, h, 64, n, dtype=torch.bfloat16)
    cb32 = torch.randn(b, nc, g, q, q)
    for cb, want in ((cb32, "fp32"), (cb32.bfloat16(), "bf16"), (cb32.double(), "fp32")):
        kept = len(pt._FAST)
        pt.mamba_chunk_scan(cb, x, dt, dA, C, states)
        ks, vals = log["prepares"][-1]
        assert ks.params.get("cb_dtype", ks.params["dtype"]) == want
        assert log["prepares_maps"][-1]["cb"].dtype == want
        assert (vals["cb"] == cb.data_ptr()) == (cb.dtype != torch.float64)  # float64: a float32 copy, not kept
        assert len(pt._FAST) == kept + (cb.dtype != torch.float64)


def test_ssd_state_passing_launch_takes_its_pointers(fake_gpu):
    """On the fake GPU: ``ptsolve.ssd``'s state passing is one launch of its class kernel over (batch, head, element
    block) tiles, reading the chunk states and dA_cumsum where they are, the initial states (float32 as given) and
    seq_idx's keep flags (float32 rows padded to 4 chunks) where given, null pointers where not; the entering states
    (x's dtype) and the final state (float32) are fresh outputs pointed at per call."""
    import ssd_torch as kt

    from ptsolve import serve, ssd

    a = kt.inputs(2, 700, 4, 64, 64, 1, torch.bfloat16, init=True, seqs=3)
    b, nc, h = 2, 3, 4
    states = torch.randn(b, nc, h, 64, 64)
    dA = torch.cumsum(-torch.rand(b, h, nc, 256), dim=-1)
    keep = ssd.seq_masks(a["seq_idx"], 256).pass_keep
    ent, fin = ssd.PTSOLVE_KERNELS.state_passing(states, dA, a["initial_states"], keep, torch.bfloat16)
    (ks, v), = fake_gpu["prepares"]
    assert ks.op == "mamba2_state_passing" and ks.params["dtype"] == "bf16" and ks.generic
    assert ks.args == ("ptr:states", "ptr:da", "ptr:keep", "ptr:init", "ptr:out", "ptr:fin", "i32:B_", "i32:NC",
                       "i32:H", "i32:Q", "i32:NTILES")
    be = ks.info["tiling"]["BE"]
    assert (v["B_"], v["NC"], v["H"], v["Q"], v["NTILES"]) == (b, nc, h, 256, b * h * 64 * 64 // be)
    assert v["states"] == states.data_ptr() and v["da"] == dA.data_ptr()
    assert v["init"] == a["initial_states"].data_ptr() and v["keep"] != 0
    assert fake_gpu["launches"][-1] == (b * h * 64 * 64 // be, ent.data_ptr())
    ln = next(x for k, x in serve.prepared.LAUNCHES.items() if k[0] == "passing")
    assert ln.ptrs["fin"].value == fin.data_ptr()
    assert ent.dtype == torch.bfloat16 and ent.shape == states.shape and fin.dtype == torch.float32
    assert fin.shape == (b, h, 64, 64)
    # new tensors of the same shapes: the same launch, every pointer written anew (no second prepare)
    s2, dA2, h2 = states.clone(), dA.clone(), a["initial_states"].clone()
    ent2, fin2 = ssd.PTSOLVE_KERNELS.state_passing(s2, dA2, h2, keep, torch.bfloat16)
    assert len(fake_gpu["prepares"]) == 1 and fake_gpu["launches"][-1][1] == ent2.data_ptr()
    assert [ln.ptrs[k].value for k in ("states", "da", "init", "fin")] == [t.data_ptr() for t in (s2, dA2, h2, fin2)]
    assert ln.ptrs["keep"].value != 0  # this call's keep flags (a fresh tensor, wherever the allocator put it)
    ent3, _ = ssd.PTSOLVE_KERNELS.state_passing(states, dA, None, None, torch.bfloat16)  # another launch: no
    _, v3 = fake_gpu["prepares"][-1]  # initial states, no keep flags
    assert v3["init"] == 0 and v3["keep"] == 0 and len(fake_gpu["prepares"]) == 2
    ln3 = next(x for k, x in serve.prepared.LAUNCHES.items() if k[0] == "passing" and k[-1] == (None, None, None))
    assert ln3.ptrs["init"].value == ln3.ptrs["keep"].value == 0 and fake_gpu["launches"][-1][1] == ent3.data_ptr()
    with pytest.raises(ShapeError, match="d_state=96"):
        ssd.PTSOLVE_KERNELS.state_passing(torch.zeros(1, 2, 4, 64, 96), dA[:1], None, None, torch.bfloat16)
    with pytest.raises(ShapeError, match="dA_cumsum must be a contiguous float32"):
        ssd.PTSOLVE_KERNELS.state_passing(states, dA[:, :, :2], None, None, torch.bfloat16)


def test_ssd_state_passing_keep_flags_are_seq_idx_s(fake_gpu, monkeypatch):
    """The keep flags the kernel reads are ``seq_masks``' pass_keep, as float32, the pad after the last chunk 0."""
    from ptsolve import serve, ssd

    seen = {}
    monkeypatch.setattr(serve, "state_passing", lambda states, dA, keep, init, out, fin, c: seen.update(keep=keep)
                        or (out, fin))
    keep = torch.tensor([[True, False, True, True, False], [False, True, True, True, True]])
    ssd.PTSOLVE_KERNELS.state_passing(torch.zeros(2, 5, 4, 64, 64), torch.zeros(2, 4, 5, 64), None, keep,
                                      torch.float16)
    assert seen["keep"].dtype == torch.float32 and seen["keep"].shape == (2, 8)
    assert seen["keep"].tolist() == [[1, 0, 1, 1, 0, 0, 0, 0], [0, 1, 1, 1, 1, 0, 0, 0]]


def test_gemm_with_n_off_the_tma_pitch_runs_the_register_store_class(pt, fake_gpu):
    """N not a multiple of 8 (C's rows are not 16-byte aligned, which a TMA store needs): the call runs the
    register-store class's kernel, no tensor map of C is made, and the output is [..., N]; K off the pitch is still
    refused, naming K and the fix."""
    from ptsolve import serve
    log = fake_gpu
    seen = []
    real = serve.gemm_launch
    serve_gemm = sys.modules["ptsolve.serve.gemm"]
    import codegen.cuda.gemm as cg
    maps, c_map = [], cg.c_map
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cg, "c_map", lambda *a: maps.append(a[2]) or c_map(*a))
        mp.setattr(serve_gemm, "gemm_launch", lambda a, b, c: seen.append(c) or real(a, b, c))
        mp.setattr(serve, "gemm_launch", serve_gemm.gemm_launch)
        for n in (77, 72):
            y = pt.gemm(torch.randn(4, 64, dtype=torch.float16), torch.randn(n, 64, dtype=torch.float16))
            assert y.shape == (4, n) and y.is_contiguous()
    assert [c.key for c in seen] == ["gemm/fp16/regs", "gemm/fp16"] and log["prepared"] == 2
    assert 72 in maps and 77 not in maps  # C's tensor map only for the TMA-store class's call
    with pytest.raises(ShapeError, match="K=60 must be a multiple of 8"):
        pt.gemm(torch.randn(4, 60, dtype=torch.float16), torch.randn(72, 60, dtype=torch.float16))


def _decode_views(b: int, h: int, g: int, n: int, dtype=torch.bfloat16) -> dict:
    """A Mamba2 mixer's decode-step inputs as the patched mixer passes them: x, B, C views of one conv-output row,
    dt a strided view of in_proj's output, A float32, D and dt_bias in the model's dtype, the state float32."""
    I = h * 64
    xbc = torch.randn(b, 1, I + 2 * g * n).to(dtype)
    proj = torch.randn(b, 1, 2 * I + 2 * g * n + h).to(dtype)
    x, B, C = torch.split(xbc, [I, g * n, g * n], dim=-1)
    return {"state": torch.zeros(b, h, 64, n), "x": x.view(b, h, 64), "dt": proj[..., -h:].reshape(b, h),
            "A": -torch.rand(h), "B": B.reshape(b, g, n), "C": C.reshape(b, g, n), "D": torch.randn(h).to(dtype),
            "dt_bias": torch.randn(h).to(dtype), "dt_softplus": True}


def test_ssm_step_launch_takes_its_pointers(fake_gpu):
    """On the fake GPU: ``mamba2_model.step_kernel`` (what ``recurrent_step`` runs on CUDA tensors) is one launch of
    its class kernel over (batch, head, row block) tiles, reading the state, the model's strided views of x, B, C
    and dt and the parameters where they are (their dtypes as flags, their batch strides as arguments) and null
    pointers for what is not given; the next token's tensors re-point the kept launch, with no second prepare."""
    import ptsolve.mamba2_model as pm
    from codegen.cuda import ssm_step as k
    from ptsolve import serve

    b, h, g, n = 2, 8, 2, 128
    a = _decode_views(b, h, g, n)
    y = pm.step_kernel(**a)
    (ks, v), = fake_gpu["prepares"]
    assert ks.op == "mamba2_ssm_step" and ks.generic and ks.params["dtype"] == "bf16"
    pt_rows = ks.info["tiling"]["PT"]
    assert (v["B_"], v["H"], v["HG"], v["SH"], v["NTILES"]) == (b, h, h // g, 0, b * h * 64 // pt_rows)
    assert (v["SX"], v["SZ"], v["SDT"], v["SB"], v["SC"]) == (a["x"].stride(0), 0, a["dt"].stride(0),
                                                             a["B"].stride(0), a["C"].stride(0))
    assert v["FLAGS"] == k.FLAG_SOFTPLUS | k.FLAG_A32 and (v["DT_LO"], v["DT_HI"]) == (0.0, float("inf"))
    assert y.shape == (b, h, 64) and y.dtype == torch.bfloat16 and y.is_contiguous()
    assert fake_gpu["launches"][-1] == (b * h * 64 // pt_rows, y.data_ptr())
    ln = next(x for key, x in serve.prepared.LAUNCHES.items() if key[0] == "ssm_step")
    names = ("state", "x", "dt", "A", "B", "C", "D", "z", "dt_bias")
    want = [a[m].data_ptr() if m in a else 0 for m in names]
    assert [ln.ptrs[m].value for m in names] == want  # the views themselves: nothing copied
    a2 = _decode_views(b, h, g, n)  # the next token: fresh tensors of the same layouts
    y2 = pm.step_kernel(**a2)
    assert len(fake_gpu["prepares"]) == 1 and fake_gpu["launches"][-1][1] == y2.data_ptr()
    assert [ln.ptrs[m].value for m in names] == [a2[m].data_ptr() if m in a2 else 0 for m in names]


def test_ssm_step_flags_copies_and_what_it_leaves_to_pytorch(fake_gpu):
    """z, a (heads, head_dim) D (a float32 copy of a bf16 one, its rows copied with x's), float32 parameters, a half
    state (SH) and a dt clamp are launch arguments; x's rows not contiguous are copied; what the kernel does not
    take (a float32 x, d_state 96, a non-contiguous or float64 state, B in another dtype, A on another device) returns
    None: the caller runs ``step_torch``."""
    import ptsolve.mamba2_model as pm
    from codegen.cuda import ssm_step as k
    from ptsolve import serve

    def ptr(name: str) -> int:  # the pointer the last prepared launch was called with
        return list(serve.prepared.LAUNCHES.values())[-1].ptrs[name].value

    b, h, g, n = 3, 4, 1, 64
    a = _decode_views(b, h, g, n, torch.float16)
    z, Dp = torch.randn(b, h, 64).half(), torch.randn(h, 64).half()
    pm.step_kernel(**(a | {"z": z, "D": Dp, "dt": a["dt"].float(), "dt_bias": a["dt_bias"].float(),
                           "dt_limit": (0.01, 2.0)}))
    _, v = fake_gpu["prepares"][-1]
    assert v["FLAGS"] == k.FLAG_SOFTPLUS | k.FLAG_D_ROWS | k.FLAG_DT32 | k.FLAG_A32 | k.FLAG_BIAS32
    assert ptr("z") == z.data_ptr() and v["SZ"] == h * 64 and ptr("D") not in (0, Dp.data_ptr())  # a float32 copy
    assert v["DT_LO"] == pytest.approx(0.01) and v["DT_HI"] == 2.0 and v["SDT"] == h  # dt.float(): contiguous
    half = a | {"state": torch.zeros(b, h, 64, n, dtype=torch.float16)}
    pm.step_kernel(**half)
    assert fake_gpu["prepares"][-1][1]["SH"] == 1
    xt = torch.randn(b, 64, h).half().transpose(1, 2)  # heads' rows not contiguous: copied
    pm.step_kernel(**(a | {"x": xt}))
    assert ptr("x") not in (0, xt.data_ptr()) and fake_gpu["prepares"][-1][1]["SX"] == h * 64
    prepared = len(fake_gpu["prepares"])
    for bad in ({"x": a["x"].float()}, {"state": torch.zeros(b, h, 64, 96), "B": torch.zeros(b, g, 96).half(),
                                        "C": torch.zeros(b, g, 96).half()},
                {"state": torch.zeros(b, h, n, 64).transpose(2, 3)}, {"state": a["state"].double()},
                {"B": a["B"].float()}, {"A": a["A"].to("meta")}):
        assert pm.step_kernel(**(a | bad)) is None
    assert len(fake_gpu["prepares"]) == prepared


def test_ssm_step_op_is_registered():
    """``torch.ops.ptsolve.mamba2_ssm_step`` (what recurrent_step calls under torch.compile): its fake gives y's
    shape and dtype; on CPU tensors it is ``step_torch``, the state written in place."""
    import ptsolve.mamba2_model as pm

    b, h, g, n = 2, 4, 1, 64
    meta = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in _decode_views(b, h, g, n).items()}
    op = torch.ops.ptsolve.mamba2_ssm_step
    y = op(meta["state"], meta["x"], meta["dt"], meta["A"], meta["B"], meta["C"], meta["D"], None, meta["dt_bias"],
           True, 0.0, float("inf"))
    assert y.shape == (b, h, 64) and y.dtype == torch.bfloat16 and y.device.type == "meta"
    a = _decode_views(b, h, g, n)
    a["state"] = torch.randn(b, h, 64, n)
    s1, s2 = a["state"].clone(), a["state"].clone()
    y1 = op(s1, a["x"], a["dt"], a["A"], a["B"], a["C"], a["D"], None, a["dt_bias"], True, 0.0, float("inf"))
    y2 = pm.step_torch(**(a | {"state": s2}))
    assert torch.equal(y1, y2) and torch.equal(s1, s2) and not torch.equal(s1, a["state"])
