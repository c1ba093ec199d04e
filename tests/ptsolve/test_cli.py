from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from xml.etree import ElementTree

import pytest

import ptsolve
from ptsolve.cli import main, parser

ROOT = Path(__file__).resolve().parents[2]


def test_optimize_writes_json_and_svg(tmp_path, capsys) -> None:
    rc = main(["optimize", "fa", "batch=1", "heads=8", "kv_heads=2", "seq=512", "head_dim=64", "causal=true",
               "--solver", "greedy", "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "loop producer" in out and "load_k" in out
    assert "notation:" in out and "task[sK]@C" in out  # the legend of the schedule lines
    js = list(tmp_path.glob("*.json"))
    assert len(js) == 1 and json.loads(js[0].read_text())["status"] == "FEASIBLE"
    svg = js[0].with_suffix(".svg")
    assert f"wrote {js[0]}" in out and f"wrote {svg}" in out
    root = ElementTree.parse(svg).getroot()  # a well-formed document: a browser shows it
    bars = [e for e in root.iter("{http://www.w3.org/2000/svg}rect") if e.find("{http://www.w3.org/2000/svg}title")
            is not None]
    assert any("load_k" in b.find("{http://www.w3.org/2000/svg}title").text for b in bars)
    assert all(float(b.get("x")) >= 90 and float(b.get("width")) > 0 for b in bars)  # right of the row labels


def test_optimize_does_not_import_matplotlib() -> None:
    """A cached answer must come back in well under a second; importing matplotlib alone costs about that."""
    code = ("import sys, tempfile; from ptsolve.cli import main; d = tempfile.mkdtemp(); "
            "args = ['optimize', 'gemm', 'M=256', 'N=256', 'K=256', '--solver', 'greedy', '--out', d]; "
            "assert main(args) == 0 and main(args) == 0; assert 'matplotlib' not in sys.modules, 'imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]


def test_optimize_default_out_is_not_the_current_folder(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["optimize", "gemm", "M=256", "N=256", "K=256", "--solver", "greedy"]) == 0
    assert not list(tmp_path.iterdir())
    out = Path(os.environ["PTSOLVE_OUT_DIR"])  # conftest's stand-in for ~/ptsolve-out
    assert f"wrote {out}" in capsys.readouterr().out and len(list(out.glob("gemm_*_h100_greedy.*"))) == 2


def test_hw_table_path_names_the_files_by_table(tmp_path, capsys) -> None:
    src = json.loads((ptsolve.hw.HERE / "h100.json").read_text())
    table = tmp_path / "tables" / "my.gpu.json"
    table.parent.mkdir()
    table.write_text(json.dumps(src | {"name": "mygpu"}))
    for solver in ("greedy", "cpsat"):
        assert main(["optimize", "gemm", "M=256", "N=256", "K=256", "--solver", solver, "--hw", str(table),
                     "--out", str(tmp_path / "o")]) == 0
    names = sorted(p.name for p in (tmp_path / "o").iterdir())
    # <graph name>_<table name>_<solver>: the graph's name says its structure (e.g. _pingpong), the table's the file
    assert len(names) == 4 and all(n.startswith("gemm_256x256x256_fp16") for n in names)
    assert sorted(n.split("_mygpu_")[1] for n in names) == ["cpsat.json", "cpsat.svg", "greedy.json", "greedy.svg"]


def test_errors_exit_2(capsys) -> None:
    assert main(["optimize", "fa", "batch=1", "heads=32", "kv_heads=5", "seq=64"]) == 2
    assert "not divisible by kv_heads" in capsys.readouterr().err
    assert main(["optimize", "conv", "x=1"]) == 2
    assert main(["optimize", "gemm", "M"]) == 2


def test_version_and_help(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out == f"ptsolve {ptsolve.__version__}\n"
    p = parser()
    subs = p._subparsers._group_actions[0].choices  # every option of every command has help text
    for name, sp in subs.items():
        for act in sp._actions:
            assert act.help, f"{name} {act.option_strings or act.dest} has no help"
            if act.choices:
                txt = sp.format_help()
                assert all(str(c) in txt for c in act.choices), (name, act.dest)
    h = subs["optimize"].format_help()
    assert "(default: 30.0)" in h and "(default: h100)" in h and "{greedy,cpsat" in h
    assert "flash_attention (also: fa): batch heads kv_heads=None" in h and "notation:" in h
    assert main(["ops", "fa"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("flash_attention (also: fa): batch heads") and "gemm" not in out


def test_compare_small_suite(tmp_path, capsys) -> None:
    rc = main(["compare", "--only", "GEMM0,CS0", "--solvers", "greedy,cpsat", "--out", str(tmp_path),
               "--time-limit", "20"])
    assert rc == 0
    md = (tmp_path / "compare_h100.md").read_text()
    assert "GEMM0" in md and "CS0" in md and "commit:" in md and "date:" in md
    assert (tmp_path / "compare_h100.csv").exists() and (tmp_path / "compare_h100.png").exists()
    out = capsys.readouterr().out
    for ext in ("csv", "md", "png"):
        assert f"wrote {tmp_path / ('compare_h100.' + ext)}" in out
    assert not (tmp_path / "compare_h100.partial.json").exists()


def _table(md: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in md.splitlines() if line.startswith("|")]


def test_compare_columns_line_up_without_greedy(tmp_path) -> None:
    assert main(["compare", "--only", "GEMM0", "--solvers", "cpsat", "--no-decoupled", "--out", str(tmp_path)]) == 0
    head, _, row = _table((tmp_path / "compare_h100.md").read_text())
    assert len(head) == len(row) and "speedup cpsat" not in head
    assert dict(zip(head, row))["cpsat status/gap"].startswith("OPTIMAL")
    assert not (tmp_path / "compare_h100.png").exists()  # no greedy, no speedup chart


def test_compare_writes_as_it_goes_and_resumes(tmp_path, monkeypatch, capsys) -> None:
    calls: list[str] = []
    real = ptsolve.optimize

    def counting(op, **kw):
        calls.append(op.op)
        if len(calls) == 3:
            raise KeyboardInterrupt  # the user presses ^C during the second configuration
        return real(op, **kw)

    monkeypatch.setattr(ptsolve, "optimize", counting)
    # --jobs 1: the configurations in this process, where the stand-in optimize counts them
    args = ["compare", "--only", "GEMM0,GEMM1", "--solvers", "greedy,cpsat", "--no-decoupled", "--jobs", "1",
            "--out", str(tmp_path)]
    assert main(args) == 130
    assert "interrupted" in capsys.readouterr().err
    csv_rows = (tmp_path / "compare_h100.csv").read_text().splitlines()
    assert len(csv_rows) == 2 and csv_rows[1].startswith("GEMM0,")  # the finished configuration is on disk
    assert (tmp_path / "compare_h100.partial.json").exists() and not (tmp_path / "compare_h100.md").exists()
    calls.clear()
    monkeypatch.setattr(ptsolve, "optimize", lambda op, **kw: (calls.append(op.op), real(op, **kw))[1])
    assert main(args) == 0
    assert "resuming: 1/2 configurations" in capsys.readouterr().err
    assert len(calls) == 2  # only GEMM1, greedy and cpsat
    assert [r[0] for r in _table((tmp_path / "compare_h100.md").read_text())[2:]] == ["GEMM0", "GEMM1"]


def _children(pid: int) -> list[int]:
    """Live child processes of ``pid`` (from /proc: no ps needed)."""
    out = []
    for d in Path("/proc").iterdir():
        try:
            stat = (d / "stat").read_text()
        except (OSError, ValueError):
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if d.name.isdigit() and int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(d.name))
    return out


def _sigint_default() -> None:
    """In the child: SIGINT as at a terminal. A command started in the background of a non-interactive shell (a CI
    runner's ``cmd &``) inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler at all."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_sigint_stops_the_pool_workers(tmp_path) -> None:
    """SIGINT to the main process (not the process group) must not leave solver workers running. The workers' solve
    is replaced by one that says it started and then waits: the signal lands while both are busy, however fast or
    loaded the machine (a real solve may finish before the signal, and the test would then check nothing)."""
    ready = tmp_path / "ready"
    ready.mkdir()
    code = ("import os, sys, time\n"
            "import ptsolve.search as s\n"
            "def busy(*a, **k):\n"
            f"    open(os.path.join({str(ready)!r}, str(os.getpid())), 'w').close()\n"
            "    time.sleep(600)\n"
            "s._worker = busy  # forked workers inherit it\n"
            "from ptsolve.cli import main\n"
            "sys.exit(main(['optimize', 'fa', 'batch=1', 'heads=8', 'kv_heads=2', 'seq=1024', '--jobs', '2',\n"
            f"               '--no-cache', '--no-compile-check', '--out', {str(tmp_path)!r}]))\n")
    p = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_default)
    try:
        deadline = time.monotonic() + 300  # only a broken pool waits this long; the verdict never depends on it
        while len(list(ready.iterdir())) < 2 and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        workers = sorted(int(f.name) for f in ready.iterdir())
        assert len(workers) == 2, f"the search never started two busy workers (exit {p.poll()})"
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=120)
    finally:
        p.kill()
    assert p.returncode == 130 and "interrupted" in err and "Traceback" not in err, err
    deadline = time.monotonic() + 60
    alive = workers
    while alive and time.monotonic() < deadline:  # a terminated worker is reaped by the exiting parent
        alive = [w for w in workers if os.path.exists(f"/proc/{w}") and "Z" not in
                 Path(f"/proc/{w}/stat").read_text().split()[2]]
        time.sleep(0.05)
    assert not alive, f"workers {alive} outlived the search"


def test_an_in_process_cpsat_solve_keeps_ctrl_c_a_keyboardinterrupt() -> None:
    """OR-Tools catches SIGINT during a solve by default and leaves it at SIG_DFL afterwards: a later Ctrl-C would
    kill the process without the CLI's cleanup (the pool's workers outliving it). The solves run in this process
    (a serial search, the polish) must leave Python's handler in place."""
    code = ("import os, signal, time\n"
            "from ptsolve import ops, optimize\n"
            "optimize(ops.gemm(512, 512, 512), hw='h200', solver='cpsat', executor='serial', cache=False,\n"
            "         compile_check=False, time_limit=5)\n"
            "try:\n"
            "    os.kill(os.getpid(), signal.SIGINT); time.sleep(2); print('not interrupted')\n"
            "except KeyboardInterrupt:\n"
            "    print('KeyboardInterrupt')\n")
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
                       capture_output=True, text=True, timeout=120, preexec_fn=_sigint_default)
    assert r.returncode == 0 and r.stdout.strip() == "KeyboardInterrupt", (r.returncode, r.stdout, r.stderr[-500:])


def test_an_interrupted_extension_import_is_an_interrupt(monkeypatch, capsys) -> None:
    """Ctrl-C during a lazy import of a C extension (OR-Tools' in the search's polish) arrives as an ImportError
    caused by the KeyboardInterrupt: the CLI still says "interrupted" and exits 130; another ImportError propagates."""
    from ptsolve import cli

    def interrupted_import(a):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as k:
            raise ImportError("initialization failed") from k
    monkeypatch.setattr(cli, "cmd_ops", interrupted_import)
    assert cli.main(["ops"]) == 130 and "interrupted" in capsys.readouterr().err
    monkeypatch.setattr(cli, "cmd_ops", lambda a: (_ for _ in ()).throw(ImportError("no module")))
    with pytest.raises(ImportError, match="no module"):
        cli.main(["ops"])


def test_compare_keeps_to_the_whole_commands_time_limit(tmp_path, monkeypatch, capsys) -> None:
    """--time-limit bounds the whole command: once it has run out, the configurations left are not solved but
    listed as not reached, and the report still comes out. The clock is the test's, not the machine's."""
    import ptsolve.cli as cli

    out_of_time = []
    real = ptsolve.optimize

    def solving(op, **kw):
        r = real(op, **kw)
        out_of_time.append(True)  # the clock runs out once the first search is done
        return r
    monkeypatch.setattr(ptsolve, "optimize", solving)
    monkeypatch.setattr(cli, "_left", lambda opts: -1.0 if out_of_time else 60.0)
    assert main(["compare", "--only", "GEMM0,GEMM1", "--solvers", "greedy,cpsat", "--no-decoupled", "--jobs", "1",
                 "--time-limit", "60", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "compare_h100.md").read_text()
    assert [r[0] for r in _table(md)[2:]] == ["GEMM0"]
    assert "**not reached** before the command's --time-limit (60 s): GEMM1." in md
    assert len(out_of_time) == 2  # GEMM0's greedy and cpsat; nothing of GEMM1


def test_compare_goes_on_past_a_configuration_with_no_schedule(tmp_path, monkeypatch) -> None:
    """A configuration a solver finds no schedule for (InfeasibleError: e.g. every tiling refused by the compiler) is
    named in the report with the reason, out of every figure, and the other configurations are still solved."""
    real = ptsolve.optimize

    def refusing(op, **kw):
        if kw["solver"] == "cpsat" and op.params.get("N") == 1024:  # GEMM0
            raise ptsolve.errors.InfeasibleError("every tiling was rejected by the compiler: test")
        return real(op, **kw)
    monkeypatch.setattr(ptsolve, "optimize", refusing)
    assert main(["compare", "--only", "GEMM0,GEMM1", "--solvers", "greedy,cpsat", "--no-decoupled", "--jobs", "1",
                 "--out", str(tmp_path)]) == 0
    md = (tmp_path / "compare_h100.md").read_text()
    assert [r[0] for r in _table(md)[2:]] == ["GEMM1"]
    assert "**no schedule** (left out of every figure above): GEMM0 (cpsat: every tiling was rejected" in md


def test_compare_says_where_the_decoupled_ablation_has_no_schedule(tmp_path, monkeypatch) -> None:
    """The decoupled ablation schedules the roofline's one tiling; where the compiler refuses it, its cell is '—' and
    the report says why; the configuration's other columns stand."""
    real = ptsolve.optimize

    def refusing(op, **kw):
        if kw.get("decoupled"):
            raise ptsolve.errors.InfeasibleError("every tiling was rejected by the compiler: roofline's")
        return real(op, **kw)
    monkeypatch.setattr(ptsolve, "optimize", refusing)
    assert main(["compare", "--only", "GEMM0", "--solvers", "greedy,cpsat", "--jobs", "1", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "compare_h100.md").read_text()
    (row,) = _table(md)[2:]
    assert row[0] == "GEMM0" and "—" in row
    assert "**decoupled: no schedule** (—): GEMM0 (every tiling was rejected by the compiler: roofline's)." in md


def test_compare_reports_exact_worse_than_greedy_and_contradicted_optima() -> None:
    """The compare table's two checks of issue "Exact means exact", by kernel cycles: an exact answer above greedy's
    is listed, and so is an OPTIMAL answer another policy's compile-clean answer beats; a clean table says so."""
    from ptsolve.cli import _contradictions

    def row(name: str, g: int, c: int, m: int, cst: str = "OPTIMAL", mchk: str = "ok") -> dict:
        return {"config": name, "greedy_cycles": g, "greedy_status": "FEASIBLE", "greedy_check": "ok",
                "cpsat_cycles": c, "cpsat_status": cst, "cpsat_check": "ok", "milp_cycles": m,
                "milp_status": "FEASIBLE", "milp_check": mchk}
    solvers = ["greedy", "cpsat", "milp"]
    clean = "\n".join(_contradictions([row("A", 100, 90, 95), row("B", 50, 50, 50)], solvers))
    assert "holds on all 2 configurations" in clean and "contradicted** by another policy's answer (compile-checked " \
        "on 2/2 configurations): none." in clean
    bad = "\n".join(_contradictions([row("A", 100, 110, 95), row("B", 50, 50, 40, mchk="rejected")], solvers))
    assert "violated on 1: A cpsat (110 > 100)" in bad
    assert "A cpsat OPTIMAL at 110, greedy 100" in bad and "A cpsat OPTIMAL at 110, milp 95" in bad
    assert "B cpsat" not in bad  # milp's lower answer there is one the compiler refused
    assert _contradictions([{"config": "old", "greedy_us": 1.0}], solvers) == []
