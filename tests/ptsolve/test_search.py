"""optimize(): policies agree with the simulator, exact beats greedy, cache, known schedules, bad input."""
from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import replace

import pytest

import ptsolve
from ptsolve import check_valid, ops, optimize, simulate
from ptsolve.errors import HardwareError, InfeasibleError, SolverError
from ptsolve.hw import load
from ptsolve.simulate import claimed_cycles

CASES = [
    ops.flash_attention(batch=1, heads=32, kv_heads=8, seq=512, head_dim=128, causal=True),
    ops.gemm(4096, 1024, 4096),
    ops.mamba2_chunk_scan(1, 2048, 64, 64, 128, 256),
    ops.mamba2_chunk_state(1, 2048, 64, 64, 128, 256),
]


@pytest.mark.parametrize("op", CASES, ids=lambda o: o.op)
def test_exact_never_worse_than_greedy_and_simulate_agrees(op) -> None:
    hw = load("h100")
    g = optimize(op, hw="h100", solver="greedy", cache=False)
    c = optimize(op, hw="h100", solver="cpsat", time_limit=60, cache=False, jobs=1)
    assert c.status == "OPTIMAL" and c.gap == 0.0
    assert c.objective <= g.objective
    assert g.bound <= c.objective  # greedy's roofline bound is a true lower bound
    for r in (g, c):
        assert check_valid(r.program, hw)
        tl = simulate(r.program, hw)
        assert tl.late == 0 and tl.kernel_cycles == r.objective == claimed_cycles(r.program, hw)
        assert abs(tl.kernel_us - r.predicted_us) < 1e-6


def test_fa_schedule_features() -> None:
    op = ops.flash_attention(batch=64, heads=32, kv_heads=8, seq=2048, head_dim=128)
    r = optimize(op, hw="h100", solver="cpsat", cache=False)
    assert any(f.startswith("ping-pong") for f in r.features), r.features
    # a single consumer warpgroup keeps the tensor cores busy during its softmax only by running PV of the
    # previous block under it (FA3's intra-warpgroup overlap); the exact schedule does that
    g = op.graph({"BM": 64, "BN": 128, "depth": 2, "groups": 1})
    r1 = optimize(g, hw="h100", solver="cpsat", cache=False)
    assert any(f.startswith("intra-warpgroup overlap") for f in r1.features), r1.features


def test_cache_warm_hit_is_fast() -> None:
    op = CASES[0]
    r = optimize(op, hw="h100")
    t = time.perf_counter()
    r2 = optimize(op, hw="h100")
    assert time.perf_counter() - t < 0.1
    assert r2.cached and r2.objective == r.objective and r2.program == r.program


def test_cache_is_shared_between_processes(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PTSOLVE_CACHE_DIR", str(tmp_path))
    code = ("import ptsolve; r = ptsolve.optimize(ptsolve.ops.gemm(1024, 1024, 1024), solver='greedy'); "
            "print(r.cached)")
    outs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
            for _ in range(2)]
    assert outs == ["False\n", "True\n"]


def test_time_limited_search_returns_best_with_gap() -> None:
    # 0.01 s cannot even cover greedy's pass over the tilings, so no exact solve starts: the search stops with
    # greedy's best and the roofline bounds (deterministically TIME_LIMIT)
    op = ops.flash_attention(batch=64, heads=64, kv_heads=8, seq=8192, head_dim=128, causal=True)
    r = optimize(op, hw="h100", solver="cpsat", time_limit=0.01, cache=False, jobs=1)
    assert r.program is not None and r.status == "TIME_LIMIT" and r.solved == 0
    assert r.gap is not None and 0 < r.gap < 1 and r.bound < r.objective
    assert r.program.policy == "cpsat (greedy's schedule, not improved, status TIME_LIMIT)"


