"""Mamba2 ChunkScan's fused epilogues and the dtype it reads CB in, shared by its graph builder
(ptsolve.ops.chunk_scan), its emitter (codegen.cuda.chunk_scan), the serving layer's classes and ptsolve.ssd."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# mamba_ssm's D skip and z gate in ChunkScan's store, out = (out + D·x)·silu(z): "D" D per head, "Dp" D per
# (head, p), "z" the gate alone, and both; no epilogue is the parameter's absence
EPILOGUES = ("D", "Dp", "z", "Dz", "Dpz")

# ChunkScan's ``cb_dtype``: CB = C·Bᵀ read as float32 ("fp32": rounded once, when the decayed P = CB·exp(ΔdA)·dt
# is packed for the wgmma, as mamba_ssm's chunk scan does) or in the input dtype (the parameter's absence: CB
# rounded to it by the matmul, then P rounded again)
CB_FP32 = "fp32"

# What the serving layer and ptsolve.ssd use unless told otherwise, per input dtype, priced on Mamba2-370m's widths
# (32 heads, batch 2, seq 1000, |y| up to 111; the chunk scan in PyTorch with its roundings, against float64) and by
# the cost model (the table's representative, Mamba2-1.3b's heads at batch 4, seq 8k, CP-SAT with the compiler):
# - bf16: float32. Rounding CB and then P raises the chunk scan's RMS error by 21% (0.0035 -> 0.0042), and the whole
#   forward's max error was 2.2x mamba_ssm's (0.688 vs 0.312, H200), which rounds P once: worth the cost below.
# - fp16: fp16. The double rounding costs the same 21% of RMS (0.00043 -> 0.00052) but at an 8x finer grain (11
#   significand bits to 8): ~7x below bf16's one-rounding error, the max error unchanged (0.034, set by the output's
#   own rounding); float32 CB would cost 3-18% of the chunk scan's predicted time (n64: q64 250 -> 285 us, q128 343
#   -> 353, q256 425 -> 484; n128: q64 342 -> 377, q128 390 -> 443, q256 488 -> 575), the CB tile's bytes doubled.
#   fp16 with float32 CB is a class of its own (ptsolve.torch's mamba_chunk_scan runs it for a float32 cb).
DEFAULT_CB_DTYPE = {"bf16": CB_FP32, "fp16": "fp16"}


def cb_bytes(p: Mapping[str, Any]) -> int:
    """Bytes of one CB element the kernel reads for parameters ``p`` (4 for float32 CB, else 2)."""
    return 4 if p.get("cb_dtype") == CB_FP32 else 2


def cb_box_cols(p: Mapping[str, Any]) -> int:
    """Columns of one CB TMA box: a 128-byte swizzled row (64 fp16/bf16 values, 32 float32 ones)."""
    return 128 // cb_bytes(p)
