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

from codegen.bench import fa3_order_plan
from codegen.cuda import emit
from codegen.cuda.schedule import LoopOrder, buffers_needed, simulate, wait_depths
from codegen.plan import KernelPlan, default_plan
from codegen.runtime import parse_ptxas
from ptsolve.errors import CodegenError

GEMM = {"M": 1000, "N": 1024, "K": 520, "dtype": "fp16"}
FA = {"batch": 2, "heads": 8, "kv_heads": 2, "seq_q": 1000, "seq_kv": 1000, "head_dim": 128, "causal": False,
      "dtype": "bf16"}


def fa(**kw):
    return FA | kw


def fa3_plan(params, tiling):
    """FA3's order: QK of j, PV of j-1, softmax of j, with ping-pong turns (codegen.bench's plan)."""
    return fa3_order_plan(params, tiling)


def solver_plan(params, tiling, wg_loops, tc_order):
    """A plan as ``plan_from_program`` builds it from a ptsolve schedule: per-group loops [(task, stage)] with
    the group suffix added, producer at stage 0."""
    base = default_plan("flash_attention", params, tiling)
    loop = {"producer": [("load_k", 0), ("load_v", 0)]}
    loop |= {f"wg{g}": [(f"{t}@{g}", s) for t, s in ops] for g, ops in enumerate(wg_loops)}
    return KernelPlan(base.op, base.params, base.tiling, {**base.order, "loop": loop}, list(tc_order))


# the schedules of ptsolve's greedy and CP-SAT policies for FA3 (B1 H32 S4096 d128 fp16) on FA3's tiling
# (.exp/s1/FA3_{greedy,cpsat}@fixed.json through codegen.plan.plan_from_program)
FA3_S = {"batch": 1, "heads": 32, "kv_heads": 8, "seq_q": 4096, "seq_kv": 4096, "head_dim": 128, "causal": False,
         "dtype": "fp16"}
T2 = {"BM": 128, "BN": 128, "depth": 2, "groups": 2}
SOFTMAX_PV = [("mma_qk", 1), ("rowmax", 1), ("exp2", 1), ("rescale", 1), ("mma_pv", 1), ("rowsum", 1)]
GREEDY = solver_plan(FA3_S, T2, [SOFTMAX_PV, SOFTMAX_PV], ["mma_qk@0", "mma_qk@1", "mma_pv@0", "mma_pv@1"])
CPSAT = solver_plan(FA3_S, T2, [
    [("mma_qk", 1), ("rowmax", 1), ("exp2", 1), ("rescale", 1), ("rowsum", 1), ("mma_pv", 1)],
    [("exp2", 2), ("rowsum", 2), ("rescale", 2), ("mma_pv", 2), ("mma_qk", 1), ("rowmax", 1)]],
    ["mma_qk@0", "mma_pv@1", "mma_qk@1", "mma_pv@0"])
FA3_ORDER = [("mma_qk", 0), ("mma_pv", 1), ("rowmax", 0), ("exp2", 0), ("rowsum", 0), ("rescale", 0)]
# wg1 one stage behind wg0 (three stages in all): guarded prologue, epilogue for unknown short trip counts
SKEWED = solver_plan(fa(causal=True), T2, [FA3_ORDER, [(t, s + 1) for t, s in FA3_ORDER]],
                     ["mma_qk@0", "mma_pv@0", "mma_qk@1", "mma_pv@1"])


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
    "fa_greedy_turns": GREEDY,
    "fa_cpsat_turns": CPSAT,
    "fa_cpsat_turns_causal_persistent": dataclasses.replace(CPSAT, params=fa(causal=True, batch=8),
                                                            tiling=T2 | {"persistent": 1}),
    "fa_skewed_turns_causal": SKEWED,
    "fa_d64_g3_turns": solver_plan(fa(head_dim=64, heads=6, kv_heads=3, causal=True),
                                   {"BM": 192, "BN": 64, "depth": 2, "groups": 3}, [FA3_ORDER] * 3,
                                   ["mma_qk@0", "mma_qk@1", "mma_pv@0", "mma_qk@2", "mma_pv@1", "mma_pv@2"]),
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


