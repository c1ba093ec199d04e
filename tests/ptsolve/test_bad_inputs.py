"""A held-out-style set of bad inputs, each at the boundary it crosses: the CLI answers with one line on stderr and
exit status 2 (no traceback, nothing half-written), the API with a PtsolveError naming the file or field."""
from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

import ptsolve
from ptsolve.cli import main
from ptsolve.errors import ConfigError, HardwareError, PtsolveError, SchemaError, ShapeError
from ptsolve.hw import HERE, load
from ptsolve.program import SProgram
from ptsolve.result import Result

GREEDY = ["--solver", "greedy", "--no-cache", "--no-compile-check"]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("bad")
    table = json.loads((HERE / "h100.json").read_text())
    docs = {"trunc.json": '{"a": 1', "list.json": "[]", "empty.json": "{}", "text.json": "hello",
            "smem0.json": json.dumps(table | {"smem_per_sm": 0}), "sms_str.json": json.dumps(table | {"sms": "many"}),
            "clock_str.json": json.dumps(table | {"clock_ghz": {"value": "fast", "source": "x"}}),
            "tma_int.json": json.dumps(table | {"has_tma": 1}), "rows.json": json.dumps(list(table.items())),
            "zero_sfu.json": json.dumps(table | {"sfu_per_clk": 0}), "neg.json": json.dumps(table | {"tc_fixed": -1}),
            "threads0.json": json.dumps(table | {"max_threads": 0}),
            "extra_str.json": json.dumps(table | {"task_extra": {"flash_attention/exp2/2": "9"}})}
    for name, text in docs.items():
        (d / name).write_text(text)
    (d / "folder.json").mkdir()
    return d


def _one_line(capsys, argv: list[str]) -> str:
    """Run the CLI; assert exit 2 and exactly one 'ptsolve: error:' line on stderr; return that line."""
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("ptsolve: error: "), (rc, err)
    assert "Traceback" not in err[0]
    return err[0]


HW_CASES = [("smem0.json", "'smem_per_sm' must be > 0"), ("sms_str.json", "'sms' must be a whole number"),
            ("clock_str.json", "'clock_ghz' must be a number"), ("tma_int.json", "'has_tma' must be true or false"),
            ("rows.json", "expected a JSON object"), ("zero_sfu.json", "'sfu_per_clk' must be > 0"),
            ("neg.json", "'tc_fixed' is negative"), ("threads0.json", "'max_threads' must be > 0"),
            ("extra_str.json", "task_extra entry"), ("trunc.json", "not valid JSON"), ("text.json", "not valid JSON"),
            ("missing.json", "does not exist"), ("folder.json", "is a folder"), ("empty.json", "missing field")]


@pytest.mark.parametrize("name,says", HW_CASES)
def test_bad_hardware_tables(files, capsys, name, says):
    line = _one_line(capsys, ["optimize", "gemm", "M=64", "N=64", "K=64", "--hw", str(files / name), *GREEDY,
                              "--out", str(files / "o")])
    assert says in line and name in line


def test_a_table_the_library_wrote_loads_back(tmp_path, capsys):
    for n in ("h100", "h200", "mi300x", "a100"):
        f = tmp_path / f"{n}_copy.json"
        f.write_text(json.dumps(load(n).to_dict()))
        assert load(f, calibrated=False) == load(n)
    assert main(["optimize", "gemm", "M=64", "N=64", "K=64", "--hw", str(f), *GREEDY, "--out", str(tmp_path)]) == 0


FILE_CASES = [
    (["calibrate", "--candidates", "{d}/missing.json", "--study", "{d}/empty.json"], "does not exist"),
    (["calibrate", "--candidates", "{d}/trunc.json", "--study", "{d}/empty.json"], "not valid JSON"),
    (["calibrate", "--candidates", "{d}/list.json", "--study", "{d}/empty.json"], "expected a JSON object"),
    (["calibrate", "--candidates", "{d}/empty.json", "--study", "{d}/empty.json"], "not a study's candidates"),
    (["calibrate", "--candidates", "{d}/folder.json", "--study", "{d}/empty.json"], "is a folder"),
    (["calibrate", "--candidates", "{d}/empty.json", "--study", "{d}/text.json"], "not valid JSON"),
    (["tune", "gemm", "M=64", "N=64", "K=64", "--finish", "{d}/missing.json"], "does not exist"),
    (["tune", "gemm", "M=64", "N=64", "K=64", "--finish", "{d}/trunc.json"], "not valid JSON"),
    (["tune", "gemm", "M=64", "N=64", "K=64", "--finish", "{d}/list.json"], "expected a JSON object"),
    (["tune", "gemm", "M=64", "N=64", "K=64", "--finish", "{d}/empty.json"], "holds candidates of"),
    (["calibrate-tasks", "--profiles", "{d}/nowhere", "--schedules", "{d}"], "no *.profile.json"),
    (["profile", "--schedules", "{d}", "--only", "trunc", "--out", "{d}/p"], "not valid JSON"),
    (["profile", "--schedules", "{d}", "--only", "missing", "--out", "{d}/p"], "does not exist"),
    (["profile", "--only", "x", "--out", "{d}/p"], "--schedules"),
    (["optimize", "fa", "batch=1", "heads=2", "seq=128", "seq_q=64", *GREEDY], "give seq alone"),
    (["optimize", "fa", "batch=1", "heads=2", "seq=128", "head_dim=abc", *GREEDY], "head_dim"),
    (["optimize", "gemm", "M=0", "N=64", "K=64", *GREEDY], "M"),
    (["optimize", "gemm", "M=64", "N=64", *GREEDY], "K"),
    (["optimize", "gemm", "M=64", "N=64", "K=64", "Q=1", *GREEDY], "Q"),
    (["optimize", "nope", "M=1", *GREEDY], "unknown operator"),
    (["optimize", "gemm", "M=64", "N=64", "K=64", "--time-limit", "-1"], "time-limit"),
    (["optimize", "gemm", "M=64", "N=64", "K=64", "--fix", "nokey=1", *GREEDY], "nokey"),
    (["compare", "--solvers", "greedy,magic"], "magic"),
    (["compare", "--only", "ZZZ"], "ZZZ"),
    (["placement", "--search-limit", "0"], "search-limit"),
]


