"""Where a dense attention call's host time goes when its tensors are new (issue 37): a model's prefill makes new
q/k/v every layer and every forward, so ``ptsolve.torch``'s kept launches (keyed by address) miss and the serving
layer prepares a launch. Times each stage of that path on one shape (Llama-3-8B's heads, bf16, causal), in µs per
call, best of 5 rounds (``bench torch_ops host_overhead``'s ``host_us``).

    python -m bench models prefill_host --out DIR [--seq 1024] [--batch 1]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=1)
    a = ap.parse_args()
    import torch

    import ptsolve.torch as pt
    from bench.torch_ops.host_overhead import host_us
    from codegen import runtime
    from codegen.cuda.attention import tensor_map
    from ptsolve import serve
    from ptsolve.serve import attention as sa
    from ptsolve.serve import exact

    kw = {"device": "cuda", "dtype": torch.bfloat16}
    B, S, H, Hkv, D = a.batch, a.seq, 32, 8, 128
    pool = [(torch.randn(B, S, H, D, **kw), torch.randn(B, S, Hkv, D, **kw), torch.randn(B, S, Hkv, D, **kw))
            for _ in range(8)]
    q, k, v = pool[0]
    c = pt._attn_class(q, k, True)
    scale = D ** -0.5
    it = iter(range(1 << 30))

    def fresh(families: bool = False) -> tuple[Any, ...]:
        """The pool's tensors in turn, the launches kept by address forgotten (and the layouts' families unless
        ``families``): every call is new."""
        serve.prepared.LAUNCHES.clear()
        pt._FAST.clear()
        if not families:
            pt._MOVE.clear()
            pt._SEEN.clear()
        return pool[next(it) % len(pool)]
    params = {"batch": B, "heads": H, "kv_heads": Hkv, "seq_q": S, "seq_kv": S, "head_dim": D, "causal": True,
              "dtype": c.dtype}
    ck = serve.kernel(c)
    sp = tensor_map("q", c.dtype, D, H, S, B, tuple(q.stride()[:3]), ck.ir.tiling["BM"])
    slot = runtime.MapSlot()
    res = {
        "flash_attention, kept launch (same tensors)": host_us(lambda: pt.flash_attention(q, k, v, causal=True)),
        "flash_attention, new tensors (prepare)": host_us(lambda: pt.flash_attention(*fresh(), causal=True)),
        "flash_attention, new tensors (the layout's family)": host_us(lambda: pt.flash_attention(*fresh(True),
                                                                                              causal=True)),
        "serve.attention_launch, new tensors": host_us(lambda: sa.attention_launch(*fresh(), c, scale)),
        "exact.serving": host_us(lambda: exact.serving(c, params, None, None)),
        "_attention_launch (class kernel)": host_us(lambda: sa._attention_launch(*fresh(), c, ck, scale, None, None, 0,
                                                                                 0)),
        "encode_tensor_map (cuda-python)": host_us(lambda: runtime.encode_tensor_map(sp, q.data_ptr())),
        "MapSlot.encode (ctypes, in place)": host_us(lambda: slot.encode(sp, q.data_ptr())),
        "SDPA FLASH (reference)": host_us(lambda: torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True)),
    }
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "prefill_host.json").write_text(json.dumps(res, indent=1))
    print(f"| stage (b{B} s{S}, 32/8 heads, d128, bf16, causal) | µs per call |\n|---|---|")
    for name, us in res.items():
        print(f"| {name} | {us:.1f} |")


if __name__ == "__main__":
    main()
