"""Host time of a decode call through ``ptsolve.torch.flash_attention`` when the cache is new each step, as with
transformers' dynamic cache (a torch.cat per step: new addresses and a new length, so no kept launch applies),
next to a warm call (the same tensors) and SDPA. Llama-3-8B's attention shape, batch 1, cache 4096 + step, fp16.

    python -m bench torch_decode host --out $OUT/host.json      # GPU
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main(out: Path) -> None:
    import torch
    import torch.nn.functional as F

    import ptsolve.torch as pt
    B, H, Hkv, D, S0, N = 1, 32, 8, 128, 4096, 200
    q = torch.randn(B, 1, H, D, device="cuda", dtype=torch.float16)
    k0 = torch.randn(B, S0 + N, Hkv, D, device="cuda", dtype=torch.float16)
    v0 = torch.randn_like(k0)
    caches = [(k0[:, :S0 + i].clone(), v0[:, :S0 + i].clone()) for i in range(N)]  # new tensors per step
    res = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}

    def per_call(fn, n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(n):
            fn(i)
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / n * 1e6

    from ptsolve import serve
    c = serve.decode_class("fp16", D, False, H, Hkv, 1)
    t0 = time.perf_counter()
    pt.flash_attention(q, *caches[0])  # the class's module load, its first re-timing
    res["first_call_ms"] = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    serve.decode_splits(c, {"batch": B, "heads": H, "kv_heads": Hkv, "seq_q": 1, "seq_kv": 3 * S0, "head_dim": D,
                              "causal": False, "dtype": "fp16"})
    res["retiming_ms"] = (time.perf_counter() - t0) * 1e3  # a new cache-length bucket
    for k, v in caches:  # every length's bucket re-timed, on other tensors: the timed calls below are cold launches
        pt.flash_attention(q, k.clone(), v.clone())
    res["new_cache_us"] = per_call(lambda i: pt.flash_attention(q, *caches[i]), N)
    import cProfile
    import io
    import pstats
    caches2 = [(k.clone(), v.clone()) for k, v in caches[:50]]
    prof = cProfile.Profile()
    prof.enable()
    for k, v in caches2:
        pt.flash_attention(q, k, v)
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(18)
    (out.parent / "host_profile.txt").write_text(buf.getvalue())
    res["warm_us"] = per_call(lambda i: pt.flash_attention(q, *caches[0]), N)
    sd = [(k.transpose(1, 2), v.transpose(1, 2)) for k, v in caches]
    qt = q.transpose(1, 2)
    res["sdpa_us"] = per_call(lambda i: F.scaled_dot_product_attention(qt, *sd[i], enable_gqa=True), N)
    res["parts_us"] = parts(q, caches)
    print(json.dumps(res))
    out.write_text(json.dumps(res, indent=1))


def parts(q, caches) -> dict:
    """µs per call of each step of a cold decode launch (``ptsolve.serve.decode._decode_prepare``), each timed alone."""
    import math
    import time as t

    from codegen import runtime
    from codegen.cuda import decode as cd
    from ptsolve import serve
    k, v = caches[-1]
    c = serve.decode_class("fp16", 128, False, 32, 8, 1)
    ck = serve.kernel(c)
    mod = ck.module()
    p = {"batch": 1, "heads": 32, "kv_heads": 8, "seq_q": 1, "seq_kv": k.shape[1], "head_dim": 128, "causal": False,
         "dtype": "fp16"}
    tl = dict(ck.ir.tiling, splits=serve.decode_splits(c, p))
    sz = cd.sizes(p, tl, mod.sms)
    mp = cd.maps(p, tl, {n: tuple(x.stride()[:3]) for n, x in (("q", q), ("k", k), ("v", v))})
    ws = {n: serve.prepared.scratch(q.device, ck.ks.name, n, b) for n, b in cd.generic_workspace(p, sz).items()}
    vals = {"q": q.data_ptr(), "k": k.data_ptr(), "v": v.data_ptr(), "o": 0, **ws,
            "scale_log2": 0.1 * math.log2(math.e), "seqlens": 0, **sz}
    steps = {"decode_splits (kept)": lambda i: serve.decode_splits(c, p),
             "sizes": lambda i: cd.sizes(p, tl, mod.sms),
             "maps": lambda i: cd.maps(p, tl, {n: tuple(x.stride()[:3]) for n, x in (("q", q), ("k", k), ("v", v))}),
             "index_error": lambda i: cd.index_error(p, tl),
             "scratch x3": lambda i: [serve.prepared.scratch(q.device, ck.ks.name, n, b)
                                      for n, b in cd.generic_workspace(p, sz).items()],
             "encode_tensor_map (one)": lambda i: runtime.encode_tensor_map(mp[1], k.data_ptr() + 16 * (i % 64)),
             "prepare (maps kept)": lambda i: mod.prepare(vals, mp, cd.grid(sz), out="o")}
    out = {}
    for name, fn in steps.items():
        fn(0)
        t0 = t.perf_counter()
        for i in range(200):
            fn(i)
        out[name] = (t.perf_counter() - t0) / 200 * 1e6
    return out


if __name__ == "__main__":
    o = Path(sys.argv[sys.argv.index("--out") + 1])
    o.parent.mkdir(parents=True, exist_ok=True)
    main(o)
