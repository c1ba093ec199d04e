"""Per-task costs from the profiler (hw.task_extra, ptsolve.calibrate.task_extra, ``ptsolve calibrate-tasks``): the
cost model charges exactly the keyed tasks, the fit recovers what a timeline measured, the table loader refuses bad
entries, the overlay keeps other fits' entries, and with the committed H200 fit the exact solver issues FlashAttention's
QK of one iteration and PV of the previous one back to back in one tensor-core turn (the order the GPU runs fastest,
bench study first_choice)."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from ptsolve import ops
from ptsolve.calibrate import task_extra, write
from ptsolve.cli import main as cli
from ptsolve.cost import task_key, timings
from ptsolve.errors import HardwareError, PtsolveError
from ptsolve.hw import load
from ptsolve.policies import greedy
from ptsolve.policies.model import build
from ptsolve.program import SProgram

ROOT = Path(__file__).resolve().parents[2]
TILING = {"BM": 128, "BN": 128, "depth": 2, "groups": 2}


def _graph(hw, heads: int = 8, seq: int = 1024):
    return ops.make("flash_attention", batch=1, heads=heads, kv_heads=heads // 4, seq_q=seq, seq_kv=seq,
                    head_dim=128).graph(TILING, hw)


def test_extra_charged_to_the_keyed_tasks_only():
    hw = load("h200", calibrated=False)
    g = _graph(hw)
    base = timings(g, hw)
    more = timings(g, replace(hw, task_extra={"flash_attention/rowmax/2": 320, "gemm/rowmax/2": 999,
                                                  "flash_decode/exp2/2": 999}))
    for n, t in base.items():
        if n.startswith("rowmax@"):
            assert more[n].busy(t.stream) - t.busy(t.stream) == 320 and more[n].latency - t.latency == 320
        else:
            assert more[n] == t, n
    assert task_key("flash_attention", g.task["exp2@1"], g.groups) == "flash_attention/exp2/2"


def _profile(prog: SProgram, busy: dict[str, list[int]]) -> dict:
    ev = []
    for n, xs in busy.items():
        for i, b in enumerate(xs):
            ev.append({"cta": 0, "role": f"wg{n[-1]}", "task": n, "phase": "loop", "iteration": i, "t0": 100 * i,
                       "t1": 100 * i + 7, "t2": 100 * i + 7 + b})
    ev.append({"cta": 0, "role": "producer", "task": "load_k", "phase": "loop", "iteration": 0, "t0": 0, "t1": 0,
               "t2": 5000})  # not a vector task: not fitted
    return {"kernel": "k", "op": prog.graph.op, "events": ev}


def test_fit_recovers_the_measured_extra():
    hw = load("h200", calibrated=False)
    g = _graph(hw)
    prog, _ = greedy.solve(build(g, hw))
    model = timings(g, hw)
    m = {n: model[n].busy(model[n].stream) for n in ("rowmax@0", "rowmax@1", "exp2@0", "rowsum@0")}
    prof = _profile(prog, {"rowmax@0": [m["rowmax@0"] + 300, m["rowmax@0"] + 310, m["rowmax@0"] + 900],
                           "rowmax@1": [m["rowmax@1"] + 330] * 3, "exp2@0": [m["exp2@0"] + 50] * 2,
                           "rowsum@0": [m["rowsum@0"] - 40] * 2})
    fit = task_extra([(prof, prog)], hw)
    assert set(fit) == {"flash_attention/rowmax/2", "flash_attention/exp2/2", "flash_attention/rowsum/2"}
    assert fit["flash_attention/rowmax/2"]["extra"] == 320  # medians 310 and 330 per warpgroup, their median
    assert fit["flash_attention/exp2/2"]["extra"] == 50
    assert fit["flash_attention/rowsum/2"]["extra"] == 0  # faster than the model: no negative extra
    # fitting from a table that already has extras gives the same answer (it starts from the bare model)
    assert task_extra([(prof, prog)], replace(hw, task_extra={"flash_attention/rowmax/2": 500})) == fit
    with pytest.raises(PtsolveError, match="pair each profile"):
        task_extra([(prof | {"op": "gemm"}, prog)], hw)


@pytest.mark.parametrize("bad", [{"flash_attention/rowmax/2": -1}, {"flash_attention/rowmax/2": 1.5},
                                 {"flash_attention/rowmax": 3}, {"flash_attention/rowmax/x": 3},
                                 {"flash_attention/rowmax/2": True}])
def test_table_refuses_bad_entries(tmp_path, bad):
    raw = json.loads((ROOT / "ptsolve/hw/h200.json").read_text())
    raw["task_extra"] = {"value": bad, "source": "test"}
    (tmp_path / "t.json").write_text(json.dumps(raw))
    with pytest.raises(HardwareError, match="task_extra"):
        load(tmp_path / "t.json")


def test_overlay_keeps_the_other_fits_entries(tmp_path, monkeypatch):
    monkeypatch.setenv("PTSOLVE_CALIBRATION_DIR", str(tmp_path))
    hw = load("h200", calibrated=False)
    write(replace(hw, tc_fixed=150), hw, "study fit")
    write(replace(hw, task_extra={"flash_attention/exp2/2": 42}), hw, "task fit", keys=("task_extra",))
    got = load("h200")
    assert got.tc_fixed == 150 and got.task_extra == {"flash_attention/exp2/2": 42}
    write(replace(hw, tc_fixed=170), hw, "study fit again")  # a new study fit keeps the task fit
    got = load("h200")
    assert got.tc_fixed == 170 and got.task_extra == {"flash_attention/exp2/2": 42}
    assert "task fit" in got.sources["task_extra"]


def test_cli_fits_the_committed_profiles(tmp_path, monkeypatch, capsys):
    """The committed overlay's task_extra is what the committed profiles give (the fit is relative to the rest of
    the calibrated table, so the overlay is copied first)."""
    committed = ROOT / "ptsolve/hw/h200.calibrated.json"
    (tmp_path / committed.name).write_text(committed.read_text())
    monkeypatch.setenv("PTSOLVE_CALIBRATION_DIR", str(tmp_path))
    d = ROOT / "tests/data/task_costs"
    assert cli(["calibrate-tasks", "--hw", "h200", "--profiles", str(d / "prof"), "--schedules", str(d / "sched"),
                "--write"]) == 0
    out = capsys.readouterr().out
    assert "| flash_attention/rowmax/2 |" in out and "wrote" in out
    fitted = load("h200").task_extra
    assert fitted == load("h200", calibrated=True).task_extra
    monkeypatch.delenv("PTSOLVE_CALIBRATION_DIR")
    assert fitted == load("h200").task_extra  # the committed overlay is this fit
    assert cli(["calibrate-tasks", "--profiles", str(tmp_path), "--schedules", str(d / "sched")]) != 0


def test_exact_solver_takes_the_fa3_turns_with_the_fitted_costs():
    """With the fitted per-task costs the free CP-SAT schedule issues QK(j) and PV(j-1) back to back in one
    tensor-core turn of each warpgroup, its softmax after them, under the tensor cores; without them it puts a
    warpgroup's softmax between its QK and its PV (the order the GPU measured 5-8% slower)."""
    pytest.importorskip("ortools")
    from codegen.plan import plan_from_program
    from ptsolve.policies import cpsat

    def turns(hw) -> list[tuple[str, ...]]:
        """Each warpgroup's run of consecutive tensor-core tasks in the schedule's tc_order (one turn each)."""
        # many tiles per SM (FA3's shape): the kernel time is the II's; with one tile per SM, schedules of
        # different IIs tie and the tie-break is the search's
        prog, st = cpsat.solve(build(_graph(hw, 32, 4096), hw), time_limit=60)
        assert st["status"] == "OPTIMAL"
        tc = plan_from_program(prog, hw).tc_order
        runs: list[list[str]] = []
        for t in tc:
            if runs and runs[-1][-1][-2:] == t[-2:]:
                runs[-1].append(t)
            else:
                runs.append([t])
        return [tuple(x.split("@")[0] for x in r) for r in runs]

    hw = load("h200")
    assert hw.task_extra, "the committed H200 overlay has per-task costs"
    assert turns(hw) == [("mma_qk", "mma_pv")] * 2
    assert turns(replace(hw, task_extra={})) != [("mma_qk", "mma_pv")] * 2


