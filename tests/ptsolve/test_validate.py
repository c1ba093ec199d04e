"""check_valid's verdicts and messages on programs built by hand (mutants of validate.py that survived the other
tests), and the search's lower bounds worked out by hand."""
from __future__ import annotations

from dataclasses import replace

import pytest
from strategies import tiny_hw
from test_schedule_checks import two_stage_gemm

from ptsolve import check_valid, simulate
from ptsolve.ir import Buffer, Edge, STask, STaskGraph
from ptsolve.policies import greedy, model
from ptsolve.program import Barrier, make_program
from ptsolve.search import ends_lower_bound, lower_bound

HW = tiny_hw(sms=1)  # a 64-FLOP vector task holds its warpgroup 1 cycle, rounded up to one 8-cycle grain


def two_on_one_stream(a: int, b: int, ii: int = 16) -> object:
    """Vector tasks A and B (8 cycles each) on warpgroup 0, no edges, starting at ``a`` and ``b``."""
    g = STaskGraph("ab", "test", {}, {"depth": 1, "groups": 1},
                   (STask("A", "vector", flops=64, group=0), STask("B", "vector", flops=64, group=0)), (), (3,), 1, 1)
    return make_program(g, HW, ii, {"A": a, "B": b})


def test_deadlock_through_the_wrap_of_a_pipelined_stream() -> None:
    # A at 16 (stage 1, slot 0), B at 8 (stage 0, slot 8): the body issues A(j-1) then B(j). A barrier "B@i waits
    # for A@i" waits for an A issued one body later, after B: a deadlock through the wrap (distance 1 + 0 - 1 = 0)
    p = two_on_one_stream(16, 8)
    assert p.streams(HW)["loop"]["wg0"] == [("A", 1), ("B", 0)] and check_valid(p, HW)
    v = check_valid(replace(p, barriers=(Barrier("A", "B", 0),)), HW)
    assert not v and "deadlock" in str(v) and "wg0 wraps from B to A" in str(v)


def test_deadlock_across_stages_in_one_body() -> None:
    # A at 0 (stage 0), B at 24 (stage 1, slot 8): the body issues A(j) then B(j-1); "A@i waits for B@i" waits for
    # a B issued in the next body (distance 0 - 1 = -1 along the stream)
    p = two_on_one_stream(0, 24)
    assert p.streams(HW)["loop"]["wg0"] == [("A", 0), ("B", 1)] and check_valid(p, HW)
    v = check_valid(replace(p, barriers=(Barrier("B", "A", 0),)), HW)
    assert not v and "deadlock" in str(v) and "wg0 issues A before B" in str(v)
    v = check_valid(replace(p, barriers=(Barrier("B", "A", 1),)), HW)  # B(i) is issued after A(i+1) too
    assert not v and "deadlock" in str(v)
    assert check_valid(replace(p, barriers=(Barrier("B", "A", 2),)), HW)  # but before A(i+2)


def test_violation_messages() -> None:
    p = two_on_one_stream(0, 8)
    v = check_valid(replace(p, start={"A": 0}), HW)
    assert str(v) == "invalid:\n  tasks not scheduled: ['B']; give every task a start time"
    v = check_valid(replace(two_on_one_stream(8, 24), ii=4), HW)
    assert "A holds wg0 for 8 cycles, longer than ii=4" in str(v)
    v = check_valid(replace(p, start={"A": 0, "B": 4}), HW)
    assert "wg0 holds A [0,8) and B [4,12) at once (modulo ii=16)" in str(v)
    g = STaskGraph("ring", "test", {}, {"depth": 2, "groups": 1}, (
        STask("ld", "load", bytes=64, is_async=True, allocs=(Buffer("k", "smem", 64),)),
        STask("acc", "vector", flops=64, group=0, reads=("k",), frees=("k",), allocs=(Buffer("s", "reg", 512),)),
        STask("use", "vector", flops=64, group=0, reads=("s",), frees=("s",))),
        (Edge("ld", "acc"), Edge("acc", "use")), (2,), 1, 1)
    q, _ = greedy.solve(model.build(g, HW))
    assert check_valid(q, HW)
    v = check_valid(replace(q, rings={}, copies={}), HW)
    assert "buffer 'k' is allocated every iteration but has no ring depth >= 1" in str(v)
    assert "buffer 's' is allocated every iteration but has no copy count >= 1" in str(v)


