"""Measured selection (``ptsolve.tune``'s candidates) for the split-KV decode shapes where the committed choice
(results/decode_h200/plans.json) trails SDPA-cuDNN, and on held-out decode shapes (HELDOUT: other models, batches
and cache lengths of ../shared/shapes.md; their ``choice`` is today's ``optimize``): the model's K best
compile-clean schedules of each, timed on the GPU next to the choice and cuDNN (bench/decode_stream/stream.py's
harness: outputs checked against float32 first); the fastest is the pick (``picks.json``), which ``confirm`` times
again in a fresh process, so the pick's margin is not the selection's own noise.

    python -m bench decode_tune decode_tune emit                                        # CPU: candidates
    PTSOLVE_CACHE_DIR=$PWD/.cubin_dt python -m bench decode_tune decode_tune compile    # CPU
    PTSOLVE_CACHE_DIR=$PWD/.cubin_dt python -m bench decode_tune decode_tune select --out $OUT/select   # GPU
    PTSOLVE_CACHE_DIR=$PWD/.cubin_dt python -m bench decode_tune decode_tune confirm --out $OUT/confirm # GPU
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[2] / "results/decode_tune"  # the study's data
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
from bench.decode_stream import stream as S  # noqa: E402

SRC = HERE / "sources.json"
SHAPES = ("dec_llama3-8b_b16_q1_k4097", "dec_llama3-8b_b16_q1_k32768", "dec_llama3-8b_b64_q1_k1000",
          "dec_llama3-8b_b64_q1_k4097", "dec_llama3-8b_b64_q1_k32768", "dec_qwen2.5-0.5b_b16_q1_k4097",
          "dec_qwen2.5-0.5b_b16_q1_k32768", "dec_qwen2.5-0.5b_b64_q1_k32768")
# held out: decode shapes of ../shared/shapes.md's models that neither results/decode_h200 nor the studies above ran
MODELS = {"llama3-70b": (64, 8, 128), "qwen2.5-7b": (28, 4, 128), "gpt2": (12, 12, 64), "falcon-7b": (71, 1, 64),
          "qwen2.5-0.5b": (14, 2, 64), "llama3-8b": (32, 8, 128)}
HELDOUT = {f"dec_{m}_b{b}_q1_k{k}": {"batch": b, "heads": MODELS[m][0], "kv_heads": MODELS[m][1], "seq_q": 1,
                                    "seq_kv": k, "head_dim": MODELS[m][2], "causal": False}
           for m, b, k in (("llama3-70b", 4, 8192), ("llama3-70b", 16, 2047), ("llama3-70b", 64, 511),
                           ("qwen2.5-7b", 1, 32768), ("qwen2.5-7b", 16, 8192), ("qwen2.5-7b", 64, 4097),
                           ("gpt2", 16, 8192), ("gpt2", 64, 2047), ("falcon-7b", 4, 8192), ("qwen2.5-0.5b", 4, 8192),
                           ("llama3-8b", 4, 8192))}
K = 4  # candidates per shape
TIME_LIMIT = 10.0  # CP-SAT seconds per solve


def emit() -> None:
    import ptsolve
    from codegen.cuda import emit as emit_source
    from codegen.plan import KernelPlan, plan_from_program
    from ptsolve.tune import candidates

    plans = {sh["name"]: sh for sh in json.loads(S.PLANS.read_text())["shapes"]}
    src = json.loads(SRC.read_text()) if SRC.exists() else {}
    info = json.loads((HERE / "candidates.json").read_text()) if (HERE / "candidates.json").exists() else {}
    for name in (*SHAPES, *HELDOUT):
        if name in src:
            continue
        op = ptsolve.ops.make("flash_decode", **(plans[name]["params"] if name in plans else HELDOUT[name]))
        if name in plans:  # the committed choice
            choice = S.committed(plans[name])
            ctiling, cplan = choice["tiling"], KernelPlan.from_json(json.dumps(choice["plan"]))
            cpred = choice["predicted_us"]
        else:  # held out: today's first choice (optimize, compiler in the loop)
            r = ptsolve.optimize(op, hw="h200", solver="cpsat", time_limit=TIME_LIMIT, cache=False)
            ctiling, cplan, cpred = r.tiling, plan_from_program(r.program, "h200"), r.predicted_us
        cands, rejected = candidates(op, "h200", K, solver="cpsat", time_limit=TIME_LIMIT)
        row = {"params": op.params, "choice": S._name(ctiling),
               "kernels": {"choice": dataclasses.asdict(emit_source(cplan, "h200"))}}
        for c in cands:
            row["kernels"][f"c{c.rank}"] = dataclasses.asdict(emit_source(plan_from_program(c.result.program, "h200"),
                                                                          "h200"))
        src[name] = row
        info[name] = {"choice": {"tiling": ctiling, "predicted_us": cpred,
                                 "what": "committed (results/decode_h200)" if name in plans else "optimize today"},
                      "candidates": [{"rank": c.rank, "tiling": c.result.tiling, "status": c.result.status,
                                      "predicted_us": c.result.predicted_us, "check": c.check.status,
                                      "program": c.result.program.to_json()} for c in cands],
                      "rejected": [[t, why] for t, why in rejected]}
        print(name, [(S._name(c.result.tiling), round(c.result.predicted_us, 1)) for c in cands], flush=True)
        SRC.write_text(json.dumps(src, indent=0, sort_keys=True))
        (HERE / "candidates.json").write_text(json.dumps(info, indent=1, sort_keys=True))


def pick(select: Path) -> None:
    """picks.json: per shape the candidate the select run timed fastest (the model's earlier on a tie); the sources'
    ``pick`` kernel for the confirm run."""
    res = json.loads(select.read_text())["shapes"]
    src = json.loads(SRC.read_text())
    info = json.loads((HERE / "candidates.json").read_text())
    rep = json.loads((HERE / "compile.json").read_text())
    picks = {}
    for name, rec in res.items():
        us = rec["us"]
        best = min((k for k in us if k[0] == "c" and k[1:].isdigit()), key=lambda k: (us[k], int(k[1:])))
        cand = info[name]["candidates"][int(best[1:])]
        picks[name] = {"pick": best, "tiling": cand["tiling"], "predicted_us": cand["predicted_us"],
                       "program": cand["program"], "select_us": us}
        src[name]["kernels"]["pick"] = src[name]["kernels"][best]
        rep[name]["pick"] = rep[name][best]
    SRC.write_text(json.dumps(src, indent=0, sort_keys=True))
    (HERE / "compile.json").write_text(json.dumps(rep, indent=1, sort_keys=True))
    (HERE / "picks.json").write_text(json.dumps(picks, indent=1, sort_keys=True))
    print(json.dumps({n: (p["pick"], S._name(p["tiling"]), round(p["select_us"][p["pick"]], 1))
                      for n, p in picks.items()}, indent=0))


def report(select: Path, confirm: Path) -> None:
    """Markdown: per shape the choice and the pick (tiling, predicted and confirmed µs) next to cuDNN, and each
    candidate's time in the select run."""
    docs = [json.loads(p.read_text()) for p in (select, confirm)]
    sel, con = (d["shapes"] for d in docs)
    for p, d in zip((select, confirm), docs):
        print(f"Run {p.name}: {d['device']}, {d['date']}, commit {d.get('provenance', {}).get('commit', '?')}; "
              "µs per call.")
    print()
    info = json.loads((HERE / "candidates.json").read_text())
    picks = json.loads((HERE / "picks.json").read_text())
    print("| shape | choice (what) | pick (rank) | predicted µs choice / pick | confirm µs choice / pick / cuDNN | "
          "cuDNN / choice | cuDNN / pick | select run µs c0 c1 c2 c3 |")
    print("|---|---|---|---|---|---|---|---|")
    for name in sorted(con, key=lambda n: (n not in SHAPES, n)):
        us, ch, pk = con[name]["us"], info[name]["choice"], picks[name]
        cd = us["sdpa_cudnn"]
        what = "committed" if name in SHAPES else "optimize, held out"
        cells = [name, f"{S._name(ch['tiling'])} ({what})", f"{S._name(pk['tiling'])} ({pk['pick']})",
                 f"{ch['predicted_us']:.1f} / {pk['predicted_us']:.1f}",
                 f"{us['choice']:.1f} / {us['pick']:.1f} / {cd:.1f}", f"{cd / us['choice']:.3f}",
                 f"{cd / us['pick']:.3f}",
                 " ".join(f"{sel[name]['us'][f'c{i}']:.1f}" for i in range(K) if f"c{i}" in sel[name]["us"])]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "emit":
        emit()
    elif cmd == "compile":
        S.compile_all(SRC)
    elif cmd == "report":
        report(Path(sys.argv[2]), Path(sys.argv[3]))
    elif cmd == "pick":
        pick(Path(sys.argv[2]))
    elif cmd in ("select", "confirm"):
        o = Path(sys.argv[sys.argv.index("--out") + 1])
        o.mkdir(parents=True, exist_ok=True)
        S.run(o / f"{cmd}.json", SRC, ("choice", "pick") if cmd == "confirm" else (), profile=False)
