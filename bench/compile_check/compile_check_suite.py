"""How often the compiler in the loop moves on (issue 8): every configuration of a suite solved with compile
checking on; per configuration the chosen tiling, its kernel's registers / spills / serialisation, and the tilings
the compiler rejected first (spills, a serialised wgmma pipeline, or no generator for them).

    python -m bench compile_check --suite paper --hw h200 --solver cpsat --out results/compile_check_h200.md

CPU only (nvcc sm_90a; cubins cached by source hash, so a re-run compiles only what changed)."""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="paper", help="ptsolve.suites suite name")
    ap.add_argument("--hw", default="h200")
    ap.add_argument("--solver", default="cpsat")
    ap.add_argument("--time-limit", type=float, default=30.0, help="per solve, seconds")
    ap.add_argument("--only", default="", help="comma-separated configuration names")
    ap.add_argument("--out", required=True, help="markdown file to write")
    a = ap.parse_args(argv)
    import ptsolve
    from ptsolve import suites
    from ptsolve.errors import InfeasibleError

    cfgs = [c for c in getattr(suites, a.suite)() if not a.only or c["name"] in a.only.split(",")]
    rows, t0 = [], time.time()
    for c in cfgs:
        try:
            r = ptsolve.optimize(suites.operator(c), hw=a.hw, solver=a.solver, time_limit=a.time_limit,
                                 compile_check=True)
        except InfeasibleError as e:  # every tiling rejected: that is a result too
            rows.append((c["name"], "—", "none compiles", None, None, None, ((("every tiling"), str(e)[:300]),)))
            print(f"{c['name']}: no tiling compiles ({str(e)[:120]})", file=sys.stderr, flush=True)
            continue
        kc = r.kernel_check or {}
        rows.append((c["name"], r.tiling, kc.get("status"), kc.get("registers"), kc.get("spill_bytes"),
                     kc.get("serialized"), r.rejected))
        print(f"{c['name']}: {kc.get('status')} {r.tiling} regs {kc.get('registers')} rejected {len(r.rejected)}"
              f" ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    fired = [r for r in rows if r[6]]
    lines = [f"# Compiler in the loop on the {a.suite} suite ({a.hw}, {a.solver})", "",
             f"`python -m bench compile_check --suite {a.suite} --hw {a.hw} --solver {a.solver} --out ...` "
             f"({time.strftime('%Y-%m-%d %H:%MZ', time.gmtime())}, commit {commit}, nvcc sm_90a on the CPU).", "",
             f"The fallback fired on **{len(fired)} of {len(rows)}** configurations "
             f"({sum(len(r[6]) for r in rows)} tilings rejected in all).", "",
             "| config | chosen tiling | check | registers | spill bytes | wgmma serialised | rejected first |",
             "|---|---|---|---|---|---|---|"]
    for n, t, st, reg, sp, ser, rej in rows:
        lines.append(f"| {n} | {t} | {st} | {reg} | {sp} | {ser} | "
                     + ("; ".join(f"{x if isinstance(x, str) else dict(x)}: {why}" for x, why in rej) or "—") + " |")
    Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-len(rows) - 2:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
