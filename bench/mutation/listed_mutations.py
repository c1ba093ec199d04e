"""Apply each mutation listed in issue 10 ('tests that cannot fail') to a copy of this checkout and run the CPU
tests: every one must make at least one test fail.
Usage: python -m bench mutation listed_mutations > results/listed_mutations.txt (about 10 minutes)."""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ["tests/ptsolve/policies/test_greedy.py", "tests/ptsolve/test_constants.py", "tests/codegen/test_plan_order.py",
         "tests/ptsolve/test_regressions.py", "tests/ptsolve/test_search.py", "tests/ptsolve/test_schedule_checks.py",
         "tests/ptsolve/test_cli.py"]
MUTATIONS = [  # (name, file, text, replacement)
    ("greedy priority key inverted", "ptsolve/policies/greedy.py",
     "ready.sort(key=lambda t: priority(t, asyn, ins, dep, S))",
     "ready.sort(key=lambda t: priority(t, asyn, ins, dep, S), reverse=True)"),
    ("greedy: synchronous first", "ptsolve/policies/greedy.py", "return not asyn[t], sum(", "return asyn[t], sum("),
    ("greedy: more unscheduled predecessors first", "ptsolve/policies/greedy.py",
     "return not asyn[t], sum(u not in S", "return not asyn[t], -sum(u not in S"),
    ("greedy: fewer dependants first", "ptsolve/policies/greedy.py", "-dep[t], t", "dep[t], t"),
    ("plan_from_program sorts a role's order", "codegen/plan.py",
     "order = {ph: {r: [(t, int(s) - (base if ph == \"loop\" else 0)) for t, s in ops]",
     "order = {ph: {r: sorted([(t, int(s) - (base if ph == \"loop\" else 0)) for t, s in ops])"),
    ("every gap forced to 0", "ptsolve/result.py",
     "return max(0.0, (self.objective - self.bound) / self.objective)", "return 0.0"),
    ("decoupled search picks the worst tiling", "ptsolve/search.py", "cands = cands[:1]", "cands = cands[-1:]"),
    ("shortest-first placement (sm_loads)", "ptsolve/placement.py",
     "for c, m in sorted(zip(vals.tolist(), counts.tolist()), reverse=True):",
     "for c, m in sorted(zip(vals.tolist(), counts.tolist())):"),
    ("shortest-first placement (model slots)", "ptsolve/placement.py",
     "for v, m in sorted(zip(vals.tolist(), counts.tolist()), reverse=True):  # longest first",
     "for v, m in sorted(zip(vals.tolist(), counts.tolist())):"),
    ("REG_OVERHEAD 24 -> 32", "ptsolve/validate.py", "REG_OVERHEAD = 24", "REG_OVERHEAD = 32"),
    ("REG_OVERHEAD 24 -> 16", "ptsolve/validate.py", "REG_OVERHEAD = 24", "REG_OVERHEAD = 16"),
    ("GEMM L2-reuse constant 132 -> 100", "ptsolve/ops/gemm.py", "side = math.isqrt(132)", "side = math.isqrt(100)"),
    ("GEMM L2-reuse constant 132 -> 196", "ptsolve/ops/gemm.py", "side = math.isqrt(132)", "side = math.isqrt(196)"),
]


def main() -> int:
    import datetime
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout
    print(f"# bench/mutation/listed_mutations.py, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
          f"commit {commit.strip()}", flush=True)
    survived = []
    for name, rel, old, new in MUTATIONS:
        with tempfile.TemporaryDirectory() as d:
            skip = shutil.ignore_patterns(".git", "mutants", "__pycache__")
            shutil.copytree(ROOT, d, dirs_exist_ok=True, ignore=skip)
            f = Path(d) / rel
            text = f.read_text()
            assert text.count(old) == 1, f"{name}: {old!r} not found once in {rel}"
            f.write_text(text.replace(old, new))
            p = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *TESTS], cwd=d,
                               capture_output=True, text=True)
            verdict = "killed" if p.returncode == 1 else "SURVIVED" if p.returncode == 0 else f"rc={p.returncode}"
            failed = next((x for x in p.stdout.splitlines() if x.startswith("FAILED")), "")
            print(f"{verdict:8} {name}  {failed}", flush=True)
            if p.returncode != 1:
                survived.append(name)
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
