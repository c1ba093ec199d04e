"""Constants and choices whose change no other CPU test noticed (issue 10, 'tests that cannot fail'): each test
pins its effect with numbers worked out by hand."""
from __future__ import annotations

import math

import pytest

from ptsolve import ops, optimize
from ptsolve.cost import load_cycles, task_timing
from ptsolve.hw import load
from ptsolve.ir import Buffer, STask, STaskGraph
from ptsolve.placement import per_sm_pairs, per_sm_trips, sm_loads
from ptsolve.policies.model import build, fits
from ptsolve.result import Result
from ptsolve.search import lower_bound
from ptsolve.validate import check_valid, regs_per_thread

H100 = load("h100")


def one_buffer_graph(regs: int) -> STaskGraph:
    """A warpgroup holding one register buffer of ``regs`` 32-bit registers per thread (128 threads)."""
    return STaskGraph("regs", "test", {}, {"depth": 1, "groups": 1}, (
        STask("zero", "vector", phase="pre", flops=64, group=0, allocs=(Buffer("acc", "reg", regs * 4 * 128),)),
        STask("body", "vector", flops=64, group=0, reads=("acc",))), (), (1,), 1, 1)


def test_register_overhead_is_the_tables() -> None:
    # one consumer warpgroup on an H100 gets min(255, 240, (65536 - 128·24) // 128 rounded to 8) = 240 registers;
    # the table's reg_overhead (32, fitted to ptxas by python -m bench regfit) goes to addresses, loop counters and
    # barrier phases, so a 208-register buffer fits, 209 does not
    assert H100.reg_overhead == 32
    assert regs_per_thread(one_buffer_graph(208), {}, 0, H100) == (240, ["acc=208"])
    assert fits(one_buffer_graph(208), H100) is None
    assert fits(one_buffer_graph(209), H100) == "registers 241/thread > 240 (acc=209)"
    g = one_buffer_graph(209)
    p = build(one_buffer_graph(208), H100).program(1, {"zero": 0, "body": 1}, "test")
    from dataclasses import replace
    v = check_valid(replace(p, graph=g), H100)
    assert not v and v.violations[-1] == ("warpgroup 0 needs 241 registers per thread (acc=209, +32) but 1 consumer "
                                          "warpgroups get 240 each on h100; use fewer rows per warpgroup or fewer "
                                          "live copies")


def test_resident_ctas_share_the_register_file() -> None:
    # two resident CTAs of one consumer warpgroup (+ producer): 65536 / (2 · 2 · 128) = 128 registers a thread, so
    # a 96-register buffer (+32, the table's reg_overhead) fits and a 97-register one does not; with one CTA per SM
    # both fit (240)
    two = {"depth": 1, "groups": 1, "ctas": 2}
    from dataclasses import replace
    assert fits(replace(one_buffer_graph(96), tiling=two), H100) is None
    assert fits(replace(one_buffer_graph(97), tiling=two), H100) == "registers 129/thread > 128 (acc=97)"
    assert fits(one_buffer_graph(97), H100) is None


def test_gemm_l2_reuse_is_the_square_of_concurrent_ctas() -> None:
    # 132 SMs run about an 11 x 11 square of the grid at once (isqrt(132) = 11): an A tile is reread by the
    # min(N/BN, 11) CTAs of its row, a B tile by min(M/BM, 11)
    t = {"BM": 128, "BN": 256, "BK": 64, "depth": 3, "groups": 2}
    g = ops.gemm(4096, 1024, 4096).graph(t)  # 32 x 4 tiles
    assert g.task["load_a"].reuse == 4 and g.task["load_b"].reuse == 11
    big = ops.gemm(8192, 8192, 8192).graph(t)
    assert big.task["load_a"].reuse == big.task["load_b"].reuse == 11
    # its effect: the A tile (128·64·2 B) comes 1/4 from DRAM (3.35e12 B/s / 1.83 GHz / 132 SMs per clock) and all
    # of it through L2
    a = g.task["load_a"]
    dram = H100.hbm_bytes_per_s / (H100.clock_ghz * 1e9) / H100.sms
    assert load_cycles(a.bytes, a.reuse, H100) == math.ceil(max(a.bytes / 4 / dram, a.bytes / H100.l2_bytes_per_clk))
    assert task_timing(a, H100).busy("tma") == 8 * math.ceil(load_cycles(a.bytes, 4, H100) / 8)


def test_lpt_is_longest_first() -> None:
    # 5 CTAs of 1..5 cycles on 2 SMs. Longest first: 5->A, 4->B, 3->B (7), 2->A (7), 1->A (8): loads 8 and 7.
    # (Shortest first would give 9 and 6; the paper's even split 1+2+3 = 6 and 4+5 = 9.)
    assert sorted(sm_loads([1, 2, 3, 4, 5], 1, 2, "lpt").tolist()) == [7, 8]
    assert sorted(sm_loads([1, 2, 3, 4, 5], 1, 2, "even").tolist()) == [6, 9]
    # the model's slots follow the same rule with CTA weights (trip-1) + 0.25: 5->A, 4->B, 3->B, 2->A, 1->A
    assert per_sm_trips((1, 2, 3, 4, 5), 1, 2, "lpt") == [((1, 1), (2, 1), (5, 1)), ((3, 1), (4, 1))]
    assert per_sm_pairs((1, 2, 3, 4, 5), 1, 2, "lpt") == [(5, 3), (5, 2)]
    assert per_sm_trips((1, 2, 3, 4, 5), 1, 2, "even") == [((1, 1), (2, 1), (3, 1)), ((4, 1), (5, 1))]


