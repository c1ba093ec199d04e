"""Mamba2's decode step's harness: random inputs in ``recurrent_step``'s layouts, a float64 reference written from
the formula, the exact-shape launch of a plan's kernel (``run_ssm_step``), its check and the hand plan.

``params`` are the operator's (batch, heads, head_dim, d_state, groups, dtype, state_dtype). Shapes: state
(b, h, p, n) float32 or in the dtype, updated in place; x, z (b, h, p) and B, C (b, g, n) in the dtype; dt (b, h),
A, dt_bias (h,) float32 or in the dtype; D (h,) (float32 or the dtype) or (h, p) float32 → y (b, h, p) in the dtype.
"""
from __future__ import annotations

import dataclasses
import math
import struct
from typing import Any

from ..plan import default_plan
from ..runtime import emit_cached, load
from .common import TOL, OpHarness, need, register, rel_err, stream, torch_dtype

OP = "mamba2_ssm_step"
# the shipped table's d_state-128 schedule (ptsolve.serve's class kernel)
HAND = {"BP": 16, "PT": 32, "depth": 2, "groups": 2, "ctas": 4}


def _dims(p: dict[str, Any]) -> tuple[int, int, int, int, int]:
    return p["batch"], p["heads"], p["head_dim"], p["d_state"], p.get("groups", 1)


def inputs(p: dict[str, Any], seed: int = 0, z: bool = True, D: str = "h", dt_bias: bool = True,
           params_dtype: str = "fp32", device: str = "cuda") -> dict[str, Any]:
    """Fresh inputs (keys are ``recurrent_step``'s, with ``dt_softplus`` True and ``dt_limit`` (0, inf)): state
    ~ randn, x, z, B, C ~ randn, dt ~ randn − 1 (through softplus: about 0.05 to 2, so exp(dt·A) spans the decay's
    range), A = −exp(randn / 2), dt_bias ~ randn / 4, D ~ randn; ``D``: "h" (heads,), "hp" (heads, head_dim) float32
    or "" none; ``params_dtype``: dt, A, dt_bias and an (h,) D in float32 ("fp32") or in the dtype."""
    import torch
    b, h, P, N, g = _dims(p)
    gen = torch.Generator(device=device).manual_seed(seed)
    act = torch_dtype(p["dtype"])
    sd = torch.float32 if p.get("state_dtype", "fp32") == "fp32" else act
    pd = torch.float32 if params_dtype == "fp32" else act

    def rnd(*shape: int, dtype: Any = act, scale: float = 1.0, shift: float = 0.0) -> Any:
        return (torch.randn(*shape, device=device, generator=gen) * scale + shift).to(dtype)
    out = {"state": rnd(b, h, P, N, dtype=sd), "x": rnd(b, h, P), "dt": rnd(b, h, dtype=pd, shift=-1.0),
           "A": -torch.exp(rnd(h, dtype=torch.float32, scale=0.5)).to(pd), "B": rnd(b, g, N), "C": rnd(b, g, N),
           "D": None, "z": rnd(b, h, P) if z else None,
           "dt_bias": rnd(h, dtype=pd, scale=0.25) if dt_bias else None, "dt_softplus": True,
           "dt_limit": (0.0, math.inf)}
    if D == "h":
        out["D"] = rnd(h, dtype=pd)
    elif D == "hp":
        out["D"] = rnd(h, P, dtype=torch.float32)
    return out


def reference(state: Any, x: Any, dt: Any, A: Any, B: Any, C: Any, D: Any = None, z: Any = None,
              dt_bias: Any = None, dt_softplus: bool = False, dt_limit: tuple[float, float] = (0.0, math.inf)
              ) -> tuple[Any, Any]:
    """The step in float64, nothing modified: (the new state (b, h, p, n), y (b, h, p)), both float64."""
    import torch
    b, h, P, N = state.shape
    rep = h // B.shape[1]
    d = dt.double() + (dt_bias.double() if dt_bias is not None else 0.0)
    if dt_softplus:
        d = torch.where(d > 20.0, d, torch.log1p(torch.exp(d)))
    d = d.clamp(min=float(dt_limit[0]), max=float(dt_limit[1]))
    Bh = B.double().repeat_interleave(rep, dim=1)  # (b, h, n): head j reads group j // rep
    Ch = C.double().repeat_interleave(rep, dim=1)
    new = torch.exp(d * A.double())[..., None, None] * state.double() \
        + (d[..., None] * x.double())[..., None] * Bh[:, :, None, :]
    y = (new * Ch[:, :, None, :]).sum(-1)
    if D is not None:
        y = y + x.double() * (D.double()[:, None] if D.dim() == 1 else D.double())
    if z is not None:
        y = y * torch.nn.functional.silu(z.double())
    return new, y


def _flags(x: Any, dt: Any, A: Any, D: Any, dt_bias: Any, dt_softplus: bool) -> int:
    """The kernel's FLAGS for these tensors (codegen.cuda.ssm_step's bits)."""
    import torch

    from ..cuda import ssm_step as k
    f32 = [t is not None and t.dtype == torch.float32 for t in (dt, A, dt_bias, D)]
    rows = D is not None and D.dim() == 2
    return ((k.FLAG_SOFTPLUS if dt_softplus else 0) | (k.FLAG_D_ROWS if rows else 0) | (k.FLAG_DT32 * f32[0])
            | (k.FLAG_A32 * f32[1]) | (k.FLAG_BIAS32 * f32[2]) | (k.FLAG_D32 * (f32[3] and not rows)))


