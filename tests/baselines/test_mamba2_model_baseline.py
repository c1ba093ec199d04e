"""baselines.mamba2_model on the CPU: the adapter from ``recurrent_step``'s arguments to mamba_ssm's
``selective_state_update`` (per-(head, p) dt, A, D, dt_bias; dt_limit applied before the kernel) gives ptsolve's
step, with a PyTorch stand-in for the Triton kernel that asserts its argument shapes as mamba_ssm's wrapper does
(written from its docstring). The kernels themselves: tests/gpu/test_mamba2_model_gpu.py."""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import ssd_torch as kt  # noqa: E402  (tests/ptsolve, on the path: tests/conftest.py)

from baselines import mamba2_model as bm  # noqa: E402
from ptsolve import mamba2_model as pm  # noqa: E402


def update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False):
    """selective_state_update's contract: state (b, h, p, n) in place; x, dt (b, h, p); A (h, p, n); B, C (b, g, n);
    D, dt_bias (h, p); out (b, h, p) in x's dtype."""
    b, h, p, n = state.shape
    g = B.shape[1]
    assert x.shape == dt.shape == (b, h, p) and A.shape == (h, p, n) and B.shape == C.shape == (b, g, n)
    assert dt_bias is not None and dt_bias.shape == (h, p) and (D is None or D.shape == (h, p))
    d = dt.float() + dt_bias.float()
    d = torch.nn.functional.softplus(d) if dt_softplus else d
    Bh, Ch = (t.float().repeat_interleave(h // g, dim=1) for t in (B, C))
    state.copy_(state * torch.exp(d[..., None] * A) + (d * x.float())[..., None] * Bh[:, :, None, :])
    out = torch.einsum("bhpn,bhn->bhp", state, Ch)
    out = out + x.float() * D.float() if D is not None else out
    return (out * torch.nn.functional.silu(z.float()) if z is not None else out).to(x.dtype)


@pytest.mark.parametrize("D, z, limit", [("h", False, (0.0, math.inf)), ("hp", True, (0.0, math.inf)),
                                         ("h", False, (0.02, 0.05)), ("", True, (0.0, 0.03))])
def test_adapter_is_ptsolves_step(D, z, limit):
    a = kt.inputs(2, 3, 4, 2, 3, 2, torch.float32, D=D, z=z, init=True, seed=11)
    s1, s2 = a["initial_states"].clone(), a["initial_states"].clone()
    step = bm._step_with(update)
    for t in range(3):
        args = (a["x"][:, t], a["dt"][:, t], a["A"], a["B"][:, t], a["C"][:, t])
        kw = {"D": a.get("D"), "z": a["z"][:, t] if z else None, "dt_bias": a["dt_bias"], "dt_softplus": True,
              "dt_limit": limit}
        y1, y2 = step(s1, *args, **kw), pm.recurrent_step(s2, *args, **kw)
        assert (y1 - y2).abs().max().item() < 1e-5
    assert (s1 - s2).abs().max().item() < 1e-5
