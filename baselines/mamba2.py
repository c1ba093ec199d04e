"""Mamba2 ChunkScan and ChunkState baselines: the official Triton kernels from ``mamba-ssm``.

Only ``mamba_ssm.ops.triton.*`` is used. ``mamba_ssm/__init__.py`` imports the package's CUDA extensions
(``selective_scan_cuda`` ...), which a wheel built with the CUDA build skipped does not have, so
:func:`load_kernels` registers a bare package module for ``mamba_ssm`` whose ``__path__`` is the installed
package folder (found with ``importlib.util.find_spec``, which does not execute ``__init__``); the
submodules then import normally and ``mamba_ssm/__init__.py`` never runs. (``ops/``, ``ops/triton/`` and
``utils/`` have empty ``__init__`` files.) No file of the package is changed.

Inputs are built as ``mamba_chunk_scan_combined`` builds them (``_mamba_chunk_scan_combined_fwd``):
dt and dA_cumsum by ``_chunk_cumsum_fwd`` (dt_bias, softplus), per-chunk states by ``_chunk_state_fwd``,
the states entering each chunk by ``_state_passing_fwd`` (in the input dtype), CB by ``_bmm_chunk_fwd``
(float32). Then only ``_chunk_scan_fwd`` (ChunkScan) or only ``_chunk_state_fwd`` (ChunkState) is timed.
ChunkScan runs with D=None and z=None: the paper's ChunkScan has no skip or gate term, and the FLOP
formula in ``configs`` counts none.

The kernels are autotuned on (chunk_size, hdim, dstate) only, so the first shape seen would fix the
tile config for every batch and seq; :func:`reset_autotune` clears that cache so each timed shape is
tuned for itself (the baseline's best case).

:func:`compare` times ptsolve's generated kernels next to these, on the same inputs in one process (the paper
round's Mamba2 rows, ``python -m bench round``).
"""

from __future__ import annotations

import importlib.util
import math
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from codegen.harness import rel_err, time_many
from codegen.harness.mamba2 import (
    SCAN,
    chunk_scan_reference,
    chunk_state_reference,
    output,
    runner,
    scan_inputs,
    state_inputs,
)


def load_kernels() -> types.SimpleNamespace:
    """Import the mamba-ssm Triton ops without running ``mamba_ssm/__init__.py``."""
    if "mamba_ssm" not in sys.modules:
        spec = importlib.util.find_spec("mamba_ssm")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("mamba_ssm is not installed (see baselines/build_mamba_wheel.sh)")
        pkg = types.ModuleType("mamba_ssm")
        pkg.__path__ = list(spec.submodule_search_locations)
        sys.modules["mamba_ssm"] = pkg
    from mamba_ssm.ops.triton import ssd_bmm, ssd_chunk_scan, ssd_chunk_state, ssd_state_passing

    return types.SimpleNamespace(
        chunk_cumsum_fwd=ssd_chunk_state._chunk_cumsum_fwd,
        chunk_state_fwd=ssd_chunk_state._chunk_state_fwd,
        state_passing_fwd=ssd_state_passing._state_passing_fwd,
        bmm_chunk_fwd=ssd_bmm._bmm_chunk_fwd,
        chunk_scan_fwd=ssd_chunk_scan._chunk_scan_fwd,
        chunk_scan_kernel=ssd_chunk_scan._chunk_scan_fwd_kernel,
        chunk_state_kernel=ssd_chunk_state._chunk_state_fwd_kernel,
        chunk_scan_ref=ssd_chunk_scan.chunk_scan_ref,
        chunk_state_ref=ssd_chunk_state.chunk_state_ref,
    )


def load_combined() -> Callable[..., Any]:
    """mamba_ssm's whole SSD forward, ``mamba_chunk_scan_combined`` (``ops/triton/ssd_combined.py``: its optional
    causal_conv1d import falls back to None), imported as ``load_kernels`` imports the steps."""
    load_kernels()
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

    return mamba_chunk_scan_combined


def reset_autotune(kernel: Any) -> None:
    """Forget a Triton autotuner's choices so the next launch tunes for its own shape."""
    cache = getattr(kernel, "cache", None)
    if isinstance(cache, dict):
        cache.clear()


def best_config(kernel: Any) -> str:
    """The autotuner's chosen config as text ('' if unknown)."""
    cfg = getattr(kernel, "best_config", None)
    return str(cfg) if cfg is not None else ""


@dataclass
class Inputs:
    """Device tensors for one shape. Shapes: x (b, L, h, p); B, C (b, L, g, n); dt, dA_cumsum (b, h, c, Q),
    float32; states (b, c, h, p, n) float32 (ChunkState's output); prev_states (b, c, h, p, n) in x's
    dtype (ChunkScan's input); CB (b, c, g, Q, Q) float32."""

    x: Any
    B: Any
    C: Any
    dt: Any
    dA_cumsum: Any
    states: Any
    prev_states: Any
    CB: Any


