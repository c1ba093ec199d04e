"""Does a persistent decode kernel (one CTA per SM dealing itself (batch, kv head) tiles, its producer loading the next
tile's K/V while the consumers finish the last) beat the grid launch on one-piece shapes? The class's plan lowered
for the exact shape with persistent 0 and 1, next to SDPA-cuDNN, in one process.

    PTSOLVE_CACHE_DIR=.cubin_td python -m bench torch_decode pers_ab compile
    PTSOLVE_CACHE_DIR=.cubin_td python -m bench torch_decode pers_ab run --out $OUT/pers.json
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.torch_decode.generic_ab import exact_plan  # noqa: E402

SHAPES = ("dec_llama3-70b_b64_q1_k511", "dec_llama3-8b_b64_q1_k1000", "dec_llama3-8b_b16_q1_k1000",
          "dec_qwen2.5-7b_b64_q1_k4097", "dec_llama3-70b_b16_q1_k2047", "dec_llama3-8b_b64_q1_k4097",
          "dec_qwen2.5-0.5b_b64_q1_k1000")


def plans(n: str) -> dict[str, Any]:
    from codegen.plan import KernelPlan
    base = exact_plan(n)
    out = {"grid": base}
    if base.tiling["splits"] == 1:
        d = json.loads(base.to_json())
        d["tiling"]["persistent"] = 1
        d["tiling"]["ctas"] = 1
        out["persistent"] = KernelPlan.from_json(json.dumps(d))
        for depth in (3, 4):
            if depth != base.tiling["depth"]:
                for pers in (0, 1):
                    e = json.loads(json.dumps(d))
                    e["tiling"]["depth"], e["tiling"]["persistent"] = depth, pers
                    out[f"{'persistent' if pers else 'grid'}_d{depth}"] = KernelPlan.from_json(json.dumps(e))
    return out


def compile_all() -> None:
    from codegen.cuda import emit
    from codegen.runtime import compile_kernel
    for n in SHAPES:
        for k, pl in plans(n).items():
            ks = emit(pl, "h200")
            print(n, k, ks.name, {x: compile_kernel(ks).report.get(x) for x in ("registers", "spill_stores")},
                  flush=True)


def run(out: Path) -> None:
    import torch

    from bench.decode.decode_bench import check, sdpa_fns, timing_sets
    from bench.torch_decode.torch_decode import shapes
    from codegen.harness import run_attention, time_many
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(),
                           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    for n in SHAPES:
        p = shapes()[n]
        ps = plans(n)
        oks = {k: check(lambda q, k_, v, o, pl=pl: run_attention(q, k_, v, pl, o), p, 1)["ok"] for k, pl in ps.items()}
        sets, _ = timing_sets(p)
        fns = {k: (lambda i, s=sets, pl=pl: run_attention(*s[i][:3], pl, s[i][3])) for k, pl in ps.items()}
        ctxs = {}
        for k, (fn, ctx) in sdpa_fns(p, sets).items():
            if fn is not None and k == "sdpa_cudnn":
                fns[k], ctxs[k] = fn, ctx
        ms = time_many(fns, len(sets), ctxs=ctxs, graphs=True, rounds=15, block_ms=1.0)
        res[n] = {"ok": oks, "us": {k: v * 1e3 for k, v in ms.items()}}
        print(n, res[n], flush=True)
        out.write_text(json.dumps(res, indent=1))
    keys = sorted({k for n in SHAPES for k in res[n]["us"]})
    print("| shape | " + " | ".join(keys) + " |")
    for n in SHAPES:
        u = res[n]["us"]
        print(f"| {n} | " + " | ".join(f"{u[k]:.1f}" if k in u else "-" for k in keys) + " |")


if __name__ == "__main__":
    if sys.argv[1] == "compile":
        compile_all()
    else:
        o = Path(sys.argv[sys.argv.index("--out") + 1])
        o.parent.mkdir(parents=True, exist_ok=True)
        run(o)
