"""Mamba2 state passing's harness: random inputs in mamba_ssm's layouts, a float64 reference written from the
recurrence, the exact-shape launch of a plan's kernel (``run_state_passing``), its check and the hand plan.

``params`` are the operator's (batch, chunks, heads, head_dim, d_state, chunk, dtype). Shapes: states (b, nc, h, p, n)
float32; dA_cumsum (b, h, nc, chunk) float32; keep (b, nc rounded up to 4) float32 or None; init (b, h, p, n) float32
or None → entering states (b, nc, h, p, n) in the dtype and the final state (b, h, p, n) float32.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from ..plan import default_plan
from ..runtime import emit_cached, load
from .common import TOL, OpHarness, need, register, rel_err, stream

OP = "mamba2_state_passing"
# the shipped table's d_state-128 schedule (ptsolve.serve's class kernel); d_state 64 halves the tile
HAND = {"BE": 2048, "depth": 2, "groups": 1, "ctas": 2}


def _dims(p: dict[str, Any]) -> tuple[int, int, int, int, int, int]:
    return p["batch"], p["chunks"], p["heads"], p["head_dim"], p["d_state"], p.get("chunk", 256)


def inputs(p: dict[str, Any], seed: int = 0, keep: bool = True, init: bool = True) -> dict[str, Any]:
    """Fresh inputs (keys are ``run_state_passing``'s): states ~ randn, dA_cumsum the chunkwise cumsum of
    −dt·exp(randn) with dt ~ softplus(randn)/chunk (every position's value differs, so the wrong one is seen, and
    a chunk's decay exp(dA_last) is about 0.15 to 0.4: the carried state weighs), keep flags with about one
    restart in four chunks (the first one's included) and 1 in the padding, init ~ 0.5·randn."""
    import torch
    b, nc, h, P, N, Q = _dims(p)
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = torch.nn.functional.softplus(torch.randn(b, h, nc, Q, device="cuda", generator=g)) / Q
    da = torch.cumsum(-torch.exp(torch.randn(b, h, nc, Q, device="cuda", generator=g)) * dt, dim=-1)
    out = {"states": torch.randn(b, nc, h, P, N, device="cuda", generator=g), "dA_cumsum": da,
           "keep": None, "init": None}
    if keep:
        k = torch.ones(b, -(-nc // 4) * 4, device="cuda")  # the padding's 1 must not leak into a real chunk
        k[:, :nc] = (torch.rand(b, nc, device="cuda", generator=g) > 0.25).float()
        out["keep"] = k
    if init:
        out["init"] = torch.randn(b, h, P, N, device="cuda", generator=g) * 0.5
    return out


def reference(states: Any, dA_cumsum: Any, keep: Any = None, init: Any = None) -> tuple[Any, Any]:
    """The recurrence in float64: (entering (b, nc, h, p, n), final (b, h, p, n)), both float64."""
    import torch
    b, nc = states.shape[:2]
    decay = torch.exp(dA_cumsum[..., -1].double()).permute(0, 2, 1)  # (b, nc, h)
    if keep is not None:
        decay = decay * keep[:, :nc, None].double()
    s = init.double() if init is not None else torch.zeros_like(states[:, 0], dtype=torch.float64)
    entering = torch.empty_like(states, dtype=torch.float64)
    for c in range(nc):
        entering[:, c] = s
        s = decay[:, c, :, None, None] * s + states[:, c].double()
    return entering, s


def run_state_passing(states: Any, dA_cumsum: Any, keep: Any, init: Any, plan: Any, out: Any = None,
                      fin: Any = None) -> tuple[Any, Any]:
    """State passing with the kernel emitted for ``plan`` (its exact shape): returns (entering in the plan's dtype,
    final float32); ``out`` / ``fin`` are written in place where given."""
    import torch
    ks = emit_cached(plan)
    p = ks.params
    b, nc, h, P, N, Q = _dims(p)
    need(states, "states", (b, nc, h, P, N), "fp32")
    need(dA_cumsum, "dA_cumsum", (b, h, nc, Q), "fp32")
    if keep is not None:
        need(keep, "keep", (b, -(-nc // 4) * 4), "fp32")
    if init is not None:
        need(init, "init", (b, h, P, N), "fp32")
    o = out if out is not None else torch.empty(states.shape, dtype=getattr(torch, {"fp16": "float16",
                                                                              "bf16": "bfloat16"}[p["dtype"]]),
                                                device=states.device)
    f = fin if fin is not None else torch.empty(b, h, P, N, device=states.device)
    need(o, "out", (b, nc, h, P, N), p["dtype"])
    need(f, "fin", (b, h, P, N), "fp32")
    load(ks).launch({"states": states.data_ptr(), "da": dA_cumsum.data_ptr(),
                     "keep": 0 if keep is None else keep.data_ptr(), "init": 0 if init is None else init.data_ptr(),
                     "out": o.data_ptr(), "fin": f.data_ptr()}, stream())
    return o, f


def check_state_passing(plan: Any, seed: int = 0) -> float:
    """Worst relative Frobenius error of the entering and final states of ``plan``'s kernel (with keep flags and an
    initial state) against the float64 reference, the outputs NaN-filled first; NaN if any output is NaN/Inf."""
    import torch
    inp = inputs(plan.params, seed)
    b, nc, h, P, N, _ = _dims(plan.params)
    o = torch.full(inp["states"].shape, float("nan"), device="cuda").to(
        {"fp16": torch.float16, "bf16": torch.bfloat16}[plan.params["dtype"]])
    f = torch.full((b, h, P, N), float("nan"), device="cuda")
    run_state_passing(**inp, plan=plan, out=o, fin=f)
    torch.cuda.synchronize()
    ent, fin = reference(**inp)
    errs = [rel_err(o, ent), rel_err(f, fin)]
    return math.nan if any(math.isnan(e) for e in errs) else max(errs)


def _random_args(p: dict[str, Any], seed: int) -> dict[str, Any]:
    import torch
    s = inputs(p, seed)
    b, nc, h, P, N, _ = _dims(p)
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[p["dtype"]]
    return {"states": s["states"], "da": s["dA_cumsum"], "keep": s["keep"], "init": s["init"],
            "out": torch.full(s["states"].shape, float("nan"), device="cuda").to(dt),
            "fin": torch.full((b, h, P, N), float("nan"), device="cuda")}


def _reduced(p: dict[str, Any]) -> dict[str, Any]:
    """The same schedule on a small shape: batch 1, 8 heads, 9 chunks (keep's last 16-byte row padded)."""
    return p | {"batch": 1, "heads": 8, "chunks": 9}


def _check(label: str, plan: Any) -> dict[str, Any]:
    err = check_state_passing(dataclasses.replace(plan, params=_reduced(dict(plan.params))))
    return {"rel_err": err, "ok": bool(err <= TOL)}


def _hand(p: dict[str, Any]) -> Any:
    pn = p["head_dim"] * p["d_state"]
    return default_plan(OP, p, HAND | {"BE": min(HAND["BE"], pn // 4)})


register(OP, OpHarness(random_args=_random_args, check=_check, reduced=_reduced, hand=_hand))
