"""Where did the first cluster kernels lose 2-3x? Variants of cluster_ab.py's clustered sq1024 and GEMM0 kernels,
timed next to the unclustered one and cuBLAS in one process: v1 the cluster launch alone (each CTA loads its whole B
tile in two halves, arrives on its own empty barrier only), v2 v1 plus arrivals on both CTAs' empty barriers, v0 the
multicast kernel. The README's numbers were taken with the sources of the first cluster build, whose arrivals had
.release.cluster semantics (codegen.cuda.common.CLUSTER_FNS before the fix): v2 as slow as v0, v1 fast, so the
remote arrivals were the cost. Run after cluster_ab.py's emit (and ``compile`` here, with $PTSOLVE_CACHE_DIR set)::

    python -m bench gemm_skinny cluster_probe compile     # CPU
    python -m bench gemm_skinny cluster_probe run         # GPU
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[2] / "results/gemm_skinny"  # the study's data
sys.path.insert(0, str(HERE.parents[1]))

from bench.ab.regress_ab import ks_of  # noqa: E402

CASES = (("sq1024", "r0_64x128g1d5pp"), ("GEMM0", "r0_128x128g1d4pp"))
MC = re.compile(r"tma_load_2d_mc\(b_cur \+ cr_ \* (\d+), &tm_b, fbar_, \(K0 \+ it_\) \* 64, n0 \+ cr_ \* (\d+), "
                r"\(1 << CLUSTER\) - 1\);")


def variants() -> dict[str, dict[str, dict]]:
    src = json.loads((HERE / "cluster_sources.json").read_text())
    out = {}
    for name, key in CASES:
        d = src[name]["kernels"][key + "_cl2"]
        s = d["source"]
        mc = MC.search(s)
        two = (f"tma_load_2d(b_cur, &tm_b, fbar_, (K0 + it_) * 64, n0); "
               f"tma_load_2d(b_cur + {mc.group(1)}, &tm_b, fbar_, (K0 + it_) * 64, n0 + {mc.group(2)});")
        v2 = s.replace(mc.group(0), two)
        cnt = re.search(r"mbar_init\(&a_empty\[s\], (\d+)\)", s)
        v1 = re.sub(r"mbar_arrive_cluster\((.*?), CLUSTER\)", r"mbar_arrive(\1)", v2).replace(
            cnt.group(0), f"mbar_init(&a_empty[s], {int(cnt.group(1)) // 2})")
        out[name] = {"base": src[name]["kernels"][key], "v0": d, "v1": d | {"source": v1}, "v2": d | {"source": v2}}
    return out


def run() -> None:
    import torch

    from codegen.harness import rel_err, time_many
    from codegen.runtime import load
    src = json.loads((HERE / "cluster_sources.json").read_text())
    for name, vs in variants().items():
        M, N, K = (src[name][k] for k in ("M", "N", "K"))
        a = torch.randn(M, K, device="cuda", dtype=torch.float16)
        b = torch.randn(N, K, device="cuda", dtype=torch.float16)
        c = torch.empty(M, N, device="cuda", dtype=torch.float16)
        ptrs = {"a": a.data_ptr(), "b": b.data_ptr(), "c": c.data_ptr()}
        ref = a.float() @ b.float().T
        fns = {}
        for k, d in vs.items():
            kern = load(ks_of(d))
            c.zero_()
            kern.launch(ptrs, int(torch.cuda.current_stream().cuda_stream))
            torch.cuda.synchronize()
            print(name, k, "grid", kern.grid, "rel err", rel_err(c, ref), flush=True)
            fns[k] = (lambda i, kk=kern, pp=ptrs: kk.launch(pp, int(torch.cuda.current_stream().cuda_stream)))
        fns["cublas"] = lambda i, x=a, y=b: torch.matmul(x, y.T)
        ms = time_many(fns, 1, graphs=True, rounds=11, block_ms=1.0)
        print(name, {k: round(v * 1e3, 2) for k, v in ms.items()}, flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "compile":
        import codegen.runtime as rt
        for name, vs in variants().items():
            for k, d in vs.items():
                print(name, k, rt.compile_kernel(ks_of(d)).report["registers"])
    else:
        run()
