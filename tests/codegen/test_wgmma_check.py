"""The wgmma pipeline check before ptxas (codegen.cuda.wgmma_check): an access of a register of an in-flight wgmma,
on some path, is a hazard; waits, constant folding, correlated branches and loop back edges decide which paths."""
from __future__ import annotations

from pathlib import Path

import pytest
from test_cuda import _have_nvcc

from codegen.cuda import emit
from codegen.cuda.wgmma_check import hazards
from ptsolve.hw import load
from ptsolve.program import SProgram

DATA = Path(__file__).parents[1] / "data"


def _kernel(body: str) -> str:
    """A kernel around ``body``: ``acc`` is a wgmma accumulator, ``a`` an A operand from registers."""
    return ('#include <stdint.h>\n__device__ void wgmma_ss_n64(float (&d)[32], uint64_t x) { asm volatile("{\\n}"); }\n'
            "__device__ void wgmma_rs_n64(float (&d)[32], uint32_t (&a)[4], uint64_t x) {}\n"
            'extern "C" __global__ void __launch_bounds__(128, 1) k(int T, float* out) {\n'
            "  float acc[32]; uint32_t a[4]; float s = 0.f;\n" + body + "\n  out[0] = s;\n}\n")


def _why(body: str) -> list[str]:
    return [f"{h.array}: {h.why}" for h in hazards(_kernel(body))]


def test_a_read_before_the_wait_is_a_hazard_and_after_it_is_not():
    issue = "wg_fence(); wgmma_ss_n64(acc, 0); wg_commit();\n"
    assert _why(issue + "s += acc[0];  // reads it in flight\nwg_wait<0>();") == [
        "acc: reading accumulator registers"]
    assert _why(issue + "wg_wait<0>();\ns += acc[0];") == []
    assert _why(issue + "acc[1] = 0.f;\nwg_wait<0>();") == ["acc: defining accumulator registers"]
    # wait<1> leaves the newest group in flight: the older one's registers are free, the newer one's are not
    two = "wgmma_ss_n64(acc, 0); wg_commit(); float b[32]; wgmma_ss_n64(b, 0); wg_commit(); wg_wait<1>();\n"
    assert _why(two + "s += acc[0];") == []
    assert _why(two + "s += b[0];") == ["b: reading accumulator registers"]
    # uncommitted wgmmas are in flight too
    assert _why("wgmma_ss_n64(acc, 0);\ns += acc[3];") == ["acc: reading accumulator registers"]


def test_an_a_operand_may_be_read_but_not_written_in_flight():
    issue = "wgmma_rs_n64(acc, a, 0); wg_commit();\n"
    assert _why(issue + "s += (float)a[0];") == []
    assert _why(issue + "a[0] = 1u;") == ["a: defining input registers"]


def test_fences_and_declarations_are_no_access():
    assert _why("wgmma_ss_n64(acc, 0); wg_commit();\nfence_regs(acc);\nfloat other[4];\nwg_wait<0>();") == []


def test_branches_on_the_same_condition_take_the_same_way():
    # the epilogue's guards: a group committed under a condition is waited for under the same one
    same = "if (T > 2) { wgmma_ss_n64(acc, 0); wg_commit(); }\nif (T > 2) { wg_wait<0>(); }\ns += acc[0];"
    assert _why(same) == []
    other = "if (T > 2) { wgmma_ss_n64(acc, 0); wg_commit(); }\nif (T > 3) { wg_wait<0>(); }\ns += acc[0];"
    assert _why(other) == ["acc: reading accumulator registers"]


def test_constants_fold_as_the_front_end_folds_them():
    body = ("constexpr int N = 2;\nconst int M = N > 1 ? 0 : 1;\nif (M) { wgmma_ss_n64(acc, 0); wg_commit(); }\n"
            "s += acc[0];")
    assert _why(body) == []  # the branch is dead
    assert _why(body.replace("N > 1", "N > 2")) == ["acc: reading accumulator registers"]


