"""The bench package: one command (``python -m bench <study> [args...]``, ``ptsolve bench``) runs every study."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


def test_every_study_is_registered_and_lists_its_tools(capsys):
    from bench import STUDIES
    from bench._study import tools
    assert sorted(p.name for p in (ROOT / "bench").iterdir() if (p / "__init__.py").exists()) == sorted(STUDIES)
    for name in STUDIES:
        assert tools(f"bench.{name}"), name
        assert importlib.import_module(f"bench.{name}").main(["--help"]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"python -m bench {name} <tool>") and all(t in out for t in tools(f"bench.{name}"))


def test_the_command_line(capsys):
    from bench import STUDIES
    from bench.__main__ import main
    assert main(["--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out] == list(STUDIES)
    assert main([]) == 2 and main(["no_such_study"]) == 2
    assert "no study 'no_such_study'" in capsys.readouterr().err


@pytest.fixture
def fake_study(tmp_path, monkeypatch):
    """A study package ``zz_fake`` with a Python tool (the default) and a shell tool, each printing its arguments."""
    pkg = tmp_path / "zz_fake"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""A fake study."""\n')
    (pkg / "echo_args.py").write_text('"""Print the arguments."""\nimport sys\n\nif __name__ == "__main__":\n'
                                      '    print("py", sys.argv[1:])\n    sys.exit(3 if "fail" in sys.argv else 0)\n')
    (pkg / "device.sh").write_text('#!/usr/bin/env bash\n# A device call.\necho "sh $*"\n')
    (pkg / "_helper.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "zz_fake"
    sys.modules.pop("zz_fake", None)


def test_a_study_dispatches_to_its_tools(fake_study, capfd):
    from bench._study import dispatch, tools
    assert sorted(tools(fake_study)) == ["device", "echo_args"]  # _helper is no tool
    saved = list(sys.argv)
    assert dispatch(fake_study, ["echo_args", "a", "--b"]) == 0
    assert dispatch(fake_study, ["x", "fail"], default="echo_args") == 3  # not a tool name: the default's arguments
    assert dispatch(fake_study, ["device", "c", "d"]) == 0
    assert dispatch(fake_study, ["x"]) == 2  # no default
    assert sys.argv == saved
    out = capfd.readouterr().out
    assert "py ['a', '--b']" in out and "py ['x', 'fail']" in out and "sh c d" in out
    assert dispatch(fake_study, ["--help"], default="echo_args") == 0
    assert "Print the arguments.  [default]" in capfd.readouterr().out


def test_fa_interface_report_names_wrong_cases_and_fa4s_bar():
    """The feature x head_dim report: a case outside FlashAttention's rule is named, FA4's ratio is FA4's time over
    ptsolve's, and the issue's 0.9 bar is counted."""
    from bench.fa_interface.report import report
    rows = [{"feature": "softcap", "head_dim": 128, "ok": True, "errs": {"ptsolve": 1e-3}, "ptsolve_us": 100.0,
             "fa4_us": 80.0, "absent": {}},
            {"feature": "seqused", "head_dim": 96, "ok": False, "errs": {"ptsolve": 0.5}, "ptsolve_us": 10.0,
             "absent": {"fa4": "refused: NotImplementedError"}}]
    md = report({"rows": rows})
    assert "| softcap | not run | not run | ok, 100 µs, FA4/ptsolve 0.80 |" in md
    assert "1 of 2; not: seqused/d96" in md and "0 of 1 at >= 0.9" in md
    assert "- seqused: refused: NotImplementedError" in md


def test_paged_report_judges_every_row():
    """bench torch_decode paged's report: the bar (paged ≥ 0.9× unpaged) is judged on the worst row, not the mean."""
    from bench.torch_decode.paged import report
    res = {"device": "H200", "date": "d", "torch": "t", "commit": "c",
           "rows": {"a": {"us": {"unpaged": 10.0, "paged": 10.0}, "max_diff": 0.0},
                    "b": {"us": {"unpaged": 10.0, "paged": 9.0}, "max_diff": 0.0}}}
    assert "met (min 1.000" in report(res)
    res["rows"]["c"] = {"us": {"unpaged": 8.0, "paged": 10.0}, "max_diff": 0.0}
    assert "not met (min 0.800" in report(res)
    assert "| c | 8.0 | 10.0 | 0.800 |" in report(res)
