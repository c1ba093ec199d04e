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
