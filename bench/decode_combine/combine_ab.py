"""Split-KV decode's merge on the GPU: the last-arriving piece merging every piece (``old``, commit dde918a: one piece
and row half per L2 round trip, after a separate max pass) against merge CTAs (``new``: codegen.cuda.decode, each
merging a few rows of every piece in parallel once the tile's pieces are done), on the weak seq_q = 1 shapes of
results/decode_h200.md, at the committed choice's tiling and at other splits (default plan, same BN and depth),
next to SDPA-cuDNN, in one process. (``batched/``: the first attempt, the last piece's merge with a batch of
pieces' loads in flight, commit 911d4bb: 0.9-1.05x the old one.)

    git worktree add /tmp/old dde918a
    python -m bench decode_combine combine_ab emit old --root /tmp/old     # CPU: the old sources
    python -m bench decode_combine combine_ab emit new                     # CPU: this tree's
    PTSOLVE_CACHE_DIR=$PWD/.cubin_dc python -m bench decode_combine combine_ab compile   # CPU
    PTSOLVE_CACHE_DIR=$PWD/.cubin_dc python -m bench decode_combine combine_ab run --out $OUT/ab.json  # GPU
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[2] / "results/decode_combine"  # the study's data
ROOT = HERE.parents[1]
if "--root" in sys.argv:  # emit with another checkout's code
    sys.path.insert(0, sys.argv[sys.argv.index("--root") + 1])
sys.path.insert(0 if "--root" not in sys.argv else 1, str(ROOT))
from bench.ab.regress_ab import ks_of as _ks  # noqa: E402  (a KernelSource from its JSON)

SRC = HERE / "sources.json"
PLANS = ROOT / "results/decode_h200/plans.json"
SHAPES = ("dec_llama3-8b_b1_q1_k1000", "dec_llama3-8b_b1_q1_k32768", "dec_qwen2.5-0.5b_b1_q1_k1000",
          "dec_qwen2.5-0.5b_b1_q1_k4097", "dec_qwen2.5-0.5b_b1_q1_k32768", "dec_qwen2.5-0.5b_b16_q1_k1000",
          "dec_qwen2.5-0.5b_b16_q1_k4097", "dec_falcon-7b_b1_q1_k1000", "dec_falcon-7b_b1_q1_k4097",
          "dec_falcon-7b_b1_q1_k32768",
          # splits chosen and already >= 0.9x cuDNN: no regression wanted (causal prefill: tiles of 1-3 pieces)
          "dec_falcon-7b_b16_q1_k4097", "dec_llama3-8b_b1_q4_k4097", "dec_qwen2.5-0.5b_b16_q1_k32768",
          "prefill_b1_h8_s1000_c")
EXTRA_SPLITS = (4, 8, 16, 32, 64)  # besides the choice's; those the operator offers at its BN


def emit(which: str) -> None:
    """Add ``which``'s kernels (old / new) of every shape and splits value to sources.json."""
    import ptsolve
    from codegen.cuda import emit as emit_source
    from codegen.plan import KernelPlan, default_plan
    from ptsolve.ops.decode import _tilings

    plans = {sh["name"]: sh for sh in json.loads(PLANS.read_text())["shapes"]}
    src = json.loads(SRC.read_text()) if SRC.exists() else {}
    for name in SHAPES:
        sh = plans[name]
        choice = sh["plans"]["split"]
        t0 = choice["tiling"]
        params = ptsolve.ops.make("flash_decode", **sh["params"]).params
        offered = {t["splits"] for t in _tilings(params) if t["BN"] == t0["BN"] and t["groups"] == t0["groups"]}
        row = src.setdefault(name, {"params": params, "choice": t0["splits"], "kernels": {}})
        for s in sorted({t0["splits"], *(s for s in EXTRA_SPLITS if s in offered)}):
            plan = KernelPlan.from_json(json.dumps(choice["plan"])) if s == t0["splits"] else \
                default_plan("flash_decode", params, {**t0, "splits": s})
            ks = emit_source(plan, "h200")
            got = {which: ks}
            for k, v in got.items():
                row["kernels"][f"s{s}/{k}"] = dataclasses.asdict(v)
        print(name, sorted(row["kernels"]), flush=True)
    SRC.write_text(json.dumps(src, indent=0, sort_keys=True))


