"""ptsolve.torch without a GPU (skipped where torch is not installed): the ops' schemas and fake implementations
(meta tensors: output shapes and dtypes), and the front door's errors for what the kernels cannot take."""
from __future__ import annotations

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


def test_hf_attention_takes_only_the_causal_mask(pt):
    """transformers' mask must be what the kernel applies anyway (bottom-right causal); a padding or static-cache mask
    is a ShapeError, not a silently unmasked result."""
    sq, skv = 3, 7
    i, j = torch.arange(sq)[:, None], torch.arange(skv)[None, :]
    causal = (j <= i + skv - sq).expand(2, 1, sq, skv)
    assert pt._mask_is_causal(causal, True, sq, skv)
    assert pt._mask_is_causal(torch.where(causal, 0.0, float("-inf")), True, sq, skv)  # additive float masks
    assert not pt._mask_is_causal(causal, False, sq, skv)
    assert pt._mask_is_causal(torch.ones(1, 1, sq, skv, dtype=torch.bool), False, sq, skv)
    assert not pt._mask_is_causal(causal[..., :-1], True, sq, skv - 1)  # top-left, not bottom-right
    padded = causal.clone()
    padded[1, :, :, :2] = False  # the second sequence is left-padded by two
    assert not pt._mask_is_causal(padded, True, sq, skv)
    static = (j <= i + 3).expand(2, 1, sq, skv)  # a static cache: slots past the filled ones masked
    assert not pt._mask_is_causal(static, True, sq, skv)
    m = causal.clone()
    assert pt._mask_is_causal(m, True, sq, skv)
    m.data[1, :, :, :2] = False  # the storage edited behind m's version counter
    assert pt._mask_is_causal(m, True, sq, skv)  # the same object keeps its verdict (transformers never edits one)
    assert not pt._mask_is_causal(m.view(m.shape), True, sq, skv)  # another object at that address: checked anew
    q, k = torch.zeros(2, 4, sq, 64, dtype=torch.float16), torch.zeros(2, 4, skv, 64, dtype=torch.float16)
    for bad in (padded, static):
        with pytest.raises(ShapeError, match="flash_attention_varlen"):
            pt.hf_attention(None, q, k, k, bad)


class _FakeModule:
    """A class kernel's loaded module without a GPU: ``prepare`` counts the launches it prepares and returns a real
    ``runtime.Launch`` whose driver call records the output address and grid."""

    def __init__(self, ks, log):
        self.ks, self.log = ks, log

    def prepare(self, values, maps, grid, out=""):
        import ctypes

        from codegen import runtime
        self.log["prepared"] += 1
        ptrs = {a.split(":")[1]: ctypes.c_uint64(int(values[a.split(":")[1]])) for a in self.ks.args
                if a.startswith("ptr:")}
        arr = (ctypes.c_void_p * 1)()
        log = self.log

        def launch(func, gx, gy, gz, *rest):
            log["launches"].append((gx, ptrs[out].value))
            return (0,)
        return runtime.Launch(launch, 0, 0, (grid, 1, 1), self.ks.block, self.ks.smem_bytes, (arr,),
                              ctypes.addressof(arr), self.ks.name, ptrs, ptrs[out])


@pytest.fixture()
def fake_gpu(pt, monkeypatch):
    """ptsolve.torch's eager path on CPU tensors: the device checks pass, the stream is 0, kernels do not run."""
    from codegen import generic, runtime
    log = {"prepared": 0, "launches": []}
    monkeypatch.setattr(generic.ClassKernel, "module", lambda self: _FakeModule(self.ks, log))
    monkeypatch.setattr(runtime, "_cu_stream", lambda h: h)
    monkeypatch.setattr(generic, "current_stream", lambda dev: 0)
    monkeypatch.setattr(pt, "_raw_stream", lambda dev: 0)
    monkeypatch.setattr(pt, "_same", lambda name, xs: None)
    monkeypatch.setattr(pt, "_FAST", {})
    monkeypatch.setattr(generic, "_LAUNCHES", {})
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
    ap = torch.randn(64, 3, 5, dtype=torch.float16).permute(1, 2, 0)  # reshape copies it: never kept
    kept = len(pt._FAST)
    for _ in range(2):
        assert pt.gemm(ap, w).shape == (3, 5, 72)
    assert len(pt._FAST) == kept and len(log["launches"]) == 14


def test_mamba_warm_path_and_conversions(pt, fake_gpu):
    """Mamba2's chunk ops: a repeated call reuses the launch; float32 states (mamba_ssm's) are converted per call
    and not kept; a new batch or seq at the same addresses is a new launch of the same class kernel."""
    from codegen import generic
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
    kernels = len(generic._KERNELS)
    half = (C[:1], x[:1], dt[:1], dA[:1])  # batch 1 at the same addresses
    pt.mamba_chunk_state(*half)
    assert log["prepared"] == prepared + 1 and len(generic._KERNELS) == kernels
    assert log["launches"][-1][0] * 2 == log["launches"][-2][0]  # half the CTAs
    with pytest.raises(ShapeError, match="dt"):
        pt.mamba_chunk_state(C, x, dt[:, :, :1], dA[:, :, :1])
