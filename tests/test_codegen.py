"""CPU tests of the CUDA code generator: plans compile for sm_90a with nvcc (no GPU needed), ptxas reports no
spills and shared memory within 227 KB, the PTX holds wgmma and TMA, the emitted order follows the plan, and
bad plans raise CodegenError. Skips cleanly without nvcc."""
from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from codegen.cuda import emit
from codegen.cuda.schedule import LoopOrder, buffers_needed, wait_depths
from codegen.plan import KernelPlan, default_plan
from codegen.runtime import parse_ptxas
from ptsolve.errors import CodegenError

GEMM = {"M": 1000, "N": 1024, "K": 520, "dtype": "fp16"}
FA = {"batch": 2, "heads": 8, "kv_heads": 2, "seq_q": 1000, "seq_kv": 1000, "head_dim": 128, "causal": False,
      "dtype": "bf16"}


def fa(**kw):
    return FA | kw


def fa3_plan(params, tiling):
    """FA3's order: QK of j, PV of j-1, softmax of j (stage 1 on mma_pv only)."""
    base = default_plan("flash_attention", params, tiling)
    loop = {"producer": [("load_k", 0), ("load_v", 0)]}
    for g in range(tiling["groups"]):
        loop[f"wg{g}"] = [(f"mma_qk@{g}", 0), (f"mma_pv@{g}", 1), (f"rowmax@{g}", 0), (f"exp2@{g}", 0),
                          (f"rowsum@{g}", 0), (f"rescale@{g}", 0)]
    return KernelPlan(base.op, base.params, base.tiling, {**base.order, "loop": loop}, base.tc_order)


def gemm_plan(bm, bn, depth, groups, dtype="fp16"):
    return default_plan("gemm", GEMM | {"dtype": dtype}, {"BM": bm, "BN": bn, "BK": 64, "depth": depth,
                                                          "groups": groups})


# the representative set: every one must compile without spills
PLANS = {
    "gemm_g1_bn128_d2": gemm_plan(128, 128, 2, 1),
    "gemm_g1_bn256_d3": gemm_plan(64, 256, 3, 1, "bf16"),
    "gemm_g2_bn256_d4": gemm_plan(128, 256, 4, 2, "bf16"),
    "gemm_g2_bn192_d4": gemm_plan(128, 192, 4, 2),
    "gemm_g2_m256_bn128_d4": gemm_plan(256, 128, 4, 2),
    "fa_d128_g2": default_plan("flash_attention", FA, {"BM": 128, "BN": 128, "depth": 2, "groups": 2}),
    "fa_d128_g2_causal": default_plan("flash_attention", fa(causal=True, seq_q=700),
                                      {"BM": 128, "BN": 128, "depth": 2, "groups": 2}),
    "fa_d128_g1": default_plan("flash_attention", fa(dtype="fp16"), {"BM": 64, "BN": 128, "depth": 3, "groups": 1}),
    "fa_d128_g2_overlap": default_plan("flash_attention", fa(causal=True),
                                       {"BM": 128, "BN": 64, "depth": 2, "groups": 2}, overlap=True),
    "fa_d64_g1": default_plan("flash_attention", fa(head_dim=64), {"BM": 64, "BN": 128, "depth": 2, "groups": 1}),
    "fa_d64_g3": default_plan("flash_attention", fa(head_dim=64, heads=6, kv_heads=3, causal=True),
                              {"BM": 192, "BN": 64, "depth": 3, "groups": 3}),
    "fa_d64_g2_overlap": default_plan("flash_attention", fa(head_dim=64),
                                      {"BM": 128, "BN": 64, "depth": 2, "groups": 2}, overlap=True),
    "fa_d64_g1_fa3": fa3_plan(fa(head_dim=64, causal=True), {"BM": 64, "BN": 64, "depth": 2, "groups": 1}),
    "fa_d128_g2_fa3": fa3_plan(fa(causal=True), {"BM": 128, "BN": 128, "depth": 2, "groups": 2}),
    "fa_d128_g2_fa3_bn176": fa3_plan(fa(), {"BM": 128, "BN": 176, "depth": 2, "groups": 2}),
    "fa_d128_g2_fa3_persistent": fa3_plan(fa(causal=True, batch=8),
                                          {"BM": 128, "BN": 128, "depth": 2, "groups": 2, "persistent": 1}),
    "fa_d64_g3_fa3": fa3_plan(fa(head_dim=64, heads=6, kv_heads=3), {"BM": 192, "BN": 64, "depth": 2, "groups": 3}),
}
PTX_CHECK = ("gemm_g2_bn256_d4", "fa_d128_g2_causal")


