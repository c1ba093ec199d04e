"""Where long-cache decode loses to cuDNN (NVIDIA H200): the weak large-batch seq_q = 1 shapes of
results/decode_h200.md (0.88-0.93x SDPA-cuDNN) timed at other tilings of the flash_decode space (BN, ring depth,
splits; and two CTAs per SM, which the space does not offer yet), next to SDPA-cuDNN in one process, and the
committed choice's kernel profiled (codegen.profile: where the producer and the consumer wait).

    python -m bench decode_stream stream emit                                  # CPU: sources.json
    PTSOLVE_CACHE_DIR=$PWD/.cubin_ds python -m bench decode_stream stream compile   # CPU
    PTSOLVE_CACHE_DIR=$PWD/.cubin_ds python -m bench decode_stream stream run --out $OUT   # GPU
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[2] / "results/decode_stream"  # the study's data
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
from bench.ab.regress_ab import ks_of as _ks  # noqa: E402

SRC = HERE / "sources.json"
PLANS = ROOT / "results/decode_h200/plans.json"
SHAPES = ("dec_llama3-8b_b16_q1_k32768", "dec_llama3-8b_b64_q1_k32768", "dec_qwen2.5-0.5b_b16_q1_k32768",
          "dec_qwen2.5-0.5b_b16_q1_k4097")


def _variants(params: dict, t0: dict) -> list[dict]:
    """Tilings to time besides the choice: BN 64/128 (256 at head_dim 64) x ring depths that fit x splits 1/2/4
    (of the choice's BN the ones the space offers), and two CTAs per SM."""
    out = []
    bns = (64, 128, 256) if params["head_dim"] == 64 else (64, 128)
    for bn in bns:
        for s in (1, 2, 4):
            for d in (2, 3, 4, 6):
                out.append({"BM": 64, "BN": bn, "depth": d, "groups": 1, "splits": s})
                if s > 1:
                    out.append({"BM": 64, "BN": bn, "depth": d, "groups": 1, "splits": s, "ctas": 2})
    return out


def committed(sh: dict) -> dict:
    """A shape's committed choice in results/decode_h200/plans.json: of its split and no-split plans the one the
    model predicts faster (decode_bench's rule)."""
    split, nosplit = sh["plans"]["split"], sh["plans"]["nosplit"]
    return split if split["predicted_us"] <= nosplit["predicted_us"] else nosplit


def _name(t: dict) -> str:
    return f"bn{t['BN']}_d{t['depth']}_s{t['splits']}" + (f"_c{t['ctas']}" if t.get("ctas", 1) > 1 else "")


def emit() -> None:
    import ptsolve
    from codegen.cuda import emit as emit_source
    from codegen.cuda import emit_ir
    from codegen.lower import lower
    from codegen.plan import KernelPlan, default_plan
    from ptsolve.errors import PtsolveError
    from ptsolve.ops import REGISTRY
    # two CTAs per SM: the skeleton builds them (Mamba2's kernels use them); the decode space does not offer them
    REGISTRY["flash_decode"] = dataclasses.replace(REGISTRY["flash_decode"], optional={"ctas": 1})

    plans = {sh["name"]: sh for sh in json.loads(PLANS.read_text())["shapes"]}
    src = {}
    for name in SHAPES:
        sh = plans[name]
        choice = committed(sh)
        params = ptsolve.ops.make("flash_decode", **sh["params"]).params
        row = src.setdefault(name, {"params": params, "choice": _name(choice["tiling"]), "kernels": {}})
        ir = lower(KernelPlan.from_json(json.dumps(choice["plan"])), "h200")
        row["ir"] = ir.to_json()
        row["kernels"]["choice"] = dataclasses.asdict(emit_ir(ir))
        row["kernels"]["prof:choice"] = dataclasses.asdict(emit_ir(dataclasses.replace(ir, profile=True)))
        for t in _variants(params, choice["tiling"]):
            try:
                ks = emit_source(default_plan("flash_decode", params, t), "h200")
            except PtsolveError as e:
                print(name, _name(t), "skipped:", str(e)[:100])
                continue
            row["kernels"][_name(t)] = dataclasses.asdict(ks)
        print(name, len(row["kernels"]), "kernels", flush=True)
    SRC.write_text(json.dumps(src, indent=0, sort_keys=True))


def predict() -> None:
    """predicted.json: the model's time (this tree's, H200 table) of the best schedule at each variant's tiling
    (CP-SAT, 3 s, the tiling fixed; compile check off: the compile report is compile.json)."""
    import ptsolve
    from ptsolve.errors import PtsolveError
    src = json.loads(SRC.read_text())
    out = HERE / "predicted.json"
    pred = json.loads(out.read_text()) if out.exists() else {}
    for name, row in src.items():
        op = ptsolve.ops.make("flash_decode", **row["params"])
        for key, d in sorted(row["kernels"].items()):
            t = {k: v for k, v in d["info"]["tiling"].items() if k != "ctas"}
            if key.startswith("prof:") or key == "choice" or d["info"]["tiling"].get("ctas", 1) > 1 \
                    or f"{name}/{key}" in pred:
                continue  # two CTAs per SM: not in the operator's space
            try:
                res = ptsolve.optimize(op, hw="h200", solver="cpsat", time_limit=3, cache=False, executor="serial",
                                       fix=t, compile_check=False)
            except PtsolveError:  # outside the space (ring depth 6)
                continue
            pred[f"{name}/{key}"] = res.predicted_us
            out.write_text(json.dumps(pred, indent=1, sort_keys=True))
        print(name, flush=True)


def compile_all(src_path: Path = SRC) -> None:
    from concurrent.futures import ThreadPoolExecutor

    import codegen.runtime as rt
    src = json.loads(src_path.read_text())
    jobs = [(n, k, _ks(d)) for n, row in src.items() for k, d in row["kernels"].items()]

    def one(j):
        try:
            return rt.compile_kernel(j[2]).report
        except Exception as e:  # noqa: BLE001
            return {"error": str(e)[:200]}
    with ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 1))) as ex:
        reps = list(ex.map(one, jobs))
    rep = {}
    for (n, k, _), r in zip(jobs, reps):
        rep.setdefault(n, {})[k] = {x: r.get(x) for x in ("registers", "spill_stores", "wgmma_serialized", "error")}
    report = src_path.parent / src_path.name.replace("sources", "compile")
    report.write_text(json.dumps(rep, indent=1, sort_keys=True))
    bad = [(n, k) for n in rep for k, r in rep[n].items() if r["error"] or r["spill_stores"] or r["wgmma_serialized"]]
    print(f"{len(jobs)} kernels; rejected (error, spills, serialised wgmma): {bad}")