def test_unfitted_warpgroup_counts_take_the_nearest_fit():
    """A tiling must not look cheaper because its warpgroup count was never profiled: three warpgroups take the
    two-warpgroup entry (the nearest below), one takes the smallest above when nothing below is fitted."""
    from ptsolve.cost import task_extra_of
    hw = load("h200", calibrated=False)
    g = _graph(hw)
    t = g.task["rowmax@0"]
    both = replace(hw, task_extra={"flash_attention/rowmax/1": 100, "flash_attention/rowmax/2": 300})
    assert [task_extra_of(both, "flash_attention", t, n) for n in (1, 2, 3, 4)] == [100, 300, 300, 300]
    two = replace(hw, task_extra={"flash_attention/rowmax/2": 300})
    assert [task_extra_of(two, "flash_attention", t, n) for n in (1, 2, 3)] == [300, 300, 300]
    assert task_extra_of(two, "gemm", t, 2) == 0 and task_extra_of(two, "flash_attention", g.task["exp2@0"], 2) == 0


def test_fitted_zeros_are_written():
    """A task measured no slower than the model is written as 0, so it does not borrow another warpgroup count's
    entry (the committed table: rowsum with two warpgroups 0, with one 16)."""
    hw = load("h200")
    assert hw.task_extra["flash_attention/rowsum/2"] == 0 and hw.task_extra["flash_attention/rowsum/1"] > 0


def test_cli_keeps_to_its_time_limit(monkeypatch, capsys):
    """calibrate-tasks --time-limit: once it has run out (the test's clock: one minute per read), the profiles left
    are not read, the fit takes what was, and stderr names the rest."""
    import ptsolve.cli as c
    clock = iter(range(0, 10_000, 60))
    monkeypatch.setattr(c.time, "time", lambda: float(next(clock)))
    d = ROOT / "tests/data/task_costs"
    assert cli(["calibrate-tasks", "--hw", "h200", "--profiles", str(d / "prof"), "--schedules", str(d / "sched"),
                "--time-limit", "90"]) == 0
    err = capsys.readouterr().err
    assert "ran out; not read:" in err and "T3_cpsat.profile.json" in err and "T4_cpsat.profile.json" in err
    assert "T1_cpsat" not in err and "T2_cpsat" not in err
