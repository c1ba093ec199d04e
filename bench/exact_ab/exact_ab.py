"""Class kernel vs exact-shape kernel vs the peers, per shape (prepare: CPU; run: GPU).

    PTSOLVE_CACHE_DIR=.cache_exact python -m bench exact_ab prepare
    PTSOLVE_CACHE_DIR=.cache_exact python -m bench exact_ab run --out FILE.json
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from ptsolve import serve
from ptsolve.serve import exact

LLM_NK = ((4096, 4096), (14336, 4096), (4096, 14336))
GEMMS = [{"M": m, "N": n, "K": k} for m in (1, 16, 64, 128, 333, 1000, 4096) for n, k in LLM_NK] + [
    {"M": 1000, "N": 1000, "K": 1000}, {"M": 3000, "N": 3000, "K": 3000}]
# (batch, heads, kv_heads, seq_q, seq_kv, head_dim, causal): held-out prefill shapes of ../shared/shapes.md
ATTN = [(16, 12, 12, 128, 128, 64, False), (16, 12, 12, 511, 511, 64, True), (1, 64, 8, 1536, 1536, 128, True),
        (4, 28, 4, 2047, 2047, 128, False), (8, 32, 8, 1000, 1000, 128, True), (2, 71, 1, 4097, 4097, 64, False),
        (4, 14, 2, 1000, 1000, 64, True), (1, 32, 8, 511, 4097, 128, True)]


def _attn_params(s: tuple) -> dict[str, Any]:
    b, h, hk, sq, skv, d, causal = s
    return {"batch": b, "heads": h, "kv_heads": hk, "seq_q": sq, "seq_kv": skv, "head_dim": d, "causal": causal,
            "dtype": "fp16"}


def cases() -> list[tuple[Any, dict[str, Any]]]:
    """(class, params) of every shape."""
    out = [(serve.gemm_class("fp16"), {**g, "dtype": "fp16"}) for g in GEMMS]
    for s in ATTN:
        p = _attn_params(s)
        out.append((serve.attention_class("fp16", p["head_dim"], p["causal"], p["heads"], p["kv_heads"]), p))
    return out


def prepare() -> None:
    os.environ["PTSOLVE_EXACT"] = "sync"
    for c in sorted({c for c, _ in cases()}, key=lambda c: c.key):
        serve.compile_class(c)
    for c, p in cases():
        t0 = time.perf_counter()
        ck, _ = exact.exact_kernel(c, p)
        entry = json.loads((exact.store() / f"{exact.shape_key(c, p)}.json").read_text())
        print(c.key, p, "class" if ck is None else ck.ir.tiling, entry.get("status", entry.get("error")),
              f"{time.perf_counter() - t0:.1f} s", flush=True)


def _gemm_fns(c: Any, p: dict[str, Any], ck: Any) -> tuple[dict[str, Any], Any, float]:
    import torch

    from ptsolve.serve import gemm as sg
    a = [torch.randn(p["M"], p["K"], device="cuda", dtype=torch.float16) for _ in range(2)]
    b = [torch.randn(p["N"], p["K"], device="cuda", dtype=torch.float16) for _ in range(2)]
    out = torch.empty(p["M"], p["N"], device="cuda", dtype=torch.float16)
    ref = a[0].float() @ b[0].float().T
    lns = {"class": [sg._gemm_launch(a[i], b[i], c, serve.kernel(c)) for i in range(2)]}
    if ck is not None:
        lns["exact"] = [sg._gemm_launch(a[i], b[i], c, ck) for i in range(2)]
    stream = torch.cuda.current_stream().cuda_stream
    fns = {k: (lambda i, ls=ls: ls[i](stream, out.data_ptr())) for k, ls in lns.items()}
    fns["cublas"] = lambda i: torch.matmul(a[i], b[i].T, out=out)
    return fns, (out, ref), 2.0 * p["M"] * p["N"] * p["K"]


def _attn_fns(c: Any, p: dict[str, Any], ck: Any) -> tuple[dict[str, Any], Any, float]:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ptsolve.serve import attention as sa
    B, H, Hk, Sq, Skv, D = (p[k] for k in ("batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim"))
    q = [torch.randn(B, Sq, H, D, device="cuda", dtype=torch.float16) for _ in range(2)]
    k = [torch.randn(B, Skv, Hk, D, device="cuda", dtype=torch.float16) for _ in range(2)]
    v = [torch.randn(B, Skv, Hk, D, device="cuda", dtype=torch.float16) for _ in range(2)]
    out = torch.empty_like(q[0])
    scale = D ** -0.5
    qt = [x.transpose(1, 2) for x in q]
    kt = [x.transpose(1, 2).repeat_interleave(H // Hk, 1) for x in k]
    vt = [x.transpose(1, 2).repeat_interleave(H // Hk, 1) for x in v]
    mask = None
    if p["causal"]:  # bottom-right aligned
        mask = torch.ones(Sq, Skv, dtype=torch.bool, device="cuda").tril(Skv - Sq)
    ref = F.scaled_dot_product_attention(qt[0].float(), kt[0].float(), vt[0].float(), attn_mask=mask).transpose(1, 2)
    lns = {"class": [sa._attention_launch(q[i], k[i], v[i], c, serve.kernel(c), scale, None, None, 0, 0)
                     for i in range(2)]}
    if ck is not None:
        lns["exact"] = [sa._attention_launch(q[i], k[i], v[i], c, ck, scale, None, None, 0, 0) for i in range(2)]
    stream = torch.cuda.current_stream().cuda_stream
    fns: dict[str, Any] = {n: (lambda i, ls=ls: ls[i](stream, out.data_ptr())) for n, ls in lns.items()}
    causal_sdpa = p["causal"] and Sq == Skv  # SDPA's is_causal is top-left: only square shapes match
    if not p["causal"] or causal_sdpa:
        for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
            def f(i, be=be):
                with sdpa_kernel(be):
                    return F.scaled_dot_product_attention(qt[i], kt[i], vt[i], is_causal=causal_sdpa)
            try:
                f(0)
                fns[name] = f
            except RuntimeError:
                pass
    flops = 4.0 * B * H * Sq * Skv * D * (0.5 if p["causal"] else 1.0)
    return fns, (out, ref), flops


def run(out_path: Path) -> None:
    import torch

    from codegen.harness import rel_err, time_many
    rows = []
    for c, p in cases():
        ck, final = exact.exact_kernel(c, p)  # PTSOLVE_EXACT=off on the GPU: only the answers prepared on the CPU
        fns, (out, ref), flops = (_gemm_fns if c.op == "gemm" else _attn_fns)(c, p, ck)
        errs = {}
        for n, f in fns.items():
            if n in ("class", "exact"):
                out.zero_()
                f(0)
                torch.cuda.synchronize()
                errs[n] = rel_err(out.float(), ref)
        ms = time_many(fns, 2, rounds=11, block_ms=1.0)
        us = {n: round(1e3 * m, 2) for n, m in ms.items()}
        row = {"class": c.key, "shape": p, "us": us, "rel_err": errs, "exact_tiling": ck and ck.ir.tiling,
               "class_tiling": serve.kernel(c).ir.tiling,
               "tflops": {n: round(flops / (u * 1e6), 1) for n, u in us.items()}}
        rows.append(row)
        print(json.dumps(row), flush=True)
    from ptsolve.provenance import stamp
    data = {"device": torch.cuda.get_device_name(), **stamp(), "command": "python3 -m bench exact_ab run", "rows": rows}
    out_path.write_text(json.dumps(data, indent=1))
    print(report(data))


def report(data: list[dict[str, Any]] | dict[str, Any]) -> str:
    """One line per shape: µs of each, class/exact, best peer / the faster of class and exact (what serve.exact.race
    keeps); ``data``: the rows, or the kept file (``rows`` with its device, date, commit and command)."""
    rows = data["rows"] if isinstance(data, dict) else data
    out = ([f"# exact_ab: {data['device']}, {data['date']}, commit {data['commit']}",
            f"command: `{data['command']}`", ""] if isinstance(data, dict) else [])
    out += ["| shape | class µs | exact µs | peer µs (best) | class/exact | peer/ours |", "|---|---|---|---|---|---|"]
    sp, vs = [], []
    for r in rows:
        u = r["us"]
        ours = min(u["class"], u.get("exact", math.inf))
        peers = {k: v for k, v in u.items() if k not in ("class", "exact")}
        best = min(peers.items(), key=lambda kv: kv[1]) if peers else ("-", math.nan)
        s = u["class"] / u["exact"] if "exact" in u else 1.0
        sp.append(s)
        if peers:  # a shape no peer takes (SDPA's causal mask is top-left) is in no peer figure
            vs.append(best[1] / min(u["class"], u.get("exact", math.inf)))
        shape = ",".join(f"{k}={v}" for k, v in r["shape"].items() if k != "dtype")
        out.append(f"| {shape} | {u['class']} | {u.get('exact', '-')} | {best[1]} ({best[0]}) | {s:.2f} | "
                   f"{best[1] / ours:.2f} |")
    g = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))  # noqa: E731
    out.append(f"\ngeomean class/exact {g(sp):.3f}; best peer / ptsolve (the faster of class and exact) {g(vs):.3f} "
               f"(min {min(vs):.2f}, {len(vs)} shapes with a peer)")
    return "\n".join(out)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("prepare", "run"))
    ap.add_argument("--out", type=Path, default=Path("exact_ab.json"))
    a = ap.parse_args()
    prepare() if a.what == "prepare" else run(a.out)
