"""CPU tests of the CUDA code generator (one lowering, one skeleton, four operators' task bodies): representative
plans of every operator compile for sm_90a with nvcc (no GPU needed; skip cleanly without nvcc) with no spills,
no serialised wgmma and shared memory within the block's budget, the PTX holds wgmma and TMA, the emitted order
follows the plan, tensor-core turns are enforced and simulated, and bad plans raise CodegenError."""
from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from codegen.cuda import emit
from codegen.cuda.schedule import wait_depths
from codegen.loop import LoopOrder, simulate
from codegen.plan import KernelPlan, default_plan, fa3_order_plan
from codegen.runtime import parse_ptxas
from ptsolve.errors import CodegenError

GEMM = {"M": 1000, "N": 1024, "K": 520, "dtype": "fp16"}
FA = {"batch": 2, "heads": 8, "kv_heads": 2, "seq_q": 1000, "seq_kv": 1000, "head_dim": 128, "causal": False,
      "dtype": "bf16"}
CS = {"batch": 2, "seq": 1000, "heads": 8, "head_dim": 64, "d_state": 128, "chunk": 256, "groups": 2, "dtype": "fp16"}
ST = CS | {"dtype": "bf16"}
T2 = {"BM": 128, "BN": 128, "depth": 2, "groups": 2}
ST2 = {"BM": 128, "BK": 64, "depth": 3, "groups": 2}


def fa(**kw):
    return FA | kw


def with_loop(plan: KernelPlan, wg_loop, producer=None) -> KernelPlan:
    """``plan`` with every consumer's loop replaced by ``wg_loop`` ([(task base, stage)]) and optionally the
    producer's."""
    loop = {"producer": producer or plan.order["loop"]["producer"]}
    loop |= {f"wg{g}": [(f"{t}@{g}", s) for t, s in wg_loop] for g in range(plan.groups)}
    return dataclasses.replace(plan, order={**plan.order, "loop": loop})


def solver_plan(params, tiling, wg_loops, tc_order):
    """An attention plan as plan_from_program builds it: per-group loops with the group suffix added."""
    base = default_plan("flash_attention", params, tiling)
    loop = {"producer": [("load_k", 0), ("load_v", 0)]}
    loop |= {f"wg{g}": [(f"{t}@{g}", s) for t, s in ops] for g, ops in enumerate(wg_loops)}
    return dataclasses.replace(base, order={**base.order, "loop": loop}, tc_order=list(tc_order))


# the schedules ptsolve's greedy and CP-SAT policies found for FA3 (B1 H32 S4096 d128 fp16) on FA3's tiling
FA3_S = {"batch": 1, "heads": 32, "kv_heads": 8, "seq_q": 4096, "seq_kv": 4096, "head_dim": 128, "causal": False,
         "dtype": "fp16"}
SOFTMAX_PV = [("mma_qk", 1), ("rowmax", 1), ("exp2", 1), ("rescale", 1), ("rowsum", 1), ("mma_pv", 1)]
GREEDY = solver_plan(FA3_S, T2, [SOFTMAX_PV, SOFTMAX_PV], ["mma_qk@0", "mma_qk@1", "mma_pv@0", "mma_pv@1"])
CPSAT = solver_plan(FA3_S, T2, [
    [("mma_qk", 1), ("rowmax", 1), ("exp2", 1), ("rescale", 1), ("rowsum", 1), ("mma_pv", 1)],
    [("exp2", 2), ("rowsum", 2), ("rescale", 2), ("mma_pv", 2), ("mma_qk", 1), ("rowmax", 1)]],
    ["mma_qk@0", "mma_pv@1", "mma_qk@1", "mma_pv@0"])
FA3_ORDER = [("mma_qk", 0), ("mma_pv", 1), ("rowmax", 0), ("exp2", 0), ("rowsum", 0), ("rescale", 0)]
SKEWED = solver_plan(fa(causal=True), T2, [FA3_ORDER, [(t, s + 1) for t, s in FA3_ORDER]],
                     ["mma_qk@0", "mma_pv@0", "mma_qk@1", "mma_pv@1"])


def gemm_plan(bm, bn, depth, groups, dtype="fp16", **kw):
    return default_plan("gemm", GEMM | {"dtype": dtype}, {"BM": bm, "BN": bn, "BK": 64, "depth": depth,
                                                          "groups": groups, **kw})


def cs_tiling(W, BK, depth=2, ctas=1):
    return {"BM": 64 * W, "BK": BK, "depth": depth, "groups": W, "ctas": ctas}


