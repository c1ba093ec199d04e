"""Mamba2's decode-step kernel on an H100/H200 (``pytest -m gpu tests/gpu/test_ssm_step_gpu.py``): the exact-shape
kernels of several tilings and the serving layer's class kernels (``recurrent_step`` on CUDA tensors) against
``step_torch`` (the PyTorch path in float32), the harness's float64 reference and, where it imports, mamba_ssm's
``selective_state_update``: Mamba2-130m to 2.7b heads (24 to 80), batch 1 to 64, with and without z, D of shape
(heads,) and (heads, head_dim) or none, dt_softplus and a clamp, groups 1 and more, fp16 and bf16 activations,
float32 and bf16 states, parameters in float32 or the dtype, and the model's strided views; then what a decode step
must not do (allocate more than y, synchronise the host) and a CUDA graph of steps.

The bounds: the kernel runs the step in float32 (an exp, one multiply-add per state element, C·h summed over
d_state by a shuffle tree), so a float32 state is within 1e-5 of the largest magnitude of the float64 reference's
and a half state within half an ulp of the dtype plus that; y is the float32 value rounded to the dtype: half an ulp
plus 1e-4 of its largest magnitude (the sum's rounding over 128 products). y is NaN-filled first where the test
hands it in, so an element the kernel does not write fails.

The cubins (compiled on a CPU machine, carried in $PTSOLVE_CACHE_DIR): ``plans()`` lists the exact-shape ones, and
``python -m ptsolve.serve precompile --only mamba2_ssm_step`` the class kernels (bench/models/pack.sh does both).
"""
from __future__ import annotations

import math
import os

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.gpu  # the fixture torch: tests/conftest.py
_CACHE = os.environ.get("PTSOLVE_CACHE_DIR")  # before conftest gives every test its own
OP = "mamba2_ssm_step"
REL = 1e-5  # of the largest magnitude: float32 rounding of one step
YREL = 1e-4  # y: a float32 sum of d_state products


@pytest.fixture(autouse=True)
def _carried_cubins(monkeypatch: pytest.MonkeyPatch) -> None:
    """Use the cubins compiled on the CPU machine and carried along."""
    if _CACHE:
        monkeypatch.setenv("PTSOLVE_CACHE_DIR", _CACHE)


EXACT = [  # (batch, heads, d_state, groups, dtype, state_dtype, tiling)
    (4, 48, 128, 1, "bf16", "fp32", {"BP": 16, "PT": 32, "depth": 2, "groups": 2, "ctas": 4}),  # the table's n128
    (2, 8, 64, 2, "fp16", "fp32", {"BP": 32, "PT": 32, "depth": 2, "groups": 2, "ctas": 4}),    # the table's n64
    (1, 24, 128, 1, "bf16", "bf16", {"BP": 8, "PT": 8, "depth": 2, "groups": 2, "ctas": 4}),    # 130m, half state
    (3, 16, 128, 4, "fp16", "fp16", {"BP": 16, "PT": 64, "depth": 4, "groups": 1, "ctas": 2}),  # four trips
    (2, 80, 64, 8, "bf16", "fp32", {"BP": 64, "PT": 64, "depth": 2, "groups": 2}),              # 2.7b heads
    (5, 32, 128, 1, "fp16", "fp32", {"BP": 8, "PT": 64, "depth": 3, "groups": 2, "ctas": 2}),   # eight trips
]


def _params(case: tuple) -> dict:
    b, h, n, g, dt, sd, _ = case
    return {"batch": b, "heads": h, "head_dim": 64, "d_state": n, "groups": g, "dtype": dt, "state_dtype": sd}


def plans() -> list:
    """The exact-shape plans these tests launch (precompile them with ``codegen.harness.precompile``)."""
    from codegen.plan import default_plan
    return [default_plan(OP, _params(c), c[6]) for c in EXACT]


def _close(torch, got, ref, rel: float, what: str) -> float:
    """``got`` against the float64 ``ref``: within half an ulp of got's dtype (0 for float32) plus ``rel`` of ref's
    largest magnitude; returns the largest error."""
    assert not torch.isnan(got).any(), f"{what}: NaN (an element not written)"
    scale = max(ref.abs().max().item(), 1e-30)
    err = (got.double() - ref).abs()
    half = 0.0
    if got.dtype != torch.float32:
        fi = torch.finfo(got.dtype)
        half = 0.5 * fi.eps * torch.exp2(torch.floor(torch.log2(ref.abs().clamp_min(fi.tiny))))
    over = err - (half + rel * scale)
    i = int(over.argmax())
    assert over.max().item() <= 0, (f"{what}: {got.flatten()[i].item():.6g} vs the reference's "
                                    f"{ref.flatten()[i].item():.6g} at flat index {i} (scale {scale:.3g})")
    return err.max().item()


