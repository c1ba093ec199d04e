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


def test_real_kernels_one_ptxas_serialises_and_one_it_keeps():
    bad = emit(SProgram.from_json((DATA / "fa_b16_d64_bn64_greedy_serialised.json").read_text()), load("h100"))
    good = emit(SProgram.from_json((DATA / "fa70b_causal_bn128_cpsat.json").read_text()), load("h100"))
    assert {h.array for h in hazards(bad.source)} == {"sacc0"}
    assert hazards(good.source) == []


@pytest.mark.skipif(not _have_nvcc(), reason="nvcc not installed")
def test_ptxas_agrees_on_the_serialised_one():
    from codegen.compile_check import check_cuda

    kc = check_cuda(SProgram.from_json((DATA / "fa_b16_d64_bn64_greedy_serialised.json").read_text()), load("h100"))
    assert kc.serialized is True
