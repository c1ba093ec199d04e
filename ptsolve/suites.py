"""Benchmark suites as plain data: the PipeThreader paper's configurations, and held-out ones it does not have."""
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


def heldout() -> list[dict[str, Any]]:
    """Configurations of the model families users run (../shared/shapes.md) that the paper suite lacks, for the
    greedy-vs-exact study with the compiler in the loop (issue "Exact means exact"): attention at head_dim 64, 96,
    128 and 256, MHA, GQA and MQA, ragged and bottom-right (seq_q < seq_kv) shapes; skinny, odd and mid-size GEMMs;
    Mamba2 chunk kernels of other models, chunks and state sizes. ``HA*`` attention, ``HG*`` GEMM, ``HC*`` ChunkScan,
    ``HS*`` ChunkState."""
    fa = [(4, 28, 4, 3000, 3000, 128, False), (16, 14, 2, 1000, 1000, 64, True), (4, 12, 12, 511, 511, 64, False),
          (1, 71, 1, 2047, 2047, 64, True), (4, 32, 32, 1000, 1000, 96, False), (2, 8, 4, 4097, 4097, 256, True),
          (1, 32, 8, 128, 4096, 128, True), (8, 64, 8, 777, 777, 128, True)]
    out: list[dict[str, Any]] = [
        {"name": f"HA{i}", "op": "flash_attention",
         "params": {"batch": b, "heads": h, "kv_heads": kv, "seq_q": sq, "seq_kv": skv, "head_dim": d, "causal": c}}
        for i, (b, h, kv, sq, skv, d, c) in enumerate(fa)]
    out += [{"name": f"HG{i}", "op": "gemm", "params": {"M": m, "N": n, "K": k}}
            for i, (m, n, k) in enumerate(((16, 14336, 4096), (1000, 1000, 1000), (333, 4096, 4096),
                                           (4096, 1024, 4096)))]
    ssm = [("HC0", "mamba2_chunk_scan", 4, 2048, 24, 128, 256), ("HC1", "mamba2_chunk_scan", 8, 1024, 32, 64, 128),
           ("HS0", "mamba2_chunk_state", 2, 4096, 48, 128, 256), ("HS1", "mamba2_chunk_state", 16, 1000, 24, 128, 64)]
    out += [{"name": n, "op": op, "params": {"batch": b, "seq": s, "heads": h, "head_dim": 64, "d_state": ds,
                                             "chunk": ch, "groups": 1}}
            for n, op, b, s, h, ds, ch in ssm]
    return out


SUITES = {"heldout": heldout, "paper": paper}


def operator(cfg: dict[str, Any]) -> Operator:
    """The ptsolve operator of one suite entry."""
    p = dict(cfg["params"])
    return {"flash_attention": flash_attention, "gemm": gemm, "mamba2_chunk_scan": mamba2_chunk_scan,
            "mamba2_chunk_state": mamba2_chunk_state}[cfg["op"]](**p)