def test_a_group_in_flight_across_the_back_edge_meets_the_next_iterations_reads():
    loop = ("for (int j = 0; j < T; ++j) {\n  s += acc[0];\n  wgmma_ss_n64(acc, 0); wg_commit();\n%s}\nwg_wait<0>();")
    assert _why(loop % "") == ["acc: reading accumulator registers"]  # only the second iteration reads it in flight
    assert _why(loop % "  wg_wait<0>();\n") == []
    # a known trip count of one has no second iteration
    assert _why("for (int j = 0; j < 1; ++j) {\n  s += acc[0];\n  wgmma_ss_n64(acc, 0); wg_commit();\n}\n"
                "wg_wait<0>();") == []


def test_a_continue_carries_its_path_to_the_loop_head():
    body = ("for (int t = 0; t < T; ++t) {\n  s += acc[0];\n  wgmma_ss_n64(acc, 0); wg_commit();\n"
            "  if (t == 5) continue;\n  wg_wait<0>();\n}")
    assert _why(body) == ["acc: reading accumulator registers"]
    assert _why(body.replace("  if (t == 5) continue;\n", "")) == []


def test_declarator_lists_null_pointers_and_dead_branches_fold():
    """nvcc knows a fixed-shape build's trip count: ``constexpr int BM = 64, BN = 64`` binds both, ``p != nullptr``
    of a ``constexpr`` null pointer is false, and ``if (CAUSAL) T = ...`` with CAUSAL false writes nothing; without
    these folds the check walked paths nvcc deletes (a prologue skipped for T <= 1) and flagged clean kernels."""
    body = ("constexpr int D = 128, BN = 64;\nconstexpr int* cu = nullptr;\nconst bool VAR = cu != nullptr;\n"
            "constexpr bool CAUSAL = false;\nint T = VAR ? 1 : (256 + BN - 1) / BN;\n"
            "if (CAUSAL) { T = T - 3; }\n"
            "if (1 < T) { wgmma_ss_n64(acc, 0); wg_commit(); }\n"
            "if (T >= 2) { wg_wait<0>(); }\ns += acc[0];")
    assert _why(body) == []  # BN, the second declarator, is bound: T is 4
    assert _why(body.replace("CAUSAL = false", "CAUSAL = true")) == ["acc: reading accumulator registers"]
    assert _why(body.replace("cu = nullptr", "cu = &T")) == ["acc: reading accumulator registers"]


_UNROLLED = ("{\nint j = 1;\nfor (; j + 1 < %s; j += 2) {\n  wg_wait<0>();\n  s += acc[0];\n"
             "  wgmma_ss_n64(acc, 0); wg_commit();\n}\n}\nwg_wait<0>();\ns += acc[1];")


def test_an_unrolled_loop_with_a_known_count_left_in_flight_is_serialised():
    """ptxas serialises a loop unrolled over register copies (step 2) that exits with an accumulator in flight once
    its trip count is a constant; the same loop with a runtime count, or left with every group retired, is kept."""
    assert _why("constexpr int N = 47;\n" + _UNROLLED % "N") == ["acc: reading accumulator registers"]
    assert _why(_UNROLLED % "T") == []  # a runtime count: the same kernel compiles clean
    retired = _UNROLLED.replace("wg_commit();\n}", "wg_commit(); wg_wait<0>();\n}")
    assert _why("constexpr int N = 47;\n" + retired % "N") == []
    step1 = _UNROLLED.replace("j += 2", "++j").replace("j + 1 <", "j <")
    assert _why("constexpr int N = 47;\n" + step1 % "N") == []  # step-1 loops with a known count compile clean