def predict(out: Path) -> None:
    """The model's time (this tree's) of the best schedule at each measured tiling (CP-SAT, 4 s, that tiling fixed)."""
    import ptsolve
    src = json.loads(SRC.read_text())
    pred = json.loads(out.read_text()) if out.exists() else {}
    for name, row in src.items():
        for key, d in sorted(row["kernels"].items()):
            if not key.endswith("/new") or f"{name}/{key}" in pred:
                continue
            t = {k: v for k, v in d["info"]["tiling"].items() if k != "ctas"}  # the lowering adds ctas
            op = ptsolve.ops.make("flash_decode", **row["params"])
            res = ptsolve.optimize(op, hw="h200", solver="cpsat", time_limit=4, cache=False, executor="serial",
                                   fix=t, compile_check=False)
            pred[f"{name}/{key}"] = res.predicted_us
            print(name, key, round(res.predicted_us, 2), flush=True)
            out.write_text(json.dumps(pred, indent=1, sort_keys=True))


def report(runs: Path) -> None:
    """The markdown table of a run (``run --out``) with the model's times (``predict``) beside the measured ones."""
    res = json.loads(runs.read_text())
    pred = json.loads((HERE / "predicted.json").read_text())
    print("| shape | splits | old µs | new µs | new / old | model µs (new) | cuDNN µs | cuDNN / new |")
    print("|---|---|---|---|---|---|---|---|")
    best = []
    for name, rec in res["shapes"].items():
        us = rec["us"]
        cd = us.get("sdpa_cudnn")
        splits = sorted({int(k.split("/")[0][1:]) for k in us if "/" in k})
        for s in splits:
            o, n, m = us.get(f"s{s}/old"), us.get(f"s{s}/new"), pred.get(f"{name}/s{s}/new")
            cells = [f"{x:.2f}" if x else "—" for x in (o, n)] + [f"{n / o:.3f}" if o and n else "—"]
            cells += [f"{m:.2f}" if m else "—", f"{cd:.2f}" if cd else "—", f"{cd / n:.3f}" if cd and n else "—"]
            print(f"| {name} | {s}{' (committed choice)' if s == rec['choice'] else ''} | " + " | ".join(cells) + " |")
        fast = min(splits, key=lambda s: us[f"s{s}/new"])
        pick = min(splits, key=lambda s: pred.get(f"{name}/s{s}/new", math.inf))
        best.append((name, fast, pick, us[f"s{pick}/new"] / us[f"s{fast}/new"]))
    print("\n| shape | fastest splits (measured) | model's pick among them | its time / the fastest |")
    print("|---|---|---|---|")
    for name, fast, pick, r in best:
        print(f"| {name} | {fast} | {pick} | {r:.3f} |")


def compile_all(check: bool) -> None:
    from concurrent.futures import ThreadPoolExecutor

    import codegen.runtime as rt
    if check:
        def no_nvcc(*a, **k):
            raise RuntimeError("cache miss: nvcc would run")
        rt._nvcc = no_nvcc
    src = json.loads(SRC.read_text())
    jobs = [(n, k, _ks(d)) for n, row in src.items() for k, d in row["kernels"].items()]
    with ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 1))) as ex:
        reps = list(ex.map(lambda j: rt.compile_kernel(j[2]).report, jobs))
    bad = [(n, k, r["spill_stores"], r["wgmma_serialized"]) for (n, k, _), r in zip(jobs, reps)
           if r["spill_stores"] or r["wgmma_serialized"]]
    print(f"{len(jobs)} cubins in {rt.cache_dir()}; spilling or serialised: {bad or 'none'}")


