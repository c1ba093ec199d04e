"""Wall times of the commands a newcomer runs, each in a fresh process with an empty cache (where it says so), on
this machine; writes a markdown table (``--out FILE``, default results/real_software/timings.md).

``--main-job`` also times ``ptsolve compare --suite paper --hw h100`` with an empty cache (minutes)."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ptsolve.provenance import stamp

ROOT = Path(__file__).resolve().parents[2]


def run(args: list[str], cache: str, limit: float = 900) -> tuple[float, int, str]:
    """(wall seconds, exit status, last line of stderr/stdout) of ``ptsolve ARGS`` with the cache in ``cache``."""
    env = {**os.environ, "PTSOLVE_CACHE_DIR": cache, "PTSOLVE_OUT_DIR": tempfile.mkdtemp(prefix="ptsolve_out_")}
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "ptsolve.cli", *args], env=env, capture_output=True, text=True,
                       timeout=limit, cwd=ROOT)
    s = time.perf_counter() - t0
    tail = (p.stdout.strip().splitlines() or [""])[0] if p.returncode == 0 else \
        (p.stderr.strip().splitlines() or [""])[-1]
    return s, p.returncode, tail[:160]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "results/real_software/timings.md"))
    ap.add_argument("--main-job", action="store_true", help="also time the main job (compare, empty cache)")
    a = ap.parse_args()
    fa = ["fa", "batch=1", "heads=32", "kv_heads=8", "seq=1536", "head_dim=128", "causal=true", "--hw", "h100"]
    rows = []
    warm = tempfile.mkdtemp(prefix="ptsolve_cache_")
    rows.append(("optimize (FA 70B-style, compile checks on), empty cache", *run(["optimize", *fa], warm)))
    rows.append(("optimize, the same call again (warm cache)", *run(["optimize", *fa], warm)))
    for d in (96, 256):
        rows.append((f"optimize head_dim {d} (Phi-3 / Gemma-2), empty cache",
                     *run(["optimize", "fa", "batch=1", "heads=32", "kv_heads=8", "seq=2048", f"head_dim={d}"],
                          tempfile.mkdtemp())))
    for name, args in (
            ("optimize", ["optimize", "fa", "batch=64", "heads=64", "kv_heads=8", "seq=8192", "causal=true",
                          "--solver", "milp"]),
            ("compare", ["compare", "--suite", "paper", "--hw", "h100"]),
            ("placement", ["placement", "--hw", "h100"]),
            ("tune --prepare", ["tune", *fa[:-2], "--hw", "h200", "--prepare",
                                str(Path(tempfile.mkdtemp()) / "c.json")])):
        rows.append((f"{name} --time-limit 20, empty cache", *run([*args, "--time-limit", "20"],
                                                                 tempfile.mkdtemp())))
    if a.main_job:
        rows.append(("the main job: compare --suite paper --hw h100, empty cache",
                     *run(["compare", "--suite", "paper", "--hw", "h100"], tempfile.mkdtemp(), 3600)))
    st = stamp()
    lines = ["# Wall times a newcomer meets", "",
             f"- command: `python -m bench real_software{' --main-job' if a.main_job else ''}`",
             f"- date: {st['date']}", f"- commit: {st['commit']}", f"- machine: {st['machine']}",
             f"- cores: {os.cpu_count()}", "",
             "| what | wall s | exit | first line of the answer (or the error) |", "|---|---|---|---|"]
    lines += [f"| {w} | {s:.1f} | {rc} | {tail.replace('|', '/')} |" for w, s, rc, tail in rows]
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
