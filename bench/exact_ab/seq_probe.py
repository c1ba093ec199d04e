"""ptsolve.torch's attention at sequence lengths either side of a round one (GPU; class kernels only:
PTSOLVE_EXACT=off): is a ragged length slower per FLOP than its round neighbour?

    python3 -m bench exact_ab seq_probe
"""
from __future__ import annotations

import os

# (batch, seq, heads, kv_heads, head_dim, causal)
SHAPES = [(4, 4096, 32, 8, 128, False), (4, 4097, 32, 8, 128, False), (4, 4104, 32, 8, 128, False),
          (4, 4160, 32, 8, 128, False), (1, 8192, 32, 8, 128, False), (1, 8193, 32, 8, 128, False),
          (2, 8194, 32, 8, 128, False), (8, 2048, 32, 8, 128, False), (8, 2049, 32, 8, 128, False),
          (1, 4096, 64, 8, 128, True), (1, 4097, 64, 8, 128, True), (1, 8192, 12, 12, 64, False),
          (2, 8192, 12, 12, 64, False)]


def main() -> None:
    os.environ["PTSOLVE_EXACT"] = "off"
    import torch

    import ptsolve.torch as pt
    from codegen.harness import time_many
    for B, S, H, Hk, D, causal in SHAPES:
        q = torch.randn(B, S, H, D, device="cuda", dtype=torch.float16)
        k = torch.randn(B, S, Hk, D, device="cuda", dtype=torch.float16)
        v = torch.randn_like(k)
        ms = time_many({"pt": lambda i, q=q, k=k, v=v, c=causal: pt.flash_attention(q, k, v, causal=c)}, 1, rounds=7,
                       block_ms=2.0)
        flops = 4 * B * H * S * S * D * (0.5 if causal else 1)
        print(B, S, H, Hk, D, causal, {n: round(m * 1e3, 1) for n, m in ms.items()},
              {n: round(flops / (m * 1e9), 0) for n, m in ms.items()}, flush=True)


if __name__ == "__main__":
    main()
