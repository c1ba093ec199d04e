"""Decode against a preallocated KV cache (``ptsolve.torch.flash_attention_kvcache``: the sequences' lengths read on
the device) next to the dense call on the filled prefix and SDPA-cuDNN on it, and the piece counts of MHA decode
(``pieces``: every count of ``ptsolve.ops.decode.split_counts`` forced, next to the model's choice and cuDNN).

    python -m bench torch_decode kvcache --out $OUT/kvcache.json     # GPU (generic cubins carried: .cubin_td)
    python -m bench torch_decode kvcache --report results/torch_decode/device/kvcache.json

``kvcache``: Llama-3-8B (32 heads, 8 kv, D 128) and GPT-2 (12 / 12, D 64), a cache of ``CAP`` positions filled to
``n``; the kvcache call's pieces are chosen for the whole cache (``ptsolve.ops.decode.length_pieces``), the dense
call's for ``n``. Host: µs per eager call of a decode loop that moves one position a step (the kvcache call: the same
tensors, its launch kept; the dense call: a new prefix view every step, a launch prepared every step).
One process, CUDA graphs for the kernel times, inputs rotating past the 50 MB L2, every output checked first.
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

CAP = 32768
KV = [("llama3-8b", 32, 8, 128, b, n) for b in (1, 16) for n in (1024, 4096, 16384, 32768)] + \
     [("gpt2", 12, 12, 64, 16, n) for n in (1024, 8192)]
MHA = [("gpt2", 12, 64, 16, 8192), ("gpt2", 12, 64, 64, 2047), ("llama2-7b", 32, 128, 8, 4096),
       ("llama2-7b", 32, 128, 1, 16384)]


def _sets(B: int, H: int, Hkv: int, D: int, S: int) -> list[tuple[Any, ...]]:
    import torch
    n = max(1, min(8, math.ceil(200e6 / (4 * B * S * Hkv * D))))
    return [(torch.randn(B, 1, H, D, device="cuda", dtype=torch.float16),
             torch.randn(B, S, Hkv, D, device="cuda", dtype=torch.float16),
             torch.randn(B, S, Hkv, D, device="cuda", dtype=torch.float16)) for _ in range(n)]


def _err(o: Any, q: Any, k: Any, v: Any) -> tuple[float, float]:
    from bench.decode.decode_bench import refs
    hi, lo = refs(q, k, v, False)
    return float((o.float() - hi).abs().max()), float((lo.float() - hi).abs().max())


def _kv_one(model: str, H: int, Hkv: int, D: int, B: int, n: int) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import ptsolve.torch as pt
    from codegen.harness import time_many
    torch.manual_seed(0)
    sets = _sets(B, H, Hkv, D, CAP)
    lens = torch.full((B,), n, dtype=torch.int32, device="cuda")
    q, kc, vc = sets[0]
    o = pt.flash_attention_kvcache(q, kc, vc, lens)
    err, base = _err(o, q, kc[:, :n], vc[:, :n])
    fns = {"kvcache": lambda i: pt.flash_attention_kvcache(*sets[i], lens),
           "dense": lambda i: pt.flash_attention(sets[i][0], sets[i][1][:, :n], sets[i][2][:, :n]),
           "sdpa_cudnn": lambda i: F.scaled_dot_product_attention(
               sets[i][0].transpose(1, 2), sets[i][1][:, :n].transpose(1, 2), sets[i][2][:, :n].transpose(1, 2),
               enable_gqa=H != Hkv)}
    ms = time_many(fns, len(sets), ctxs={"sdpa_cudnn": lambda: sdpa_kernel([SDPBackend.CUDNN_ATTENTION])},
                   graphs=True, rounds=11, block_ms=1.0)
    # host: eager calls of a decode loop (synchronised once per 200 calls, kernel time included); the dense call
    # gets a prefix not seen before every step, as a cache that grows by concatenation hands over
    host = {}
    for name, call in (("kvcache", lambda j: pt.flash_attention_kvcache(q, kc, vc, lens)),
                       ("dense", lambda j: pt.flash_attention(q, kc[:, :n - 400 + j], vc[:, :n - 400 + j]))):
        for j in range(64):
            call(j)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for j in range(200, 400):
            call(j)
        torch.cuda.synchronize()
        host[name] = (time.perf_counter() - t0) / 200 * 1e6
    return {"us": {k: v * 1e3 for k, v in ms.items()}, "eager_us": host, "max_err": err, "fp16_err": base,
            "ok": err <= 2 * base + 1e-3}


def kvcache(res: dict[str, Any]) -> None:
    import torch
    for model, H, Hkv, D, B, n in KV:
        name = f"{model}_b{B}_n{n}"
        r = res["kvcache"][name] = _kv_one(model, H, Hkv, D, B, n)
        print(name, {k: round(v, 1) for k, v in r["us"].items()}, {k: round(v, 1) for k, v in r["eager_us"].items()},
              f"err {r['max_err']:.2g} ({r['fp16_err']:.2g})", flush=True)
        torch.cuda.empty_cache()


def _pieces_one(H: int, D: int, B: int, S: int) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import ptsolve.torch as pt
    from codegen.harness import time_many
    from ptsolve import serve
    from ptsolve.ops.decode import split_counts
    torch.manual_seed(0)
    sets = _sets(B, H, H, D, S)
    q, k, v = sets[0]
    c = pt._decode_class(q, k, False)
    p = {"batch": B, "heads": H, "kv_heads": H, "seq_q": 1, "seq_kv": S, "head_dim": D, "causal": False,
         "dtype": "fp16"}
    chosen = serve.decode_pick
    pick = serve.decode_splits(c, p)
    t = serve.kernel(c).ir.tiling
    fns, errs = {}, {}
    for s in split_counts(p, t["BM"], t["BN"]):
        serve.decode_pick = lambda c_, p_, s=s: (c, s)  # class c's binary with s pieces, whatever the model says
        try:
            lns = [serve.decode._decode_prepare(*x, c, 1 / math.sqrt(D), None)[0] for x in sets]
        finally:
            serve.decode_pick = chosen
        outs = [torch.empty_like(x[0]) for x in sets]
        lns[0](serve.current_stream(0), outs[0].data_ptr())
        errs[s] = _err(outs[0], q, k, v)
        fns[f"s{s}"] = lambda i, lns=lns, outs=outs: lns[i](serve.current_stream(0), outs[i].data_ptr())
    fns["sdpa_cudnn"] = lambda i: F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in sets[i]))
    ms = time_many(fns, len(sets), ctxs={"sdpa_cudnn": lambda: sdpa_kernel([SDPBackend.CUDNN_ATTENTION])},
                   graphs=True, rounds=11, block_ms=1.0)
    return {"us": {k: v * 1e3 for k, v in ms.items()}, "pick": pick,
            "ok": all(e <= 2 * b + 1e-3 for e, b in errs.values())}


def pieces(res: dict[str, Any]) -> None:
    import torch
    for model, H, D, B, S in MHA:
        name = f"{model}_b{B}_k{S}"
        r = res["pieces"][name] = _pieces_one(H, D, B, S)
        print(name, "pick", r["pick"], {k: round(v, 1) for k, v in r["us"].items()}, flush=True)
        torch.cuda.empty_cache()


def report(res: dict[str, Any]) -> str:
    rows = ["| cache filled to | kvcache µs | dense µs | SDPA-cuDNN µs | cuDNN / kvcache | eager µs/call kvcache | "
            "eager µs/call dense | ok |", "|---|---|---|---|---|---|---|---|"]
    for name, r in res["kvcache"].items():
        u, h = r["us"], r["eager_us"]
        rows.append(f"| {name} | {u['kvcache']:.1f} | {u['dense']:.1f} | {u['sdpa_cudnn']:.1f} | "
                    f"{u['sdpa_cudnn'] / u['kvcache']:.3f} | {h['kvcache']:.1f} | {h['dense']:.1f} | "
                    f"{'yes' if r['ok'] else 'NO'} |")
    rows += ["", "| MHA shape | model's pieces | its µs | best pieces | its µs | SDPA-cuDNN µs | cuDNN / model's | "
             "cuDNN / best | ok |", "|---|---|---|---|---|---|---|---|---|"]
    for name, r in res["pieces"].items():
        u = r["us"]
        own = {int(k[1:]): v for k, v in u.items() if k[0] == "s" and k[1:].isdigit()}
        b = min(own, key=own.get)
        rows.append(f"| {name} | {r['pick']} | {own[r['pick']]:.1f} | {b} | {own[b]:.1f} | {u['sdpa_cudnn']:.1f} | "
                    f"{u['sdpa_cudnn'] / own[r['pick']]:.3f} | {u['sdpa_cudnn'] / own[b]:.3f} | "
                    f"{'yes' if r['ok'] else 'NO'} |")
        rows.append("|  | all: " + ", ".join(f"{s}: {own[s]:.1f}" for s in sorted(own)) + " | | | | | | | |")
    return "\n".join(rows)


def main(out: Path) -> None:
    import torch
    res = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "torch": torch.__version__, "kvcache": {}, "pieces": {}}
    kvcache(res)
    out.write_text(json.dumps(res, indent=1, sort_keys=True))
    pieces(res)
    out.write_text(json.dumps(res, indent=1, sort_keys=True))
    print(report(res))


if __name__ == "__main__":
    if "--report" in sys.argv:
        print(report(json.loads(Path(sys.argv[sys.argv.index("--report") + 1]).read_text())))
    else:
        o = Path(sys.argv[sys.argv.index("--out") + 1])
        o.parent.mkdir(parents=True, exist_ok=True)
        main(o)