@pytest.mark.parametrize("case", EXACT, ids=lambda c: "-".join(map(str, c[:6])))
@pytest.mark.parametrize("z,D", [(True, "h"), (False, ""), (True, "hp"), (False, "hp")])
def test_exact_kernel_matches_the_reference(torch, case, z, D):
    from codegen.harness.ssm_step import inputs, reference, run_ssm_step
    from codegen.plan import default_plan

    p = _params(case)
    plan = default_plan(OP, p, case[6])
    for params_dtype in ("fp32", p["dtype"]):
        inp = inputs(p, seed=p["heads"] * 7 + p["batch"], z=z, D=D, params_dtype=params_dtype)
        ref_state, ref_y = reference(**inp)
        y = torch.full((p["batch"], p["heads"], 64), float("nan"), device="cuda", dtype=inp["x"].dtype)
        run_ssm_step(**inp, plan=plan, y=y)
        torch.cuda.synchronize()
        _close(torch, inp["state"], ref_state, REL, "state")
        _close(torch, y, ref_y, YREL, "y")


CLASS_CASES = [  # (batch, heads, d_state, groups, dtype, state dtype, z, D, softplus, dt_limit)
    (1, 24, 128, 1, "bf16", "fp32", False, "h", True, (0.0, math.inf)),    # Mamba2-130m decode, batch 1
    (8, 48, 128, 1, "bf16", "fp32", False, "h", True, (0.0, math.inf)),    # 780m, batch 8
    (64, 64, 128, 1, "bf16", "fp32", True, "h", True, (0.0, math.inf)),    # 1.3b, batch 64
    (2, 80, 128, 1, "fp16", "fp32", True, "hp", True, (0.0, math.inf)),    # 2.7b
    (4, 32, 64, 4, "fp16", "fp16", True, "", False, (0.0, math.inf)),      # no softplus: the clamp at 0 bites
    (3, 64, 128, 8, "bf16", "bf16", False, "hp", True, (0.05, 0.5)),      # a clamp that bites, bf16 state
    (16, 48, 64, 2, "bf16", "fp32", True, "h", True, (0.0, math.inf)),
    (33, 24, 128, 3, "fp16", "fp32", False, "h", True, (0.0, 2.0)),
]


def _class_inputs(torch, case, params_dtype: str) -> dict:
    from codegen.harness.ssm_step import inputs
    b, h, n, g, dt, sd, z, D, sp, lim = case
    p = {"batch": b, "heads": h, "head_dim": 64, "d_state": n, "groups": g, "dtype": dt, "state_dtype": sd}
    return inputs(p, seed=b * 131 + h, z=z, D=D, params_dtype=params_dtype) | {"dt_softplus": sp, "dt_limit": lim}


@pytest.mark.parametrize("case", CLASS_CASES, ids=lambda c: "-".join(map(str, c[:8])))
@pytest.mark.parametrize("params_dtype", ["fp32", "act"])
def test_class_kernel_matches_step_torch(torch, case, params_dtype):
    """``recurrent_step`` on CUDA tensors runs the class kernel (counted) and matches ``step_torch`` and the float64
    reference; the state is updated in place."""
    import ptsolve.mamba2_model as pm
    from codegen.harness.ssm_step import reference

    a = _class_inputs(torch, case, "fp32" if params_dtype == "fp32" else case[4])
    ref_state, ref_y = reference(**a)
    st_t = a["state"].clone()
    y_t = pm.step_torch(**(a | {"state": st_t}))
    st = a["state"]
    ran = pm.step_kernel(**a)
    assert ran is not None, "the kernel did not take these inputs"
    torch.cuda.synchronize()
    _close(torch, st, ref_state, REL, "state")
    _close(torch, ran, ref_y, YREL, "y")
    _close(torch, st_t, ref_state, REL, "step_torch's state")  # the PyTorch path within the same bounds
    assert (ran.double() - y_t.double()).abs().max().item() <= 2 * (_close(torch, y_t, ref_y, YREL, "step_torch's y")
                                                                    + 1e-3 * ref_y.abs().max().item())


