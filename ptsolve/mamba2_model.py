"""Hugging Face transformers' ``Mamba2ForCausalLM`` with its mixers' SSD on ptsolve: prefill through
``ptsolve.ssd.mamba_chunk_scan_combined`` (the chunked scan on ptsolve's kernels), decode through a recurrent step
(``recurrent_step``: ptsolve's decode-step kernel, one launch a layer and token).

```python
import torch
from transformers import Mamba2Config, Mamba2ForCausalLM
import ptsolve.mamba2_model as pm

model = pm.patch(Mamba2ForCausalLM(Mamba2Config(...)).cuda().bfloat16().eval())
with torch.no_grad():
    out = model.generate(input_ids, max_new_tokens=32)
```

``patch(model)`` replaces the ``forward`` of every ``Mamba2Mixer`` in ``model`` (that model's modules only: nothing
of transformers is changed) by one that computes what transformers' mixer computes around the SSD — the padding
mask, ``in_proj`` and its split into gate, xBC and dt, the depthwise causal conv1d and its activation (``F.conv1d`` on
the mixer's own weights, as transformers does where causal_conv1d is absent; the cache's conv state read and updated
as transformers does), the split of xBC into x, B, C, the model's own gated RMSNorm (``norm(y, gate)``: the z gate is
the norm's, so the SSD runs with z=None as transformers calls it) and ``out_proj`` — with the SSD itself from a
``Backend``:

- prefill (no previous state, or more than one new token): ``scan``, mamba_ssm's ``mamba_chunk_scan_combined``
  signature, called with the mixer's D, dt_bias, dt_softplus=True, dt_limit = ``time_step_limit``, the cache's state as
  ``initial_states`` and the final state written back into the cache (``update_recurrent_state``);
- decode (one token on a cache with a previous state): ``step``, ``recurrent_step``'s signature, the state updated
  in place in the cache (its address fixed, so a CUDA graph can hold the step). dt is clamped to
  ``time_step_limit`` there too, as in the prefill, so a token's output does not depend on whether it was prefilled
  or decoded; transformers' and mamba_ssm's decode steps skip that clamp (the same unless the config sets a
  ``time_step_limit`` other than the default (0, inf)).

``PTSOLVE`` is ptsolve's backend (``ptsolve.ssd.mamba_chunk_scan_combined`` and ``recurrent_step``: on CUDA the
``mamba2_ssm_step`` kernel, elsewhere ``step_torch``, PyTorch ops batched over heads and groups);
``baselines.mamba2_model`` builds mamba_ssm's from the same glue. Written against transformers 5.17's Mamba2 (the
mixer's ``forward(hidden_states, cache_params, attention_mask)`` and the cache's ``has_previous_state`` /
``update_conv_state`` / ``update_recurrent_state`` / ``layers[i].conv_states`` / ``recurrent_states``); ``patch`` checks
for them and raises ``ConfigError`` naming what is missing. Inference only (no autograd through the kernels): run the
model under ``torch.no_grad()``.
"""
from __future__ import annotations

import inspect
import math
import types
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from . import ssd
from .errors import ConfigError, ShapeError

__all__ = ["Backend", "PTSOLVE", "check_ptsolve", "patch", "recurrent_step", "step_kernel", "step_torch",
           "unpatch"]

_SOFTPLUS_LINEAR = 20.0  # softplus is the identity above 20 (mamba_ssm's and F.softplus's threshold)
_CACHE_API = ("has_previous_state", "update_conv_state", "update_recurrent_state")


class Geometry(NamedTuple):
    """A mixer's SSD sizes: heads, head_dim, n_groups, d_state (state_size), chunk (chunk_size), and the width
    num_heads·head_dim must equal (intermediate = expand·hidden_size)."""

    heads: int
    head_dim: int
    groups: int
    d_state: int
    chunk: int
    intermediate: int


class Backend(NamedTuple):
    """What the patched mixer calls for the SSD: ``scan`` (prefill; mamba_ssm's ``mamba_chunk_scan_combined``
    signature, returning (out, final states) with ``return_final_states``), ``step`` (decode; ``recurrent_step``'s
    signature, the state updated in place) and ``check`` (``Geometry`` → None, raising ``ShapeError`` for sizes the
    backend does not run; None: no check)."""

    name: str
    scan: Callable[..., Any]
    step: Callable[..., torch.Tensor]
    check: Callable[[Geometry], None] | None = None


