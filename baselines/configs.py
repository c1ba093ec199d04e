"""The paper's benchmark suite for the baselines: ptsolve.suites.paper() flattened, with the FLOP count used for
TFLOP/s (the operator's ``useful_flops`` from ptsolve.ops, so predictions and measurements count alike).

TFLOP/s = ``flops / (median_ms * 1e9)``.

FlashAttention numbering (forward pass, head_dim 128, self-attention with seq_q == seq_kv):
``FA{i}`` with ``i = 10 * model + 5 * bs + seq`` where
model 0 = LLaMA3-8B (32 q heads, 8 kv heads), 1 = LLaMA3-70B (64 q heads, 8 kv heads);
bs 0 = batch 1, 1 = batch 64; seq 0..4 = 512, 1024, 2048, 4096, 8192. So FA0-FA4 are 8B/BS1,
FA5-FA9 8B/BS64, FA10-FA14 70B/BS1, FA15-FA19 70B/BS64, seq increasing within each group of five.
``FA_CONFIGS`` holds these 20 shapes non-causal; ``FA_CAUSAL_CONFIGS`` holds the same 20 shapes causal,
named ``FA{i}c`` (the paper plots the causal and non-causal cases as two panels over FA0-FA19).

Mamba2-1.3B (64 heads, head_dim 64, d_state 128, chunk 256, ngroups 1): ``CS{j}`` (ChunkScan) and
``ST{j}`` (ChunkState) with ``j = 5 * bs + seq``, bs 0 = batch 1, 1 = batch 64, seq 0..4 = 1k, 2k, 4k, 8k, 16k.

GEMM: ``GEMM{k}`` for the four M x N x K shapes of ptsolve.suites.GEMMS, in that order.
"""

from __future__ import annotations

from typing import Any

from ptsolve.suites import operator, paper

Config = dict[str, Any]
KIND = {"flash_attention": "attention", "gemm": "gemm", "mamba2_chunk_scan": "chunk_scan",
        "mamba2_chunk_state": "chunk_state"}


def _flat(entry: dict[str, Any]) -> Config:
    """One suite entry in the flat form the baselines use (lower-case m/n/k, ngroups)."""
    p = dict(entry["params"])
    if entry["op"] == "gemm":
        p = {"m": p["M"], "n": p["N"], "k": p["K"]}
    elif entry["op"].startswith("mamba2"):
        p["ngroups"] = p.pop("groups")
    extra = {"model": entry["model"]} if "model" in entry else {}
    return {"name": entry["name"], "kind": KIND[entry["op"]], **extra, **p, "flops": operator(entry).useful_flops}


_ALL = [_flat(e) for e in paper()]
FA_CONFIGS: list[Config] = [c for c in _ALL if c["kind"] == "attention" and not c["causal"]]
FA_CAUSAL_CONFIGS: list[Config] = [c for c in _ALL if c["kind"] == "attention" and c["causal"]]
GEMM_CONFIGS: list[Config] = [c for c in _ALL if c["kind"] == "gemm"]
CHUNK_SCAN_CONFIGS: list[Config] = [c for c in _ALL if c["kind"] == "chunk_scan"]
CHUNK_STATE_CONFIGS: list[Config] = [c for c in _ALL if c["kind"] == "chunk_state"]


def all_configs() -> list[Config]:
    """Every config of the suite: 20 + 20 attention, 4 GEMM, 10 ChunkScan, 10 ChunkState."""
    return list(_ALL)


def by_name(name: str) -> Config:
    """The config called ``name`` (KeyError if none)."""
    for cfg in _ALL:
        if cfg["name"] == name:
            return cfg
    raise KeyError(name)