def make_inputs(
    k: types.SimpleNamespace,
    batch: int,
    seq: int,
    heads: int,
    head_dim: int,
    d_state: int,
    chunk: int,
    ngroups: int,
    dtype: Any,
    seed: int = 0,
) -> Inputs:
    """Random Mamba2-like inputs, then the preprocessing kernels of ``_mamba_chunk_scan_combined_fwd``.

    Values follow Mamba2's initialisation: A = -uniform(1, 16), dt_bias = softplus^-1 of a log-uniform
    dt in [1e-3, 1e-1], raw dt ~ N(0, 1) through softplus.
    """
    import torch
    from einops import rearrange

    g = torch.Generator(device="cuda").manual_seed(seed)
    dev = "cuda"
    x = torch.randn(batch, seq, heads, head_dim, device=dev, dtype=dtype, generator=g)
    bm = torch.randn(batch, seq, ngroups, d_state, device=dev, dtype=dtype, generator=g)
    cm = torch.randn(batch, seq, ngroups, d_state, device=dev, dtype=dtype, generator=g)
    dt_raw = torch.randn(batch, seq, heads, device=dev, dtype=dtype, generator=g)
    a = -(1 + 15 * torch.rand(heads, device=dev, generator=g))
    dt0 = torch.exp(torch.rand(heads, device=dev, generator=g) * (math.log(1e-1) - math.log(1e-3)) + math.log(1e-3))
    dt_bias = dt0 + torch.log(-torch.expm1(-dt0))  # inverse softplus

    dA_cumsum, dt = k.chunk_cumsum_fwd(dt_raw, a, chunk, dt_bias=dt_bias, dt_softplus=True)
    states = k.chunk_state_fwd(bm, x, dt, dA_cumsum, states_in_fp32=True)
    prev, _final = k.state_passing_fwd(
        rearrange(states, "... p n -> ... (p n)"), dA_cumsum[:, :, :, -1], chunk_size=chunk, out_dtype=cm.dtype
    )
    prev = rearrange(prev, "... (p n) -> ... p n", n=d_state)
    cb = k.bmm_chunk_fwd(cm, bm, chunk, output_dtype=torch.float32)
    torch.cuda.synchronize()
    return Inputs(x=x, B=bm, C=cm, dt=dt, dA_cumsum=dA_cumsum, states=states, prev_states=prev, CB=cb)


def chunk_scan_fn(k: types.SimpleNamespace, inp: Inputs) -> Callable[[], Any]:
    """The timed ChunkScan call: one ``_chunk_scan_fwd`` launch; returns ``out`` (b, L, h, p)."""
    return lambda: k.chunk_scan_fwd(inp.CB, inp.x, inp.dt, inp.dA_cumsum, inp.C, inp.prev_states)[0]


def chunk_state_fn(k: types.SimpleNamespace, inp: Inputs) -> Callable[[], Any]:
    """The timed ChunkState call: one ``_chunk_state_fwd`` launch into a preallocated float32 buffer."""
    import torch

    out = torch.empty_like(inp.states)
    return lambda: k.chunk_state_fwd(inp.B, inp.x, inp.dt, inp.dA_cumsum, states=out, states_in_fp32=True)


def chunk_state_ref(inp: Inputs) -> Any:
    """States from the formula (``codegen.harness.chunk_state_reference``, float64)."""
    return chunk_state_reference(inp.x, inp.B, inp.dt, inp.dA_cumsum)


def chunk_scan_ref(inp: Inputs) -> Any:
    """ChunkScan from the formula (``codegen.harness.chunk_scan_reference``, float64) on the kernel's own inputs,
    CB included."""
    return chunk_scan_reference(inp.CB, inp.x, inp.dt, inp.dA_cumsum, inp.C, inp.prev_states)


def check(k: types.SimpleNamespace, kind: str, dtype: Any, seq: int = 700, seed: int = 1) -> float:
    """Relative Frobenius error of the ChunkScan or ChunkState kernel against its float32 reference.

    Small shape with a ragged seq (700, not a multiple of the 256 chunk) and 2 groups of heads.
    """
    inp = make_inputs(
        k, batch=2, seq=seq, heads=4, head_dim=64, d_state=128, chunk=256, ngroups=2, dtype=dtype, seed=seed
    )
    if kind == "chunk_scan":
        return rel_err(chunk_scan_fn(k, inp)(), chunk_scan_ref(inp))
    return rel_err(chunk_state_fn(k, inp)(), chunk_state_ref(inp))


