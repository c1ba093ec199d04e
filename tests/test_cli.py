from __future__ import annotations

import json

from ptsolve.cli import main


def test_optimize_writes_json_and_png(tmp_path, capsys) -> None:
    rc = main(["optimize", "fa", "batch=1", "heads=8", "kv_heads=2", "seq=512", "head_dim=64", "causal=true",
               "--solver", "greedy", "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "loop producer" in out and "load_k" in out
    js = list(tmp_path.glob("*.json"))
    assert len(js) == 1 and json.loads(js[0].read_text())["status"] == "FEASIBLE"
    assert list(tmp_path.glob("*.png"))


def test_errors_exit_2(capsys) -> None:
    assert main(["optimize", "fa", "batch=1", "heads=32", "kv_heads=5", "seq=64"]) == 2
    assert "not divisible by kv_heads" in capsys.readouterr().err
    assert main(["optimize", "conv", "x=1"]) == 2
    assert main(["optimize", "gemm", "M"]) == 2


def test_compare_small_suite(tmp_path) -> None:
    rc = main(["compare", "--only", "GEMM0,CS0", "--solvers", "greedy,cpsat", "--out", str(tmp_path),
               "--time-limit", "20"])
    assert rc == 0
    md = (tmp_path / "compare_h100.md").read_text()
    assert "GEMM0" in md and "CS0" in md and "commit:" in md and "date:" in md
    assert (tmp_path / "compare_h100.csv").exists() and (tmp_path / "compare_h100.png").exists()