def _dt(dt: torch.Tensor, dt_bias: torch.Tensor | None, dt_softplus: bool, dt_limit: tuple[float, float]
        ) -> torch.Tensor:
    """dt (b, h) as the step uses it, float32: plus dt_bias, through softplus (identity above 20) when asked,
    clamped to ``dt_limit`` (skipped where the clamp cannot change a softplus output: (≤ 0, inf))."""
    d = dt.float()
    if dt_bias is not None:
        d = d + dt_bias  # promoted to float32 inside the add: no separate conversion launch per step
        d = d if d.dtype == torch.float32 else d.float()  # a float64 bias: the step still computes in float32
    if dt_softplus:
        d = F.softplus(d, threshold=_SOFTPLUS_LINEAR)
    lo, hi = float(dt_limit[0]), float(dt_limit[1])
    if not (dt_softplus and lo <= 0.0 and hi == math.inf):
        d = d.clamp(min=lo, max=hi)
    return d


def _check_step(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                C: torch.Tensor, D: torch.Tensor | None, z: torch.Tensor | None, dt_bias: torch.Tensor | None
                ) -> None:
    """ShapeError naming the argument whose shape does not fit state (b, h, p, n)."""
    if state.dim() != 4 or B.dim() != 3:
        raise ShapeError(f"recurrent_step: state must be (batch, nheads, headdim, dstate) and B (batch, ngroups, "
                         f"dstate); got state {tuple(state.shape)}, B {tuple(B.shape)}")
    b, h, p, n = state.shape
    g = B.shape[1]
    if g < 1 or h % g:
        raise ShapeError(f"recurrent_step: nheads={h} must be a multiple of ngroups={g} (B's dim 1)")
    want = {"x": (x, (b, h, p)), "dt": (dt, (b, h)), "A": (A, (h,)), "B": (B, (b, g, n)), "C": (C, (b, g, n)),
            "z": (z, (b, h, p)), "dt_bias": (dt_bias, (h,))}
    for name, (t, shape) in want.items():
        if t is not None and tuple(t.shape) != shape:
            raise ShapeError(f"recurrent_step: {name} must be {shape} (state {tuple(state.shape)}), got "
                             f"{tuple(t.shape)}")
    if D is not None and tuple(D.shape) not in ((h,), (h, p)):
        raise ShapeError(f"recurrent_step: D must be (nheads,) = ({h},) or (nheads, headdim) = ({h}, {p}), got "
                         f"{tuple(D.shape)}")


def recurrent_step(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                   C: torch.Tensor, D: torch.Tensor | None = None, z: torch.Tensor | None = None,
                   dt_bias: torch.Tensor | None = None, dt_softplus: bool = False,
                   dt_limit: tuple[float, float] = (0.0, math.inf)) -> torch.Tensor:
    """One token of the SSM for every batch row and head, the state updated **in place**:

        dt = clamp(softplus?(dt + dt_bias), *dt_limit);  h = exp(dt·A)·h + dt·x ⊗ B;  y = (C·h + D·x)·silu(z)

    state (b, h, p, n) (float32 kept float32; another dtype is computed in float32 and stored back); x, z (b, h, p);
    dt (b, h); A, dt_bias (h,); B, C (b, g, n), head j reading group j // (h/g); D (h,) or (h, p). Returns y
    (b, h, p) in x's dtype.

    On CUDA tensors that ptsolve's decode-step kernel takes (``step_kernel``: x fp16/bf16, head_dim 64, d_state 64
    or 128, the state float32 or x's dtype and contiguous) it is one launch of that kernel (under ``torch.compile``
    the registered op ``torch.ops.ptsolve.mamba2_ssm_step``); otherwise, and on the CPU, ``step_torch``: PyTorch ops
    in float32, the reference."""
    _check_step(state, x, dt, A, B, C, D, z, dt_bias)
    if state.is_cuda:
        if torch.compiler.is_compiling():
            return torch.ops.ptsolve.mamba2_ssm_step(state, x, dt, A, B, C, D, z, dt_bias, bool(dt_softplus),
                                                     float(dt_limit[0]), float(dt_limit[1]))
        y = step_kernel(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit)
        if y is not None:
            return y
    return step_torch(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit)


