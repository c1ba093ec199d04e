"""The GEMM schedule space against cuBLAS: ptsolve's chosen kernel per shape, timed next to ``torch.matmul``.

CPU (solver, nvcc; the candidates travel with the repository, the cubins in the cache)::

    python3 -m codegen.gemm_space prepare --tag after --out results/gemm_space_h200/cands_after.json

For every shape of ``SHAPES`` (the paper's four GEMMs and the GEMM list of ``../shared/shapes.md``): the schedule
``ptsolve.optimize(gemm, hw)`` returns (CP-SAT, compile-checked), its tiling and predicted time, and the same
search restricted to the tilings without split-K (``splits`` = 1) for the "what split-K buys" column.

GPU (one call; no solver needed)::

    python3 -m codegen.gemm_space run results/gemm_space_h200/cands_*.json --out $OUT

Every distinct kernel is checked at the full shape against a float32 product (output poisoned with NaN, relative
Frobenius error <= 1e-2), then all of a shape's kernels and cuBLAS (``torch.matmul(a, b.T)``) are timed in one
``time_many`` call (CUDA graphs, interleaved rounds, median). Writes ``gemm_space.json``; ``report`` turns it
into the markdown table.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from ptsolve.suites import GEMMS

# (name, M, N, K, set): "paper" = ptsolve.suites.GEMMS; "llm" = M tokens x the N x K projections of shapes.md;
# "square" / "odd" = the other GEMM shapes of shapes.md (16384³ left out: one call's budget)
_NK = ((4096, 4096), (14336, 4096), (4096, 14336), (28672, 8192), (8192, 28672), (1024, 4096), (151936, 3584))
SHAPES: tuple[tuple[str, int, int, int, str], ...] = (
    *((f"GEMM{i}", m, n, k, "paper") for i, (m, n, k) in enumerate(GEMMS)),
    *((f"M{m}_{n}x{k}", m, n, k, "llm") for m in (1, 16, 128, 1024, 4096) for n, k in _NK),
    *((f"sq{s}", s, s, s, "square") for s in (1024, 2048, 4096, 8192)),
    ("odd1000", 1000, 1000, 1000, "odd"),
    ("odd4095x4097x1024", 4095, 4097, 1024, "odd"),
)


def shapes(only: tuple[str, ...] = ()) -> list[tuple[str, int, int, int, str]]:
    return [s for s in SHAPES if not only or s[0] in only]


def prepare(out: Path, tag: str, hw: str = "h200", only: tuple[str, ...] = (), base: bool = True,
            executor: str = "serial") -> dict[str, Any]:
    """Solve every shape (the full space and, when ``base``, the space without split-K); write the JSON."""
    import ptsolve
    from ptsolve.errors import PtsolveError

    from .plan import plan_from_program

    doc: dict[str, Any] = {"hw": hw, "tag": tag, "date": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime()),
                           "shapes": {}}
    for name, M, N, K, kind in shapes(only):
        e: dict[str, Any] = {"M": M, "N": N, "K": K, "set": kind, "cands": {}}
        spaces = {tag: None}
        if base:
            spaces[f"{tag}_nosplit"] = {"splits": 1}
        for label, fix in spaces.items():
            try:
                # no result cache: the cached schedules may predate the space's current structures
                r = ptsolve.optimize(ptsolve.ops.gemm(M=M, N=N, K=K), hw=hw, fix=fix, cache=False, executor=executor)
                e["cands"][label] = {"tiling": dict(r.program.graph.tiling), "predicted_us": r.predicted_us,
                                     "status": r.status, "check": (r.kernel_check or {}).get("status"),
                                     "plan": plan_from_program(r.program, hw).to_json()}
            except PtsolveError as ex:
                e["cands"][label] = {"error": f"{type(ex).__name__}: {ex}"}
        doc["shapes"][name] = e
        print(name, {k: (v.get("tiling"), round(v["predicted_us"], 1)) if "tiling" in v else v["error"][:80]
                     for k, v in e["cands"].items()}, flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    return doc


def _plans(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """shape -> label -> KernelPlan, over every candidates file (labels are the files' tags)."""
    from .plan import KernelPlan
    out: dict[str, dict[str, Any]] = {}
    for d in docs:
        for name, e in d["shapes"].items():
            for label, c in e["cands"].items():
                if "plan" in c:
                    out.setdefault(name, {})[label] = KernelPlan.from_json(c["plan"])
    return out


def precompile(docs: list[dict[str, Any]]) -> int:
    """Compile every kernel the run launches into $PTSOLVE_CACHE_DIR; returns how many distinct ones."""
    from .bench import precompile as pc
    plans = [p for v in _plans(docs).values() for p in v.values()]
    pc(plans)
    return len(plans)


def run(paths: list[Path], out: Path, only: tuple[str, ...] = ()) -> int:
    """Check and time every shape's kernels next to cuBLAS; write gemm_space.json (after every shape)."""
    import torch

    from .bench import TOL, precompile, rel_err, time_many
    from .cuda import emit
    from .runtime import load

    docs = [json.loads(p.read_text()) for p in paths]
    plans = _plans(docs)
    t0 = time.time()
    precompile([p for v in plans.values() for p in v.values()])
    print(f"compiled/loaded {sum(map(len, plans.values()))} plans in {time.time() - t0:.0f} s", flush=True)
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "date": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime()), "shapes": {}}
    torch.backends.cuda.matmul.allow_tf32 = False
    ok_all = True
    for name, M, N, K, kind in shapes(only):
        if name not in plans:
            continue
        tdt = torch.float16
        sets = [(torch.randn(M, K, device="cuda", dtype=tdt), torch.randn(N, K, device="cuda", dtype=tdt))
                for _ in range(2)]
        c = torch.empty(M, N, device="cuda", dtype=tdt)
        ref = sets[0][0].float() @ sets[0][1].float().T
        fns, checks = {}, {}
        kern = {label: load(emit(p)) for label, p in plans[name].items()}
        for label, kk in kern.items():
            ptrs = [{"a": a.data_ptr(), "b": b.data_ptr(), "c": c.data_ptr()} for a, b in sets]
            c.fill_(float("nan"))
            kk.launch(ptrs[0], int(torch.cuda.current_stream().cuda_stream))
            torch.cuda.synchronize()
            err = rel_err(c, ref)
            checks[label] = {"rel_err": err, "ok": bool(err <= TOL)}
            ok_all &= checks[label]["ok"]
            if checks[label]["ok"]:
                fns[label] = (lambda i, kk=kk, ptrs=ptrs:
                              kk.launch(ptrs[i], int(torch.cuda.current_stream().cuda_stream)))
        del ref
        fns["cublas"] = lambda i, sets=sets: torch.matmul(sets[i][0], sets[i][1].T)
        ms = time_many(fns, 2, graphs=True)
        res["shapes"][name] = {"M": M, "N": N, "K": K, "set": kind, "checks": checks,
                               "us": {k: v * 1e3 for k, v in ms.items()}}
        print(f"{name}: cublas {ms['cublas'] * 1e3:.1f} µs; " + ", ".join(
            f"{k} {v * 1e3:.1f} ({ms['cublas'] / v:.3f}x)" for k, v in ms.items() if k != "cublas")
            + "".join(f"; {k} FAILED check {v['rel_err']:.2e}" for k, v in checks.items() if not v["ok"]), flush=True)
        out.mkdir(parents=True, exist_ok=True)
        (out / "gemm_space.json").write_text(json.dumps(res, indent=1))
    print(f"done in {time.time() - t0:.0f} s")
    return 0 if ok_all else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m codegen.gemm_space", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tag", default="after")
    p.add_argument("--hw", default="h200")
    p.add_argument("--only", default="")
    p.add_argument("--no-base", action="store_true", help="skip the search without split-K")
    p.add_argument("--executor", default="serial", help="ptsolve.optimize's executor (serial: few CPUs)")
    c = sub.add_parser("precompile")
    c.add_argument("cands", type=Path, nargs="+")
    r = sub.add_parser("run")
    r.add_argument("cands", type=Path, nargs="+")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--only", default="")
    a = ap.parse_args(argv)
    only = tuple(x for x in getattr(a, "only", "").split(",") if x)
    if a.cmd == "prepare":
        prepare(a.out, a.tag, a.hw, only, base=not a.no_base, executor=a.executor)
        return 0
    if a.cmd == "precompile":
        print(precompile([json.loads(x.read_text()) for x in a.cands]), "plans compiled")
        return 0
    return run(a.cands, a.out, only)


if __name__ == "__main__":
    sys.exit(main())
