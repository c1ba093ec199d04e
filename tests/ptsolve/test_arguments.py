"""Every bad input is refused with a PtsolveError naming the value and the fix, before any cache lookup or solve
(issue 10). Each case here was accepted, or gave a traceback, before ptsolve/arguments.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ptsolve
from ptsolve import ops, optimize
from ptsolve.errors import ConfigError, GraphError, HardwareError, PtsolveError, SchemaError, ShapeError, SolverError
from ptsolve.ir import STaskGraph

ROOT = Path(__file__).resolve().parents[2]
GEMM_T = {"BM": 128, "BN": 128, "BK": 64, "depth": 2, "groups": 1}


def run(*args: str, env: dict[str, str] | None = None, **kw) -> subprocess.CompletedProcess:
    """``python -m ptsolve.cli`` of this checkout, in a subprocess."""
    e = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "ptsolve.cli", *args], capture_output=True, text=True, env=e,
                          cwd=kw.pop("cwd", ROOT), timeout=300, **kw)


def test_causal_must_be_a_bool() -> None:
    with pytest.raises(ShapeError, match="causal='maybe' must be true or false"):
        ops.flash_attention(batch=1, heads=2, seq=128, causal="maybe")
    with pytest.raises(ShapeError, match="causal=1"):
        ops.flash_attention(batch=1, heads=2, seq=128, causal=1)


def graph_dict() -> dict:
    return json.loads(ops.gemm(256, 256, 256).graph(GEMM_T).to_json())


@pytest.mark.parametrize("field,value,match", [
    ("bytes", -4096, "bytes=-4096 must be an integer >= 0"),
    ("flops", -1, "flops=-1"),
    ("sfu", 2.5, "sfu=2.5"),
    ("reuse", -3, "reuse=-3 must be a number >= 1"),
    ("reuse", 0.5, "reuse=0.5"),
    ("tile", [128, -64], r"tile=\(128, -64\) must be positive"),
    ("group", -2, "group=-2"),
    ("is_async", "yes", "is_async='yes'"),
    ("dtype", "fp64", "dtype 'fp64'"),
])
def test_graph_json_numbers_are_checked(field: str, value, match: str) -> None:
    d = graph_dict()
    load_a = next(t for t in d["tasks"] if t["name"] == "load_a")
    load_a[field] = value
    with pytest.raises(GraphError, match=match):
        STaskGraph.from_json(json.dumps(d))


def test_graph_json_missing_field_is_not_zero() -> None:
    d = graph_dict()
    del next(t for t in d["tasks"] if t["name"] == "load_a")["bytes"]
    with pytest.raises(SchemaError, match=r"missing fields \['bytes'\]"):
        STaskGraph.from_json(json.dumps(d))
    d = graph_dict()
    del d["edges"][0]["dist"]
    with pytest.raises(SchemaError, match="missing fields"):
        STaskGraph.from_json(json.dumps(d))
    d = graph_dict()
    d["rows"] = -1
    with pytest.raises(GraphError, match="rows=-1"):
        STaskGraph.from_json(json.dumps(d))
    d = graph_dict()
    d["tiling"]["depth"] = 0
    with pytest.raises(GraphError, match="tiling values"):
        STaskGraph.from_json(json.dumps(d))


def test_grain_env_var() -> None:
    code = "import ptsolve; print('imported'); ptsolve.optimize(ptsolve.ops.gemm(256, 256, 256), solver='greedy')"
    for bad in ("abc", "0", "-8", "99999"):
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": str(ROOT), "PTSOLVE_GRAIN": bad}, timeout=120)
        assert p.stdout == "imported\n", p.stderr  # import works; the first use refuses the value
        assert f"ConfigError: PTSOLVE_GRAIN='{bad}' is not a whole number of cycles" in p.stderr
        c = run("optimize", "gemm", "M=256", "N=256", "K=256", "--solver", "greedy", env={"PTSOLVE_GRAIN": bad})
        assert c.returncode == 2 and c.stderr.count("\n") == 1 and "PTSOLVE_GRAIN" in c.stderr, c.stderr
    assert ptsolve.arguments.env_grain("16") == 16 and ptsolve.arguments.env_grain(None) == 8


def test_cache_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PTSOLVE_CACHE", "perhaps")
    with pytest.raises(ConfigError, match="PTSOLVE_CACHE='perhaps'"):
        optimize(ops.gemm(256, 256, 256), solver="greedy")


@pytest.mark.parametrize("call,match", [
    (lambda: ops.flash_attention(batch=10**6, heads=64, seq=8192), "from batch·heads·seq_q"),
    (lambda: ops.flash_attention(batch=1, heads=1, seq=10**6, causal=True), r"from seq_kv \(causal\)"),
    (lambda: ops.gemm(10**6, 10**6, 64), "from M·N"),
    (lambda: ops.gemm(64, 64, 10**9), "from K"),
    (lambda: ops.mamba2_chunk_scan(10**6, 10**6, 64, 64, 128, 256), "from batch·seq·heads"),
])
def test_size_guard_names_the_dimension(call, match: str) -> None:
    with pytest.raises(ShapeError, match=match):
        call()


def test_size_guard_on_graphs() -> None:
    d = graph_dict()
    d["rows"] = 10**8
    with pytest.raises(ShapeError, match="len.row.·rows"):
        STaskGraph.from_json(json.dumps(d))


@pytest.mark.parametrize("kw,err,match", [
    ({"time_limit": -1}, SolverError, "time_limit must be"),
    ({"time_limit": float("nan")}, SolverError, "time_limit must be"),
    ({"time_limit": "30"}, SolverError, "time_limit must be"),
    ({"executor": "gpu"}, SolverError, "unknown executor 'gpu'"),
    ({"placement": "random"}, SolverError, "unknown placement 'random'"),
    ({"jobs": 0}, SolverError, "jobs must be"),
    ({"jobs": 1.5}, SolverError, "jobs must be"),
    ({"fix": {"ctas": "one"}}, SolverError, "fix must map"),
    ({"hw": None}, HardwareError, "hw must be"),
    ({"hw": 100}, HardwareError, "hw must be"),
    ({"cache": "yes"}, PtsolveError, "must be True or False"),
])
def test_arguments_checked_before_the_cache(kw, err, match: str) -> None:
    op = ops.gemm(1024, 1024, 1024)
    optimize(op, hw="h100", solver="greedy")  # now cached: a bad argument must still be refused
    with pytest.raises(err, match=match):
        optimize(op, **{"hw": "h100", "solver": "greedy", **kw})


def test_exhaustive_refuses_big_operators_up_front() -> None:
    with pytest.raises(SolverError, match="'exhaustive' enumerates .* use solver 'cpsat'"):
        optimize(ops.gemm(4096, 1024, 4096), solver="exhaustive", cache=False)


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("")
    cases = [
        (["optimize", "gemm", "M=256", "N=256", "K=256", "--solver", "greedy", "--out", str(f)], "is a file"),
        (["optimize", "gemm", "M=256", "N=256", "K=256", "--jobs", "0"], "--jobs"),
        (["optimize", "fa", "batch=1", "heads=2", "seq=128", "causal=maybe"], "causal='maybe'"),
        (["compare", "--only", "NOPE"], "matches no configuration"),
        (["compare", "--solvers", "greedy,annealing"], "unknown ['annealing']"),
        (["placement", "--suite", "bogus"], "invalid choice: 'bogus'"),
        (["optimize", "gemm", "M=256", "N=256", "K=256", "--hw", str(tmp_path / "none.json")], "does not exist"),
        (["optimize", "conv", "x=1"], "unknown operator 'conv'"),
    ]
    for args, match in cases:
        p = run(*args)
        assert p.returncode == 2, (args, p.stderr)
        assert p.stderr.count("\n") == 1 and match in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)


def test_cli_survives_a_closed_pipe() -> None:
    e = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run(f"{sys.executable} -m ptsolve.cli ops | head -1", shell=True, capture_output=True, text=True,
                       env=e, cwd=ROOT, timeout=120)
    assert p.stdout.count("\n") == 1 and "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr, p.stderr
