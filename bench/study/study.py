"""The measured-selection and fidelity study: many schedules per configuration, timed in one device call.

CPU (solvers, nvcc; writes the candidates, travels with the repository)::

    python -m bench study prepare --out results/study_h200/candidates.json [--top-k 4] [--only NAME,...]

For every configuration (the paper's training set and the held-out shapes of ``HELD_OUT``): the ``top_k`` best
distinct compile-clean schedules of CP-SAT (ptsolve.tune.candidates) and of greedy (PipeThreader's procedure:
greedy schedules over all tilings, ranked by greedy's own prediction), each with its predicted time.

GPU (one call; no solver needed)::

    python -m bench study run results/study_h200/candidates.json --out $OUT [--profile N]

Every kernel is checked on a reduced shape first (codegen.harness.check), then all schedules of a configuration and
its library baseline (SDPA cuDNN, cuBLAS, or mamba_ssm's Triton kernels) are timed in one time_many call at the
full shape; the first ``--profile`` schedules of each training configuration are profiled (codegen.profile) for
the calibration's timelines. Writes ``study.json`` (every time, check, profile summary) and prints a table.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

# shapes real users run that the paper's suite does not have (../shared/shapes.md): the held-out set
HELD_OUT: dict[str, tuple[str, dict[str, Any]]] = {
    "H_qwen7b_b4_s1000_c": ("flash_attention", {"batch": 4, "heads": 28, "kv_heads": 4, "seq": 1000, "head_dim": 128,
                                                "causal": True}),
    "H_qwen05b_b4_s2047": ("flash_attention", {"batch": 4, "heads": 14, "kv_heads": 2, "seq": 2047, "head_dim": 64}),
    "H_gpt2_b16_s511_c": ("flash_attention", {"batch": 16, "heads": 12, "kv_heads": 12, "seq": 511, "head_dim": 64,
                                              "causal": True}),
    "H_llama8b_prefill_1000_4097_c": ("flash_attention", {"batch": 1, "heads": 32, "kv_heads": 8, "seq_q": 1000,
                                                          "seq_kv": 4097, "head_dim": 128, "causal": True}),
    "H_llama70b_b1_s8192_c": ("flash_attention", {"batch": 1, "heads": 64, "kv_heads": 8, "seq": 8192,
                                                  "head_dim": 128, "causal": True}),
    "H_gemm_1000": ("gemm", {"M": 1000, "N": 1000, "K": 1000}),
    "H_gemm_4096x14336x4096": ("gemm", {"M": 4096, "N": 14336, "K": 4096}),
    "H_gemm_128x4096x4096": ("gemm", {"M": 128, "N": 4096, "K": 4096}),
    "H_cs_370m_b16_s2048": ("mamba2_chunk_scan", {"batch": 16, "seq": 2048, "heads": 32, "head_dim": 64,
                                                  "d_state": 128, "chunk": 256}),
    "H_st_q128_n64_b4_s1000": ("mamba2_chunk_state", {"batch": 4, "seq": 1000, "heads": 24, "head_dim": 64,
                                                      "d_state": 64, "chunk": 128}),
}
TRAINING = ("FA2", "FA3", "FA3c", "FA13c", "FA14", "GEMM1", "GEMM3", "CS0", "CS3", "ST0", "ST3")


def configs(only: tuple[str, ...] = ()) -> dict[str, tuple[str, dict[str, Any], bool]]:
    """name -> (op, params, held out?) of the study's configurations."""
    from ptsolve.suites import operator, paper
    cfg = {c["name"]: c for c in paper()}
    out = {n: (operator(cfg[n]).op, dict(operator(cfg[n]).params), False) for n in TRAINING}
    out |= {n: (op, p, True) for n, (op, p) in HELD_OUT.items()}
    return {k: v for k, v in out.items() if not only or k in only}


