"""ChunkScan's ``cb_dtype``: CB read as float32 (rounded once, in P, as mamba_ssm) or in the input dtype. The operator
validates and prices it (the CB tile's bytes and shared memory double), the emitter reads float32 CB through its own
TMA map and compiles clean for sm_90a (nvcc needed; skipped without), the serving layer's classes carry it (bf16's
default float32, fp16's fp16: ``ptsolve.geometry.mamba2.DEFAULT_CB_DTYPE``) with table entries of their own, and the
launcher refuses a cb of the other dtype. The launches on the fake GPU: tests/serve/test_torch_cpu.py; the accuracy
on the GPU: tests/gpu/test_ssd_gpu.py."""
from __future__ import annotations

import pytest

from codegen.cuda import chunk_scan as cs
from codegen.cuda import emit_ir
from codegen.lower import lower
from codegen.plan import default_plan
from ptsolve import ops, serve
from ptsolve.errors import PtsolveError, ShapeError
from ptsolve.geometry.mamba2 import DEFAULT_CB_DTYPE
from ptsolve.hw import load, target
from ptsolve.validate import smem_peak

SHAPE = {"batch": 2, "seq": 1000, "heads": 8, "head_dim": 64, "d_state": 128, "chunk": 256, "groups": 1}
H200 = load("h200")
T64 = {"BM": 64, "BK": 64, "depth": 3, "groups": 1, "ctas": 2}


def _p(dtype: str = "bf16", cb: str | None = "fp32", **kw: object) -> dict:
    return SHAPE | {"dtype": dtype} | ({"cb_dtype": cb} if cb else {}) | kw


def test_the_parameter_is_validated_and_kept_only_for_float32():
    assert ops.make("mamba2_chunk_scan", **_p()).params["cb_dtype"] == "fp32"
    for same in ("bf16", None):  # the input dtype is the parameter's absence: the plain kernel, byte for byte
        assert "cb_dtype" not in ops.make("mamba2_chunk_scan", **_p(cb=same)).params
    for bad in ("fp16", "float32", "fp8"):
        with pytest.raises(ShapeError, match=f"cb_dtype={bad!r}"):
            ops.make("mamba2_chunk_scan", **_p(cb=bad))
    with pytest.raises(ShapeError, match="cb_dtype"):
        ops.make("mamba2_chunk_scan", **_p("fp16", "bf16"))


def _graph(p: dict, t: dict):
    return ops.make("mamba2_chunk_scan", **p).graph(t, "h200")


@pytest.mark.parametrize("bk, ratio", [(32, 1), (64, 2), (128, 2)])
def test_the_cb_tile_is_priced(bk, ratio):
    """float32 CB doubles the CB tile's bytes and slot, except at BK 32, where the fp16/bf16 box already moves 64
    columns (one 128-byte row) and the float32 box its 32."""
    t = T64 | {"BK": bk}
    g16, g32 = _graph(_p(cb=None), t), _graph(_p(), t)
    t16, t32 = g16.task["load_cb"], g32.task["load_cb"]
    assert t32.bytes == ratio * t16.bytes == 64 * max(bk, 32) * 4 and t32.dtype == "fp32"
    assert [b.bytes for b in t32.allocs] == [t32.bytes] and [b.bytes for b in t16.allocs] == [t16.bytes]
    slots = {"cb": 3, "da": 3, "dt": 3, "x": 3, "w@0": 1}
    assert smem_peak(g32, slots, H200)[0] - smem_peak(g16, slots, H200)[0] >= 3 * (t32.bytes - t16.bytes)


def test_a_tiling_that_no_longer_fits_is_refused():
    """Three CTAs a SM with d_state 128 fit with bf16 CB and not with float32 CB: the search's budget sees it."""
    t = {"BM": 64, "BK": 64, "depth": 2, "groups": 1, "ctas": 3}
    slots = {"cb": 2, "da": 2, "dt": 2, "x": 2, "w@0": 1}
    cap = target(H200).smem_budget(3)
    assert smem_peak(_graph(_p(cb=None), t), slots, H200)[0] <= cap < smem_peak(_graph(_p(), t), slots, H200)[0]


