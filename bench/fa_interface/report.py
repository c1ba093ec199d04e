"""The markdown of a run's JSON: ``python -m bench fa_interface report F.json --out F.md``."""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any


def _cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "not run"
    if "error" in r:
        return f"error: {r['error'][:60]}"
    ok = "ok" if r["ok"] else f"**wrong** (err {r['errs'].get('ptsolve')})"
    us, fa = r.get("ptsolve_us"), r.get("fa4_us")
    ratio = f", FA4/ptsolve {fa / us:.2f}" if us and fa else ", FA4 absent" if not fa else ""
    return f"{ok}, {us:.0f} µs{ratio}" if us else ok


def report(res: dict[str, Any]) -> str:
    """Feature × head_dim: correct or not, ptsolve's µs, FlashAttention-4's time over ptsolve's (> 1: ptsolve
    faster); then the criteria of issue 36 the run speaks to and why FA4 was absent where it was."""
    from bench.fa_interface.run import FEATURES, HEAD_DIMS
    rows = {(r["feature"], r["head_dim"]): r for r in res["rows"]}
    lines = [f"# FlashAttention's interface, feature by feature ({res.get('device', '?')})", "",
             f"Command `{res.get('command')}`, {res.get('date')}, commit {res.get('commit')}; "
             f"torch {res.get('torch')}, flash-attn-4 {res.get('fa4_version') or 'absent'} "
             f"({res.get('fa4_why') or 'imported'}).",
             f"Shape: {json.dumps(res.get('shape'))}; each feature's arguments in `bench/fa_interface/run.py`.", "",
             "| feature | " + " | ".join(f"d{d}" for d in HEAD_DIMS) + " |", "|---|" + "---|" * len(HEAD_DIMS)]
    lines += [f"| {f} | " + " | ".join(_cell(rows.get((f, d))) for d in HEAD_DIMS) + " |" for f in FEATURES]
    done = [r for r in res["rows"] if "error" not in r]
    ratios = [r["fa4_us"] / r["ptsolve_us"] for r in done if r.get("fa4_us") and r.get("ptsolve_us")]
    wrong = [f"{r['feature']}/d{r['head_dim']}" for r in res["rows"] if not r.get("ok")]
    lines += ["", f"- Correct (FlashAttention's rule against fp32): {len(done) - len(wrong)} of {len(res['rows'])}"
              + (f"; not: {', '.join(wrong)}" if wrong else ""),
              f"- Against FlashAttention-4 where it ran ({len(ratios)} cases): geomean "
              + (f"{math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}, min {min(ratios):.3f}, "
                 f"{sum(x >= 0.9 for x in ratios)} of {len(ratios)} at >= 0.9 (issue 36's bar)" if ratios else "none"),
              "", "## FlashAttention-4 absent", ""]
    why = sorted({(r["feature"], r["absent"]["fa4"]) for r in done if "fa4" in r.get("absent", {})})
    lines += [f"- {f}: {w[:200]}" for f, w in why] or ["- nowhere"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench fa_interface report")
    ap.add_argument("json", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    a.out.write_text(report(json.loads(a.json.read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
