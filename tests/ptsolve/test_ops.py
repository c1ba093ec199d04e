from __future__ import annotations

import pytest

from ptsolve import ops
from ptsolve.errors import ShapeError
from ptsolve.ops.attention import kept_pairs


def executed_mma_flops(g) -> int:
    per_iter = sum(t.flops for t in g.phase("loop") if t.kind == "mma")
    return sum(n * per_iter for n in g.row) * g.rows


@pytest.mark.parametrize("b,h,kv,s,d", [(2, 8, 2, 1024, 128), (1, 32, 8, 512, 64)])
def test_fa_flops_noncausal(b, h, kv, s, d) -> None:
    op = ops.flash_attention(batch=b, heads=h, kv_heads=kv, seq=s, head_dim=d)
    for t in op.tilings()[:6]:
        g = op.graph(t)
        assert g.useful_flops == 4 * b * h * s * s * d
        if s % t["BM"] == 0 and s % t["BN"] == 0:
            assert executed_mma_flops(g) == 4 * b * h * s * s * d


def test_fa_flops_causal_counts_kept_tiles() -> None:
    b, h, s, d = 2, 4, 1024, 128
    op = ops.flash_attention(batch=b, heads=h, kv_heads=h, seq=s, head_dim=d, causal=True)
    assert op.useful_flops == 4 * b * h * d * s * (s + 1) // 2
    g = op.graph({"BM": 128, "BN": 128, "depth": 2, "groups": 2})
    assert g.row == tuple(range(1, 9))  # query block i keeps key blocks 0..i
    kept = sum(range(1, 9))
    assert executed_mma_flops(g) == b * h * kept * 4 * 128 * 128 * d
    assert 0.5 < executed_mma_flops(g) / (4 * b * h * s * s * d) < 0.6


def test_fa_ragged_and_bottom_right_causal() -> None:
    op = ops.flash_attention(batch=1, heads=2, seq=1000, head_dim=64)
    g = op.graph({"BM": 128, "BN": 128, "depth": 2, "groups": 1})
    assert g.row == (8,) * 8 and g.useful_flops == 4 * 2 * 1000 * 1000 * 64
    c = ops.flash_attention(batch=1, heads=1, seq_q=128, seq_kv=512, head_dim=64, causal=True)
    assert kept_pairs(c.params) == sum(384 + i + 1 for i in range(128))
    assert c.graph({"BM": 128, "BN": 128, "depth": 2, "groups": 1}).row == (4,)


def test_propagate_infers_tiles_from_output_tile() -> None:
    op = ops.flash_attention(batch=1, heads=8, kv_heads=8, seq=1024, head_dim=128)
    t = op.propagate((128, 0), BN=64, groups=2)
    assert t["load_q"] == (128, 128) and t["load_k"] == (64, 128) and t["mma_qk@1"] == (64, 64, 128)
    g = ops.gemm(1024, 1024, 1024).propagate((256, 128), groups=2, BK=64)
    assert g["load_a"] == (256, 64) and g["load_b"] == (64, 128) and g["mma@0"] == (128, 128, 64)


def test_every_operator_builds_every_tiling() -> None:
    for op in (ops.gemm(4096, 1024, 4096), ops.flash_attention(batch=1, heads=32, kv_heads=8, seq=512),
               ops.mamba2_chunk_scan(1, 1024, 64, 64, 128, 256), ops.mamba2_chunk_state(1, 1024, 64, 64, 128, 256)):
        ts = op.tilings()
        assert ts
        for t in ts:
            g = op.graph(t)
            assert g.tiling == t and g.n_ctas >= 1


def test_mamba_flops() -> None:
    op = ops.mamba2_chunk_state(2, 1024, 8, 64, 128, 256)
    assert op.useful_flops == 2 * 4 * 8 * 2 * 256 * 128 * 64
    g = op.graph({"BM": 128, "BK": 64, "depth": 2, "groups": 2})
    assert executed_mma_flops(g) == op.useful_flops
    scan = ops.mamba2_chunk_scan(1, 512, 4, 64, 128, 256)
    assert scan.graph(scan.tilings()[0]).row[0] < scan.graph(scan.tilings()[0]).row[-1]  # causal inside a chunk


@pytest.mark.parametrize("call,match", [
    (lambda: ops.gemm(0, 8, 8), "M must be a positive integer"),
    (lambda: ops.gemm(64, 64, 60), "multiple of 8"),
    (lambda: ops.flash_attention(batch=1, heads=32, kv_heads=5, seq=128), "not divisible by kv_heads"),
    (lambda: ops.flash_attention(batch=1, heads=4, seq=128, head_dim=100), "head_dim=100 cannot be served"),
    (lambda: ops.flash_attention(batch=1, heads=4, seq=-3), "must be a positive integer"),
    (lambda: ops.flash_attention(batch=1, heads=4, seq=128, dtype="fp64"), "dtype"),
    (lambda: ops.flash_attention(batch=1, heads=4, seq_q=256, seq_kv=128, causal=True), "seq_q <= seq_kv"),
    (lambda: ops.mamba2_chunk_scan(1, 1024, 64, 60, 128, 256), "head_dim=60"),
    (lambda: ops.mamba2_chunk_state(1, 1024, 6, 64, 128, 256, groups=4), "not divisible by groups"),
    (lambda: ops.make("conv", x=1), "unknown operator"),
])
def test_bad_shapes(call, match) -> None:
    with pytest.raises(ShapeError, match=match):
        call()
