"""What a PyTorch user gets for a decode step: ``ptsolve.torch.flash_attention`` on decode shapes (seq_q <= 16 runs
the shape-generic split-KV kernel, its pieces chosen per shape by the cost model: ``ptsolve.serve.decode_splits``)
next to SDPA in one process (CUDA graphs, inputs rotating past the L2, each output checked against float32 first).

Shapes: the 54 decode shapes of results/decode_h200 (``bench.decode.decode_bench.shapes``) and the 11 held out in
results/decode_tune (``HELDOUT``), none of them tuned for here.

    python -m bench torch_decode torch_decode --out $OUT/torch_decode.json [--only <text>]   # GPU
    python -m bench torch_decode torch_decode --report results/torch_decode/device/torch_decode.json  # table

The target is SDPA-cuDNN; where cuDNN refuses a causal decode with seq_q < seq_kv (bottom-right mask), the cuDNN
call without the mask (``sdpa_cudnn_nc``: the same bytes, a lower bound on what a masked one costs) stands in.
"""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def shapes() -> dict[str, dict[str, Any]]:
    """name -> decode_bench parameters (fp16)."""
    from bench.decode.decode_bench import shapes as bench_shapes
    from bench.decode_tune.decode_tune import HELDOUT
    out = {s["name"]: s["params"] for s in bench_shapes() if s["kind"] == "decode"}
    return out | {n: p for n, p in HELDOUT.items() if n not in out}


def target(us: dict[str, float]) -> tuple[str, float]:
    """The SDPA time a shape is measured against: cuDNN's, else cuDNN's without the mask."""
    for n in ("sdpa_cudnn", "sdpa_cudnn_nc"):
        if n in us:
            return n, us[n]
    raise KeyError("no cuDNN time")