def run(out: Path) -> None:
    import torch

    from bench.decode.decode_bench import refs, sdpa_fns, timing_sets
    from codegen.harness import time_many
    from codegen.runtime import load

    src = json.loads(SRC.read_text())
    t0 = time.time()
    res = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "torch": torch.__version__, "shapes": {}}
    for name, row in src.items():
        p = row["params"]
        torch.manual_seed(0)
        sets, kv_bytes = timing_sets(p, 1)
        nsets = len(sets)
        ptrs = [{"q": q.data_ptr(), "k": k.data_ptr(), "v": v.data_ptr(), "o": o.data_ptr()} for q, k, v, o in sets]
        hi, lo = refs(*sets[0][:3], p["causal"])
        base = float((lo.float() - hi).abs().max())
        rec: dict = {"params": p, "choice": row["choice"], "err": {}, "us": {}}
        fns, ctxs = {}, {}
        for key, d in sorted(row["kernels"].items()):
            kern = load(_ks(d))
            stream = int(torch.cuda.current_stream().cuda_stream)
            outs = []
            for _ in range(2):  # twice: the counters must be back at zero, the two outputs bit-equal
                sets[0][3].fill_(float("nan"))
                kern.launch(ptrs[0], stream)
                torch.cuda.synchronize()
                outs.append(sets[0][3].clone())
            err = float((outs[0].float() - hi).abs().max())
            ok = key.endswith("nomerge") or (math.isfinite(err) and err <= 2 * base + 1e-3
                                             and bool(torch.equal(outs[0], outs[1])))
            rec["err"][key] = err
            if not ok:
                print(f"  {name} {key}: max err {err:.3g} (fp16 math {base:.3g}), repeat equal "
                      f"{bool(torch.equal(outs[0], outs[1]))}: not timed", flush=True)
                continue
            fns[key] = (lambda i, kk=kern, pp=ptrs: kk.launch(pp[i], int(torch.cuda.current_stream().cuda_stream)))
        for sname, (fn, ctx) in sdpa_fns(p, sets).items():
            if fn is not None and sname in ("sdpa_cudnn", "sdpa_default"):
                fns[sname], ctxs[sname] = fn, ctx
        ms = time_many(fns, nsets, ctxs=ctxs, graphs=True, rounds=11, block_ms=1.0)
        rec["us"] = {k: v * 1e3 for k, v in ms.items()}
        res["shapes"][name] = rec
        print(name, " ".join(f"{k} {v:.2f}" for k, v in sorted(rec["us"].items())), flush=True)
        sets = ptrs = hi = lo = fns = None
        torch.cuda.empty_cache()
        out.write_text(json.dumps(res, indent=1, sort_keys=True))
    print(f"\ndone in {time.time() - t0:.0f} s ({res['device']}, {res['date']}); µs per call, CUDA graphs\n")
    print("| shape | splits | old µs | new µs | new / old | cuDNN µs | cuDNN / new |")
    print("|---|---|---|---|---|---|---|")
    for name, rec in res["shapes"].items():
        us = rec["us"]
        for s in sorted({int(k.split("/")[0][1:]) for k in us if "/" in k}):
            g = {v: us.get(f"s{s}/{v}") for v in ("old", "new")}
            f = lambda x: f"{x:.2f}" if x else "—"  # noqa: E731
            cd = us.get("sdpa_cudnn")
            print(f"| {name} | {s}{'*' if s == rec['choice'] else ''} | " + " | ".join(f(g[v]) for v in g) +
                  f" | {g['new'] / g['old']:.3f}" * bool(g["new"] and g["old"]) + " —" * (not (g["new"] and g["old"]))
                  + f" | {f(cd)} | " + (f"{cd / g['new']:.3f}" if cd and g["new"] else "—") + " |")


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "emit":
        emit(sys.argv[2])
    elif cmd in ("compile", "check"):
        compile_all(cmd == "check")
    elif cmd == "report":
        report(Path(sys.argv[2]))
    elif cmd == "predict":
        predict(HERE / "predicted.json")
    elif cmd == "run":
        run(Path(sys.argv[sys.argv.index("--out") + 1]))
