"""Benchmark suites as plain data: the PipeThreader paper's configurations."""
from __future__ import annotations

from typing import Any

from .ops import flash_attention, gemm, mamba2_chunk_scan, mamba2_chunk_state
from .opspec import Operator

LLAMA = {"llama3-8b": (32, 8), "llama3-70b": (64, 8)}
FA_SEQS = (512, 1024, 2048, 4096, 8192)
GEMMS = ((4096, 1024, 4096), (8192, 14336, 4096), (8192, 8192, 28672), (8192, 8192, 8192))
MAMBA_SEQS = (1024, 2048, 4096, 8192, 16384)


def paper() -> list[dict[str, Any]]:
    """Every configuration of the paper suite: name, op, parameters (plain data).

    ``FA{i}``, i = 10·model + 5·bs + seq (model 0 = LLaMA3-8B 32/8 heads, 1 = LLaMA3-70B 64/8; bs 0 = batch 1,
    1 = batch 64; seq 0..4 = 512 … 8192), head_dim 128, non-causal; ``FA{i}c`` the same shape causal.
    ``GEMM{k}``: the M×N×K shapes of GEMMS. Mamba2-1.3B (64 heads, head_dim 64, d_state 128, chunk 256,
    one group): ``CS{j}`` ChunkScan and ``ST{j}`` ChunkState, j = 5·bs + seq (seq 0..4 = 1k … 16k).
    The same names as baselines/configs.py, so predictions and measurements join on ``name``.
    """
    out: list[dict[str, Any]] = []
    for causal in (False, True):
        i = 0
        for model, (h, kv) in LLAMA.items():
            for b in (1, 64):
                for s in FA_SEQS:
                    out.append({"name": f"FA{i}" + ("c" if causal else ""), "op": "flash_attention", "model": model,
                                "params": {"batch": b, "heads": h, "kv_heads": kv, "seq": s, "head_dim": 128,
                                           "causal": causal}})
                    i += 1
    for k, (m, n, kk) in enumerate(GEMMS):
        out.append({"name": f"GEMM{k}", "op": "gemm", "params": {"M": m, "N": n, "K": kk}})
    for kind, tag in (("mamba2_chunk_scan", "CS"), ("mamba2_chunk_state", "ST")):
        j = 0
        for b in (1, 64):
            for s in MAMBA_SEQS:
                out.append({"name": f"{tag}{j}", "op": kind,
                            "params": {"batch": b, "seq": s, "heads": 64, "head_dim": 64, "d_state": 128,
                                       "chunk": 256, "groups": 1}})
                j += 1
    return out


SUITES = {"paper": paper}


def operator(cfg: dict[str, Any]) -> Operator:
    """The ptsolve operator of one suite entry."""
    p = dict(cfg["params"])
    return {"flash_attention": flash_attention, "gemm": gemm, "mamba2_chunk_scan": mamba2_chunk_scan,
            "mamba2_chunk_state": mamba2_chunk_state}[cfg["op"]](**p)
