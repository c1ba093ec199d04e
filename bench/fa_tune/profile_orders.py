"""Where the model's first choice (c0: the free CP-SAT order, rescale of iteration j-1 between QK(j) and PV(j-1))
loses to the FA3 order (c3: rescale of j after rowsum(j)) on the GPU: both candidates of results/fa_tune
(candidates.json) profiled (codegen.profile: per task and warpgroup, cycles waiting and working, the measured ii).

    python -m bench fa_tune profile_orders emit                                          # CPU
    PTSOLVE_CACHE_DIR=$PWD/.cubin_po python -m bench fa_tune profile_orders compile      # CPU
    PTSOLVE_CACHE_DIR=$PWD/.cubin_po python -m bench fa_tune profile_orders run --out $OUT   # GPU
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[2] / "results/fa_tune"  # the study's data
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
SRC = HERE / "profile_sources.json"
CONFIGS = ("FA3", "FA14")
RANKS = (0, 3)


def emit() -> None:
    from codegen.cuda import emit_ir
    from codegen.lower import lower
    from ptsolve.program import SProgram
    info = json.loads((HERE / "candidates.json").read_text())
    out = {}
    for c in CONFIGS:
        for r in RANKS:
            ir = lower(SProgram.from_json(info[c]["candidates"][r]["program"]), "h200")
            out[f"{c}/c{r}"] = {"ir": ir.to_json(),
                                "plain": dataclasses.asdict(emit_ir(dataclasses.replace(ir, profile=False))),
                                "prof": dataclasses.asdict(emit_ir(dataclasses.replace(ir, profile=True)))}
    SRC.write_text(json.dumps(out, sort_keys=True))


def compile_all() -> None:
    import codegen.runtime as rt
    from bench.ab.regress_ab import ks_of
    for k, v in json.loads(SRC.read_text()).items():
        for w in ("plain", "prof"):
            r = rt.compile_kernel(ks_of(v[w])).report
            print(k, w, r["registers"], r["spill_stores"], r["wgmma_serialized"], flush=True)


def run(out: Path) -> None:
    from codegen import profile as prof
    from codegen.kernel_ir import KernelIR
    res = {}
    for k, v in json.loads(SRC.read_text()).items():
        ir = KernelIR.from_json(v["ir"])
        pr, _ = prof.measure(ir, "h200")
        (out / f"{k.replace('/', '_')}.profile.json").write_text(pr.to_json())
        res[k] = {"ii": pr.ii, "predicted_ii": ir.predicted_ii, "kernel_us": pr.kernel_us, "overhead": pr.overhead,
                  "per_task": {t: [round(w), round(b)] for t, (w, b) in prof.task_means(pr).items()}}
        print(k, json.dumps(res[k]), flush=True)
    (out / "profile_orders.json").write_text(json.dumps(res, indent=1, sort_keys=True))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "emit":
        emit()
    elif cmd == "compile":
        compile_all()
    elif cmd == "run":
        o = Path(sys.argv[sys.argv.index("--out") + 1])
        o.mkdir(parents=True, exist_ok=True)
        run(o)