@pytest.mark.parametrize("name", ["fa_greedy_turns", "fa_cpsat_turns", "fa_d128_g2_fa3_persistent"])
def test_turns_keep_wgmma_pipelined(compiled, name):
    """The named-barrier turns must not make ptxas serialise the wgmma pipeline (C7510-C7515 warnings)."""
    assert not any("are serialized" in w for w in compiled[name].report["warnings"]), compiled[name].report


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
    # FA3: group 0 issues QK(j) and PV(j-1) back to back, then hands the tensor cores to group 1, and back
    assert ks.info["tc_turns"] == (("wg0", "mma_pv", "wg1", "mma_qk", 2), ("wg1", "mma_pv", "wg0", "mma_qk", 1))
    assert ks.info["score_buffers"] == [1, 1]
    assert "bar.sync 1, 256" in ks.source and "bar.arrive 2, 256" in ks.source
    assert 'if (g == 1) asm volatile("bar.arrive 1, 256;"' in ks.source  # group 1 lets group 0 go first
    assert _steady(ks.source, 0)[:4] == ["sync 1", "mma_qk", "mma_pv", "arrive 2"]
    rev = emit(dataclasses.replace(pp, tc_order=["mma_qk@1", "mma_pv@1", "mma_qk@0", "mma_pv@0"]))
    assert rev.info["tc_turns"] == (("wg1", "mma_pv", "wg0", "mma_qk", 1), ("wg0", "mma_pv", "wg1", "mma_qk", 2))
    assert rev.source != ks.source and 'if (g == 0) asm volatile("bar.arrive 2, 256;"' in rev.source
    off = emit(dataclasses.replace(pp, tc_order=[]))
    assert off.info["tc_turns"] is None and "bar.sync 1" not in off.source and "bar.arrive" not in off.source
    # one group's tasks only: nothing to hand over
    assert emit(dataclasses.replace(pp, tc_order=["mma_qk@0", "mma_pv@0"])).info["tc_turns"] is None
    # the plain order enforced as written (wg0's GEMMs, then wg1's) serialises the two softmaxes
    plain = default_plan("flash_attention", FA, t)
    assert plain.tc_order == [] and emit(plain).info["tc_turns"] is None
    forced = emit(dataclasses.replace(plain, tc_order=["mma_qk@0", "mma_pv@0", "mma_qk@1", "mma_pv@1"]))
    assert forced.info["tc_turns"] == (("wg0", "mma_pv", "wg1", "mma_qk", 2), ("wg1", "mma_pv", "wg0", "mma_qk", 1))
    assert _steady(forced.source, 0) == ["sync 1", "mma_qk", "rowmax", "exp2", "rowsum", "rescale", "mma_pv",
                                         "arrive 2"]


def _role(src: str, g: int) -> str:
    """The loop code of consumer warpgroup g (up to its post phase)."""
    a = src.index(f"// ---- consumer warpgroup {g}:")
    return src[a:src.index("// post:", a)]


def _tokens(code: str) -> list[str]:
    """Turn operations and task blocks, in order: "sync <bar>", "arrive <bar>", task names."""
    out = []
    for ln in code.splitlines():  # emit_loop's own lines start in column 0, the tasks' code is indented
        for op in ("sync", "arrive"):
            if ln.startswith(f'asm volatile("bar.{op} '):
                out.append(f"{op} {ln.split()[2].rstrip(',')}")
        if ln.startswith("{  // ") or ln.startswith("if (") and "{  // " in ln:
            out.append(ln.split("{  // ")[1].split()[-1] if "epilogue" in ln else ln.split("{  // ")[1].split()[0])
        elif ln.startswith("wg_commit();  // empty group in place of "):
            out.append("empty " + ln.split("in place of ")[1].split()[0])
    return out


def _steady(src: str, g: int) -> list[str]:
    """Tokens of group g's steady loop body (the first copy when unrolled)."""
    code = _role(src, g)
    a = code.index("#pragma unroll 1")
    b = code.find("// epilogue", a)
    return _tokens(code[a:b] if b > 0 else code[a:])


def test_turns_greedy_schedule():
    """Greedy's FA3 schedule (tc_order qk@0, qk@1, pv@0, pv@1): every GEMM is a handoff."""
    ks = emit(GREEDY)
    assert ks.info["tc_turns"] == (("wg0", "mma_qk", "wg1", "mma_qk", 2), ("wg1", "mma_qk", "wg0", "mma_pv", 1),
                                   ("wg0", "mma_pv", "wg1", "mma_pv", 2), ("wg1", "mma_pv", "wg0", "mma_qk", 1))
    # all consumer tasks at stage 1 -> shifted to stage 0: one stage, no prologue or epilogue
    assert "// prologue" not in _role(ks.source, 0)
    assert _steady(ks.source, 0) == ["sync 1", "mma_qk", "arrive 2", "rowmax", "exp2", "rescale",
                                     "sync 1", "mma_pv", "arrive 2", "rowsum"]
    assert _steady(ks.source, 1) == ["sync 2", "mma_qk", "arrive 1", "rowmax", "exp2", "rescale",
                                     "sync 2", "mma_pv", "arrive 1", "rowsum"]
    assert 'if (g == 1) asm volatile("bar.arrive 1, 256;"' in ks.source  # pv@1 precedes qk@0 cyclically


