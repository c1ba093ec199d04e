"""Mamba2 ChunkState code generator (codegen.cuda.chunk_state).

CPU (needs nvcc, skips without): representative plans compile for sm_90a with 0 spills and shared memory within
227 KB, the PTX holds wgmma and TMA, the number of xs buffers follows the order, different orders give different
sources, and bad plans raise CodegenError.
GPU (``pytest -m gpu``, an H100/H200): relative Frobenius error <= 1e-2 against a float64 torch reference of
states[b,c,h,p,n] = sum_l x[b,l,h,p] B[b,l,g(h),n] exp(dA[b,h,c,Q-1] - dA[b,h,c,l]) dt[b,h,c,l] on fresh random
inputs, the output poisoned with NaN before the run (NaN never passes), ragged last chunks, grouped B.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest
from hopper import require_hopper

from codegen.cuda.chunk_state import default_chunk_state_plan, emit_chunk_state
from codegen.cuda.common import SMEM_LIMIT
from codegen.plan import KernelPlan
from ptsolve.errors import CodegenError

P = {"batch": 2, "seq": 1000, "heads": 8, "head_dim": 64, "d_state": 128, "chunk": 256, "groups": 2,
     "dtype": "bf16"}
T2 = {"BM": 128, "BK": 64, "depth": 3, "groups": 2}


def with_loop(plan: KernelPlan, wg_loop: list[tuple[str, int]]) -> KernelPlan:
    """``plan`` with every consumer warpgroup's loop replaced by ``wg_loop`` (task bases, stages)."""
    loop = {"producer": plan.order["loop"]["producer"]}
    loop |= {f"wg{g}": [(f"{t}@{g}", s) for t, s in wg_loop] for g in range(plan.groups)}
    return dataclasses.replace(plan, order={**plan.order, "loop": loop})


def ahead(params, tiling):
    """The scale issued a full step ahead of the mma: (scale it, mma it-1) per emitted iteration."""
    return with_loop(default_chunk_state_plan(params, tiling), [("scale", 0), ("mma", 1)])


def producer_order(plan: KernelPlan, loads: list[tuple[str, int]]) -> KernelPlan:
    loop = {**plan.order["loop"], "producer": loads}
    return dataclasses.replace(plan, order={**plan.order, "loop": loop})


PLANS = {
    "g2_bk64_d3": default_chunk_state_plan(P, T2),
    "g2_bk64_d3_overlap": default_chunk_state_plan(P, T2, overlap=True),
    "g2_bk64_d3_ahead": ahead(P, T2),
    "g1_bk32_d2_overlap": default_chunk_state_plan(P, {"BM": 64, "BK": 32, "depth": 2, "groups": 1}, overlap=True),
    "g1_bm128_bk64_d2": default_chunk_state_plan(P | {"dtype": "fp16"}, {"BM": 128, "BK": 64, "depth": 2,
                                                                          "groups": 1}),
    "g2_bk32_d2_fp16": default_chunk_state_plan(P | {"dtype": "fp16"}, {"BM": 128, "BK": 32, "depth": 2,
                                                                         "groups": 2}, overlap=True),
    "g2_bk64_d3_p128": default_chunk_state_plan(P | {"head_dim": 128}, T2, overlap=True),
    # what codegen.plan.plan_from_program makes of ptsolve's greedy / CP-SAT schedule (H200, ST0 shape)
    "solver": producer_order(with_loop(default_chunk_state_plan(P, T2), [("scale", 1), ("mma", 1)]),
                             [("load_dA", 0), ("load_dt", 0), ("load_x", 0), ("load_b", 0)]),
    # the two warpgroups follow different orders (2 and 1 xs buffers): their xs regions must not overlap
    "mixed_groups": dataclasses.replace(default_chunk_state_plan(P, T2), order={
        **default_chunk_state_plan(P, T2).order,
        "loop": {**default_chunk_state_plan(P, T2).order["loop"],
                 "wg0": [("mma@0", 1), ("scale@0", 0)], "wg1": [("scale@1", 0), ("mma@1", 0)]}}),
    "g2_2cta_overlap": default_chunk_state_plan(P, T2 | {"depth": 2, "ctas": 2}, overlap=True),
    "g1_2cta_bk32_d3": default_chunk_state_plan(P, {"BM": 128, "BK": 32, "depth": 3, "groups": 1, "ctas": 2}),
    "producer_reordered": producer_order(default_chunk_state_plan(P, T2),
                                         [("load_dt", 0), ("load_dA", 0), ("load_x", 0), ("load_b", 1)]),
}