def prepare(out: Path, hw: str = "h200", top_k: int = 4, only: tuple[str, ...] = ()) -> dict[str, Any]:
    """Solve and compile-check the candidates of every configuration; write them as JSON."""
    from ptsolve import ops
    from ptsolve.tune import candidates

    doc: dict[str, Any] = {"hw": hw, "top_k": top_k, "date": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime()),
                           "configs": {}}
    for name, (op, params, held) in configs(only).items():
        o = ops.make(op, **params)
        entry: dict[str, Any] = {"op": op, "params": o.params, "held_out": held, "candidates": [], "rejected": {}}
        for solver in ("cpsat", "greedy"):
            cands, rejected = candidates(o, hw, top_k, solver)
            entry["rejected"][solver] = [[t, why] for t, why in rejected]
            for c in cands:
                entry["candidates"].append({"label": f"{solver}{c.rank}", "policy": solver, "rank": c.rank,
                                            "tiling": c.tiling, "predicted_us": c.result.predicted_us,
                                            "check": c.check.status, "program": c.result.program.to_json()})
        doc["configs"][name] = entry
        print(f"{name}: " + ", ".join(f"{c['label']} {c['predicted_us']:.1f}" for c in entry["candidates"])
              + "".join(f"; {s} rejected {len(r)}" for s, r in entry["rejected"].items() if r), flush=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=1))
    return doc


def kernels(doc: dict[str, Any], profile: int = 1) -> list[Any]:
    """Every KernelSource a ``run`` of ``doc`` launches: each candidate at its full shape, at the reduced shape of
    its check (codegen.harness.check), and instrumented where it is profiled (so all can be compiled beforehand)."""

    from codegen.cuda import emit
    from codegen.harness import reduced
    from codegen.lower import lower
    from codegen.plan import plan_from_program
    from ptsolve.program import SProgram

    out = []
    for e in doc["configs"].values():
        for c in e["candidates"]:
            prog = SProgram.from_json(c["program"])
            p = plan_from_program(prog, doc["hw"])
            out.append(emit(p))
            out.append(emit(reduced(p)))
            if not e["held_out"] and c["rank"] < profile:
                out.append(emit(lower(prog, doc["hw"], profile=True)))
    return out


def precompile(doc: dict[str, Any], profile: int = 1, jobs: int = 2) -> int:
    """Compile every kernel of ``kernels(doc)`` into the cubin cache ($PTSOLVE_CACHE_DIR): the device call then
    compiles nothing. Returns how many distinct kernels."""
    from concurrent.futures import ThreadPoolExecutor

    from codegen.runtime import compile_kernel
    ks = {k.source: k for k in kernels(doc, profile)}
    with ThreadPoolExecutor(max_workers=jobs) as ex:
        list(ex.map(compile_kernel, ks.values()))
    return len(ks)


def _time(op: str, params: dict[str, Any], plans: dict[str, Any]) -> dict[str, float]:
    """Median µs of each plan's kernel and of the library baseline at the full shape, one time_many call."""
    from bench.round.round import _time as round_time
    from ptsolve.ops import make
    g = make(op, **params).graph(make(op, **params).tilings()[0])
    r = round_time(g, plans)
    return {k[:-3]: v for k, v in r.items() if k.endswith("_us")}


def run(cands: Path, out: Path, profile: int = 1, only: tuple[str, ...] = ()) -> int:
    """Check, time and (for training configurations) profile every candidate; write study.json."""
    import torch

    from codegen.harness import check, precompile
    from codegen.plan import plan_from_program
    from codegen.profile import measure
    from ptsolve.program import SProgram

    doc = json.loads(cands.read_text())
    if only:  # in the order given: put what might hang last (a timed-out call keeps what was written before)
        doc["configs"] = {k: doc["configs"][k] for k in only if k in doc["configs"]}
    hw = doc["hw"]
    prev = out / "study.json"  # a second call (--only the rest) adds to the first one's file
    res: dict[str, Any] = json.loads(prev.read_text()) if prev.exists() else {}
    res |= {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "candidates_date": doc["date"], "configs": res.get("configs", {})}
    t0 = time.time()
    allplans = {}
    for name, e in doc["configs"].items():
        for c in e["candidates"]:
            allplans[(name, c["label"])] = plan_from_program(SProgram.from_json(c["program"]), hw)
    precompile(list(allplans.values()))
    print(f"compiled {len(allplans)} kernels in {time.time() - t0:.0f} s", flush=True)
    for name, e in doc["configs"].items():
        plans, checks = {}, {}
        for c in e["candidates"]:
            p = allplans[(name, c["label"])]
            ck = check(e["op"], c["label"], p)
            checks[c["label"]] = {"rel_err": ck["rel_err"], "ok": bool(ck["ok"])}
            if ck["ok"]:
                plans[c["label"]] = p
        times = _time(e["op"], e["params"], plans) if plans else {}
        profs = {}
        if not e["held_out"]:
            for c in [c for c in e["candidates"] if c["rank"] < profile and c["label"] in plans]:
                try:
                    pr, _ = measure(SProgram.from_json(c["program"]), hw)
                    starts = {f"{ev.task}|{ev.iteration}": ev.t1 for ev in pr.events if ev.cta == 0}
                    trip = 1 + max((ev.iteration for ev in pr.events if ev.cta == 0 and ev.phase == "loop"),
                                   default=0)
                    profs[c["label"]] = {"ii": pr.ii, "span": pr.span, "kernel_us": pr.kernel_us,
                                         "instrumented_us": pr.instrumented_us, "trip": trip, "starts": starts}
                except Exception as ex:  # noqa: BLE001 - a failed profile must not lose the timings
                    profs[c["label"]] = {"error": f"{type(ex).__name__}: {ex}"}
        res["configs"][name] = {"op": e["op"], "params": e["params"], "held_out": e["held_out"], "checks": checks,
                                "measured_us": times, "profiles": profs}
        best = min(((v, k) for k, v in times.items() if k in plans), default=(math.nan, "-"))
        print(f"{name}: best {best[1]} {best[0]:.1f} µs; " + ", ".join(f"{k} {v:.1f}" for k, v in times.items()),
              flush=True)
        out.mkdir(parents=True, exist_ok=True)
        (out / "study.json").write_text(json.dumps(res, indent=1))
    print(f"done in {time.time() - t0:.0f} s")
    return 0 if all(c["ok"] for r in res["configs"].values() for c in r["checks"].values()) else 1