def _src(p: dict, t: dict = T64, generic: bool = True):
    return emit_ir(lower(default_plan("mamba2_chunk_scan", p, t), "h200", generic=generic))


def test_the_float32_variant_reads_float32_cb_and_converts_nothing():
    plain, f32 = _src(_p(cb=None)).source, _src(_p()).source
    assert "pts_bf1622float2(*reinterpret_cast<const pts_bf162*>(&cbv))" in plain
    assert "const float2 cf = *reinterpret_cast<const float2*>(cb_cur + (j >> 2) * BM * 128" in f32
    assert "cbv" not in f32 and "CBCH = 2;" in f32 and "CBCH = 1;" in plain  # BK 64: two 32-column float32 boxes
    assert "it_ * BK + 32 * cc, cb_row" in f32 and "it_ * BK + 64 * cc, cb_row" in plain
    # the one rounding: P packed to bf16 for the wgmma (and the store's), no conversion from bf16 anywhere
    assert "__bfloat1622float2" not in f32 and f32.count("pack_bf162(") == plain.count("pack_bf162(") > 0
    assert _src(_p(cb=None)).name != _src(_p()).name  # another binary


def test_the_tma_map_and_launch_bytes_are_float32():
    t = T64
    m16 = {m.tensor: m for m in cs.maps(_p(cb=None), t)}["cb"]
    m32 = {m.tensor: m for m in cs.maps(_p(), t)}["cb"]
    Q = SHAPE["chunk"]
    assert (m16.dtype, m16.strides_bytes, m16.box) == ("bf16", (Q * 2,), (64, 64))
    assert (m32.dtype, m32.strides_bytes, m32.box, m32.swizzle) == ("fp32", (Q * 4,), (32, 64), m16.swizzle)
    assert m32.dims == m16.dims  # the same (chunk, rows) view, in float32
    for other in ("x", "c", "states", "dt", "dA"):  # the other maps are the plain kernel's
        assert {m.tensor: m for m in cs.maps(_p(), t)}[other] == {m.tensor: m for m in cs.maps(_p(cb=None), t)}[other]
    src = _src(_p(), generic=False).source
    assert "mbar_expect_tx(&cb_full[s_], 16384);" in src  # 64 rows x 64 float32 columns per stage


def _has_nvcc() -> bool:
    from codegen.runtime import nvcc_path
    try:
        nvcc_path()
    except PtsolveError:
        return False
    return True


@pytest.mark.skipif(not _has_nvcc(), reason="needs nvcc")
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("t", [T64, {"BM": 128, "BK": 32, "depth": 2, "groups": 2},
                               {"BM": 64, "BK": 128, "depth": 2, "groups": 1},
                               {"BM": 128, "BK": 64, "depth": 2, "groups": 2}], ids=lambda t: str(tuple(t.values())))
def test_float32_cb_compiles_clean(dtype, t, tmp_path, monkeypatch):
    """ptxas builds hand tilings of the float32 variant for sm_90a without spills or a serialised wgmma pipeline, in
    the plain kernel's registers plus at most a few."""
    from codegen.runtime import compile_kernel

    monkeypatch.setenv("PTSOLVE_CACHE_DIR", str(tmp_path))
    rep = compile_kernel(_src(_p(dtype))).report
    assert rep["spill_stores"] == 0 and rep["spill_loads"] == 0 and not rep["wgmma_serialized"], rep
    assert rep["registers"] <= compile_kernel(_src(_p(dtype, None))).report["registers"] + 8, rep


def _scan(dtype: str = "bf16", cb: str | None = None, n: int = 128, q: int = 256, ep: str = "") -> serve.ShapeClass:
    return serve.mamba_class("mamba2_chunk_scan", dtype, 64, n, q, ep, cb)


