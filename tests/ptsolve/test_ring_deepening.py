"""The ring deepening of a search's winner (Hardware.deep_ring_max, policies.model.deepen): same schedule, same
objective, a deeper ring where the operator's table asks for one and the loop streams memory, never against the
caller's fix, a given graph or the compiler's rejections."""
from __future__ import annotations

import dataclasses

import pytest

import ptsolve
from ptsolve.hw import load
from ptsolve.policies.model import deepen
from ptsolve.search import search

H200 = load("h200")
FLAT = dataclasses.replace(H200, op_constants={k: {**v, "deep_ring_max": 0} for k, v in H200.op_constants.items()})
SQ = ptsolve.ops.gemm(M=1024, N=1024, K=1024)


def test_table_asks_gemm_for_depth_8():
    assert H200.for_op("gemm").deep_ring_max == 8 and H200.for_op("flash_attention").deep_ring_max == 0


def test_winner_deepened_with_its_schedule():
    a, b = search(SQ, FLAT, solver="greedy"), search(SQ, H200, solver="greedy")
    assert a.tiling["depth"] <= 5 and b.tiling["depth"] == 8  # the space's depths stop at 5
    assert {k: v for k, v in a.tiling.items() if k != "depth"} == {k: v for k, v in b.tiling.items() if k != "depth"}
    assert (a.objective, a.program.ii, a.program.start) == (b.objective, b.program.ii, b.program.start)
    assert b.program.rings and max(b.program.rings.values()) == 8


def test_never_against_the_caller():
    assert search(SQ, H200, solver="greedy", fix={"depth": 5}).tiling["depth"] == 5
    g = SQ.graph({"BM": 64, "BN": 128, "BK": 64, "depth": 5, "groups": 1, "pingpong": 1}, H200)
    assert search(g, H200, solver="greedy").tiling["depth"] == 5  # a given graph is the caller's
    t = search(SQ, H200, solver="greedy").tiling
    stop = search(SQ, H200, solver="greedy", exclude=(t | {"depth": 7},))  # the compiler rejected depth 7
    assert stop.tiling["depth"] == 6


def test_only_where_the_loop_streams_memory():
    big = ptsolve.ops.gemm(M=4096, N=1024, K=4096)  # tensor-core bound: its depth is the space's
    r = search(big, H200, solver="greedy")
    assert r.tiling["depth"] <= 5
    p = r.program
    assert deepen(p, H200) is p


@pytest.mark.parametrize("op", [ptsolve.ops.flash_attention(batch=1, heads=8, seq=512)])
def test_other_operators_untouched(op):
    r = search(op, H200, solver="greedy")
    assert deepen(r.program, H200) is r.program


def test_tune_candidates_are_what_optimize_returns():
    from ptsolve.tune import candidates
    cs, _ = candidates(SQ, H200, 2, solver="greedy", check=False)
    assert all(c.tiling["depth"] == 8 for c in cs if c.tiling.get("splits", 1) == 1 and c.tiling["BM"] == 64)
    assert cs[0].tiling == search(SQ, H200, solver="greedy").tiling
    fixed, _ = candidates(SQ, H200, 1, solver="greedy", check=False, fix={"depth": 5})
    assert fixed[0].tiling["depth"] == 5