def test_turns_cpsat_schedule():
    """CP-SAT's FA3 schedule (tc_order qk@0, pv@1, qk@1, pv@0; wg1 a stage ahead on its softmax):
    each group issues PV then QK back to back; the turn passes after QK, is awaited before PV."""
    ks = emit(CPSAT)
    assert ks.info["tc_turns"] == (("wg0", "mma_qk", "wg1", "mma_pv", 2), ("wg1", "mma_qk", "wg0", "mma_pv", 1))
    assert _steady(ks.source, 0) == ["mma_qk", "arrive 2", "rowmax", "exp2", "rescale", "rowsum",
                                     "sync 1", "mma_pv"]
    assert _steady(ks.source, 1) == ["exp2", "rowsum", "rescale", "sync 2", "mma_pv", "mma_qk", "arrive 1",
                                     "rowmax"]
    assert "bar.arrive 1, 256;\" ::: \"memory\");  // first turn" not in ks.source  # qk@0 follows pv@0: no first turn
    w0, w1 = _tokens(_role(ks.source, 0)), _tokens(_role(ks.source, 1))
    # prologue (j = 0): wg0 runs iteration 0; wg1 only QK(0) and, in place of PV(-1), an empty group with
    # the turn ops all the same; epilogue (j = T): wg0 has no task left but still takes part in the turns
    assert w0[:3] == ["mma_qk", "arrive 2", "rowmax"]
    assert w1[:5] == ["sync 2", "empty mma_pv", "mma_qk", "arrive 1", "rowmax"]
    assert w0[-2:] == ["arrive 2", "sync 1"]
    assert w1[-5:] == ["exp2", "rowsum", "rescale", "sync 2", "mma_pv"] or \
        w1[-6:] == ["exp2", "rowsum", "rescale", "sync 2", "mma_pv", "arrive 1"]
    # every group performs the same number of turn operations per tile (the sequence cannot fall out of step)
    for src in (ks.source, emit(SKEWED).source):
        n = [sum(t.startswith(("sync", "arrive")) for t in _tokens(_role(src, g))) for g in range(2)]
        assert n[0] == n[1], n


def test_turns_guarded_prologue():
    """Three stages (wg1 one stage behind): prologue tasks guarded by the trip count, turn ops outside."""
    code = _role(emit(SKEWED).source, 0)
    pro = code[code.index("// prologue j=1"):code.index("#pragma unroll 1")]
    assert "if (1 < T) {  // mma_qk it=1" in pro
    assert pro.index("bar.sync 1, 256") < pro.index("if (1 < T) {  // mma_qk it=1")


DEADLOCK = {
    # wg0 issues QK before PV but the turn order wants PV(j-1) first: contradicts the issue order
    "contradicts_issue_order": dataclasses.replace(fa3_plan(FA, T2), tc_order=["mma_pv@0", "mma_qk@0", "mma_qk@1",
                                                                               "mma_pv@1"]),
    # wg1's QK(j) must be issued before wg0's QK(j-1); with a one-slot K ring, K(j) cannot be loaded before
    # both groups released K(j-1), which wg0 does only after its QK(j-1)
    "ring_depth1": solver_plan(FA, T2 | {"depth": 1},
                               [[(t, 1) for t, _ in SOFTMAX_PV], [(t, 0) for t, _ in SOFTMAX_PV]],
                               ["mma_qk@1", "mma_qk@0", "mma_pv@1", "mma_pv@0"]),
}


@pytest.mark.parametrize("name", sorted(DEADLOCK))
def test_deadlocking_tc_order_raises(name):
    with pytest.raises(CodegenError, match="deadlock"):
        emit(DEADLOCK[name])


def test_ring_depth2_is_fine():
    """The same skew as ``ring_depth1`` with a two-slot ring emits (the simulation finds no deadlock)."""
    ks = emit(dataclasses.replace(DEADLOCK["ring_depth1"], tiling=T2 | {"depth": 2}))
    assert ks.info["tc_turns"]


def test_simulate_barrier_misuse():
    with pytest.raises(CodegenError, match="deadlock"):  # both wait for the other's turn first
        simulate({"a": [("sync", 1), ("arrive", 2)], "b": [("sync", 2), ("arrive", 1)]}, "t")
    with pytest.raises(CodegenError, match="wrong warpgroup"):  # two arrivals in one generation
        simulate({"a": [("arrive", 1), ("arrive", 1)], "b": [("sync", 1), ("sync", 1)]}, "t")
    simulate({"a": [("arrive", 2), ("sync", 1), ("arrive", 2)], "b": [("sync", 2), ("arrive", 1), ("sync", 2)]}, "t")


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