def test_a_join_of_an_in_flight_accumulator_and_a_rewritten_one_is_serialised():
    """Where an ``if``'s ways meet with an accumulator in flight on one and retired and rewritten on the other, ptxas
    serialises (the guarded prologue of a causal tile); each way alone is clean."""
    body = ("wgmma_ss_n64(acc, 0); wg_commit();\nif (1 < T) { wg_wait<0>(); acc[0] *= 2.f; }\nwg_wait<0>();\n"
            "s += acc[0];")
    assert _why(body) == ["acc: defining accumulator registers"]
    assert _why(body.replace("acc[0] *= 2.f;", "s += 1.f;")) == []  # not rewritten: one value reaches the join
    assert _why(body.replace("wg_commit();\nif", "wg_commit(); wg_wait<0>();\nif")) == []  # retired on both ways
    assert _why("constexpr int N = 4;\n" + body.replace("1 < T", "1 < N")) == []  # a folded branch joins nothing
    other = body.replace("{ wg_wait<0>(); acc[0] *= 2.f; }", "{ s += 1.f; } else { wg_wait<0>(); acc[0] = 0.f; }")
    assert _why(other) == ["acc: defining accumulator registers"]  # either way may be the rewriting one


def test_real_kernels_one_ptxas_serialises_and_one_it_keeps():
    # ptxas serialises this one (C7514; bench study compile_verdicts, the dev set's b4 h28/4 s3000 d128 BM64/BN64
    # CP-SAT schedule): an unrolled loop with a known trip count left with the P.V wgmma in flight
    bad = emit(SProgram.from_json((DATA / "fa_b4_d128_bm64_bn64_cpsat_serialised.json").read_text()), load("h100"))
    good = emit(SProgram.from_json((DATA / "fa70b_causal_bn128_cpsat.json").read_text()), load("h100"))
    assert {(h.array, h.why) for h in hazards(bad.source)} == {("o", "reading accumulator registers")}
    assert hazards(good.source) == []


@pytest.mark.skipif(not _have_nvcc(), reason="nvcc not installed")
def test_ptxas_agrees_on_the_serialised_one():
    from codegen.compile_check import check_cuda

    kc = check_cuda(SProgram.from_json((DATA / "fa_b4_d128_bm64_bn64_cpsat_serialised.json").read_text()),
                    load("h100"))
    assert kc.serialized is True


def _c7511(body: str) -> list[str]:
    from codegen.cuda.wgmma_check import rewrites

    return [h.array for h in rewrites(_kernel(body))]


_MMA = "wgmma_ss_n64(acc, 0); wg_commit(); wg_wait<0>();\n"
_HALF = "for (int i = 0; i < 16; ++i) acc[i] *= 0.5f;\n"


def test_an_accumulator_rewritten_in_part_before_a_wgmma_is_refused():
    """ptxas gives up the pipeline (C7511, "insufficient register resources") where a wgmma accumulates into an
    array ordinary code rewrote in part since its last wgmma, whatever the register pressure (bench study
    compile_verdicts, probes synthetic: a 32-register accumulator); all of it or none of it compiles clean."""
    assert _c7511(_MMA + _HALF + _MMA) == ["acc"]
    assert _c7511(_MMA + _HALF.replace("16", "32") + _MMA) == []  # all of it rewritten
    assert _c7511(_MMA + "for (int i = 0; i < 16; ++i) s += acc[i];\n" + _MMA) == []  # read, not rewritten
    # two halves rewrite all of it
    assert _c7511(_MMA + _HALF + "for (int i = 16; i < 32; ++i) acc[i] *= 0.25f;\n" + _MMA) == []
    # a zero-scale wgmma (``_z``) reads no accumulator: nothing to mix
    assert _c7511(_MMA + _HALF + _MMA.replace("wgmma_ss_n64(", "wgmma_ss_n64_z(")) == []


def test_a_loop_head_or_a_loop_carrying_the_accumulator_spares_a_partial_rewrite():
    """Observed: the same rewrite inside a loop that carries the accumulator (FlashAttention's rescale over 96 of 128
    columns before P.V) compiles clean, and so does a rewrite at the end of a loop body before a wgmma after the
    loop; after the loop (the epilogue's rescale), or in a loop that zeroes the accumulator every trip, it does
    not."""
    loop = "for (int j = 0; j < T; ++j) {\n%s}\n"
    assert _c7511(loop % (_HALF + _MMA)) == []  # carried: live at the loop's head
    assert _c7511(loop % (_MMA + _HALF) + _MMA) == []  # a loop head between the rewrite and the wgmma
    assert _c7511(loop % _MMA + _HALF + _MMA) == ["acc"]  # after the loop
    zeroed = "for (int i = 0; i < 32; ++i) acc[i] = 0.f;\n" + _MMA + _HALF + _MMA + "s += acc[0];\n"
    assert _c7511(loop % zeroed) == ["acc"]  # not carried: the loop rewrites all of it first


