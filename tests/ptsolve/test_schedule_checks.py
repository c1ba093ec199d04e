"""check_valid and simulate: a worked example by hand, properties over random programs, and rejections."""
from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from strategies import examples, graphs, tiny_hw

from ptsolve import check_valid, ops, simulate
from ptsolve.cost import timings
from ptsolve.errors import InfeasibleError
from ptsolve.ir import Buffer, Edge, STask, STaskGraph
from ptsolve.policies import cpsat, greedy, model
from ptsolve.program import Barrier, make_program
from ptsolve.simulate import claimed_cycles, replay


def two_stage_gemm() -> tuple[STaskGraph, object]:
    hw = replace(tiny_hw(sms=1), l2_bytes_per_clk=64.0, mem_latency=96, tc_flops_per_clk=1024.0, tc_latency=0)
    tasks = (STask("load", "load", bytes=6144, is_async=True, allocs=(Buffer("a", "smem", 6144),)),
             STask("mma", "mma", flops=1024 * 160, is_async=True, group=0, reads=("a",), frees=("a",)))
    g = STaskGraph("gemm2", "custom", {}, {"depth": 2, "groups": 1}, tasks,
                   (Edge("load", "mma"), Edge("mma", "mma", 1)), row=(4,), rows=1, useful_flops=1)
    return g, hw


def test_worked_two_stage_gemm() -> None:
    # load: TMA busy 6144 B / 64 B/clk = 96 cycles, result after 96 + 96 (memory latency) = 192 cycles.
    # mma:  tensor cores busy 163840 FLOP / 1024 FLOP/clk = 160 cycles; result after 160 cycles.
    # load -> mma crosses from the producer to warpgroup 0: + 8-cycle barrier, so mma starts >= load + 200.
    # The ring has 2 slots. Nothing in warpgroup 0 waits for the mma, so its slot is released when the next
    # mma, right after being issued, waits for it (protocol.releases: "commit"): the load of iteration i+2
    # refills the slot of iteration i once the mma of i+1 is issued (8 cycles) and the producer hears of it
    # (8-cycle barrier): load + 2·II >= mma + II + 16, i.e. II >= 200 + 16 = 216; the mma of i must also be
    # done (load + 2·II >= mma + 160 + 8, II >= 184) and the tensor cores alone would allow II = 160.
    # Four iterations: 3·216 + (200 + 160) = 1008 cycles.
    g, hw = two_stage_gemm()
    tm = timings(g, hw)
    assert tm["load"].busy("tma") == 96 and tm["load"].latency == 192 and tm["mma"].busy("tc") == 160
    p = make_program(g, hw, 216, {"load": 0, "mma": 200})
    assert check_valid(p, hw)
    tl = simulate(p, hw)
    assert tl.late == 0 and tl.cta_cycles == {4: 1008} and tl.kernel_cycles == 1008
    assert not check_valid(replace(p, ii=208), hw)  # one grain less refills a slot before it is released
    best, st = cpsat.solve(model.build(g, hw))
    assert st["status"] == "OPTIMAL" and claimed_cycles(best, hw) == 1008
    # the hardware's dynamic issue does better in the first iterations (the two slots start empty):
    # loads at 0, 96, 376, 592; mmas at 200, 360, 576, 792; done at 952
    assert simulate(p, hw, mode="asap").kernel_cycles == 952


@settings(max_examples=examples(40), deadline=None, derandomize=True)
@given(graphs())
def test_simulate_respects_dependencies_and_resources(g: STaskGraph) -> None:
    hw = tiny_hw()
    p, _ = greedy.solve(model.build(g, hw))
    assert check_valid(p, hw), check_valid(p, hw)
    tm = timings(g, hw)
    tl = simulate(p, hw)
    assert tl.late == 0 and tl.kernel_cycles == claimed_cycles(p, hw)
    for mode in ("timed", "asap"):
        ev, _ = replay(p, hw, g.trip_count, mode)
        at = {(e.task, e.iteration): e.start for e in ev}
        for e in g.edges:
            for (t, i), s in at.items():
                if t != e.dst:
                    continue
                src = g.task[e.src].phase
                j = 0 if src == "pre" else (g.trip_count - 1 if g.task[t].phase == "post" else i - e.dist)
                if j >= 0 and (e.src, j) in at:
                    assert s >= at[(e.src, j)] + tm[e.src].latency
        busy: dict[str, list[tuple[int, int]]] = {}
        for x in ev:
            for r, o, n in tm[x.task].uses:
                busy.setdefault(r, []).append((x.start + o, x.start + o + n))
        for iv in busy.values():
            iv.sort()
            assert all(a1 <= b0 for (_, a1), (b0, _) in zip(iv, iv[1:]))


def fa_program():
    hw_ = "h100"
    from ptsolve.hw import load
    hw = load(hw_)
    op = ops.flash_attention(batch=1, heads=8, kv_heads=8, seq=1024, head_dim=128)
    g = op.graph({"BM": 128, "BN": 128, "depth": 2, "groups": 2})
    p, _ = greedy.solve(model.build(g, hw))
    return p, hw


def test_check_valid_rejects_dropped_barrier() -> None:
    p, hw = fa_program()
    assert check_valid(p, hw)
    drop = [b for b in p.barriers if b.src == "load_k" and b.dst == "mma_qk@1"]
    bad = replace(p, barriers=tuple(b for b in p.barriers if b not in drop))
    v = check_valid(bad, hw)
    assert not v and "load_k -> mma_qk@1" in str(v) and "no barrier" in str(v)


def test_check_valid_rejects_over_full_ring_and_overlap() -> None:
    p, hw = fa_program()
    v = check_valid(replace(p, rings={k: 1 for k in p.rings}), hw)
    assert not v and ("over-full ring" in str(v) or "ring slot reuse" in str(v))
    late = dict(p.start, **{"mma_qk@0": p.start["mma_qk@0"] - 8})
    v = check_valid(replace(p, start=late), hw)
    assert not v and "not met" in str(v)


def test_check_valid_memory_limits() -> None:
    p, hw = fa_program()
    small = replace(hw, smem_per_block=64 * 1024)
    v = check_valid(p, small)
    assert not v and "shared memory" in str(v) and "k" in str(v)
    v = check_valid(replace(p, copies={k: 3 for k in p.copies}), hw)
    assert not v and "registers per thread" in str(v)


def test_check_valid_finds_deadlock() -> None:
    g, hw = two_stage_gemm()
    p = make_program(g, hw, 216, {"load": 0, "mma": 200})
    # a barrier that makes the load wait for the mma of the same iteration: mma waits for load, load for mma
    bad = replace(p, barriers=(*p.barriers, Barrier("mma", "load", 0)))
    v = check_valid(bad, hw)
    assert not v and "deadlock" in str(v)


def test_replay_of_inconsistent_orders_raises() -> None:
    g, hw = two_stage_gemm()
    p = make_program(g, hw, 216, {"load": 300, "mma": 0})
    assert not check_valid(p, hw)
    with pytest.raises(InfeasibleError, match="deadlock"):
        simulate(p, hw)