def run(out: Path, src_path: Path = SRC, keys: tuple[str, ...] = (), profile: bool = True) -> None:
    """Time every kernel of ``src_path`` (or only ``keys``) next to SDPA-cuDNN, each output checked against float32
    first (FlashAttention's rule, two launches bit-equal); profile the committed choice's kernel (``profile``)."""
    import torch

    from bench.decode.decode_bench import refs, sdpa_fns, timing_sets
    from codegen import profile as prof
    from codegen.harness import time_many
    from codegen.kernel_ir import KernelIR
    from codegen.runtime import load

    src = json.loads(src_path.read_text())
    rep = json.loads((src_path.parent / src_path.name.replace("sources", "compile")).read_text())
    t0 = time.time()
    res = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "torch": torch.__version__, "shapes": {}, "profiles": {}}
    for name, row in src.items():
        p = row["params"]
        torch.manual_seed(0)
        sets, kv_bytes = timing_sets(p, 2)
        nsets = len(sets)
        ptrs = [{"q": q.data_ptr(), "k": k.data_ptr(), "v": v.data_ptr(), "o": o.data_ptr()} for q, k, v, o in sets]
        hi, lo = refs(*sets[0][:3], p["causal"])
        base = float((lo.float() - hi).abs().max())
        rec: dict = {"params": p, "choice": row["choice"], "kv_bytes": kv_bytes, "err": {}, "us": {}}
        fns, ctxs = {}, {}
        for key, d in sorted(row["kernels"].items()):
            r = rep[name][key]
            if key.startswith("prof:") or (keys and key not in keys):
                continue
            if r["error"] or r["spill_stores"]:  # serialised wgmma: timed all the same (memory-bound loops)
                continue
            kern = load(_ks(d))
            outs = []
            for _ in range(2):
                sets[0][3].fill_(float("nan"))
                kern.launch(ptrs[0], int(torch.cuda.current_stream().cuda_stream))
                torch.cuda.synchronize()
                outs.append(sets[0][3].clone())
            err = float((outs[0].float() - hi).abs().max())
            rec["err"][key] = err
            if not (math.isfinite(err) and err <= 2 * base + 1e-3 and bool(torch.equal(outs[0], outs[1]))):
                print(f"  {name} {key}: max err {err:.3g}: not timed", flush=True)
                continue
            fns[key] = (lambda i, kk=kern, pp=ptrs: kk.launch(pp[i], int(torch.cuda.current_stream().cuda_stream)))
        for sname, (fn, ctx) in sdpa_fns(p, sets).items():
            if fn is not None and sname == "sdpa_cudnn":
                fns[sname], ctxs[sname] = fn, ctx
        ms = time_many(fns, nsets, ctxs=ctxs, graphs=True, rounds=11, block_ms=1.0)
        rec["us"] = {k: v * 1e3 for k, v in ms.items()}
        res["shapes"][name] = rec
        best = min((k for k in rec["us"] if not k.startswith("sdpa")), key=rec["us"].get)
        print(name, f"cudnn {rec['us'].get('sdpa_cudnn', 0):.1f} choice {rec['us'].get('choice', 0):.1f} "
              f"best {best} {rec['us'][best]:.1f}", flush=True)
        sets = ptrs = hi = lo = fns = None
        torch.cuda.empty_cache()
        for key in ("choice",) if profile else ():
            try:
                ir = KernelIR.from_json(row["ir"])
                pr, _ = prof.measure(ir, "h200")
                res["profiles"][f"{name}/{key}"] = {"ii": pr.ii, "predicted_ii": ir.predicted_ii,
                                                    "kernel_us": pr.kernel_us, "overhead": pr.overhead,
                                                    "per_task": {k: {"wait": w, "busy": b} for k, (w, b)
                                                                 in prof.task_means(pr, base=True).items()}}
                print("  profile", key, json.dumps(res["profiles"][f"{name}/{key}"]), flush=True)
            except Exception as e:  # noqa: BLE001
                print("  profile", key, "failed:", type(e).__name__, str(e)[:200], flush=True)
        out.write_text(json.dumps(res, indent=1, sort_keys=True))
    print(f"\ndone in {time.time() - t0:.0f} s ({res['device']}, {res['date']})\n")
    print("| shape | kernel | µs | GB/s | cuDNN / it |")
    print("|---|---|---|---|---|")
    for name, rec in res["shapes"].items():
        cd = rec["us"].get("sdpa_cudnn")
        for k, v in sorted(rec["us"].items(), key=lambda kv: kv[1])[:8]:
            print(f"| {name} | {k} | {v:.1f} | {rec['kv_bytes'] / v / 1e3:.0f} | {cd / v:.3f} |")


