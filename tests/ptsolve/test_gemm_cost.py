"""The cost model's view of a GEMM main loop: what the GPU measured (bench study gemm_model) and the model must see."""
from __future__ import annotations

import pytest

import ptsolve
from ptsolve.cost import edge_delay, timings
from ptsolve.hw import load
from ptsolve.policies.model import build, ii_lower_bound
from ptsolve.simulate import simulate, unit_floor
from ptsolve.validate import check_valid

H200 = load("h200")
PP = {"BM": 128, "BN": 128, "BK": 64, "depth": 4, "groups": 1, "splits": 1, "pingpong": 1}


def test_an_accumulating_mma_chains_at_tensor_core_occupancy():
    """wgmma k-steps accumulating into one register tile run back to back (the kernel keeps one group in flight): the
    mma's edge to itself costs its tensor-core occupancy, not occupancy + drain, so one warpgroup's main loop with a
    deep ring is bound by its busiest unit, as the ping-pong kernels measured (8192³, 128×192: ~1070 cycles a k-step
    against 1096 of tensor-core occupancy)."""
    g = ptsolve.ops.gemm(M=8192, N=8192, K=8192).graph(PP | {"BN": 192, "depth": 5}, "h200")
    tm = timings(g, H200)
    tc = tm["mma@0"].busy("tc")
    assert tm["mma@0"].latency > tc  # a reader of the result (the epilogue) still waits for the drain
    assert edge_delay(tm, "mma@0", "mma@0", H200) == tc
    assert edge_delay(tm, "mma@0", "epilogue@0", H200) == tm["mma@0"].latency
    # a cooperative graph's two warpgroups: each chain at its own occupancy too
    coop = ptsolve.ops.gemm(M=8192, N=8192, K=8192).graph(PP | {"BM": 256, "groups": 2, "pingpong": 0}, "h200")
    tc2 = timings(coop, H200)
    assert all(edge_delay(tc2, m, m, H200) == tc2[m].busy("tc") for m in ("mma@0", "mma@1"))
    # the loop's recurrence no longer exceeds its busiest resource
    rich = H200.__class__(**{**H200.__dict__, "l2_bytes_per_clk": 256.0})  # copy engine never binds
    assert ii_lower_bound(g, rich) == max(timings(g, rich)["mma@0"].busy("tc"), 0)


def test_fewer_work_units_than_sms_share_no_unit():
    """A ping-pong kernel with fewer tiles than SMs runs one warpgroup's tile per SM (the GPU spreads CTAs over the
    SMs first): nothing shares an SM's tensor cores, so the shared-unit floor is 0 and the kernel takes one tile's
    time; with more tiles than SMs two slots share an SM and the floor binds. The policy's objective, check_valid
    and simulate agree in both."""
    few = ptsolve.ops.gemm(M=1024, N=1024, K=1024)   # 64 tiles of 128×128 on 132 SMs
    many = ptsolve.ops.gemm(M=4096, N=1024, K=4096)  # 256 tiles
    P = build(few.graph(PP, "h200"), H200)
    assert P.floor == 0 and unit_floor(few.graph(PP, "h200"), H200, "even") == 0
    Q = build(many.graph(PP, "h200"), H200)
    assert Q.floor > 0 and unit_floor(many.graph(PP, "h200"), H200, "even") > 0
    for op in (few, many):
        r = ptsolve.optimize(op, hw="h200", solver="greedy", cache=False, compile_check=False, executor="serial",
                             fix=PP)
        assert check_valid(r.program, "h200"), check_valid(r.program, "h200")
        assert simulate(r.program, "h200").kernel_cycles == r.objective
    one = ptsolve.optimize(few, hw="h200", solver="cpsat", cache=False, compile_check=False, executor="serial",
                           fix=PP)
    tl = simulate(one.program, "h200")
    assert one.objective == tl.kernel_cycles == max(tl.cta_cycles.values())  # one tile's time, nothing shared


