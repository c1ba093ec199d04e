"""Mamba2 ChunkScan / ChunkState on the GPU: random inputs in mamba_ssm's layouts, float64 references written from
the formulas, the correctness check of a generated kernel, and timing next to the official Triton kernels.

``params`` use ptsolve's mamba2 names (batch, seq, heads, head_dim, d_state, chunk, groups, dtype; dtype defaults
to fp16 as in the generators). Shapes: x (b, L, h, p); B, C (b, L, g, n); dt, dA_cumsum (b, h, c, Q) float32;
cb (b, c, g, Q, Q) in the dtype; ChunkScan's entering states (b, c, h, p, n) in the dtype; ChunkState's output
(b, c, h, p, n) float32.
"""
from __future__ import annotations

import math
from typing import Any

from codegen.plan import KernelPlan

SCAN, STATE = "mamba2_chunk_scan", "mamba2_chunk_state"


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
    then the dtype), entering states ~ 0.1·randn."""
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
    cb = torch.einsum("bcmgn,bckgn->bcgmk", Cp, Bp).to(tdt)
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


def _runner(plan: KernelPlan) -> Any:
    from codegen.runtime import run_chunk_scan, run_chunk_state
    if plan.op == SCAN:
        return run_chunk_scan
    if plan.op == STATE:
        return run_chunk_state
    raise ValueError(f"not a Mamba2 plan: op {plan.op!r}")


def _out(plan: KernelPlan, inp: dict[str, Any], fill: float = float("nan")) -> Any:
    import torch
    if plan.op == SCAN:
        return torch.full_like(inp["x"], fill)
    b, _, h, P = inp["x"].shape
    return torch.full((b, inp["dt"].shape[2], h, P, inp["B"].shape[3]), fill, device="cuda")


def check(plan: KernelPlan, trials: int = 2, poison_tail: bool = False) -> float:
    """Worst relative Frobenius error of the kernel emitted for ``plan`` (either Mamba2 op, at the plan's shape)
    against the float64 reference over ``trials`` fresh inputs, the output poisoned with NaN before each run;
    NaN if any output is NaN/Inf (so it never passes a ``<=`` test). ``poison_tail`` (ChunkState only) puts
    inf / NaN in dt / dA_cumsum past seq (see state_inputs)."""
    import torch

    from codegen.bench import rel_err
    run = _runner(plan)
    if poison_tail and plan.op != STATE:
        raise ValueError(f"poison_tail applies to {STATE} plans, not {plan.op}")
    worst = 0.0
    for _ in range(trials):
        if plan.op == SCAN:
            inp = scan_inputs(plan.params)
            ref = chunk_scan_reference
        else:
            inp = state_inputs(plan.params, poison_tail=poison_tail)
            ref = chunk_state_reference
        out = _out(plan, inp)
        run(**inp, plan=plan, out=out)
        torch.cuda.synchronize()
        e = rel_err(out, ref(**inp))
        if math.isnan(e):
            return e
        worst = max(worst, e)
    return worst


# mamba_ssm 2.3.2's Triton kernels index in int32: at batch 64, seq 16k (x of 2^32 elements) ChunkScan faults and
# ChunkState returns wrong states (results/baselines_h200.md), so compare() does not run them past this size
TRITON_MAX_ELEMENTS = 1 << 31


def compare(plans: dict[str, KernelPlan], nsets: int = 2, triton: bool = True, graphs: bool = True
            ) -> dict[str, Any]:
    """Median milliseconds per call of each plan's kernel (all plans of one op and shape) and, when ``triton``,
    of mamba_ssm's ``_chunk_scan_fwd`` / ``_chunk_state_fwd`` (autotune reset for this shape) in one
    ``codegen.bench.time_many`` call on the same ``nsets`` input sets, replayed from CUDA graphs when ``graphs``
    (at batch 1 both wrappers' Python costs more than the kernel); the Triton kernel gets the same cb (in the
    dtype) as ours. Every output at the full shape is checked too: its last batch element (the largest offsets)
    against the float64 reference of that element. Returns {"ms": {label: ms}, "rel_err_vs_triton": {label: error
    on set 0}, "rel_err_last_batch": {label: error vs the reference}, "triton_error": why the baseline is
    missing, or None}."""
    import torch

    from codegen.bench import rel_err, time_many
    ops = {(pl.op, repr(sorted(pl.params.items()))) for pl in plans.values()}
    if len(ops) != 1:
        raise ValueError(f"compare() takes plans of one op and shape; got {sorted(ops)}")
    first = next(iter(plans.values()))
    run = _runner(first)
    make = scan_inputs if first.op == SCAN else state_inputs
    sets = [make(first.params) for _ in range(nsets)]
    outs = {k: _out(pl, sets[0], 0.0) for k, pl in plans.items()}  # one buffer per plan: CS9's x is 8.6 GB
    fns: dict[str, Any] = {k: (lambda i, pl=pl, o=outs[k]: run(**sets[i], plan=pl, out=o)) for k, pl in plans.items()}
    res: dict[str, Any] = {"ms": {}, "rel_err_vs_triton": {}, "rel_err_last_batch": {}, "triton_error": None}
    tri_out: list[Any] = [None]
    if triton and sets[0]["x"].numel() > TRITON_MAX_ELEMENTS:
        res["triton_error"] = (f"not run: x has {sets[0]['x'].numel()} elements, past the int32 indexing of "
                               "mamba_ssm's Triton kernels (they fault or return wrong states there)")
    elif triton:
        try:
            from baselines.mamba2 import load_kernels, reset_autotune
            kern = load_kernels()
            if first.op == SCAN:
                reset_autotune(kern.chunk_scan_kernel)

                def tri(i: int) -> Any:
                    s = sets[i]
                    tri_out[0] = kern.chunk_scan_fwd(s["cb"], s["x"], s["dt"], s["dA_cumsum"], s["C"], s["states"])[0]
            else:
                reset_autotune(kern.chunk_state_kernel)
                tout = _out(first, sets[0], 0.0)

                def tri(i: int) -> Any:
                    s = sets[i]
                    tri_out[0] = kern.chunk_state_fwd(s["B"], s["x"], s["dt"], s["dA_cumsum"], states=tout,
                                                      states_in_fp32=True)
            tri(0)
            fns["triton"] = tri
        except Exception as e:  # noqa: BLE001 - the baseline is optional; say why it is missing
            res["triton_error"] = f"{type(e).__name__}: {e}"
    for f in fns.values():
        f(0)  # compile / load / autotune outside the timing
    torch.cuda.synchronize()
    if "triton" in fns:
        res["rel_err_vs_triton"] = {k: rel_err(outs[k], tri_out[0]) for k in plans}
    ref = (chunk_scan_reference if first.op == SCAN else chunk_state_reference)(
        **{n: t[-1:] for n, t in sets[0].items()})
    res["rel_err_last_batch"] = {k: rel_err(outs[k][-1:], ref) for k in plans}
    del ref
    res["ms"] = time_many(fns, nsets, graphs=graphs)
    return res