def test_bad_input_errors() -> None:
    op = CASES[1]
    with pytest.raises(SolverError, match="unknown solver 'annealing'"):
        optimize(op, solver="annealing")
    with pytest.raises(SolverError, match="time_limit must be"):
        optimize(op, time_limit=0)
    with pytest.raises(HardwareError, match="known: a100, h100, h200, mi300x"):
        optimize(op, hw="b200")
    tiny = replace(load("h100"), smem_per_block=8 * 1024)
    with pytest.raises(InfeasibleError, match="no tiling .* fits"):
        optimize(op, hw=tiny, cache=False)
    with pytest.raises(ptsolve.PtsolveError, match="operator from ptsolve.ops"):
        optimize("gemm")


def test_every_hw_table_schedules() -> None:
    for name in ("h100", "h200", "a100", "mi300x"):
        r = optimize(CASES[1], hw=name, solver="greedy", cache=False)
        assert r.predicted_us > 0 and load(name).sources  # every number carries its source


def test_hw_table_from_path_and_calibration(tmp_path, monkeypatch) -> None:
    import json
    src = json.loads((ptsolve.hw.HERE / "h100.json").read_text())
    p = tmp_path / "mine.json"
    p.write_text(json.dumps(src | {"name": "mine"}))
    assert load(str(p)).name == "mine"
    (tmp_path / "mine.calibrated.json").write_text(json.dumps({"tc_efficiency": 0.5}))
    assert load(str(p)).tc_efficiency == 0.5
    del src["sms"]
    p.write_text(json.dumps(src))
    with pytest.raises(HardwareError, match="missing field 'sms'"):
        load(str(p))


@pytest.mark.parametrize("executor", ["serial", "process", "ray"])
def test_executors_agree(executor) -> None:
    if executor == "ray":
        pytest.importorskip("ray")
    op = ops.mamba2_chunk_state(1, 1024, 64, 64, 128, 256)
    # deterministic: the solves are functions of the model, not of the machine's load (no wall-clock limit decides)
    r = optimize(op, hw="h100", solver="cpsat", executor=executor, jobs=2, cache=False, deterministic=True)
    ref = optimize(op, hw="h100", solver="cpsat", executor="serial", cache=False, deterministic=True)
    assert r.status == ref.status == "OPTIMAL" and r.objective == ref.objective
    assert r.program == ref.program  # ties broken alike by every executor (search.answer_key)


def test_decoupled_is_never_better_than_joint() -> None:
    op = ops.mamba2_chunk_scan(64, 8192, 64, 64, 128, 256)
    joint = optimize(op, hw="h100", cache=False)
    dec = optimize(op, hw="h100", cache=False, decoupled=True)
    assert dec.objective >= joint.objective and dec.tilings == 1


def test_resident_ctas_budgets_match_the_emitters() -> None:
    """Two resident CTAs: the model's shared-memory and register budgets are what the generated kernel is granted
    (both read ptsolve.hw.Target)."""
    from codegen.cuda import emit
    from codegen.lower import lower
    from codegen.plan import default_plan
    from ptsolve.hw import Target
    hw = load("h100")
    assert Target(hw).smem_budget(1) == 227 * 1024
    assert Target(hw).smem_budget(2) == 114 * 1024 - 1024
    assert Target(hw).consumer_regs(2, 2) == 80  # 65536 / (2 CTAs * 384 threads), to 8
    assert Target(hw).consumer_regs(2, 1) == 240
    p = {"batch": 2, "seq": 1000, "heads": 8, "head_dim": 64, "d_state": 128, "chunk": 256, "groups": 1}
    one = lower(default_plan("mamba2_chunk_state", p, {"BM": 128, "BK": 64, "depth": 2, "groups": 2}))
    two = lower(default_plan("mamba2_chunk_state", p, {"BM": 128, "BK": 64, "depth": 2, "groups": 2, "ctas": 2}))
    assert [r.regs for r in one.roles] == [24, 240, 240] and [r.regs for r in two.roles] == [0, 0, 0]
    assert "__launch_bounds__(384, 2)" in emit(two).source and "setmaxnreg" not in emit(two).source.split("extern")[-1]


