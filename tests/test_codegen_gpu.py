"""GPU tests of generated kernels (run on an H100/H200 with ``pytest -m gpu tests/test_codegen_gpu.py``):
relative Frobenius error vs a float32 torch reference <= 1e-2 on fresh random inputs, outputs poisoned with
NaN before every run (NaN never passes), ragged and GQA shapes, causal masks, several schedules."""
from __future__ import annotations

import pytest
from hopper import require_hopper

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def _gpu():
    require_hopper()


def _fa(B, H, Hkv, Sq, Skv, D, causal, dtype="bf16"):
    return {"batch": B, "heads": H, "kv_heads": Hkv, "seq_q": Sq, "seq_kv": Skv, "head_dim": D, "causal": causal,
            "dtype": dtype}


T2 = {"BM": 128, "BN": 128, "depth": 2, "groups": 2}

# solver-style plans whose tc_order is enforced with named-barrier turns (see tests/test_codegen.py)
FA3_ORDER = [("mma_qk", 0), ("mma_pv", 1), ("rowmax", 0), ("exp2", 0), ("rowsum", 0), ("rescale", 0)]
SOFTMAX_PV = [("mma_qk", 1), ("rowmax", 1), ("exp2", 1), ("rescale", 1), ("mma_pv", 1), ("rowsum", 1)]
TURN_PLANS = {
    # ptsolve greedy's FA3 schedule: every GEMM hands the tensor cores to the other group
    "greedy": ([SOFTMAX_PV, SOFTMAX_PV], ["mma_qk@0", "mma_qk@1", "mma_pv@0", "mma_pv@1"]),
    # CP-SAT's: wg1 a stage ahead on its softmax; each group issues PV then QK back to back
    "cpsat": ([[("mma_qk", 1), ("rowmax", 1), ("exp2", 1), ("rescale", 1), ("rowsum", 1), ("mma_pv", 1)],
               [("exp2", 2), ("rowsum", 2), ("rescale", 2), ("mma_pv", 2), ("mma_qk", 1), ("rowmax", 1)]],
              ["mma_qk@0", "mma_pv@1", "mma_qk@1", "mma_pv@0"]),
    # wg1 one stage behind wg0: three stages, guarded prologue, epilogue for short trip counts
    "skewed": ([FA3_ORDER, [(t, s + 1) for t, s in FA3_ORDER]], ["mma_qk@0", "mma_pv@0", "mma_qk@1", "mma_pv@1"]),
    "g3": ([FA3_ORDER] * 3, ["mma_qk@0", "mma_qk@1", "mma_pv@0", "mma_qk@2", "mma_pv@1", "mma_pv@2"]),
}


def turn_plan(p, tiling, which):
    """A KernelPlan with per-group loops and tc_order as plan_from_program builds them."""
    from codegen.plan import KernelPlan, default_plan
    loops, tc = TURN_PLANS[which]
    base = default_plan("flash_attention", p, tiling)
    loop = {"producer": [("load_k", 0), ("load_v", 0)]}
    loop |= {f"wg{g}": [(f"{t}@{g}", s) for t, s in ops] for g, ops in enumerate(loops)}
    return KernelPlan(base.op, base.params, base.tiling, {**base.order, "loop": loop}, tc)


@pytest.mark.parametrize("M,N,K,dtype,tiling", [
    (512, 512, 512, "fp16", {"BM": 128, "BN": 128, "BK": 64, "depth": 2, "groups": 1}),
    (1000, 1000, 1000, "bf16", {"BM": 128, "BN": 128, "BK": 64, "depth": 3, "groups": 2}),
    (777, 1024, 520, "bf16", {"BM": 128, "BN": 256, "BK": 64, "depth": 4, "groups": 2}),
    (2048, 2048, 4096, "fp16", {"BM": 128, "BN": 256, "BK": 64, "depth": 4, "groups": 2}),
    (1024, 768, 256, "fp16", {"BM": 64, "BN": 256, "BK": 64, "depth": 2, "groups": 1}),
    (300, 4096, 2048, "bf16", {"BM": 256, "BN": 128, "BK": 64, "depth": 4, "groups": 2}),
    (64, 64, 8, "fp16", {"BM": 64, "BN": 64, "BK": 64, "depth": 2, "groups": 1}),  # K < BK: one k-step
    (2048, 2048, 1024, "bf16", {"BM": 128, "BN": 256, "BK": 64, "depth": 4, "groups": 2, "persistent": 0}),
])
def test_gemm(M, N, K, dtype, tiling):
    from codegen.bench import check_gemm
    r = check_gemm(M, N, K, dtype, tiling, trials=2)
    assert r["ok"], r


