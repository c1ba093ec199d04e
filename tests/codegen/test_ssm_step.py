"""Mamba2's decode step (ptsolve.ops.ssm_step, codegen.cuda.ssm_step) on the CPU: the operator validates and refuses
bad shapes naming the value, its tilings and graph are what the kernel builds, the cost model prices the state's
bytes (near the HBM roofline at a large batch), greedy and CP-SAT schedule it and ``simulate`` replays the claim,
the command knows its alias, hand plans and the solvers' schedules compile for sm_90a with no spill (exact-shape and
shape-generic builds), the launch arguments are the serving layer's and the harness's float64 reference is
``recurrent_step``'s. The kernel against ``recurrent_step`` and mamba_ssm on an H100/H200 is
tests/gpu/test_ssm_step_gpu.py."""
from __future__ import annotations

import math
import os
import shutil

import pytest
from test_logsumexp import assert_clean

import ptsolve
from codegen.cuda import emit
from codegen.plan import default_plan
from ptsolve.errors import CodegenError, ShapeError
from ptsolve.opspec import aliases, make

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None and not os.path.exists("/usr/local/cuda/bin/nvcc"),
                                reason="nvcc not installed")

OP = "mamba2_ssm_step"
P = {"batch": 4, "heads": 48, "head_dim": 64, "d_state": 128, "groups": 1, "dtype": "bf16", "state_dtype": "fp32"}
TILINGS = [  # one and two warpgroups, 1 to 8 vectors a thread, one to eight trips a tile, one to four CTAs an SM
    {"BP": 8, "PT": 8, "depth": 2, "groups": 2, "ctas": 4},
    {"BP": 16, "PT": 32, "depth": 2, "groups": 2, "ctas": 4},
    {"BP": 16, "PT": 64, "depth": 4, "groups": 1, "ctas": 2},
    {"BP": 32, "PT": 32, "depth": 2, "groups": 1},
    {"BP": 64, "PT": 64, "depth": 2, "groups": 2},
    {"BP": 8, "PT": 64, "depth": 3, "groups": 2, "ctas": 2},
]


def _key(t: dict[str, int]) -> str:
    return "_".join(f"{k}{v}" for k, v in sorted(t.items()))


