"""The public suite: prefill, varlen, decode and GEMM rows drawn from ``../shared/shapes.md``.

Deterministic (the varlen lengths come from seeded generators and are written into the rows), fp16, and sized so
that the whole GPU run fits in a few minutes on an H200: 16k-token prefills run at batch 1, batch x sequence stays
at or under 32k tokens, a decode batch's caches hold at most 262k tokens (64 x 4097 ... 1 x 131072), and the LLM
projections at M = 16384 take N x K up to 4096 x 14336 (the 16384^3 square aside). The model families' heads (query
/ kv heads, head_dim) are shapes.md's; Phi-3 (head_dim 96) and Gemma-2 (head_dim 256) have prefill rows only (their
short queries run the prefill kernel: the split-KV decode kernel covers head_dim 64 and 128).

    python -m bench peers suite            # one line per row
    python -m bench peers suite --json     # the rows as JSON
    python -m bench peers suite --counts   # rows per workload
"""
from __future__ import annotations

import json
import random
import sys
from typing import Any

# shapes.md's model families: query heads, kv heads, head_dim
MODELS: dict[str, tuple[int, int, int]] = {
    "llama3-8b": (32, 8, 128), "llama3-70b": (64, 8, 128), "qwen2.5-7b": (28, 4, 128),
    "qwen2.5-0.5b": (14, 2, 64), "gpt2": (12, 12, 64), "falcon-7b": (71, 1, 64), "phi3-mini": (32, 32, 96),
    "gemma2-2b": (8, 4, 256)}

# dense prefill: (model, batch, seq_q, seq_kv, causal); seq_q < seq_kv is a prompt chunk against its cache
# (bottom-right causal)
PREFILL: tuple[tuple[str, int, int, int, bool], ...] = (
    ("llama3-8b", 32, 128, 128, False), ("llama3-8b", 32, 128, 128, True), ("llama3-8b", 16, 1000, 1000, True),
    ("llama3-8b", 8, 2047, 2047, True), ("llama3-8b", 4, 4097, 4097, False), ("llama3-8b", 4, 4097, 4097, True),
    ("llama3-8b", 1, 8192, 8192, False), ("llama3-8b", 1, 16384, 16384, True),
    ("llama3-70b", 16, 511, 511, False), ("llama3-70b", 16, 511, 511, True), ("llama3-70b", 2, 2047, 2047, False),
    ("llama3-70b", 1, 4097, 4097, True), ("llama3-70b", 1, 8192, 8192, True), ("llama3-70b", 1, 16384, 16384, False),
    ("qwen2.5-7b", 32, 128, 128, True), ("qwen2.5-7b", 16, 1000, 1000, False), ("qwen2.5-7b", 16, 1000, 1000, True),
    ("qwen2.5-7b", 4, 2047, 2047, True), ("qwen2.5-7b", 1, 8192, 8192, True),
    ("qwen2.5-0.5b", 16, 511, 511, False), ("qwen2.5-0.5b", 16, 511, 511, True),
    ("qwen2.5-0.5b", 32, 1000, 1000, True), ("qwen2.5-0.5b", 4, 4097, 4097, False),
    ("qwen2.5-0.5b", 1, 16384, 16384, True),
    ("gpt2", 32, 128, 128, False), ("gpt2", 16, 128, 128, True), ("gpt2", 16, 1000, 1000, False),
    ("gpt2", 8, 2047, 2047, True), ("gpt2", 1, 8192, 8192, False),
    ("falcon-7b", 16, 128, 128, False), ("falcon-7b", 16, 511, 511, True), ("falcon-7b", 4, 2047, 2047, False),
    ("falcon-7b", 1, 4097, 4097, True), ("falcon-7b", 1, 16384, 16384, False),
    ("phi3-mini", 16, 511, 511, False), ("phi3-mini", 4, 2047, 2047, True), ("phi3-mini", 1, 8192, 8192, False),
    ("gemma2-2b", 16, 1000, 1000, True), ("gemma2-2b", 4, 4097, 4097, False), ("gemma2-2b", 1, 8192, 8192, True),
    # seq_q < seq_kv: bottom-right causal (and one without the mask)
    ("llama3-8b", 4, 511, 4097, True), ("llama3-8b", 1, 2047, 16384, True), ("llama3-8b", 32, 64, 2047, True),
    ("llama3-70b", 2, 1000, 8192, True), ("qwen2.5-7b", 4, 128, 4097, False), ("qwen2.5-0.5b", 16, 17, 1000, True),
    ("gpt2", 16, 128, 2047, True), ("falcon-7b", 8, 333, 4097, True),
)

# varlen batches: (model, sequences, shortest, longest, causal, seed, kv_extra); kv_extra > 0 gives every sequence
# that many more keys at most (a chunked prefill against its cache, bottom-right causal), capped at 4000
VARLEN: tuple[tuple[str, int, int, int, bool, int, int], ...] = (
    ("llama3-8b", 16, 1, 4000, True, 1, 0), ("llama3-8b", 8, 1, 4000, False, 2, 0),
    ("qwen2.5-0.5b", 32, 1, 1000, True, 3, 0), ("gpt2", 16, 1, 4000, False, 4, 0),
    ("falcon-7b", 12, 1, 4000, True, 5, 0), ("llama3-70b", 4, 1000, 4000, True, 6, 0),
    ("qwen2.5-7b", 64, 1, 512, True, 7, 0), ("llama3-8b", 16, 1, 512, True, 8, 3000),
)