@pytest.mark.parametrize("p,tiling,order", [
    (_fa(1, 2, 2, 256, 256, 128, False), T2, "plain"),
    (_fa(2, 8, 2, 1000, 1000, 128, False), T2, "plain"),
    (_fa(2, 8, 2, 1000, 1000, 128, True), T2, "plain"),
    (_fa(1, 4, 1, 300, 1000, 128, True), T2, "plain"),
    (_fa(2, 4, 4, 384, 384, 64, False, "fp16"), {"BM": 64, "BN": 64, "depth": 2, "groups": 1}, "plain"),
    (_fa(2, 6, 3, 1000, 777, 64, False, "fp16"), {"BM": 192, "BN": 64, "depth": 3, "groups": 3}, "plain"),
    (_fa(2, 8, 2, 1000, 1000, 128, True), {"BM": 128, "BN": 64, "depth": 2, "groups": 2}, "overlap"),
    (_fa(1, 4, 4, 64, 64, 128, True), {"BM": 128, "BN": 64, "depth": 2, "groups": 2}, "overlap"),
    (_fa(2, 8, 2, 1000, 1000, 128, True), T2, "fa3"),
    (_fa(1, 4, 2, 200, 1000, 64, True, "fp16"), {"BM": 64, "BN": 64, "depth": 2, "groups": 1}, "fa3"),
    (_fa(2, 6, 3, 1000, 1000, 64, True, "fp16"), {"BM": 192, "BN": 64, "depth": 2, "groups": 3}, "fa3"),
    (_fa(1, 8, 8, 777, 777, 128, False), {"BM": 128, "BN": 176, "depth": 2, "groups": 2}, "fa3"),
    (_fa(1, 8, 8, 777, 777, 128, True), {"BM": 128, "BN": 176, "depth": 2, "groups": 2}, "plain"),
    # persistent CTAs (more tiles than SMs: each CTA runs several tiles with different trip counts)
    (_fa(4, 16, 4, 1000, 1000, 128, True), T2 | {"persistent": 1}, "fa3"),
    (_fa(4, 16, 4, 1000, 1000, 128, False), T2 | {"persistent": 1}, "plain"),
    (_fa(3, 32, 8, 777, 1000, 64, True, "fp16"), {"BM": 128, "BN": 64, "depth": 2, "groups": 2, "persistent": 1},
     "overlap"),
    # tiny sequences: one key block, one query row
    (_fa(2, 4, 2, 1, 1, 128, False), T2, "fa3"),
    (_fa(2, 4, 2, 1, 1000, 128, True), T2, "plain"),
])
def test_attention(p, tiling, order):
    from codegen.bench import check_fa, fa3_order_plan
    from codegen.plan import default_plan
    plan = {"plain": default_plan("flash_attention", p, tiling),
            "overlap": default_plan("flash_attention", p, tiling, overlap=True),
            "fa3": fa3_order_plan(p, tiling)}[order]
    r = check_fa(p, tiling, plan, trials=2, label=order)
    assert r["ok"], r


@pytest.mark.parametrize("p,tiling,which", [
    (_fa(2, 8, 2, 1000, 1000, 128, True), T2, "cpsat"),
    (_fa(4, 16, 4, 1000, 1000, 128, True, "fp16"), T2 | {"persistent": 1}, "cpsat"),
    (_fa(1, 8, 8, 777, 777, 128, False), T2, "greedy"),
    (_fa(4, 16, 4, 1000, 1000, 128, True), T2 | {"persistent": 1}, "greedy"),
    (_fa(1, 4, 2, 200, 1000, 128, True), T2, "skewed"),
    (_fa(2, 4, 2, 1, 1, 128, False), T2, "skewed"),
    (_fa(3, 32, 8, 777, 1000, 64, True, "fp16"), {"BM": 128, "BN": 64, "depth": 2, "groups": 2, "persistent": 1},
     "skewed"),
    (_fa(2, 6, 3, 1000, 1000, 64, True, "fp16"), {"BM": 192, "BN": 64, "depth": 2, "groups": 3}, "g3"),
])
def test_attention_turns(p, tiling, which):
    """Enforced tc_order: correct results, no hang, for short and ragged trip counts and persistent CTAs."""
    from codegen.bench import check_fa
    r = check_fa(p, tiling, turn_plan(p, tiling, which), trials=2, label=which)
    assert r["ok"], r


def test_attention_deterministic():
    """Same inputs twice give bitwise-equal outputs (a moving result would mean a race)."""
    import torch

    from codegen.plan import default_plan
    from codegen.runtime import run_attention
    p = _fa(2, 8, 2, 1000, 1000, 128, True)
    plan = default_plan("flash_attention", p, T2, overlap=False)
    q = torch.randn(2, 1000, 8, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 1000, 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    o1 = run_attention(q, k, v, plan, out=torch.full_like(q, float("nan")))
    o2 = run_attention(q, k, v, plan, out=torch.full_like(q, float("nan")))
    torch.cuda.synchronize()
    assert torch.equal(o1, o2)


def test_wrong_shape_raises():
    import torch

    from codegen.plan import default_plan
    from codegen.runtime import run_gemm
    from ptsolve.errors import DeviceError
    plan = default_plan("gemm", {"M": 256, "N": 256, "K": 256, "dtype": "fp16"},
                        {"BM": 128, "BN": 128, "BK": 64, "depth": 2, "groups": 1})
    a = torch.randn(256, 128, device="cuda", dtype=torch.float16)
    with pytest.raises(DeviceError):
        run_gemm(a, a, plan)