def test_prologue_and_epilogue_do_not_overlap_on_a_stream() -> None:
    # a 40-cycle prologue task and an epilogue task on warpgroup 0; the epilogue starts at 8 after the last
    # iteration's start, which for a 1-iteration CTA is before the prologue is done
    g = STaskGraph("pp", "test", {}, {"depth": 1, "groups": 1}, (
        STask("pre", "vector", phase="pre", flops=40 * 64, group=0), STask("body", "vector", flops=64, group=1),
        STask("post", "vector", phase="post", flops=64, group=0)), (), (1,), 1, 1)
    bad = make_program(g, HW, 8, {"pre": 0, "body": 0, "post": 8})
    v = check_valid(bad, HW)
    assert v.violations == ("wg0 holds pre [0,40) and post [8,16) at once",)
    good = make_program(g, HW, 8, {"pre": 0, "body": 0, "post": 40})
    assert check_valid(good, HW) and simulate(good, HW).late == 0
    # the replay records what each instance holds: (resource, from, to) cycles
    ev = {(e.task, e.iteration): e for e in simulate(good, HW).events}
    assert ev[("pre", 0)].holds == (("wg0", 0, 40),) and ev[("post", 0)].holds == (("wg0", 40, 48),)
    assert ev[("body", 0)].holds == (("wg1", 0, 8),)


def test_lower_bounds_by_hand() -> None:
    # two-stage GEMM in 8-cycle grains: load -> mma takes 25 (192 + 8 barrier), the mma 20 more: last >= 45, no
    # prologue; ii >= 27 (the slot is released once the next mma is issued, 1 grain, + 1 grain of barrier: the
    # recurrence load -> mma -> load of the next iteration takes 25 + 2). Four iterations: 3·27 + 45 = 126 grains
    # = 1008 cycles, which the optimum meets (test_schedule.test_worked_two_stage_gemm)
    g, hw = two_stage_gemm()
    P = model.build(g, hw)
    assert ends_lower_bound(P) == (0, 45) and P.ii_lb == 27
    assert lower_bound(P) == 1008


@pytest.mark.parametrize("trip", [1, 4])
def test_simulate_tflops(trip: int) -> None:
    g, hw = two_stage_gemm()
    g = replace(g, row=(trip,), useful_flops=10**9)
    tl = simulate(make_program(g, hw, 216, {"load": 0, "mma": 200}), hw)
    assert tl.tflops == pytest.approx(1e9 / (tl.kernel_us * 1e-6) / 1e12)


def test_exact_solver_keeping_greedys_optimal_program_says_so() -> None:
    from ptsolve import optimize
    g, hw = two_stage_gemm()  # greedy's program (ii 216, mma at 200) is already optimal: 1008 cycles
    r = optimize(g, hw=hw, solver="cpsat", cache=False, executor="serial")
    assert r.status == "OPTIMAL" and r.objective == 1008 and r.bound == 1008 and r.gap == 0.0
    assert r.program.policy == "cpsat (greedy's schedule, proven optimal)"
    assert str(r).startswith("cpsat: OPTIMAL (proven: gap 0%)")


def test_ring_users_barriers_and_default_depth() -> None:
    """A ring buffer nobody frees explicitly is released by its readers; a tiling without 'depth' gets 2 slots;
    each ring slot's release is an 'empty' mbarrier: here a wgmma nothing waits for, so its next instance releases
    the slot right after it is issued, one iteration late (ptsolve.protocol): distance depth - 1."""
    from ptsolve.cost import timings
    from ptsolve.program import required_barriers, ring_users
    g = STaskGraph("r", "test", {}, {"groups": 1}, (
        STask("ld", "load", bytes=64, is_async=True, allocs=(Buffer("k", "smem", 64),)),
        STask("mma", "mma", flops=64, group=0, is_async=True, reads=("k",)),
        STask("other", "vector", flops=64, group=0)), (Edge("ld", "mma"),), (2,), 1, 1)
    assert ring_users(g) == {"k": ("ld", ["mma"])}
    p = make_program(g, HW, 64, {"ld": 0, "mma": 96, "other": 0})
    assert p.rings == {"k": 2}
    assert Barrier("mma", "ld", 1, "empty") in p.barriers and Barrier("ld", "mma", 0, "data") in p.barriers
    assert required_barriers(g, timings(g, HW), {"k": 3}, {}) == [Barrier("ld", "mma", 0, "data"),
                                                                   Barrier("mma", "ld", 2, "empty")]