@pytest.fixture(scope="session")
def compiled(tmp_path_factory):
    """Compile every plan once (in parallel); returns name -> Compiled."""
    if not (shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc") or os.environ.get("NVCC")):
        pytest.skip("nvcc not available")
    from codegen.runtime import compile_kernel
    old = os.environ.get("PTSOLVE_CACHE_DIR")
    os.environ["PTSOLVE_CACHE_DIR"] = str(tmp_path_factory.mktemp("ptsolve_cache"))
    try:
        with ThreadPoolExecutor(max_workers=max(2, min(8, os.cpu_count() or 2))) as ex:
            futs = {k: ex.submit(compile_kernel, emit(p)) for k, p in PLANS.items()}
            return {k: f.result() for k, f in futs.items()}
    finally:
        if old is None:
            os.environ.pop("PTSOLVE_CACHE_DIR", None)
        else:
            os.environ["PTSOLVE_CACHE_DIR"] = old


@pytest.mark.parametrize("name", sorted(PLANS))
def test_compiles_without_spills(compiled, name):
    c = compiled[name]
    rep = c.report
    assert c.cubin[:4] == b"\x7fELF"
    assert rep["spill_stores"] == 0 and rep["spill_loads"] == 0, rep
    assert rep["stack_bytes"] == 0, rep
    assert c.kernel.smem_bytes + rep["smem_static"] <= 227 * 1024
    assert not any("C7508" in w for w in rep["warnings"]), "setmaxnreg was ignored"


@pytest.mark.parametrize("name", PTX_CHECK)
def test_ptx_has_wgmma_and_tma(compiled, name):
    from codegen.runtime import ptx_text
    ptx = ptx_text(compiled[name].kernel)
    for needle in ("wgmma.mma_async", "cp.async.bulk.tensor", "mbarrier.try_wait.parity", "setmaxnreg"):
        assert needle in ptx, needle


def test_cache_hit(compiled, tmp_path, monkeypatch):
    from codegen.runtime import compile_kernel
    monkeypatch.setenv("PTSOLVE_CACHE_DIR", str(tmp_path))
    ks = compiled["gemm_g1_bn128_d2"].kernel
    first = compile_kernel(ks)
    assert first.path.parent.parent == tmp_path
    stamp = first.path.stat().st_mtime_ns
    again = compile_kernel(ks)  # served from the cache: the file is not rewritten
    assert again.path == first.path and again.cubin == first.cubin and again.path.stat().st_mtime_ns == stamp
    assert again.report["registers"] == first.report["registers"]


# ------------------------------------------------------------------------------------------------ order


def _loop_lines(src: str) -> list[str]:
    return [ln for ln in src.splitlines() if ln.strip()]


def test_order_changes_source_gemm():
    a = gemm_plan(128, 256, 4, 2)
    loop = dict(a.order["loop"]) | {"producer": [("load_b", 0), ("load_a", 0)]}
    b = dataclasses.replace(a, order={**a.order, "loop": loop})
    sa, sb = emit(a).source, emit(b).source
    assert sa != sb
    # same statements, only their order (and the plan id in the name) differ
    strip = [ln for ln in _loop_lines(sa) if "pts_gemm" not in ln and "plan " not in ln]
    stripb = [ln for ln in _loop_lines(sb) if "pts_gemm" not in ln and "plan " not in ln]
    assert sorted(strip) == sorted(stripb)
    ia, ib = sb.index("tm_b, &full_bar"), sb.index("tm_a, &full_bar")
    assert ia < ib  # B loaded first, as the plan says
    assert sa.index("tm_a, &full_bar") < sa.index("tm_b, &full_bar")


def test_order_changes_source_fa_overlap():
    t = {"BM": 128, "BN": 64, "depth": 2, "groups": 2}
    plain = emit(default_plan("flash_attention", FA, t))
    over = emit(default_plan("flash_attention", FA, t, overlap=True))
    assert plain.source != over.source and plain.name != over.name
    assert "prologue j=0" in over.source and "prologue j=0" not in plain.source
    # overlap: QK of iteration j is issued before the softmax (rowmax) of j - 1 in the steady loop
    body = over.source[over.source.index("#pragma unroll 1"):]
    assert body.index("// mma_qk") < body.index("// rowmax")
    assert "(j - 1)" in body
    assert over.info["score_buffers"] == [2, 2] and plain.info["score_buffers"] == [1, 1]


def test_tc_order_pingpong():
    t = {"BM": 128, "BN": 128, "depth": 2, "groups": 2}
    pp = fa3_plan(FA, t)
    ks = emit(pp)
    assert ks.info["tc_turns"] == [0, 1] and ks.info["score_buffers"] == [1, 1]
    assert "bar.sync 1, 256" in ks.source and "bar.arrive 2, 256" in ks.source
    rev = emit(dataclasses.replace(pp, tc_order=["mma_qk@1", "mma_pv@1", "mma_qk@0", "mma_pv@0"]))
    assert rev.info["tc_turns"] == [1, 0] and rev.source != ks.source
    off = emit(dataclasses.replace(pp, tc_order=[]))
    assert off.info["tc_turns"] is None and "bar.sync 1" not in off.source
    # the plain order separates QK and PV by the softmax: enforcing turns would serialise it, so it is not
    assert emit(default_plan("flash_attention", FA, t)).info["tc_turns"] is None


def test_deterministic():
    p = PLANS["fa_d128_g2_causal"]
    assert emit(p).source == emit(KernelPlan.from_json(p.to_json())).source


def test_wait_depths_overlap():
    lo = LoopOrder((("mma_qk", 0), ("rowmax", 1), ("exp2", 1), ("rowsum", 1), ("rescale", 1), ("mma_pv", 1)))
    needs = {"rowmax": [("mma_qk", 0)], "rescale": [("mma_pv", -1)], "mma_pv": [("mma_pv", -1)]}
    d = wait_depths(lo, {"mma_qk", "mma_pv"}, needs)
    # at rowmax(j-1): PV(j-2) and QK(j) were committed after QK(j-1) and may stay in flight
    assert d["rowmax"]["mma_qk"] == 2
    assert d["rescale"]["mma_pv"] == 1
    assert buffers_needed(lo, "mma_qk", ("rowmax", "exp2", "rowsum", "mma_pv")) == 2
    plain = LoopOrder(tuple((n, 0) for n, _ in lo.ops))
    assert buffers_needed(plain, "mma_qk", ("rowmax", "exp2", "rowsum", "mma_pv")) == 1
    assert wait_depths(plain, {"mma_qk", "mma_pv"}, needs)["rowmax"]["mma_qk"] == 0


# ------------------------------------------------------------------------------------------------ errors


def _with(plan, **kw):
    return dataclasses.replace(plan, **kw)


BASE_FA = default_plan("flash_attention", FA, {"BM": 128, "BN": 128, "depth": 2, "groups": 2})
BASE_G = gemm_plan(128, 256, 4, 2)


def _loop(plan, role, ops):
    return _with(plan, order={**plan.order, "loop": {**plan.order["loop"], role: ops}})


BAD = {
    "op": _with(BASE_G, op="conv2d"),
    "task_injection": _loop(BASE_G, "wg0", [('mma@0"); system("rm', 0)]),
    "unknown_task": _loop(BASE_G, "producer", [("load_a", 0), ("load_c", 0)]),
    "missing_task": _loop(BASE_G, "producer", [("load_a", 0)]),
    "duplicate_task": _loop(BASE_G, "producer", [("load_a", 0), ("load_b", 0), ("load_b", 0)]),
    "wrong_group": _loop(BASE_G, "wg0", [("mma@1", 0)]),
    "unknown_role": _loop(BASE_G, "wg7", [("mma@7", 0)]),
    "negative_stage": _loop(BASE_G, "wg0", [("mma@0", -1)]),
    "str_stage": _loop(BASE_G, "wg0", [("mma@0", "0")]),
    "huge_stage": _loop(BASE_G, "wg0", [("mma@0", 99)]),
    "BM": _with(BASE_G, tiling={**BASE_G.tiling, "BM": 100}),
    "BN": _with(BASE_G, tiling={**BASE_G.tiling, "BN": 250}),
    "BN_str": _with(BASE_G, tiling={**BASE_G.tiling, "BN": "256"}),
    "groups": _with(BASE_G, tiling={**BASE_G.tiling, "groups": 4, "BM": 256}),
    "depth": _with(BASE_G, tiling={**BASE_G.tiling, "depth": 0}),
    "BK": _with(BASE_G, tiling={**BASE_G.tiling, "BK": 32}),
    "smem": _with(BASE_G, tiling={**BASE_G.tiling, "depth": 8}),
    "regs": gemm_plan(128, 256, 4, 1),
    "dtype": _with(BASE_G, params={**BASE_G.params, "dtype": "fp8; int x"}),
    "M_neg": _with(BASE_G, params={**BASE_G.params, "M": -5}),
    "M_bool": _with(BASE_G, params={**BASE_G.params, "M": True}),
    "K_odd": _with(BASE_G, params={**BASE_G.params, "K": 100}),
    "extra_param": _with(BASE_G, params={**BASE_G.params, "evil": "x"}),
    "head_dim": _with(BASE_FA, params={**FA, "head_dim": 96}),
    "gqa": _with(BASE_FA, params={**FA, "kv_heads": 3}),
    "causal_str": _with(BASE_FA, params={**FA, "causal": "yes"}),
    "fa_rows": _with(BASE_FA, tiling={**BASE_FA.tiling, "BM": 256}),
    "fa_bn": _with(BASE_FA, tiling={**BASE_FA.tiling, "BN": 72}),
    "tc_order": _with(BASE_FA, tc_order=["mma_qk@0", "bogus@1"]),
    "dep_violation": _loop(BASE_FA, "wg0", [("mma_qk@0", 0), ("exp2@0", 0), ("rowmax@0", 0), ("rowsum@0", 0),
                                            ("rescale@0", 0), ("mma_pv@0", 0)]),
    "three_buffers": _loop(BASE_FA, "wg0", [("mma_qk@0", 0), ("rowmax@0", 2), ("exp2@0", 2), ("rowsum@0", 2),
                                            ("rescale@0", 2), ("mma_pv@0", 2)]),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_plans_raise(name):
    with pytest.raises(CodegenError):
        emit(BAD[name])


def test_not_a_plan():
    with pytest.raises(CodegenError):
        emit({"op": "gemm"})  # type: ignore[arg-type]


def test_emit_cache():
    from codegen.runtime import _emit_cached
    p = PLANS["gemm_g1_bn128_d2"]
    assert _emit_cached(p) is _emit_cached(KernelPlan.from_json(p.to_json()))
    with pytest.raises(CodegenError):
        _emit_cached(BAD["BN"])
    with pytest.raises(CodegenError):
        _emit_cached(_with(BASE_G, params={**BASE_G.params, "M": object()}))


def test_parse_ptxas():
    text = """ptxas info    : Compiling entry function 'k' for 'sm_90a'
ptxas info    : Function properties for k
    8 bytes stack frame, 12 bytes spill stores, 16 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers, 1024 bytes smem
ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized"""
    r = parse_ptxas(text)
    assert (r["registers"], r["stack_bytes"], r["spill_stores"], r["spill_loads"], r["smem_static"]) == \
        (168, 8, 12, 16, 1024)
    assert r["wgmma_serialized"]


def test_import_without_gpu_stack():
    code = ("import sys; import codegen, codegen.cuda, codegen.runtime, codegen.bench; "
            "assert 'cuda.bindings' not in sys.modules and 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=os.path.dirname(os.path.dirname(__file__)))