def test_op_constants_price_their_operator_only(tmp_path, monkeypatch):
    """An operator's own fitted constants (Hardware.op_constants, written by calibrate.write_op) replace the shared
    ones for that operator's graphs only: a GEMM load's latency moves, an attention load's does not; the overlay
    round-trips and keeps the other operators' entries; a bad entry is refused with its name."""
    import json
    from dataclasses import replace

    from ptsolve.calibrate import write_op
    from ptsolve.errors import HardwareError
    base = load("h200", calibrated=False)
    gemm = ptsolve.ops.gemm(M=4096, N=4096, K=4096).graph(PP, "h200")
    fa = ptsolve.ops.flash_attention(batch=1, heads=4, kv_heads=4, seq=2048, head_dim=128).graph(
        {"BM": 128, "BN": 128, "depth": 2, "groups": 2}, "h200")
    hw = replace(base, op_constants={"gemm": {"mem_latency": base.mem_latency + 4000}})
    assert hw.for_op("flash_attention") is hw and hw.for_op("gemm").mem_latency == base.mem_latency + 4000
    assert timings(gemm, hw)["load_a"].latency == timings(gemm, base)["load_a"].latency + 4000
    assert timings(fa, hw) == timings(fa, base)
    assert build(gemm, hw).ii_lb >= build(gemm, base).ii_lb  # the ring recurrences see it too
    p = tmp_path / "h200.calibrated.json"
    p.write_text(json.dumps({"op_constants": {"value": {"mamba2_chunk_scan": {"tc_fixed": 7}},
                                              "source": "mamba2_chunk_scan: an older fit"}}))
    write_op(replace(base, mem_latency=999, tc_fixed=base.tc_fixed), base, "gemm", "test fit",
             ("mem_latency", "tc_fixed"), p)
    monkeypatch.setenv("PTSOLVE_CALIBRATION_DIR", str(tmp_path))
    got = load("h200")
    assert got.op_constants == {"gemm": {"mem_latency": 999}, "mamba2_chunk_scan": {"tc_fixed": 7}}
    assert "gemm: ptsolve.calibrate: test fit" in got.sources["op_constants"] and "older fit" in got.sources[
        "op_constants"]
    assert got.mem_latency == base.mem_latency  # the shared entry is untouched
    p.write_text(json.dumps({"op_constants": {"value": {"gemm": {"mem_latncy": 5}}, "source": "typo"}}))
    with pytest.raises(HardwareError, match="mem_latncy"):
        load("h200")


def test_ring_handoff_charges_the_ring_recurrences_not_the_fill():
    """hw.ring_handoff is paid from a ring slot's release to its refill: a ring too shallow for the loop's latency
    gets a longer initiation interval; the first fills (no release to wait for) and the graph's edges do not move."""
    from dataclasses import replace

    from ptsolve.program import handover
    from ptsolve.protocol import precedences, ring_depths
    g = ptsolve.ops.gemm(M=8192, N=8192, K=8192).graph(PP | {"depth": 2}, "h200")
    slow = replace(H200, op_constants={}, ring_handoff=800)
    fast = replace(H200, op_constants={}, ring_handoff=0)
    a = precedences(g, timings(g, fast), fast, ring_depths(g), {})
    b = precedences(g, timings(g, slow), slow, ring_depths(g), {})
    assert [x for x in a if x[4] == "edge"] == [x for x in b if x[4] == "edge"]
    assert all(y[3] == x[3] + 800 for x, y in zip(a, b) if x[4] == "ring") and any(x[4] == "ring" for x in a)
    assert ii_lower_bound(g, slow) > ii_lower_bound(g, fast)
    assert handover(g, slow) == handover(g, fast)