# the representative set: every one must compile without spills or serialised wgmma
PLANS = {
    "gemm_g1_bn128_d2": gemm_plan(128, 128, 2, 1),
    "gemm_g1_bn256_d3": gemm_plan(64, 256, 3, 1, "bf16"),
    "gemm_g2_bn256_d4": gemm_plan(128, 256, 4, 2, "bf16"),
    "gemm_g2_bn192_d4": gemm_plan(128, 192, 4, 2),
    "gemm_g2_m256_bn128_d4": gemm_plan(256, 128, 4, 2),
    "gemm_g2_bn256_d4_grid": gemm_plan(128, 256, 4, 2, persistent=0),
    "gemm_g1_bn64_split4": gemm_plan(64, 64, 4, 1, splits=4),
    "gemm_g1_bn256_split3": gemm_plan(64, 256, 3, 1, splits=3),
    "gemm_g2_bn128_split2_grid": gemm_plan(128, 128, 4, 2, "bf16", splits=2, persistent=0),
    "gemm_pp_m128_bn128_d4": gemm_plan(128, 128, 4, 1, pingpong=1),
    "gemm_pp_m64_bn256_d4": gemm_plan(64, 256, 4, 1, "bf16", pingpong=1),
    "gemm_pp_m128_bn192_d3": gemm_plan(128, 192, 3, 1, pingpong=1),
    "fa_d128_g2": default_plan("flash_attention", FA, T2),
    "fa_d128_g2_causal": default_plan("flash_attention", fa(causal=True, seq_q=700), T2),
    "fa_d128_g1": default_plan("flash_attention", fa(dtype="fp16"), {"BM": 64, "BN": 128, "depth": 3, "groups": 1}),
    "fa_d128_g2_overlap": default_plan("flash_attention", fa(causal=True), T2 | {"BN": 64}, overlap=True),
    "fa_d64_g1": default_plan("flash_attention", fa(head_dim=64), {"BM": 64, "BN": 128, "depth": 2, "groups": 1}),
    "fa_d64_g3": default_plan("flash_attention", fa(head_dim=64, heads=6, kv_heads=3, causal=True),
                              {"BM": 192, "BN": 64, "depth": 3, "groups": 3}),
    "fa_d64_g1_fa3": fa3_order_plan(fa(head_dim=64, causal=True), {"BM": 64, "BN": 64, "depth": 2, "groups": 1}),
    "fa_d128_g2_fa3": fa3_order_plan(fa(causal=True), T2),
    "fa_d128_g2_fa3_bn176": fa3_order_plan(fa(), T2 | {"BN": 176}),
    "fa_d128_g2_fa3_persistent": fa3_order_plan(fa(causal=True, batch=8), T2 | {"persistent": 1}),
    "fa_d64_g3_fa3": fa3_order_plan(fa(head_dim=64, heads=6, kv_heads=3), {"BM": 192, "BN": 64, "depth": 2,
                                                                          "groups": 3}),
    # head dims off the 64-column swizzle atom are padded tiles (geometry.attention.head_cols); 192 and 256 whole
    "fa_d96_g2_fa3": fa3_order_plan(fa(head_dim=96), T2),
    "fa_d80_g2_causal": default_plan("flash_attention", fa(head_dim=80, causal=True, dtype="fp16"), T2 | {"BN": 64}),
    "fa_d192_g2_fa3": fa3_order_plan(fa(head_dim=192), T2 | {"BN": 64}),
    "fa_d256_g2_causal": default_plan("flash_attention", fa(head_dim=256, causal=True), T2 | {"BN": 64}),
    # a softcap (a tanh per score in rowmax) and a sliding window (the band's first block, its edges masked)
    "fa_d128_g2_fa3_softcap_window_causal": fa3_order_plan(fa(causal=True, softcap=30.0, window_left=300), T2),
    "fa_d256_g2_softcap_window": default_plan("flash_attention", fa(head_dim=256, softcap=50.0, window_left=100,
                                                                    window_right=20), T2 | {"BN": 64}),
    "fa_greedy_turns": GREEDY,
    "fa_cpsat_turns": CPSAT,
    "fa_cpsat_turns_causal_persistent": dataclasses.replace(CPSAT, params=fa(causal=True, batch=8),
                                                            tiling=T2 | {"persistent": 1}),
    "fa_skewed_turns_causal": SKEWED,
    "cs_g2_bk64": default_plan("mamba2_chunk_scan", CS, cs_tiling(2, 64)),
    "cs_g1_bk32": default_plan("mamba2_chunk_scan", CS | {"groups": 1, "heads": 4}, cs_tiling(1, 32)),
    "cs_g2_bk32_overlap": default_plan("mamba2_chunk_scan", CS | {"dtype": "bf16"}, cs_tiling(2, 32), True),
    "cs_g1_bk64_overlap_d3": default_plan("mamba2_chunk_scan", CS, cs_tiling(1, 64, 3), True),
    "cs_g2_bk128": default_plan("mamba2_chunk_scan", CS, cs_tiling(2, 128)),
    "cs_g1_bk64_c2": default_plan("mamba2_chunk_scan", CS, cs_tiling(1, 64, ctas=2)),
    "cs_g1_bk32_c3": default_plan("mamba2_chunk_scan", CS, cs_tiling(1, 32, 3, ctas=3)),
    "st_g2_bk64_d3": default_plan("mamba2_chunk_state", ST, ST2),
    "st_g2_bk64_d3_overlap": default_plan("mamba2_chunk_state", ST, ST2, True),
    "st_g1_bk32_d2_overlap": default_plan("mamba2_chunk_state", ST, {"BM": 64, "BK": 32, "depth": 2, "groups": 1},
                                          True),
    "st_g2_bk64_d3_p128": default_plan("mamba2_chunk_state", ST | {"head_dim": 128}, ST2, True),
    "st_g2_2cta_overlap": default_plan("mamba2_chunk_state", ST, ST2 | {"depth": 2, "ctas": 2}, True),
    "st_g1_2cta_bk32_d3": default_plan("mamba2_chunk_state", ST, {"BM": 128, "BK": 32, "depth": 3, "groups": 1,
                                                                  "ctas": 2}),
}
# hand plans ptxas compiles with a serialised wgmma pipeline (C7512, register pressure: two score buffers at
# d=128, or a third stage on one warpgroup); the search never returns such a schedule (codegen.compile_check)
SERIALISED = {"fa_d128_g2_overlap", "fa_skewed_turns_causal"}
PTX_CHECK = ("gemm_g2_bn256_d4", "fa_d128_g2_causal", "cs_g2_bk64", "st_g2_bk64_d3_overlap")


