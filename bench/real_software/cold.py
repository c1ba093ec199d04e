"""Cold and warm ``ptsolve optimize`` times of held-out attention configurations (issue 34's speed target: <= 3 s
median cold, < 1 s warm, on 2 cores), each in a fresh process pinned to ``--cpus``; writes a markdown table
(``--out FILE``, default results/real_software/cold.md).

Cold: an empty schedule and cubin cache (a fresh ``PTSOLVE_CACHE_DIR``), so every compile check runs nvcc. Warm: the
same call again on the cache the cold run filled. Besides the wall time, the CPU seconds of the whole process tree
(user + system, the solver workers and nvcc included) are reported: on a shared machine the wall time moves with
the load, the CPU time much less. ``--ab TREE`` times another source tree (e.g. a ``git archive`` of the commit
before a change) in turn with this one, run for run, so that both meet the same load."""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ptsolve.provenance import stamp

ROOT = Path(__file__).resolve().parents[2]
# held-out attention shapes: GQA and MHA, causal or not, head_dim 64/96/128/256, ragged and round lengths
CONFIGS = {
    "70B-style causal d128": "batch=1 heads=32 kv_heads=8 seq=1536 head_dim=128 causal=true",
    "Qwen-style 28/4 s3000": "batch=4 heads=28 kv_heads=4 seq=3000 head_dim=128",
    "b16 h16 s512 d64": "batch=16 heads=16 kv_heads=16 seq=512 head_dim=64",
    "h32/8 s2048 d96": "batch=1 heads=32 kv_heads=8 seq=2048 head_dim=96",
    "h32/8 s2048 d256": "batch=1 heads=32 kv_heads=8 seq=2048 head_dim=256",
    "h24/8 s2000 d96 causal": "batch=1 heads=24 kv_heads=8 seq=2000 head_dim=96 causal=true",
}


def once(params: str, cache: str, cpus: str | None, hw: str, root: Path = ROOT) -> tuple[float, float, int, str]:
    """(wall s, CPU s of the process tree, exit status, first line of the answer) of one ``ptsolve optimize fa`` of
    the source tree ``root``."""
    env = {**os.environ, "PTSOLVE_CACHE_DIR": cache, "PTSOLVE_OUT_DIR": tempfile.mkdtemp(prefix="ptsolve_out_"),
           "PYTHONPATH": str(root)}
    cmd = [sys.executable, "-m", "ptsolve.cli", "optimize", "fa", *params.split(), "--hw", hw]
    if cpus and shutil.which("taskset"):
        cmd = ["taskset", "-c", cpus, *cmd]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=root)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    out = p.stdout if p.returncode == 0 else p.stderr
    return wall, cpu, p.returncode, (out.strip().splitlines() or [""])[0 if p.returncode == 0 else -1][:150]


def measure(params: str, repeat: int, cpus: str | None, hw: str, roots: tuple[Path, ...] = (ROOT,)
            ) -> list[dict[str, object]]:
    """Per source tree in ``roots``: median cold and warm wall and CPU seconds over ``repeat`` fresh caches, and the
    answers seen (one expected); the trees take turns, run for run."""
    runs: list[tuple[list, list, set]] = [([], [], set()) for _ in roots]
    for _ in range(repeat):
        for root, (cold, warm, answers) in zip(roots, runs):
            cache = tempfile.mkdtemp(prefix="ptsolve_cache_")
            w, c, rc, line = once(params, cache, cpus, hw, root)
            cold.append((w, c))
            answers.add(line.split(", ")[0] if rc == 0 else f"exit {rc}: {line}")
            warm.append(once(params, cache, cpus, hw, root)[:2])
            shutil.rmtree(cache, ignore_errors=True)
    med = statistics.median
    return [{"cold": med(w for w, _ in cold), "cold_cpu": med(c for _, c in cold), "cold_all": [w for w, _ in cold],
             "warm": med(w for w, _ in warm), "warm_cpu": med(c for _, c in warm), "answers": sorted(answers)}
            for cold, warm, answers in runs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "results/real_software/cold.md"))
    ap.add_argument("--repeat", type=int, default=3, help="cold runs per configuration (default 3; the median)")
    ap.add_argument("--cpus", default="0,1", help="taskset's CPU list (default 0,1: two cores; '' for all)")
    ap.add_argument("--hw", default="h100")
    ap.add_argument("--only", nargs="*", default=None, help="configuration names (default: all)")
    ap.add_argument("--ab", default=None, help="another source tree, timed in turn with this one (rows 'ab')")
    a = ap.parse_args()
    roots = (ROOT,) + ((Path(a.ab).resolve(),) if a.ab else ())
    for root in roots:  # an installed library's bytecode is compiled: no timed run pays for it (with
        # PYTHONDONTWRITEBYTECODE set, as on some CI images, every run would: a warm call took 0.56 s, not 0.30)
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(root / "ptsolve"), str(root / "codegen")],
                       check=True, capture_output=True)
    rows = []
    for name, params in CONFIGS.items():
        if a.only and name not in a.only:
            continue
        for tag, r in zip(("", " (ab)"), measure(params, a.repeat, a.cpus or None, a.hw, roots)):
            rows.append((name + tag, params, r))
            print(f"{name}{tag}: cold {r['cold']:.2f} s ({r['cold_cpu']:.1f} CPU s), warm {r['warm']:.2f} s; "
                  f"{r['answers']}", flush=True)
    st = stamp()
    lines = ["# Cold and warm optimize times (issue 34: <= 3 s cold, < 1 s warm, 2 cores)", "",
             f"- command: `python -m bench real_software cold --repeat {a.repeat} --cpus '{a.cpus}' --hw {a.hw}"
             + (f" --ab {a.ab}`" if a.ab else "`") + (f"; (ab) rows: the tree {a.ab}" if a.ab else ""),
             f"- date: {st['date']}", f"- commit: {st['commit']}", f"- machine: {st['machine']}",
             f"- cores: {os.cpu_count()}, pinned to: {a.cpus or 'all'}", "",
             "| configuration | cold s (median) | cold runs s | cold CPU s | warm s | warm CPU s | answer |",
             "|---|---|---|---|---|---|---|"]
    for name, params, r in rows:
        runs = " / ".join(f"{x:.1f}" for x in r["cold_all"])  # type: ignore[union-attr]
        lines.append(f"| {name} (`{params}`) | {r['cold']:.2f} | {runs} | {r['cold_cpu']:.1f} | {r['warm']:.2f} | "
                     f"{r['warm_cpu']:.1f} | {'; '.join(r['answers']).replace('|', '/')} |")  # type: ignore[arg-type]
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