def test_real_kernels_with_the_partial_rescale():
    """The held-out set's d96 BM64 kernels: the greedy schedule rescaled o (64 registers, 48 of them the head dim's)
    after the loop and then ran P.V: C7511 (its source as the generator emitted it before rescaling all of O, kept
    in tests/data); the FA3 order rescales at the end of the loop body: clean; and the generator now rescales the
    padded columns too, so the same greedy schedule has no partial rewrite."""
    from codegen.cuda.wgmma_check import rewrites

    bad = (DATA / "fa_d96_bm64_bn128_greedy_c7511.cu").read_text()
    now = emit(SProgram.from_json((DATA / "fa_d96_bm64_bn128_greedy_c7511.json").read_text()), load("h100"))
    good = emit(SProgram.from_json((DATA / "fa_d96_bm64_bn128_fa3_clean.json").read_text()), load("h100"))
    assert [h.array for h in rewrites(bad)] == ["o"]
    assert rewrites(good.source) == [] and rewrites(now.source) == []


def _pressure_kernel(body: str) -> str:
    return _kernel(body).replace("float acc[32];", "float acc[32]; float b[32]; float c[32]; float big[192];")


def test_registers_pinned_by_wgmmas_in_flight_with_those_live_beside_them():
    """The pressure counts, at each statement with a wgmma in flight, the arrays in flight and those live there
    (read later before rewritten); a kernel is refused where they alone pass the consumer's budget."""
    from codegen.cuda.wgmma_check import over_budget, pressure

    src = _pressure_kernel("for (int i = 0; i < 192; ++i) big[i] = 1.f;\n"
                           "wgmma_ss_n64(acc, 0); wg_commit();\nwg_wait<0>();\n"
                           "for (int i = 0; i < 192; ++i) s += big[i];\ns += acc[0];")
    p = pressure(src)
    assert (p.peak, p.pinned, p.live, p.budget) == (224, ("acc",), ("big",), 255)  # 32 + 192; 64K / 256 threads
    assert over_budget(src) is None
    assert over_budget(src.replace("__launch_bounds__(128, 1)", "__launch_bounds__(384, 1)")) is not None  # 168
    # big dead by the time the wgmma is issued: not counted
    dead = src.replace("for (int i = 0; i < 192; ++i) s += big[i];\n", "").replace(
        "big[i] = 1.f;", "big[i] = 1.f;\nfor (int i = 0; i < 192; ++i) s += big[i];")
    assert pressure(dead).peak == 32


def test_predict_refusal_is_the_search_s_question_before_nvcc():
    """codegen.compile_check.predict_refusal: a reason for a kernel a rule refuses, None for one predicted clean;
    it takes a program or its CUDA source, and needs no nvcc."""
    from codegen.compile_check import predict_refusal

    hw = load("h100")
    bad = (DATA / "fa_d96_bm64_bn128_greedy_c7511.cu").read_text()  # the source before O was rescaled whole
    good = SProgram.from_json((DATA / "fa_d96_bm64_bn128_fa3_clean.json").read_text())
    assert "C7511" in predict_refusal(bad, hw)
    assert predict_refusal(good, hw) is None
    assert predict_refusal(emit(good, hw).source, hw) is None
    serialised = SProgram.from_json((DATA / "fa_b4_d128_bm64_bn64_cpsat_serialised.json").read_text())
    assert "reading accumulator registers" in predict_refusal(serialised, hw)