def check_reference(k: types.SimpleNamespace, kind: str, seed: int = 2) -> float:
    """Relative error between this module's float32 reference and mamba-ssm's own ``*_ref`` function fed
    float32 inputs (seq 768, a multiple of the chunk, which the library's reference requires).

    A check of the check: the two are written independently.
    """
    import torch

    inp = make_inputs(
        k, batch=2, seq=768, heads=4, head_dim=64, d_state=128, chunk=256, ngroups=2, dtype=torch.float16, seed=seed
    )
    if kind == "chunk_scan":
        lib = k.chunk_scan_ref(
            inp.B.float(), inp.C.float(), inp.x.float(), inp.dt, inp.dA_cumsum, inp.prev_states.float()
        )
        return rel_err(chunk_scan_ref(inp), lib)
    lib = k.chunk_state_ref(inp.B.float(), inp.x.float(), inp.dt, inp.dA_cumsum)
    return rel_err(chunk_state_ref(inp), lib)


def last_batch_consistency(k: types.SimpleNamespace, kind: str, inp: Inputs, full_out: Any) -> float:
    """Relative error between the last batch element of a full-size run and a batch-1 run on that element.

    Catches index overflow at large shapes (the largest offsets belong to the last batch element)
    without a float32 reference of the full tensor.
    """
    one = Inputs(
        *(
            t[-1:].contiguous()
            for t in (inp.x, inp.B, inp.C, inp.dt, inp.dA_cumsum, inp.states, inp.prev_states, inp.CB)
        )
    )
    fn = chunk_scan_fn(k, one) if kind == "chunk_scan" else chunk_state_fn(k, one)
    return rel_err(full_out[-1:], fn())


# mamba_ssm 2.3.2's Triton kernels index in int32: at batch 64, seq 16k (x of 2^32 elements) ChunkScan faults and
# ChunkState returns wrong states (the baselines' GPU run, baselines/run_gpu.py), so compare() does not run them past
# this size
TRITON_MAX_ELEMENTS = 1 << 31


def compare(plans: dict[str, Any], nsets: int = 2, triton: bool = True, graphs: bool = True
            ) -> dict[str, Any]:
    """Median milliseconds per call of each plan's kernel (all plans of one op and shape) and, when ``triton``,
    of mamba_ssm's ``_chunk_scan_fwd`` / ``_chunk_state_fwd`` (autotune reset for this shape) in one
    ``codegen.harness.time_many`` call on the same ``nsets`` input sets, replayed from CUDA graphs when ``graphs``
    (at batch 1 both wrappers' Python costs more than the kernel); the Triton kernel gets the same cb (in the
    dtype) as ours. Every output at the full shape is checked too: its last batch element (the largest offsets)
    against the float64 reference of that element. Returns {"ms": {label: ms}, "rel_err_vs_triton": {label: error
    on set 0}, "rel_err_last_batch": {label: error vs the reference}, "triton_error": why the baseline is
    missing, or None}."""
    import torch

    ops = {(pl.op, repr(sorted(pl.params.items()))) for pl in plans.values()}
    if len(ops) != 1:
        raise ValueError(f"compare() takes plans of one op and shape; got {sorted(ops)}")
    first = next(iter(plans.values()))
    run = runner(first.op)
    make = scan_inputs if first.op == SCAN else state_inputs
    sets = [make(first.params) for _ in range(nsets)]
    outs = {k: output(pl, sets[0], 0.0) for k, pl in plans.items()}  # one buffer per plan: CS9's x is 8.6 GB
    fns: dict[str, Any] = {k: (lambda i, pl=pl, o=outs[k]: run(**sets[i], plan=pl, out=o)) for k, pl in plans.items()}
    res: dict[str, Any] = {"ms": {}, "rel_err_vs_triton": {}, "rel_err_last_batch": {}, "triton_error": None}
    tri_out: list[Any] = [None]
    if triton and sets[0]["x"].numel() > TRITON_MAX_ELEMENTS:
        res["triton_error"] = (f"not run: x has {sets[0]['x'].numel()} elements, past the int32 indexing of "
                               "mamba_ssm's Triton kernels (they fault or return wrong states there)")
    elif triton:
        try:
            kern = load_kernels()
            if first.op == SCAN:
                reset_autotune(kern.chunk_scan_kernel)

                def tri(i: int) -> Any:
                    s = sets[i]
                    tri_out[0] = kern.chunk_scan_fwd(s["cb"], s["x"], s["dt"], s["dA_cumsum"], s["C"], s["states"])[0]
            else:
                reset_autotune(kern.chunk_state_kernel)
                tout = output(first, sets[0], 0.0)

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
