"""Row-wise log-sum-exp (ptsolve.ops.logsumexp, codegen.cuda.logsumexp), the worked example of adding an operator:
on the CPU the operator validates, greedy and CP-SAT schedule it, the command knows it, its kernels (hand plans and
the solvers' schedules) compile for sm_90a with no spill and no serialised wgmma; on an H100/H200 (``-m gpu``) the
kernel matches torch.logsumexp in float64."""
from __future__ import annotations

import os
import shutil

import pytest

import ptsolve
from codegen.cuda import emit
from codegen.plan import default_plan
from ptsolve.errors import ShapeError
from ptsolve.opspec import aliases, make

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None and not os.path.exists("/usr/local/cuda/bin/nvcc"),
                                reason="nvcc not installed")

P = {"rows": 1000, "cols": 1000, "dtype": "fp16"}
TILINGS = [  # one and two warpgroups, 64 and 128 rows each, the three column blocks, two CTAs per SM
    {"BM": 64, "BK": 64, "depth": 2, "groups": 1},
    {"BM": 128, "BK": 128, "depth": 3, "groups": 2},
    {"BM": 128, "BK": 256, "depth": 2, "groups": 1},
    {"BM": 256, "BK": 64, "depth": 4, "groups": 2},
    {"BM": 128, "BK": 128, "depth": 2, "groups": 2, "ctas": 2},
]


def _key(t: dict[str, int]) -> str:
    return "_".join(f"{k}{v}" for k, v in sorted(t.items()))


def test_the_operator_validates_and_builds() -> None:
    assert aliases()["lse"] == "logsumexp"
    op = make(aliases()["lse"], rows=1000, cols=1000)
    assert op == ptsolve.ops.logsumexp.logsumexp(1000, 1000)  # the builder function its spec names
    assert op.params == P and op.tilings()
    g = op.graph({"BM": 128, "BK": 128, "depth": 3, "groups": 2})
    assert {t.name for t in g.tasks} == {"load_x", "init@0", "init@1", "reduce@0", "reduce@1", "store@0", "store@1"}
    assert g.row == (8,) and g.rows == 8 and not any(t.kind == "mma" for t in g.tasks)
    assert op.propagate((64,), BK=64, depth=2)["reduce@0"] == (64, 64)
    for bad, why in (({"rows": 10, "cols": 12}, "multiple of 8"), ({"rows": 0, "cols": 8}, "positive"),
                     ({"rows": 8, "cols": 8, "dtype": "fp8"}, "not supported"), ({"rows": 8}, "missing cols")):
        with pytest.raises(ShapeError, match=why):
            make("logsumexp", **bad)


@pytest.mark.parametrize("solver", ["greedy", "cpsat"])
def test_the_solvers_schedule_it(solver: str) -> None:
    r = ptsolve.optimize(make("logsumexp", rows=4096, cols=4096, dtype="bf16"), solver=solver, hw="h200",
                         time_limit=20, executor="serial", cache=False)
    assert r.status in ("OPTIMAL", "FEASIBLE") and r.program is not None and r.objective >= r.bound > 0
    tl = ptsolve.simulate(r.program)
    assert tl.kernel_cycles == r.objective and tl.late == 0  # the replay reproduces the claim
    assert emit(r.program, "h200").name.startswith("pts_logsumexp_bf16_")


def test_the_command_knows_it(tmp_path, capsys) -> None:
    from ptsolve.cli import main
    assert main(["optimize", "lse", "rows=512", "cols=768", "--solver", "greedy", "--out", str(tmp_path)]) == 0
    assert "reduce@0" in capsys.readouterr().out
    assert main(["ops", "lse"]) == 0
    assert capsys.readouterr().out.startswith("logsumexp (also: lse): rows cols dtype=fp16")


