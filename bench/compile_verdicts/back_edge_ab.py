"""The back-edge wait on the GPU: each attention schedule whose kernel it changes, timed with and without it.

    python -m bench compile_verdicts back_edge_ab prepare --verdicts DIR/verdicts.jsonl --out FILE   # CPU
    python -m bench compile_verdicts back_edge_ab run FILE                                             # GPU

``prepare`` keeps the schedules of a ``verdicts`` run whose sm_90a source the wait changes (codegen.cuda.skeleton
``_back_edge_wait``); ``run`` emits each both ways, checks both outputs against float32 attention and times them
interleaved (CUDA events, the median of 7 rounds of 20 launches each), and prints one row per schedule.
"""
from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any

import codegen.cuda.skeleton as sk
from codegen.cuda import emit
from ptsolve.hw import load
from ptsolve.program import SProgram


def variants(prog: SProgram) -> dict[str, Any]:
    """The kernel with the wait and without it (the rule switched off for the second emit)."""
    real = sk._back_edge_wait
    with_it = emit(prog, load("h100"))
    sk._back_edge_wait = lambda *a: ""
    try:
        without = emit(prog, load("h100"))
    finally:
        sk._back_edge_wait = real
    return {"with": with_it, "without": without}


def prepare(verdicts: Path, out: Path) -> None:
    rows = []
    for line in verdicts.read_text().splitlines():
        r = json.loads(line)
        if r["op"] == "flash_attention":
            v = variants(SProgram.from_json(r["program"]))
            if v["with"].source != v["without"].source:
                rows.append({k: r[k] for k in ("desc", "tiling", "solver", "program")})
    out.write_text(json.dumps(rows))
    print(f"{len(rows)} schedules whose kernel the wait changes -> {out}")


def run(path: Path) -> None:
    import torch

    from codegen.harness import attention_ref, rel_err
    from codegen.runtime import compile_kernel
    from codegen.runtime import load as load_kernel

    print("| configuration | tiling | policy | ptxas without / with | µs without | µs with | with/without | "
          "rel err without / with |\n|---|---|---|---|---|---|---|---|")
    for r in json.loads(path.read_text()):
        prog = SProgram.from_json(r["program"])
        p = prog.graph.params
        q = torch.randn(p["batch"], p["seq_q"], p["heads"], p["head_dim"], device="cuda", dtype=torch.float16)
        k = torch.randn(p["batch"], p["seq_kv"], p["kv_heads"], p["head_dim"], device="cuda", dtype=torch.float16)
        v = torch.randn_like(k)
        ref = attention_ref(q, k, v, p["causal"])
        res: dict[str, Any] = {}
        for name, ks in variants(prog).items():
            kern, out = load_kernel(ks), torch.empty_like(q)
            ser = compile_kernel(ks).report["wgmma_serialized"]
            ptrs = {"q": q.data_ptr(), "k": k.data_ptr(), "v": v.data_ptr(), "o": out.data_ptr()}
            launch = functools.partial(kern.launch, ptrs, 0)
            launch()
            torch.cuda.synchronize()
            res[name] = {"launch": launch, "err": rel_err(out.float(), ref), "ser": ser, "ms": []}
        for _ in range(7):  # interleaved rounds: both variants see the same clocks and neighbours
            for x in res.values():
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                for _ in range(20):
                    x["launch"]()
                b.record()
                torch.cuda.synchronize()
                x["ms"].append(a.elapsed_time(b) / 20)
        us = {n: 1e3 * sorted(x["ms"])[3] for n, x in res.items()}
        ser = " / ".join("serialised" if res[n]["ser"] else "clean" for n in ("without", "with"))
        print(f"| {r['desc']} | {r['tiling']} | {r['solver']} | {ser} | {us['without']:.1f} | {us['with']:.1f} | "
              f"{us['with'] / us['without']:.3f} | {res['without']['err']:.1e} / {res['with']['err']:.1e} |")


if __name__ == "__main__":
    if sys.argv[1] == "prepare":
        prepare(Path(sys.argv[sys.argv.index("--verdicts") + 1]), Path(sys.argv[sys.argv.index("--out") + 1]))
    else:
        run(Path(sys.argv[2]))
