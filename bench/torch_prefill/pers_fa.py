"""Do persistent CTAs pay for prefill attention? The attention class's plan (``ptsolve/serve/schedule_table.json``)
lowered for the exact shape as a grid launch and on persistent CTAs (one per SM dealing itself the query tiles,
longest first; its producer loads the next tile's Q, K and V while the consumers finish the last), next to SDPA-
cuDNN, in one process (CUDA graphs, inputs rotating past the L2, outputs checked first), with the cost model's
prediction of each.

    PTSOLVE_CACHE_DIR=.cubin_td python -m bench torch_prefill pers_fa compile       # CPU: the cubins
    PTSOLVE_CACHE_DIR=.cubin_td python -m bench torch_prefill pers_fa run --out $OUT/pers_fa.json   # GPU
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[2] / "results/torch_prefill"  # the study's data
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

NAMES = ("pf_llama3-8b_b16_q128_k128", "pf_llama3-8b_b16_q511_k511_causal", "pf_llama3-8b_b16_q1000_k1000",
         "pf_llama3-8b_b4_q2047_k2047_causal", "pf_llama3-70b_b1_q1000_k1000_causal", "pf_gpt2_b16_q511_k511",
         "pf_gpt2_b16_q128_k128_causal", "pf_qwen2.5-0.5b_b16_q1000_k1000_causal", "pf_falcon-7b_b16_q128_k128",
         "pf_gpt2_b1_q8192_k8192")


def plans(name: str) -> dict[str, Any]:
    """tag -> KernelPlan: the class's plan at the shape, grid and persistent."""
    from bench.torch_prefill.torch_prefill import shapes
    from codegen.plan import KernelPlan
    from ptsolve import serve
    p = shapes()[name] | {"dtype": "fp16"}
    c = serve.attention_class("fp16", p["head_dim"], p["causal"], p["heads"], p["kv_heads"])
    d = json.loads(serve.schedule(c).to_json())
    d["params"] = dict(p)
    out = {}
    for tag, pers in (("grid", 0), ("persistent", 1)):
        d["tiling"]["persistent"] = pers
        out[tag] = KernelPlan.from_json(json.dumps(d))
    return out


def compile_all() -> None:
    from codegen.cuda import emit
    from codegen.runtime import compile_kernel
    for n in NAMES:
        for tag, pl in plans(n).items():
            rep = compile_kernel(emit(pl, "h200")).report
            print(n, tag, {k: rep.get(k) for k in ("registers", "spill_stores", "wgmma_serialized")}, flush=True)


def run(out: Path) -> None:
    import torch

    from bench.decode.decode_bench import refs, sdpa_fns, timing_sets
    from bench.torch_prefill.torch_prefill import shapes
    from codegen.harness import run_attention, time_many
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(),
                           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "shapes": {}}
    for n in NAMES:
        p = shapes()[n]
        ps = plans(n)
        torch.manual_seed(0)
        sets, _ = timing_sets(p)
        hi, lo = refs(*sets[0][:3], p["causal"])
        base = float((lo.float() - hi).abs().max())
        oks = {}
        for tag, pl in ps.items():
            o = run_attention(*sets[0][:3], pl, sets[0][3])
            torch.cuda.synchronize()
            oks[tag] = float((o.float() - hi).abs().max()) <= 2 * base + 1e-3
        del hi, lo
        fns = {k: (lambda i, s=sets, pl=pl: run_attention(*s[i][:3], pl, s[i][3])) for k, pl in ps.items()}
        ctxs = {}
        for k, (fn, ctx) in sdpa_fns(p, sets).items():
            if fn is not None and k == "sdpa_cudnn":
                fns[k], ctxs[k] = fn, ctx
        ms = time_many(fns, len(sets), ctxs=ctxs, graphs=True, rounds=11, block_ms=1.0)
        res["shapes"][n] = {"params": p, "ok": oks, "us": {k: v * 1e3 for k, v in ms.items()}}
        print(n, res["shapes"][n], flush=True)
        out.write_text(json.dumps(res, indent=1))
        del sets
        torch.cuda.empty_cache()
    print(report(res))


def report(res: dict[str, Any]) -> str:
    rows = ["| shape | grid µs | persistent µs | grid / persistent | cuDNN µs | cuDNN / best |",
            "|---|---|---|---|---|---|"]
    for n, r in res["shapes"].items():
        u = r["us"]
        rows.append(f"| {n} | {u['grid']:.1f} | {u['persistent']:.1f} | {u['grid'] / u['persistent']:.3f} | "
                    f"{u['sdpa_cudnn']:.1f} | {u['sdpa_cudnn'] / min(u['grid'], u['persistent']):.3f} |"
                    + ("" if all(r["ok"].values()) else f" bad: {r['ok']}"))
    return "\n".join(rows)


if __name__ == "__main__":
    if sys.argv[1] == "compile":
        compile_all()
    elif "--report" in sys.argv:
        print(report(json.loads(Path(sys.argv[sys.argv.index("--report") + 1]).read_text())))
    else:
        o = Path(sys.argv[sys.argv.index("--out") + 1])
        o.parent.mkdir(parents=True, exist_ok=True)
        run(o)
