"""A's TMA box holds no more rows than M rounded up to 8 (ptsolve.ops.gemm.a_rows): the model's load bytes, the
kernel's tensor map and its expect-tx count agree; a tile M fills keeps its box."""
from __future__ import annotations

import pytest

import ptsolve
from codegen.cuda import emit
from codegen.plan import default_plan
from ptsolve.hw import load
from ptsolve.ops.gemm import a_rows

T = {"BM": 64, "BN": 128, "BK": 64, "depth": 5, "groups": 1, "pingpong": 1}


@pytest.mark.parametrize("M,rows", [(1, 8), (8, 8), (13, 16), (64, 64), (4096, 64)])
def test_box_rows(M, rows):
    assert a_rows(M, 64) == rows
    p = {"M": M, "N": 1024, "K": 512, "dtype": "fp16"}
    g = ptsolve.ops.gemm(**p).graph(T, load("h200"))
    assert g.task["load_a"].bytes == rows * 64 * 2 and g.buffers()["a"].bytes == 64 * 64 * 2  # the tile stays
    ks = emit(default_plan("gemm", p, T), "h200")
    assert ks.tensor_maps[0].box == (64, rows)
    assert f"mbar_expect_tx(&a_full[s_], {rows * 128});" in ks.source
