"""Hugging Face Mamba2 on mamba_ssm's path, the baseline of ``ptsolve.mamba2_model``: the same patched mixer (the
same glue: in_proj, conv1d, gated norm, out_proj, the cache) with mamba_ssm's Triton ``mamba_chunk_scan_combined``
for prefill and its Triton ``selective_state_update`` for decode, loaded as ``baselines.mamba2.load_kernels`` loads
them (without ``mamba_ssm/__init__.py`` and its CUDA extensions).

```python
from baselines.mamba2_model import patch_mamba_ssm
model = patch_mamba_ssm(Mamba2ForCausalLM(config).cuda().bfloat16().eval())
```
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from baselines.mamba2 import load_combined, load_kernels
from ptsolve.mamba2_model import Backend, patch


def load_state_update() -> Any:
    """mamba_ssm's Triton ``selective_state_update`` (``ops/triton/selective_state_update.py``)."""
    load_kernels()
    from mamba_ssm.ops.triton.selective_state_update import selective_state_update

    return selective_state_update


def _step_with(update: Any) -> Any:
    """``recurrent_step``'s signature over mamba_ssm's ``selective_state_update`` (its per-(head, p) dt, A, D,
    dt_bias given as stride-0 expansions, which its kernel reads once per head, as transformers and mamba_ssm's
    Mamba2.step pass them)."""
    def step(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
             C: torch.Tensor, D: torch.Tensor | None = None, z: torch.Tensor | None = None,
             dt_bias: torch.Tensor | None = None, dt_softplus: bool = False,
             dt_limit: tuple[float, float] = (0.0, math.inf)) -> torch.Tensor:
        _, h, p, n = state.shape
        if dt_bias is None:  # the kernel's tied-head_dim test reads dt_bias's strides
            dt_bias = dt.new_zeros(h)
        if not (dt_softplus and float(dt_limit[0]) <= 0.0 and float(dt_limit[1]) == math.inf):
            # the kernel has no clamp: give it dt already biased, through softplus and clamped (as ptsolve's step)
            d = dt.float() + dt_bias.float()
            d = F.softplus(d) if dt_softplus else d
            dt, dt_bias, dt_softplus = d.clamp(float(dt_limit[0]), float(dt_limit[1])), torch.zeros_like(
                dt_bias, dtype=torch.float32), False
        Dp = None if D is None else (D[:, None].expand(h, p) if D.dim() == 1 else D)
        return update(state, x, dt[..., None].expand(*dt.shape, p), A[:, None, None].expand(h, p, n), B, C, D=Dp,
                      z=z, dt_bias=dt_bias[:, None].expand(h, p), dt_softplus=dt_softplus)
    return step


def backend() -> Backend:
    """mamba_ssm's SSD for ``ptsolve.mamba2_model.patch``: its Triton chunked scan and state update."""
    return Backend("mamba_ssm", load_combined(), _step_with(load_state_update()))


def patch_mamba_ssm(model: Any) -> Any:
    """``model`` (a transformers Mamba2ForCausalLM) with its mixers on mamba_ssm's kernels; returns it."""
    return patch(model, backend())
