"""Split-KV decode's softcap variants in the serving layer (Gemma-2's and Grok's capped scores): every decode class has
one, ``.../softcap``, that runs its plain class's schedule with the cap in its parameters (``OpClasses.derived``), is
priced with the tanh when a shape's binary and pieces are chosen, and compiles for sm_90a without spills or a
serialised wgmma pipeline; the table holds none of them."""
from __future__ import annotations

import dataclasses
import os
from concurrent.futures import ThreadPoolExecutor

import pytest
from test_shape_classes import _has_nvcc

from ptsolve import serve
from ptsolve.errors import ShapeError
from ptsolve.hw import load
from ptsolve.serve.classes import variants
from ptsolve.serve.table import load_table

DECODE = [c for c in serve.classes() if c.op == "flash_decode"]
SOFTCAP = [c for c in variants() if c.op == "flash_decode"]


def test_every_decode_class_has_a_softcap_variant_outside_the_table():
    """One variant per decode table class (the same binaries' choice: ``decode_variants`` keeps the cap), keyed
    ``.../softcap``, absent from the shipped table: its schedule is the plain class's with the cap in its parameters,
    and its program (re-timed per shape) the plain class's."""
    assert SOFTCAP == [dataclasses.replace(c, softcap=True) for c in DECODE] and len(SOFTCAP) == len(DECODE) > 0
    table = load_table()["classes"]
    for v in SOFTCAP:
        plain = dataclasses.replace(v, softcap=False)
        assert v.key == plain.key + "/softcap" and v.key not in table and plain.key in table
        s, p = serve.schedule(v), serve.schedule(plain)
        assert s.params == p.params | {"softcap": serve.decode.DECODE_REP_SOFTCAP} and s.tiling == p.tiling
        assert s.order == p.order and serve.class_program(v) == serve.class_program(plain)
    c = serve.decode_class("bf16", 128, True, 16, 8, 1, softcap=True)  # Gemma-2-9B's heads
    assert c.key == "flash_decode/bf16/d128/causal/wg1/softcap" and c in SOFTCAP
    assert all(v.softcap for v in serve.decode_variants(c))
    assert [dataclasses.replace(v, softcap=False) for v in serve.decode_variants(c)] == serve.decode_variants(
        dataclasses.replace(c, softcap=False))


@pytest.mark.parametrize("B,H,Hkv,sq,skv,D", [(1, 16, 8, 1, 8192, 128), (1, 32, 16, 4, 16384, 128),
                                              (8, 8, 4, 1, 4096, 64), (64, 16, 8, 1, 1024, 128)])
def test_softcap_decode_is_priced_with_its_tanh(B, H, Hkv, sq, skv, D):
    """A shape's pieces and binary are chosen on the graph with the cap: at every piece count the re-timed softcap
    kernel takes at least the plain one's time (rowmax's tanh on the SFU), more in one piece (the whole softmax on one
    SM); the choice still splits a long cache of few kv heads (Gemma-2-9B's 8 at batch 1)."""
    hw = load("h200")
    p = {"batch": B, "heads": H, "kv_heads": Hkv, "seq_q": sq, "seq_kv": skv, "head_dim": D, "causal": False,
         "dtype": "bf16"}
    plain = serve.decode_class("bf16", D, False, H, Hkv, sq)
    capped = dataclasses.replace(plain, softcap=True)
    for s in (1, 2, 8, 16):
        assert serve.decode_retime(capped, p | {"softcap": 50.0}, s, hw) >= serve.decode_retime(plain, p, s, hw)
    assert serve.decode_retime(capped, p | {"softcap": 50.0}, 1, hw) > serve.decode_retime(plain, p, 1, hw)
    v, s = serve.decode_pick(capped, p | {"softcap": 50.0})
    assert v.softcap and v in serve.decode_variants(capped)
    if B * Hkv <= 16 and skv >= 8192:
        assert s > 1


def test_a_launch_and_its_class_agree_on_the_softcap():
    """The plain class's launch refuses a cap and the softcap variant's a call without one (ptsolve.torch picks the
    class from the call): the error names the class and the value."""
    torch = pytest.importorskip("torch")
    q, k = torch.zeros(1, 1, 16, 128, dtype=torch.float16), torch.zeros(1, 64, 8, 128, dtype=torch.float16)
    plain = serve.decode_class("fp16", 128, False, 16, 8, 1)
    for c, cap in ((plain, 30.0), (dataclasses.replace(plain, softcap=True), 0.0)):
        with pytest.raises(ShapeError, match=rf"{c.key} runs softcap={cap!r}"):
            serve.decode_launch(q, k, k, c, 0.1, softcap=cap)


@pytest.mark.skipif(not _has_nvcc(), reason="needs nvcc")
def test_every_softcap_decode_variant_compiles_clean(tmp_path, monkeypatch):
    """Each softcap variant's generic kernel caps its scores with the tanh (the cap a launch argument) and ptxas builds
    it for sm_90a without spills or a serialised wgmma pipeline, its registers those of its plain class's binary or
    fewer than the register file's share (the two-CTA binaries: half of it)."""
    monkeypatch.setenv("PTSOLVE_CACHE_DIR", str(tmp_path))
    for v in SOFTCAP:
        ks = serve.kernel(v).ks
        assert "fast_tanh(sacc" in ks.source and "f32:softcap_pre" in ks.args and "f32:scale_log2" in ks.args
        assert "fast_tanh" not in serve.kernel(dataclasses.replace(v, softcap=False)).ks.source
    with ThreadPoolExecutor(max(1, min(8, os.cpu_count() or 1))) as pool:  # nvcc runs are independent processes
        reps = dict(zip(SOFTCAP, pool.map(serve.compile_class, SOFTCAP)))
    for v, rep in reps.items():
        assert rep["spill_stores"] == 0 and rep["spill_loads"] == 0 and not rep["wgmma_serialized"], (v.key, rep)
        assert rep["registers"] <= (128 if v.ctas == 2 else 240), (v.key, rep)