def main(out: Path, only: str, todo: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Time ``todo`` (name -> parameters; default ``shapes()``), write ``out`` after each shape; the results."""
    import torch

    import ptsolve.torch as pt
    from bench.decode.decode_bench import refs, sdpa_fns, timing_sets
    from codegen.harness import time_many
    from ptsolve import serve
    res = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "torch": torch.__version__, "shapes": {}}
    for name, p in (shapes() if todo is None else todo).items():
        if only and only not in name:
            continue
        torch.manual_seed(0)
        sets, kv_bytes = timing_sets(p)
        q, k, v = sets[0][:3]
        hi, lo = refs(q, k, v, p["causal"])
        t0 = time.time()
        o = pt.flash_attention(q, k, v, causal=p["causal"])
        torch.cuda.synchronize()
        first_s = time.time() - t0
        err, base = float((o.float() - hi).abs().max()), float((lo.float() - hi).abs().max())
        del hi, lo
        routed = pt._decodes(q, k, p["causal"])
        pick = serve.decode_pick(pt._decode_class(q, k, p["causal"]), p | {"dtype": "fp16"}) if routed else None
        splits, binary = (pick[1], pick[0].key) if pick else (0, "")
        fns = {"pt.flash_attention": lambda i, s=sets, c=p["causal"]: pt.flash_attention(*s[i][:3], causal=c)}
        ctxs = {}
        for n, (fn, ctx) in sdpa_fns(p, sets, nc=True).items():
            if fn is not None and n in ("sdpa_cudnn", "sdpa_cudnn_nc", "sdpa_default"):
                fns[n], ctxs[n] = fn, ctx
        ms = time_many(fns, len(sets), ctxs=ctxs, graphs=True, rounds=11, block_ms=1.0)
        rec = {"params": p, "kv_bytes": kv_bytes, "first_call_s": first_s, "max_err": err, "fp16_err": base,
               "ok": math.isfinite(err) and err <= 2 * base + 1e-3, "decode_kernel": routed, "splits": splits,
               "binary": binary,
               "us": {n: v * 1e3 for n, v in ms.items()}}
        res["shapes"][name] = rec
        tn, tu = target(rec["us"])
        ratio = tu / rec["us"]["pt.flash_attention"]
        print(name, {n: round(v, 1) for n, v in rec["us"].items()}, f"{tn}/pt {ratio:.3f}",
              f"splits {splits} {binary} err {err:.2g} (fp16 {base:.2g}) ok {rec['ok']}", f"first call {first_s:.2f} s",
              flush=True)
        out.write_text(json.dumps(res, indent=1, sort_keys=True))
        del sets, q, k, v, o
        torch.cuda.empty_cache()
    return res


def best(us: dict[str, float]) -> tuple[str, float]:
    """The fastest SDPA call measured (for a causal decode with seq_q > 1 that may be one without the mask)."""
    return min(((n, t) for n, t in us.items() if n.startswith("sdpa")), key=lambda x: x[1])


def _summary(what: str, ratios: list[float]) -> str:
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
    return (f"{what} / ptsolve over {len(ratios)} shapes: geomean {geo:.3f}, min {min(ratios):.3f}, "
            f"{sum(x >= 0.9 for x in ratios)} at >= 0.9, {sum(x >= 1.0 for x in ratios)} at >= 1.0")


def _split_rows(r: dict[str, Any]) -> bool:
    """Did a shape of a two-warpgroup class run a one-warpgroup binary (its rows in 64-row query tiles)?"""
    from ptsolve import serve
    p = r["params"]
    c = serve.decode_class("fp16", p["head_dim"], p["causal"], p["heads"], p["kv_heads"], p["seq_q"])
    return c.groups == 2 and "/wg1" in r.get("binary", "")


def binary_note(binary: str) -> str:
    """What the pieces column says of a decode binary (a class key) besides its pieces: two CTAs per SM, persistent."""
    return " (2 CTAs/SM)" if "/ctas2" in binary else " (persistent)" if "/persistent" in binary else ""


def report(res: dict[str, Any]) -> str:
    """The markdown table (shape, ptsolve µs, cuDNN µs and ratio, the fastest SDPA call and ratio, pieces) and the
    summary lines."""
    rows, rc, rb, tiles = [], [], [], " (1 warpgroup, 64-row tiles)"
    for name, r in sorted(res["shapes"].items()):
        tn, tu = target(r["us"])
        bn, bu = best(r["us"])
        us = r["us"]["pt.flash_attention"]
        rc.append(tu / us)
        rb.append(bu / us)
        rows.append(f"| {name} | {us:.1f} | {tu:.1f}{' (no mask)' if tn.endswith('_nc') else ''} | {tu / us:.3f} | "
                    f"{bu:.1f} ({bn}) | {bu / us:.3f} | {r['splits']}{binary_note(r.get('binary', ''))}"
                    f"{tiles if _split_rows(r) else ''} | "
                    f"{'yes' if r['ok'] else 'NO'} |")
    return "\n".join([
        "| shape | `pt.flash_attention` µs | SDPA-cuDNN µs | cuDNN / ptsolve | fastest SDPA µs | fastest / ptsolve "
        "| pieces | output ok |",
        "|---|---|---|---|---|---|---|---|", *rows, "",
        _summary("cuDNN", rc) + "  ", _summary("the fastest SDPA call", rb) + "  ",
        _summary("seq_q = 1 only: cuDNN", [x for x, r in zip(rc, sorted(res["shapes"].items()))
                                            if r[1]["params"]["seq_q"] == 1]) + "  ",
        f"outputs within FlashAttention's rule: {sum(r['ok'] for r in res['shapes'].values())}/{len(rc)}"])


if __name__ == "__main__":
    if "--report" in sys.argv:
        print(report(json.loads(Path(sys.argv[sys.argv.index("--report") + 1]).read_text())))
    else:
        o = Path(sys.argv[sys.argv.index("--out") + 1])
        o.parent.mkdir(parents=True, exist_ok=True)
        print(report(main(o, sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else "")))