def test_decoupled_takes_the_tiling_with_the_least_roofline_bound() -> None:
    op = ops.mamba2_chunk_state(64, 1024, 64, 64, 128, 256)
    bounds = {}
    for t in op.tilings():
        g = op.graph(t)
        if fits(g, H100) is None:
            bounds[tuple(sorted(t.items()))] = lower_bound(build(g, H100))
    best = min(bounds, key=lambda k: (bounds[k], k))
    dec = optimize(op, hw="h100", cache=False, decoupled=True, jobs=1)
    assert tuple(sorted(dec.tiling.items())) == best and dec.tilings == 1
    assert dec.bound == bounds[best] or dec.status == "OPTIMAL"
    joint = optimize(op, hw="h100", cache=False, jobs=1)
    assert joint.objective < dec.objective  # the roofline's pick is not the best schedule here


def test_gap_is_objective_minus_bound_over_objective() -> None:
    r = Result(program=None, solver="cpsat", status="TIME_LIMIT", objective=110, bound=100, solve_s=1.0,
               predicted_us=1.0, tflops=1.0, hw="h100")
    assert r.gap == pytest.approx(10 / 110)
    assert Result(**{**r.__dict__, "bound": 120}).gap == 0.0  # a bound above the objective is no gap
    assert Result(**{**r.__dict__, "bound": None}).gap is None


def test_validity_lists_each_violation_on_its_own_line() -> None:
    from ptsolve.validate import Validity
    assert str(Validity(())) == "valid" and Validity(())
    v = Validity(("a is late", "b overlaps c"))
    assert not v and str(v) == "invalid:\n  a is late\n  b overlaps c"


@pytest.mark.parametrize("solver", ["cpsat", "milp", "milp-highs", "exhaustive"])
def test_search_hands_each_solver_greedys_hint(solver: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """search runs the named back-end and gives it greedy's program as the hint (what makes a time-limited run
    never worse than greedy)."""
    from test_regressions import TINY1, lone_prologue

    import ptsolve.policies.cpsat as C
    import ptsolve.policies.exhaustive as E
    import ptsolve.policies.milp as M
    seen = []
    mod = {"cpsat": C, "exhaustive": E}.get(solver, M)
    real = mod.solve

    def spy(P, **kw):
        seen.append(kw.get("hint"))
        return real(P, **kw)

    monkeypatch.setattr(mod, "solve", spy)
    r = optimize(lone_prologue(), hw=TINY1, solver=solver, cache=False, executor="serial")
    assert len(seen) == 1 and r.status == "OPTIMAL" and r.objective == (40 + 42) * 8
    if solver != "exhaustive":  # exhaustive seeds itself with greedy
        assert seen[0] is not None and seen[0].policy == "greedy"
    assert r.program.policy.split(" ")[0] == solver


def test_exact_placement_beats_longest_first_by_hand() -> None:
    from ptsolve.placement import exact_loads
    from ptsolve.placement import lower_bound as placement_bound
    # CTAs of 5, 4, 3, 3, 3 cycles on 2 SMs: longest first gives 5+3 and 4+3+3 = 10; {5, 4} and {3, 3, 3} is 9,
    # which meets the bound max(ceil(18 / 2), 5) = 9
    assert sorted(sm_loads([5, 4, 3, 3, 3], 1, 2, "lpt").tolist()) == [8, 10]
    assert placement_bound([5, 4, 3, 3, 3], 1, 2) == 9 and placement_bound([20, 1], 1, 2) == 20
    loads, proven = exact_loads([5, 4, 3, 3, 3], 1, 2, time_limit=10)
    assert sorted(loads.tolist()) == [9, 9] and proven
    assert sorted(sm_loads([5, 4, 3, 3, 3], 1, 2, "exact").tolist()) == [9, 9]
    loads, proven = exact_loads([2, 2, 2, 2], 1, 2)  # longest first already meets the bound
    assert loads.tolist() == [4, 4] and proven


def test_dynamic_placement_is_the_block_schedulers() -> None:
    """dynamic: CTAs in launch order, each to the SM that frees first (what the GPU's block scheduler does for a
    grid launch); it differs from longest-first when a long CTA comes late, and from the even split always."""
    assert sm_loads([1, 1, 4], 1, 2, "dynamic").tolist() == [5, 1]
    assert sorted(sm_loads([1, 1, 4], 1, 2, "lpt").tolist()) == [2, 4]
    assert sm_loads([1, 1, 4], 1, 2, "even").tolist() == [2, 4]
    assert sm_loads([4, 1, 1, 1, 1], 1, 2, "dynamic").tolist() == [4, 4]
    # per_sm_trips: the same assignment by trip counts (weights trip - 1 + ratio)
    assert per_sm_trips([1, 1, 5], 1, 2, "dynamic") == [((1, 1), (5, 1)), ((1, 1),)]
    assert sorted(per_sm_trips([1, 1, 5], 1, 2, "lpt")) == [((1, 2),), ((5, 1),)]
