"""The wait before the back edge (codegen.cuda.skeleton._back_edge_wait): where a consumer loop's first task begins
with a wgmma wait, the steady iteration ends with the same wait, so ptxas sees every wgmma pipeline stage close in the
iteration that opened it. The schedule is the CP-SAT optimum of a 70B-style causal attention (batch 1, 32/8 heads,
seq 1536, d128, BM128/BN128, h100) that ptxas serialised without it (bench study compile_verdicts)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_cuda import _have_nvcc

from codegen.cuda import emit
from codegen.cuda.skeleton import _back_edge_wait
from codegen.loop import LoopOrder
from ptsolve.hw import load
from ptsolve.program import SProgram

PROG = Path(__file__).parents[1] / "data" / "fa70b_causal_bn128_cpsat.json"


def _loops(src: str) -> list[str]:
    """The steady loops' bodies of a kernel source, in order (text from the for line to its closing brace)."""
    out = []
    for m in re.finditer(r"for \(int j = \d+; j < [^;]+; \+\+j\) \{\n", src):
        depth, i = 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(src[i], 0)
            i += 1
        out.append(src[m.end():i - 1])
    return out


def test_only_a_first_task_that_waits_before_it_issues_gets_the_tail():
    order = LoopOrder((("rowmax", 1), ("rescale", 1), ("mma_pv", 1), ("mma_qk", 0)))
    assert _back_edge_wait(order, {"rowmax": {"depth": 0}}, {"mma_pv", "mma_qk"}).startswith("wg_wait<0>();")
    assert _back_edge_wait(order, {"rowmax": {"depth": 1}}, {"mma_pv", "mma_qk"}).startswith("wg_wait<1>();")
    assert _back_edge_wait(order, {"rowmax": {}}, {"mma_pv", "mma_qk"}) == ""  # an earlier wait covered it
    # a committing first task waits after its own issue: a wait before the back edge would come earlier than that
    mma_first = LoopOrder((("mma_qk", 0), ("rowmax", 0)))
    assert _back_edge_wait(mma_first, {"mma_qk": {"depth": 1}}, {"mma_qk"}) == ""


def test_the_loop_that_left_wgmma_in_flight_across_its_back_edge_waits_before_it():
    src = emit(SProgram.from_json(PROG.read_text()), load("h100")).source
    loops = _loops(src)
    assert len(loops) == 3  # the producer's and the two consumer warpgroups'
    # wg1 issues PV and QK last and reads QK first (rowmax): its iteration ends with rowmax's wait
    assert loops[2].rstrip().endswith("wg_wait<0>();  // rowmax@1's wait before the back edge: each wgmma stage "
                                      "ends in its iteration")
    # wg0 issues PV and QK first: nothing changes there
    assert "before the back edge" not in loops[1]


@pytest.mark.skipif(not _have_nvcc(), reason="nvcc not installed")
def test_ptxas_no_longer_serialises_it():
    from codegen.compile_check import check_cuda

    kc = check_cuda(SProgram.from_json(PROG.read_text()), load("h100"))
    assert kc.status == "ok" and kc.serialized is False and kc.spill_bytes == 0, kc.reason
