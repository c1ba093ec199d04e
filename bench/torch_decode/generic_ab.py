"""Is the shape-generic decode kernel slower than an exact-shape kernel of the same schedule? For each shape, the
class's plan lowered for the exact shape (its pieces the ones the generic launch chose; with one piece, without the
merge tasks) next to ``pt.flash_attention`` (the generic kernel) and SDPA-cuDNN, in one process (CUDA graphs,
inputs rotating past the L2, outputs checked first).

    PTSOLVE_CACHE_DIR=.cubin_td python -m bench torch_decode generic_ab compile     # CPU: the exact cubins
    PTSOLVE_CACHE_DIR=.cubin_td python -m bench torch_decode generic_ab run --out $OUT/ab.json   # GPU
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SHAPES = ("dec_llama3-70b_b64_q1_k511", "dec_llama3-8b_b64_q1_k1000", "dec_qwen2.5-0.5b_b16_q1_k1000",
          "dec_gpt2_b64_q1_k2047", "dec_gpt2_b16_q1_k8192", "dec_falcon-7b_b1_q1_k1000", "dec_llama3-8b_b1_q1_k32768")


def exact_plan(name: str) -> Any:
    """The class's plan at shape ``name`` with the pieces the generic launch uses."""
    from bench.torch_decode.torch_decode import shapes
    from codegen.plan import KernelPlan
    from ptsolve import serve
    p = shapes()[name] | {"dtype": "fp16"}
    c = serve.decode_class("fp16", p["head_dim"], p["causal"], p["heads"], p["kv_heads"], p["seq_q"])
    v, s = serve.decode_pick(c, p)
    d = json.loads(serve.schedule(v).to_json())
    d["params"] = dict(p)
    d["tiling"]["splits"] = s
    from ptsolve.ops.decode import pieces
    if max(w[3] for w in pieces(p, d["tiling"]["BM"], d["tiling"]["BN"], s)) == 1:  # no merge: the plain epilogue
        d["order"]["post"] = {r: [x for x in o if x[0].split("@")[0] not in ("combine", "out")]
                              for r, o in d["order"]["post"].items()}
    return KernelPlan.from_json(json.dumps(d))


def compile_all() -> None:
    from codegen.cuda import emit
    from codegen.runtime import compile_kernel
    for n in SHAPES:
        ks = emit(exact_plan(n), "h200")
        print(n, ks.name, {k: compile_kernel(ks).report.get(k) for k in ("registers", "spill_stores")}, flush=True)


def run(out: Path) -> None:
    import torch

    import ptsolve.torch as pt
    from bench.decode.decode_bench import check, sdpa_fns, timing_sets
    from bench.torch_decode.torch_decode import shapes
    from codegen.harness import run_attention, time_many
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                        time.gmtime())}
    for n in SHAPES:
        p = shapes()[n]
        plan = exact_plan(n)
        chk = check(lambda q, k, v, o, pl=plan: run_attention(q, k, v, pl, o), p, 1)
        sets, _ = timing_sets(p)
        fns = {"exact": lambda i, s=sets, pl=plan: run_attention(*s[i][:3], pl, s[i][3]),
               "generic": lambda i, s=sets: pt.flash_attention(*s[i][:3])}
        ctxs = {}
        for k, (fn, ctx) in sdpa_fns(p, sets).items():
            if fn is not None and k == "sdpa_cudnn":
                fns[k], ctxs[k] = fn, ctx
        ms = time_many(fns, len(sets), ctxs=ctxs, graphs=True, rounds=15, block_ms=1.0)
        res[n] = {"splits": plan.tiling["splits"], "exact_ok": chk["ok"], "us": {k: v * 1e3 for k, v in ms.items()}}
        print(n, res[n], flush=True)
        out.write_text(json.dumps(res, indent=1))
    print("| shape | pieces | exact µs | generic µs | generic / exact | cuDNN µs |\n|---|---|---|---|---|---|")
    for n in SHAPES:
        u = res[n]["us"]
        print(f"| {n} | {res[n]['splits']} | {u['exact']:.1f} | {u['generic']:.1f} | {u['generic'] / u['exact']:.3f} "
              f"| {u['sdpa_cudnn']:.1f} |")


if __name__ == "__main__":
    if sys.argv[1] == "compile":
        compile_all()
    else:
        o = Path(sys.argv[sys.argv.index("--out") + 1])
        o.parent.mkdir(parents=True, exist_ok=True)
        run(o)
