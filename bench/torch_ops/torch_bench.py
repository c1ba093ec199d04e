"""ptsolve.torch on the GPU: host overhead of a warm call, a second process's first call (nvcc runs, seconds), a
Hugging Face Llama-style decoder with ptsolve attention against SDPA, and one LLaMA3-8B decoder layer on ptsolve
kernels (attention + GEMMs) against PyTorch (SDPA cuDNN + cuBLAS), eager and torch.compile.

    python -m bench torch_ops --out DIR [--quick]

Writes DIR/torch_bench.json and prints a Markdown summary. Timings: CUDA events around a CUDA-graph-free loop,
median of rounds after warm-up; the same process times the baseline beside ours.
"""
# ruff: noqa: B023  (the timed lambdas run inside the loop iteration that made them)
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import ptsolve.torch as pt

ROOT = Path(__file__).resolve().parents[2]


def cuda_time(fn, warm: int = 3, rounds: int = 10) -> float:
    """Median ms of ``fn()`` (CUDA events)."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def host_us(fn, n: int = 2000) -> float:
    """Host µs per call of ``fn`` in a tight loop (a tiny shape: the GPU keeps up, so the loop is the host's)."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = math.inf
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t) / n * 1e6)
        torch.cuda.synchronize()
    return best


def overhead() -> dict:
    from ptsolve import serve
    q, k, v = (torch.randn(1, 64, 2, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    out = torch.empty_like(q)
    c = serve.attention_class("fp16", 64, True, 2, 2)
    a, b = torch.randn(64, 64, device="cuda", dtype=torch.float16), torch.randn(64, 64, device="cuda",
                                                                                dtype=torch.float16)
    co = torch.empty(64, 64, device="cuda", dtype=torch.float16)
    gc = serve.gemm_class("fp16")
    return {
        "flash_attention (public API, eager)": host_us(lambda: pt.flash_attention(q, k, v, causal=True)),
        "torch.ops.ptsolve.flash_attention (through the dispatcher)": host_us(
            lambda: torch.ops.ptsolve.flash_attention(q, k, v, True, 0.125)),
        "ptsolve.serve.attention (launch path only)": host_us(
            lambda: serve.attention.attention(q, k, v, out, c, 0.125)),
        "F.scaled_dot_product_attention (reference)": host_us(
            lambda: F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                   is_causal=True)),
        "gemm (public API, eager)": host_us(lambda: pt.gemm(a, b)),
        "torch.ops.ptsolve.gemm (through the dispatcher)": host_us(lambda: torch.ops.ptsolve.gemm(a, b)),
        "ptsolve.serve.gemm (launch path only)": host_us(lambda: serve.gemm.gemm(a, b, co, gc)),
        "F.linear (reference)": host_us(lambda: F.linear(a, b)),
    }


SECOND = """
import time, json
t0 = time.perf_counter()
import torch, ptsolve.torch as pt
from codegen import runtime
from ptsolve import serve
q = torch.randn(2, 300, 8, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(2, 500, 2, 128, device="cuda", dtype=torch.bfloat16)
t1 = time.perf_counter()
ck = serve.kernel(serve.attention_class("bf16", 128, True, 8, 2))
ta = time.perf_counter()
ck.module()
tb = time.perf_counter()
o = pt.flash_attention(q, k, k, causal=True); torch.cuda.synchronize()
t2 = time.perf_counter()
o = pt.flash_attention(q[:, :77], k[:, :99], k[:, :99], causal=True); torch.cuda.synchronize()
t3 = time.perf_counter()
print(json.dumps({"nvcc_runs": runtime.NVCC_RUNS[0], "first_call_s": t2 - t1, "of_which_schedule_lower_emit_s": ta - t1,
                  "of_which_cubin_load_s": tb - ta, "new_shape_call_s": t3 - t2, "import_and_inputs_s": t1 - t0}))
"""


def second_process() -> dict:
    r = subprocess.run([sys.executable, "-c", SECOND], capture_output=True, text=True, cwd=ROOT, timeout=300)
    if r.returncode:
        return {"error": r.stderr[-1500:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def hf_llama(quick: bool) -> dict:
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    name = pt.register_transformers()
    cfg = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=16,
                      num_key_value_heads=4, head_dim=64, vocab_size=32000, max_position_embeddings=4096)
    torch.manual_seed(0)
    out = {"transformers": transformers.__version__, "config": "hidden 1024, 4 layers, 16 heads, 4 kv heads, "
           "head_dim 64, vocab 32000, random weights"}
    model32 = LlamaForCausalLM(cfg).to("cuda").eval()
    for dtype in (torch.bfloat16,):
        m = LlamaForCausalLM(cfg).to("cuda", dtype).eval()
        m.load_state_dict(model32.state_dict())
        ids = torch.randint(0, cfg.vocab_size, (2, 512 if quick else 1024), device="cuda")
        with torch.no_grad():
            set_attn(model32, "sdpa")
            ref = model32(ids).logits.float()
            set_attn(m, "sdpa")
            sdpa = m(ids).logits.float()
            t_sdpa = cuda_time(lambda: m(ids))
            set_attn(m, name)
            ours = m(ids).logits.float()
            t_ours = cuda_time(lambda: m(ids))
        e_ours, e_sdpa = (ours - ref).abs().max().item(), (sdpa - ref).abs().max().item()
        out[str(dtype)] = {"tokens": list(ids.shape), "max_abs_err_ptsolve_vs_fp32": e_ours,
                           "max_abs_err_sdpa_vs_fp32": e_sdpa,
                           "max_abs_ptsolve_vs_sdpa": (ours - sdpa).abs().max().item(),
                           "logits_scale": ref.abs().max().item(), "ok": e_ours <= 2 * e_sdpa + 1e-2,
                           "forward_ms_ptsolve": t_ours, "forward_ms_sdpa": t_sdpa}
    return out


def set_attn(model, name: str) -> None:
    """Switch a transformers model's attention function (the installed version's API, else its config field)."""
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    else:
        model.config._attn_implementation = name


class Layer:
    """One LLaMA3-8B decoder layer (fp16): RMSNorm, fused QKV projection, RoPE, causal GQA attention, output
    projection, RMSNorm, fused gate/up projection, SiLU·up, down projection, residuals. ``ours``: ptsolve's
    attention and GEMMs; otherwise SDPA (cuDNN backend) and F.linear (cuBLAS)."""

    def __init__(self, hidden=4096, heads=32, kv=8, hd=128, inter=14336, dtype=torch.float16):
        g = torch.Generator(device="cuda").manual_seed(0)

        def w(o, i):
            return (torch.randn(o, i, device="cuda", dtype=dtype, generator=g) / math.sqrt(i))
        self.h, self.nh, self.nkv, self.hd, self.inter = hidden, heads, kv, hd, inter
        self.wqkv, self.wo = w((heads + 2 * kv) * hd, hidden), w(hidden, heads * hd)
        self.wgu, self.wd = w(2 * inter, hidden), w(hidden, inter)
        self.n1 = torch.ones(hidden, device="cuda", dtype=dtype)
        self.n2 = torch.ones(hidden, device="cuda", dtype=dtype)

    def rope(self, x, pos):
        d = x.shape[-1]
        inv = 1.0 / (500000.0 ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
        f = pos[:, None].float() * inv[None]
        cos, sin = f.cos()[None, :, None, :].to(x.dtype), f.sin()[None, :, None, :].to(x.dtype)
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    def forward(self, x, ours: bool):
        lin = pt.gemm if ours else F.linear
        B, S, _ = x.shape
        h = F.rms_norm(x, (self.h,), self.n1)
        qkv = lin(h, self.wqkv)
        q, k, v = qkv.split([self.nh * self.hd, self.nkv * self.hd, self.nkv * self.hd], -1)
        pos = torch.arange(S, device=x.device)
        q = self.rope(q.reshape(B, S, self.nh, self.hd), pos)
        k = self.rope(k.reshape(B, S, self.nkv, self.hd), pos)
        v = v.reshape(B, S, self.nkv, self.hd)
        if ours:
            a = pt.flash_attention(q, k, v, causal=True)
        else:  # the caller picks the SDPA backend (cudnn)
            a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True, enable_gqa=True).transpose(1, 2)
        x = x + lin(a.reshape(B, S, self.nh * self.hd), self.wo)
        h = F.rms_norm(x, (self.h,), self.n2)
        gu = lin(h, self.wgu)
        gate, up = gu.split([self.inter, self.inter], -1)
        return x + lin(F.silu(gate) * up, self.wd)


def cudnn(fn):
    """``fn`` run with SDPA restricted to its cuDNN backend (the FA3-class baseline)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def run(*a):
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return fn(*a)
    return run


def llama_layer(quick: bool) -> list[dict]:
    layer = Layer()
    shapes = [(1, 512), (1, 4096)] if quick else [(1, 512), (1, 2048), (1, 8192), (64, 512), (16, 2048)]
    rows = []
    ours_eager, torch_eager = (lambda x: layer.forward(x, True)), cudnn(lambda x: layer.forward(x, False))
    comp = {True: torch.compile(ours_eager, fullgraph=True),
            False: cudnn(torch.compile(lambda x: layer.forward(x, False), fullgraph=True))}
    for B, S in shapes:
        x = torch.randn(B, S, layer.h, device="cuda", dtype=torch.float16) * 0.5
        with torch.no_grad():
            ref, ours = torch_eager(x), ours_eager(x)
            r = {"batch": B, "seq": S, "max_abs_diff": (ours - ref).abs().max().item(),
                 "ref_max_abs": ref.abs().max().item(),
                 "eager_ms_ptsolve": cuda_time(lambda: ours_eager(x)),
                 "eager_ms_torch": cuda_time(lambda: torch_eager(x))}
            if (B, S) == shapes[-1]:  # torch.compile on one shape (its compile time is the device's)
                r["compile_ms_ptsolve"] = cuda_time(lambda: comp[True](x))
                r["compile_ms_torch"] = cuda_time(lambda: comp[False](x))
        rows.append(r)
        print(json.dumps(r), flush=True)
    return rows


def attention_speed(quick: bool) -> list[dict]:
    """ptsolve.torch.flash_attention beside SDPA (cuDNN) on LLaMA3-8B attention shapes, causal, fp16."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    rows = []
    for B, S in ([(1, 4096)] if quick else [(1, 512), (1, 4096), (1, 8192), (16, 2048)]):
        q = torch.randn(B, S, 32, 128, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(B, S, 8, 128, device="cuda", dtype=torch.float16) for _ in range(2))
        ours = cuda_time(lambda: pt.flash_attention(q, k, v, causal=True), rounds=20)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            ref = cuda_time(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True),
                            rounds=20)
        flops = 4 * B * 32 * 128 * S * S / 2
        rows.append({"batch": B, "seq": S, "ms_ptsolve": ours, "ms_sdpa_cudnn": ref,
                     "tflops_ptsolve": flops / ours / 1e9, "tflops_sdpa_cudnn": flops / ref / 1e9})
    return rows


def _f(x: object, nd: int = 2) -> str:
    return f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def render(res: dict, command: str) -> str:
    """The Markdown report of a torch_bench.json."""
    L = [f"# ptsolve.torch on an {res['device']}", "",
         f"Made by `{command}` on {res['date']}, commit {res['commit']}, torch {res['torch']}.", ""]
    if isinstance(res.get("host_us"), dict) and "error" not in res["host_us"]:
        L += ["## Host overhead of a warm call (µs per call, tight loop on a tiny shape, best of 5 × 2000)", "",
              "| call | µs |", "|---|---|"]
        L += [f"| {k} | {_f(v, 1)} |" for k, v in res["host_us"].items()]
        L.append("")
    sp = res.get("second_process")
    if isinstance(sp, dict):
        L += ["## A second process (warm disk cache)", "", "| " + " | ".join(sp) + " |",
              "|" + "---|" * len(sp), "| " + " | ".join(_f(v, 3) for v in sp.values()) + " |", ""]
    at = res.get("attention")
    if isinstance(at, list):
        L += ["## Attention, LLaMA3-8B heads (32 q, 8 kv, d 128), causal, fp16", "",
              "| batch | seq | ptsolve ms | SDPA cuDNN ms | ptsolve TFLOP/s | cuDNN TFLOP/s | ratio |",
              "|---|---|---|---|---|---|---|"]
        L += [f"| {r['batch']} | {r['seq']} | {_f(r['ms_ptsolve'], 3)} | {_f(r['ms_sdpa_cudnn'], 3)} | "
              f"{_f(r['tflops_ptsolve'], 0)} | {_f(r['tflops_sdpa_cudnn'], 0)} | "
              f"{_f(r['ms_sdpa_cudnn'] / r['ms_ptsolve'], 3)} |" for r in at]
        L.append("")
    hf = res.get("hf_llama")
    if isinstance(hf, dict):
        L += ["## transformers Llama (random weights) with `attn_implementation=\"ptsolve\"` vs SDPA", "",
              f"transformers {hf.get('transformers')}; {hf.get('config')}.", ""]
        for k, v in hf.items():
            if isinstance(v, dict):
                L += [f"- {k}, tokens {v['tokens']}: max |logits − fp32| ptsolve "
                      f"{_f(v['max_abs_err_ptsolve_vs_fp32'], 4)}, SDPA {_f(v['max_abs_err_sdpa_vs_fp32'], 4)} "
                      f"(logits up to {_f(v['logits_scale'])}); "
                      f"ptsolve vs SDPA {_f(v['max_abs_ptsolve_vs_sdpa'], 4)}; within 2·SDPA's + 1e-2: {v['ok']}; "
                      f"forward {_f(v['forward_ms_ptsolve'], 3)} ms vs SDPA {_f(v['forward_ms_sdpa'], 3)} ms"]
        if "error" in hf:
            L.append(f"- error: {hf['error']}")
        L.append("")
    ly = res.get("llama3_8b_layer")
    if isinstance(ly, list):
        L += ["## One LLaMA3-8B decoder layer, fp16: ptsolve (attention + GEMMs) vs PyTorch (SDPA cuDNN + cuBLAS)", "",
              "| batch | seq | max abs diff (out up to) | eager ptsolve ms | eager torch ms | eager ratio | "
              "compiled ptsolve ms | compiled torch ms | compiled ratio |", "|---|---|---|---|---|---|---|---|---|"]
        for r in ly:
            c = "– | – | –"
            if "compile_ms_ptsolve" in r:
                c = (f"{_f(r['compile_ms_ptsolve'], 3)} | {_f(r['compile_ms_torch'], 3)} | "
                     f"{_f(r['compile_ms_torch'] / r['compile_ms_ptsolve'], 3)}")
            L.append(f"| {r['batch']} | {r['seq']} | {_f(r['max_abs_diff'], 4)} ({_f(r['ref_max_abs'], 1)}) | "
                     f"{_f(r['eager_ms_ptsolve'], 3)} | {_f(r['eager_ms_torch'], 3)} | "
                     f"{_f(r['eager_ms_torch'] / r['eager_ms_ptsolve'], 3)} | {c} |")
        L += ["", "ratio = PyTorch time / ptsolve time (> 1: ptsolve faster)."]
    for k, v in res.items():
        if isinstance(v, dict) and "error" in v:
            L += ["", f"**{k} failed**: `{v['error']}`"]
    return "\n".join(L) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: overhead,second,hf,layer,attn")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    skip = set(a.skip.split(","))
    res: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                 "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": os.environ.get("COMMIT", "?")}
    parts = [("overhead", "host_us", overhead), ("second", "second_process", second_process),
             ("attn", "attention", lambda: attention_speed(a.quick)), ("hf", "hf_llama", lambda: hf_llama(a.quick)),
             ("layer", "llama3_8b_layer", lambda: llama_layer(a.quick))]
    for key, name, fn in parts:
        if key in skip:
            continue
        t = time.perf_counter()
        try:
            res[name] = fn()
        except Exception as e:  # one part failing must not lose the others' numbers
            import traceback
            res[name] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]}
        print(f"== {name} ({time.perf_counter() - t:.1f} s)\n{json.dumps(res[name], indent=1)}", flush=True)
        (a.out / "torch_bench.json").write_text(json.dumps(res, indent=1))
    (a.out / "torch_h200.md").write_text(render(res, "python -m bench torch_ops " + " ".join(sys.argv[1:])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