def test_two_resident_ctas_share_the_sm() -> None:
    """ChunkState at batch 64 with two CTAs per SM: the copy engine's floor binds (a second CTA hides the
    first's latency but not its bytes); every policy reports max(floor, slot latency), and simulate agrees."""
    from ptsolve.policies.model import build
    hw = load("h200")
    op = ops.mamba2_chunk_state(64, 1024, 64, 64, 128, 256)
    t = {"BM": 128, "BK": 64, "depth": 2, "groups": 2}
    one, two = (optimize(op.graph(t | {"ctas": k}), hw="h200", solver="cpsat", cache=False, jobs=1) for k in (1, 2))
    P = build(two.program.graph, hw)
    assert P.floor > 0 and two.objective == P.floor * P.grain
    assert two.objective < one.objective  # the latency of one CTA per SM was over the floor
    for r in (one, two):
        assert r.objective == claimed_cycles(r.program, hw) == simulate(r.program, hw).kernel_cycles
    # greedy reports the same kernel time (the floor) with a longer slot latency
    g = optimize(op.graph(t | {"ctas": 2}), hw="h200", solver="greedy", cache=False)
    from ptsolve.simulate import claimed
    assert g.objective == two.objective and claimed(g.program, hw)[1] >= claimed(two.program, hw)[1]


def test_fix_pins_tiling_keys() -> None:
    op = ops.mamba2_chunk_state(64, 1024, 64, 64, 128, 256)
    r = optimize(op, hw="h200", solver="greedy", cache=False, fix={"ctas": 1, "groups": 2})
    assert r.tiling["ctas"] == 1 and r.tiling["groups"] == 2
    with pytest.raises(ptsolve.errors.PtsolveError, match="no key"):
        optimize(op, hw="h200", solver="greedy", cache=False, fix={"BN": 64})
    with pytest.raises(ptsolve.errors.PtsolveError, match="no tiling"):
        optimize(op, hw="h200", solver="greedy", cache=False, fix={"ctas": 5})


def test_ring_depth_ties_go_deep_only_where_the_loop_streams_memory() -> None:
    """The model predicts the same time for a tiling and its deeper-ring twin; the tie-break takes the deeper ring
    where the copy engine binds and the operator's table says deeper rings measured faster there (GEMM on the H200:
    skinny shapes), the shallower where the tensor cores bind, or where the operator measured the other way
    (split-KV decode) or was never measured (the H100 table)."""
    from ptsolve.policies.model import build, streams_memory, tiling_tie

    hw = load("h200")
    skinny, square = ops.gemm(1, 28672, 8192), ops.gemm(4096, 4096, 4096)
    rs = {n: optimize(o, hw="h200", solver="cpsat", cache=False, compile_check=False)
          for n, o in (("skinny", skinny), ("square", square))}
    assert rs["skinny"].tiling["depth"] == 5 and rs["square"].tiling["depth"] == 4
    for n, o in (("skinny", skinny), ("square", square)):
        P = build(o.graph(rs[n].tiling, hw), hw)
        assert streams_memory(P.tm, P.phase) == (n == "skinny")
        assert P.tie == tiling_tie(o.graph(rs[n].tiling, hw), hw)
    # the shallower twin of the skinny choice ties it in the model: the tie-break, not the model, took the deeper ring
    g4 = skinny.graph(rs["skinny"].tiling | {"depth": 4}, hw)
    assert optimize(g4, hw="h200", solver="cpsat", cache=False, compile_check=False).objective == rs["skinny"].objective
    assert build(g4, hw).tie > build(skinny.graph(rs["skinny"].tiling, hw), hw).tie
    h100 = load("h100")  # no measured preference there: the smaller key (shallower ring) first
    assert build(skinny.graph(rs["skinny"].tiling | {"depth": 4}, h100), h100).tie < \
        build(skinny.graph(rs["skinny"].tiling, h100), h100).tie
    dec = ops.make("flash_decode", batch=16, heads=32, kv_heads=8, seq_q=1, seq_kv=4097, head_dim=128, causal=False)
    t = {"BM": 64, "BN": 64, "depth": 2, "groups": 1, "splits": 1}
    P2, P3 = (build(dec.graph(t | {"depth": d}, hw), hw) for d in (2, 3))
    assert streams_memory(P2.tm, P2.phase) and P2.tie < P3.tie  # memory-bound, yet decode keeps the shallower ring


