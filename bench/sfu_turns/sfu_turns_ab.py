"""Does the shared SFU's order, which the model schedules but the kernel leaves to chance, explain why the exact
attention schedule runs slower than the model says (issue 13)? Experiment: the committed CP-SAT schedule's kernel
(``cpsat``), the same source with the model's order on the SFU enforced by named-barrier turns around each consumer
warpgroup's exp2 (``cpsat_sfu``: a source edit of this experiment, not the skeleton), and the round's hand
FA3-order plan (``hand``). One process, CUDA graphs, candidates interleaved (codegen.harness.time_many).

    python -m bench sfu_turns sfu_turns_ab emit          # CPU: sources -> results/sfu_turns/sources.json
    PTSOLVE_CACHE_DIR=$PWD/.cubin_sfu python -m bench sfu_turns sfu_turns_ab compile
    PTSOLVE_CACHE_DIR=$PWD/.cubin_sfu python -m bench sfu_turns sfu_turns_ab        # GPU
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.ab.regress_ab import ks_of  # noqa: E402

NAMES = ["FA2_cpsat", "FA3_cpsat", "FA3c_cpsat", "FA13c_cpsat", "FA17c_cpsat", "FA14_cpsat"]
OUT = ROOT / "results/sfu_turns/sources.json"  # not committed: `emit` rewrites it
BAR = 5  # named barriers 5 + g: warpgroup g's SFU turn (1 + g: tensor-core turns, 3 + g: a warpgroup's own)


def sfu_order(program) -> list[int]:
    """Consumer warpgroups in the order the schedule's exp2 tasks hold the SFU within one initiation interval."""
    ex = sorted((t.name for t in program.graph.phase("loop") if t.name.startswith("exp2@")),
                key=lambda n: (program.start[n] % program.ii, n))
    return [int(n.split("@")[1]) for n in ex]


def with_sfu_turns(src: str, order: list[int]) -> str:
    """``src`` with exp2@g preceded by a sync on warpgroup g's SFU barrier and followed by an arrive on the next
    warpgroup's (cyclic ``order``); the last warpgroup of the order credits the first once before its loop."""
    lines = src.split("\n")
    out: list[str] = []
    open_g = None
    nxt = {g: order[(i + 1) % len(order)] for i, g in enumerate(order)}
    for ln in lines:
        s = ln.strip()
        if open_g is not None and s.startswith(("{  // ", "// epilogue", 'asm volatile("bar.')):
            out.append(f'asm volatile("bar.arrive {BAR + nxt[open_g]}, 256;" ::: "memory");  // SFU turn passed on')
            open_g = None
        if s.startswith("{  // exp2@") or s.startswith("{  // epilogue exp2@"):
            g = int(s.split("@")[1].split()[0])
            out.append(f'asm volatile("bar.sync {BAR + g}, 256;" ::: "memory");  // wait for the SFU turn')
            open_g = g
        if s.startswith("// loop:") and out and any(f"consumer warpgroup {order[-1]}" in x for x in out[-80:]):
            out.append(f'asm volatile("bar.arrive {BAR + order[0]}, 256;" ::: "memory");  // first SFU turn')
        out.append(ln)
    return "\n".join(out)


def emit_all() -> None:
    from codegen.cuda import emit
    from codegen.harness import FIXED
    from codegen.plan import fa3_order_plan, plan_from_program
    from ptsolve.result import Result

    res = {}
    for n in NAMES:
        prog = Result.from_json((ROOT / f"results/schedules_h200/{n}.json").read_text()).program
        ks = emit(plan_from_program(prog, "h200"), "h200")
        order = sfu_order(prog)
        src = with_sfu_turns(ks.source, order)
        assert src.count("SFU turn") >= 5, n
        hand = emit(fa3_order_plan(dict(prog.graph.params), FIXED | {"persistent": 1}), "h200")
        res[n] = {"cpsat": dataclasses.asdict(ks), "cpsat_sfu": dataclasses.asdict(dataclasses.replace(ks, source=src)),
                  "hand": dataclasses.asdict(hand), "order": order}
        print(n, "sfu order", order, flush=True)
    OUT.write_text(json.dumps(res, indent=0, sort_keys=True))


