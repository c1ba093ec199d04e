"""The paper's benchmark suite as plain data (no torch), with the FLOP count used for TFLOP/s.

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

GEMM: ``GEMM{k}`` for the four M x N x K shapes below, in that order.
"""

from __future__ import annotations

from typing import Any

Config = dict[str, Any]

FA_MODELS: tuple[tuple[str, int, int], ...] = (("llama3-8b", 32, 8), ("llama3-70b", 64, 8))
FA_BATCHES: tuple[int, ...] = (1, 64)
FA_SEQS: tuple[int, ...] = (512, 1024, 2048, 4096, 8192)
FA_HEAD_DIM = 128

GEMM_SHAPES: tuple[tuple[int, int, int], ...] = (
    (4096, 1024, 4096),
    (8192, 14336, 4096),
    (8192, 8192, 28672),
    (8192, 8192, 8192),
)

MAMBA_HEADS = 64
MAMBA_HEAD_DIM = 64
MAMBA_D_STATE = 128
MAMBA_CHUNK = 256
MAMBA_NGROUPS = 1
MAMBA_BATCHES: tuple[int, ...] = (1, 64)
MAMBA_SEQS: tuple[int, ...] = (1024, 2048, 4096, 8192, 16384)


def attention_flops(batch: int, heads: int, seq: int, head_dim: int, causal: bool) -> int:
    """FLOPs of one attention forward pass (two matmuls, 2 FLOPs per multiply-add).

    Non-causal: 4*B*H*S*S*D. Causal counts exactly the S*(S+1)/2 unmasked (query, key) pairs:
    4*B*H*D*S*(S+1)/2.
    """
    if causal:
        return 4 * batch * heads * head_dim * seq * (seq + 1) // 2
    return 4 * batch * heads * seq * seq * head_dim


def gemm_flops(m: int, n: int, k: int) -> int:
    """FLOPs of an M x N x K matrix product: 2*M*N*K."""
    return 2 * m * n * k


def _nchunks(seq: int, chunk: int) -> int:
    return -(-seq // chunk)


def chunk_scan_flops(batch: int, seq: int, heads: int, head_dim: int, d_state: int, chunk: int) -> int:
    """FLOPs of Mamba2 ChunkScan: B*nchunks*H*(P*Q*(Q+1) + 2*Q*N*P).

    P*Q*(Q+1) is the causal (lower-triangular) intra-chunk product (CB*decay) @ x, 2*Q*N*P the
    inter-chunk product C @ states.
    """
    q, n, p = chunk, d_state, head_dim
    return batch * _nchunks(seq, chunk) * heads * (p * q * (q + 1) + 2 * q * n * p)


def chunk_state_flops(batch: int, seq: int, heads: int, head_dim: int, d_state: int, chunk: int) -> int:
    """FLOPs of Mamba2 ChunkState: B*nchunks*H*2*Q*N*P (the product x^T @ (B * decay * dt) per chunk)."""
    q, n, p = chunk, d_state, head_dim
    return batch * _nchunks(seq, chunk) * heads * 2 * q * n * p


def _fa_configs(causal: bool) -> list[Config]:
    out: list[Config] = []
    for mi, (model, heads, kv_heads) in enumerate(FA_MODELS):
        for bi, batch in enumerate(FA_BATCHES):
            for si, seq in enumerate(FA_SEQS):
                i = 10 * mi + 5 * bi + si
                out.append(
                    {
                        "name": f"FA{i}c" if causal else f"FA{i}",
                        "kind": "attention",
                        "model": model,
                        "batch": batch,
                        "heads": heads,
                        "kv_heads": kv_heads,
                        "seq": seq,
                        "head_dim": FA_HEAD_DIM,
                        "causal": causal,
                        "flops": attention_flops(batch, heads, seq, FA_HEAD_DIM, causal),
                    }
                )
    return out


def _gemm_configs() -> list[Config]:
    return [
        {"name": f"GEMM{k}", "kind": "gemm", "m": m, "n": n, "k": kk, "flops": gemm_flops(m, n, kk)}
        for k, (m, n, kk) in enumerate(GEMM_SHAPES)
    ]


def _mamba_configs(kind: str) -> list[Config]:
    prefix, flops_fn = {"chunk_scan": ("CS", chunk_scan_flops), "chunk_state": ("ST", chunk_state_flops)}[kind]
    out: list[Config] = []
    for bi, batch in enumerate(MAMBA_BATCHES):
        for si, seq in enumerate(MAMBA_SEQS):
            out.append(
                {
                    "name": f"{prefix}{5 * bi + si}",
                    "kind": kind,
                    "batch": batch,
                    "seq": seq,
                    "heads": MAMBA_HEADS,
                    "head_dim": MAMBA_HEAD_DIM,
                    "d_state": MAMBA_D_STATE,
                    "chunk": MAMBA_CHUNK,
                    "ngroups": MAMBA_NGROUPS,
                    "flops": flops_fn(batch, seq, MAMBA_HEADS, MAMBA_HEAD_DIM, MAMBA_D_STATE, MAMBA_CHUNK),
                }
            )
    return out


FA_CONFIGS: list[Config] = _fa_configs(causal=False)
FA_CAUSAL_CONFIGS: list[Config] = _fa_configs(causal=True)
GEMM_CONFIGS: list[Config] = _gemm_configs()
CHUNK_SCAN_CONFIGS: list[Config] = _mamba_configs("chunk_scan")
CHUNK_STATE_CONFIGS: list[Config] = _mamba_configs("chunk_state")


def all_configs() -> list[Config]:
    """Every config of the suite: 20 + 20 attention, 4 GEMM, 10 ChunkScan, 10 ChunkState."""
    return FA_CONFIGS + FA_CAUSAL_CONFIGS + GEMM_CONFIGS + CHUNK_SCAN_CONFIGS + CHUNK_STATE_CONFIGS


def by_name(name: str) -> Config:
    """The config called ``name`` (KeyError if none)."""
    for cfg in all_configs():
        if cfg["name"] == name:
            return cfg
    raise KeyError(name)
