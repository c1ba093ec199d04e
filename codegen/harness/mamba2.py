"""Mamba2 ChunkScan / ChunkState's harness: random inputs in mamba_ssm's layouts, float64 references written from
the formulas, the exact-shape launch of a plan's kernel (``run_chunk_scan``, ``run_chunk_state``), its check, and the
hand-written plans measurements compare against. (The timing next to mamba_ssm's Triton kernels is
``baselines.mamba2.compare``.)

``params`` use ptsolve's mamba2 names (batch, seq, heads, head_dim, d_state, chunk, groups, dtype; dtype defaults
to fp16 as in the generators). Shapes: x (b, L, h, p); B, C (b, L, g, n); dt, dA_cumsum (b, h, c, Q) float32;
cb (b, c, g, Q, Q) in the plan's ``cb_dtype`` (float32) or the dtype; ChunkScan's entering states (b, c, h, p, n) in
the dtype; ChunkState's output (b, c, h, p, n) float32.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from ..plan import KernelPlan, default_plan
from ..runtime import emit_cached, load
from .common import TOL, OpHarness, need, register, rel_err, stream

SCAN, STATE = "mamba2_chunk_scan", "mamba2_chunk_state"
# the hand plans (tiling, overlapped order): the fastest of our sweeps on the H200 (chunk_scan: two consumer
# warpgroups, BK 64, textbook order; chunk_state: two CTAs per SM, the mma one stage behind the scale)
HAND = {SCAN: ({"BM": 128, "BK": 64, "depth": 2, "groups": 2}, False),
        STATE: ({"BM": 128, "BK": 64, "depth": 2, "groups": 2, "ctas": 2}, True)}


def _shape(p: dict[str, Any]) -> tuple[int, int, int, int, int, int, int, Any]:
    import torch
    tdt = {"fp16": torch.float16, "bf16": torch.bfloat16}[p.get("dtype", "fp16")]
    return (p["batch"], p["seq"], p["heads"], p["head_dim"], p["d_state"], p["chunk"], p.get("groups", 1), tdt)


def _dt_da(g: Any, b: int, h: int, nc: int, Q: int) -> tuple[Any, Any]:
    """dt = softplus(randn)·0.1 and dA_cumsum = chunkwise cumsum of −exp(randn)·dt (float32)."""
    import torch
    dt = torch.nn.functional.softplus(torch.randn(b, h, nc, Q, device="cuda", generator=g)) * 0.1
    da = torch.cumsum(-torch.exp(torch.randn(b, h, nc, Q, device="cuda", generator=g)) * dt, dim=-1)
    return dt, da


def _gen(seed: int | None) -> Any:
    import torch
    g = torch.Generator(device="cuda")
    g.manual_seed(seed if seed is not None else int(torch.randint(0, 1 << 30, (1,)).item()))
    return g


def scan_inputs(p: dict[str, Any], seed: int | None = None) -> dict[str, Any]:
    """Fresh ChunkScan inputs (keys are ``run_chunk_scan``'s): x, B, C ~ randn, cb = C·Bᵀ per chunk (in float32,
    kept so where ``p``'s cb_dtype is "fp32", else rounded to the dtype), entering states ~ 0.1·randn."""
    import torch
    import torch.nn.functional as F
    b, L, h, P, N, Q, G, tdt = _shape(p)
    g = _gen(seed)
    nc = -(-L // Q)
    x = torch.randn(b, L, h, P, device="cuda", generator=g).to(tdt)
    C = torch.randn(b, L, G, N, device="cuda", generator=g).to(tdt)
    Bm = torch.randn(b, L, G, N, device="cuda", generator=g).to(tdt)
    pad = nc * Q - L
    Cp = F.pad(C.float(), (0, 0, 0, 0, 0, pad)).reshape(b, nc, Q, G, N)
    Bp = F.pad(Bm.float(), (0, 0, 0, 0, 0, pad)).reshape(b, nc, Q, G, N)
    cb = torch.einsum("bcmgn,bckgn->bcgmk", Cp, Bp)
    cb = cb if p.get("cb_dtype") == "fp32" else cb.to(tdt)
    del Cp, Bp
    dt, da = _dt_da(g, b, h, nc, Q)
    states = (torch.randn(b, nc, h, P, N, device="cuda", generator=g) * 0.1).to(tdt)
    return {"cb": cb, "x": x, "dt": dt, "dA_cumsum": da, "C": C, "states": states}


def state_inputs(p: dict[str, Any], seed: int | None = None, poison_tail: bool = False) -> dict[str, Any]:
    """Fresh ChunkState inputs (keys are ``run_chunk_state``'s): x, B ~ randn. ``poison_tail`` puts inf in dt and
    NaN in dA_cumsum past seq (except the chunk's last position, whose dA every position's decay uses): a
    kernel that does not mask them fails the check."""
    import torch
    b, L, h, P, N, Q, G, tdt = _shape(p)
    g = _gen(seed)
    nc = -(-L // Q)
    x = torch.randn(b, L, h, P, device="cuda", generator=g).to(tdt)
    Bm = torch.randn(b, L, G, N, device="cuda", generator=g).to(tdt)
    dt, da = _dt_da(g, b, h, nc, Q)
    tail = nc * Q - L
    if poison_tail and tail > 1:
        dt[:, :, -1, Q - tail:] = float("inf")
        da[:, :, -1, Q - tail:-1] = float("nan")
    return {"x": x, "B": Bm, "dt": dt, "dA_cumsum": da}


def chunk_scan_reference(cb: Any, x: Any, dt: Any, dA_cumsum: Any, C: Any, states: Any) -> Any:
    """float64 ChunkScan: out[b, cQ+m, h, p] = exp(dA[m]) Σ_n C[m, n] states[p, n]
    + Σ_{k <= m, k < seq} cb[m, k] exp(dA[m] − dA[k]) dt[k] x[k, p], heads h of group h // (H/G)."""
    import torch
    import torch.nn.functional as F
    b, L, H, P = x.shape
    nc, G, Q = cb.shape[1], cb.shape[2], cb.shape[3]
    rep = H // G
    pad = nc * Q - L
    xf = F.pad(x.double(), (0, 0, 0, 0, 0, pad)).reshape(b, nc, Q, H, P)
    Cf = F.pad(C.double(), (0, 0, 0, 0, 0, pad)).reshape(b, nc, Q, G, -1).repeat_interleave(rep, dim=3)
    cbh = cb.double().repeat_interleave(rep, dim=2)                    # (b, c, h, m, k)
    dA = dA_cumsum.double().permute(0, 2, 1, 3)                        # (b, c, h, Q)
    dtc = dt.double().permute(0, 2, 1, 3)
    seg = dA[..., :, None] - dA[..., None, :]                          # (b, c, h, m, k)
    causal = torch.ones(Q, Q, dtype=torch.bool, device=x.device).tril()
    valid_k = (torch.arange(nc * Q, device=x.device) < L).reshape(nc, Q)[None, :, None, None, :]
    decay = torch.exp(seg.masked_fill(~causal, float("-inf"))) * dtc[..., None, :]
    decay = torch.where(valid_k & causal, decay, torch.zeros((), dtype=decay.dtype, device=x.device))
    intra = torch.einsum("bchmk,bckhp->bcmhp", cbh * decay, xf)
    inter = torch.einsum("bcmhn,bchpn->bcmhp", Cf, states.double()) * torch.exp(dA).permute(0, 1, 3, 2)[..., None]
    return (intra + inter).reshape(b, nc * Q, H, P)[:, :L]


def chunk_state_reference(x: Any, B: Any, dt: Any, dA_cumsum: Any) -> Any:
    """float64 states[b, c, h, p, n] = Σ_{l < seq} x[l, p] B[l, n] exp(dA[Q−1] − dA[l]) dt[l]; positions past seq
    get weight 0 whatever dt / dA hold there."""
    import torch
    import torch.nn.functional as F
    b, L, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    nc, Q = dt.shape[2], dt.shape[3]
    pad = nc * Q - L
    xf = F.pad(x.double(), (0, 0, 0, 0, 0, pad)).reshape(b, nc, Q, H, P)
    bf = F.pad(B.double(), (0, 0, 0, 0, 0, pad)).reshape(b, nc, Q, G, N).repeat_interleave(H // G, dim=3)
    w = torch.exp(dA_cumsum[..., -1:].double() - dA_cumsum.double()) * dt.double()  # (b, h, c, Q)
    pos = torch.arange(nc * Q, device=x.device).reshape(nc, Q)
    w = torch.where(pos < L, w, torch.zeros((), dtype=w.dtype, device=w.device))
    return torch.einsum("bclhn,bhcl,bclhp->bchpn", bf, w, xf)


def _sizes(p: dict[str, Any]) -> tuple[int, ...]:
    return tuple(p[k] for k in ("batch", "seq", "heads", "head_dim", "d_state", "chunk", "groups"))


def run_chunk_scan(cb: Any, x: Any, dt: Any, dA_cumsum: Any, C: Any, states: Any, plan: Any, out: Any = None) -> Any:
    """Mamba2 ChunkScan with the kernel emitted for ``plan`` (mamba_ssm layouts): cb (b, nc, g, Q, Q), x (b, L, h, p),
    dt / dA_cumsum (b, h, nc, Q) float32, C (b, L, g, n), states (b, nc, h, p, n) -> out (b, L, h, p). x, C, out
    in the plan's dtype, cb in its ``cb_dtype`` (float32) or dtype; states and cb of another float dtype (the float32
    that mamba_ssm's state passing and ``_bmm_chunk_fwd`` may return) are converted to it (a wgmma operand)."""
    import torch

    ks = emit_cached(plan)
    p = ks.params
    B, L, H, P, N, Q, G = _sizes(p)
    nc, d = -(-L // Q), p["dtype"]
    cb = need(cb, "cb", (B, nc, G, Q, Q), p.get("cb_dtype", d), convert=True)
    need(x, "x", (B, L, H, P), d)
    need(dt, "dt", (B, H, nc, Q), "fp32")
    need(dA_cumsum, "dA_cumsum", (B, H, nc, Q), "fp32")
    need(C, "C", (B, L, G, N), d)
    states = need(states, "states", (B, nc, H, P, N), d, convert=True)
    o = out if out is not None else torch.empty_like(x)
    need(o, "out", (B, L, H, P), d)
    load(ks).launch({"cb": cb.data_ptr(), "x": x.data_ptr(), "c": C.data_ptr(), "states": states.data_ptr(),
                     "dt": dt.data_ptr(), "dA": dA_cumsum.data_ptr(), "out": o.data_ptr()}, stream())
    return o


def run_chunk_state(x: Any, B: Any, dt: Any, dA_cumsum: Any, plan: Any, out: Any = None) -> Any:
    """Mamba2 ChunkState with the kernel emitted for ``plan``: states (b, nc, h, p, n) float32 from x (b, L, h, p),
    B (b, L, g, n) in the plan's dtype and dt, dA_cumsum (b, h, nc, Q) float32; ``out`` is written in place."""
    import torch

    ks = emit_cached(plan)
    p = ks.params
    Bt, L, H, P, N, Q, G = _sizes(p)
    nc, d = -(-L // Q), p["dtype"]
    need(x, "x", (Bt, L, H, P), d)
    need(B, "B", (Bt, L, G, N), d)
    need(dt, "dt", (Bt, H, nc, Q), "fp32")
    need(dA_cumsum, "dA_cumsum", (Bt, H, nc, Q), "fp32")
    o = out if out is not None else torch.empty(Bt, nc, H, P, N, dtype=torch.float32, device=x.device)
    need(o, "out", (Bt, nc, H, P, N), "fp32")
    load(ks).launch({"x": x.data_ptr(), "b": B.data_ptr(), "dt": dt.data_ptr(), "da": dA_cumsum.data_ptr(),
                     "out": o.data_ptr()}, stream())
    return o


def runner(op: str) -> Any:
    """``run_chunk_scan`` or ``run_chunk_state`` for a Mamba2 operator; ValueError for another."""
    run = _RUN.get(op)
    if run is None:
        raise ValueError(f"not a Mamba2 plan: op {op!r}")
    return run


def output(plan: KernelPlan, inp: dict[str, Any], fill: float = float("nan")) -> Any:
    """A new output tensor of ``plan``'s kernel for inputs ``inp``, filled with ``fill``."""
    import torch

    if plan.op == SCAN:  # this file's own two operators
        return torch.full_like(inp["x"], fill)
    b, _, h, P = inp["x"].shape
    return torch.full((b, inp["dt"].shape[2], h, P, inp["B"].shape[3]), fill, device="cuda")


def check_mamba(plan: KernelPlan, trials: int = 2, poison_tail: bool = False) -> float:
    """Worst relative Frobenius error of the kernel emitted for ``plan`` (either Mamba2 op, at the plan's shape)
    against the float64 reference over ``trials`` fresh inputs, the output poisoned with NaN before each run;
    NaN if any output is NaN/Inf (so it never passes a ``<=`` test). ``poison_tail`` (ChunkState only) puts
    inf / NaN in dt / dA_cumsum past seq (see state_inputs)."""
    import torch

    run = runner(plan.op)
    if poison_tail and plan.op != STATE:
        raise ValueError(f"poison_tail applies to {STATE} plans, not {plan.op}")
    worst = 0.0
    for _ in range(trials):
        inp = scan_inputs(plan.params) if plan.op == SCAN else state_inputs(plan.params, poison_tail=poison_tail)
        ref = _REFERENCE[plan.op]
        out = output(plan, inp)
        run(**inp, plan=plan, out=out)
        torch.cuda.synchronize()
        e = rel_err(out, ref(**inp))
        if math.isnan(e):
            return e
        worst = max(worst, e)
    return worst


def _random_args(p: dict[str, Any], seed: int) -> dict[str, Any]:
    import torch

    s = scan_inputs(p, seed)
    return {"cb": s["cb"], "x": s["x"], "dt": s["dt"], "dA": s["dA_cumsum"], "c": s["C"], "states": s["states"],
            "out": torch.full_like(s["x"], float("nan"))}


def _state_random_args(p: dict[str, Any], seed: int) -> dict[str, Any]:
    import torch

    s = state_inputs(p, seed)
    b, L, h, P = s["x"].shape
    out = torch.full((b, s["dt"].shape[2], h, P, s["B"].shape[3]), float("nan"), device="cuda")
    return {"x": s["x"], "b": s["B"], "dt": s["dt"], "da": s["dA_cumsum"], "out": out}


def _reduced(p: dict[str, Any]) -> dict[str, Any]:
    """The same schedule on a shape small enough for a float64 reference: batch 1, 8 heads per group, and a seq
    that leaves the last chunk ragged."""
    return p | {"batch": 1, "heads": 8 * p.get("groups", 1), "seq": min(p["seq"], 2048) - 24}


def _check(label: str, plan: Any) -> dict[str, Any]:
    err = check_mamba(dataclasses.replace(plan, params=_reduced(dict(plan.params))), trials=1)
    return {"rel_err": err, "ok": bool(err <= TOL)}


def _hand(op: str, p: dict[str, Any]) -> Any:
    t, ov = HAND[op]
    if op == STATE and t["BM"] > p["d_state"]:  # d_state 64: one 64-column block per warpgroup
        t = t | {"BM": p["d_state"], "groups": 1}
    return default_plan(op, p, t, ov)


_RUN = {SCAN: run_chunk_scan, STATE: run_chunk_state}
_REFERENCE = {SCAN: chunk_scan_reference, STATE: chunk_state_reference}
register(SCAN, OpHarness(random_args=_random_args, check=_check, reduced=_reduced,
                         hand=lambda p: _hand(SCAN, p)))
register(STATE, OpHarness(random_args=_state_random_args, check=_check, reduced=_reduced,
                          hand=lambda p: _hand(STATE, p)))