def test_a_loop_entered_with_only_empty_groups_and_left_in_flight_at_its_back_edge_is_serialised():
    """ptxas serialises (C7515) a loop entered with only empty groups committed (a prologue's ``wg_commit()`` in place
    of a stage not reached yet) whose back edge carries an accumulator in flight; a real group before it, a wait
    before the back edge, or a GEMM-like chain with a constant trip count keeps the pipeline (bench study
    compile_verdicts, probes synthetic; the three-warpgroup BM192 kernels)."""
    body = ("float b[32];\n%s\n#pragma unroll 1\nfor (int j = 0; j < %s; ++j) {\n"
            "  wgmma_ss_n64(b, 0); wg_commit(); wg_wait<0>();\n  wgmma_ss_n64(acc, 0); wg_commit();\n%s}\n"
            "wg_wait<0>();\ns += acc[0] + b[0];")
    assert _why(body % ("wg_commit();", "T", "")) == ["acc: defining accumulator registers"]
    assert _why(body % ("wg_commit();", "63", "")) == ["acc: defining accumulator registers"]  # not a chain
    assert _why(body % ("wg_commit();", "T", "  wg_wait<0>();\n")) == []  # nothing in flight at the back edge
    assert _why(body % ("wgmma_ss_n64(b, 0); wg_commit();", "T", "")) == []  # a real group before the loop
    chain = ("wg_commit();\n#pragma unroll 1\nfor (int j = 0; j < %s; ++j) {\n  wgmma_ss_n64(acc, 0); wg_commit();"
             " wg_wait<1>();\n}\nwg_wait<0>();\ns += acc[0];")
    assert _why(chain % "T") == ["acc: defining accumulator registers"]
    assert _why(chain % "63") == []  # GEMM's main loop: a chain nvcc knows the count of
    assert _why(chain.replace("#pragma unroll 1\n", "") % "8") == []  # unrolled: no back edge in ptxas's input


def test_scores_written_from_scratch_in_flight_at_the_back_edge_are_serialised():
    """A loop whose back edge carries in flight an accumulator its body writes from scratch (a zero-scale ``_z``
    wgmma: FlashAttention's scores issued last) and that the next iteration retires with a partial wait (the group
    committed after it still in flight) is serialised (C7514); retired by ``wg_wait<0>``, or waited for before the
    back edge, it is not (bench study compile_verdicts: the development set's 12 such kernels, probes synthetic)."""
    body = ("float b[32];\nwgmma_ss_n64_z(b, 0); wg_commit();\n#pragma unroll 1\nfor (int j = 0; j < T; ++j) {\n"
            "  wgmma_ss_n64(acc, 0); wg_commit(); wg_wait<1>();\n  s += b[1];\n  wgmma_ss_n64_z(b, 0); wg_commit();\n"
            "}\nwg_wait<0>();\ns += acc[0] + b[0];")
    src = _kernel(body).replace("__device__ void wgmma_rs_n64", "__device__ void wgmma_ss_n64_z(float (&d)[32], "
                                "uint64_t x) {}\n__device__ void wgmma_rs_n64")
    assert [f"{h.array}: {h.why}" for h in hazards(src)] == ["b: reading accumulator registers"]
    assert hazards(src.replace("wg_commit();\n}", "wg_commit();\n  wg_wait<0>();\n}")) == []  # before the back edge
    assert hazards(src.replace("wg_wait<1>();\n  s += b[1]", "wg_wait<0>();\n  s += b[1]")) == []  # a full wait


@pytest.mark.skipif(not _have_nvcc(), reason="nvcc not installed")
def test_the_generator_rescales_all_of_o_and_ptxas_keeps_the_pipeline(tmp_path, monkeypatch):
    """The d96 greedy schedule ptxas used to serialise (C7511: O rescaled in part, then P.V accumulating into it) now
    compiles clean: the generator rescales O's padded columns too (codegen.cuda.attention, rescale)."""
    from codegen.compile_check import check_cuda

    monkeypatch.setenv("PTSOLVE_CACHE_DIR", str(tmp_path))
    kc = check_cuda(SProgram.from_json((DATA / "fa_d96_bm64_bn128_greedy_c7511.json").read_text()), load("h100"))
    assert kc.ok and not kc.serialized and kc.spill_bytes == 0, kc