def _have_nvcc() -> bool:
    return bool(os.environ.get("NVCC") or shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc"))


needs_nvcc = pytest.mark.skipif(not _have_nvcc(), reason="nvcc not found")


@pytest.fixture(scope="module")
def compiled():
    from codegen.runtime import compile_kernel
    with ThreadPoolExecutor(max_workers=max(2, min(8, os.cpu_count() or 2))) as ex:
        res = dict(zip(PLANS, ex.map(lambda p: compile_kernel(emit_chunk_state(p)), PLANS.values())))
    return res


@needs_nvcc
@pytest.mark.parametrize("name", list(PLANS))
def test_compiles_without_spills(compiled, name):
    c = compiled[name]
    r = c.report
    assert r["spill_stores"] == 0 and r["spill_loads"] == 0, r
    assert r["stack_bytes"] == 0, r
    assert not r["wgmma_serialized"], r["warnings"]
    assert c.kernel.smem_bytes + r["smem_static"] <= SMEM_LIMIT
    assert 0 < r["registers"] <= 255


@needs_nvcc
@pytest.mark.parametrize("name", ["g2_bk64_d3_overlap", "g1_bk32_d2_overlap"])
def test_ptx_has_wgmma_and_tma(compiled, name):
    from codegen.runtime import ptx_text
    ptx = ptx_text(compiled[name].kernel)
    assert "wgmma.mma_async" in ptx
    assert "cp.async.bulk.tensor" in ptx
    assert "cp.async.bulk.tensor.2d" in ptx  # dA / dt slices of the loop (x and B tiles are 4-D)
    assert "cp.async.bulk.shared::cluster.global" in ptx  # the chunk's last dA, once
    assert "fence.proxy.async.shared::cta" in ptx
    assert "setmaxnreg" in ptx and "mbarrier" in ptx


def test_xs_buffers_follow_the_order():
    assert emit_chunk_state(PLANS["g2_bk64_d3"]).info["xs_buffers"] == [1, 1]
    assert emit_chunk_state(PLANS["g2_bk64_d3_overlap"]).info["xs_buffers"] == [2, 2]
    assert emit_chunk_state(PLANS["g2_bk64_d3_ahead"]).info["xs_buffers"] == [3, 3]
    src = emit_chunk_state(PLANS["mixed_groups"]).source
    assert "smem + XS_OFF + 0 * X_BYTES" in src and "smem + XS_OFF + 2 * X_BYTES" in src


def test_orders_change_the_source():
    srcs = {n: emit_chunk_state(p).source for n, p in PLANS.items()}
    # the solver's plan shifts to the default order (same stages relative to each other) but loads differ
    assert len(set(srcs.values())) == len(srcs)
    # the producer's issue order is the plan's
    src = srcs["producer_reordered"]
    prod = src[src.index("setmaxnreg.dec"):src.index("setmaxnreg.inc")]
    i_dt, i_da = prod.index("DT_OFF"), prod.index("DA_OFF")
    assert i_dt < i_da < prod.index("tm_x") < prod.index("tm_b")


@pytest.mark.parametrize("name", list(PLANS))
def test_smem_layout_alignment(name):
    """128B-swizzled tiles at 1024-byte offsets, bulk-copy destinations (dA, dt, dA_last) at 16-byte ones."""
    from codegen.cuda.chunk_state import _layout
    plan = PLANS[name]
    ks = emit_chunk_state(plan)
    lay = _layout(ks.params, ks.info["tiling"], max(ks.info["xs_buffers"]))
    for k in ("x_off", "stage", "xs_off", "bar_off", "x_bytes", "b_bytes"):
        assert lay[k] % 1024 == 0, (k, lay)
    for k in ("da_off", "dt_off", "dal_off"):
        assert lay[k] % 16 == 0, (k, lay)
    assert lay["dal_off"] >= lay["bar_off"] + (2 * plan.tiling["depth"] + 1) * 8
    assert ks.smem_bytes == lay["total"]


def test_two_ctas_per_sm_drop_setmaxnreg():
    src1 = emit_chunk_state(PLANS["g2_bk64_d3_overlap"]).source
    src2 = emit_chunk_state(PLANS["g2_2cta_overlap"]).source
    assert "setmaxnreg" in src1 and "__launch_bounds__(384, 1)" in src1
    assert "setmaxnreg" not in src2.split("extern")[-1] and "__launch_bounds__(384, 2)" in src2


def test_launch_metadata():
    ks = emit_chunk_state(PLANS["g2_bk64_d3"])
    assert ks.grid == (4 * 8, 1, 2)  # nchunks * heads, d_state blocks, batch
    assert ks.block == (384, 1, 1)
    assert ks.args == ("tmap:x", "tmap:b", "tmap:dt", "tmap:da", "ptr:da", "ptr:out")
    assert {m.tensor: m.box for m in ks.tensor_maps} == {"x": (64, 1, 64, 1), "b": (64, 1, 64, 1), "dt": (64, 1),
                                                          "da": (64, 1)}
    assert {m.tensor: m.dims for m in ks.tensor_maps if m.dtype == "fp32"} == {"dt": (256, 2 * 8 * 4),
                                                                               "da": (256, 2 * 8 * 4)}


def _bad(**kw):
    plan = kw.pop("plan", None) or default_chunk_state_plan(kw.pop("params", P), kw.pop("tiling", T2))
    return dataclasses.replace(plan, **kw)


BAD = {
    "wrong op": lambda: _bad(op="gemm"),
    "head_dim 96": lambda: _bad(params=P | {"head_dim": 96}),
    "d_state not multiple of BM": lambda: _bad(params=P | {"d_state": 192}),
    "BK not dividing chunk": lambda: _bad(tiling=T2 | {"BK": 48}),
    "three groups": lambda: _bad(tiling={"BM": 192, "BK": 64, "depth": 3, "groups": 3}),
    "rows per group 32": lambda: _bad(tiling=T2 | {"BM": 64}),
    "bad dtype": lambda: _bad(params=P | {"dtype": "fp8"}),
    "heads not multiple of groups": lambda: _bad(params=P | {"groups": 3}),
    "unknown param": lambda: _bad(params=P | {"foo": 1}),
    "unknown task": lambda: with_loop(default_chunk_state_plan(P, T2), [("scale", 0), ("mma", 0), ("exp2", 0)]),
    "missing task": lambda: with_loop(default_chunk_state_plan(P, T2), [("mma", 0)]),
    "mma before scale": lambda: with_loop(default_chunk_state_plan(P, T2), [("mma", 0), ("scale", 0)]),
    "stage 4": lambda: with_loop(default_chunk_state_plan(P, T2), [("scale", 0), ("mma", 4)]),
    "too many xs buffers": lambda: with_loop(default_chunk_state_plan(P, T2 | {"depth": 4}),
                                             [("scale", 0), ("mma", 2)]),
    "ring deadlock": lambda: ahead(P, T2 | {"depth": 2}),
    "producer deadlock": lambda: producer_order(default_chunk_state_plan(P, T2 | {"depth": 2}),
                                                [("load_dt", 0), ("load_dA", 0), ("load_x", 0), ("load_b", 1)]),
    "unknown role": lambda: _bad(order={**default_chunk_state_plan(P, T2).order,
                                        "loop": {**default_chunk_state_plan(P, T2).order["loop"], "wg7": []}}),
    "other group's task": lambda: _bad(order={**default_chunk_state_plan(P, T2).order, "post": {
        "wg0": [("store@1", 0)], "wg1": [("store@1", 0)]}}),
    "smem": lambda: _bad(params=P | {"head_dim": 128, "d_state": 256},
                         tiling={"BM": 256, "BK": 128, "depth": 4, "groups": 2}),
    "tc_order": lambda: _bad(tc_order=["mma_qk@0"]),
    "ctas 3": lambda: _bad(tiling=T2 | {"ctas": 3}),
    "2 ctas: registers": lambda: _bad(params=P | {"head_dim": 128}, tiling=T2 | {"ctas": 2}),
    "2 ctas: smem": lambda: _bad(tiling={"BM": 128, "BK": 128, "depth": 3, "groups": 2, "ctas": 2}),
    "unknown tiling key": lambda: _bad(tiling=T2 | {"BN": 64}),
    "not a plan": lambda: {"op": "mamba2_chunk_state"},
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_plans_raise(case):
    with pytest.raises(CodegenError):
        emit_chunk_state(BAD[case]())


# ---------------------------------------------------------------------------------------------------- GPU


def _params(batch, seq, heads, ngroups, headdim, dstate, chunk, dtype):
    return {"batch": batch, "seq": seq, "heads": heads, "head_dim": headdim, "d_state": dstate, "chunk": chunk,
            "groups": ngroups, "dtype": dtype}


SHAPES = {
    "b2_l1000_h8_g2": (2, 1000, 8, 2, 64, 128, 256),   # ragged last chunk (232 of 256), grouped B
    "b1_l512_h4_g1": (1, 512, 4, 1, 64, 128, 256),
    "b1_l700_h4_g2_p128": (1, 700, 4, 2, 128, 128, 256),
    "b1_l300_h2_g1_short": (1, 300, 2, 1, 64, 128, 256),  # last chunk: 44 positions, a single loop step
}
GPU_PLANS = {
    "default_g2": lambda p: default_chunk_state_plan(p, T2),
    "overlap_g2": lambda p: default_chunk_state_plan(p, T2, overlap=True),
    "ahead_g2": lambda p: ahead(p, T2),
    "mixed_g2": lambda p: dataclasses.replace(PLANS["mixed_groups"], params=p),
    "overlap_g2_2cta": lambda p: default_chunk_state_plan(p, T2 | {"depth": 2, "ctas": 2}, overlap=True),
    "solver_g2": lambda p: dataclasses.replace(PLANS["solver"], params=p),
    "overlap_g1_bm64_bk32": lambda p: default_chunk_state_plan(p, {"BM": 64, "BK": 32, "depth": 2, "groups": 1},
                                                               overlap=True),
}


def _check(shape, plan_fn, dtype, poison_tail=False, trials=2):
    from codegen.mamba import check
    err = check(plan_fn(_params(*shape, dtype)), trials, poison_tail)
    assert err <= 1e-2, f"rel err {err}"  # NaN compares False: never passes


_gpu_ok = require_hopper


@pytest.mark.gpu
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("plan", list(GPU_PLANS))
def test_gpu_matches_reference(shape, plan):
    if SHAPES[shape][4] == 128 and "2cta" in plan:
        pytest.skip("head_dim 128 needs more registers than two CTAs per SM leave (CodegenError by design)")
    _gpu_ok()
    _check(SHAPES[shape], GPU_PLANS[plan], "bf16")


@pytest.mark.gpu
@pytest.mark.parametrize("plan", ["default_g2", "overlap_g1_bm64_bk32"])
def test_gpu_fp16(plan):
    _gpu_ok()
    _check(SHAPES["b2_l1000_h8_g2"], GPU_PLANS[plan], "fp16")


@pytest.mark.gpu
def test_gpu_garbage_past_seq_is_masked():
    _gpu_ok()
    _check(SHAPES["b2_l1000_h8_g2"], GPU_PLANS["overlap_g2"], "bf16", poison_tail=True)


@pytest.mark.gpu
def test_gpu_shape_errors():
    _gpu_ok()
    import torch

    from codegen.cuda.chunk_state import run_chunk_state
    from ptsolve.errors import DeviceError
    shape = SHAPES["b1_l512_h4_g1"]
    from codegen.mamba import state_inputs
    plan = default_chunk_state_plan(_params(*shape, "bf16"), T2)
    x, bm, dt, da = state_inputs(plan.params).values()
    with pytest.raises(DeviceError):
        run_chunk_state(x[:, :256], bm, dt, da, plan)
    with pytest.raises(DeviceError):
        run_chunk_state(x.half(), bm, dt, da, plan)
    with pytest.raises(DeviceError):
        run_chunk_state(x, bm, dt.double(), da, plan)
    with pytest.raises(DeviceError):
        run_chunk_state(x, bm, dt, da, plan, out=torch.empty(1, device="cuda"))


@pytest.mark.gpu
def test_gpu_bench_runs():
    _gpu_ok()
    from codegen.cuda.chunk_state import bench_chunk_state
    ms = bench_chunk_state(1, 2048, nheads=8)
    assert 0 < ms < 100


@pytest.mark.gpu
def test_gpu_matches_triton():
    """Same inputs through mamba_ssm's Triton _chunk_state_fwd (skipped where it does not import)."""
    _gpu_ok()
    from codegen.cuda.chunk_state import compare_chunk_state
    r = compare_chunk_state(2, 1000, nheads=8, ngroups=2, nsets=1)
    if r["triton_error"]:
        pytest.skip(f"mamba_ssm Triton kernels unavailable: {r['triton_error']}")
    errs = r["rel_err_vs_triton"]
    assert errs and all(e <= 1e-2 for e in errs.values()), r  # NaN compares False: never passes
    assert all(ms > 0 for ms in r["ms"].values()) and "triton" in r["ms"], r


def test_runner_rejects_host_tensors():
    torch = pytest.importorskip("torch")
    from codegen.cuda.chunk_state import run_chunk_state
    from ptsolve.errors import DeviceError
    x = torch.zeros(2, 1000, 8, 64, dtype=torch.bfloat16)
    with pytest.raises(DeviceError, match="CUDA"):
        run_chunk_state(x, x, x, x, PLANS["g2_bk64_d3"])


def test_index_limits():
    """batch 64, seq 16k (x of 2^32 elements) emits; a dt / dA_cumsum of 2^31 elements raises."""
    big = {**P, "batch": 64, "seq": 16384, "heads": 64, "groups": 1}
    assert emit_chunk_state(default_chunk_state_plan(big, T2)).grid == (64 * 64, 1, 64)
    with pytest.raises(CodegenError, match="32-bit"):
        emit_chunk_state(default_chunk_state_plan({**big, "batch": 2048, "seq": 1 << 16}, T2))