# decode: (model, batch, seq_q, cache length); seq_q > 1 is causal (speculative verification, bottom-right)
DECODE: tuple[tuple[str, int, int, int], ...] = (
    ("llama3-8b", 1, 1, 32768), ("llama3-8b", 64, 1, 4097), ("llama3-8b", 32, 1, 8192), ("llama3-8b", 16, 4, 16384),
    ("llama3-8b", 1, 1, 131072), ("llama3-8b", 64, 16, 2047), ("llama3-70b", 8, 1, 32768),
    ("llama3-70b", 1, 16, 65536), ("qwen2.5-7b", 64, 1, 1000), ("qwen2.5-7b", 4, 8, 32768),
    ("qwen2.5-0.5b", 32, 1, 4097), ("qwen2.5-0.5b", 1, 2, 131072), ("falcon-7b", 16, 1, 8192),
    ("gpt2", 64, 1, 2047),
)

# GEMM M x N x K (a [M, K] times w [N, K]^T, F.linear's layout): LLM projections with M = tokens, squares, odd sizes
_LLM_NK = {"q": (4096, 4096), "up": (14336, 4096), "down": (4096, 14336), "up70": (28672, 8192),
           "down70": (8192, 28672), "kv": (1024, 4096), "head": (151936, 3584)}
GEMM: tuple[tuple[int, int, int], ...] = (
    *((m, *_LLM_NK[p]) for m, p in (
        (1, "q"), (1, "up"), (1, "head"), (16, "q"), (16, "up"), (16, "down70"), (64, "kv"), (64, "down"),
        (128, "q"), (128, "up70"), (333, "q"), (333, "up"), (1000, "down"), (1000, "kv"), (4096, "up70"),
        (4096, "up"), (4096, "head"), (16384, "q"), (16384, "kv"), (16384, "down"))),
    (1024, 1024, 1024), (4096, 4096, 4096), (8192, 8192, 8192), (16384, 16384, 16384),  # squares
    (1000, 1000, 1000), (3000, 3000, 3000), (4095, 4097, 1024),  # odd
)


def _attn(model: str) -> dict[str, int]:
    h, kv, d = MODELS[model]
    return {"heads": h, "kv_heads": kv, "head_dim": d}


def varlen_lengths(n: int, lo: int, hi: int, seed: int, kv_extra: int = 0) -> tuple[list[int], list[int]]:
    """Seeded sequence lengths (query, key) of a varlen batch: ``n`` query lengths in ``lo..hi``, each key length
    the query length plus up to ``kv_extra`` (at most 4000, never below the query length)."""
    rng = random.Random(seed)
    q = [rng.randint(lo, hi) for _ in range(n)]
    k = [min(4000, x + rng.randint(0, kv_extra)) if kv_extra else x for x in q]
    return q, [max(a, b) for a, b in zip(q, k)]


def _name(workload: str, s: dict[str, Any]) -> str:
    if workload == "gemm":
        return f"gemm/m{s['M']}_n{s['N']}_k{s['K']}"
    c = "_causal" if s.get("causal") else ""
    if workload == "varlen":
        return f"varlen/{s['model']}_n{len(s['seqlens_q'])}_seed{s['seed']}{c}"
    return f"{workload}/{s['model']}_b{s['batch']}_q{s['seq_q']}_k{s['seq_kv']}{c}"


def rows() -> list[dict[str, Any]]:
    """Every row: ``{"name", "workload", "shape"}``, prefill first, then varlen, decode and GEMM."""
    out: list[tuple[str, dict[str, Any]]] = []
    for m, b, sq, skv, c in PREFILL:
        out.append(("prefill", {"model": m, "batch": b, "seq_q": sq, "seq_kv": skv, **_attn(m), "causal": c}))
    for m, n, lo, hi, c, seed, extra in VARLEN:
        q, k = varlen_lengths(n, lo, hi, seed, extra)
        out.append(("varlen", {"model": m, **_attn(m), "causal": c, "seed": seed, "seqlens_q": q, "seqlens_k": k}))
    for m, b, sq, skv in DECODE:
        out.append(("decode", {"model": m, "batch": b, "seq_q": sq, "seq_kv": skv, **_attn(m), "causal": sq > 1}))
    for M, N, K in GEMM:
        out.append(("gemm", {"M": M, "N": N, "K": K}))
    return [{"name": _name(w, s), "workload": w, "shape": s | {"dtype": "fp16"}} for w, s in out]


def select(all_rows: list[dict[str, Any]], only: str = "", limit: int = 0) -> list[dict[str, Any]]:
    """The rows whose name contains one of ``only``'s comma-separated parts (all when empty), at most ``limit`` of
    each workload (0: no limit)."""
    picked = [r for r in all_rows if not only or any(x and x in r["name"] for x in only.split(","))]
    if not limit:
        return picked
    seen: dict[str, int] = {}
    out = []
    for r in picked:
        seen[r["workload"]] = seen.get(r["workload"], 0) + 1
        if seen[r["workload"]] <= limit:
            out.append(r)
    return out


def counts(all_rows: list[dict[str, Any]]) -> dict[str, int]:
    """Rows per workload."""
    out: dict[str, int] = {}
    for r in all_rows:
        out[r["workload"]] = out.get(r["workload"], 0) + 1
    return out


if __name__ == "__main__":
    rs = rows()
    if "--json" in sys.argv:
        print(json.dumps(rs, indent=1))
    elif "--counts" in sys.argv:
        print(counts(rs))
    else:
        for r in rs:
            s = r["shape"]
            extra = f" tokens q {sum(s['seqlens_q'])} k {sum(s['seqlens_k'])}" if r["workload"] == "varlen" else ""
            print(r["name"] + extra)
        print(counts(rs))
