"""Calibration: on synthetic measurements made by the model itself under known constants, the fit recovers the
constants; the fidelity metrics are right on hand-computed cases; the overlay file round-trips through the loader."""
from __future__ import annotations

from dataclasses import replace

import pytest

import ptsolve
from ptsolve.calibrate import FIT, Sample, evaluate, fit, loss, predicted, replayed_starts, spearman, write
from ptsolve.errors import PtsolveError
from ptsolve.hw import load

TRUE = {"mem_latency": 900, "tc_fixed": 160, "vector_efficiency": 0.65, "l2_bytes_per_clk": 40.0, "launch_us": 3.0}


@pytest.fixture(scope="module")
def samples():
    """Greedy and CP-SAT schedules of four small operators, 'measured' by replaying them under TRUE constants:
    kernel time, II and the start of every task of one CTA, as the profiler would give them."""
    hw = load("h200")
    true = replace(hw, **TRUE)
    ops = {"fa": ptsolve.ops.flash_attention(batch=1, heads=4, kv_heads=2, seq=1024, head_dim=64),
           "fac": ptsolve.ops.flash_attention(batch=1, heads=4, kv_heads=2, seq=1024, head_dim=128, causal=True),
           "gemm": ptsolve.ops.gemm(1024, 1024, 2048),
           "cs": ptsolve.ops.mamba2_chunk_scan(1, 2048, 8, 64, 128, 256)}
    out = []
    for k, op in ops.items():
        for pol in ("greedy", "cpsat"):
            # GEMM with two consumer warpgroups: the samples must exercise the tensor-core turns (tc_handoff)
            # deterministic: the same schedules on any machine and load (a wall-clock limit that binds on a busy
            # machine changes them, and with them what the fit can recover)
            r = ptsolve.optimize(op, hw=hw, solver=pol, cache=False, fix={"groups": 2} if k == "gemm" else None,
                                 deterministic=True, time_limit=4)
            s = Sample(f"{k}_{pol}", k, pol, r.program, 0.0, trip=r.program.graph.trip_count)
            us, ii = predicted(s, true)
            out.append(replace(s, kernel_us=us, ii=ii, starts=replayed_starts(s, true)))
    return out


def test_fit_recovers_known_constants(samples):
    hw = load("h200")
    assert loss(samples, replace(hw, **TRUE)) == 0
    fitted, hist = fit(samples, hw, tuple(TRUE))
    assert hist[-1] < hist[0] / 100 and hist == sorted(hist, reverse=True)
    for k, v in TRUE.items():
        assert getattr(fitted, k) == pytest.approx(v, rel=0.1), (k, getattr(fitted, k), v)
    assert fitted.barrier_cycles == hw.barrier_cycles  # not fitted: untouched



def test_fit_finds_the_costs_the_table_leaves_out(samples):
    """The tensor-core hand-off and co-resident interference start at 0 (no datasheet entry) and are recovered."""
    hw = load("h200", calibrated=False)
    assert hw.tc_handoff == 0 and hw.coresident == 0
    true = replace(hw, tc_handoff=96, coresident=0.3)
    measured = []
    for s in samples:
        us, ii = predicted(s, true)
        measured.append(replace(s, kernel_us=us, ii=ii, starts=replayed_starts(s, true)))
    # the samples exercise both: turns between warpgroups and CTAs sharing an SM
    assert any(len({t.group for t in s.program.graph.tasks if t.kind == "mma"}) > 1 for s in samples)
    assert any(int(s.program.graph.tiling.get("ctas", 1)) > 1 for s in samples)
    assert loss(measured, hw) > 0
    fitted, hist = fit(measured, hw, ("tc_handoff", "coresident"))
    assert hist[-1] < hist[0] / 100
    assert fitted.tc_handoff == pytest.approx(96, rel=0.1) and fitted.coresident == pytest.approx(0.3, rel=0.1)

def test_fit_refuses_bad_input(samples):
    with pytest.raises(PtsolveError, match="no samples"):
        fit([], load("h200"))
    with pytest.raises(PtsolveError, match="sms"):
        fit(samples, load("h200"), ("sms",))


def test_evaluate_metrics(samples):
    hw = load("h200")
    ev = evaluate(samples, replace(hw, **TRUE))
    assert ev["mape"] == 0 and ev["sign_configs"] == 4 and ev["sign_agreement"] == 1
    off = evaluate([replace(s, kernel_us=s.kernel_us * 1.25) for s in samples], replace(hw, **TRUE))
    assert off["mape"] == pytest.approx(0.2)


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == 1
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == -1
    assert spearman([1, 2, 3], [1, 3, 2]) == pytest.approx(0.5)
    assert spearman([1, 2], [1, 2]) != spearman([1, 2], [1, 2])  # NaN: too few
    assert spearman([1, 1, 2, 3], [5, 6, 7, 8]) == pytest.approx(0.9486832980505138)  # average ranks for ties


def hw_table(name):
    import json
    from pathlib import Path

    import ptsolve.hw
    return {k: v["value"] if isinstance(v, dict) else v
            for k, v in json.loads((Path(ptsolve.hw.__file__).parent / f"{name}.json").read_text()).items()}


def test_overlay_round_trip(tmp_path, monkeypatch):
    hw = load("h200", calibrated=False)
    p = write(replace(hw, tc_fixed=150, mem_latency=700), hw, "test fit", tmp_path / "h200.calibrated.json")
    monkeypatch.setenv("PTSOLVE_CALIBRATION_DIR", str(tmp_path))
    got = load("h200")
    assert (got.tc_fixed, got.mem_latency) == (150, 700) and got.l2_bytes_per_clk == hw.l2_bytes_per_clk
    assert "test fit" in got.sources["tc_fixed"] and set(FIT) >= {"tc_fixed", "mem_latency"}
    assert p.name == "h200.calibrated.json"
    base = load("h200", calibrated=False)  # what a fit starts from: the datasheet table, overlay ignored
    assert (base.tc_fixed, base.mem_latency) == (hw_table("h200")["tc_fixed"], hw_table("h200")["mem_latency"])


def test_fit_stops_at_its_deadline(samples):
    """A deadline already past: no sweep runs, the table comes back unchanged, and the progress line says why."""
    hw = load("h200")
    said = []
    fitted, hist = fit(samples, hw, tuple(TRUE), deadline=0.0, progress=said.append)
    assert fitted == hw and len(hist) == 1 and "time limit" in said[0]