@pytest.mark.parametrize("argv,says", FILE_CASES, ids=[" ".join(a[:2]) + f"-{i}" for i, (a, _) in
                                                        enumerate(FILE_CASES)])
def test_bad_files_and_arguments(files, capsys, argv, says):
    line = _one_line(capsys, [x.format(d=files) for x in argv] + (["--out", str(files / "o")] if argv[0] in (
        "optimize", "compare", "calibrate") else []))
    assert says in line, line


def test_debug_shows_where_an_error_came_from(files, capsys, monkeypatch):
    monkeypatch.setenv("PTSOLVE_DEBUG", "1")
    assert main(["optimize", "gemm", "M=64", "N=64", "K=64", "--hw", str(files / "smem0.json"), *GREEDY]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("ptsolve: error: ")


@pytest.fixture(scope="module")
def result_json() -> dict:
    r = ptsolve.optimize(ptsolve.ops.gemm(256, 256, 256), hw="h100", solver="greedy", cache=False,
                         compile_check=False)
    return json.loads(r.to_json())


@pytest.mark.parametrize("field,value,says", [
    ("objective", "fast", "'objective' must be a whole number or null"), ("solve_s", "x", "'solve_s'"),
    ("program", [], "'program' must be an object or null"), ("tiling", [1], "'tiling' must be an object"),
    ("cached", 1, "'cached' must be true or false"), ("status", "GREAT", "status 'GREAT'"),
    ("features", "ping-pong", "'features' must be an array")])
def test_bad_result_json(result_json, field, value, says):
    with pytest.raises(SchemaError, match=says):
        Result.from_json(json.dumps(result_json | {field: value}))


@pytest.mark.parametrize("doc", ["{}", "[]", '{"schema": 1}', '{"a"'])
def test_bad_program_json(doc):
    with pytest.raises(SchemaError):
        SProgram.from_json(doc)


def test_bad_program_fields(result_json):
    with pytest.raises(SchemaError, match="SProgram"):
        SProgram.from_json(json.dumps(result_json["program"] | {"start": [1, 2]}))


@pytest.mark.parametrize("doc", ["{}", "[]", '{"schema": 1, "roles": 3}', '{"a'])
def test_bad_kernel_ir_json(doc):
    from codegen.kernel_ir import KernelIR
    with pytest.raises(SchemaError):
        KernelIR.from_json(doc)


@pytest.mark.parametrize("name,says", [("trunc.json", "not valid JSON"), ("missing.json", "does not exist"),
                                       ("list.json", "expected a JSON object"), ("empty.json", "neither")])
def test_bad_schedules_for_the_hip_emitter(files, capsys, name, says):
    from codegen.hip.__main__ import main as hip
    assert hip([str(files / name), "--out", str(files / "h")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0]


def test_the_api_names_contradictions_and_bad_tables(files):
    with pytest.raises(ShapeError, match="seq=128 sets both"):
        ptsolve.ops.flash_attention(batch=1, heads=2, seq=128, seq_kv=256)
    with pytest.raises(HardwareError, match="smem_per_sm"):
        load(files / "smem0.json")
    assert isinstance(HardwareError("x"), PtsolveError)


def test_a_full_disk_leaves_the_old_file_and_no_temporary(tmp_path, capsys, monkeypatch):
    """The JSON of an earlier answer is on disk; writing the next one runs out of space: the CLI says so in one line,
    the old file is whole, no temporary file is left beside it."""
    args = ["optimize", "gemm", "M=64", "N=64", "K=64", *GREEDY, "--out", str(tmp_path)]
    assert main(args) == 0
    capsys.readouterr()
    (old,) = tmp_path.glob("*.json")
    before = old.read_text()
    import ptsolve.fileio as fio

    def full(fd, mode):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(fio.os, "fdopen", full)
    line = _one_line(capsys, args)
    assert "No space left on device" in line and str(old) in line
    assert old.read_text() == before and sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [old.name, old.with_suffix(".svg").name])


def test_an_unwritable_output_folder(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    line = _one_line(capsys, ["optimize", "gemm", "M=64", "N=64", "K=64", *GREEDY, "--out", str(f)])
    assert "is a file, not a folder" in line
    with pytest.raises(ConfigError, match="cannot write"):
        from ptsolve.fileio import write_text
        write_text(tmp_path / "no" / "such" / "dir" / "x.json", "{}")