def variants(n: str) -> dict:
    row = json.loads(OUT.read_text())[n]
    return {k: ks_of(row[k]) for k in ("cpsat", "cpsat_sfu", "hand")}


def compile_all() -> None:
    import codegen.runtime as rt
    for n in NAMES:
        for k, ks in variants(n).items():
            c = rt.compile_kernel(ks)
            print(n, k, "regs", c.report.get("registers"), "spill", c.report.get("spill_stores"),
                  [w for w in c.report.get("warnings", [])][:2], flush=True)


def smoke_one(key: str) -> None:
    import torch

    from codegen.harness import random_args
    from codegen.runtime import load
    n, k = key.split("/")
    ks = variants(n)[k]
    args = random_args(ks, 0)
    load(ks).launch({a: t.data_ptr() for a, t in args.items()}, int(torch.cuda.current_stream().cuda_stream))
    torch.cuda.synchronize()
    print("ok", flush=True)


def main() -> None:
    import torch

    from codegen.harness import random_args, time_many
    from codegen.runtime import load
    rows = []
    for n in NAMES:
        vs = variants(n)
        good = {}
        for k in vs:
            p = subprocess.run([sys.executable, __file__, "smoke", f"{n}/{k}"], capture_output=True, text=True,
                               timeout=60)
            if "ok" in p.stdout:
                good[k] = vs[k]
            else:
                print(f"{n}/{k}: smoke failed {p.stdout[-200:]} {p.stderr[-300:]}", flush=True)
        sets = [random_args(vs["cpsat"], s) for s in range(2)]
        ptrs = [{a: t.data_ptr() for a, t in s.items()} for s in sets]
        kern = {k: load(ks) for k, ks in good.items()}
        stream = int(torch.cuda.current_stream().cuda_stream)
        outs = {}
        ok_ = next(a for a in ("o", "out") if a in sets[0])
        for k, kk in kern.items():
            sets[0][ok_].fill_(float("nan"))
            kk.launch(ptrs[0], stream)
            torch.cuda.synchronize()
            outs[k] = sets[0][ok_].float().clone()
        diffs = {k: (o - outs["cpsat"]).abs().max().item() for k, o in outs.items()}
        fns = {k: (lambda i, kk=kk, pp=ptrs: kk.launch(pp[i], int(torch.cuda.current_stream().cuda_stream)))
               for k, kk in kern.items() if diffs[k] <= 1e-2}
        ms = time_many(fns, 2, graphs=True, rounds=20)
        us = {k: v * 1e3 for k, v in ms.items()}
        rows.append((n, us))
        print(n, {k: round(v, 1) for k, v in us.items()}, "diffs", diffs, flush=True)
        del sets, ptrs, outs
        torch.cuda.empty_cache()
    print("\n| schedule | cpsat µs | cpsat + SFU turns µs | hand FA3 order µs | sfu / cpsat | hand / cpsat |")
    print("|---|---|---|---|---|---|")
    for n, us in rows:
        c = us.get("cpsat")
        cell = {k: f"{us[k]:.1f}" if k in us else "—" for k in ("cpsat", "cpsat_sfu", "hand")}
        rel = {k: f"{us[k] / c:.3f}" if k in us and c else "—" for k in ("cpsat_sfu", "hand")}
        print(f"| {n} | {cell['cpsat']} | {cell['cpsat_sfu']} | {cell['hand']} | {rel['cpsat_sfu']} | {rel['hand']} |")


if __name__ == "__main__":
    cmd = sys.argv[1:2]
    if cmd == ["emit"]:
        emit_all()
    elif cmd == ["compile"]:
        compile_all()
    elif cmd == ["smoke"]:
        smoke_one(sys.argv[2])
    else:
        t0 = time.time()
        main()
        print(f"done in {time.time() - t0:.0f} s")
