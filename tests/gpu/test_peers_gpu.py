"""GPU test of the peers run (bench study ``peers``): one small row of each workload through ``run.run_row``: the
user call within FlashAttention's rule and timed, the exact kernel absent without plans (with the reason), every
peer either timed or absent with a reason (never a zero), the row serialisable."""
from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.gpu

ROWS = [
    {"name": "t/prefill", "workload": "prefill", "shape": {"batch": 2, "heads": 8, "kv_heads": 2, "seq_q": 300,
                                                          "seq_kv": 333, "head_dim": 64, "causal": True}},
    {"name": "t/varlen", "workload": "varlen", "shape": {"heads": 8, "kv_heads": 2, "head_dim": 128, "causal": True,
                                                        "seqlens_q": [5, 130, 77], "seqlens_k": [5, 200, 77]}},
    {"name": "t/decode", "workload": "decode", "shape": {"batch": 2, "heads": 8, "kv_heads": 2, "seq_q": 4,
                                                        "seq_kv": 1000, "head_dim": 128, "causal": True}},
    {"name": "t/gemm", "workload": "gemm", "shape": {"M": 100, "N": 256, "K": 512}},
]


@pytest.mark.parametrize("row", ROWS, ids=[r["workload"] for r in ROWS])
def test_a_row_is_checked_timed_and_says_why_a_peer_is_absent(torch, row):
    from bench.peers.run import run_row
    rec = run_row(row, None, rounds=3, block_ms=0.2)
    assert rec["ok"] and rec["ptsolve_us"] > 0, rec
    assert rec["exact_us"] is None and rec["absent"]["exact"]
    assert all(v > 0 for v in rec["peers"].values())
    assert all(isinstance(why, str) and why for why in rec["absent"].values())
    assert "tilelang" in rec["absent"] and not set(rec["peers"]) & set(rec["absent"])
    if row["workload"] == "gemm":
        assert "cublas" in rec["peers"]
    json.dumps(rec)
