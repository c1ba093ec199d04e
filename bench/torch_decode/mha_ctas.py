"""MHA decode (one query row per 64-row tile) with two CTAs per SM: does sharing the SM hide a piece's fill and
drain and the grid's partial last wave? The d64 decode class's schedule as shipped (one CTA per SM, 240 registers)
next to the same schedule with 64-wide key blocks (one CTA per SM: the control) and lowered with ``ctas = 2``
(64-wide key blocks, the widest that compiles without spills or a serialised wgmma pipeline in half the register
file; depth 2 and 3), every piece count up to 16 forced, and SDPA-cuDNN, on GPT-2 (12 heads, D 64) and
Qwen2.5-0.5B (14 / 2) decode shapes.

    PTSOLVE_CACHE_DIR=.cubin_td python -m bench torch_decode mha_ctas compile              # CPU
    PTSOLVE_CACHE_DIR=.cubin_td python -m bench torch_decode mha_ctas run --out $OUT/mha_ctas.json   # GPU
    python -m bench torch_decode mha_ctas --report results/torch_decode/device_kv/mha_ctas.json
"""
from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SHAPES = {f"{m}_b{b}_k{k}": (h, kv, b, k) for m, h, kv, b, k in (
    ("gpt2", 12, 12, 1, 1024), ("gpt2", 12, 12, 16, 1024), ("gpt2", 12, 12, 64, 1024), ("gpt2", 12, 12, 16, 8192),
    ("gpt2", 12, 12, 64, 2047), ("qwen2.5-0.5b", 14, 2, 16, 4097), ("qwen2.5-0.5b", 14, 2, 1, 32768))}
VARIANTS = {"shipped": {}, "bn64_d3": {"BN": 64, "depth": 3}, "ctas2_d2": {"ctas": 2, "BN": 64, "depth": 2},
            "ctas2_d3": {"ctas": 2, "BN": 64, "depth": 3}}


def _kernels() -> dict[str, Any]:
    from ptsolve import serve
    from ptsolve.ops import base
    spec = base.REGISTRY["flash_decode"]
    if "ctas" not in spec.optional:  # the experiment's tiling key (the op does not offer it)
        base.REGISTRY["flash_decode"] = dataclasses.replace(spec, optional={"ctas": 1})
    c = serve.decode_class("fp16", 64, False, 12, 12, 1)
    plan = serve.schedule(c)
    return {n: serve.kernel(c) if not t else serve.kernels.build(c, dataclasses.replace(plan, tiling=plan.tiling | t))
            for n, t in VARIANTS.items()}


def compile_all() -> None:
    from codegen.runtime import compile_kernel
    for n, ck in _kernels().items():
        rep = compile_kernel(ck.ks).report
        print(n, ck.ir.tiling, {k: rep.get(k) for k in ("registers", "spill_stores", "wgmma_serialized")})


def run(out: Path) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from bench.decode.decode_bench import refs
    from codegen.harness import time_many
    from ptsolve import serve
    from ptsolve.ops.decode import split_counts
    ks = _kernels()
    c = serve.decode_class("fp16", 64, False, 12, 12, 1)
    chosen = serve.decode_splits
    res = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "shapes": {}}
    for name, (H, Hkv, B, S) in SHAPES.items():
        torch.manual_seed(0)
        n = max(1, min(8, math.ceil(200e6 / (4 * B * S * Hkv * 64))))
        sets = [tuple(torch.randn(B, s, h, 64, device="cuda", dtype=torch.float16) for s, h in ((1, H), (S, Hkv),
                                                                                                 (S, Hkv)))
                for _ in range(n)]
        hi, lo = refs(*sets[0], False)
        base = float((lo.float() - hi).abs().max())
        p = {"batch": B, "heads": H, "kv_heads": Hkv, "seq_q": 1, "seq_kv": S, "head_dim": 64, "causal": False,
             "dtype": "fp16"}
        cls = serve.decode_class("fp16", 64, False, H, Hkv, 1)
        pick = chosen(cls, p)  # the shipped binary's pieces
        fns, bad = {}, []
        for vn, ck in ks.items():
            serve.kernels._KERNELS[c] = ck
            for s in split_counts(p, 64, ck.ir.tiling["BN"]):
                if s > 16:
                    continue
                serve.decode_splits = lambda c_, p_, s=s: s  # _KERNELS[c]: this variant
                try:
                    lns = [serve.decode._decode_prepare(*x, c, 0.125, None)[0] for x in sets]
                finally:
                    serve.decode_splits = chosen
                outs = [torch.empty_like(x[0]) for x in sets]
                lns[0](serve.current_stream(0), outs[0].data_ptr())
                torch.cuda.synchronize()
                if not float((outs[0].float() - hi).abs().max()) <= 2 * base + 1e-3:
                    bad.append(f"{vn}/s{s}")
                fns[f"{vn}/s{s}"] = lambda i, lns=lns, outs=outs: lns[i](serve.current_stream(0), outs[i].data_ptr())
        serve.kernels._KERNELS[c] = ks["shipped"]
        fns["sdpa_cudnn"] = lambda i, s=sets, g=H != Hkv: F.scaled_dot_product_attention(
            *(x.transpose(1, 2) for x in s[i]), enable_gqa=g)
        ms = time_many(fns, len(sets), ctxs={"sdpa_cudnn": lambda: sdpa_kernel([SDPBackend.CUDNN_ATTENTION])},
                       graphs=True, rounds=11, block_ms=1.0)
        res["shapes"][name] = {"us": {k: v * 1e3 for k, v in ms.items()}, "pick": pick, "bad": bad}
        print(name, "pick", pick, "bad", bad, {k: round(v * 1e3, 1) for k, v in ms.items()}, flush=True)
        out.write_text(json.dumps(res, indent=1, sort_keys=True))
        del sets, hi, lo
        torch.cuda.empty_cache()
    print(report(res))


def report(res: dict[str, Any]) -> str:
    rows = ["| shape | SDPA-cuDNN µs | shipped at the model's pieces | shipped, best pieces | BN 64 depth 3, best | "
            "ctas 2 depth 2, best | ctas 2 depth 3, best | cuDNN / best ctas 2 |", "|---|---|---|---|---|---|---|---|"]
    for name, r in res["shapes"].items():
        u = r["us"]

        b = {v: min((t, k.split("/")[1]) for k, t in u.items() if k.startswith(v + "/")) for v in VARIANTS}
        c2 = min(b["ctas2_d2"][0], b["ctas2_d3"][0])
        at = u.get(f"shipped/s{r['pick']}", math.nan)
        rows.append(f"| {name} | {u['sdpa_cudnn']:.1f} | {at:.1f} ({r['pick']}) | "
                    + " | ".join(f"{b[v][0]:.1f} ({b[v][1]})" for v in VARIANTS)
                    + f" | {u['sdpa_cudnn'] / c2:.3f} |" + (f" bad: {r['bad']}" if r["bad"] else ""))
    return "\n".join(rows)


if __name__ == "__main__":
    if "--report" in sys.argv:
        print(report(json.loads(Path(sys.argv[sys.argv.index("--report") + 1]).read_text())))
    elif sys.argv[1] == "compile":
        compile_all()
    else:
        o = Path(sys.argv[sys.argv.index("--out") + 1])
        o.parent.mkdir(parents=True, exist_ok=True)
        run(o)