def assert_clean(c) -> None:
    """A compiled kernel (``runtime.Compiled``) is a cubin with no spill, no stack, no serialised wgmma, its
    setmaxnreg honoured and its shared memory within one SM's."""
    rep = c.report
    assert c.cubin[:4] == b"\x7fELF"
    assert rep["spill_stores"] == rep["spill_loads"] == rep["stack_bytes"] == 0, rep
    assert not rep["wgmma_serialized"], rep["warnings"]
    assert not any("C7508" in w for w in rep["warnings"]), "setmaxnreg was ignored"
    assert c.kernel.smem_bytes <= 227 * 1024


@needs_nvcc
@pytest.mark.parametrize("tiling", TILINGS, ids=_key)
def test_compiles_without_spills(tiling: dict[str, int], tmp_path, monkeypatch) -> None:
    from codegen.runtime import compile_kernel
    monkeypatch.setenv("PTSOLVE_CACHE_DIR", str(tmp_path))
    c = compile_kernel(emit(default_plan("logsumexp", P, tiling)))
    assert_clean(c)


@needs_nvcc
def test_the_compiler_in_the_loop_accepts_the_solvers_schedules() -> None:
    for solver in ("greedy", "cpsat"):
        r = ptsolve.optimize(make("logsumexp", rows=1000, cols=1000), solver=solver, hw="h200", time_limit=20,
                             executor="serial", cache=False, compile_check=True)
        assert r.kernel_check["status"] == "ok" and not r.kernel_check["serialized"], r.kernel_check
        assert r.kernel_check["spill_bytes"] == 0


SHAPES = [  # (rows, cols, dtype, tiling): ragged rows and columns (TMA zero fill, masked columns), one column block,
    # more rows than one warpgroup covers per pass, large magnitudes (the running max keeps exp finite)
    (1000, 1000, "fp16", {"BM": 128, "BK": 128, "depth": 3, "groups": 2}),
    (4096, 4096, "bf16", {"BM": 64, "BK": 64, "depth": 4, "groups": 1}),
    (77, 8, "fp16", {"BM": 64, "BK": 64, "depth": 2, "groups": 1}),
    (300, 32000, "bf16", {"BM": 128, "BK": 256, "depth": 2, "groups": 1}),
    (513, 2056, "fp16", {"BM": 256, "BK": 64, "depth": 4, "groups": 2}),
    (2048, 1024, "bf16", {"BM": 128, "BK": 128, "depth": 2, "groups": 2, "ctas": 2}),
]


@pytest.mark.gpu
@pytest.mark.parametrize("rows,cols,dtype,tiling", SHAPES, ids=lambda v: _key(v) if isinstance(v, dict) else str(v))
def test_matches_torch_on_the_gpu(rows: int, cols: int, dtype: str, tiling: dict[str, int]) -> None:
    from hopper import require_hopper
    torch = require_hopper()
    from codegen.runtime import load
    k = load(emit(default_plan("logsumexp", {"rows": rows, "cols": cols, "dtype": dtype}, tiling)))
    tdt = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    gen = torch.Generator(device="cuda").manual_seed(rows * 7 + cols)
    for scale, shift in ((1.0, 0.0), (8.0, 40.0)):
        x = (torch.randn(rows, cols, device="cuda", generator=gen) * scale + shift).to(tdt)
        x[0, : min(cols, 5)] = float("-inf")  # -inf entries add nothing; the row stays finite
        if rows > 1:
            x[rows - 1] = float("-inf")  # a row of nothing but -inf: lse = -inf, as torch's, never NaN
        out = torch.full((rows,), float("nan"), device="cuda", dtype=torch.float32)  # NaN never passes
        k.launch({"x": x.data_ptr(), "out": out.data_ptr()})
        torch.cuda.synchronize()
        ref = torch.logsumexp(x.double(), dim=1)
        # fp32 sums of ex2.approx terms: a few ulp of the result's magnitude
        torch.testing.assert_close(out.double(), ref, rtol=2e-5, atol=1e-4)