def _have_nvcc() -> bool:
    return bool(shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc") or os.environ.get("NVCC"))


@pytest.fixture(scope="session")
def compiled(tmp_path_factory):
    """Compile every plan once (in parallel); returns name -> Compiled."""
    if not _have_nvcc():
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
    assert rep["wgmma_serialized"] == (name in SERIALISED), rep["warnings"]
    assert c.kernel.smem_bytes + rep["smem_static"] <= 227 * 1024
    assert not any("C7508" in w for w in rep["warnings"]), "setmaxnreg was ignored"


@pytest.mark.parametrize("name", PTX_CHECK)
def test_ptx_has_wgmma_and_tma(compiled, name):
    from codegen.runtime import ptx_text
    ptx = ptx_text(compiled[name].kernel)
    for needle in ("wgmma.mma_async", "cp.async.bulk.tensor", "mbarrier.try_wait.parity", "setmaxnreg"):
        assert needle in ptx, needle
    if name.startswith(("cs", "st")):  # generic-proxy reads of a slot are fenced before it is released
        assert "fence.proxy.async.shared::cta" in ptx


@pytest.mark.parametrize("D,cols", [(64, 64), (80, 128), (96, 128), (128, 128), (192, 192), (256, 256)])
def test_padded_head_dims_expect_the_whole_box(D, cols):
    """TMA counts the zero-filled columns past head_dim: a padded tile's fills expect BM (or BN) x cols x 2 bytes,
    P·V runs cols wide, Q·Kᵀ only the k-steps that carry data, and the store writes head_dim columns."""
    p = fa(head_dim=D)
    ks = emit(default_plan("flash_attention", p, T2 | {"BN": 64}))
    box = {"q": 128 * cols * 2, "kv": 64 * cols * 2}
    if cols != D:
        assert f"mbar_expect_tx(pre_full, {box['q']});" in ks.source and f", {box['kv']});" in ks.source
        assert f"DP = {cols}" in ks.source
    else:
        assert "DP" not in ks.source
    assert f"wgmma_rs_n{cols}_" in ks.source and (cols == D or f"wgmma_rs_n{D}_" not in ks.source)
    # per warpgroup, the k-steps after the first (the _z one zero-fills), and the device function's definition
    assert ks.source.count("wgmma_ss_n64_bf16(") == 2 * (D // 16 - 1) + 1


def test_features_are_built_in_only_where_asked():
    """A softcap kernel caps scores before the mask (tanh.approx, its value a constant of an exact build); a window
    kernel starts its loads and mask at the band's first block; a plain kernel has neither, and an exact build of a
    window stores a block that sees no key as zeros."""
    plain = emit(fa3_order_plan(fa(causal=True), T2)).source
    both = emit(fa3_order_plan(fa(causal=True, softcap=30.0, window_left=300), T2)).source
    assert "fast_tanh" not in plain and "T0" not in plain and "no key for this query block" not in plain
    assert "tanh.approx.f32" in both and "(T0 + it_) * BN" in both and "no key for this query block" in both
    assert both.index("fast_tanh(sacc") < both.index("the tile crosses an edge of the band")
    assert "SOFTCAP_PRE = " in both and "constexpr int WL = 300, WR = -1;" in both


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


def _role(src: str, g: int) -> str:
    """The code of consumer warpgroup g up to its tile's tail (wg_wait<0> before the post phase)."""
    a = src.index(f"// ---- consumer warpgroup {g}")
    return src[a:src.index("// every wgmma of the tile is complete", a)]


def _tokens(code: str) -> list[str]:
    """Turn operations and task blocks, in order: "sync <bar>", "arrive <bar>", task names without "@g"."""
    out = []
    for ln in code.splitlines():  # emit_loop's own lines start in column 0, the tasks' code is indented
        for op in ("sync", "arrive"):
            if ln.startswith(f'asm volatile("bar.{op} '):
                out.append(f"{op} {ln.split()[2].rstrip(',')}")
        if ln.startswith("{  // ") or ln.startswith("if (") and "{  // " in ln:
            name = ln.split("{  // ")[1].split()[-1] if "epilogue" in ln else ln.split("{  // ")[1].split()[0]
            out.append(name.split("@")[0])
        elif ln.startswith("wg_commit();  // empty group in place of "):
            out.append("empty " + ln.split("in place of ")[1].split()[0].split("@")[0])
    return out


def _steady(src: str, g: int) -> list[str]:
    """Tokens of group g's steady loop body (the first copy when unrolled)."""
    code = _role(src, g)
    a = code.index("#pragma unroll 1")
    b = code.find("// epilogue", a)
    return _tokens(code[a:b] if b > 0 else code[a:])


def test_order_changes_source_gemm():
    a = gemm_plan(128, 256, 4, 2)
    b = with_loop(a, [("mma", 0)], [("load_b", 0), ("load_a", 0)])
    sa, sb = emit(a).source, emit(b).source
    assert sa != sb
    assert sb.index("tm_b, fbar_") < sb.index("tm_a, fbar_")  # B loaded first, as the plan says
    assert sa.index("tm_a, fbar_") < sa.index("tm_b, fbar_")


def test_order_changes_source_fa_overlap():
    t = T2 | {"BN": 64}
    plain = emit(default_plan("flash_attention", FA, t))
    over = emit(default_plan("flash_attention", FA, t, overlap=True))
    assert plain.source != over.source and plain.name != over.name
    assert "prologue j=0" in over.source and "prologue j=0" not in plain.source
    body = over.source[over.source.index("#pragma unroll 1"):]
    assert body.index("// mma_qk") < body.index("// rowmax")  # QK of j issued before the softmax of j - 1
    assert "(j - 1)" in body
    assert over.info["score_buffers"] == [2, 2] and plain.info["score_buffers"] == [1, 1]


def test_mamba_copies_follow_the_plan():
    """Mamba2's hand plans name their copies: the overlapped order keeps two W fragments / xs buffers (the vector
    work of j runs while the mma of j-1 reads the other); a plan with one makes the vector task wait."""
    base = default_plan("mamba2_chunk_scan", CS, cs_tiling(1, 64, ctas=3), overlap=True)
    assert emit(base).info["w_buffers"] == [2]
    one = dataclasses.replace(base, copies={"w@0": 1})
    ks = emit(one)
    assert ks.info["w_buffers"] == [1] and "wg_wait<0>();" in _role(ks.source, 0)
    assert KernelPlan.from_json(one.to_json()) == one
    with pytest.raises(CodegenError, match="copies"):
        emit(dataclasses.replace(base, copies={"w@0": 4}))
    st = default_plan("mamba2_chunk_state", ST, ST2, overlap=True)
    assert emit(st).info["xs_buffers"] == [2, 2] and emit(dataclasses.replace(st, copies={})).info["xs_buffers"] == \
        [1, 1]  # a hand plan naming none gets the fewest its order needs


def test_tc_order_pingpong():
    pp = fa3_order_plan(FA, T2)
    ks = emit(pp)
    # FA3: group 0 issues QK(j) and PV(j-1) back to back, then hands the tensor cores to group 1, and back
    assert ks.info["tc_turns"] == (("wg0", "mma_pv@0", "wg1", "mma_qk@1", 2),
                                   ("wg1", "mma_pv@1", "wg0", "mma_qk@0", 1))
    assert "bar.sync 1, 256" in ks.source and "bar.arrive 2, 256" in ks.source
    assert 'if (g == 1) asm volatile("bar.arrive 1, 256;"' in ks.source  # group 1 lets group 0 go first
    assert _steady(ks.source, 0)[:4] == ["sync 1", "mma_qk", "mma_pv", "arrive 2"]
    off = emit(dataclasses.replace(pp, tc_order=[]))
    assert off.info["tc_turns"] is None and "bar.sync 1" not in off.source
    assert emit(dataclasses.replace(pp, tc_order=["mma_qk@0", "mma_pv@0"])).info["tc_turns"] is None
    unforced = emit(pp, turns=False)
    assert unforced.info["tc_turns"] is None and "switched off" in unforced.info["turns_note"]


def test_turns_for_every_operator():
    """tc_order is enforced for every operator with more than one consumer warpgroup."""
    for name in ("gemm_g2_bn256_d4", "cs_g2_bk64", "st_g2_bk64_d3"):
        ks = emit(PLANS[name])
        assert ks.info["tc_turns"] == (("wg0", "mma@0", "wg1", "mma@1", 2), ("wg1", "mma@1", "wg0", "mma@0", 1)), name
        assert _steady(ks.source, 1).count("sync 2") == 1


def test_turns_greedy_schedule():
    """Greedy's FA3 schedule (tc_order qk@0, qk@1, pv@0, pv@1): every GEMM is a handoff."""
    ks = emit(GREEDY)
    assert [h[:4] for h in ks.info["tc_turns"]] == [("wg0", "mma_qk@0", "wg1", "mma_qk@1"),
                                                    ("wg1", "mma_qk@1", "wg0", "mma_pv@0"),
                                                    ("wg0", "mma_pv@0", "wg1", "mma_pv@1"),
                                                    ("wg1", "mma_pv@1", "wg0", "mma_qk@0")]
    assert "// prologue" not in _role(ks.source, 0)  # every consumer task at stage 1 -> shifted to 0
    assert _steady(ks.source, 0) == ["sync 1", "mma_qk", "arrive 2", "rowmax", "exp2", "rescale", "rowsum",
                                     "sync 1", "mma_pv", "arrive 2"]


def test_turns_cpsat_schedule():
    """CP-SAT's FA3 schedule: each group issues PV then QK back to back; every group performs the same number of
    turn operations per tile, so the sequence cannot fall out of step."""
    ks = emit(CPSAT)
    assert _steady(ks.source, 0) == ["mma_qk", "arrive 2", "rowmax", "exp2", "rescale", "rowsum", "sync 1", "mma_pv"]
    assert _steady(ks.source, 1) == ["exp2", "rowsum", "rescale", "sync 2", "mma_pv", "mma_qk", "arrive 1", "rowmax"]
    w1 = _tokens(_role(ks.source, 1))
    assert w1[:5] == ["sync 2", "empty mma_pv", "mma_qk", "arrive 1", "rowmax"]
    for src in (ks.source, emit(SKEWED).source):
        n = [sum(t.startswith(("sync", "arrive")) for t in _tokens(_role(src, g))) for g in range(2)]
        assert n[0] == n[1], n


def test_release_points_are_the_models():
    """Ring slots are released where ptsolve.protocol says: K after the wait in rowmax, V one iteration late in
    rescale (and at the end of the tile), GEMM's A/B after the next mma's post-issue wait, ChunkScan's CB after
    decay (fenced: generic reads)."""
    fa_src = _role(emit(fa3_order_plan(FA, T2)).source, 0)
    rm = fa_src[fa_src.index("{  // rowmax"):]
    assert rm.index("wg_wait<") < rm.index("k of iteration it-0 released") < rm.index("fence_regs")
    assert "if (it_ >= 1) {  // v of iteration it-1 released" in fa_src
    g = _role(emit(PLANS["gemm_g2_bn256_d4"]).source, 0)
    assert g.index("wg_commit();") < g.index("wg_wait<1>();") < g.index("a, b of iteration it-1 released")
    cs = _role(emit(PLANS["cs_g2_bk64"]).source, 0)
    dec = cs[cs.index("{  // decay"):cs.index("{  // mma")]
    # released at the body's last read of the slot, before the fragments are packed in registers
    assert dec.index("cb_cur") < dec.index("fence.proxy.async") < dec.index("mbar_arrive(&cb_empty") < \
        dec.index("pf0[kk][rr] =")


DEADLOCK = {
    # wg0 issues QK before PV but the turn order wants PV(j-1) first: contradicts the issue order
    "contradicts_issue_order": dataclasses.replace(fa3_order_plan(FA, T2),
                                                   tc_order=["mma_pv@0", "mma_qk@0", "mma_qk@1", "mma_pv@1"]),
    # ChunkScan: load_x of q waits for the slot of q-2, freed by mma(q-1), which needs the CB of q-1, loaded one
    # producer iteration later
    "cs_producer": with_loop(default_plan("mamba2_chunk_scan", CS, cs_tiling(2, 64)), [("decay", 0), ("mma", 0)],
                             [("load_x", 0), ("load_cb", 1), ("load_dA", 1), ("load_dt", 1)]),
    # ChunkState: x loaded two steps after B on two-slot rings: the B of it+2 waits for the mma of it+1, which
    # follows the scale of it+1, which waits for the x of it+1, loaded after the B of it+3
    "st_producer": with_loop(default_plan("mamba2_chunk_state", ST, ST2 | {"depth": 2}), [("scale", 0), ("mma", 0)],
                             [("load_b", 0), ("load_dA", 2), ("load_dt", 2), ("load_x", 2)]),
}


@pytest.mark.parametrize("name", sorted(DEADLOCK))
def test_deadlocking_plans_raise(name):
    with pytest.raises(CodegenError, match="deadlock"):
        emit(DEADLOCK[name])


def test_simulate_barrier_misuse():
    with pytest.raises(CodegenError, match="deadlock"):  # both wait for the other's turn first
        simulate({"a": [("sync", 1), ("arrive", 2)], "b": [("sync", 2), ("arrive", 1)]}, "t")
    with pytest.raises(CodegenError, match="wrong warpgroup"):  # two arrivals in one generation
        simulate({"a": [("arrive", 1), ("arrive", 1)], "b": [("sync", 1), ("sync", 1)]}, "t")
    simulate({"a": [("arrive", 2), ("sync", 1), ("arrive", 2)], "b": [("sync", 2), ("arrive", 1), ("sync", 2)]}, "t")


def test_deterministic():
    for p in (PLANS["fa_d128_g2_causal"], PLANS["st_g2_bk64_d3_overlap"]):
        assert emit(p).source == emit(KernelPlan.from_json(p.to_json())).source


def test_wait_depths():
    lo = LoopOrder((("mma_qk", 0), ("rowmax", 1), ("exp2", 1), ("rowsum", 1), ("rescale", 1), ("mma_pv", 1)))
    needs = {"rowmax": [("mma_qk", 0)], "rescale": [("mma_pv", -1)], "rowsum": [("mma_pv", -1)]}
    d = wait_depths(lo, {"mma_qk", "mma_pv"}, needs)
    # at rowmax(j-1): PV(j-2) and QK(j) were committed after QK(j-1) and may stay in flight
    assert d["rowmax"] == {"depth": 2}
    assert d["rowsum"] == {"depth": 1}  # PV(j-2) must be done before P(j-1) is packed
    assert d["rescale"] == {}  # rowsum's wait already covered PV(j-2): a second, weaker wait would serialise
    plain = LoopOrder(tuple((n, 0) for n, _ in lo.ops))
    assert wait_depths(plain, {"mma_qk", "mma_pv"}, needs)["rowmax"] == {"depth": 0}


# ------------------------------------------------------------------------------------------------ errors


def _with(plan, **kw):
    return dataclasses.replace(plan, **kw)


BASE_FA = default_plan("flash_attention", FA, T2)
BASE_G = gemm_plan(128, 256, 4, 2)
BASE_CS = default_plan("mamba2_chunk_scan", CS, cs_tiling(2, 64))
BASE_ST = default_plan("mamba2_chunk_state", ST, ST2)


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
    "BN_str": _with(BASE_G, tiling={**BASE_G.tiling, "BN": "256"}),
    "depth": _with(BASE_G, tiling={**BASE_G.tiling, "depth": 0}),
    "depth1": _with(BASE_G, tiling={**BASE_G.tiling, "depth": 1}),  # released one iteration late: needs two
    "BK": _with(BASE_G, tiling={**BASE_G.tiling, "BK": 32}),
    "smem": _with(BASE_G, tiling={**BASE_G.tiling, "depth": 8}),
    "unknown_tiling_key": _with(BASE_G, tiling={**BASE_G.tiling, "evil": 1}),
    "persistent_2": _with(BASE_G, tiling={**BASE_G.tiling, "persistent": 2}),
    "dtype": _with(BASE_G, params={**BASE_G.params, "dtype": "fp8; int x"}),
    "M_neg": _with(BASE_G, params={**BASE_G.params, "M": -5}),
    "M_bool": _with(BASE_G, params={**BASE_G.params, "M": True}),
    "K_odd": _with(BASE_G, params={**BASE_G.params, "K": 100}),
    "extra_param": _with(BASE_G, params={**BASE_G.params, "evil": "x"}),
    "head_dim": _with(BASE_FA, params={**FA, "head_dim": 48}),
    "gqa": _with(BASE_FA, params={**FA, "kv_heads": 3}),
    "fa_rows": _with(BASE_FA, tiling={**BASE_FA.tiling, "BM": 256}),
    "fa_bn": _with(BASE_FA, tiling={**BASE_FA.tiling, "BN": 72}),
    "tc_order": _with(BASE_FA, tc_order=["mma_qk@0", "bogus@1"]),
    "dep_violation": _loop(BASE_FA, "wg0", [("mma_qk@0", 0), ("exp2@0", 0), ("rowmax@0", 0), ("rowsum@0", 0),
                                            ("rescale@0", 0), ("mma_pv@0", 0)]),
    "three_score_buffers": _loop(BASE_FA, "wg0", [("mma_qk@0", 0), ("rowmax@0", 2), ("exp2@0", 2), ("rowsum@0", 2),
                                                  ("rescale@0", 2), ("mma_pv@0", 2)]),
    # FA19's 2^32-element q / o emit now (64-bit offsets, tests/codegen/test_decode.py); 2^31 rows of batch·seq do not
    "too_large": _with(BASE_FA, params=fa(batch=1 << 16, heads=1, kv_heads=1, seq_q=1 << 15, seq_kv=1 << 15)),
    "cs_head_dim": _with(BASE_CS, params=CS | {"head_dim": 128}),
    "cs_mma_first": with_loop(BASE_CS, [("mma", 0), ("decay", 0)]),
    "cs_scale_order": _with(BASE_CS, order={**BASE_CS.order, "pre": {**BASE_CS.order["pre"], "wg1": [
        ("scale_state@1", 0), ("mma_state@1", 0)]}}),
    "cs_index_limit": _with(BASE_CS, params=CS | {"batch": 2048, "seq": 1 << 20}),
    "st_d_state": _with(BASE_ST, params=ST | {"d_state": 192}),
    "st_regs_2cta": _with(BASE_ST, params=ST | {"head_dim": 128}, tiling=ST2 | {"ctas": 2}),
    "st_three_xs": with_loop(default_plan("mamba2_chunk_state", ST, ST2 | {"depth": 4}), [("scale", 0), ("mma", 3)]),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_plans_raise(name):
    with pytest.raises(CodegenError):
        emit(BAD[name])


def test_not_a_plan():
    with pytest.raises(CodegenError):
        emit({"op": "gemm"})  # type: ignore[arg-type]


def test_index_limits():
    """Batch 64, seq 16k (an x of 2^32 elements) emits: x, C and the outputs go through TMA coordinates and 64-bit
    offsets; the kernels' 32-bit ints are what CodegenError guards (cs_index_limit above)."""
    big = CS | {"batch": 64, "seq": 16384, "heads": 64, "groups": 1}
    assert emit(default_plan("mamba2_chunk_scan", big, cs_tiling(2, 64))).grid == (2 * 64 * 64 * 64, 1, 1)
    assert emit(default_plan("mamba2_chunk_state", big, ST2)).grid == (64 * 64 * 64, 1, 1)


def test_emit_cache():
    from codegen.runtime import emit_cached
    p = PLANS["gemm_g1_bn128_d2"]
    assert emit_cached(p) is emit_cached(KernelPlan.from_json(p.to_json()))
    with pytest.raises(CodegenError):
        emit_cached(BAD["BM"])
    with pytest.raises(CodegenError):
        emit_cached(_with(BASE_G, params={**BASE_G.params, "M": object()}))


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
    code = ("import sys; import codegen, codegen.cuda, codegen.runtime, codegen.harness, codegen.lower; "
            "assert 'cuda.bindings' not in sys.modules and 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(Path(__file__).resolve().parents[2]))


def test_tune_split_round_robin():
    from codegen.tune_runner import split
    assert split(5, 2) == [[0, 2, 4], [1, 3]]
    assert split(3, 1) == [[0, 1, 2]] and split(2, 0) == [[0, 1]]
    assert sorted(i for part in split(7, 3) for i in part) == list(range(7))


def test_tune_compile_only_fills_the_cache(tmp_path, monkeypatch):
    """`python3 -m codegen.tune_runner C --compile-only` (CPU) compiles exactly the kernels the GPU run launches (full
    and reduced shapes), so the device call finds them all in the carried cache."""
    if not _have_nvcc():
        pytest.skip("nvcc not available")
    import json

    from codegen import tune_runner
    from codegen.cuda import emit
    from codegen.harness import reduced
    from codegen.plan import plan_from_program
    from codegen.runtime import _key
    from ptsolve.program import SProgram

    d = json.loads((Path(__file__).parents[1] / "data" / "tune_h200_cands.json").read_text())
    d["candidates"] = d["candidates"][:1]
    (tmp_path / "c.json").write_text(json.dumps(d))
    monkeypatch.setenv("PTSOLVE_CACHE_DIR", str(tmp_path / "cache"))
    assert tune_runner.main([str(tmp_path / "c.json"), "--compile-only"]) == 0
    plan = plan_from_program(SProgram.from_json(d["candidates"][0]["program"]), d["hw"])
    want = {_key(emit(plan)), _key(emit(reduced(plan)))}
    got = {p.stem for p in (tmp_path / "cache" / "cubin").glob("*.cubin")}
    assert want <= got, (want, got)
    with pytest.raises(SystemExit):
        tune_runner.main([str(tmp_path / "c.json")])  # neither --out nor --compile-only


# ---------------------------------------------------------------------------------------------- split-K


def _split_kernel_c(kt: int, splits: int) -> list[int]:
    """Trip count of each split as the emitted C computes it (the tile decoder's K0 / T lines), evaluated with C's
    integer division by compiling nothing: the expressions are read from the source and run in Python."""
    import re
    ks = emit(default_plan("gemm", {"M": 64, "N": 64, "K": 64 * kt, "dtype": "fp16"},
                           {"BM": 64, "BN": 64, "BK": 64, "depth": 2, "groups": 1, "splits": splits}))
    k0 = re.search(r"const int K0 = (.*?);", ks.source).group(1)
    tl = re.search(r"(?:constexpr|const) int T = (.*?);", ks.source).group(1)
    out = []
    for sp in range(splits):
        env = {"split_": sp, "KT": kt, "SPLITS": splits}
        py = lambda e: e.replace("/", "//")  # noqa: E731 - non-negative ints: C's division truncates like //
        env["K0"] = eval(py(k0), {}, env)
        out.append(eval(py(tl), {}, env))
    return out


@pytest.mark.parametrize("kt,splits", [(64, 2), (65, 6), (16, 3), (7, 7), (100, 16)])
def test_split_k_ranges_cover_k_once(kt, splits):
    """The emitted kernel's K ranges are the model's (ptsolve.ops.gemm.split_trips): every K step in exactly one
    split, none empty, the graph's row the same trip counts."""
    from ptsolve import ops
    from ptsolve.ops.gemm import split_trips
    got = _split_kernel_c(kt, splits)
    assert got == list(split_trips(kt, splits))
    assert sum(got) == kt and min(got) >= 1
    g = ops.gemm(M=64, N=64, K=64 * kt).graph({"BM": 64, "BN": 64, "BK": 64, "depth": 2, "groups": 1,
                                              "splits": splits})
    assert list(g.row) == got and g.n_ctas == splits


def test_split_k_source_and_workspace():
    """A split kernel takes the workspace and counters, launches a grid of one CTA per (tile, split) and then the
    reduce CTAs (ptsolve.ops.gemm.reduce_ctas per tile), reads each split's K range, counts each warp's partial and
    stores nothing from a split unit; the reduce CTAs wait for every warp counter of their tile before any barrier
    is set up, sum the partials in split order and reset the counters; splits=1 emits none of it (persistent, no
    workspace)."""
    from ptsolve.ops.gemm import reduce_ctas
    one = emit(gemm_plan(128, 128, 4, 2))
    four = emit(gemm_plan(128, 128, 4, 2, splits=4))
    tiles = -(-1000 // 128) * -(-1024 // 128)
    rpt = reduce_ctas(1000, 1024, four.info["tiling"], 384, 132)
    assert rpt == max(1, min(128 * 128 // 4 // 384 + 1, 131 // tiles)) == 2 == four.info["reduce_ctas_per_tile"]
    assert four.args[-2:] == ("ptr:ws", "ptr:cnt") and "ptr:ws" not in one.args
    assert four.persistent_tiles == 0 and four.grid[0] == 4 * tiles + rpt * tiles and one.persistent_tiles == tiles
    assert four.info["workspace"] == {"ws": tiles * 4 * 128 * 128 * 4, "cnt": tiles * (2 * 4 + 1) * 4}
    assert "workspace" not in one.info
    src = four.source
    assert "(K0 + it_) * 64" in src and "atomicAdd(cnt + (tmn_ * GROUPS + g) * 4 + w, 1)" in src
    assert "if (SPLITS == 1) {" in src and "store_pair(c, r, col," in src  # splits: the reduce CTAs store
    assert src.index("blockIdx.x >= NTILES") < src.index("mbar_init(&")  # the reduce CTAs leave before any barrier
    assert "ld_acquire(ctr_ + threadIdx.x) < SPLITS" in src and "ctr_[k] = 0;" in src
    assert "a.x += v[u].x" in src and "in split order" in src
    assert src.index("atomicAdd(cnt + (tmn_") < src.index("cpk[m][i] =")  # counted before the epilogue packs
    assert "atomicAdd" not in one.source and "SPLITS = 1" in one.source and "blockIdx.x >= NTILES" not in one.source
    with pytest.raises(CodegenError, match="persistent=0"):
        emit(gemm_plan(128, 128, 4, 2, splits=4, persistent=1))


@pytest.mark.parametrize("M,N,BM,BN,threads", [(1, 1024, 64, 128, 256), (1, 8448, 64, 128, 256),
                                                (1000, 1024, 128, 128, 384), (16, 33000, 64, 256, 256)])
def test_reduce_ctas_stay_below_the_sms(M, N, BM, BN, threads):
    """Reduce CTAs per tile: one float4 per thread at most, fewer than the SMs in all (so a split always finds an SM),
    and as many as that allows (one more per tile would reach the SMs, or exceed the float4s)."""
    from ptsolve.ops.gemm import reduce_ctas
    t = {"BM": BM, "BN": BN}
    tiles = -(-M // BM) * -(-N // BN)
    r = reduce_ctas(M, N, t, threads, 132)
    assert 1 <= r <= -(-BM * BN // 4 // threads)
    assert tiles * r < 132 or r == 1
    assert r == -(-BM * BN // 4 // threads) or tiles * (r + 1) >= 132


def test_split_k_refused_beyond_k_steps():
    from ptsolve import ops
    from ptsolve.errors import ShapeError
    with pytest.raises(ShapeError, match="splits=9 exceeds the 8 K steps"):
        ops.gemm(M=64, N=64, K=512).graph({"BM": 64, "BN": 64, "BK": 64, "depth": 2, "groups": 1, "splits": 9})
    with pytest.raises(CodegenError, match="splits"):
        emit(dataclasses.replace(gemm_plan(64, 64, 2, 1), tiling={"BM": 64, "BN": 64, "BK": 64, "depth": 2,
                                                                  "groups": 1, "splits": 0}))


def test_split_k_in_the_space_and_chosen_for_skinny_m():
    """The search space offers split-K where output tiles are few, not for large M·N; the model picks it for a
    skinny shape (M=1, K=4096: 64 tiles of 64 columns leave half the SMs idle) and check_valid / simulate agree
    with the objective the policy claims."""
    import ptsolve
    from ptsolve.simulate import simulate
    from ptsolve.validate import check_valid
    assert any(t.get("splits", 1) > 1 for t in ptsolve.ops.gemm(M=1, N=4096, K=4096).tilings())
    assert all(t.get("splits", 1) == 1 for t in ptsolve.ops.gemm(M=8192, N=8192, K=8192).tilings())
    r = ptsolve.optimize(ptsolve.ops.gemm(M=1, N=4096, K=4096), hw="h200", solver="greedy", cache=False,
                         compile_check=False, executor="serial")
    assert r.program.graph.tiling.get("splits", 1) > 1, r.program.graph.tiling
    assert check_valid(r.program, "h200"), check_valid(r.program, "h200")
    assert simulate(r.program, "h200").kernel_cycles == r.objective
    unsplit = ptsolve.optimize(ptsolve.ops.gemm(M=1, N=4096, K=4096), hw="h200", solver="greedy", cache=False,
                               compile_check=False, executor="serial", fix={"splits": 1})
    assert r.predicted_us < unsplit.predicted_us


def test_gemm_space_report(tmp_path):
    """bench gemm_space report: "after" falls back to the old choice where the space has no split tiling, and to
    the top-1 candidate where the old space refused the shape; the geomeans are cuBLAS time / ours."""
    import json

    from bench.gemm_space import gemm_space
    t1 = {"BM": 64, "BN": 64, "BK": 64, "depth": 3, "groups": 1}
    cands = {"shapes": {
        "GEMM0": {"cands": {"before": {"tiling": t1, "predicted_us": 10.0},
                            "tune_c0": {"tiling": t1, "predicted_us": 10.0}}},
        "M1_4096x4096": {"cands": {"before": {"tiling": t1, "predicted_us": 20.0},
                                   "after": {"tiling": t1 | {"splits": 4}, "predicted_us": 10.0}}},
        "odd4095x4097x1024": {"cands": {"before": {"error": "ShapeError: N"},
                                        "tune_c0": {"tiling": t1, "predicted_us": 5.0}}}}}
    run = {"shapes": {"GEMM0": {"us": {"cublas": 9.0, "before": 10.0, "tune_c0": 9.5}},
                      "M1_4096x4096": {"us": {"cublas": 10.0, "before": 20.0, "after": 12.5}},
                      "odd4095x4097x1024": {"us": {"cublas": 40.0, "tune_c0": 10.0}}}}
    (tmp_path / "c.json").write_text(json.dumps(cands))
    (tmp_path / "r.json").write_text(json.dumps(run))
    md = gemm_space.report([tmp_path / "c.json"], tmp_path / "r.json")
    rows = {r.split("|")[1].strip(): [x.strip() for x in r.split("|")[1:-1]] for r in md.splitlines()
            if r.startswith("| ") and "geomean" not in r}
    assert rows["GEMM0"][5] == "10.0 (0.900)" and rows["GEMM0"][8] == "9.5 (0.947)"
    assert rows["M1_4096x4096"][5] == "12.5 (0.800)" and "split4" in rows["M1_4096x4096"][6]
    assert rows["M1_4096x4096"][7] == "2.00 / 1.60"
    assert rows["odd4095x4097x1024"][4] == "-" and rows["odd4095x4097x1024"][5] == "10.0 (4.000)"
    assert "| paper (GEMM0-3) | 1 | 0.900 | 0.900 | 0.947 |" in md
    assert f"| all | 3 | {(0.9 * 0.5) ** 0.5:.3f} | {(0.9 * 0.8 * 4.0) ** (1 / 3):.3f} |" in md


PP = {"BM": 128, "BN": 128, "BK": 64, "depth": 4, "groups": 1, "splits": 1, "pingpong": 1}


def test_pingpong_in_the_space_and_modelled_as_two_slots():
    """The GEMM space offers ping-pong (each of two warpgroups its own tile) where there are two tiles or more; its
    graph is one warpgroup's tile, run in two slots per SM that share the tensor cores and the copy engine (so the
    kernel is at least the shared units' floor), with two consumer warpgroups' registers; check_valid and simulate
    agree with the objective the policy claims."""
    import ptsolve
    from ptsolve.simulate import claimed, simulate, unit_floor
    from ptsolve.tiling import kernel_groups, slots_of
    from ptsolve.validate import check_valid
    op = ptsolve.ops.gemm(M=4096, N=4096, K=4096)
    pps = [t for t in op.tilings() if t.get("pingpong")]
    assert pps and all(t["groups"] == 1 and t["splits"] == 1 for t in pps)
    assert not any(t.get("pingpong") for t in ptsolve.ops.gemm(M=64, N=64, K=4096).tilings())  # one tile
    g = op.graph(PP, "h200")
    assert g.groups == 1 and g.tiling["pingpong"] == 1 and slots_of(g.tiling) == 2
    assert kernel_groups(g.groups, g.tiling) == 2
    assert "pingpong" not in op.graph(PP | {"pingpong": 0}, "h200").tiling  # cooperative graphs as they were
    from ptsolve.policies.model import fits
    assert fits(g, ptsolve.hw.load("h200")) is None
    assert "use pingpong=0" in fits(op.graph(PP, "mi300x"), ptsolve.hw.load("mi300x"))  # no wgmma / TMA there
    with pytest.raises(ptsolve.errors.ShapeError, match="groups=1"):
        op.graph(PP | {"BM": 256, "groups": 2}, "h200")
    r = ptsolve.optimize(op, hw="h200", solver="greedy", cache=False, compile_check=False, executor="serial",
                         fix={"pingpong": 1, "BM": 128, "BN": 128})
    p = r.program
    assert p.graph.tiling.get("pingpong") == 1
    assert check_valid(p, "h200"), check_valid(p, "h200")
    tl = simulate(p, "h200")
    assert tl.kernel_cycles == r.objective == claimed(p, ptsolve.hw.load("h200"))[0]
    assert len(tl.sm_busy) == 2 * 132  # two warpgroup slots per SM
    assert tl.kernel_cycles >= unit_floor(p.graph, ptsolve.hw.load("h200"), p.placement) > 0

    def pred(depth):
        r = ptsolve.optimize(op, hw="h200", solver="greedy", cache=False, compile_check=False, executor="serial",
                             fix={"pingpong": 1, "BM": 128, "BN": 128, "depth": depth})
        assert simulate(r.program, "h200").kernel_cycles == r.objective
        return r.predicted_us
    # the turns serialise the two warpgroups' main loops: a ring too shallow for one main loop's latency (depth 2,
    # released a step late) shows in the kernel's time, although the two slots could hide it from each other
    assert pred(2) > 1.2 * pred(4)


def test_pingpong_lowered_with_tile_turns():
    """The lowered ping-pong KernelIR: two consumer warpgroups, each with warpgroup 0's orders on its own tile, the
    alternating turn order mma@0 -> mma@1 -> mma@0, one ring released by the owner of each tile; the protocol
    simulator accepts it; the kernel takes the turn once per tile (sync before the main loop, arrive after it)."""
    from codegen.lower import lower
    from codegen.sync_sim import check
    ir = lower(gemm_plan(128, 128, 4, 1, pingpong=1), "h200")
    assert ir.pingpong and ir.turns and ir.groups == 2 and ir.threads == 384
    assert ir.tc_order == ("mma@0", "mma@1")
    assert [r.loop for r in ir.roles[1:]] == [(("mma@0", 0),), (("mma@1", 0),)]
    (ring,) = ir.rings
    assert ring.arrivals == 4 and {x.role for x in ring.releases} == {"wg0", "wg1"}
    assert {r: t for r, t in ring.waiters} == {"wg0": "mma@0", "wg1": "mma@1"}
    check(ir)
    from codegen.kernel_ir import KernelIR
    assert KernelIR.from_json(ir.to_json()) == ir
    ks = emit(ir)
    assert ks.info["tc_turns"] == (("wg0", "mma@0", "wg1", "mma@1", 2), ("wg1", "mma@1", "wg0", "mma@0", 1))
    src = ks.source
    wg0, wg1 = src.split("// ---- consumer warpgroup 0")[1].split("// ---- consumer warpgroup 1")
    assert 'if (g == 1) asm volatile("bar.arrive 1, 256;"' in src  # wg1 hands wg0 the first turn
    for part, mine, other, sync, arrive in ((wg0, 0, 1, 1, 2), (wg1, 1, 0, 2, 1)):
        assert f"if (lt % 2 != {mine}) {{ rbase += T; ++lt; continue; }}" in part
        assert part.index(f'"bar.sync {sync}, 256;"') < part.index("wgmma_ss") < part.index(
            f'asm volatile("bar.arrive {arrive}, 256;"') < part.index("wg_wait<0>();  // every wgmma")
        assert part.count("bar.sync") == 1 and part.count("bar.arrive") == 1  # once per tile, not per k-step
        assert f"@{other}" not in part.replace("// ---- consumer warpgroup 1", "")
    assert "constexpr int ROW0 = 0;" in wg1


def test_pingpong_broken_turn_order_fails():
    """Breaking the ping-pong turn order is caught: the reversed order (wg1's tile first) deadlocks in the protocol
    simulator (wg1's tile needs ring slots that only wg0's release frees), the emitter refuses it, and lowering
    without turns is refused (the model's protocol alternates the warpgroups on the tensor cores)."""
    from codegen.lower import lower
    from codegen.sync_sim import check
    plan = gemm_plan(128, 128, 4, 1, pingpong=1)
    ir = lower(plan, "h200")
    bad = dataclasses.replace(ir, tc_order=("mma@1", "mma@0"))
    with pytest.raises(CodegenError, match="deadlock"):
        check(bad)
    with pytest.raises(CodegenError, match="deadlock"):
        emit(bad)
    with pytest.raises(CodegenError, match="turns"):
        lower(plan, "h200", turns=False)
    with pytest.raises(CodegenError, match="persistent"):
        lower(plan, "h200", persistent=False)


def test_gemm_space_pingpong_report(tmp_path):
    """bench gemm_space report --pingpong: a plan found twice is timed once (``same_as``), the model's choice is
    named by structure, the gain is coop / ping-pong (predicted, measured), ratios are cuBLAS time / ours."""
    import json

    from bench.gemm_space import gemm_space
    co = {"BM": 128, "BN": 256, "BK": 64, "depth": 4, "groups": 2}
    pp = {"BM": 128, "BN": 128, "BK": 64, "depth": 4, "groups": 1, "pingpong": 1}
    cands = {"shapes": {
        "GEMM0": {"cands": {"pp": {"tiling": co, "predicted_us": 10.0, "same_as": "pp_coop"},
                            "pp_coop": {"tiling": co, "predicted_us": 10.0, "plan": "x"},
                            "pp_ping": {"tiling": pp, "predicted_us": 12.5, "plan": "y"},
                            "pp_ping_c0": {"tiling": pp, "predicted_us": 12.5, "same_as": "pp_ping"},
                            "pp_ping_c1": {"tiling": pp | {"depth": 3}, "predicted_us": 12.5, "plan": "z"},
                            "pp_probe0": {"tiling": pp | {"BM": 64, "BN": 256}, "predicted_us": 14.0, "plan": "w"}}},
        "GEMM1": {"cands": {"pp": {"tiling": pp, "predicted_us": 8.0, "same_as": "pp_ping"},
                            "pp_coop": {"tiling": co, "predicted_us": 10.0, "plan": "x"},
                            "pp_ping": {"tiling": pp, "predicted_us": 8.0, "plan": "y"}}}}}
    run = {"shapes": {"GEMM0": {"us": {"cublas": 9.0, "pp_coop": 10.0, "pp_ping": 9.0, "pp_ping_c1": 12.0,
                                       "pp_probe0": 8.0}},
                      "GEMM1": {"us": {"cublas": 9.0, "pp_coop": 10.0, "pp_ping": 12.0}}}}
    (tmp_path / "c.json").write_text(json.dumps(cands))
    (tmp_path / "r.json").write_text(json.dumps(run))
    md = gemm_space.report_pingpong([tmp_path / "c.json"], tmp_path / "r.json")
    rows = {r.split("|")[1].strip(): [x.strip() for x in r.split("|")[1:-1]] for r in md.splitlines()
            if r.startswith("| GEMM")}
    assert rows["GEMM0"][3:9] == ["10.0 (0.900)", "128x256 d4 g2", "9.0 (1.000)", "128x128 d4 g1 **pingpong**",
                                  "0.80 / 1.11", "9.0 (1.000)"]
    assert rows["GEMM0"][10] == "8.0 (1.125)" and rows["GEMM0"][12] == "coop"
    assert rows["GEMM0"][13] == "9.0 (1.000)"  # tune: the best of the cooperative and ping-pong top 3s
    assert rows["GEMM1"][7] == "1.25 / 0.83" and rows["GEMM1"][12] == "**ping-pong**"
    assert "| paper (GEMM0-3) | 2 | 0.900 | " in md and "chose ping-pong for 1 shape(s): GEMM1" in md


def test_round_compile_covers_what_run_launches(tmp_path, monkeypatch):
    """`python -m bench round compile` hands precompile every plan `run` times (each policy's, the hand plan) and
    each one's reduced-shape twin that `check` runs, so a device call with the carried cache runs no nvcc."""
    import shutil

    from bench.round import round as rnd
    from codegen import harness
    src = Path(__file__).parents[1] / "data" / "sched_new"
    for f in ("GEMM1_cpsat.json", "GEMM1_greedy.json", "FA3_cpsat.json", "FA3_greedy.json"):
        shutil.copy(src / f, tmp_path / f)
    got: list = []
    monkeypatch.setattr(harness, "precompile", lambda plans: got.extend(plans))
    assert rnd.main(["compile", "--schedules", str(tmp_path), "--persistent"]) == 0
    _, plans = rnd.plans_of(tmp_path, persistent=True)
    assert sorted(plans) == ["FA3", "GEMM1"] and set(plans["GEMM1"]) == {"cpsat", "greedy", "hand"}
    assert set(plans["FA3"]) == {"cpsat", "greedy", "hand", "cpsat+persistent", "greedy+persistent"}
    every = [p for d in plans.values() for p in d.values()]
    assert got == every + [rnd.reduced(p) for p in every]