def run_ssm_step(state: Any, x: Any, dt: Any, A: Any, B: Any, C: Any, D: Any = None, z: Any = None,
                 dt_bias: Any = None, dt_softplus: bool = False, dt_limit: tuple[float, float] = (0.0, math.inf),
                 plan: Any = None, y: Any = None) -> Any:
    """The step with the kernel emitted for ``plan`` (its exact shape; the inputs contiguous): ``state`` updated in
    place; returns y in the plan's dtype (``y`` written in place where given)."""
    import torch
    ks = emit_cached(plan)
    p = ks.params
    b, h, P, N, g = _dims(p)
    need(state, "state", (b, h, P, N), p.get("state_dtype", "fp32"))
    for name, t, shape in (("x", x, (b, h, P)), ("z", z, (b, h, P)), ("B", B, (b, g, N)), ("C", C, (b, g, N))):
        if t is not None:
            need(t, name, shape, p["dtype"])
    if D is not None and D.dim() == 2:
        need(D, "D", (h, P), "fp32")
    for name, t, shape in (("dt", dt, (b, h)), ("A", A, (h,)), ("dt_bias", dt_bias, (h,)), ("D", D, (h,))):
        if t is not None and t.dim() == len(shape):
            need(t, name, shape, "fp32" if t.dtype == torch.float32 else p["dtype"])
    y = y if y is not None else torch.empty(b, h, P, dtype=torch_dtype(p["dtype"]), device=x.device)
    need(y, "y", (b, h, P), p["dtype"])
    ptrs = {k: 0 if t is None else t.data_ptr() for k, t in (("state", state), ("x", x), ("dt", dt), ("A", A),
                                                             ("B", B), ("C", C), ("D", D), ("z", z),
                                                             ("dt_bias", dt_bias), ("y", y))}
    scalars = {"SX": h * P, "SZ": h * P, "SDT": h, "SB": g * N, "SC": g * N,
               "FLAGS": _flags(x, dt, A, D, dt_bias, dt_softplus), "DT_LO": float(dt_limit[0]),
               "DT_HI": float(dt_limit[1])}
    load(ks).prepare(ptrs | scalars, (), ks.grid[0])(stream())
    return y


def check_ssm_step(plan: Any, seed: int = 0) -> float:
    """Worst relative Frobenius error of the new state and y of ``plan``'s kernel (z, an (h,) D, dt_bias,
    softplus) against the float64 reference, y NaN-filled first; NaN if any output is NaN/Inf."""
    import torch
    inp = inputs(plan.params, seed)
    ref_state, ref_y = reference(**inp)
    b, h, P, _, _ = _dims(plan.params)
    y = torch.full((b, h, P), float("nan"), device="cuda").to(torch_dtype(plan.params["dtype"]))
    run_ssm_step(**inp, plan=plan, y=y)
    torch.cuda.synchronize()
    errs = [rel_err(inp["state"], ref_state), rel_err(y, ref_y)]
    return math.nan if any(math.isnan(e) for e in errs) else max(errs)


class _Word(int):
    """A scalar kernel argument (or a null pointer) where the tuner and the profiler take ``data_ptr()`` of every
    argument and launch with ``Loaded.launch``, which stores each as 8 little-endian bytes: the kernel reads the low
    4 (an i32's value, an f32's bits)."""

    def data_ptr(self) -> int:
        return int(self)


def _f32_bits(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", v))[0]


def _random_args(p: dict[str, Any], seed: int) -> dict[str, Any]:
    import torch
    s = inputs(p, seed)
    b, h, P, N, g = _dims(p)
    ts = {k: s[k] if s[k] is not None else _Word(0) for k in ("state", "x", "dt", "A", "B", "C", "D", "z",
                                                                "dt_bias")}
    scalars = {"SX": h * P, "SZ": h * P, "SDT": h, "SB": g * N, "SC": g * N,
               "FLAGS": _flags(s["x"], s["dt"], s["A"], s["D"], s["dt_bias"], True), "DT_LO": _f32_bits(0.0),
               "DT_HI": _f32_bits(math.inf)}
    return ts | {k: _Word(v) for k, v in scalars.items()} | {
        "y": torch.full((b, h, P), float("nan"), device="cuda").to(torch_dtype(p["dtype"]))}


def _reduced(p: dict[str, Any]) -> dict[str, Any]:
    """The same schedule on a small shape: batch 2, 8 heads in 2 groups."""
    return p | {"batch": 2, "heads": 8, "groups": 2}


def _check(label: str, plan: Any) -> dict[str, Any]:
    err = check_ssm_step(dataclasses.replace(plan, params=_reduced(dict(plan.params))))
    return {"rel_err": err, "ok": bool(err <= TOL)}


def _hand(p: dict[str, Any]) -> Any:
    t = HAND if p["d_state"] == 128 else HAND | {"BP": 32}  # the d_state-64 class's: twice the rows a trip
    return default_plan(OP, p, t)


register(OP, OpHarness(random_args=_random_args, check=_check, reduced=_reduced, hand=_hand))
