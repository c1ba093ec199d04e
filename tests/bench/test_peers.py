"""The peers study (bench study ``peers``): its suite meets issue 35's minimums and is deterministic, and its report
computes the ratios, geomeans and minimums from a run's JSON with absent peers left out (never zeros)."""
from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from bench.peers import report as rep
from bench.peers import suite
from bench.peers.run import cumulative, nsets, within_rule

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def rows():
    return suite.rows()


def by(rows, w):
    return [r["shape"] for r in rows if r["workload"] == w]


def test_the_suite_meets_the_counts_and_is_deterministic_and_unique(rows):
    c = suite.counts(rows)
    assert c["prefill"] >= 40 and c["varlen"] >= 6 and c["decode"] >= 12 and c["gemm"] >= 24
    assert rows == suite.rows()  # the varlen lengths are seeded
    assert len({r["name"] for r in rows}) == len(rows)
    assert len({repr(sorted(r["shape"].items())) for r in rows}) == len(rows)
    assert all(r["shape"]["dtype"] == "fp16" for r in rows)


def test_prefill_covers_batches_lengths_masks_and_head_layouts(rows):
    pf = by(rows, "prefill")
    assert min(s["batch"] for s in pf) == 1 and max(s["batch"] for s in pf) == 32
    seqs = {s["seq_kv"] for s in pf} | {s["seq_q"] for s in pf}
    assert min(s["seq_kv"] for s in pf) == 128 and max(s["seq_kv"] for s in pf) == 16384
    assert {1000, 2047, 4097} <= seqs  # ragged lengths
    assert {True, False} == {s["causal"] for s in pf}
    assert any(s["seq_q"] < s["seq_kv"] and s["causal"] for s in pf)  # bottom-right
    assert {64, 96, 128, 256} == {s["head_dim"] for s in pf}  # shapes.md's head dims
    assert any(1 < s["heads"] // s["kv_heads"] < s["heads"] for s in pf)  # GQA
    assert any(s["kv_heads"] == 1 for s in pf) and any(s["kv_heads"] == s["heads"] for s in pf)  # MQA, MHA
    assert all(s["batch"] == 1 for s in pf if max(s["seq_q"], s["seq_kv"]) > 8192)  # the giant rows capped


def test_the_heads_are_shapes_md_families(rows):
    md = ROOT.parent / "shared" / "shapes.md"
    if not md.exists():
        pytest.skip("../shared/shapes.md is not beside this checkout")
    cells = re.finditer(r"\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|", md.read_text())
    table = {tuple(map(int, m.groups())) for m in cells}
    assert set(suite.MODELS.values()) <= table


def test_varlen_batches_are_seeded_lengths_from_1_to_4000(rows):
    vl = by(rows, "varlen")
    assert len(vl) >= 6
    for s in vl:
        assert len(s["seqlens_q"]) == len(s["seqlens_k"]) >= 2
        assert all(1 <= q <= k <= 4000 for q, k in zip(s["seqlens_q"], s["seqlens_k"]))
    assert min(min(s["seqlens_q"]) for s in vl) <= 16 and max(max(s["seqlens_k"]) for s in vl) >= 3500
    assert any(s["seqlens_q"] != s["seqlens_k"] for s in vl) and {True, False} == {s["causal"] for s in vl}
    assert suite.varlen_lengths(8, 1, 4000, 1) == suite.varlen_lengths(8, 1, 4000, 1)
    assert suite.varlen_lengths(8, 1, 4000, 1) != suite.varlen_lengths(8, 1, 4000, 2)


def test_decode_covers_positions_caches_batches_and_gqa(rows):
    dc = by(rows, "decode")
    assert {s["seq_q"] for s in dc} >= {1, 16} and all(1 <= s["seq_q"] <= 16 for s in dc)
    assert min(s["seq_kv"] for s in dc) <= 1024 and max(s["seq_kv"] for s in dc) >= 128 * 1024
    assert {1, 64} <= {s["batch"] for s in dc}
    assert any(1 < s["heads"] // s["kv_heads"] for s in dc)
    assert all(s["causal"] == (s["seq_q"] > 1) for s in dc)


def test_gemm_covers_the_m_set_llm_projections_squares_and_odd_sizes(rows):
    gm = {(s["M"], s["N"], s["K"]) for s in by(rows, "gemm")}
    assert {1, 16, 64, 128, 333, 1000, 4096, 16384} <= {m for m, _, _ in gm}
    llm = {(14336, 4096), (4096, 14336), (28672, 8192), (8192, 28672), (1024, 4096), (151936, 3584), (4096, 4096)}
    assert llm <= {(n, k) for _, n, k in gm}
    assert {(1024,) * 3, (16384,) * 3, (1000,) * 3, (3000,) * 3, (4095, 4097, 1024)} <= gm


def test_select_filters_by_name_and_limits_each_workload(rows):
    assert {r["workload"] for r in suite.select(rows, "gemm/")} == {"gemm"}
    got = suite.select(rows, limit=2)
    assert suite.counts(got) == {"prefill": 2, "varlen": 2, "decode": 2, "gemm": 2}
    assert suite.select(rows, "no-such-row") == []


def test_run_helpers():
    assert nsets(1e3) == 64 and nsets(1e9) == 1 and nsets(50e6) == 4
    assert cumulative([3, 1, 2]) == [0, 3, 4, 6]
    assert within_rule(0.002, 0.001, 0.0) and not within_rule(0.0021, 0.001, 0.0)
    assert within_rule(0.0021, 0.001, 0.0002) and not within_rule(math.inf, 1.0, 1.0)


def row(name, w, pt, peers, exact=None, ok=True, **kw):
    shape = {"M": 1, "N": 8, "K": 8} if w == "gemm" else {"batch": 1, "heads": 8, "kv_heads": 2, "seq_q": 128,
                                                          "seq_kv": 128, "head_dim": 64, "causal": False}
    return {"name": name, "workload": w, "shape": shape, "ptsolve_us": pt, "exact_us": exact, "peers": peers,
            "max_abs_err": 1e-3, "ok": ok, **kw}


def synthetic():
    return {"device": "NVIDIA H200", "date": "2026-12-04", "commit": "abc1234", "command": "x",
            "fa4_importable": False, "fa4_why": "flash_attn.cute not importable: ModuleNotFoundError: x",
            "rows": [row("p1", "prefill", 100.0, {"fa4": 80.0, "cudnn": 90.0}, exact=95.0),
                     row("p2", "prefill", 50.0, {"cudnn": 60.0, "fa4": None}, exact=50.0),
                     row("p3", "prefill", 40.0, {}, absent={"fa4": "refused: NotImplementedError"}),
                     row("g1", "gemm", 100.0, {"cublas": 110.0}),
                     row("g2", "gemm", 100.0, {"cublas": 90.0}, ok=False),
                     row("g3", "gemm", None, {"cublas": 50.0}, absent={"ptsolve": "ShapeError: N=4097"})]}


def test_report_ratios_leave_absent_peers_out():
    rs = synthetic()["rows"]
    assert rep.fastest_peer(rs[0]) == ("fa4", 80.0) and rep.fastest_peer(rs[2]) is None
    assert rep.ratio(rs[0]) == pytest.approx(0.8) and rep.ratio(rs[1]) == pytest.approx(1.2)
    assert rep.ratio(rs[1], "fa4") is None and rep.ratio(rs[5]) is None
    s = rep.summary(rs[:3])
    assert s["geomean"] == pytest.approx(math.sqrt(0.8 * 1.2)) and s["min"] == pytest.approx(0.8)
    assert s["measured"] == 2 and s["no_peer"] == ["p3"] and s["below_090"] == ["p1"]
    g = rep.summary(rs[3:], "cublas")
    assert g["geomean"] == pytest.approx(math.sqrt(1.1 * 0.9)) and g["min"] == pytest.approx(0.9)
    assert g["no_ptsolve"] == ["g3"] and g["measured"] == 2
    assert rep.geomean([]) is None and rep.geomean([2.0, 8.0]) == pytest.approx(4.0)


def test_the_markdown_says_absent_never_zero_and_judges_the_criteria():
    md = rep.report(synthetic())
    assert "| 0.0 |" not in md and " 0.000" not in md
    assert "abc1234" in md and "H200" in md and "absent from every row" in md and "ModuleNotFoundError" in md
    line = next(ln for ln in md.splitlines() if ln.startswith("| p2 |"))
    assert "| — | 60.0 |" in line and "1.200 (cudnn)" in line  # fa4 absent: a dash, cuDNN the fastest peer
    crit = md.split("## Done when")[1].split("## Per workload")[0]
    assert "**Prefill and varlen** (fastest peer / ptsolve geomean >= 1.0, none below 0.90): NOT met" in crit
    assert "**GEMM** (cuBLAS / ptsolve geomean >= 1.0, none below 0.90): NOT met" in crit
    assert "**Varlen** (>= 1.0x FlashAttention-4 on every batch): not measured" in crit
    assert ("Correctness** (every row within FlashAttention's rule): NOT met (4 of 6 rows; outside the rule: g2; "
            "ptsolve absent (refused or failed): g3)") in crit
    assert "geomean 1.026 over 2 rows" in crit  # (100/95 * 50/50) ** 0.5


def test_a_run_that_beats_every_peer_meets_its_criteria():
    res = {"rows": [row("p", "prefill", 50.0, {"fa4": 60.0}, exact=50.0), row("g", "gemm", 10.0, {"cublas": 10.5}),
                    row("d", "decode", 20.0, {"cudnn": 19.0})]}
    crit = "\n".join(rep.criteria(res["rows"]))
    assert "(fastest peer / ptsolve geomean >= 1.0, none below 0.90): met" in crit
    assert "(cuBLAS / ptsolve geomean >= 1.0, none below 0.90): met" in crit
    assert "**Decode** (geomean >= 1.0, none below 0.90): NOT met" in crit  # 0.95


def test_prepare_packs_only_the_cubins_the_run_launches(tmp_path):
    import json
    import tarfile

    from bench.peers.prepare import op_params, pack
    work = tmp_path / "work" / "cubin"
    work.mkdir(parents=True)
    for k in ("aa", "bb", "cc"):
        (work / f"{k}.cubin").write_bytes(b"x")
        (work / f"{k}.json").write_text("{}")
    plans = {"classes": {"gemm/fp16": "aa"}, "rows": {"r1": {"cubin": "bb"}, "r2": {"error": "refused"}}}
    n, size = pack(plans, tmp_path / "work", tmp_path / "out", tmp_path / "pack" / "c.tar.xz")
    assert n == 2 and size > 0
    names = set(tarfile.open(tmp_path / "pack" / "c.tar.xz").getnames())
    assert {"out/cubin/aa.cubin", "out/cubin/bb.json", "out/plans.json"} <= names and "out/cubin/cc.cubin" not in names
    assert json.loads((tmp_path / "out" / "plans.json").read_text()) == plans
    r = {"workload": "prefill", "shape": {"model": "m", "batch": 1, "heads": 8, "kv_heads": 2, "seq_q": 5,
                                          "seq_kv": 9, "head_dim": 64, "causal": True, "dtype": "fp16"}}
    assert "model" not in op_params(r) and op_params(r)["seq_kv"] == 9
    assert op_params({"workload": "gemm", "shape": {"M": 1, "N": 2, "K": 3, "dtype": "fp16"}}) == {
        "M": 1, "N": 2, "K": 3, "dtype": "fp16"}


def test_merging_two_partial_runs_keeps_every_row_once(tmp_path, capsys):
    import json
    a, b = synthetic(), synthetic()
    a["rows"], a["not_run"], a["wall_s"] = a["rows"][:3], ["g1", "g2", "g3"], 100.0
    b["rows"], b["not_run"], b["wall_s"], b["command"] = b["rows"][2:], [], 50.0, "y"
    m = rep.merge([a, b])
    assert [r["name"] for r in m["rows"]] == ["p1", "p2", "p3", "g1", "g2", "g3"]
    assert m["not_run"] == [] and m["wall_s"] == 150.0 and m["command"] == "x ; y"
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    assert rep.main([str(pa), str(pb), "--json-out", str(tmp_path / "m.json"), "--out", str(tmp_path / "m.md")]) == 0
    assert json.loads((tmp_path / "m.json").read_text())["rows"] == m["rows"]
    assert (tmp_path / "m.md").read_text() == rep.report(m)


def test_a_row_that_ptsolve_refuses_fails_its_criterion_even_with_nothing_else_measured():
    crit = "\n".join(rep.criteria([row("d", "decode", None, {"cudnn": 19.0}, absent={"ptsolve": "ShapeError"})]))
    assert "**Decode** (geomean >= 1.0, none below 0.90): NOT met" in crit
    assert "**GEMM** (cuBLAS / ptsolve geomean >= 1.0, none below 0.90): not measured" in crit
