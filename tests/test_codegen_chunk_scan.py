"""Tests of the Mamba2 ChunkScan emitter (``codegen.cuda.chunk_scan``).

CPU (need nvcc, skip cleanly without): several plans compile for sm_90a with 0 spills and shared memory within
227 KB, the PTX holds wgmma and TMA, different loop orders give different sources, bad plans raise
CodegenError. GPU (``pytest -m gpu tests/test_codegen_chunk_scan.py`` on an H100/H200): the kernel against a
float32 torch reference of the ChunkScan formula on fresh random inputs, output poisoned with NaN (relative
Frobenius error <= 1e-2; NaN never passes); ``codegen.mamba.compare`` times it.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from hopper import require_hopper

from codegen.cuda.chunk_scan import default_chunk_scan_plan, emit_chunk_scan
from codegen.plan import KernelPlan
from ptsolve.errors import CodegenError

TOL = 1e-2


def params(batch: int = 2, seq: int = 1000, heads: int = 8, groups: int = 2, dtype: str = "fp16",
           d_state: int = 128, chunk: int = 256) -> dict[str, Any]:
    return {"batch": batch, "seq": seq, "heads": heads, "head_dim": 64, "d_state": d_state, "chunk": chunk,
            "groups": groups, "dtype": dtype}


def tiling(W: int, BK: int, depth: int = 2, ctas: int = 1) -> dict[str, int]:
    return {"BM": 64 * W, "BK": BK, "depth": depth, "groups": W, "ctas": ctas}


def with_loop(plan: KernelPlan, wg_loop: list[tuple[str, int]], producer: list[tuple[str, int]] | None = None
              ) -> KernelPlan:
    """``plan`` with every consumer's loop replaced by ``wg_loop`` ([(task base, stage)]) and optionally the
    producer's loop."""
    loop = {"producer": producer or plan.order["loop"]["producer"]}
    loop |= {f"wg{g}": [(f"{t}@{g}", s) for t, s in wg_loop] for g in range(plan.groups)}
    return KernelPlan(plan.op, plan.params, plan.tiling, {**plan.order, "loop": loop}, list(plan.tc_order))


# the mma one stage behind decay, issued after it (serialised, but a legal order)
LATE_MMA = [("decay", 0), ("mma", 1)]
# the producer loads x one iteration later than CB/dA/dt (a producer prologue and epilogue)
LAG_X = [("load_cb", 0), ("load_dA", 0), ("load_dt", 0), ("load_x", 1)]

PLANS = {
    "g2_bk64": default_chunk_scan_plan(params(), tiling(2, 64)),
    "g1_bk32": default_chunk_scan_plan(params(groups=1, heads=4), tiling(1, 32)),
    "g2_bk32_overlap": default_chunk_scan_plan(params(dtype="bf16"), tiling(2, 32), overlap=True),
    "g1_bk64_overlap_d3": default_chunk_scan_plan(params(), tiling(1, 64, 3), overlap=True),
    "g2_bk64_late": with_loop(default_chunk_scan_plan(params(), tiling(2, 64)), LATE_MMA),
    "g2_bk64_lagx_overlap": with_loop(default_chunk_scan_plan(params(), tiling(2, 64)), [("mma", 1), ("decay", 0)],
                                      LAG_X),
    "g2_bk128": default_chunk_scan_plan(params(), tiling(2, 128)),
    # several CTAs per SM (no setmaxnreg; the register file split evenly)
    "g1_bk64_c2": default_chunk_scan_plan(params(), tiling(1, 64, ctas=2)),
    "g1_bk32_c3_overlap": default_chunk_scan_plan(params(), tiling(1, 32, 3, ctas=3), overlap=True),
}


