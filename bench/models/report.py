"""The markdown of a ``llama`` (or ``ssd``) run: one table, the issue's bars, what the JSON says and nothing else.

    python -m bench models report results/models/h200.json --out results/models/h200.md
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any


def _geo(xs: list[float]) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


SSD_PHASES = ("ssd_combined", "chunk_scan", "chunk_state")


def render_ssd(res: dict[str, Any]) -> str:
    """The report of one ``ssd`` run's JSON: a row per shape, mamba_ssm / ptsolve per phase, and the issue's bars."""
    rows = [r for r in res["rows"] if "skipped" not in r]
    names = list(dict.fromkeys(r["name"] for r in rows))
    by = {(r["name"], r["phase"]): r for r in rows}
    out = [f"# Mamba2's SSD forward through ptsolve, next to mamba_ssm ({res['device']})", "",
           f"`{res['command']}`, commit {res['commit']}, {res['date']}, torch {res['torch']}. Times in ms; ratio "
           "mamba_ssm / ptsolve (above 1: ptsolve faster).", "",
           "| row | " + " | ".join(f"{ph} ptsolve | mamba_ssm | ratio" for ph in SSD_PHASES) + " |",
           "|---|" + "---|---|---|" * len(SSD_PHASES)]
    for n in names:
        cells = []
        for ph in SSD_PHASES:
            r = by.get((n, ph))
            cells += ([f"{r['ptsolve_ms']:.3f}", f"{r['baseline_ms']:.3f}", f"{r['baseline_ms'] / r['ptsolve_ms']:.2f}"]
                      if r else ["—"] * 3)
        out.append(f"| {n} | " + " | ".join(cells) + " |")
    ratio = {ph: [by[n, ph]["baseline_ms"] / by[n, ph]["ptsolve_ms"] for n in names if (n, ph) in by]
             for ph in SSD_PHASES}
    out += ["", "## Issue 37's bars (Mamba2)", ""]
    for ph, bar in (("chunk_scan", 1.5), ("chunk_state", 1.5)):
        if ratio[ph]:
            ok = "met" if min(ratio[ph]) >= bar else "not met"
            out.append(f"- {ph} ≥ {bar}× the Triton kernel on every shape: {ok}"
                       f" (min {min(ratio[ph]):.2f}, geomean {_geo(ratio[ph]):.2f})")
    if ratio["ssd_combined"]:
        c = ratio["ssd_combined"]
        ok = "met" if _geo(c) >= 1.3 and min(c) >= 1 else "not met"
        out.append(f"- whole SSD forward ≥ 1.3× geomean, none below 1.0: {ok} "
                   f"(geomean {_geo(c):.2f}, min {min(c):.2f})")
    skipped = [r for r in res["rows"] if "skipped" in r]
    out += [f"- {r['name']}: skipped ({r['skipped']})" for r in skipped]
    return "\n".join(out) + "\n"


def render(res: dict[str, Any]) -> str:
    """The report of one run's JSON (``llama``'s, or ``ssd``'s: ``render_ssd``)."""
    rows = res["rows"]
    if rows and rows[0].get("phase") in SSD_PHASES:
        return render_ssd(res)
    out = [f"# Hugging Face Llama through ptsolve, next to SDPA ({res['device']})", "",
           f"`{res['command']}`, commit {res['commit']}, {res['date']}, torch {res['torch']}, transformers "
           f"{res['transformers']}. Times in ms (prefill: a call; decode: a step of the whole model, eager, "
           "transformers' dynamic cache). Ratio: baseline / ptsolve (above 1: ptsolve faster).", "",
           "| row | phase | ptsolve | SDPA FLASH | SDPA cuDNN | SDPA default | baseline | ratio | max logit diff "
           "| SDPA cuDNN vs FLASH |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r["peers_ms"]
        cell = [f"{p[k]:.3f}" if k in p else "—" for k in ("sdpa_flash", "sdpa_cudnn", "sdpa_default")]
        out.append(f"| {r['name']} | {r['phase']} | {r['ptsolve_ms']:.3f} | {' | '.join(cell)} | {r['baseline']} "
                   f"| {r['baseline_ms'] / r['ptsolve_ms']:.3f} | {r['max_abs_err']:.3f} | "
                   f"{r['sdpa_noise'] if r['sdpa_noise'] is None else format(r['sdpa_noise'], '.3f')} |")
    ratio = {ph: [r["baseline_ms"] / r["ptsolve_ms"] for r in rows if r["phase"] == ph] for ph in ("prefill", "decode")}
    err = max(r["max_abs_err"] for r in rows)
    noise = max(r["sdpa_noise"] or 0 for r in rows)
    out += ["", "## Issue 37's bars (Hugging Face Llama)", "",
            f"- decode per step ≥ 1.0× the faster of SDPA FLASH / cuDNN on every row: "
            f"{'met' if min(ratio['decode']) >= 1 else 'not met'} (min {min(ratio['decode']):.3f}, geomean "
            f"{_geo(ratio['decode']):.3f})",
            f"- prefill ≥ 1.0× geomean: {'met' if _geo(ratio['prefill']) >= 1 else 'not met'} "
            f"({_geo(ratio['prefill']):.3f}, min {min(ratio['prefill']):.3f})",
            f"- logits within 1e-2 of SDPA's: {'met' if err <= 1e-2 else 'not met'} (max {err:.3f}; SDPA cuDNN "
            f"differs from SDPA FLASH by up to {noise:.3f} on the same rows)"]
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    a.out.write_text(render(json.loads(a.json.read_text())))
    print(a.out.read_text())


if __name__ == "__main__":
    main()