def test_the_operator_validates_and_builds() -> None:
    assert aliases()["ssm_step"] == OP
    op = make(OP, batch=4, heads=48, head_dim=64, d_state=128, dtype="bf16")
    assert op == ptsolve.ops.ssm_step.mamba2_ssm_step(4, 48, 64, 128, dtype="bf16")
    assert op.params == P
    ts = op.tilings()
    assert {t["BP"] // t["groups"] for t in ts} == {4, 8, 16, 32} and all(t["BP"] % 8 == 0 for t in ts)
    assert {t["PT"] // t["BP"] for t in ts} == {1, 2, 4, 8} and {t["ctas"] for t in ts} == {1, 2, 4}
    g = op.graph({"BP": 16, "PT": 32, "depth": 2, "groups": 2})
    assert {t.name for t in g.tasks} == {"load_s", "load_in", "init@0", "init@1", "step@0", "step@1", "put@0",
                                         "put@1"}
    assert g.row == (2, 2) and g.rows == 4 * 48 and not any(t.kind == "mma" for t in g.tasks)
    t = g.task
    # bytes of a trip: the float32 state rows in and out, x/z/B/C/D in, y out
    assert t["load_s"].bytes == 16 * 128 * 4 and t["put@0"].bytes == 8 * 128 * 4 + 8 * 2
    assert t["load_in"].bytes == 2 * 16 * 2 + 2 * 128 * 2 + 16 * 4
    assert {(e.src, e.dst, e.dist) for e in g.edges} >= {("load_s", "step@0", 0), ("load_in", "step@1", 0),
                                                        ("step@1", "put@1", 0), ("put@0", "step@0", 1)}
    half = make(OP, **(P | {"state_dtype": "bf16"})).graph({"BP": 16, "PT": 32, "depth": 2, "groups": 2}).task
    assert half["load_s"].bytes == 16 * 128 * 2 and half["put@1"].bytes == 8 * 128 * 2 + 8 * 2
    small = make(OP, **(P | {"d_state": 64}))
    assert {t["BP"] // t["groups"] for t in small.tilings()} == {8, 16, 32, 64}


@pytest.mark.parametrize("bad,why", [
    ({"d_state": 96}, "d_state=96 must be 16, 32, 64 or 128"),
    ({"head_dim": 60}, "head_dim=60 must be a multiple of 8"),
    ({"groups": 5}, "heads=48 must be a multiple of groups=5"),
    ({"state_dtype": "fp16"}, "state_dtype='fp16'; the state is 'fp32' or the activations' dtype 'bf16'"),
    ({"heads": 0}, "heads must be a positive integer"),
    ({"dtype": "fp32"}, "not supported"),
    ({"batch": 1 << 20, "heads": 64}, "below 2\\^31"),
    ({"seq": 8}, "unknown seq"),
])
def test_bad_shapes_name_the_value(bad: dict, why: str) -> None:
    with pytest.raises(ShapeError, match=why):
        make(OP, **(P | bad))


def test_a_tiling_the_kernel_cannot_build_is_refused() -> None:
    op = make(OP, **P)
    with pytest.raises(ShapeError, match="BP=24"):
        op.graph({"BP": 24, "PT": 24, "depth": 2, "groups": 1})
    with pytest.raises(ShapeError, match="PT=48"):
        op.graph({"BP": 16, "PT": 48, "depth": 2, "groups": 1})
    import dataclasses

    from codegen.cuda.skeleton import emit_ir
    from codegen.lower import lower
    ir = lower(default_plan(OP, P, {"BP": 16, "PT": 32, "depth": 2, "groups": 1}), "h200")
    with pytest.raises(CodegenError, match="d_state=96"):
        emit_ir(dataclasses.replace(ir, params=ir.params | {"d_state": 96}))
    with pytest.raises(CodegenError, match="1 to 8 vectors a thread"):
        emit_ir(dataclasses.replace(ir, tiling=ir.tiling | {"BP": 64}))


def test_the_cost_model_prices_the_bytes() -> None:
    """Memory-bound: at a large batch the predicted time follows the state's bytes (twice the batch, about twice the
    time), is no faster than the HBM moving them and within 15% of that roofline."""
    from ptsolve.hw import load
    hw = load("h200")
    t = {"BP": 32, "PT": 32, "depth": 2, "groups": 2, "ctas": 2}
    us = {}
    for b in (32, 64):
        r = ptsolve.optimize(make(OP, **(P | {"batch": b, "heads": 64})), solver="greedy", hw="h200", fix=t,
                             executor="serial", cache=False)
        us[b] = r.predicted_us
        roof = b * 64 * 64 * 128 * 4 * 2 / hw.hbm_bytes_per_s * 1e6  # float32 state in and out
        assert roof <= r.predicted_us <= 1.15 * roof, (b, r.predicted_us, roof)
    assert 1.8 <= us[64] / us[32] <= 2.1, us


@pytest.mark.parametrize("solver", ["greedy", "cpsat"])
def test_the_solvers_schedule_it(solver: str) -> None:
    r = ptsolve.optimize(make(OP, **P), solver=solver, hw="h200", time_limit=20, executor="serial", cache=False)
    assert r.status in ("OPTIMAL", "FEASIBLE") and r.program is not None and r.objective >= r.bound > 0
    tl = ptsolve.simulate(r.program)
    assert tl.kernel_cycles == r.objective and tl.late == 0  # the replay reproduces the claim
    assert emit(r.program, "h200").name.startswith("pts_mamba2_ssm_step_bf16_")


def test_a_batch_of_one_gets_row_block_tiles() -> None:
    """At batch 1 the solve cuts each (batch, head) state into row blocks, so the CTAs outnumber the heads."""
    r = ptsolve.optimize(make(OP, **(P | {"batch": 1, "heads": 24})), solver="cpsat", hw="h200", time_limit=20,
                         executor="serial", cache=False)
    t = r.program.graph.tiling
    assert 64 // t["PT"] >= 2, t


def test_the_command_knows_it(tmp_path, capsys) -> None:
    from ptsolve.cli import main
    assert main(["optimize", "ssm_step", "batch=1", "heads=8", "head_dim=64", "d_state=64", "--solver", "greedy",
                 "--out", str(tmp_path)]) == 0
    assert "step@0" in capsys.readouterr().out
    assert main(["ops", "ssm_step"]) == 0
    assert capsys.readouterr().out.startswith(f"{OP} (also: ssm_step): batch heads head_dim d_state")


def test_the_kernel_source_reads_and_writes_what_the_layouts_say() -> None:
    """The loop's copies follow the layouts (a trip's state rows contiguous, x's and z's rows at their batch strides,
    the group's B and C rows, D's rows only for a (heads, head_dim) D, the fill's bytes with them), the state is
    updated in float32 registers and written back in its dtype, and a generic build is one binary per class."""
    ks = emit(default_plan(OP, P, {"BP": 16, "PT": 32, "depth": 2, "groups": 2}), "h200")
    src = ks.source
    assert ks.args == ("ptr:state", "ptr:x", "ptr:dt", "ptr:A", "ptr:B", "ptr:C", "ptr:D", "ptr:z", "ptr:dt_bias",
                       "ptr:y", "i32:SX", "i32:SZ", "i32:SDT", "i32:SB", "i32:SC", "i32:FLAGS", "f32:DT_LO",
                       "f32:DT_HI")
    assert ks.grid == (4 * 48 * 2, 1, 1) and ks.tensor_maps == ()
    assert "bulk_load(s_cur, static_cast<const uint8_t*>(state) + (row0 + it_ * BP) * N * ES, BP * N * ES" in src
    assert "bulk_load(in_cur, x + (size_t)bz * SX + r_, BP * 2, fbar_);" in src
    assert "if (z != nullptr) bulk_load(in_cur + 2 * BP, z + (size_t)bz * SZ + r_" in src
    assert "Bm + (size_t)bz * SB + grp * N" in src and "Cm + (size_t)bz * SC + grp * N" in src
    assert "if (FLAGS & 2) bulk_load(in_cur + 4 * BP + 4 * N" in src
    assert "(2 * BP + 4 * N + (z != nullptr ? 2 * BP : 0) + ((FLAGS & 2) ? 4 * BP : 0))" in src
    assert "float st[4 * NV];" in src and "__shfl_xor_sync" in src and "pack_bf162" in src
    assert "d > 20.f ? d : log1pf(expf(d))" in src  # softplus's linear tail, as F.softplus(threshold=20)
    assert src.index("// step@0") < src.index("// put@0")
    gen = emit(default_plan(OP, P, {"BP": 16, "PT": 32, "depth": 2, "groups": 2}), "h200", generic=True)
    assert gen.args[-5:] == ("i32:B_", "i32:H", "i32:HG", "i32:SH", "i32:NTILES") and gen.generic
    other = emit(default_plan(OP, P | {"batch": 5, "heads": 7, "groups": 7},
                              {"BP": 16, "PT": 32, "depth": 2, "groups": 2}), "h200", generic=True)
    assert other.source == gen.source  # the sizes are launch arguments: one binary per class
    # a half state is the SH flag of the same binary: its copy fills half of the float32 slot
    assert "const int SH" in gen.source and "mbar_expect_tx(&in_full[s_], (BP * N * ES));" in gen.source


def test_sizes_are_the_grid() -> None:
    from codegen.cuda.ssm_step import sizes
    assert sizes(P, {"PT": 32}) == {"B_": 4, "H": 48, "HG": 48, "SH": 0, "NTILES": 4 * 48 * 2}
    assert sizes(P | {"groups": 8, "state_dtype": "bf16", "batch": 1}, {"PT": 8}) == {
        "B_": 1, "H": 48, "HG": 6, "SH": 1, "NTILES": 48 * 8}


@needs_nvcc
@pytest.mark.parametrize("tiling", TILINGS, ids=_key)
@pytest.mark.parametrize("generic", [False, True])
def test_compiles_without_spills(tiling: dict[str, int], generic: bool, tmp_path, monkeypatch) -> None:
    from codegen.runtime import compile_kernel
    monkeypatch.setenv("PTSOLVE_CACHE_DIR", str(tmp_path))
    for p in (P, P | {"d_state": 64, "dtype": "fp16", "state_dtype": "fp16"}):
        if p["d_state"] == 64 and tiling["BP"] // tiling["groups"] < 8:
            continue  # a warpgroup covers 8 rows of 64 at least
        c = compile_kernel(emit(default_plan(OP, p, tiling), "h200", generic=generic))
        assert_clean(c)


@needs_nvcc
def test_the_compiler_in_the_loop_accepts_the_solvers_schedules() -> None:
    for solver in ("greedy", "cpsat"):
        r = ptsolve.optimize(make(OP, **(P | {"dtype": "fp16", "d_state": 64, "batch": 1})), solver=solver,
                             hw="h200", time_limit=20, executor="serial", cache=False, compile_check=True)
        assert r.kernel_check["status"] == "ok" and not r.kernel_check["serialized"], r.kernel_check
        assert r.kernel_check["spill_bytes"] == 0


@needs_nvcc
def test_the_serving_classes_compile(tmp_path, monkeypatch) -> None:
    """Every decode-step class of the shipped table: its schedule, its generic kernel, no spill."""
    from ptsolve import serve
    monkeypatch.setenv("PTSOLVE_CACHE_DIR", str(tmp_path))
    cs = [c for c in serve.classes() if c.op == OP]
    assert [c.key for c in cs] == [f"{OP}/{d}/p64/n{n}" for d in ("fp16", "bf16") for n in (64, 128)]
    for c in cs:
        rep = serve.compile_class(c)
        assert rep["spill_stores"] == rep["spill_loads"] == 0 and rep["registers"] > 0, (c.key, rep)
        assert serve.kernel(c).ks.generic and serve.kernel(c).ir.tiling["PT"] < 64  # row blocks: batch 1 fills


@pytest.mark.parametrize("D", ["h", "hp", ""])
@pytest.mark.parametrize("state_dtype,params_dtype", [("fp32", "fp32"), ("bf16", "bf16"), ("fp32", "bf16")])
def test_the_harness_reference_is_recurrent_step(D: str, state_dtype: str, params_dtype: str) -> None:
    """The GPU tests' float64 step (codegen.harness.ssm_step.reference) and ``recurrent_step``'s PyTorch path agree
    (groups > 1, z, dt_bias, softplus, a clamp that bites), the state written in place."""
    import torch

    import ptsolve.mamba2_model as pm
    from codegen.harness.ssm_step import inputs, reference
    p = P | {"batch": 3, "heads": 8, "groups": 2, "d_state": 64, "state_dtype": state_dtype}
    a = inputs(p, 1, D=D, params_dtype=params_dtype, device="cpu") | {"dt_limit": (0.1, 1.5)}
    new, y = reference(**a)
    st = a["state"].clone()
    y2 = pm.recurrent_step(**(a | {"state": st}))
    tol = 1e-5 if state_dtype == "fp32" else 1e-2
    assert (st.double() - new).abs().max() <= tol * new.abs().max()
    assert (y2.double() - y).abs().max() <= 8e-3 * y.abs().max()  # y rounded to bf16
    assert torch.equal(a["state"], inputs(p, 1, D=D, params_dtype=params_dtype, device="cpu")["state"])


def test_the_harness_reference_clamps_and_gates() -> None:
    """The reference's dt: softplus with the linear tail above 20, the clamp; y gated by silu(z)."""
    import torch

    from codegen.harness.ssm_step import reference
    st = torch.zeros(1, 2, 8, 16)
    x, z = torch.ones(1, 2, 8), torch.full((1, 2, 8), 2.0)
    B = C = torch.ones(1, 1, 16)
    dt, A = torch.tensor([[30.0, -1.0]]), torch.zeros(2)
    new, y = reference(st, x, dt, A, B, C, z=z, dt_softplus=True, dt_limit=(0.0, 25.0))
    assert new[0, 0, 0, 0] == 25.0 and math.isclose(new[0, 1, 0, 0].item(), math.log1p(math.exp(-1.0)))
    assert math.isclose(y[0, 0, 0].item(), 16 * 25.0 * 2.0 / (1 + math.exp(-2.0)), rel_tol=1e-12)


@needs_nvcc
def test_the_gpu_tests_kernels_compile(tmp_path, monkeypatch) -> None:
    """Every exact-shape plan tests/gpu/test_ssm_step_gpu.py launches (``plans()``) compiles with no spill: the list
    bench/models/pack.sh compiles."""
    import test_ssm_step_gpu as gpu

    from codegen.runtime import compile_kernel
    monkeypatch.setenv("PTSOLVE_CACHE_DIR", str(tmp_path))
    for plan in gpu.plans():
        rep = compile_kernel(emit(plan)).report
        assert rep["spill_stores"] == rep["spill_loads"] == rep["stack_bytes"] == 0, (plan.tiling, rep)