def test_the_models_views_are_read_where_they_are(torch, monkeypatch):
    """The mixer's decode inputs — x, B, C views of one conv-output row, dt a strided view of in_proj's output, bf16
    D and dt_bias — reach the kernel without a copy (the pointers are the views') and give step_torch's result."""
    import ptsolve.mamba2_model as pm
    from ptsolve import serve

    b, h, g, n = 4, 48, 2, 128
    gen = torch.Generator(device="cuda").manual_seed(5)
    I, conv = h * 64, h * 64 + 2 * g * n
    xbc = torch.randn(b, 1, conv, device="cuda", generator=gen).bfloat16()
    proj = torch.randn(b, 1, 2 * I + 2 * g * n + h, device="cuda", generator=gen).bfloat16()
    x, B, C = torch.split(xbc, [I, g * n, g * n], dim=-1)
    x, B, C, dt = x.view(b, h, 64), B.reshape(b, g, n), C.reshape(b, g, n), proj[..., -h:].reshape(b, h)
    A = -torch.exp(torch.randn(h, device="cuda", generator=gen) / 2)
    D, dtb = torch.randn(h, device="cuda", generator=gen).bfloat16(), torch.randn(h, device="cuda").bfloat16() / 4
    state = torch.randn(b, h, 64, n, device="cuda", generator=gen)
    seen = {}
    real = serve.ssm_step

    def spy(*args):
        seen["ptrs"] = [None if t is None else t.data_ptr() for t in args[:9]]
        return real(*args)
    monkeypatch.setattr(serve, "ssm_step", spy)
    st_t = state.clone()
    y_t = pm.step_torch(st_t, x, dt, A, B, C, D=D, dt_bias=dtb, dt_softplus=True)
    y = pm.recurrent_step(state, x, dt, A, B, C, D=D, dt_bias=dtb, dt_softplus=True)
    torch.cuda.synchronize()
    assert seen["ptrs"] == [state.data_ptr(), x.data_ptr(), dt.data_ptr(), A.data_ptr(), B.data_ptr(), C.data_ptr(),
                            D.data_ptr(), None, dtb.data_ptr()]
    assert (state - st_t).abs().max().item() <= REL * st_t.abs().max().item()
    assert (y.float() - y_t.float()).abs().max().item() <= 1e-2 * y_t.float().abs().max().item()


def test_matches_mamba_ssm_selective_state_update(torch):
    """Where mamba_ssm's Triton ``selective_state_update`` imports: on the same inputs its error against the float64
    reference and the kernel's are alike (the kernel's at most twice its, plus the dtype's half ulp)."""
    try:
        from baselines.mamba2_model import _step_with, load_state_update
        theirs = _step_with(load_state_update())
    except Exception as e:  # noqa: BLE001 - any import failure of the peer skips
        pytest.skip(f"mamba_ssm's selective_state_update does not import: {e}")
    import ptsolve.mamba2_model as pm
    from codegen.harness.ssm_step import reference

    for case in CLASS_CASES[:4] + CLASS_CASES[5:6]:
        a = _class_inputs(torch, case, case[4])
        ref_state, ref_y = reference(**a)
        st_m = a["state"].clone()
        y_m = theirs(**(a | {"state": st_m}))
        y = pm.recurrent_step(**a)
        torch.cuda.synchronize()
        for ours, their, ref, what in ((a["state"], st_m, ref_state, "state"), (y, y_m, ref_y, "y")):
            e_o = (ours.double() - ref).abs().max().item()
            e_m = (their.double() - ref).abs().max().item()
            half = 0.5 * torch.finfo(ours.dtype).eps * ref.abs().max().item() if ours.dtype != torch.float32 else 0
            assert e_o <= 2 * e_m + half + REL * ref.abs().max().item(), (case, what, e_o, e_m)


def test_a_step_allocates_only_y_and_never_syncs(torch):
    """A warm decode step: one allocation (y), no host synchronisation (torch's sync debug mode raises on one)."""
    import ptsolve.mamba2_model as pm

    a = _class_inputs(torch, CLASS_CASES[1], "bf16")
    pm.recurrent_step(**a)  # cold: the kernel loaded, the launch prepared
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    torch.cuda.set_sync_debug_mode("error")
    try:
        y = pm.recurrent_step(**a)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.cuda.memory_stats()["allocation.all.allocated"] - before == 1 and y.is_cuda


def test_a_cuda_graph_replays_the_steps(torch):
    """Eight steps captured in a CUDA graph (the state's address fixed, the inputs static) and replayed give the eight
    steps run eagerly."""
    import ptsolve.mamba2_model as pm

    a = _class_inputs(torch, CLASS_CASES[6], "fp32")
    eager = a["state"].clone()
    for _ in range(8):
        pm.recurrent_step(**(a | {"state": eager}))
    st = a["state"].clone()
    pm.recurrent_step(**(a | {"state": st.clone()}))  # warm: prepared outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(8):
            pm.recurrent_step(**(a | {"state": st}))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(st, eager)
