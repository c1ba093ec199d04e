"""Training kernels for the per-task cost calibration (ptsolve.calibrate.task_scales): attention shapes of
``../shared/shapes.md`` that are not paper configurations (the paper's are held out), solved with CP-SAT on the
H200 table, their plain and probed kernels compiled here so the device call only measures.

    python -m bench task_costs train solve      # CPU: results/task_costs/sched/<name>.json
    PTSOLVE_CACHE_DIR=$PWD/.cubin_prof python -m bench task_costs train compile
    PTSOLVE_CACHE_DIR=$PWD/.cubin_prof python3 -m codegen.profile --schedules results/task_costs/sched \\
        --only T1_cpsat,T2_cpsat,T3_cpsat,T4_cpsat --out $OUT/prof                    # GPU
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
SCHED = ROOT / "results/task_costs/sched"
SHAPES = {  # name: flash_attention params (shapes.md: model family, batch x sequence)
    "T1": dict(batch=4, heads=32, kv_heads=8, head_dim=128, seq_q=2047, seq_kv=2047, causal=True),  # Llama-3 8B
    "T2": dict(batch=1, heads=28, kv_heads=4, head_dim=128, seq_q=4097, seq_kv=4097, causal=False),  # Qwen2.5 7B
    "T3": dict(batch=16, heads=12, kv_heads=12, head_dim=64, seq_q=1000, seq_kv=1000, causal=False),  # GPT-2
    "T4": dict(batch=1, heads=71, kv_heads=1, head_dim=64, seq_q=8192, seq_kv=8192, causal=True),  # Falcon 7B
}


def solve() -> None:
    from ptsolve import ops, optimize
    SCHED.mkdir(parents=True, exist_ok=True)
    for n, p in SHAPES.items():
        r = optimize(ops.make("flash_attention", dtype="fp16", **p), hw="h200", solver="cpsat", time_limit=120,
                     cache=False)
        (SCHED / f"{n}_cpsat.json").write_text(r.to_json())
        print(n, r.status, r.program.graph.tiling, f"{r.predicted_us:.1f} us", r.kernel_check, flush=True)


def compile_all() -> None:
    from codegen.cuda import emit_ir
    from codegen.lower import lower
    from codegen.runtime import compile_kernel
    from ptsolve.result import Result
    for f in sorted(SCHED.glob("*.json")):
        ir = lower(Result.from_json(f.read_text()).program, "h200")
        for prof in (False, True):
            c = compile_kernel(emit_ir(dataclasses.replace(ir, profile=prof)))
            print(f.stem, "probed" if prof else "plain", c.report.get("registers"), c.report.get("spill_stores"),
                  flush=True)


if __name__ == "__main__":
    {"solve": solve, "compile": compile_all}[sys.argv[1]]()