def test_relative_loss_weighs_the_spread_within_a_configuration():
    """calibrate.loss(relative=w) adds w times the variance of the log ratios within each configuration: zero when
    every candidate of a configuration is off by the same factor (their order is right), positive otherwise."""
    from dataclasses import replace

    from ptsolve.calibrate import Sample, loss, predicted
    op = ptsolve.ops.gemm(M=1024, N=1024, K=2048)
    progs = [ptsolve.optimize(op, hw=H200, solver="greedy", cache=False, compile_check=False, executor="serial",
                              fix={"BM": bm, "BN": 128, "depth": 4, "groups": 2, "splits": 1}).program
             for bm in (128, 256)]
    s = [Sample(f"g{k}", "gemm", "greedy", p, 0.0) for k, p in enumerate(progs)]
    same = [replace(x, kernel_us=predicted(x, H200)[0] * 1.2) for x in s]
    assert loss(same, H200, relative=5.0) == pytest.approx(loss(same, H200))
    apart = [replace(x, kernel_us=predicted(x, H200)[0] * f) for x, f in zip(s, (1.0, 1.5))]
    assert loss(apart, H200, relative=5.0) > loss(apart, H200) + 0.1


def test_cli_calibrate_fits_one_operator_and_writes_its_own_constants(tmp_path, monkeypatch, capsys):
    """`ptsolve calibrate --op gemm` fits on the study's GEMM schedules only (the attention ones stay out) and writes
    the fitted entries as GEMM's own (op_constants), recovering the latency the 'measurements' were made with; an
    operator the study lacks is one line and exit 2."""
    import json
    from dataclasses import replace

    from ptsolve.calibrate import Sample, predicted
    from ptsolve.cli import main
    base = load("h200", calibrated=False)
    true = replace(base, op_constants={"gemm": {"mem_latency": 1500}})
    cands, study = {"configs": {}}, {"device": "synthetic", "configs": {}}
    ops = {"g1": ptsolve.ops.gemm(M=2048, N=2048, K=2048), "g2": ptsolve.ops.gemm(M=1024, N=4096, K=2048),
           "fa": ptsolve.ops.flash_attention(batch=1, heads=4, kv_heads=4, seq=1024, head_dim=64)}
    for name, op in ops.items():
        e, got = [], {"measured_us": {}, "checks": {}}
        for rank, depth in enumerate((2, 3)):
            r = ptsolve.optimize(op, hw=base, solver="greedy", cache=False, compile_check=False, executor="serial",
                                 fix={"depth": depth})
            lab = f"greedy_c{rank}"
            e.append({"label": lab, "policy": "greedy", "rank": rank, "program": r.program.to_json()})
            got["measured_us"][lab] = predicted(Sample(lab, name, "greedy", r.program, 0.0), true)[0] * (
                2.0 if name == "fa" else 1.0)  # attention 'measured' far off: a fit that used it would not recover
            got["checks"][lab] = {"ok": True}
        cands["configs"][name] = {"held_out": name == "g2", "candidates": e}
        study["configs"][name] = got
    (tmp_path / "c.json").write_text(json.dumps(cands))
    (tmp_path / "s.json").write_text(json.dumps(study))
    monkeypatch.setenv("PTSOLVE_CALIBRATION_DIR", str(tmp_path))
    args = ["calibrate", "--hw", "h200", "--candidates", str(tmp_path / "c.json"), "--study", str(tmp_path / "s.json"),
            "--params", "mem_latency", "--rounds", "4", "--out", str(tmp_path / "o")]
    assert main(args + ["--op", "gemm", "--relative", "1", "--write"]) == 0
    got = load("h200")
    assert got.op_constants["gemm"]["mem_latency"] == pytest.approx(1500, rel=0.05)
    assert got.mem_latency == base.mem_latency  # the shared entry untouched
    assert "--op gemm --relative 1" in got.sources["op_constants"]
    capsys.readouterr()
    assert main(args + ["--op", "mamba2_chunk_scan"]) == 2
    err = capsys.readouterr().err.strip()
    assert "no measured schedules of operator 'mamba2_chunk_scan'" in err and "'gemm'" in err and "\n" not in err
    assert main(args + ["--relative", "-1"]) == 2
