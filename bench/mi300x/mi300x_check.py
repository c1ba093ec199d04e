"""Correctness and timing of ptsolve's HIP kernels on an AMD Instinct MI300X: one command for whoever has one.

    python -m bench mi300x [--out results] [--quick] [--solver cpsat]

Needs ROCm, hipcc and a ROCm build of PyTorch (``torch.version.hip``); run from the repository root. For every
case, ptsolve schedules the operator for ``mi300x``, ``codegen.hip`` emits the kernel, hipcc builds a gfx942 code
object (``--genco``; ``--compiler clang19`` uses the compile path CI checks instead), the HIP runtime PyTorch loads
(libamdhip64, through ctypes) launches it on random inputs with a NaN-poisoned output, the result is compared with a
float32 reference (attention: FlashAttention's rule, error <= 2 x that of PyTorch's own fp16/bf16 SDPA + a
rounding floor), then kernel and baseline (``torch.matmul`` / ``F.scaled_dot_product_attention``) are timed with
HIP events in interleaved rounds (median). Writes ``<out>/mi300x_check.md`` and ``.json`` with device, ROCm and
torch versions, date and commit. Exits 1 when a kernel is wrong.

This script has never run: the project has no AMD GPU. Until someone runs it, every HIP result is "compile-verified,
not run" (codegen/hip/README.md).
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("gemm 4096^3 fp16", "gemm", {"M": 4096, "N": 4096, "K": 4096, "dtype": "fp16"}),
    ("gemm 8192^3 bf16", "gemm", {"M": 8192, "N": 8192, "K": 8192, "dtype": "bf16"}),
    ("gemm ragged 1000x520x3000 bf16", "gemm", {"M": 1000, "N": 520, "K": 3000, "dtype": "bf16"}),
    ("fa b1 h8 kv2 s2048 d64", "flash_attention",
     {"batch": 1, "heads": 8, "kv_heads": 2, "seq_q": 2048, "seq_kv": 2048, "head_dim": 64, "causal": False}),
    ("fa b2 h32 kv8 s4096 d128 causal", "flash_attention",
     {"batch": 2, "heads": 32, "kv_heads": 8, "seq_q": 4096, "seq_kv": 4096, "head_dim": 128, "causal": True}),
    ("fa b1 h16 kv4 s1000 d128 bf16 ragged", "flash_attention",
     {"batch": 1, "heads": 16, "kv_heads": 4, "seq_q": 1000, "seq_kv": 1000, "head_dim": 128, "causal": False,
      "dtype": "bf16"}),
]
QUICK = {0, 3}


class Hip:
    """The HIP runtime PyTorch uses, through ctypes: load a code object, launch a kernel on torch's stream."""

    def __init__(self) -> None:
        import torch
        libs = sorted(glob.glob(str(Path(torch.__file__).parent / "lib" / "libamdhip64.so*")))
        self.lib = ctypes.CDLL(libs[0] if libs else "libamdhip64.so")
        self.mods: list[ctypes.c_void_p] = []

    def check(self, err: int, what: str) -> None:
        if err != 0:
            self.lib.hipGetErrorString.restype = ctypes.c_char_p
            raise RuntimeError(f"{what}: HIP error {err} ({self.lib.hipGetErrorString(err).decode()})")

    def function(self, code: bytes, name: str) -> ctypes.c_void_p:
        mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
        buf = ctypes.create_string_buffer(code, len(code))
        self.check(self.lib.hipModuleLoadData(ctypes.byref(mod), buf), "hipModuleLoadData")
        self.mods.append(mod)
        self.check(self.lib.hipModuleGetFunction(ctypes.byref(fn), mod, name.encode()), "hipModuleGetFunction")
        return fn

    def launch(self, fn: ctypes.c_void_p, grid: tuple[int, int, int], block: tuple[int, int, int],
               tensors: list[Any]) -> None:
        import torch
        vals = [ctypes.c_void_p(t.data_ptr()) for t in tensors]
        params = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in vals])
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        self.check(self.lib.hipModuleLaunchKernel(fn, *grid, *block, 0, stream, params, None), "hipModuleLaunchKernel")


