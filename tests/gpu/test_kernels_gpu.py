"""GPU tests of the generated kernels, every operator through the one path (plan or program -> lower ->
skeleton): relative Frobenius error against a float32 / float64 torch reference <= 1e-2 on fresh random inputs,
outputs poisoned with NaN before every run (NaN never passes), ragged, GQA, causal and grouped shapes, hand
orders, the schedules ptsolve's policies found (bench study round, solved on the CPU: the GPU machine has
no solver), 1-3 CTAs per SM, persistent CTAs. Run on an H100/H200 with ``pytest -m gpu``."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hopper import require_hopper
from test_cuda import CPSAT, FA3_ORDER, GREEDY, SKEWED, cs_tiling, solver_plan, with_loop

from codegen.plan import default_plan, fa3_order_plan, plan_from_program

pytestmark = pytest.mark.gpu
TOL = 1e-2
SCHEDULES = Path(__file__).parents[1] / "data" / "schedules_h200"  # committed schedules (bench study round)


@pytest.fixture(scope="module", autouse=True)
def _gpu():
    require_hopper()


def _fa(B, H, Hkv, Sq, Skv, D, causal, dtype="bf16"):
    return {"batch": B, "heads": H, "kv_heads": Hkv, "seq_q": Sq, "seq_kv": Skv, "head_dim": D, "causal": causal,
            "dtype": dtype}


def _ms(batch, seq, heads, groups, dtype, head_dim=64, d_state=128, chunk=256):
    return {"batch": batch, "seq": seq, "heads": heads, "head_dim": head_dim, "d_state": d_state, "chunk": chunk,
            "groups": groups, "dtype": dtype}


T2 = {"BM": 128, "BN": 128, "depth": 2, "groups": 2}


@pytest.mark.parametrize("M,N,K,dtype,tiling", [
    (512, 512, 512, "fp16", {"BM": 128, "BN": 128, "BK": 64, "depth": 2, "groups": 1}),
    (1000, 1000, 1000, "bf16", {"BM": 128, "BN": 128, "BK": 64, "depth": 3, "groups": 2}),
    (777, 1024, 520, "bf16", {"BM": 128, "BN": 256, "BK": 64, "depth": 4, "groups": 2}),
    (2048, 2048, 4096, "fp16", {"BM": 128, "BN": 256, "BK": 64, "depth": 4, "groups": 2}),
    (1024, 768, 256, "fp16", {"BM": 64, "BN": 256, "BK": 64, "depth": 2, "groups": 1}),
    (300, 4096, 2048, "bf16", {"BM": 256, "BN": 128, "BK": 64, "depth": 4, "groups": 2}),
    (64, 64, 8, "fp16", {"BM": 64, "BN": 64, "BK": 64, "depth": 2, "groups": 1}),  # K < BK: one k-step
    (2048, 2048, 1024, "bf16", {"BM": 128, "BN": 256, "BK": 64, "depth": 4, "groups": 2, "persistent": 0}),
    (4095, 4097, 1024, "fp16", {"BM": 128, "BN": 256, "BK": 64, "depth": 4, "groups": 2}),  # odd N: half stores
    (100, 77, 72, "bf16", {"BM": 64, "BN": 64, "BK": 64, "depth": 2, "groups": 1}),
])
def test_gemm(M, N, K, dtype, tiling):
    from codegen.harness import check_gemm
    r = check_gemm(M, N, K, dtype, tiling, trials=2)
    assert r["ok"], r


SPLIT_CASES = [  # split-K: even and uneven K ranges, one and two warpgroups, persistent or a grid, M of 1 and ragged
    (1, 4096, 4096, "fp16", {"BM": 64, "BN": 64, "BK": 64, "depth": 4, "groups": 1, "splits": 2}),
    (16, 1024, 4096, "bf16", {"BM": 64, "BN": 128, "BK": 64, "depth": 3, "groups": 1, "splits": 8}),
    (100, 768, 1000, "fp16", {"BM": 128, "BN": 64, "BK": 64, "depth": 4, "groups": 2, "splits": 3}),
    (777, 520, 4104, "bf16", {"BM": 128, "BN": 128, "BK": 64, "depth": 3, "groups": 2, "splits": 6, "persistent": 0}),
    (128, 4096, 14336, "fp16", {"BM": 64, "BN": 256, "BK": 64, "depth": 3, "groups": 1, "splits": 4}),
    (33, 1001, 512, "fp16", {"BM": 64, "BN": 64, "BK": 64, "depth": 3, "groups": 1, "splits": 2}),  # odd N
    # 256 tiles: one reduce CTA each is more than the SMs (CTA index order keeps the split units ahead)
    (2048, 2048, 1024, "fp16", {"BM": 128, "BN": 128, "BK": 64, "depth": 3, "groups": 2, "splits": 2}),
]


@pytest.mark.parametrize("M,N,K,dtype,tiling", SPLIT_CASES)
def test_gemm_split_k(M, N, K, dtype, tiling):
    """Split-K against the float32 product, three launches on fresh inputs (the arrival counters must be back at
    zero after each), and bitwise-equal outputs for equal inputs (the partials are summed in split order, whoever
    arrives last)."""
    import torch

    from codegen.harness import check_gemm, run_gemm
    r = check_gemm(M, N, K, dtype, tiling, trials=3)
    assert r["ok"], r
    plan = default_plan("gemm", {"M": M, "N": N, "K": K, "dtype": dtype}, tiling)
    t = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    a, b = torch.randn(M, K, device="cuda", dtype=t), torch.randn(N, K, device="cuda", dtype=t)
    outs = [run_gemm(a, b, plan, out=torch.full((M, N), float("nan"), device="cuda", dtype=t)) for _ in range(4)]
    torch.cuda.synchronize()
    assert all(torch.equal(outs[0], o) for o in outs[1:])


PINGPONG_CASES = [  # ping-pong: two warpgroups, a tile each; ragged M / N / K, odd N, CTAs with odd tile counts
    (4095, 4097, 1024, "fp16", {"BM": 128, "BN": 128, "BK": 64, "depth": 4, "groups": 1, "pingpong": 1}),
    (2000, 3000, 520, "bf16", {"BM": 64, "BN": 256, "BK": 64, "depth": 4, "groups": 1, "pingpong": 1}),
    (8192, 8192, 1024, "bf16", {"BM": 128, "BN": 192, "BK": 64, "depth": 3, "groups": 1, "pingpong": 1}),
    (777, 1000, 4096, "fp16", {"BM": 128, "BN": 64, "BK": 64, "depth": 5, "groups": 1, "pingpong": 1}),
    (300, 500, 64, "fp16", {"BM": 64, "BN": 64, "BK": 64, "depth": 2, "groups": 1, "pingpong": 1}),  # one k-step
    (1, 151936, 3584, "fp16", {"BM": 64, "BN": 192, "BK": 64, "depth": 3, "groups": 1, "pingpong": 1}),
]


@pytest.mark.parametrize("M,N,K,dtype,tiling", PINGPONG_CASES)
def test_gemm_pingpong(M, N, K, dtype, tiling):
    """Ping-pong kernels against the float32 product (output poisoned with NaN), two fresh inputs each."""
    from codegen.harness import check_gemm
    r = check_gemm(M, N, K, dtype, tiling, trials=2)
    assert r["ok"], r


CLUSTER_CASES = [  # 2-CTA clusters, B multicast: an odd M-tile count (an empty partner), ragged K, ping-pong with
    # several tiles per CTA and odd N, cooperative warpgroups, a launched grid
    (320, 1000, 1000, "fp16", {"BM": 64, "BN": 128, "BK": 64, "depth": 4, "groups": 1, "cluster": 2}),
    (4095, 4097, 1024, "fp16", {"BM": 128, "BN": 128, "BK": 64, "depth": 4, "groups": 1, "pingpong": 1, "cluster": 2}),
    (2000, 3000, 520, "bf16", {"BM": 64, "BN": 256, "BK": 64, "depth": 4, "groups": 1, "pingpong": 1, "cluster": 2}),
    (1000, 1000, 1000, "bf16", {"BM": 128, "BN": 128, "BK": 64, "depth": 3, "groups": 2, "cluster": 2,
                                "persistent": 0}),
    (777, 520, 4104, "fp16", {"BM": 128, "BN": 64, "BK": 64, "depth": 4, "groups": 2, "cluster": 2}),
]


@pytest.mark.parametrize("M,N,K,dtype,tiling", CLUSTER_CASES)
def test_gemm_cluster(M, N, K, dtype, tiling):
    """Clustered kernels against the float32 product (output poisoned with NaN), two fresh inputs each: a protocol
    error (a slot refilled before the peer freed it, a partner that left early) shows as a wrong result or a hang."""
    from codegen.harness import check_gemm
    r = check_gemm(M, N, K, dtype, tiling, trials=2)
    assert r["ok"], r


TMA_STORE_CASES = [  # the TMA-store epilogue: ragged M and N (the copy engine clips), N = 8 mod 64, one and several
    # chunks, ping-pong with odd tile counts, a launched grid, M smaller than a warpgroup's rows, a cluster
    (4095, 4104, 1024, "fp16", {"BM": 128, "BN": 256, "BK": 64, "depth": 4, "groups": 2, "tma_store": 1}),
    (2000, 3000, 520, "bf16", {"BM": 128, "BN": 192, "BK": 64, "depth": 4, "groups": 1, "pingpong": 1,
                               "tma_store": 1}),
    (777, 1000, 4096, "fp16", {"BM": 128, "BN": 64, "BK": 64, "depth": 5, "groups": 2, "tma_store": 1}),
    (1000, 1000, 1000, "bf16", {"BM": 128, "BN": 128, "BK": 64, "depth": 3, "groups": 2, "persistent": 0,
                                "tma_store": 1}),
    (1, 151936, 3584, "fp16", {"BM": 64, "BN": 192, "BK": 64, "depth": 3, "groups": 1, "pingpong": 1,
                               "tma_store": 1}),
    (320, 1000, 1000, "fp16", {"BM": 64, "BN": 128, "BK": 64, "depth": 4, "groups": 1, "cluster": 2,
                               "tma_store": 1}),
]


@pytest.mark.parametrize("M,N,K,dtype,tiling", TMA_STORE_CASES)
def test_gemm_tma_store(M, N, K, dtype, tiling):
    """TMA-store kernels against the float32 product (output poisoned with NaN, so a chunk never stored or stored
    past the edge shows), two fresh inputs each; a slot rewritten before the copy engine read it shows as a wrong
    result too."""
    from codegen.harness import check_gemm
    r = check_gemm(M, N, K, dtype, tiling, trials=2)
    assert r["ok"], r


def test_gemm_without_turns():
    from codegen.cuda import emit
    from codegen.harness import check_gemm
    t = {"BM": 128, "BN": 256, "BK": 64, "depth": 4, "groups": 2}
    plan = dataclasses.replace(default_plan("gemm", {"M": 1000, "N": 1024, "K": 520, "dtype": "fp16"}, t), tc_order=[])
    assert emit(plan).info["tc_turns"] is None
    assert check_gemm(1000, 1024, 520, "fp16", t, plan, trials=1)["ok"]


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
    # head dims off the 64-column atom (padded tiles, zero-filled by TMA), and the wide ones
    (_fa(2, 8, 2, 1000, 1000, 96, False), T2, "fa3"),
    (_fa(2, 8, 2, 777, 1000, 96, True, "fp16"), T2 | {"persistent": 1}, "plain"),
    (_fa(1, 4, 4, 333, 333, 80, True), T2 | {"BN": 64}, "overlap"),
    (_fa(2, 8, 2, 1000, 1000, 192, False), T2 | {"BN": 64}, "fa3"),
    (_fa(2, 8, 8, 700, 1000, 192, True, "fp16"), T2 | {"BN": 64}, "plain"),
    (_fa(2, 8, 2, 1000, 1000, 256, False, "fp16"), T2 | {"BN": 64}, "fa3"),
    (_fa(1, 16, 2, 1000, 1000, 256, True), T2 | {"BN": 64, "persistent": 1}, "plain"),
    # tiny sequences: one key block, one query row
    (_fa(2, 4, 2, 1, 1, 128, False), T2, "fa3"),
    (_fa(2, 4, 2, 1, 1000, 128, True), T2, "plain"),
])
def test_attention(p, tiling, order):
    from codegen.harness import check_fa
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
    (_fa(2, 6, 3, 1000, 1000, 64, True, "fp16"), {"BM": 192, "BN": 64, "depth": 2, "groups": 3}, "g3"),
])
def test_attention_turns(p, tiling, which):
    """Enforced tc_order: correct results, no hang, for short and ragged trip counts and persistent CTAs."""
    from codegen.harness import check_fa
    base = {"cpsat": CPSAT, "greedy": GREEDY, "skewed": SKEWED}.get(which)
    if base is None:  # three warpgroups, interleaved turns
        plan = solver_plan(p, tiling, [FA3_ORDER] * 3,
                           ["mma_qk@0", "mma_qk@1", "mma_pv@0", "mma_qk@2", "mma_pv@1", "mma_pv@2"])
    else:
        plan = dataclasses.replace(base, params=p, tiling=tiling)
    r = check_fa(p, tiling, plan, trials=2, label=which)
    assert r["ok"], r


def _program(name: str):
    from ptsolve.result import Result
    return Result.from_json((SCHEDULES / f"{name}.json").read_text()).program


@pytest.mark.parametrize("name", ["FA3_cpsat", "FA3_greedy", "FA8c_cpsat", "GEMM1_cpsat", "GEMM1_greedy",
                                  "CS3_cpsat", "CS3_greedy@1cta", "ST3_cpsat", "ST3_cpsat@1cta"])
def test_solver_schedules(name):
    """The schedules the policies found, lowered from the programs (plan_from_program: orders, turn order, the
    copies the start times use), on a reduced shape (the same plan: only the sizes change)."""
    from codegen.harness import check_fa, check_gemm
    from codegen.harness import check_mamba as check
    plan = plan_from_program(_program(name), "h200")
    if plan.op == "flash_attention":
        p = _fa(1, 8, 2, 1000, 1000, plan.params["head_dim"], plan.params["causal"], plan.params["dtype"])
        r = check_fa(p, plan.tiling, dataclasses.replace(plan, params=p), trials=1, label=name)
        assert r["ok"], r
    elif plan.op == "gemm":
        p = {"M": 1000, "N": 768, "K": 1000, "dtype": plan.params.get("dtype", "fp16")}
        assert check_gemm(1000, 768, 1000, p["dtype"], plan.tiling, dataclasses.replace(plan, params=p))["ok"]
    else:
        small = dataclasses.replace(plan, params=plan.params | {"batch": 1, "heads": 8, "seq": 1000})
        err = check(small, trials=1, poison_tail=plan.op == "mamba2_chunk_state")
        assert err <= TOL, err


CB32 = {"cb_dtype": "fp32"}
CS_CASES = [
    # (params, tiling, overlap)
    (_ms(2, 1000, 8, 2, "fp16"), cs_tiling(2, 64), False),
    (_ms(2, 1000, 8, 2, "bf16"), cs_tiling(2, 32), True),
    (_ms(2, 1000, 8, 2, "fp16"), cs_tiling(1, 64, 3), True),
    (_ms(1, 512, 4, 1, "fp16"), cs_tiling(1, 32), False),
    (_ms(1, 512, 4, 1, "bf16"), cs_tiling(2, 64), True),
    (_ms(1, 512, 4, 1, "fp16"), cs_tiling(2, 128), False),
    (_ms(2, 1000, 8, 2, "bf16"), cs_tiling(1, 64, ctas=2), False),
    (_ms(1, 512, 4, 1, "fp16"), cs_tiling(1, 32, 3, ctas=3), True),
    (_ms(1, 700, 4, 1, "bf16", chunk=128, d_state=64), cs_tiling(2, 64), True),
    # CB read as float32 (cb_dtype "fp32": 32-column boxes, two per 64-column k-block, one per 32)
    (_ms(2, 1000, 8, 2, "bf16") | CB32, cs_tiling(1, 64, ctas=2), False),
    (_ms(2, 1000, 8, 2, "bf16") | CB32, cs_tiling(2, 32), True),
    (_ms(1, 512, 4, 1, "fp16") | CB32, cs_tiling(2, 128), False),
    (_ms(1, 700, 4, 1, "bf16", chunk=128, d_state=64) | CB32, cs_tiling(1, 64, 3), True),
]


@pytest.mark.parametrize("case", CS_CASES, ids=lambda c: f"{c[0]['batch']}x{c[0]['seq']}_h{c[0]['heads']}_"
                         f"g{c[0]['groups']}_q{c[0]['chunk']}_w{c[1]['groups']}_bk{c[1]['BK']}_c{c[1]['ctas']}"
                         f"{'_ov' if c[2] else ''}{'_cb32' if c[0].get('cb_dtype') else ''}")
def test_chunk_scan(case):
    from codegen.harness import check_mamba as check
    p, t, ov = case
    err = check(default_plan("mamba2_chunk_scan", p, t, ov), trials=2)
    assert err <= TOL, err  # NaN compares False: never passes


def test_chunk_scan_other_orders():
    from codegen.harness import check_mamba as check
    base = default_plan("mamba2_chunk_scan", _ms(2, 1000, 8, 2, "fp16"), cs_tiling(2, 64))
    late = dataclasses.replace(with_loop(base, [("decay", 0), ("mma", 1)]), copies={})  # the order needs two W
    lag = with_loop(base, [("mma", 1), ("decay", 0)], [("load_cb", 0), ("load_dA", 0), ("load_dt", 0), ("load_x", 1)])
    for plan in (late, dataclasses.replace(lag, copies={"w@0": 2, "w@1": 2})):
        err = check(plan, trials=1)
        assert err <= TOL, err


ST2 = {"BM": 128, "BK": 64, "depth": 3, "groups": 2}
ST_SHAPES = {
    "b2_l1000_h8_g2": _ms(2, 1000, 8, 2, "bf16"),  # ragged last chunk (232 of 256), grouped B
    "b1_l700_h4_g2_p128": _ms(1, 700, 4, 2, "bf16", head_dim=128),
    "b1_l300_h2_g1_short": _ms(1, 300, 2, 1, "bf16"),  # last chunk: 44 positions, a single loop step
    "b1_l500_h4_g1_q128_n64": _ms(1, 500, 4, 1, "bf16", chunk=128, d_state=64),
}
ST_PLANS = {
    "default_g2": lambda p: default_plan("mamba2_chunk_state", p, ST2),
    "overlap_g2": lambda p: default_plan("mamba2_chunk_state", p, ST2, overlap=True),
    "ahead_g2": lambda p: dataclasses.replace(with_loop(default_plan("mamba2_chunk_state", p, ST2),
                                                        [("scale", 0), ("mma", 1)]), copies={}),
    "overlap_g2_2cta": lambda p: default_plan("mamba2_chunk_state", p, ST2 | {"depth": 2, "ctas": 2}, overlap=True),
    "overlap_g1_bm64_bk32": lambda p: default_plan("mamba2_chunk_state", p,
                                                   {"BM": 64, "BK": 32, "depth": 2, "groups": 1}, overlap=True),
}


@pytest.mark.parametrize("shape", list(ST_SHAPES))
@pytest.mark.parametrize("plan", list(ST_PLANS))
def test_chunk_state(shape, plan):
    from codegen.harness import check_mamba as check
    p = ST_SHAPES[shape]
    if p["d_state"] < 128 and "g2" in plan:
        p = p | {"d_state": 128}
    if p["head_dim"] == 128 and "2cta" in plan:
        pytest.skip("head_dim 128 needs more registers than two CTAs per SM leave")
    err = check(ST_PLANS[plan](p), trials=2, poison_tail=True)
    assert err <= TOL, err  # NaN compares False: never passes


def test_attention_deterministic():
    """Same inputs twice give bitwise-equal outputs (a moving result would mean a race)."""
    import torch

    from codegen.harness import run_attention
    plan = fa3_order_plan(_fa(2, 8, 2, 1000, 1000, 128, True), T2)
    q = torch.randn(2, 1000, 8, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 1000, 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    o1 = run_attention(q, k, v, plan, out=torch.full_like(q, float("nan")))
    o2 = run_attention(q, k, v, plan, out=torch.full_like(q, float("nan")))
    torch.cuda.synchronize()
    assert torch.equal(o1, o2)


def test_wrong_shapes_raise():
    import torch

    from codegen.harness import run_chunk_scan, run_chunk_state, run_gemm, scan_inputs, state_inputs
    from ptsolve.errors import DeviceError
    plan = default_plan("gemm", {"M": 256, "N": 256, "K": 256, "dtype": "fp16"},
                        {"BM": 128, "BN": 128, "BK": 64, "depth": 2, "groups": 1})
    a = torch.randn(256, 128, device="cuda", dtype=torch.float16)
    with pytest.raises(DeviceError):
        run_gemm(a, a, plan)
    cs = default_plan("mamba2_chunk_scan", _ms(1, 512, 4, 1, "fp16"), cs_tiling(1, 64))
    inp = scan_inputs(cs.params)
    with pytest.raises(DeviceError):
        run_chunk_scan(**dict(inp, x=inp["x"][:, :256].contiguous()), plan=cs)
    out = run_chunk_scan(**dict(inp, states=inp["states"].float()), plan=cs)  # float32 states are converted
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()
    st = default_plan("mamba2_chunk_state", _ms(1, 512, 4, 1, "bf16"), ST2)
    x, bm, dt, da = state_inputs(st.params).values()
    for bad in ((x[:, :256], bm, dt, da), (x.half(), bm, dt, da), (x, bm, dt.double(), da)):
        with pytest.raises(DeviceError):
            run_chunk_state(*bad, st)


def test_mamba_compare_runs():
    """baselines.mamba2.compare times our kernels (and Triton's where mamba_ssm imports) and checks the outputs."""
    from baselines.mamba2 import compare
    p = _ms(2, 1000, 8, 2, "bf16")
    r = compare({"ov": default_plan("mamba2_chunk_state", p, ST2, overlap=True),
                 "plain": default_plan("mamba2_chunk_state", p, ST2)}, nsets=1)
    assert all(e <= TOL for e in r["rel_err_last_batch"].values()), r
    if not r["triton_error"]:
        assert all(e <= TOL for e in r["rel_err_vs_triton"].values()), r
    assert all(0 < ms < 100 for ms in r["ms"].values()), r


def test_profile_measures_every_role():
    """The instrumented build on the GPU: events for the producer and each consumer, a positive II and span, the
    plain kernel timed beside it (codegen.profile.measure, what `ptsolve profile` runs)."""
    from codegen.profile import measure

    plan = default_plan("gemm", {"M": 2048, "N": 2048, "K": 2048, "dtype": "fp16"},
                        {"BM": 128, "BN": 256, "BK": 64, "depth": 4, "groups": 2})
    prof, words = measure(plan, "h200")
    roles = {e.role for e in prof.events}
    assert {"producer", "wg0", "wg1"} <= roles, roles
    assert prof.ii > 0 and prof.span > prof.ii and prof.kernel_us > 0 and prof.instrumented_us > 0
    assert all(e.t2 >= e.t1 >= e.t0 for e in prof.events)
    assert words.any()


def test_tune_runner_times_candidates():
    """codegen.tune_runner: each candidate is checked on a reduced shape, then all are timed in one process."""
    from codegen import tune_runner

    p = _fa(2, 16, 4, 1024, 1024, 128, True)
    good = fa3_order_plan(p, T2)
    other = default_plan("flash_attention", p, {"BM": 128, "BN": 128, "depth": 3, "groups": 2})
    us = tune_runner.time_plans([good, other])
    assert all(0 < u < 1e4 for u in us), us


@pytest.mark.parametrize("name", ["FA3c_cpsat-orders", "FA17c_cpsat-orders", "FA13c_cpsat-orders_p",
                                  "FA3c_cpsat_first"])
def test_cpsat_orders_schedule(name):
    """The FA3 order as the exact solver returns it (policy cpsat-orders, from `python -m bench orders_ab`), lowered
    through plan_from_program (warpgroup 1 rotated back to warpgroup 0's start), and the solver's persistent first
    choice, on reduced causal shapes (persistent: more tiles than SMs, so each CTA deals itself several)."""
    from codegen.harness import check_fa
    from ptsolve.result import Result
    prog = Result.from_json((SCHEDULES.parent / "orders_ab" / f"{name}.json").read_text()).program
    plan = plan_from_program(prog, "h200")
    if "orders" in name:
        assert [t for t, _ in plan.order["loop"]["wg1"]][:2] == ["mma_qk@1", "mma_pv@1"]
    b, h = (4, 16) if plan.tiling.get("persistent") else (1, 8)
    p = _fa(b, h, 2, 1000, 1000, plan.params["head_dim"], plan.params["causal"], plan.params["dtype"])
    r = check_fa(p, plan.tiling, dataclasses.replace(plan, params=p), trials=1, label=name)
    assert r["ok"], r