def report(cands_path: Path, study_path: Path, out: Path, hw_name: str = "h200", write_table: bool = False,
           rounds: int = 6) -> str:
    """The study's tables: per configuration the candidates' predicted and measured times, where the model's first
    choice ranks, the measured best of the exact top-K against PipeThreader's procedure (greedy over the tilings,
    its top-K timed) at the same budget, the library baseline; then the calibration: fitted on the training
    configurations, MAPE / Spearman / sign agreement before and after on both sets. ``write_table`` stores the fit
    as <hw>.calibrated.json (ptsolve.calibrate.write)."""
    import subprocess

    from ptsolve.calibrate import FIT, evaluate, fit, predicted, samples_from_study, write
    from ptsolve.hw import load

    cands, study = json.loads(cands_path.read_text()), json.loads(study_path.read_text())
    samples = samples_from_study(cands, study)
    train = [x for x in samples if not x.meta["held_out"]]
    held = [x for x in samples if x.meta["held_out"]]
    base = load(hw_name, calibrated=False)  # fit from the datasheet table, not from an overlay already on disk
    fitted, hist = fit(train, base, tuple(FIT), rounds,
                       progress=lambda m: print(f"fit: {m}", file=sys.stderr, flush=True))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [f"# Measured selection and model fidelity ({study['device']})", "",
             f"- candidates: `python -m bench study prepare` ({cands['date']}, top {cands['top_k']} per policy, "
             "compile-checked); times: `python -m bench study run` (one device call); this report: "
             f"`python -m bench study report` at commit {commit}, {time.strftime('%Y-%m-%d')}",
             f"- calibration: fitted on {len(train)} timed schedules of {len({x.config for x in train})} training "
             f"configurations (loss {hist[0]:.4f} -> {hist[-1]:.4f}); evaluated on {len(held)} schedules of "
             f"{len({x.config for x in held})} held-out configurations never used in the fit", "",
             "| fitted entry | table | fitted |", "|---|---|---|"]
    lines += [f"| {k} | {getattr(base, k)} | {getattr(fitted, k):.4g} |" for k in FIT]
    lines += ["", "| set | model | MAPE | median Spearman (configs) | exact-vs-greedy sign agreement |",
              "|---|---|---|---|---|"]
    ev = {}
    for part, xs in (("training", train), ("held-out", held)):
        for label, hw in (("table", base), ("calibrated", fitted)):
            e = evaluate(xs, hw) if xs else None
            ev[(part, label)] = e
            if e:
                rho = sorted(v for v in e["spearman"].values() if v == v)
                lines.append(f"| {part} | {label} | {100 * e['mape']:.1f}% | "
                             f"{rho[len(rho) // 2] if rho else float('nan'):.2f} ({len(rho)}) | "
                             f"{e['sign_agreement']:.2f} ({e['sign_configs']}) |")
    lines += ["", "Per configuration (µs; rank = the model's order among the timed candidates, 0 = first choice):", "",
              "| config | set | model's choice (pred → meas) | its measured rank, table / calibrated | measured best "
              "exact | measured best greedy (PipeThreader procedure) | exact / greedy | library | exact best / "
              "library |", "|---|---|---|---|---|---|---|---|---|"]
    first_best = {"table": 0, "calibrated": 0}
    nconf = 0
    for name in cands["configs"]:
        xs = [x for x in samples if x.config == name]
        if not xs:
            continue
        nconf += 1
        meas = sorted(xs, key=lambda x: x.kernel_us)
        ex = [x for x in xs if x.policy == "cpsat"]
        gr = [x for x in xs if x.policy == "greedy"]
        ranks = {}
        for label, hw in (("table", base), ("calibrated", fitted)):
            choice = min(ex or xs, key=lambda x: (predicted(x, hw)[0], x.name))
            ranks[label] = meas.index(choice)
            first_best[label] += ranks[label] == 0
        first = min(ex or xs, key=lambda x: x.meta["rank"])
        bex = min((x.kernel_us for x in ex), default=math.nan)
        bgr = min((x.kernel_us for x in gr), default=math.nan)
        lib = xs[0].meta["library"]
        lk = next((k for k in ("sdpa_cudnn", "cublas", "triton") if k in lib), None)
        lv = lib.get(lk, math.nan) if lk else math.nan
        lines.append(f"| {name} | {'held-out' if xs[0].meta['held_out'] else 'training'} | "
                     f"{first.name.split('/')[1]} ({[c for c in cands['configs'][name]['candidates'] if c['label'] == first.name.split('/')[1]][0]['predicted_us']:.1f} → {first.kernel_us:.1f}) | "  # noqa: E501
                     f"{ranks['table']} / {ranks['calibrated']} | {bex:.1f} | {bgr:.1f} | {bgr / bex:.3f} | "
                     f"{lk or '—'} {lv:.1f} | {lv / bex:.3f} |")
    lines += ["", f"The model's first choice was the measured best in {first_best['table']} of {nconf} configurations "
              f"with the table's constants and in {first_best['calibrated']} with the calibrated ones."]
    md = "\n".join(lines) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"study_{hw_name}.md").write_text(md)
    (out / f"study_{hw_name}_fit.json").write_text(json.dumps(
        {"fitted": {k: getattr(fitted, k) for k in FIT}, "loss": hist,
         "eval": {f"{a}/{b}": v for (a, b), v in ev.items()}}, indent=1, default=str))
    if write_table:
        write(fitted, base, f"fitted by `python -m bench study report` on {len(train)} schedules of "
                            f"{len({x.config for x in train})} training configurations measured on {study['device']} "
                            f"({study_path}, commit {commit})")
    return md


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("prepare", help="solve and compile-check the candidates (CPU)")
    pr.add_argument("--out", required=True)
    pr.add_argument("--hw", default="h200")
    pr.add_argument("--top-k", type=int, default=4)
    pr.add_argument("--only", default="")
    ru = sub.add_parser("run", help="check, time and profile them (GPU)")
    ru.add_argument("candidates")
    ru.add_argument("--out", required=True)
    ru.add_argument("--profile", type=int, default=1, help="profile the best N schedules of each training config")
    ru.add_argument("--only", default="", help="comma-separated configurations (default: all)")
    pc = sub.add_parser("precompile", help="compile every kernel a run launches into the cubin cache (CPU)")
    pc.add_argument("candidates")
    pc.add_argument("--profile", type=int, default=1)
    pc.add_argument("--jobs", type=int, default=2)
    rp = sub.add_parser("report", help="tables and the calibration from a finished study (CPU)")
    rp.add_argument("--candidates", required=True)
    rp.add_argument("--study", required=True)
    rp.add_argument("--out", default="results")
    rp.add_argument("--hw", default="h200")
    rp.add_argument("--write", action="store_true", help="store the fit as ptsolve/hw/<hw>.calibrated.json")
    a = ap.parse_args(argv)
    if a.cmd == "precompile":
        print(f"{precompile(json.loads(Path(a.candidates).read_text()), a.profile, a.jobs)} kernels compiled")
        return 0
    if a.cmd == "report":
        print(report(Path(a.candidates), Path(a.study), Path(a.out), a.hw, a.write))
        return 0
    if a.cmd == "prepare":
        prepare(Path(a.out), a.hw, a.top_k, tuple(x for x in a.only.split(",") if x))
        return 0
    return run(Path(a.candidates), Path(a.out), a.profile, tuple(x for x in a.only.split(",") if x))


if __name__ == "__main__":
    sys.exit(main())