def ring_kb(name: str, D: int) -> float | None:
    """KB of K/V ring per CTA of a variant named by ``_name`` (depth x BN keys x (K + V) x D x 2 bytes)."""
    import re
    m = re.match(r"bn(\d+)_d(\d+)_s\d+", name)
    return int(m.group(1)) * int(m.group(2)) * 2 * D * 2 / 1024 if m else None


def report(runs: Path) -> None:
    """Markdown: per shape every timed kernel, fastest first, with its ring per CTA, the model's time at its tiling
    (predicted.json; two CTAs per SM and ring depth 6 are outside the space: none) and cuDNN's time over it."""
    res = json.loads(runs.read_text())
    pred = json.loads((HERE / "predicted.json").read_text())
    pv = res.get("provenance", {})
    print(f"Run {runs.name}: {res['device']}, {res['date']}, commit {pv.get('commit', '?')}; µs per call.\n")
    print("| shape | kernel (BN, ring depth, splits, CTAs per SM) | ring KB per CTA | model µs | µs | KV GB/s | "
          "cuDNN / it |")
    print("|---|---|---|---|---|---|---|")
    for name, rec in res["shapes"].items():
        cd, D = rec["us"]["sdpa_cudnn"], rec["params"]["head_dim"]
        for k, v in sorted(rec["us"].items(), key=lambda kv: kv[1]):
            kb = ring_kb(rec["choice"] if k == "choice" else k, D)
            m = pred.get(f"{name}/{k}")
            label = f"committed choice ({rec['choice']})" if k == "choice" else k
            cells = [name, label, f"{kb:.0f}" if kb else "—", f"{m:.1f}" if m else "—", f"{v:.1f}",
                     f"{rec['kv_bytes'] / v / 1e3:.0f}", f"{cd / v:.3f}"]
            print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "emit":
        emit()
    elif cmd == "compile":
        compile_all()
    elif cmd == "predict":
        predict()
    elif cmd == "report":
        report(Path(sys.argv[2]))
    elif cmd == "run":
        o = Path(sys.argv[sys.argv.index("--out") + 1])
        o.mkdir(parents=True, exist_ok=True)
        run(o / "stream.json")