def _have_nvcc() -> bool:
    return bool(shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc") or os.environ.get("NVCC"))


@pytest.fixture(scope="module")
def compiled() -> dict[str, Any]:
    if not _have_nvcc():
        pytest.skip("nvcc not available")
    from codegen.runtime import compile_kernel, ptx_text

    def one(name: str) -> tuple[str, Any, str]:
        ks = emit_chunk_scan(PLANS[name])
        return name, compile_kernel(ks, cache=False), ptx_text(ks)

    with ThreadPoolExecutor(max_workers=max(2, min(8, os.cpu_count() or 2))) as ex:
        return {n: (c, ptx) for n, c, ptx in ex.map(one, PLANS)}


@pytest.mark.parametrize("name", list(PLANS))
def test_compiles_without_spills(compiled: dict[str, Any], name: str) -> None:
    from codegen.cuda.common import SMEM_LIMIT
    c, _ = compiled[name]
    rep = c.report
    assert rep["spill_stores"] == 0 and rep["spill_loads"] == 0, rep
    assert c.kernel.smem_bytes <= SMEM_LIMIT
    assert not rep["wgmma_serialized"], rep["warnings"]


@pytest.mark.parametrize("name", list(PLANS))
def test_ptx_has_wgmma_and_tma(compiled: dict[str, Any], name: str) -> None:
    c, ptx = compiled[name]
    needles = ["wgmma.mma_async", "cp.async.bulk.tensor", "mbarrier.try_wait", "fence.proxy.async.shared::cta"]
    assert "&tm_dt, &w_full" in c.kernel.source  # dA / dt slices by TMA, not a raw bulk copy
    needles += ["setmaxnreg"] if c.kernel.info["tiling"]["ctas"] == 1 else []
    for needle in needles:
        assert needle in ptx, needle


def test_orders_give_different_sources() -> None:
    base = default_chunk_scan_plan(params(), tiling(2, 64))
    srcs = {emit_chunk_scan(p).source for p in (
        base, default_chunk_scan_plan(params(), tiling(2, 64), overlap=True), with_loop(base, LATE_MMA),
        with_loop(base, [("decay", 0), ("mma", 0)], [("load_x", 0), ("load_dt", 0), ("load_dA", 0), ("load_cb", 0)]))}
    assert len(srcs) == 4
    ks = emit_chunk_scan(default_chunk_scan_plan(params(), tiling(2, 64), overlap=True))
    assert ks.info["w_buffers"] == [2, 2]
    assert emit_chunk_scan(base).info["w_buffers"] == [1, 1]


def _bad(plan: KernelPlan, **kw: Any) -> KernelPlan:
    return KernelPlan(kw.get("op", plan.op), kw.get("params", plan.params), kw.get("tiling", plan.tiling),
                      kw.get("order", plan.order), kw.get("tc_order", list(plan.tc_order)))


def test_bad_plans_raise() -> None:
    base = default_chunk_scan_plan(params(), tiling(2, 64))
    order = base.order
    cases = [
        _bad(base, op="gemm"),
        _bad(base, params=params() | {"head_dim": 128}),
        _bad(base, params=params() | {"evil": "x\"; system(\"rm"}),
        _bad(base, params=params(heads=6, groups=4)),
        _bad(base, params=params() | {"dtype": "fp32"}),
        _bad(base, tiling=tiling(2, 48)),
        _bad(base, tiling={"BM": 128, "BK": 64, "depth": 2, "groups": 1}),  # 128 rows on one warpgroup
        _bad(base, tiling=tiling(2, 64, 1)),
        _bad(base, tiling=tiling(2, 64) | {"groups": 3, "BM": 192}),
        _bad(base, tiling=tiling(2, 64) | {"depth": "2"}),
        _bad(base, tiling=tiling(2, 64, ctas=2)),  # two consumer warpgroups in half the register file
        _bad(base, tiling=tiling(1, 128, ctas=3)),  # 3 x 100 KB of shared memory
        _bad(base, tiling=tiling(2, 64) | {"BN": 64}),
        _bad(base, order={**order, "loop": {**order["loop"], "wg0": [("decay@0", 0), ("bogus@0", 0)]}}),
        _bad(base, order={**order, "loop": {**order["loop"], "wg0": [("decay@1", 0), ("mma@0", 0)]}}),
        _bad(base, order={**order, "loop": {**order["loop"], "wg2": [("decay@2", 0), ("mma@2", 0)]}}),
        _bad(base, order={**order, "loop": {**order["loop"], "producer": [("load_cb", 0), ("load_x", 0)]}}),
        _bad(base, order={**order, "loop": {**order["loop"], "wg0": [("decay@0", 0), ("mma@0", 4)]}}),
        _bad(base, order={**order, "pre": {**order["pre"], "wg1": [("scale_state@1", 0), ("mma_state@1", 0)]}}),
        _bad(base, tc_order=["mma_qk@0"]),
        with_loop(base, [("mma", 0), ("decay", 0)]),  # mma before the decay it consumes
        # deadlocks (simulated): load_x of q waits for the slot of q-2, freed by mma(q-1), which needs the CB of q-1,
        # loaded one producer iteration later
        with_loop(base, [("decay", 0), ("mma", 0)], [("load_x", 0), ("load_cb", 1), ("load_dA", 1), ("load_dt", 1)]),
        # load_x first at depth 2 with the late mma: mma(q-1) comes after decay(q), which needs the CB of q
        with_loop(base, LATE_MMA, [("load_x", 0), ("load_cb", 0), ("load_dA", 0), ("load_dt", 0)]),
    ]
    for plan in cases:
        with pytest.raises(CodegenError):
            emit_chunk_scan(plan)
    with pytest.raises(CodegenError):
        emit_chunk_scan("not a plan")  # type: ignore[arg-type]


def test_plan_json_roundtrip_emits_same_kernel() -> None:
    p = default_chunk_scan_plan(params(), tiling(2, 32), overlap=True)
    assert emit_chunk_scan(KernelPlan.from_json(p.to_json())).source == emit_chunk_scan(p).source


# ------------------------------------------------------------------------------------------------ GPU


_gpu = require_hopper


def check_chunk_scan(batch: int, seq: int, heads: int, ngroups: int, dtype: str, t: dict[str, int],
                     overlap: bool = False, plan: KernelPlan | None = None, trials: int = 2) -> float:
    """Worst relative Frobenius error of our kernel over ``trials`` fresh inputs (NaN if any NaN/Inf)."""
    from codegen.mamba import check
    p = params(batch, seq, heads, ngroups, dtype)
    return check(dataclasses.replace(plan, params=p) if plan else default_chunk_scan_plan(p, t, overlap), trials)


GPU_CASES = [
    # (batch, seq, heads, ngroups, dtype, tiling, overlap)
    (2, 1000, 8, 2, "fp16", tiling(2, 64), False),
    (2, 1000, 8, 2, "bf16", tiling(2, 32), True),
    (2, 1000, 8, 2, "fp16", tiling(1, 64, 3), True),
    (1, 512, 4, 1, "fp16", tiling(1, 32), False),
    (1, 512, 4, 1, "bf16", tiling(2, 64), True),
    (1, 512, 4, 1, "fp16", tiling(2, 128), False),
    (2, 1000, 8, 2, "bf16", tiling(1, 64, ctas=2), False),
    (1, 512, 4, 1, "fp16", tiling(1, 32, 3, ctas=3), True),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: f"b{c[0]}_l{c[1]}_h{c[2]}_g{c[3]}_{c[4]}_w{c[5]['groups']}"
                         f"_bk{c[5]['BK']}_d{c[5]['depth']}_c{c[5]['ctas']}{'_ov' if c[6] else ''}")
def test_chunk_scan_matches_reference(case: tuple) -> None:
    _gpu()
    err = check_chunk_scan(*case)
    assert err <= TOL, err  # NaN compares False: never passes


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["g2_bk64_late", "g2_bk64_lagx_overlap"])
def test_chunk_scan_other_orders(name: str) -> None:
    _gpu()
    err = check_chunk_scan(2, 1000, 8, 2, "fp16", tiling(2, 64), plan=PLANS[name])
    assert err <= TOL, err


