"""What a PyTorch user gets for a decode step today: ``ptsolve.torch.flash_attention`` (the shape-generic
flash_attention kernels; decode shapes are not routed to the split-KV operator, which exists only as exact-shape
kernels) next to SDPA-cuDNN, on decode shapes of results/decode_h200 (whose split-KV times are there), in one
process (CUDA graphs, inputs rotating past the L2, output checked against float32 first).

    python3 results/torch_decode/torch_decode.py --out $OUT/torch_decode.json     # GPU (nvcc runs on first use)
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

SHAPES = {"dec_llama3-8b_b1_q1_k4097": (1, 32, 8, 4097, 128), "dec_llama3-8b_b16_q1_k4097": (16, 32, 8, 4097, 128),
          "dec_llama3-8b_b1_q1_k32768": (1, 32, 8, 32768, 128), "dec_qwen2.5-0.5b_b1_q1_k32768": (1, 14, 2, 32768, 64),
          "dec_falcon-7b_b16_q1_k4097": (16, 71, 1, 4097, 64)}


def main(out: Path) -> None:
    import torch
    from decode_bench import refs, sdpa_fns, timing_sets

    import ptsolve.torch as pt
    from codegen.bench import time_many
    res = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "torch": torch.__version__, "shapes": {}}
    for name, (B, H, Hkv, Skv, D) in SHAPES.items():
        p = {"batch": B, "heads": H, "kv_heads": Hkv, "seq_q": 1, "seq_kv": Skv, "head_dim": D, "causal": False}
        torch.manual_seed(0)
        sets, kv_bytes = timing_sets(p)
        hi, lo = refs(*sets[0][:3], False)
        t0 = time.time()
        o = pt.flash_attention(*sets[0][:3])
        torch.cuda.synchronize()
        first_s = time.time() - t0
        err, base = float((o.float() - hi).abs().max()), float((lo.float() - hi).abs().max())
        fns = {"pt.flash_attention": lambda i, s=sets: pt.flash_attention(*s[i][:3])}
        ctxs = {}
        for n, (fn, ctx) in sdpa_fns(p, sets).items():
            if fn is not None and n == "sdpa_cudnn":
                fns[n], ctxs[n] = fn, ctx
        ms = time_many(fns, len(sets), ctxs=ctxs, graphs=True, rounds=11, block_ms=1.0)
        rec = {"params": p, "kv_bytes": kv_bytes, "first_call_s": first_s, "max_err": err, "fp16_err": base,
               "us": {k: v * 1e3 for k, v in ms.items()}}
        res["shapes"][name] = rec
        print(name, {k: round(v, 1) for k, v in rec["us"].items()}, f"err {err:.2g} (fp16 {base:.2g})",
              f"first call {first_s:.1f} s", flush=True)
        out.write_text(json.dumps(res, indent=1, sort_keys=True))


if __name__ == "__main__":
    o = Path(sys.argv[sys.argv.index("--out") + 1])
    o.parent.mkdir(parents=True, exist_ok=True)
    main(o)
