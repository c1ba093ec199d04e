"""Mamba2's whole SSD forward (the state space dual) behind mamba_ssm's ``mamba_chunk_scan_combined``.

```python
from ptsolve.ssd import mamba_chunk_scan_combined
out, final = mamba_chunk_scan_combined(x, dt, A, B, C, 256, D=D, z=z, dt_bias=dt_bias, dt_softplus=True,
                                       return_final_states=True)
```

Shapes (mamba_ssm's): x, z (b, L, h, p); dt (b, L, h); A, dt_bias (h,); B, C (b, L, g, n) with h a multiple of g;
D (h,) or (h, p); initial_states (b, h, p, n); seq_idx (b, L) integer → out (b, L, h, p) in x's dtype and, with
``return_final_states``, the state after the last position (b, h, p, n) float32. The recurrence it computes, per
batch row, head and position t (A ≤ 0, dt ≥ 0 after the clamp):

    dt_t = clamp(softplus?(dt_t + dt_bias), *dt_limit)
    h_t  = [seq_t = seq_{t-1}] · exp(dt_t·A) · h_{t-1} + dt_t · x_t B_tᵀ       (h_{-1} = initial_states, seq_{-1} = 0)
    y_t  = (C_t · h_tᵀ + D · x_t) · silu(z_t)

in chunks of ``chunk_size`` positions (the SSD algorithm): the steps and where they run are

- chunk cumsum (dt's bias, softplus and clamp; dA's cumulative sum per chunk): PyTorch ops, float32;
- chunk state (each chunk's own final state): ptsolve's generated ChunkState kernel (through ``ptsolve.serve``);
- state passing (the states entering each chunk, in the input dtype: the ChunkScan kernel's wgmma operand, and
  the final one, float32): ptsolve's generated state-passing kernel, one launch that runs the recurrence over the
  chunks in float32 registers (``state_passing`` is the same in PyTorch, one multiply-add per chunk: the CPU path
  and the reference);
- CB (C·Bᵀ per chunk and group): one batched matmul, float32 out for bf16 (rounded once, in the chunk scan's P,
  as mamba_ssm's), fp16 out for fp16 (``geometry.mamba2.DEFAULT_CB_DTYPE`` says why);
- chunk scan, D skip and z gate: ptsolve's generated ChunkScan kernel, a variant with the epilogue fused where D or
  z is given (out = (scan + D·x)·silu(z) in float32, one rounding; z is read in x's dtype);
- (``skip_gate``, the same epilogue as PyTorch ops, serves chunk-scan kernels that do not fuse it: the CPU tests'.)

``seq_idx`` (packed sequences) runs through the same kernels with masked inputs: dt zeroed where a position is not in
its chunk's last sequence (ChunkState), CB zeroed between positions of different sequences, C zeroed for the
entering-state term where a position is not in the sequence the previous chunk ended in (ChunkScan), and the state
passing's decay zeroed across a change, as mamba_ssm's kernels mask them. Forward only (no autograd). What the
kernels do not cover (``return_varlen_states``, float32 inter-chunk states, head_dim other than 64, d_state other
than 64/128, chunk other than 64/128/256) raises a ``ShapeError`` naming the argument and the alternative.
``ssd_reference`` is the same forward in float64 PyTorch (quadratic, no chunks), for checking. The forward is
registered as ``torch.ops.ptsolve.mamba_chunk_scan_combined`` (→ (out, final states)), which
``mamba_chunk_scan_combined`` calls under ``torch.compile``; eagerly it runs the same code without the dispatcher.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from .errors import DeviceError, ShapeError

__all__ = ["mamba_chunk_scan_combined", "ssd_reference"]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
_DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
_SOFTPLUS_LINEAR = 20.0  # mamba_ssm's softplus is the identity above 20 (F.softplus's default threshold)


class Kernels(NamedTuple):
    """The kernels the forward calls (mamba_ssm's layouts): ``chunk_state(B, x, dt, dA_cumsum)`` → states
    (b, nc, h, p, n) float32; ``chunk_scan(cb, x, dt, dA_cumsum, C, states)`` → out (b, L, h, p) in x's dtype, and
    where ``fused``, ``chunk_scan(..., D, z)`` → (out + D·x)·silu(z) (the epilogue in the kernel);
    ``state_passing(states, dA_cumsum, initial_states, pass_keep, out_dtype)`` → (entering, final) as
    ``state_passing`` (which runs where it is None). ptsolve's by default (``PTSOLVE_KERNELS``); the CPU tests pass
    PyTorch versions of the same formulas."""

    chunk_state: Callable[..., torch.Tensor]
    chunk_scan: Callable[..., torch.Tensor]
    fused: bool = False
    state_passing: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` contiguous and 16-byte aligned (the kernels' tensor maps), copied only where it is not."""
    t = t if t.is_contiguous() else t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def _mamba_class(op: str, x: torch.Tensor, BC: torch.Tensor, dt: torch.Tensor) -> Any:
    from . import serve  # the serving layer (the code generator behind it) only once a kernel runs

    return serve.mamba_class(op, _DTYPE_NAMES[x.dtype], x.shape[-1], BC.shape[-1], dt.shape[-1])


def _chunk_state_cuda(B: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, dA: torch.Tensor) -> torch.Tensor:
    """ptsolve's ChunkState kernel (``serve.chunk_state``) → states (b, nc, h, p, n) float32."""
    from . import serve

    b, _, h, p = x.shape
    out = x.new_empty((b, dt.shape[2], h, p, B.shape[-1]), dtype=torch.float32)
    c = _mamba_class("mamba2_chunk_state", x, B, dt)
    return serve.chunk_state(*(_aligned(t) for t in (B, x, dt, dA)), out, c)


def _chunk_scan_cuda(cb: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, dA: torch.Tensor, C: torch.Tensor,
                     states: torch.Tensor, D: torch.Tensor | None = None, z: torch.Tensor | None = None
                     ) -> torch.Tensor:
    """ptsolve's ChunkScan kernel (``serve.chunk_scan``) → out (b, L, h, p) in x's dtype; with D and/or z its fused
    variant, (out + D·x)·silu(z) in float32 before the one rounding (D as float32, z in x's dtype). cb float32 or
    in x's dtype: the class whose kernel reads it as it is (ShapeError for another dtype)."""
    from . import serve

    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    ep = ("" if D is None else "Dp" if D.dim() == 2 else "D") + ("" if z is None else "z")
    # the class that reads cb as it is: float32 (the bf16 default, chunk_bmm's) or x's dtype
    cbd = "fp32" if cb.dtype == torch.float32 else _DTYPE_NAMES.get(cb.dtype, str(cb.dtype))
    c = serve.mamba_class("mamba2_chunk_scan", _DTYPE_NAMES[x.dtype], x.shape[-1], C.shape[-1], dt.shape[-1], ep,
                          cbd)
    Df = _aligned(D.float()) if D is not None else None
    zx = _aligned(z.to(x.dtype)) if z is not None else None
    return serve.chunk_scan(*(_aligned(t) for t in (cb, x, dt, dA, C, states)), out, c, Df, zx)


def _state_passing_cuda(states: torch.Tensor, dA_cumsum: torch.Tensor, initial_states: torch.Tensor | None = None,
                        pass_keep: torch.Tensor | None = None, out_dtype: torch.dtype = torch.float16
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """ptsolve's state-passing kernel (``serve.state_passing``): ``state_passing``'s (entering in ``out_dtype``,
    final float32) in one launch, ``states`` left as they are. pass_keep (b, nc) goes to the kernel as float32 rows
    padded to a multiple of 4 chunks (its 16-byte copies)."""
    from . import serve

    b, nc, h, p, n = states.shape
    c = serve.state_passing_class(_DTYPE_NAMES[out_dtype], p, n)
    keep = None
    if pass_keep is not None:
        keep = states.new_zeros((b, -(-nc // 4) * 4))
        keep[:, :nc] = pass_keep
    init = _aligned(initial_states.float()) if initial_states is not None else None
    entering = states.new_empty(states.shape, dtype=out_dtype)
    final = states.new_empty((b, h, p, n))
    return serve.state_passing(_aligned(states), _aligned(dA_cumsum), keep, init, entering, final, c)


# ptsolve's kernels, reached through the serving layer (not ptsolve.torch, which may re-export this module)
PTSOLVE_KERNELS = Kernels(_chunk_state_cuda, _chunk_scan_cuda, fused=True, state_passing=_state_passing_cuda)


# ------------------------------------------------------------------------------------------------ checks

def _shape(name: str, t: torch.Tensor | None, want: tuple[int, ...], what: str) -> None:
    if t is not None and tuple(t.shape) != want:
        raise ShapeError(f"mamba_chunk_scan_combined: {name} must be {what} = {want}, got {tuple(t.shape)}")


def _check_dims(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                chunk_size: int, D: torch.Tensor | None, z: torch.Tensor | None, dt_bias: torch.Tensor | None,
                initial_states: torch.Tensor | None, seq_idx: torch.Tensor | None) -> None:
    """ShapeError naming the argument, its shape and the one it must have."""
    if x.dim() != 4 or B.dim() != 4:
        raise ShapeError(f"mamba_chunk_scan_combined: x must be (batch, seqlen, nheads, headdim) and B "
                         f"(batch, seqlen, ngroups, dstate); got x {tuple(x.shape)}, B {tuple(B.shape)}")
    b, L, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    if g < 1 or h % g:
        raise ShapeError(f"mamba_chunk_scan_combined: nheads={h} must be a multiple of ngroups={g} (B's dim 2)")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ShapeError(f"mamba_chunk_scan_combined: chunk_size={chunk_size!r} must be a positive int")
    _shape("B", B, (b, L, g, n), "(batch, seqlen, ngroups, dstate)")
    _shape("C", C, (b, L, g, n), "B's shape (batch, seqlen, ngroups, dstate)")
    _shape("dt", dt, (b, L, h), "(batch, seqlen, nheads)")
    _shape("A", A, (h,), "(nheads,)")
    _shape("dt_bias", dt_bias, (h,), "(nheads,)")
    _shape("z", z, (b, L, h, p), "x's shape (batch, seqlen, nheads, headdim)")
    _shape("initial_states", initial_states, (b, h, p, n), "(batch, nheads, headdim, dstate)")
    _shape("seq_idx", seq_idx, (b, L), "(batch, seqlen)")
    if D is not None and tuple(D.shape) not in ((h,), (h, p)):
        raise ShapeError(f"mamba_chunk_scan_combined: D must be (nheads,) = ({h},) or (nheads, headdim) = "
                         f"({h}, {p}), got {tuple(D.shape)}")


def _check_types(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                 extra: dict[str, torch.Tensor | None], seq_idx: torch.Tensor | None,
                 dt_limit: tuple[float, float]) -> None:
    """ShapeError for a dtype the forward does not take, DeviceError for tensors on different devices."""
    if B.dtype != x.dtype or C.dtype != x.dtype:
        raise ShapeError(f"mamba_chunk_scan_combined: B ({B.dtype}) and C ({C.dtype}) must have x's dtype {x.dtype}; "
                         f"convert them with .to(x.dtype)")
    for name, t in {"dt": dt, "A": A, **extra}.items():
        if t is not None and t.dtype not in _FLOATS:
            raise ShapeError(f"mamba_chunk_scan_combined: {name} is {t.dtype}; give it a float16, bfloat16 or "
                             f"float32 tensor")
    if seq_idx is not None and (seq_idx.dtype.is_floating_point or seq_idx.dtype.is_complex
                                or seq_idx.dtype == torch.bool):
        raise ShapeError(f"mamba_chunk_scan_combined: seq_idx is {seq_idx.dtype}; give it an integer tensor "
                         f"(torch.int32, mamba_ssm's)")
    devs = {k: str(t.device) for k, t in {"x": x, "dt": dt, "A": A, "B": B, "C": C, "seq_idx": seq_idx,
                                           **extra}.items() if t is not None}
    if len(set(devs.values())) > 1:
        raise DeviceError(f"mamba_chunk_scan_combined: the tensors must be on one device, got {devs}")
    lo, hi = (float(v) for v in dt_limit)
    if not lo <= hi or math.isnan(lo):
        raise ShapeError(f"mamba_chunk_scan_combined: dt_limit={dt_limit!r} must be (min, max) with min <= max")


def _check_supported(x: torch.Tensor, B: torch.Tensor, chunk_size: int, return_varlen_states: bool,
                     state_dtype: torch.dtype | None) -> None:
    """ShapeError for what mamba_ssm takes and ptsolve's forward does not, naming the alternative."""
    if return_varlen_states:
        raise ShapeError("mamba_chunk_scan_combined: return_varlen_states=True (each packed sequence's final state "
                         "from cu_seqlens) is not supported by ptsolve's SSD forward; use mamba_ssm's "
                         "mamba_chunk_scan_combined for it, or run the sequences as separate batch rows with "
                         "return_final_states=True")
    if state_dtype is not None and state_dtype != x.dtype:
        raise ShapeError(f"mamba_chunk_scan_combined: state_dtype={state_dtype} — ptsolve's ChunkScan kernel takes "
                         f"the inter-chunk states in x's dtype ({x.dtype}); pass state_dtype=None")
    if x.dtype not in (torch.float16, torch.bfloat16):
        raise ShapeError(f"mamba_chunk_scan_combined: x is {x.dtype}; ptsolve's kernels take torch.float16 or "
                         f"torch.bfloat16 (convert x, B, C with .half() or .bfloat16())")
    if torch.compiler.is_compiling():  # traced: the op's CUDA implementation meets the class check when it runs
        return
    from . import serve  # the kernels' classes: head_dim, d_state and chunk they cover

    try:
        serve.mamba_class("mamba2_chunk_scan", _DTYPE_NAMES[x.dtype], x.shape[-1], B.shape[-1], chunk_size)
    except ShapeError as e:
        raise ShapeError(f"mamba_chunk_scan_combined (headdim = x.shape[-1], dstate = B.shape[-1], chunk_size): "
                         f"{e}; mamba_ssm's mamba_chunk_scan_combined runs other sizes") from None
    if not x.is_cuda:
        raise DeviceError("mamba_chunk_scan_combined runs ptsolve's sm_90a kernels: give it CUDA tensors "
                          "(ptsolve.ssd.ssd_reference is the same forward in PyTorch, on any device)")


# ------------------------------------------------------------------------------------------------ the steps

def process_dt(dt: torch.Tensor, dt_bias: torch.Tensor | None, dt_softplus: bool,
               dt_limit: tuple[float, float]) -> torch.Tensor:
    """dt (..., h) as the forward uses it, float32: plus dt_bias (h,), through softplus (the identity above 20) when
    ``dt_softplus``, clamped to ``dt_limit`` (always: mamba_ssm's default (0, inf) makes a negative dt 0)."""
    d = dt.float()
    if dt_bias is not None:
        d = d + dt_bias.float()
    if dt_softplus:  # F.softplus is already the identity above its threshold: one kernel, not a compare and a where
        d = F.softplus(d, threshold=_SOFTPLUS_LINEAR)
    return d.clamp(min=float(dt_limit[0]), max=float(dt_limit[1]))


def chunk_cumsum(dt: torch.Tensor, A: torch.Tensor, chunk: int, dt_bias: torch.Tensor | None = None,
                 dt_softplus: bool = False, dt_limit: tuple[float, float] = (0.0, math.inf)
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """mamba_ssm's ``_chunk_cumsum_fwd``: dt (b, L, h) → (dt, dA_cumsum), both (b, h, nc, chunk) float32
    contiguous, nc = ceil(L / chunk): dt processed (``process_dt``) and 0 past L, dA_cumsum the running sum of dt·A
    within each chunk (flat past L)."""
    b, L, h = dt.shape
    nc = -(-L // chunk)
    d = process_dt(dt, dt_bias, dt_softplus, dt_limit)
    if nc * chunk != L:  # zeros after the clamp; F.pad copies even when it adds nothing
        d = F.pad(d, (0, 0, 0, nc * chunk - L))
    d = d.reshape(b, nc, chunk, h).permute(0, 3, 1, 2).contiguous()
    return d, torch.cumsum(d * A.float().view(1, h, 1, 1), dim=-1)


class SeqMasks(NamedTuple):
    """What ``seq_idx`` (b, L) masks, as mamba_ssm's kernels mask it (positions past L are sequence −1):
    ``state_keep`` (b, 1, nc, chunk): a position counts in its chunk's state iff it is in the chunk's last
    sequence (≥ 0); ``cb_keep`` (b, nc, 1, chunk, chunk): C_m·B_k counts iff m and k are in one sequence;
    ``c_keep`` (b, L, 1, 1): a position sees the entering state iff it is in the sequence the previous chunk ended in
    (sequence 0 for the first chunk); ``pass_keep`` (b, nc): a chunk's entering state carries on iff the chunk ends in
    the sequence the previous one ended in (0 before the first)."""

    state_keep: torch.Tensor
    cb_keep: torch.Tensor
    c_keep: torch.Tensor
    pass_keep: torch.Tensor


def seq_masks(seq_idx: torch.Tensor, chunk: int) -> SeqMasks:
    """The masks of ``seq_idx`` (b, L) for chunks of ``chunk`` positions (``SeqMasks``)."""
    b, L = seq_idx.shape
    nc = -(-L // chunk)
    s = F.pad(seq_idx.long(), (0, nc * chunk - L), value=-1).view(b, nc, chunk)
    ends = torch.clamp(torch.arange(nc, device=seq_idx.device) * chunk + chunk - 1, max=L - 1)
    last = seq_idx.long()[:, ends]  # (b, nc): the sequence each chunk ends in
    prev = F.pad(last[:, :-1], (1, 0), value=0)  # the one the previous chunk ended in; 0 before the first
    state_keep = ((s == last[..., None]) & (last[..., None] >= 0)).unsqueeze(1)
    cb_keep = (s[..., :, None] == s[..., None, :]).unsqueeze(2)
    c_keep = (s == prev[..., None]).view(b, nc * chunk)[:, :L, None, None]
    return SeqMasks(state_keep, cb_keep, c_keep, last == prev)


def state_passing(states: torch.Tensor, dA_cumsum: torch.Tensor, initial_states: torch.Tensor | None = None,
                  pass_keep: torch.Tensor | None = None, out_dtype: torch.dtype = torch.float32
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """mamba_ssm's ``_state_passing_fwd`` on float32 chunk states (b, nc, h, p, n), **in place**: chunk c's state
    becomes the state after chunk c, s_c = keep_c · exp(dA_cumsum[c, -1]) · s_{c−1} + states_c (s_{−1} =
    initial_states or 0; keep from ``pass_keep`` (b, nc), 1 without). Returns (entering, final): the states
    entering each chunk (b, nc, h, p, n) in ``out_dtype`` (s_{−1}, s_0, …, s_{nc−2}) and s_{nc−1} (b, h, p, n)
    float32. One multiply-add kernel per chunk: the running sum stays float32 (mamba_ssm's kernel keeps it so)."""
    b, nc, h, p, n = states.shape
    decay = torch.exp(dA_cumsum[..., -1].float())  # (b, h, nc)
    if pass_keep is not None:
        decay = decay * pass_keep[:, None, :].to(decay.dtype)
    decay = decay.permute(0, 2, 1).contiguous()[..., None, None]  # (b, nc, h, 1, 1)
    if initial_states is not None:
        states[:, 0].addcmul_(initial_states.float(), decay[:, 0])
    for c in range(1, nc):  # sequential by nature: chunk c needs c − 1's result
        states[:, c].addcmul_(states[:, c - 1], decay[:, c])
    entering = states.new_empty(states.shape, dtype=out_dtype)
    if initial_states is not None:
        entering[:, 0].copy_(initial_states)
    else:
        entering[:, 0].zero_()
    entering[:, 1:].copy_(states[:, :-1])
    return entering, states[:, -1].clone()


# whether torch.bmm takes out_dtype (the aten::bmm.dtype overload, torch >= 2.8; its kernel is CUDA's)
_BMM_OUT_DTYPE = hasattr(torch.ops.aten.bmm, "dtype")


def cb_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype ``chunk_bmm`` gives CB in for C and B of ``dtype``: ``geometry.mamba2.DEFAULT_CB_DTYPE`` (float32
    for bf16, fp16 for fp16: the ChunkScan class ptsolve runs by default), ``dtype`` itself for others."""
    from .geometry.mamba2 import CB_FP32, DEFAULT_CB_DTYPE

    name = _DTYPE_NAMES.get(dtype)
    return torch.float32 if name is not None and DEFAULT_CB_DTYPE[name] == CB_FP32 else dtype


def _bmm_float32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a (k, m, n) · b (k, n, p) → float32 (k, m, p), fp16/bf16 operands with float32 accumulation and output:
    cuBLAS's mixed-precision GEMM through torch.bmm's ``out_dtype`` on CUDA (no float32 copies of the operands, one
    kernel); elsewhere (a CPU, torch < 2.8) the same products in a float32 matmul of float32 copies."""
    if _BMM_OUT_DTYPE and a.is_cuda:
        return torch.bmm(a, b, out_dtype=torch.float32)
    return torch.bmm(a.float(), b.float())


def chunk_bmm(C: torch.Tensor, B: torch.Tensor, chunk: int, cb_keep: torch.Tensor | None = None,
              out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """CB = C·Bᵀ per chunk and group: C, B (b, L, g, n) → (b, nc, g, chunk, chunk) in ``out_dtype`` (None:
    ``cb_dtype(C.dtype)``; float32, or the inputs' dtype) with float32 accumulation and one rounding, rows and
    columns past L 0, zeroed where ``cb_keep`` is False. ShapeError for another ``out_dtype``."""
    b, L, g, n = C.shape
    out_dtype = cb_dtype(C.dtype) if out_dtype is None else out_dtype
    if out_dtype not in (C.dtype, torch.float32):
        raise ShapeError(f"chunk_bmm: out_dtype={out_dtype} must be torch.float32 or C's dtype {C.dtype}")
    nc = -(-L // chunk)
    pad = (0, 0, 0, 0, 0, nc * chunk - L)
    if nc * chunk != L:  # F.pad copies even when it adds nothing
        C, B = F.pad(C, pad), F.pad(B, pad)
    Cc = C.reshape(b, nc, chunk, g, n).permute(0, 1, 3, 2, 4)
    Bc = B.reshape(b, nc, chunk, g, n).permute(0, 1, 3, 4, 2)
    if out_dtype == C.dtype:
        cb = torch.matmul(Cc, Bc)
    else:  # (b·nc·g) matrices: a view of Cc where g is 1, Bc's transpose taken by the GEMM as it is
        cb = _bmm_float32(Cc.reshape(-1, chunk, n), Bc.reshape(-1, n, chunk)).view(b, nc, g, chunk, chunk)
    return cb.masked_fill_(~cb_keep, 0) if cb_keep is not None else cb


def skip_gate(out: torch.Tensor, x: torch.Tensor, D: torch.Tensor | None, z: torch.Tensor | None) -> torch.Tensor:
    """The epilogue: (out + D·x)·silu(z) in float32, returned in out's dtype (D (h,) or (h, p); each term only
    where given)."""
    if D is None and z is None:
        return out
    y = out.float()
    if D is not None:
        y = torch.addcmul(y, x.float(), (D.float()[:, None] if D.dim() == 1 else D.float()))
    if z is not None:
        y = y * F.silu(z.float())
    return y.to(out.dtype)


def ssd_forward(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, chunk: int,
                kernels: Kernels, D: torch.Tensor | None = None, z: torch.Tensor | None = None,
                dt_bias: torch.Tensor | None = None, initial_states: torch.Tensor | None = None,
                seq_idx: torch.Tensor | None = None, dt_softplus: bool = False,
                dt_limit: tuple[float, float] = (0.0, math.inf)) -> tuple[torch.Tensor, torch.Tensor]:
    """The SSD forward's steps on checked inputs, with ``kernels``' chunk state and chunk scan: (out (b, L, h, p) in
    x's dtype, final states (b, h, p, n) float32). See the module's docstring for what runs where."""
    b, L, h, p = x.shape
    n = B.shape[-1]
    if x.numel() == 0:  # no position: nothing to scan, the state is the initial one
        fin = initial_states.float().clone() if initial_states is not None else x.new_zeros((b, h, p, n),
                                                                                           dtype=torch.float32)
        return x.new_empty(x.shape), fin
    x, B, C = (t if t.is_contiguous() else t.contiguous() for t in (x, B, C))
    dtc, dA = chunk_cumsum(dt, A, chunk, dt_bias, dt_softplus, dt_limit)
    masks = seq_masks(seq_idx, chunk) if seq_idx is not None else None
    # seq_idx: a position outside its chunk's last sequence adds nothing to the chunk's state (dt there is 0)
    states = kernels.chunk_state(B, x, dtc * masks.state_keep if masks else dtc, dA)
    passing = kernels.state_passing or state_passing
    entering, final = passing(states, dA, initial_states, masks.pass_keep if masks else None, x.dtype)
    del states
    cb = chunk_bmm(C, B, chunk, masks.cb_keep if masks else None)
    # the kernel reads C only for the entering state's term: there, seq_idx keeps the previous chunk's sequence
    Cs = C.masked_fill(~masks.c_keep, 0) if masks else C
    if kernels.fused and (D is not None or z is not None):  # the D skip and z gate in the kernel's epilogue
        return kernels.chunk_scan(cb, x, dtc, dA, Cs, entering, D, z), final
    return skip_gate(kernels.chunk_scan(cb, x, dtc, dA, Cs, entering), x, D, z), final


def mamba_chunk_scan_combined(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                              chunk_size: int, D: torch.Tensor | None = None, z: torch.Tensor | None = None,
                              dt_bias: torch.Tensor | None = None, initial_states: torch.Tensor | None = None,
                              seq_idx: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None,
                              dt_softplus: bool = False, dt_limit: tuple[float, float] = (0.0, math.inf),
                              return_final_states: bool = False, return_varlen_states: bool = False,
                              state_dtype: torch.dtype | None = None) -> Any:
    """Mamba2's SSD forward with mamba_ssm's signature and results (see the module's docstring for the formula and
    what runs where): x (b, L, h, p) float16 or bfloat16 on an H100/H200; dt (b, L, h) and A (h,) any float dtype
    (computed in float32; A ≤ 0 as Mamba2's −exp(A_log)); B, C (b, L, g, n) in x's dtype; ``chunk_size`` positions
    per chunk (64, 128 or 256); D (h,) or (h, p); z like x; dt_bias (h,); initial_states (b, h, p, n);
    seq_idx (b, L) int, nondecreasing along L (packed sequences; the state restarts where it changes); dt_limit
    (min, max) clamps dt. Returns out (b, L, h, p) in x's dtype, and with ``return_final_states`` also the final
    states (b, h, p, n) float32. ``cu_seqlens`` is only read with ``return_varlen_states`` (as in mamba_ssm), which
    ptsolve does not support (ShapeError); ``state_dtype`` must be None or x's dtype. Head_dim 64, d_state 64 or 128.
    """
    _check_dims(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx)
    _check_types(x, dt, A, B, C, {"D": D, "z": z, "dt_bias": dt_bias, "initial_states": initial_states},
                 seq_idx, dt_limit)
    _check_supported(x, B, chunk_size, return_varlen_states, state_dtype)
    args = (x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, bool(dt_softplus),
            float(dt_limit[0]), float(dt_limit[1]))
    # under torch.compile the registered op (its fake gives the shapes); eagerly the same code without the dispatcher
    out, final = torch.ops.ptsolve.mamba_chunk_scan_combined(*args) if torch.compiler.is_compiling() else \
        _combined_cuda(*args)
    return (out, final) if return_final_states else out


# ------------------------------------------------------------------------------------------------ the torch op
# ptsolve::mamba_chunk_scan_combined, beside ptsolve.torch's ops in the same namespace (a fragment of it)

_LIB = torch.library.Library("ptsolve", "FRAGMENT")
_LIB.define("mamba_chunk_scan_combined(Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, int chunk_size, Tensor? D, "
            "Tensor? z, Tensor? dt_bias, Tensor? initial_states, Tensor? seq_idx, bool dt_softplus, float dt_min, "
            "float dt_max) -> (Tensor, Tensor)")


def _combined_cuda(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                   chunk_size: int, D: torch.Tensor | None, z: torch.Tensor | None, dt_bias: torch.Tensor | None,
                   initial_states: torch.Tensor | None, seq_idx: torch.Tensor | None, dt_softplus: bool,
                   dt_min: float, dt_max: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The op's CUDA implementation: (out, final states) of checked inputs (``mamba_chunk_scan_combined``)."""
    return ssd_forward(x, dt, A, B, C, chunk_size, PTSOLVE_KERNELS, D, z, dt_bias, initial_states, seq_idx,
                       dt_softplus, (dt_min, dt_max))


_LIB.impl("mamba_chunk_scan_combined", _combined_cuda, "CUDA")


@torch.library.register_fake("ptsolve::mamba_chunk_scan_combined", lib=_LIB)
def _(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, chunk_size: int,
      D: torch.Tensor | None, z: torch.Tensor | None, dt_bias: torch.Tensor | None,
      initial_states: torch.Tensor | None, seq_idx: torch.Tensor | None, dt_softplus: bool, dt_min: float,
      dt_max: float) -> tuple[torch.Tensor, torch.Tensor]:
    b, _, h, p = x.shape
    return x.new_empty(x.shape), x.new_empty((b, h, p, B.shape[-1]), dtype=torch.float32)


# ------------------------------------------------------------------------------------------------ the reference

_REF_ROWS = 128  # output positions per block of the quadratic reference: its (h, rows, L) decay matrix stays small


def _segments(seq_idx: torch.Tensor | None, b: int, L: int, device: torch.device) -> torch.Tensor:
    """(b, L): how many times the sequence changed up to each position (seq_{−1} = 0): two positions share a state
    iff their counts are equal; the initial state reaches the positions with count 0."""
    if seq_idx is None:
        return torch.zeros(b, L, dtype=torch.long, device=device)
    s = seq_idx.long()
    return torch.cumsum((s != F.pad(s[:, :-1], (1, 0), value=0)).long(), dim=1)


def _reference_row(x: torch.Tensor, d: torch.Tensor, cum: torch.Tensor, Bh: torch.Tensor, Ch: torch.Tensor,
                   seg: torch.Tensor, h0: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch row, float64: y (L, h, p) = Σ_{s ≤ t, same segment} (C_t·B_s)·exp(cum_t − cum_s)·dt_s·x_s
    (+ exp(cum_t)·C_t·h0ᵀ where the segment is 0) and the state after the last position (h, p, n)."""
    L = x.shape[0]
    y = torch.empty_like(x)
    for t0 in range(0, L, _REF_ROWS):
        t1 = min(L, t0 + _REF_ROWS)
        t, s = torch.arange(t0, t1, device=x.device), torch.arange(t1, device=x.device)
        keep = (s[None, :] <= t[:, None]) & (seg[t0:t1, None] == seg[None, :t1])  # (rows, s)
        diff = cum[t0:t1].T[:, :, None] - cum[:t1].T[:, None, :]  # (h, rows, s)
        decay = torch.exp(diff.masked_fill(~keep, -math.inf))
        w = torch.einsum("thn,shn->hts", Ch[t0:t1], Bh[:t1]) * decay * d[:t1].T[:, None, :]
        y[t0:t1] = torch.einsum("hts,shp->thp", w, x[:t1])
        if h0 is not None:
            e = torch.exp(cum[t0:t1]) * (seg[t0:t1] == 0)[:, None]  # (rows, h)
            y[t0:t1] += e[..., None] * torch.einsum("thn,hpn->thp", Ch[t0:t1], h0)
    wl = torch.exp(cum[-1][None, :] - cum) * d * (seg == seg[-1])[:, None]  # (L, h): weights into the last state
    final = torch.einsum("sh,shn,shp->hpn", wl, Bh, x)
    if h0 is not None and int(seg[-1]) == 0:
        final += torch.exp(cum[-1])[:, None, None] * h0
    return y, final


def ssd_reference(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                  chunk_size: int, D: torch.Tensor | None = None, z: torch.Tensor | None = None,
                  dt_bias: torch.Tensor | None = None, initial_states: torch.Tensor | None = None,
                  seq_idx: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None,
                  dt_softplus: bool = False, dt_limit: tuple[float, float] = (0.0, math.inf),
                  return_final_states: bool = False, return_varlen_states: bool = False,
                  state_dtype: torch.dtype | None = None) -> Any:
    """``mamba_chunk_scan_combined``'s forward in plain PyTorch on any device, for checking: the recurrence of the
    module's docstring in its quadratic form, computed in float64 and returned as float32 (out (b, L, h, p) and, with
    ``return_final_states``, the final states (b, h, p, n)). No chunks: the result does not depend on
    ``chunk_size`` (checked only as an int); seq_idx's segments are where it changes (nondecreasing: packed
    sequences). Memory: float64 (h, 128, L) per block of output rows."""
    _check_dims(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx)
    if return_varlen_states:
        raise ShapeError("ssd_reference: return_varlen_states=True is not supported (as mamba_chunk_scan_combined)")
    b, L, h, p = x.shape
    rep = h // B.shape[2]
    d = process_dt(dt, dt_bias, dt_softplus, dt_limit).double()
    cum = torch.cumsum(d * A.double(), dim=1)  # (b, L, h): float64, long sequences keep their precision
    Bh, Ch = (t.double().repeat_interleave(rep, dim=2) for t in (B, C))
    xd, seg = x.double(), _segments(seq_idx, b, L, x.device)
    out = torch.empty(b, L, h, p, dtype=torch.float64, device=x.device)
    final = torch.empty(b, h, p, B.shape[3], dtype=torch.float64, device=x.device)
    for i in range(b):
        h0 = initial_states[i].double() if initial_states is not None else None
        if L == 0:
            final[i] = h0 if h0 is not None else 0
            continue
        out[i], final[i] = _reference_row(xd[i], d[i], cum[i], Bh[i], Ch[i], seg[i], h0)
    if D is not None:
        out += xd * (D.double()[:, None] if D.dim() == 1 else D.double())
    if z is not None:
        out *= F.silu(z.double())
    out, final = out.float(), final.float()
    return (out, final) if return_final_states else out