def test_classes_carry_the_cb_dtype_with_their_own_schedules():
    assert DEFAULT_CB_DTYPE == {"bf16": "fp32", "fp16": "fp16"}
    assert _scan("bf16").cb_dtype == "fp32" and _scan("fp16").cb_dtype == ""
    assert _scan("bf16").key == "mamba2_chunk_scan/bf16/p64/n128/q256/cb32"
    assert _scan("bf16", "bf16").key == "mamba2_chunk_scan/bf16/p64/n128/q256" == _scan("bf16", "").key
    assert _scan("fp16", "fp32").key == "mamba2_chunk_scan/fp16/p64/n128/q256/cb32"
    assert _scan("bf16", ep="Dz").key == "mamba2_chunk_scan/bf16/p64/n128/q256/cb32/Dz"
    with pytest.raises(ShapeError, match="cb_dtype='fp16'"):
        _scan("bf16", "fp16")
    with pytest.raises(ShapeError, match="only ChunkScan"):
        serve.mamba_class("mamba2_chunk_state", "bf16", 64, 128, 256, cb_dtype="fp32")
    keys = {c.key for c in serve.classes()}
    for d in ("fp16", "bf16"):  # both CB dtypes of both dtypes are table classes
        assert {_scan(d, cb).key for cb in ("fp32", d)} <= keys
    table = serve.load_table()["classes"]
    for c in serve.classes():
        if c.op == "mamba2_chunk_scan":
            assert serve.representative(c).get("cb_dtype", "") == c.cb_dtype
            assert table[c.key]["plan"]["params"].get("cb_dtype", "") == c.cb_dtype, c.key
            var = serve.schedule(_scan(c.dtype, c.cb_dtype or c.dtype, c.d_state, c.chunk, "Dz"))
            assert var.params.get("cb_dtype", "") == c.cb_dtype  # a variant keeps its class's CB


@pytest.mark.skipif(not _has_nvcc(), reason="needs nvcc")
@pytest.mark.parametrize("args", [("bf16", 128, 256), ("bf16", 64, 64), ("fp16", 128, 128)])
def test_float32_cb_classes_compile_clean(args, tmp_path, monkeypatch):
    """The table's float32-CB class kernels and fused variants compile for sm_90a without spills or a serialised
    wgmma pipeline (n64 q64 runs three CTAs a SM in 80 registers: its D variant spilled while D was held across the
    store's loops)."""
    monkeypatch.setenv("PTSOLVE_CACHE_DIR", str(tmp_path))
    d, n, q = args
    for c in (_scan(d, "fp32", n, q), _scan(d, "fp32", n, q, "D"), _scan(d, "fp32", n, q, "Dz")):
        rep = serve.compile_class(c)
        assert rep["spill_stores"] == 0 and rep["spill_loads"] == 0 and not rep["wgmma_serialized"], (c.key, rep)


def test_launch_refuses_a_cb_of_the_other_dtype():
    torch = pytest.importorskip("torch")
    from ptsolve.serve.mamba2 import _check_cb

    cb32 = torch.zeros(1, 1, 1, 4, 4)
    c32, c16 = _scan("bf16"), _scan("bf16", "bf16")
    _check_cb(c32, cb32, {"dtype": "bf16", "cb_dtype": "fp32"})
    _check_cb(c16, cb32.bfloat16(), {"dtype": "bf16"})
    with pytest.raises(ShapeError, match="cb must be float32, got torch.bfloat16"):
        _check_cb(c32, cb32.bfloat16(), {"dtype": "bf16", "cb_dtype": "fp32"})
    with pytest.raises(ShapeError, match="cb must be bf16, got torch.float32"):
        _check_cb(c16, cb32, {"dtype": "bf16"})
    with pytest.raises(PtsolveError, match="rebuild the table"):  # a schedule made for the other CB
        _check_cb(c32, cb32, {"dtype": "bf16"})