def step_torch(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
               C: torch.Tensor, D: torch.Tensor | None = None, z: torch.Tensor | None = None,
               dt_bias: torch.Tensor | None = None, dt_softplus: bool = False,
               dt_limit: tuple[float, float] = (0.0, math.inf)) -> torch.Tensor:
    """``recurrent_step`` as PyTorch ops in float32 (checked inputs): the outer product and the C contraction as
    batched matmuls over (batch, group), every head of a group in one matrix, so no B or C is repeated per head."""
    b, h, p, n = state.shape
    g = B.shape[1]
    d = _dt(dt, dt_bias, dt_softplus, dt_limit)  # (b, h)
    work = state if state.dtype == torch.float32 and state.is_contiguous() else state.float().contiguous()
    work.mul_(torch.exp(d * A.float())[..., None, None])
    s = work.view(b * g, (h // g) * p, n)  # a group's heads stacked: one B row and one C column serve them all
    dx = (x * d[..., None]).float()  # (b, h, p) float32 (type promotion; a float64 x converted)
    s.baddbmm_(dx.reshape(b * g, -1, 1), B.float().reshape(b * g, 1, n))
    y = torch.bmm(s, C.float().reshape(b * g, n, 1)).view(b, h, p)
    if work is not state:
        state.copy_(work)
    if D is not None:
        y.addcmul_(x, D[:, None] if D.dim() == 1 else D)
    if z is not None:
        y.mul_(F.silu(z.float()))
    return y.to(x.dtype)


_STEP_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
_STEP_CLASSES: dict[tuple[torch.dtype, int, int], Any] = {}  # (x's dtype, head_dim, d_state) -> class or None


def _step_class(dtype: torch.dtype, p: int, n: int) -> Any:
    """The decode-step kernel's class (``serve.ssm_step_class``) for x's dtype, head_dim p and d_state n, or None
    where it has none; looked up once per triple (a decode step asks on every layer and token)."""
    key = (dtype, p, n)
    c = _STEP_CLASSES.get(key, False)
    if c is False:
        from . import serve  # the serving layer (the code generator behind it) only once a kernel runs

        try:
            c = serve.ssm_step_class(_STEP_DTYPES[dtype], p, n) if dtype in _STEP_DTYPES else None
        except ShapeError:
            c = None
        _STEP_CLASSES[key] = c
    return c


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` (b, r, k) in the layout the kernel's bulk copies read — rows of k contiguous, r·k apart, the batch stride
    a multiple of 8 elements (16 bytes), the address 16-byte aligned — copied only where it is not (the model's x, B
    and C are views of one conv output whose rows are, and are read where they are)."""
    s0, s1, s2 = t.stride()
    b, r, k = t.shape
    if s2 == 1 and (r == 1 or s1 == k) and (b == 1 or s0 % 8 == 0) and t.data_ptr() % 16 == 0:
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _param(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A per-head parameter (A, dt_bias, a (h,) D) as the kernel reads it: contiguous, float32 or x's dtype (another
    dtype converted to float32, as ``step_torch`` computes)."""
    if t is None:
        return None
    t = t if t.dtype in (torch.float32, dtype) else t.float()
    return t if t.is_contiguous() else t.contiguous()


def step_kernel(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                C: torch.Tensor, D: torch.Tensor | None = None, z: torch.Tensor | None = None,
                dt_bias: torch.Tensor | None = None, dt_softplus: bool = False,
                dt_limit: tuple[float, float] = (0.0, math.inf)) -> torch.Tensor | None:
    """``recurrent_step`` (checked inputs) as one launch of ptsolve's decode-step kernel (``serve.ssm_step``, on the
    current stream, no host sync), or None where the kernel does not take these inputs: x not fp16/bf16, (head_dim,
    d_state) outside its classes, the state neither float32 nor x's dtype or not contiguous and 16-byte aligned, B, C or
    z not in x's dtype, a tensor on another device. What it takes in another layout is copied first: x, z, B, C whose
    rows are not contiguous (``_rows``), dt whose heads are not, a (h, p) D not float32, dt, A, dt_bias or D in a third
    dtype (float32). y (b, h, p) is the one tensor a step allocates."""
    b, h, p, n = state.shape
    c = _step_class(x.dtype, p, n)
    if (c is None or state.dtype not in (torch.float32, x.dtype) or not state.is_contiguous()
            or state.data_ptr() % 16 or B.dtype != x.dtype or C.dtype != x.dtype
            or (z is not None and z.dtype != x.dtype)):
        return None
    dev = state.device  # a tensor elsewhere would be read through a foreign pointer: PyTorch says which one
    if any(t is not None and t.device != dev for t in (x, dt, A, B, C, D, z, dt_bias)):
        return None
    from . import serve

    x, B, C = _rows(x), _rows(B), _rows(C)
    z = None if z is None else _rows(z)
    dt = dt if dt.dtype in (torch.float32, x.dtype) else dt.float()
    dt = dt if h == 1 or dt.stride(1) == 1 else dt.contiguous()
    if D is not None and D.dim() == 2:  # its rows are bulk-copied with x's: float32, 16-byte aligned
        D = D.float().contiguous()
        D = D if D.data_ptr() % 16 == 0 else D.clone()
    else:
        D = _param(D, x.dtype)
    y = torch.empty((b, h, p), dtype=x.dtype, device=x.device)
    return serve.ssm_step(state, x, dt, _param(A, x.dtype), B, C, D, z, _param(dt_bias, x.dtype), bool(dt_softplus),
                          dt_limit, y, c)


# ptsolve::mamba2_ssm_step, beside ptsolve.ssd's op in the same namespace (a fragment of it): what recurrent_step
# calls under torch.compile, the state marked as written in place
_LIB = torch.library.Library("ptsolve", "FRAGMENT")
_LIB.define("mamba2_ssm_step(Tensor(a!) state, Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, Tensor? D, "
            "Tensor? z, Tensor? dt_bias, bool dt_softplus, float dt_min, float dt_max) -> Tensor")


def _step_op(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
             C: torch.Tensor, D: torch.Tensor | None, z: torch.Tensor | None, dt_bias: torch.Tensor | None,
             dt_softplus: bool, dt_min: float, dt_max: float) -> torch.Tensor:
    """The op's implementation: the kernel where it takes the inputs, else ``step_torch``."""
    args = (state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, (dt_min, dt_max))
    y = step_kernel(*args) if state.is_cuda else None
    return y if y is not None else step_torch(*args)


_LIB.impl("mamba2_ssm_step", _step_op, "CUDA")
_LIB.impl("mamba2_ssm_step", _step_op, "CPU")


@torch.library.register_fake("ptsolve::mamba2_ssm_step", lib=_LIB)
def _(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
      D: torch.Tensor | None, z: torch.Tensor | None, dt_bias: torch.Tensor | None, dt_softplus: bool, dt_min: float,
      dt_max: float) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def check_ptsolve(geo: Geometry) -> None:
    """ShapeError where ptsolve's SSD does not run a mixer of this geometry: heads not a multiple of n_groups, or
    (head_dim, d_state, chunk) outside the chunk kernels' classes (``ptsolve.serve.mamba_class``)."""
    from . import serve  # the kernels' classes (head_dim, d_state, chunk); the code generator only when one runs

    if geo.groups < 1 or geo.heads % geo.groups:
        raise ShapeError(f"Mamba2 with ptsolve: num_heads={geo.heads} must be a multiple of n_groups={geo.groups}")
    try:
        serve.mamba_class("mamba2_chunk_scan", "bf16", geo.head_dim, geo.d_state, geo.chunk)
    except ShapeError as e:
        raise ShapeError(f"Mamba2 with ptsolve (config head_dim={geo.head_dim}, state_size={geo.d_state}, "
                         f"chunk_size={geo.chunk}): {e}; run this model unpatched (transformers' own path)") from None


PTSOLVE = Backend("ptsolve", ssd.mamba_chunk_scan_combined, recurrent_step, check_ptsolve)


# ------------------------------------------------------------------------------------------------ the mixer

def _masked(t: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """transformers' ``apply_mask_to_padding_states``: padding positions (mask 0) zeroed, in t's dtype."""
    return t if attention_mask is None else (t * attention_mask[:, :, None]).to(t.dtype)


def _conv(mixer: Any, xbc: torch.Tensor, cache: Any, prev: bool) -> torch.Tensor:
    """The depthwise causal conv1d and its activation on xbc (b, conv_dim, L), as transformers runs it without
    causal_conv1d: one token on a previous state updates the cache's conv state in place and convolves it; otherwise
    the cache (if any) is given the new columns (``update_conv_state``: it keeps the last kernel-size of them and
    returns them behind the previous ones) and the last L outputs are kept."""
    L = xbc.shape[-1]
    w = mixer.conv1d.weight  # (conv_dim, 1, k)
    if prev and L == 1 and not cache.layers[mixer.layer_idx].record_past:
        state = cache.layers[mixer.layer_idx].conv_states[0]
        full = torch.cat([state, xbc], dim=-1).to(w.dtype)
        state.copy_(full[..., -state.shape[-1]:])
        out = F.conv1d(full, w, mixer.conv1d.bias, groups=w.shape[0])[..., -L:]
        return mixer.act(out).to(xbc.dtype)
    if cache is not None:
        xbc = cache.update_conv_state(xbc, mixer.layer_idx, conv_kernel_size=mixer.conv_kernel_size)
    out = F.conv1d(xbc.to(w.dtype), w, mixer.conv1d.bias, padding=w.shape[-1] - 1, groups=w.shape[0])
    out = mixer.act(out[..., :xbc.shape[-1]]).to(xbc.dtype)
    return out[..., -L:] if cache is not None else out


def _mixer_A(mixer: Any) -> torch.Tensor:
    """A = −exp(A_log) (h,) float32, kept on the mixer while A_log is the same tensor at the same version (an
    in-place update, a loaded state dict, bumps it): two or three launches a layer and token fewer in decode."""
    a = mixer.A_log
    if torch.compiler.is_compiling() or (a.requires_grad and torch.is_grad_enabled()):
        return -torch.exp(a.float())  # the graph computes it: nothing kept behind the compiler's or autograd's back
    key = (a.data_ptr(), a._version, a.dtype, a.device)
    got = mixer.__dict__.get("_ptsolve_A")
    if got is None or got[0] != key:
        got = mixer.__dict__["_ptsolve_A"] = (key, -torch.exp(a.float()))
    return got[1]


def _ssd(mixer: Any, backend: Backend, cache: Any, prev: bool, x: torch.Tensor, dt: torch.Tensor, B: torch.Tensor,
         C: torch.Tensor, seq_idx: torch.Tensor | None) -> torch.Tensor:
    """The SSD of x (b, L, h·p), dt (b, L, h), B, C (b, L, g·n) → y (b, L, h·p): ``backend.step`` on one token with
    a previous state, ``backend.scan`` otherwise (the cache's state in, the final state back into the cache; a
    model call's ``seq_idx`` (b, L), packed sequences, passed on to it as transformers passes it to mamba_ssm's)."""
    b, L, _ = x.shape
    h, p, g, n = mixer.num_heads, mixer.head_dim, mixer.n_groups, mixer.ssm_state_size
    A = _mixer_A(mixer)
    if prev and L == 1:
        state = cache.layers[mixer.layer_idx].recurrent_states[0]
        y = backend.step(state, x.view(b, h, p), dt.reshape(b, h), A, B.reshape(b, g, n), C.reshape(b, g, n),
                         D=mixer.D, z=None, dt_bias=mixer.dt_bias, dt_softplus=True,
                         dt_limit=mixer.time_step_limit)
        return y.reshape(b, 1, h * p)
    init = cache.layers[mixer.layer_idx].recurrent_states[0] if prev else None
    extra = {} if seq_idx is None else {"seq_idx": seq_idx}
    got = backend.scan(x.view(b, L, h, p), dt, A, B.view(b, L, g, n), C.view(b, L, g, n), mixer.chunk_size,
                       D=mixer.D, z=None, dt_bias=mixer.dt_bias, initial_states=init, dt_softplus=True,
                       dt_limit=mixer.time_step_limit, return_final_states=cache is not None, **extra)
    if cache is not None:
        got, final = got
        cache.update_recurrent_state(final, layer_idx=mixer.layer_idx)
    return got.reshape(b, L, h * p)


def _mixer_forward(self: Any, hidden_states: torch.Tensor, cache_params: Any = None,
                   attention_mask: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor:
    """transformers 5.17's ``Mamba2Mixer.forward`` (inference) with the SSD from ``self._ptsolve_backend``:
    hidden_states (b, L, hidden) → (b, L, hidden) in its dtype."""
    dtype = hidden_states.dtype
    prev = cache_params is not None and cache_params.has_previous_state(self.layer_idx)
    proj = self.in_proj(_masked(hidden_states, attention_mask))
    gate, xbc, dt = proj.split([self.intermediate_size, self.conv_dim, self.num_heads], dim=-1)
    xbc = _masked(_conv(self, xbc.transpose(1, 2), cache_params, prev).transpose(1, 2), attention_mask)
    gn = self.n_groups * self.ssm_state_size
    x, B, C = torch.split(xbc, [self.intermediate_size, gn, gn], dim=-1)
    y = _ssd(self, self._ptsolve_backend, cache_params, prev, x, dt, B, C, kwargs.get("seq_idx"))
    return self.out_proj(self.norm(y, gate).to(dtype))


def geometry(mixer: Any) -> Geometry:
    """A ``Mamba2Mixer``'s SSD sizes."""
    return Geometry(int(mixer.num_heads), int(mixer.head_dim), int(mixer.n_groups), int(mixer.ssm_state_size),
                    int(mixer.chunk_size), int(mixer.intermediate_size))


def _mixer_class() -> type:
    """transformers' ``Mamba2Mixer``, after checking that its forward and the cache have the API the patched forward
    is written against (transformers 5.17's)."""
    try:
        from transformers import DynamicCache
        from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer
    except ImportError as e:
        raise ConfigError(f"ptsolve.mamba2_model.patch needs transformers with Mamba2 (5.17): {e}") from None
    missing = [a for a in _CACHE_API if not hasattr(DynamicCache, a)]
    if "cache_params" not in inspect.signature(Mamba2Mixer.forward).parameters:
        missing.append("Mamba2Mixer.forward(cache_params=...)")
    if missing:
        import transformers
        raise ConfigError(f"ptsolve.mamba2_model.patch is written against transformers 5.17's Mamba2; transformers "
                          f"{transformers.__version__} lacks {missing}: install transformers==5.17.*")
    return Mamba2Mixer


def patch(model: Any, backend: Backend = PTSOLVE) -> Any:
    """``model`` (a transformers ``Mamba2ForCausalLM`` / ``Mamba2Model``, or any module holding ``Mamba2Mixer``\\ s)
    with every mixer's forward replaced by the one of this module's docstring, its SSD from ``backend`` (ptsolve's
    by default); returns ``model`` (patched in place; ``unpatch`` undoes it). Each mixer is checked first
    (ShapeError naming the config field: num_heads·head_dim ≠ expand·hidden_size, num_heads not a multiple of
    n_groups, and ``backend.check``'s sizes), so nothing is patched if one fails. ConfigError if ``model`` has no
    Mamba2Mixer or transformers is not the 5.17 API."""
    cls = _mixer_class()
    mixers = [m for m in model.modules() if isinstance(m, cls)]
    if not mixers:
        raise ConfigError(f"ptsolve.mamba2_model.patch: {type(model).__name__} holds no Mamba2Mixer; give it a "
                          f"transformers Mamba2ForCausalLM or Mamba2Model")
    for m in mixers:
        geo = geometry(m)
        if geo.heads * geo.head_dim != geo.intermediate:
            raise ShapeError(f"Mamba2 layer {m.layer_idx}: num_heads·head_dim = {geo.heads}·{geo.head_dim} must "
                             f"equal expand·hidden_size = {geo.intermediate}; fix the config's num_heads")
        if geo.groups < 1 or geo.heads % geo.groups:
            raise ShapeError(f"Mamba2 layer {m.layer_idx}: num_heads={geo.heads} must be a multiple of "
                             f"n_groups={geo.groups}")
        if backend.check is not None:
            backend.check(geo)
    fwd = _with_hooks(_mixer_forward)
    for m in mixers:
        m._ptsolve_backend = backend
        m.forward = types.MethodType(fwd, m)
    return model


def _with_hooks(fwd: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``fwd`` under transformers' ``force_accelerate_hooks("conv1d")``, as its mixer's forward is: the conv's
    weights are read directly, so an offloaded model's accelerate hook must bring them in first."""
    try:
        from transformers.integrations.accelerate import force_accelerate_hooks
    except ImportError:  # an older layout: no such hooks to fire
        return fwd
    return force_accelerate_hooks("conv1d")(fwd)


def unpatch(model: Any) -> Any:
    """``model`` with the mixers ``patch`` replaced back on transformers' own forward; returns ``model``."""
    for m in model.modules():
        if hasattr(m, "_ptsolve_backend"):
            del m.forward, m._ptsolve_backend
            m.__dict__.pop("_ptsolve_A", None)
    return model