def build(src: Any, compiler: str) -> bytes:
    """A gfx942 code object of ``src``: hipcc --genco, or codegen.hip.compile's clang-19 path."""
    if compiler == "clang19":
        from codegen.hip import compile as clang_build
        return clang_build(src, cache=False).code_object
    hipcc = shutil.which("hipcc") or "/opt/rocm/bin/hipcc"
    with tempfile.TemporaryDirectory() as tmp:
        k, o = Path(tmp) / "k.hip", Path(tmp) / "k.hsaco"
        k.write_text(src.source)
        p = subprocess.run([hipcc, "--genco", f"--offload-arch={src.arch}", "-O3", "-o", str(o), str(k)],
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"hipcc failed on {src.name}:\n{p.stderr[-4000:]}")
        return o.read_bytes()


def timeit(fn: Any, base: Any, rounds: int = 7, reps: int = 20) -> tuple[float, float]:
    """Median microseconds of ``fn`` and ``base``, measured in interleaved rounds with HIP events."""
    import torch
    for _ in range(3):
        fn()
        base()
    t: dict[str, list[float]] = {"k": [], "b": []}
    for _ in range(rounds):
        for key, f in (("k", fn), ("b", base)):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(reps):
                f()
            e.record()
            e.synchronize()
            t[key].append(s.elapsed_time(e) * 1e3 / reps)
    return statistics.median(t["k"]), statistics.median(t["b"])