@pytest.mark.gpu
def test_reference_detects_nan_and_shape_errors() -> None:
    """The poisoned output is really overwritten (not NaN-passing) and wrong shapes raise DeviceError."""
    torch = _gpu()
    from codegen.cuda.chunk_scan import run_chunk_scan
    from codegen.mamba import scan_inputs
    from ptsolve.errors import DeviceError
    plan = default_chunk_scan_plan(params(1, 512, 4, 1), tiling(1, 64))
    inp = scan_inputs(plan.params)
    bad = dict(inp, x=inp["x"][:, :256].contiguous())
    with pytest.raises(DeviceError):
        run_chunk_scan(**bad, plan=plan)
    # float32 states are accepted and converted (the official state passing may return float32)
    out = run_chunk_scan(**dict(inp, states=inp["states"].float()), plan=plan)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()


@pytest.mark.gpu
def test_bench_chunk_scan_runs() -> None:
    _gpu()
    from codegen.mamba import compare
    plans = {"w2_bk64": default_chunk_scan_plan(params(1, 2048, 8, 1), tiling(2, 64)),
             "w1_bk64_c2": default_chunk_scan_plan(params(1, 2048, 8, 1), tiling(1, 64, ctas=2))}
    r = compare(plans, triton=False)
    assert set(r["ms"]) == set(plans) and all(0 < ms < 100 for ms in r["ms"].values()), r


def test_index_limits() -> None:
    """The paper's largest shape (batch 64, seq 16k: x has 2^32 elements) emits, since x, C and the output are
    addressed by TMA coordinates and 64-bit offsets; a shape whose dt row index passes 2^31 raises."""
    big = params(64, 16384, 64, 1)
    assert emit_chunk_scan(default_chunk_scan_plan(big, tiling(2, 64))).grid == (2, 64, 64 * 64)
    with pytest.raises(CodegenError, match="32-bit"):
        emit_chunk_scan(default_chunk_scan_plan(params(2048, 1 << 20, 8, 1), tiling(2, 64)))


def test_plan_copies_limit_fragment_buffers() -> None:
    """An order with mma a stage behind decay gets two W fragment buffers, unless the program was scheduled
    with one (its register budget): then one, and decay waits for the previous mma (wgmma.wait_group 0)."""
    base = default_chunk_scan_plan(params(), tiling(1, 64, ctas=3))
    late = with_loop(base, [("mma", 1), ("decay", 0)])
    assert emit_chunk_scan(late).info["w_buffers"] == [2]
    one = dataclasses.replace(late, copies={"w@0": 1})
    ks = emit_chunk_scan(one)
    assert ks.info["w_buffers"] == [1] and "wg_wait<0>();  // the mma that last read this fragment buffer" in ks.source
    assert KernelPlan.from_json(one.to_json()) == one
    with pytest.raises(CodegenError, match="copies"):
        emit_chunk_scan(dataclasses.replace(late, copies={"w@0": 3}))
