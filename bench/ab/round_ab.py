"""Issue 8's acceptance on the GPU, in one process: the paper round's exact (CP-SAT) kernel of every configuration
before the one lowering (the old per-op emitters, commit ae3a8a0, on the round's committed schedules
``results/schedules_h200``) next to what the library builds now.

Columns: ``old`` (and ``old_again``, the same kernel timed twice: the comparison's noise); ``same``: today's
skeleton from the same committed schedule (``plan_from_program``; the lowering alone); ``now``: today's skeleton
from the schedule the current model and compiler-in-the-loop choose (``results/sched_new``, written by
``python -m bench round prepare --hw h200 --out results/sched_new``), which is what ``codegen.round`` and
``optimize`` give a user today. Timing and checks are ``bench/ab/regress_ab.py``'s (one child process smoke-runs
every kernel first; outputs compared with ``old``'s; CUDA graphs, 30 rounds, candidates in a rotated order).

    python -m bench ab round_ab emit [--old-root /tmp/old_wt]   # CPU; the old root is a checkout of ae3a8a0
    PTSOLVE_CACHE_DIR=$PWD/.cubin_round python -m bench ab round_ab compile
    PTSOLVE_CACHE_DIR=$PWD/.cubin_round python -m bench ab round_ab            # GPU
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.ab import regress_ab as R  # noqa: E402

CONFIGS = ("FA2", "FA3", "FA3c", "FA8", "FA8c", "FA13c", "FA14", "FA17c", "GEMM1", "GEMM3",
           "CS0", "CS3", "CS5", "CS8", "CS9", "ST0", "ST3", "ST5", "ST8", "ST9")
R.AB = ROOT / "results/ab/round_sources.json"
R.NAMES = list(CONFIGS)
R.COLS = ["old", "old_again", "same", "now"]
R.RATIOS = [("same", "old"), ("now", "old"), ("now", "same")]
R.__file__ = __file__  # the smoke test re-runs this script in a child process
OLD_COMMIT = "ae3a8a0"
OLD_EMIT = """
import dataclasses, json, sys
from codegen.cuda import emit
from codegen.plan import plan_from_program
from ptsolve.result import Result
out = {}
for f in sys.argv[1:]:
    ks = emit(plan_from_program(Result.from_json(open(f).read()).program, "h200"))
    out[f] = dataclasses.asdict(ks)
print(json.dumps(out))
"""


def emit() -> None:
    from codegen.cuda import emit as emit_source
    from codegen.plan import plan_from_program
    from ptsolve.result import Result

    root = Path(sys.argv[sys.argv.index("--old-root") + 1]) if "--old-root" in sys.argv else Path("/tmp/old_wt")
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.stdout.strip() != OLD_COMMIT:
        raise SystemExit(f"{root} is at {head.stdout.strip() or '?'}, not {OLD_COMMIT}: "
                         f"git worktree add {root} {OLD_COMMIT}")
    files = [str(ROOT / "results/schedules_h200" / f"{c}_cpsat.json") for c in CONFIGS]
    got = subprocess.run([sys.executable, "-c", OLD_EMIT, *files], cwd=root, capture_output=True, text=True,
                         env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin:/usr/local/bin"})
    if got.returncode:
        raise SystemExit(f"old emitters failed: {got.stderr[-2000:]}")
    old = json.loads(got.stdout)
    out = {}
    for c, f in zip(CONFIGS, files):
        same = emit_source(plan_from_program(Result.from_json(Path(f).read_text()).program, "h200"), "h200")
        new = Result.from_json((ROOT / "results/sched_new" / f"{c}_cpsat.json").read_text())
        now = emit_source(plan_from_program(new.program, "h200"), "h200")
        out[c] = {"old": old[f], "same": dataclasses.asdict(same), "now": dataclasses.asdict(now)}
        print(c, "now:", new.tiling, "same source as old schedule's:", now.source == same.source, flush=True)
    R.AB.write_text(json.dumps(out, indent=0, sort_keys=True))


if __name__ == "__main__":
    R.cli(emit)