def run_case(hip: Hip, label: str, op_name: str, params: dict[str, Any], solver: str, compiler: str
             ) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    import ptsolve
    from codegen import hip as hipgen

    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[params.get("dtype", "fp16")]
    op = ptsolve.ops.make(op_name, **params)
    res = ptsolve.optimize(op, hw="mi300x", solver=solver, time_limit=60)
    src = hipgen.emit(res.program, "mi300x")
    fn = hip.function(build(src, compiler), src.name)
    cus = torch.cuda.get_device_properties(0).multi_processor_count
    grid = (min(src.persistent_tiles, cus), 1, 1) if src.persistent_tiles else src.grid
    g = torch.Generator(device="cuda").manual_seed(0)
    row: dict[str, Any] = {"case": label, "tiling": res.program.graph.tiling, "solver": res.solver,
                           "predicted_us": round(res.predicted_us, 2), "kernel": src.name}
    if op_name == "gemm":
        M, N, K = params["M"], params["N"], params["K"]
        a = torch.randn(M, K, device="cuda", dtype=dt, generator=g)
        b = torch.randn(N, K, device="cuda", dtype=dt, generator=g)
        c = torch.full((M, N), float("nan"), device="cuda", dtype=dt)
        hip.launch(fn, grid, src.block, [a, b, c])
        torch.cuda.synchronize()
        ref = a.float() @ b.float().T
        err = ((c.float() - ref).abs().max() / ref.abs().max()).item()
        ok = math.isfinite(err) and err <= (2e-2 if dt == torch.bfloat16 else 5e-3)
        us, base = timeit(lambda: hip.launch(fn, grid, src.block, [a, b, c]), lambda: torch.matmul(a, b.T))
        flops = 2 * M * N * K
        row |= {"baseline": "torch.matmul"}
    else:
        B, H, HKV, SQ, SKV, D = (params[k] for k in ("batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim"))
        q = torch.randn(B, SQ, H, D, device="cuda", dtype=dt, generator=g)
        k = torch.randn(B, SKV, HKV, D, device="cuda", dtype=dt, generator=g)
        v = torch.randn(B, SKV, HKV, D, device="cuda", dtype=dt, generator=g)
        o = torch.full((B, SQ, H, D), float("nan"), device="cuda", dtype=dt)
        hip.launch(fn, grid, src.block, [q, k, v, o])
        torch.cuda.synchronize()
        qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))
        kh, vh = kh.repeat_interleave(H // HKV, dim=1), vh.repeat_interleave(H // HKV, dim=1)
        causal = params["causal"]
        mask = None
        if causal:  # bottom-right aligned, as the kernel: query i sees keys <= i + SKV - SQ
            mask = torch.ones(SQ, SKV, device="cuda", dtype=torch.bool).tril(SKV - SQ)
        ref = F.scaled_dot_product_attention(qh.float(), kh.float(), vh.float(), attn_mask=mask).transpose(1, 2)
        low = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask).transpose(1, 2)
        floor = 1e-2 if dt == torch.bfloat16 else 1e-3
        bound = 2 * (low.float() - ref).abs().max().item() + floor
        err = (o.float() - ref).abs().max().item()
        ok = math.isfinite(err) and err <= bound
        row["bound"] = bound
        base_fn = (lambda: F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)) if causal and SQ == SKV \
            else (lambda: F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask))
        us, base = timeit(lambda: hip.launch(fn, grid, src.block, [q, k, v, o]), base_fn)
        from ptsolve.ops.attention import kept_pairs
        flops = 4 * B * H * D * kept_pairs(params | {"causal": causal})
        row |= {"baseline": "F.scaled_dot_product_attention (K/V heads expanded)"}
    return row | {"max_err": err, "ok": ok, "us": round(us, 2), "baseline_us": round(base, 2),
                  "tflops": round(flops / us / 1e6, 1), "baseline_tflops": round(flops / base / 1e6, 1),
                  "speedup_vs_baseline": round(base / us, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "results")
    ap.add_argument("--quick", action="store_true", help="one GEMM and one attention case")
    ap.add_argument("--solver", default="cpsat", help="ptsolve solver for the schedules (default cpsat)")
    ap.add_argument("--compiler", choices=("hipcc", "clang19"), default="hipcc")
    a = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("mi300x_check: needs a ROCm build of PyTorch (pip install torch --index-url <the ROCm wheel index>)")
        return 2
    if not torch.cuda.is_available() or not getattr(torch.version, "hip", None):
        print("mi300x_check: needs a ROCm build of PyTorch and an AMD GPU (torch.version.hip is unset or no device)")
        return 2
    arch = getattr(torch.cuda.get_device_properties(0), "gcnArchName", "")
    if not arch.startswith("gfx942"):
        print(f"mi300x_check: the kernels are built for gfx942 (MI300X/MI325X); this device is {arch or 'unknown'}")
        return 2
    from ptsolve.provenance import stamp
    hip = Hip()
    rows = []
    for i, (label, op, params) in enumerate(CASES):
        if a.quick and i not in QUICK:
            continue
        try:
            r = run_case(hip, label, op, params, a.solver, a.compiler)
        except Exception as e:  # noqa: BLE001  (one broken case must not hide the others' results)
            r = {"case": label, "ok": False, "error": f"{type(e).__name__}: {e}"}
        rows.append(r)
        print(json.dumps(r, default=str), flush=True)
    dev = torch.cuda.get_device_name(0)
    prov = stamp() | {"device": dev, "arch": arch, "torch": torch.__version__, "hip": torch.version.hip,
                      "command": "python -m bench mi300x " + " ".join(sys.argv[1:])}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "mi300x_check.json").write_text(json.dumps({"provenance": prov, "rows": rows}, indent=1, default=str))
    lines = [f"# ptsolve HIP kernels on {dev} ({arch}): measured", ""] + [f"- {k}: {v}" for k, v in prov.items()]
    lines += ["", "| case | tiling | ok | max err | µs | baseline µs | TFLOP/s | baseline TFLOP/s | speedup |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['case']} | | FAIL: {r['error'][:120]} | | | | | | |")
            continue
        lines.append(f"| {r['case']} | {r['tiling']} | {'ok' if r['ok'] else 'WRONG'} | {r['max_err']:.2e} | "
                     f"{r['us']} | {r['baseline_us']} | {r['tflops']} | {r['baseline_tflops']} | "
                     f"{r['speedup_vs_baseline']} |")
    (a.out / "mi300x_check.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
