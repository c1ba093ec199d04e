"""Split-KV attention on an H100/H200 (``pytest -m gpu tests/gpu/test_decode_gpu.py``): FlashAttention's rule against a
float32 reference, max|out - ref| <= 2 max|out_lowprec - ref| + 1e-3, on NaN-poisoned outputs; repeated launches
agree bit for bit (the combine counters are back at zero); the 2^32-element attention (FA19's q) runs."""
from __future__ import annotations

import math
import os

import pytest

import ptsolve

pytestmark = pytest.mark.gpu
_CACHE = os.environ.get("PTSOLVE_CACHE_DIR")  # before conftest gives every test its own


@pytest.fixture(autouse=True)
def _carried_cubins(monkeypatch: pytest.MonkeyPatch) -> None:
    """Use the cubins compiled on the CPU machine and carried along (these tests use no schedule cache)."""
    if _CACHE:
        monkeypatch.setenv("PTSOLVE_CACHE_DIR", _CACHE)


def _gpu() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")


def _refs(q, k, v, causal: bool):
    """(float32 reference, the same math in the inputs' precision), q [B,Sq,H,D], k/v [B,Skv,Hkv,D]."""
    import torch
    B, Sq, H, D = q.shape
    Skv, Hkv = k.shape[1], k.shape[2]
    out = []
    for dt in (torch.float32, q.dtype):
        qt = q.to(dt).transpose(1, 2)
        kt = k.to(dt).transpose(1, 2).repeat_interleave(H // Hkv, 1)
        vt = v.to(dt).transpose(1, 2).repeat_interleave(H // Hkv, 1)
        s = (qt @ kt.transpose(-1, -2)) * (1.0 / math.sqrt(D))
        if causal:
            i = torch.arange(Sq, device=q.device)[:, None]
            s = s.masked_fill(torch.arange(Skv, device=q.device)[None] > i + (Skv - Sq), float("-inf"))
        out.append((torch.softmax(s, -1) @ vt).transpose(1, 2))
    return out


CASES = [  # (params, tiling): splits > 1 combine, splits 1, GQA packing, MQA beyond 64 rows, causal prefill, bf16
    (dict(batch=2, heads=32, kv_heads=8, seq_q=1, seq_kv=4097), {"BM": 64, "BN": 128, "depth": 3, "groups": 1,
                                                                 "splits": 11}),
    (dict(batch=2, heads=32, kv_heads=8, seq_q=4, seq_kv=1000, causal=True),
     {"BM": 64, "BN": 128, "depth": 2, "groups": 1, "splits": 1}),
    (dict(batch=3, heads=14, kv_heads=2, seq_q=4, seq_kv=1000, head_dim=64, causal=True, dtype="bf16"),
     {"BM": 64, "BN": 64, "depth": 4, "groups": 1, "splits": 8}),
    (dict(batch=1, heads=71, kv_heads=1, seq_q=4, seq_kv=777, head_dim=64, causal=True),
     {"BM": 128, "BN": 64, "depth": 2, "groups": 2, "splits": 4}),
    (dict(batch=1, heads=71, kv_heads=1, seq_q=1, seq_kv=1000, head_dim=64),
     {"BM": 64, "BN": 128, "depth": 3, "groups": 1, "splits": 4}),
    (dict(batch=1, heads=8, kv_heads=8, seq_q=1000, seq_kv=1000, causal=True),
     {"BM": 128, "BN": 128, "depth": 2, "groups": 2, "splits": 4}),
    (dict(batch=1, heads=4, kv_heads=2, seq_q=16, seq_kv=33, head_dim=128, causal=True),
     {"BM": 64, "BN": 64, "depth": 2, "groups": 1, "splits": 1}),
    # 512 tiles of several pieces: one merge CTA each is more than the SMs (CTA index order keeps the pieces ahead)
    (dict(batch=64, heads=32, kv_heads=8, seq_q=1, seq_kv=1000), {"BM": 64, "BN": 128, "depth": 3, "groups": 1,
                                                                  "splits": 4}),
]


@pytest.mark.parametrize("p,t", CASES)
def test_flash_decode_matches_float32(p: dict, t: dict) -> None:
    _gpu()
    import torch

    from codegen.harness import run_decode
    from codegen.plan import default_plan
    op = ptsolve.ops.flash_decode(**p)
    assert t in op.tilings()
    pp = op.params
    plan = default_plan("flash_decode", pp, t)
    tdt = {"fp16": torch.float16, "bf16": torch.bfloat16}[pp["dtype"]]
    torch.manual_seed(0)
    B, Sq, Skv, H, Hkv, D = (pp[x] for x in ("batch", "seq_q", "seq_kv", "heads", "kv_heads", "head_dim"))
    for _ in range(2):  # fresh inputs twice: the second launch finds the counters the first left
        q = torch.randn(B, Sq, H, D, device="cuda", dtype=tdt)
        k = torch.randn(B, Skv, Hkv, D, device="cuda", dtype=tdt)
        v = torch.randn(B, Skv, Hkv, D, device="cuda", dtype=tdt)
        o1, o2 = torch.full_like(q, float("nan")), torch.full_like(q, float("nan"))
        run_decode(q, k, v, plan, out=o1)
        run_decode(q, k, v, plan, out=o2)
        torch.cuda.synchronize()
        hi, lo = _refs(q, k, v, pp["causal"])
        err = (o1.float() - hi).abs().max().item()
        base = (lo.float() - hi).abs().max().item()
        assert math.isfinite(err) and err <= 2 * base + 1e-3, (err, base)
        assert torch.equal(o1, o2)


def test_solver_schedule_runs() -> None:
    """A schedule the model chose (greedy: no solver on the GPU machine) for a few-head decode splits and is right."""
    _gpu()
    import torch

    from codegen.harness import run_decode
    op = ptsolve.ops.flash_decode(batch=1, heads=32, kv_heads=8, seq_q=1, seq_kv=8191)
    res = ptsolve.optimize(op, hw="h200", solver="greedy", cache=False, executor="serial", compile_check=False)
    assert res.tiling["splits"] > 1
    q = torch.randn(1, 1, 32, 128, device="cuda", dtype=torch.float16)
    k = torch.randn(1, 8191, 8, 128, device="cuda", dtype=torch.float16)
    v = torch.randn(1, 8191, 8, 128, device="cuda", dtype=torch.float16)
    o = run_decode(q, k, v, res.program)
    hi, lo = _refs(q, k, v, False)
    assert (o.float() - hi).abs().max().item() <= 2 * (lo.float() - hi).abs().max().item() + 1e-3


def test_fa19_sized_attention_runs_with_64_bit_offsets() -> None:
    """q and o of 2^32 elements (FA19: batch 64, 64 heads, seq 8192, d128): the last batch's offsets exceed 2^31;
    (batch, head) slices there and at the start are checked against float32."""
    _gpu()
    import torch

    from codegen.harness import run_attention
    from codegen.plan import default_plan
    if torch.cuda.get_device_properties(0).total_memory < 40 << 30:
        pytest.skip("needs 40 GB of GPU memory")
    p = ptsolve.ops.flash_attention(batch=64, heads=64, kv_heads=8, seq=8192, head_dim=128).params
    plan = default_plan("flash_attention", p, {"BM": 128, "BN": 128, "depth": 2, "groups": 2})
    torch.manual_seed(0)
    q = torch.randn(64, 8192, 64, 128, device="cuda", dtype=torch.float16)
    k = torch.randn(64, 8192, 8, 128, device="cuda", dtype=torch.float16)
    v = torch.randn(64, 8192, 8, 128, device="cuda", dtype=torch.float16)
    o = torch.full_like(q, float("nan"))
    assert o.numel() == 1 << 32
    run_attention(q, k, v, plan, out=o)
    torch.cuda.synchronize()
    for b in (0, 63):
        hi, lo = _refs(q[b:b + 1, :, :8], k[b:b + 1, :, :1], v[b:b + 1, :, :1], False)  # group 0
        assert (o[b:b + 1, :, :8].float() - hi).abs().max().item() <= \
            2 * (lo.float() - hi).abs().max().item() + 1e-3
    assert torch.isfinite(o[-1]).all()
