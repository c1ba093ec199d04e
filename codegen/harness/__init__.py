"""The compiler's kernel harness: a plan's exact-shape kernel run on torch tensors, checked against a reference and
timed. ``codegen``'s own plugins use it (``tune_runner`` checks every candidate on a reduced shape and times it,
``profile`` launches on random inputs), and so do the GPU tests, the baselines and the bench studies.

Each operator's part is its own module (``gemm``, ``attention``, ``mamba2``, ``state_passing``: its ``run_*``
launcher, reference, check, random inputs, reduced shape and hand plan), registered with one line
(``common.register``); the functions here dispatch on the plan's operator through that table, and no code here names
an operator. The shape-generic kernels PyTorch users call are the serving layer's (``ptsolve.serve``), not this.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from . import attention, gemm, mamba2, ssm_step, state_passing  # noqa: F401  (each registers its operators)
from .attention import FA_TILING, FIXED, attention_ref, check_fa, run_attention, run_decode
from .common import HARNESS, TOL, OpHarness, entry, need, precompile, register, rel_err, time_many, time_ms
from .gemm import GEMM_TILING, check_gemm, run_gemm
from .mamba2 import (
    HAND,
    check_mamba,
    chunk_scan_reference,
    chunk_state_reference,
    run_chunk_scan,
    run_chunk_state,
    scan_inputs,
    state_inputs,
)


def random_args(ks: Any, seed: int = 0) -> dict[str, Any]:
    """Fresh random device tensors for every pointer a launch of ``ks`` (a KernelSource) takes, keyed as
    ``Loaded.launch`` wants them (outputs included, poisoned with NaN; the profile buffer excluded): what the
    profiler and the timing drivers launch on."""
    return entry(ks.op, "random_args")(ks.params, seed)


def reduced(plan: Any) -> Any:
    """``plan`` on the reduced shape ``check`` runs it at (GEMM 1000 x 768 x 1000; attention batch 1, the GQA ratio
    kept; Mamba2 batch 1, 8 heads a group, a ragged last chunk)."""
    return dataclasses.replace(plan, params=entry(plan.op, "reduced")(dict(plan.params)))


def check(op: str, label: str, plan: Any) -> dict[str, Any]:
    """Check ``plan``'s kernel on a reduced shape (``reduced``): the same plan, smaller sizes, a float32 / float64
    reference, the output poisoned with NaN."""
    return entry(op, "check")(label, plan)


def hand(op: str, params: dict[str, Any]) -> Any:
    """The hand-written plan of ``op`` at ``params`` that measurements compare against (attention: the FA3-order
    plan at FA3's tiling; GEMM: the 4-stage 128x256 tiling; Mamba2: the fastest tiling of our sweeps)."""
    return entry(op, "hand")(params)


__all__ = ["FA_TILING", "FIXED", "GEMM_TILING", "HAND", "HARNESS", "TOL", "OpHarness", "attention_ref", "check",
           "check_fa", "check_gemm", "check_mamba", "chunk_scan_reference", "chunk_state_reference", "entry", "hand",
           "need", "precompile", "random_args", "reduced", "register", "rel_err", "run_attention", "run_chunk_scan",
           "run_chunk_state", "run_decode", "run_gemm", "scan_inputs", "state_inputs", "time_many", "time_ms"]
