"""The greedy policy pinned to the paper (ptsolve/policies/greedy.py, rules 1-5): worked examples whose greedy
schedule is computed by hand, one per priority rule, and the greedy baseline of the paper suite.

Units: the TINY table of test_policies_equal makes every duration a whole number of grains (Q cycles each):
a vector task of F FLOPs holds its warpgroup F/Q grains, an mma of F FLOPs issues in 1 grain (its warpgroup)
and holds the tensor cores F/Q grains, crossing streams costs a 1-grain barrier. Starts below are in grains.
"""
from __future__ import annotations

import pytest
from test_policies_agree import TINY, Q
from test_schedule_checks import two_stage_gemm

from ptsolve import optimize
from ptsolve.ir import Edge, STask, STaskGraph
from ptsolve.policies import greedy, model
from ptsolve.simulate import claimed_cycles
from ptsolve.suites import operator, paper


def vec(name: str, grains: int, group: int = 0) -> STask:
    return STask(name, "vector", flops=grains * Q, group=group)


def schedule(tasks: tuple[STask, ...], edges: tuple[Edge, ...] = ()) -> tuple[int, dict[str, int]]:
    """(ii, starts) of greedy's program, in grains."""
    g = STaskGraph("worked", "test", {}, {"depth": 1}, tasks, edges, (2,), 1, 1)
    p, st = greedy.solve(model.build(g, TINY))
    assert st["status"] == "FEASIBLE" and p.placement == "even"  # rule 1: the paper's even split
    return p.ii // Q, {t: s // Q for t, s in p.start.items()}


def test_rule_3a_asynchronous_first() -> None:
    # wg0 runs an mma (async: holds wg0 1 grain to issue) and a 3-grain vector task (sync), no edges:
    # ii = 4 (wg0 busy 1 + 3). At 0 both are ready; the mma goes first although "a" < "m" by name, and the
    # vector task follows when wg0 is free, at 1. (Synchronous first would give a at 0, m at 3.)
    ii, s = schedule((vec("a", 3), STask("m", "mma", flops=Q, group=0, is_async=True)))
    assert (ii, s) == (4, {"m": 0, "a": 1})


def test_rule_3b_fewer_unscheduled_predecessors_first() -> None:
    # wg0: a_carried (2 grains) and z_free (1 grain); wg1: y (1 grain) after z_free; y feeds a_carried of the
    # next iteration. ii = 3 (wg0). At 0, a_carried still waits for y (1 unscheduled predecessor), z_free for
    # nothing: z_free at 0, then a_carried at 1 (wg0 free), y at 2 (z_free's 1 grain + the 1-grain barrier).
    # y -> a_carried holds: 1 + 3 >= 2 + 1 + 1. (The other order, a_carried at 0, leaves y at 4 > 0 + 3 - 2:
    # no schedule at ii = 3.)
    ii, s = schedule((vec("a_carried", 2), vec("z_free", 1), vec("y", 1, group=1)),
                     (Edge("z_free", "y"), Edge("y", "a_carried", 1)))
    assert (ii, s) == (3, {"z_free": 0, "a_carried": 1, "y": 2})


def test_rule_3c_more_dependants_first() -> None:
    # wg0: a_leaf and z_root (1 grain each); wg1: w after z_root. ii = 2. z_root has a dependant, a_leaf none:
    # z_root at 0, a_leaf at 1, w at 2 (1 grain + barrier). (Fewer dependants first: a_leaf 0, z_root 1, w 3.)
    ii, s = schedule((vec("a_leaf", 1), vec("z_root", 1), vec("w", 1, group=1)), (Edge("z_root", "w"),))
    assert (ii, s) == (2, {"z_root": 0, "a_leaf": 1, "w": 2})


def test_rule_3d_name_breaks_the_last_tie() -> None:
    ii, s = schedule((vec("b", 1), vec("a", 2)))
    assert (ii, s) == (3, {"a": 0, "b": 2})


def test_rule_2_phases_in_order() -> None:
    # a prologue task on wg1 and a loop task on wg0 are both ready at 0 and share no resource; the loop waits
    # for the prologue to be placed but not to finish: both start at 0. The epilogue (after the loop task,
    # 1 grain) starts at 1 in the last iteration's frame.
    ii, s = schedule((STask("pre", "vector", phase="pre", flops=5 * Q, group=1), vec("body", 1),
                      STask("post", "vector", phase="post", flops=Q, group=0)), (Edge("body", "post"),))
    assert (ii, s) == (1, {"pre": 0, "body": 0, "post": 1})
    # the epilogue waits for every loop task, even one that sorts after it: body (0) and z_body (1) fill ii = 2 on
    # wg0; post, ready once body is placed, starts at 2, after the loop's reservations on wg0
    ii, s = schedule((vec("body", 1), vec("z_body", 1), STask("post", "vector", phase="post", flops=Q, group=0)),
                     (Edge("body", "post"),))
    assert (ii, s) == (2, {"body": 0, "z_body": 1, "post": 2})


def test_rules_4_and_5_wait_and_smallest_interval() -> None:
    # The two-stage GEMM of test_schedule (cycles): load (TMA 96, result after 192 + 8 barrier) then mma (tensor
    # cores 160); the slot the mma of i reads is released once the mma of i+1 is issued (8) and the producer hears
    # of it (+8): the load of i+2 waits for that, so ii >= 200 + 16 = 216 (protocol.releases, "commit").
    # Greedy tries ii = 216 first (the recurrence bound): load at 0 (the only ready task), then nothing fits at
    # 0, so time advances to 200, when the mma's input is ready.
    g, hw = two_stage_gemm()
    p, st = greedy.solve(model.build(g, hw))
    assert p.ii == 216 and p.start == {"load": 0, "mma": 200} and st["ii_tries"] == 1 and st["solve_s"] >= 0
    assert claimed_cycles(p, hw) == 3 * 216 + 360


def test_priority_key_is_rule_3() -> None:
    left = {"x": 1, "y": 0}  # x waits for one unscheduled predecessor (u), y for none
    assert greedy.priority("x", {"x": True}, left, {"x": 0}) < greedy.priority("y", {"y": False}, left, {"y": 9})
    assert greedy.priority("y", {"y": False}, left, {"y": 0}) < greedy.priority("x", {"x": False}, left, {"x": 9})
    assert greedy.priority("x", {"x": False}, {"x": 0}, {"x": 0}) < greedy.priority("y", {"y": False}, left, {"y": 0})


# The greedy baseline every speedup of `ptsolve compare` (the main job) is measured against (kernel cycles on h100,
# PTSOLVE_GRAIN=8): a change to the policy, the cost model or the tilings moves these, and must be deliberate.
# 2026-12-01: attention's space gained persistent CTAs (FA5c 942000 -> 752128, FA19 428976000 -> 423005120).
# 2026-12-02: co-resident CTAs' copy-engine floor splits DRAM over the SMs a launch keeps busy (floor_of):
# ST0's grid of fewer than two CTAs per SM, 13968 -> 13696.
GREEDY_H100 = {"FA0": 19936, "FA5c": 752128, "FA19": 423005120, "GEMM0": 105616, "GEMM3": 3172488, "CS0": 36416,
               "CS9": 36161088, "ST0": 13696, "ST9": 13870224}


@pytest.mark.parametrize("name", sorted(GREEDY_H100))
def test_greedy_baseline_of_the_paper_suite(name: str) -> None:
    cfg = next(c for c in paper() if c["name"] == name)
    r = optimize(operator(cfg), hw="h100", solver="greedy", cache=False)
    assert r.objective == GREEDY_H100[name]
