"""Split-K GEMM's reduction on the GPU: the last-arriving split summing the whole tile (``old``, commit dde918a, the
persistent kernel) against reduce CTAs (``new``: codegen.cuda.gemm, each summing a share of the tile once its
splits are counted), on the 12 shapes of the 45 whose first choice (``results/depth_tie/cands_tie.json``) splits K,
next to cuBLAS (``torch.matmul``), in one process.

    python -m bench gemm_reduce reduce_ab emit old --root <checkout of dde918a>     # CPU
    python -m bench gemm_reduce reduce_ab emit new                                  # CPU
    PTSOLVE_CACHE_DIR=$PWD/.cubin_gr python -m bench gemm_reduce reduce_ab compile  # CPU
    PTSOLVE_CACHE_DIR=$PWD/.cubin_gr python -m bench gemm_reduce reduce_ab run --out $OUT/ab.json   # GPU
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[2] / "results/gemm_reduce"  # the study's data
ROOT = HERE.parents[1]
if "--root" in sys.argv:
    sys.path.insert(0, sys.argv[sys.argv.index("--root") + 1])
sys.path.insert(0 if "--root" not in sys.argv else 1, str(ROOT))

from bench.ab.regress_ab import ks_of as _ks  # noqa: E402  (a KernelSource from its JSON)

SRC = HERE / "sources.json"
CANDS = ROOT / "results/depth_tie/cands_tie.json"


def emit(which: str) -> None:
    from codegen.cuda import emit as emit_source
    from codegen.plan import KernelPlan
    src = json.loads(SRC.read_text()) if SRC.exists() else {}
    for name, sh in json.loads(CANDS.read_text())["shapes"].items():
        c = sh["cands"]["tie"]
        if c["tiling"].get("splits", 1) == 1:
            continue
        plan = KernelPlan.from_json(c["plan"] if isinstance(c["plan"], str) else json.dumps(c["plan"]))
        row = src.setdefault(name, {"M": sh["M"], "N": sh["N"], "K": sh["K"], "tiling": c["tiling"],
                                    "predicted_us": c["predicted_us"], "kernels": {}})
        row["kernels"][which] = dataclasses.asdict(emit_source(plan, "h200"))
        print(name, c["tiling"], sorted(row["kernels"]), flush=True)
    SRC.write_text(json.dumps(src, indent=0, sort_keys=True))


def compile_all() -> None:
    from concurrent.futures import ThreadPoolExecutor

    import codegen.runtime as rt
    jobs = [_ks(d) for row in json.loads(SRC.read_text()).values() for d in row["kernels"].values()]
    with ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 1))) as ex:
        reps = list(ex.map(lambda ks: rt.compile_kernel(ks).report, jobs))
    bad = [(ks.name, r["spill_stores"], r["wgmma_serialized"]) for ks, r in zip(jobs, reps)
           if r["spill_stores"] or r["wgmma_serialized"]]
    print(f"{len(jobs)} cubins in {rt.cache_dir()}; spilling or serialised: {bad or 'none'}")


def run(out: Path) -> None:
    import torch

    from codegen.harness import rel_err, time_many
    from codegen.runtime import load
    res = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "torch": torch.__version__, "shapes": {}}
    for name, row in json.loads(SRC.read_text()).items():
        M, N, K = row["M"], row["N"], row["K"]
        nsets = max(2, min(8, int(200e6 // (2 * (M + N) * K))))
        torch.manual_seed(0)
        sets = [(torch.randn(M, K, device="cuda", dtype=torch.float16), torch.randn(N, K, device="cuda",
                 dtype=torch.float16), torch.full((M, N), float("nan"), device="cuda", dtype=torch.float16))
                for _ in range(nsets)]
        ptrs = [{"a": a.data_ptr(), "b": b.data_ptr(), "c": c.data_ptr()} for a, b, c in sets]
        ref = sets[0][0].float() @ sets[0][1].float().T
        rec = {"M": M, "N": N, "K": K, "tiling": row["tiling"], "predicted_us": row["predicted_us"], "err": {}}
        fns = {}
        for key, d in sorted(row["kernels"].items()):
            kern = load(_ks(d))
            outs = []
            for _ in range(2):  # the counters must be back at zero: two launches, bit-equal
                sets[0][2].fill_(float("nan"))
                kern.launch(ptrs[0], int(torch.cuda.current_stream().cuda_stream))
                torch.cuda.synchronize()
                outs.append(sets[0][2].clone())
            err = rel_err(outs[0], ref)
            rec["err"][key] = err
            if not (err <= 1e-2 and torch.equal(outs[0], outs[1])):
                print(f"  {name} {key}: rel err {err:.3g}, repeat equal {torch.equal(outs[0], outs[1])}: not timed")
                continue
            fns[key] = (lambda i, kk=kern, pp=ptrs: kk.launch(pp[i], int(torch.cuda.current_stream().cuda_stream)))
        fns["cublas"] = lambda i, s=sets: torch.matmul(s[i][0], s[i][1].T)
        ms = time_many(fns, nsets, graphs=True, rounds=21, block_ms=1.0)
        rec["us"] = {k: v * 1e3 for k, v in ms.items()}
        res["shapes"][name] = rec
        print(name, " ".join(f"{k} {v:.2f}" for k, v in sorted(rec["us"].items())), flush=True)
        sets = ptrs = ref = fns = None
        torch.cuda.empty_cache()
        out.write_text(json.dumps(res, indent=1, sort_keys=True))
    print(f"\ndone ({res['device']}, {res['date']}); µs per call, CUDA graphs, median of 21 interleaved rounds\n")
    report(out)


def report(runs: Path) -> None:
    import math
    res = json.loads(runs.read_text())
    print("| shape | tiling (splits) | model µs | old µs | new µs | new / old | cuBLAS µs | cuBLAS / old "
          "| cuBLAS / new |")
    print("|---|---|---|---|---|---|---|---|---|")
    ro, rn = [], []
    for name, r in res["shapes"].items():
        us = r["us"]
        o, n, cb = us.get("old"), us.get("new"), us["cublas"]
        t = r["tiling"]
        f = lambda x: f"{x:.2f}" if x else "—"  # noqa: E731
        print(f"| {name} | {t['BM']}x{t['BN']} d{t['depth']} ({t['splits']}) | {r['predicted_us']:.2f} | {f(o)} | "
              f"{f(n)} | {n / o:.3f} | {cb:.2f} | {cb / o:.3f} | {cb / n:.3f} |" if o and n else f"| {name} | ... |")
        if o and n:
            ro.append(cb / o)
            rn.append(cb / n)
    g = lambda x: math.exp(sum(map(math.log, x)) / len(x))  # noqa: E731
    if rn:
        print(f"\ngeomean cuBLAS / ours over {len(rn)} shapes: old {g(ro):.3f}, new {g(rn):.3f}")


def main(emit_fn: Any, report_fn: Any, argv: list[str]) -> None:
    """The scripts' command line over this harness: ``emit [args]`` (CPU: ``emit_fn(*args)``), ``compile`` (CPU),
    ``run --out <json>`` (GPU: every source's kernels next to cuBLAS), ``report <json>`` (``report_fn``)."""
    cmd = argv[1]
    if cmd == "emit":
        emit_fn(*argv[2:])
    elif cmd == "compile":
        compile_all()
    elif cmd == "run":
        run(Path(argv[argv.index("--out") + 1]))
    elif cmd == "report":
        report_fn(Path(argv[2]))
    else:
        raise SystemExit(f"unknown command {cmd!r}: emit, compile, run --out <json> or report <json>")


if __name__ == "__main__":
    main(emit, report, sys.argv)
