"""PyTorch stand-ins for Mamba2's chunk kernels and a token-by-token recurrence, shared by the SSD tests (CPU and
GPU): the kernels' formulas (codegen/cuda/chunk_scan.py, chunk_state.py), with their wgmma operands optionally
rounded to a low-precision dtype, and random inputs in mamba_ssm's layouts."""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F


def _rnd(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """``t`` rounded to ``dtype`` (a wgmma operand), computed on in float32 (float64 when no rounding is asked)."""
    return t.to(dtype).float() if dtype is not None else t.double()


def chunk_state(B: Any, x: Any, dt: Any, dA: Any, low: torch.dtype | None = None) -> torch.Tensor:
    """ChunkState's formula: states[b, c, h, p, n] = Σ_k exp(dA[c, −1] − dA[c, k])·dt[c, k]·x[cQ+k, h, p]·B[cQ+k, g, n]
    over the chunk's positions inside L; float32 (b, nc, h, p, n). ``low``: the scaled x and B rounded to it."""
    b, L, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    nc, Q = dt.shape[2], dt.shape[3]
    pad = (0, 0, 0, 0, 0, nc * Q - L)
    xc = F.pad(x, pad).view(b, nc, Q, h, p)
    Bc = F.pad(B, pad).view(b, nc, Q, g, n).repeat_interleave(h // g, dim=3)  # (b, nc, Q, h, n)
    scale = (torch.exp(dA[..., -1:] - dA) * dt).permute(0, 2, 3, 1)  # (b, nc, Q, h)
    xs = _rnd(xc.double() * scale.double()[..., None], low)  # the kernel scales x (codegen.cuda.chunk_state)
    return torch.einsum("bckhp,bckhn->bchpn", xs, _rnd(Bc, low)).float()


def chunk_scan(cb: Any, x: Any, dt: Any, dA: Any, C: Any, states: Any, low: torch.dtype | None = None
               ) -> torch.Tensor:
    """ChunkScan's formula: out[b, cQ+m, h, p] = exp(dA[m])·Σ_n C[cQ+m, g, n]·states[c, h, p, n] + Σ_{k ≤ m}
    cb[c, g, m, k]·exp(dA[m] − dA[k])·dt[k]·x[cQ+k, h, p]; in x's dtype. ``low``: the decayed CB rounded to it."""
    b, L, h, p = x.shape
    g = C.shape[2]
    nc, Q = dt.shape[2], dt.shape[3]
    pad = (0, 0, 0, 0, 0, nc * Q - L)
    xc = _rnd(F.pad(x, pad).view(b, nc, Q, h, p), low)
    Cc = F.pad(C, pad).view(b, nc, Q, g, -1).repeat_interleave(h // g, dim=3)  # (b, nc, Q, h, n)
    dAd = dA.double()
    state = torch.einsum("bcmhn,bchpn->bcmhp", _rnd(Cc, low), _rnd(states, low))
    state = state * torch.exp(dAd).permute(0, 2, 3, 1)[..., None]
    causal = torch.tril(torch.ones(Q, Q, dtype=torch.bool, device=x.device))
    decay = torch.exp((dAd[..., :, None] - dAd[..., None, :]).masked_fill(~causal, -math.inf))  # (b, h, nc, m, k)
    cbh = cb.double().repeat_interleave(h // g, dim=2).permute(0, 2, 1, 3, 4)  # (b, h, nc, m, k)
    w = _rnd(cbh * decay * dt.double()[..., None, :], low)
    y = state + torch.einsum("bhcmk,bckhp->bcmhp", w, xc)
    return y.reshape(b, nc * Q, h, p)[:, :L].to(x.dtype)


def recurrence(x: Any, dt: Any, A: Any, B: Any, C: Any, D: Any = None, z: Any = None, dt_bias: Any = None,
               initial_states: Any = None, seq_idx: Any = None, dt_softplus: bool = False,
               dt_limit: tuple[float, float] = (0.0, math.inf)) -> tuple[torch.Tensor, torch.Tensor]:
    """The SSM one position at a time, float64, written from the formula alone: dt = clamp(softplus?(dt + bias));
    h_t = [seq_t = seq_{t−1}]·exp(dt_t·A)·h_{t−1} + dt_t·x_t B_tᵀ (h_{−1} = initial_states or 0, seq_{−1} = 0);
    y_t = (C_t·h_t + D·x_t)·silu(z_t). Returns (y (b, L, h, p), h_{L−1} (b, h, p, n))."""
    b, L, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    d = dt.double() + (dt_bias.double() if dt_bias is not None else 0)
    if dt_softplus:
        d = torch.where(d <= 20, torch.log1p(torch.exp(d)), d)
    d = d.clamp(dt_limit[0], dt_limit[1])
    st = initial_states.double().clone() if initial_states is not None else torch.zeros(b, h, p, n, dtype=torch.float64)
    ys = []
    for t in range(L):
        if seq_idx is not None:
            prev = seq_idx[:, t - 1] if t else torch.zeros_like(seq_idx[:, 0])
            st = st * (seq_idx[:, t] == prev).double()[:, None, None, None]
        Bt = B[:, t].double().repeat_interleave(h // g, dim=1)  # (b, h, n)
        Ct = C[:, t].double().repeat_interleave(h // g, dim=1)
        st = st * torch.exp(d[:, t] * A.double())[..., None, None] \
            + (d[:, t, :, None] * x[:, t].double())[..., None] * Bt[:, :, None, :]
        y = torch.einsum("bhpn,bhn->bhp", st, Ct)
        if D is not None:
            y = y + x[:, t].double() * (D.double()[:, None] if D.dim() == 1 else D.double())
        if z is not None:
            y = y * F.silu(z[:, t].double())
        ys.append(y)
    return torch.stack(ys, 1) if ys else torch.zeros(b, 0, h, p, dtype=torch.float64), st


def inputs(b: int, L: int, h: int, p: int, n: int, g: int = 1, dtype: torch.dtype = torch.float32,
           device: str = "cpu", seed: int = 0, D: str = "", z: bool = False, init: bool = False,
           seqs: int = 0) -> dict[str, Any]:
    """Random SSD inputs as Mamba2 initialises them (A = −uniform(1, 16), dt_bias = softplus⁻¹ of a log-uniform dt in
    [1e-3, 1e-1], raw dt ~ N(0, 1) through softplus): keyword arguments of ``mamba_chunk_scan_combined`` less
    chunk_size. ``D``: "" none, "h" per head, "hp" per (head, p); ``seqs``: that many packed sequences per row
    (seq_idx, cut at random places)."""
    gen = torch.Generator().manual_seed(seed)

    def r(*s: int) -> torch.Tensor:
        return torch.randn(*s, generator=gen)

    dt0 = torch.exp(torch.rand(h, generator=gen) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
    a = {"x": r(b, L, h, p), "dt": r(b, L, h), "A": -(1 + 15 * torch.rand(h, generator=gen)),
         "B": r(b, L, g, n), "C": r(b, L, g, n), "dt_bias": dt0 + torch.log(-torch.expm1(-dt0)),
         "dt_softplus": True}
    if D:
        a["D"] = r(h) if D == "h" else r(h, p)
    if z:
        a["z"] = r(b, L, h, p)
    if init:
        a["initial_states"] = r(b, h, p, n) * 0.5
    if seqs:
        cuts = [torch.sort(torch.randperm(max(L - 1, 1), generator=gen)[: seqs - 1] + 1).values for _ in range(b)]
        a["seq_idx"] = torch.stack([torch.bucketize(torch.arange(L), c, right=True) for c in cuts]).int()
    for k in ("x", "B", "C", "z"):
        if k in a:
            a[k] = a[k].to(dtype)
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in a.items()}
