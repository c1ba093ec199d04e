"""The PyTorch path's GEMM (``ptsolve.torch.gemm``: the generic kernel of its class) before and after the GEMM
classes were re-solved with the TMA-store epilogue in the space, next to cuBLAS, in one process (issue 13).

    PTSOLVE_CACHE_DIR=$PWD/.cubin_gen python -m bench tma_store torch_gemm_ab precompile   # CPU
    PTSOLVE_CACHE_DIR=$PWD/.cubin_gen python -m bench tma_store torch_gemm_ab run --out DIR  # GPU

"before" is ``results/tma_store/table_before.json``'s plan (``git show c9c8a0f:codegen/schedule_table.json``),
"after" the shipped table's; both launched as ``ptsolve.serve.gemm_launch`` launches them. Shapes: bench.gemm_space's
SHAPES with N and K multiples of 8 (what ``ptsolve.torch.gemm`` takes), fp16; outputs checked against a float32
product first; timed with CUDA graphs, interleaved rounds (codegen.harness.time_many).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[2] / "results/tma_store"  # the study's data
sys.path.insert(0, str(HERE.parents[1]))

from bench.gemm_space.gemm_space import SHAPES  # noqa: E402
from codegen.plan import KernelPlan  # noqa: E402
from ptsolve import serve  # noqa: E402


def kernels(dtype: str = "fp16") -> dict[str, serve.ClassKernel]:
    c = serve.gemm_class(dtype)
    before = json.loads((HERE / "table_before.json").read_text())["classes"][c.key]["plan"]
    old = KernelPlan.from_json(before if isinstance(before, str) else json.dumps(before))
    return {"before": serve.kernels.build(c, old), "after": serve.kernel(c)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cmd", choices=("precompile", "run"))
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    ks = kernels()
    if a.cmd == "precompile":
        from codegen.runtime import compile_kernel
        for k, ck in ks.items():
            print(k, ck.plan.tiling, {x: compile_kernel(ck.ks).report.get(x) for x in ("registers", "spill_stores")})
        return 0
    import torch

    from codegen.harness import TOL, rel_err, time_many
    c = serve.gemm_class("fp16")
    res = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime()),
           "tilings": {k: ck.plan.tiling for k, ck in ks.items()}, "shapes": {}}
    stream = torch.cuda.current_stream().cuda_stream
    for name, M, N, K, _ in SHAPES:
        if N % 8 or K % 8:
            continue
        sets = [(torch.randn(M, K, device="cuda", dtype=torch.float16),
                 torch.randn(N, K, device="cuda", dtype=torch.float16)) for _ in range(2)]
        out = torch.empty(M, N, device="cuda", dtype=torch.float16)
        lns = {}
        for k, ck in ks.items():  # each kernel's own launches (the launcher caches by class: swap the kernel in)
            serve.kernels._KERNELS[c], serve.prepared.LAUNCHES = ck, {}
            lns[k] = [serve.gemm_launch(x, w, c) for x, w in sets]
        ref = sets[0][0].float() @ sets[0][1].float().T
        ok = {}
        for k, ln in lns.items():
            out.fill_(float("nan"))
            ln[0](stream, out.data_ptr())
            torch.cuda.synchronize()
            ok[k] = rel_err(out, ref)
        del ref
        fns = {k: (lambda i, ln=ln, out=out: ln[i](torch.cuda.current_stream().cuda_stream, out.data_ptr()))
               for k, ln in lns.items() if ok[k] <= TOL}
        fns["cublas"] = lambda i, sets=sets: torch.matmul(sets[i][0], sets[i][1].T)
        ms = time_many(fns, 2, graphs=True)
        res["shapes"][name] = {"M": M, "N": N, "K": K, "rel_err": ok, "us": {k: v * 1e3 for k, v in ms.items()}}
        print(f"{name}: " + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in ms.items())
              + "".join(f"; {k} FAILED {e:.2e}" for k, e in ok.items() if e > TOL), flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "torch_gemm_ab.json").write_text(json.dumps(res, indent=1))
    r = [s["us"] for s in res["shapes"].values()]

    def geo(xs: list[float]) -> float:
        return math.exp(sum(map(math.log, xs)) / len(xs))
    print(f"| shapes | before / cuBLAS | after / cuBLAS | after vs before |\n|---|---|---|---|\n| {len(r)} | "
          f"{geo([u['cublas'] / u['before'] for u in r]):.3f} | {geo([u['cublas'] / u['after'] for u in r]):.3f} | "
          f"{geo([u['before'] / u['after'] for u in r]):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