def test_write_op_keeps_the_operators_other_entries(tmp_path) -> None:
    from ptsolve.calibrate import write_op

    base = replace(load("h200", calibrated=False), op_constants={})
    p = tmp_path / "t.calibrated.json"
    write_op(replace(base, mem_latency=base.mem_latency + 7), base, "gemm", "fit A", ["mem_latency"], p)
    write_op(replace(base, deep_ring_ties=1), base, "gemm", "A/B B", ["deep_ring_ties"], p)
    import json
    v = json.loads(p.read_text())["op_constants"]
    assert v["value"]["gemm"] == {"deep_ring_ties": 1, "mem_latency": base.mem_latency + 7}
    assert "fit A" in v["source"] and "A/B B" in v["source"]
    write_op(replace(base, mem_latency=base.mem_latency + 9), base, "gemm", "fit C", ["mem_latency"], p)
    v = json.loads(p.read_text())["op_constants"]
    assert v["value"]["gemm"] == {"deep_ring_ties": 1, "mem_latency": base.mem_latency + 9}
    assert "fit A" not in v["source"] and "fit C" in v["source"] and "A/B B" in v["source"]


def test_polish_keeps_the_optimum_and_idles_the_streams_before_their_wgmma() -> None:
    """CP-SAT's optimum for FlashAttention leaves a warpgroup no idle time before its QK wgmma (its rescale waits for
    the previous PV right up to it); polish finds the optimum of the same ii and latency with the most idle time
    before every tensor-core issue, and the search returns that one (optimize then weighs it against the declared
    order by their replay: tests/ptsolve/policies/test_orders.py)."""
    from ptsolve.policies import cpsat
    from ptsolve.policies.model import build

    hw = load("h200")
    op = ops.flash_attention(batch=1, heads=32, kv_heads=8, seq=2048, head_dim=128, causal=False)
    t = {"BM": 128, "BN": 128, "depth": 2, "groups": 2, "persistent": 1}
    P = build(op.graph(t, hw), hw)
    prog, st = cpsat.solve(P, time_limit=20, num_workers=1)
    new = cpsat.polish(P, prog)
    a, b = cpsat.tc_guards(P, prog), cpsat.tc_guards(P, new)
    assert st["status"] == "OPTIMAL" and claimed_cycles(new, hw) == claimed_cycles(prog, hw) and check_valid(new, hw)
    assert min(a.values()) == 0 < min(b.values()) and sum(b.values()) > sum(a.values())
    from ptsolve.search import search
    r = search(op, hw, solver="cpsat", fix=t, executor="serial")
    assert r.status == "OPTIMAL" and r.objective == claimed_cycles(prog, hw)
    assert min(cpsat.tc_guards(P, r.program).values()) >= min(b.values())  # search polished its answer too


def test_every_tiling_excluded_says_so():
    """The compiler in the loop excludes the tilings it rejected; when none is left the error says that, not an empty
    list of reasons why none fits."""
    from ptsolve.search import search
    op = ops.gemm(M=64, N=64, K=128)
    every = tuple(op.tilings())
    with pytest.raises(InfeasibleError, match=f"the {len(every)} excluded were all it had"):
        search(op, "h200", solver="greedy", exclude=every, executor="serial")
