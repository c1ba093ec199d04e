"""The markdown report of a peers run, made from its JSON alone (so it can be made again).

The provenance, one table row per shape, per workload the geomean and minimum of fastest peer / ptsolve, and issue
35's "Done when" criteria as far as this run measures them. An absent peer (refused, not installed, not built) is
left out of every figure, never counted as zero.

    python -m bench peers report results/peers/h200.json [--out results/peers/h200.md]
    python -m bench peers report part1.json part2.json --json-out results/peers/h200.json --out results/peers/h200.md
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

WORKLOADS = ("prefill", "varlen", "decode", "gemm")
PEER_KEYS = ("fa4", "cudnn", "sdpa_flash", "tilelang", "cublas")


def geomean(xs: list[float]) -> float | None:
    """The geometric mean of positive numbers; None for none."""
    xs = [x for x in xs if x is not None and x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def fastest_peer(row: dict[str, Any]) -> tuple[str, float] | None:
    """(peer, µs) of the fastest peer measured on the row; None where every peer is absent."""
    ps = [(k, v) for k, v in (row.get("peers") or {}).items() if v is not None and v > 0]
    return min(ps, key=lambda kv: kv[1]) if ps else None


def ratio(row: dict[str, Any], peer: str | None = None) -> float | None:
    """Peer µs / ptsolve µs (> 1: ptsolve faster) against ``peer``, or the fastest peer; None where either is
    absent."""
    us = row.get("ptsolve_us")
    if not us:
        return None
    if peer is None:
        best = fastest_peer(row)
        return best[1] / us if best else None
    p = (row.get("peers") or {}).get(peer)
    return p / us if p else None


def summary(rows: list[dict[str, Any]], peer: str | None = None) -> dict[str, Any]:
    """Over ``rows``: the ratios (``ratio``), their geomean and minimum, how many were measured, and the rows where
    ptsolve is absent (refused or failed) or no peer ran."""
    rs = [(r["name"], ratio(r, peer)) for r in rows]
    got = [x for _, x in rs if x is not None]
    return {"n": len(rows), "measured": len(got), "geomean": geomean(got), "min": min(got) if got else None,
            "below_090": [n for n, x in rs if x is not None and x < 0.90],
            "no_ptsolve": [r["name"] for r in rows if not r.get("ptsolve_us")],
            "no_peer": [r["name"] for r in rows if r.get("ptsolve_us") and ratio(r, peer) is None]}


def _f(x: float | None, nd: int = 1) -> str:
    return "—" if x is None else f"{x:.{nd}f}"


def _err(x: float | None) -> str:
    return "—" if x is None else f"{x:.2g}"


def _shape(row: dict[str, Any]) -> str:
    s = row["shape"]
    if row["workload"] == "gemm":
        return f"{s['M']}×{s['N']}×{s['K']}"
    heads = f"{s['heads']}/{s['kv_heads']} d{s['head_dim']}{' causal' if s.get('causal') else ''}"
    if row["workload"] == "varlen":
        return f"{len(s['seqlens_q'])} seqs, {sum(s['seqlens_q'])} / {sum(s['seqlens_k'])} tokens, {heads}"
    return f"b{s['batch']} q{s['seq_q']} k{s['seq_kv']} {heads}"


def table(rows: list[dict[str, Any]]) -> list[str]:
    """One markdown line per row: µs of ptsolve, the exact kernel and every peer, the fastest peer / ptsolve,
    exact / ptsolve, the error and the check."""
    out = ["| row | shape | ptsolve µs | exact µs | " + " | ".join(f"{p} µs" for p in PEER_KEYS) +
           " | fastest peer / ptsolve | exact / ptsolve | max abs err | ok |",
           "|---|---|---|---|" + "---|" * len(PEER_KEYS) + "---|---|---|---|"]
    for r in rows:
        best = fastest_peer(r)
        peers = r.get("peers") or {}
        ex = r.get("exact_us")
        rat = ratio(r)
        out.append(f"| {r['name']} | {_shape(r)} | {_f(r.get('ptsolve_us'))} | {_f(ex)} | " +
                   " | ".join(_f(peers.get(p)) for p in PEER_KEYS) +
                   f" | {_f(rat, 3)}{f' ({best[0]})' if best and rat is not None else ''} | "
                   f"{_f(ex / r['ptsolve_us'] if ex and r.get('ptsolve_us') else None, 3)} | "
                   f"{_err(r.get('max_abs_err'))} | "
                   f"{'yes' if r.get('ok') else 'NO'} |")
    return out


def _line(what: str, s: dict[str, Any]) -> str:
    parts = [f"- {what}: geomean {_f(s['geomean'], 3)}, min {_f(s['min'], 3)} over {s['measured']} of {s['n']} rows"]
    if s["below_090"]:
        parts.append(f"below 0.90: {len(s['below_090'])}")
    if s["no_ptsolve"]:
        parts.append(f"ptsolve absent on {len(s['no_ptsolve'])}")
    if s["no_peer"]:
        parts.append(f"no peer measured on {len(s['no_peer'])}")
    return "; ".join(parts)


def _verdict(s: dict[str, Any], geo_min: float, floor: float | None) -> str:
    """'met' / 'NOT met' / 'not measured' for a summary against a geomean and (optionally) a per-row floor."""
    if s["no_ptsolve"]:
        return "NOT met"  # ptsolve refused or failed a row: nothing to compare, and the user path fails there
    if not s["measured"]:
        return "not measured"
    ok = s["geomean"] >= geo_min and (floor is None or s["min"] >= floor)
    if not ok:
        return "NOT met"
    return "met" if not s["no_peer"] else f"met on the {s['measured']} rows measured ({len(s['no_peer'])} without)"


def criteria(rows: list[dict[str, Any]]) -> list[str]:
    """Issue 35's "Done when", each evaluated on this run or said not to be measured by it."""
    by = {w: [r for r in rows if r["workload"] == w] for w in WORKLOADS}
    att = summary(by["prefill"] + by["varlen"])
    var = summary(by["varlen"], "fa4")
    dec, gem = summary(by["decode"]), summary(by["gemm"], "cublas")
    pairs = [r["ptsolve_us"] / r["exact_us"] for r in rows if r.get("ptsolve_us") and r.get("exact_us")]
    g = geomean(pairs)
    nv = sum(r.get("nvcc_runs", 0) for r in rows)
    bad = [r["name"] for r in rows if r.get("ptsolve_us") and not r.get("ok")]
    gone = [r["name"] for r in rows if not r.get("ptsolve_us")]
    torch_path = ("not measured" if g is None else "met" if g <= 1.03 else "NOT met")
    return [
        f"- **Prefill and varlen** (fastest peer / ptsolve geomean >= 1.0, none below 0.90): "
        f"{_verdict(att, 1.0, 0.90)}. {_line('all', att)[2:]}",
        f"- **Varlen** (>= 1.0x FlashAttention-4 on every batch): {_verdict(var, 0.0, 1.0)}. {_line('fa4', var)[2:]}",
        f"- **Decode** (geomean >= 1.0, none below 0.90): {_verdict(dec, 1.0, 0.90)}. {_line('all', dec)[2:]}",
        f"- **GEMM** (cuBLAS / ptsolve geomean >= 1.0, none below 0.90): {_verdict(gem, 1.0, 0.90)}. "
        f"{_line('cublas', gem)[2:]}",
        f"- **The torch path within 3% of the exact-shape kernel** (geomean ptsolve / exact <= 1.03): {torch_path}"
        f"{'' if g is None else f' (geomean {g:.3f} over {len(pairs)} rows)'}.",
        f"- **Compiles**: {nv} nvcc runs during the calls of this run (the cubins were compiled ahead and carried). "
        "Compiling in the background on first use and never on a decode step are not measured by this study.",
        f"- **Correctness** (every row within FlashAttention's rule): {'met' if not bad and not gone else 'NOT met'} "
        f"({len(rows) - len(bad) - len(gone)} of {len(rows)} rows"
        f"{'; outside the rule: ' + ', '.join(bad) if bad else ''}"
        f"{'; ptsolve absent (refused or failed): ' + ', '.join(gone) if gone else ''}).",
        "- **Ranking** (model's first choice within 3% of the measured best on >= 90%): not measured by this study.",
        "- **Reference shapes on no list**: not measured here (this suite is public).",
    ]


def _provenance(res: dict[str, Any]) -> list[str]:
    fa4 = (f"flash-attn-4 {res.get('fa4_version') or '?'} (nvidia-cutlass-dsl {res.get('cutlass_dsl') or '?'})"
           if res.get("fa4_importable") else
           f"**absent from every row**: {res.get('fa4_why') or 'not importable'}")
    out = [f"- device: {res.get('device', '?')}; date: {res.get('date', '?')}; commit: {res.get('commit', '?')}",
           f"- command: `{res.get('command', '?')}`",
           f"- torch {res.get('torch', '?')}, cuDNN {res.get('cudnn', '?')}; FlashAttention-4: {fa4}",
           f"- TileLang: absent ({res.get('tilelang', 'not built')})",
           f"- wall time {res.get('wall_s', '?')} s over {len(res.get('rows', []))} rows"]
    if res.get("not_run"):
        out.append(f"- not run (the time budget ran out): {len(res['not_run'])} rows: {', '.join(res['not_run'])}")
    errs = [f"{r['name']} ({r['error']})" for r in res.get("rows", []) if r.get("error")]
    if errs:
        out.append(f"- rows that failed: {'; '.join(errs)}")
    return out


def _absences(rows: list[dict[str, Any]]) -> list[str]:
    """Why candidates were absent, grouped by reason (the reasons as the run recorded them)."""
    seen: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        for k, why in (r.get("absent") or {}).items():
            seen.setdefault((k, why), []).append(r["name"])
    return [f"- `{k}` absent on {len(ns)} rows: {why}" + (f" ({', '.join(ns)})" if len(ns) <= 6 else "")
            for (k, why), ns in sorted(seen.items())]


def report(res: dict[str, Any]) -> str:
    """The whole markdown report of a run's JSON."""
    rows = res.get("rows", [])
    lines = ["# ptsolve.torch next to the peers (issue 35)", "", *_provenance(res), "",
             "Times are medians in µs (CUDA graphs, interleaved rounds, inputs rotating past the L2); a ratio > 1 "
             "means ptsolve is faster; an absent candidate is '—' and is left out of every figure.", "",
             "## Done when", "", *criteria(rows), "", "## Per workload", ""]
    for w in WORKLOADS:
        rs = [r for r in rows if r["workload"] == w]
        if not rs:
            continue
        lines.append(_line(f"**{w}**, fastest peer / ptsolve", summary(rs)))
        for p in PEER_KEYS:
            s = summary(rs, p)
            if s["measured"]:
                lines.append("  " + _line(f"{p} / ptsolve", s))
        dims = sorted({r["shape"]["head_dim"] for r in rs if "head_dim" in r["shape"]})
        for d in dims if len(dims) > 1 else ():  # FlashAttention's head dims apart (issue 36's speed criterion)
            lines.append("  " + _line(f"head_dim {d}, fastest peer / ptsolve",
                                      summary([r for r in rs if r["shape"].get("head_dim") == d])))
        ex = [r["exact_us"] / r["ptsolve_us"] for r in rs if r.get("exact_us") and r.get("ptsolve_us")]
        if ex:
            lines.append(f"  - exact / ptsolve: geomean {geomean(ex):.3f}, min {min(ex):.3f} over {len(ex)} rows")
        for who, what in (("ptsolve", "ptsolve's first call on a new shape"),
                          ("fa4", "FlashAttention-4's first call (its JIT compile where the shape needs a new one)")):
            first = [r["first_call_s"][who] for r in rs
                     if (r.get("first_call_s") or {}).get(who) and who not in (r.get("absent") or {})]
            if first:
                lines.append(f"  - {what}: median {sorted(first)[len(first) // 2]:.3f} s, max {max(first):.3f} s")
    lines += ["", "## Absent candidates", "", *(_absences(rows) or ["- none"]), "", "## Rows", "", *table(rows), ""]
    return "\n".join(lines)


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Runs of parts of the suite (e.g. two device calls, ``--only prefill`` and the rest) as one: the first run's
    provenance, every row once (a later run's row replaces an earlier one of the same name), the wall times added,
    ``not_run`` what no part measured."""
    out = dict(parts[0])
    rows: dict[str, dict[str, Any]] = {}
    for p in parts:
        rows.update({r["name"]: r for r in p.get("rows", [])})
    out["rows"] = list(rows.values())
    out["not_run"] = sorted({n for p in parts for n in p.get("not_run", [])} - set(rows))
    out["wall_s"] = round(sum(p.get("wall_s", 0) for p in parts), 1)
    if len(parts) > 1:
        out["command"] = " ; ".join(dict.fromkeys(p.get("command", "?") for p in parts))
        out["date"] = " / ".join(dict.fromkeys(p.get("date", "?") for p in parts))
    return out


def main(argv: list[str] | None = None) -> int:
    import json
    ap = argparse.ArgumentParser(prog="python -m bench peers report", description=__doc__.split("\n\n")[0])
    ap.add_argument("json", type=Path, nargs="+", help="a run's JSON, or several runs' to merge")
    ap.add_argument("--out", type=Path, help="write the markdown here (default: print it)")
    ap.add_argument("--json-out", type=Path, help="write the (merged) JSON here")
    a = ap.parse_args(argv)
    res = merge([json.loads(p.read_text()) for p in a.json])
    if a.json_out:
        a.json_out.write_text(json.dumps(res, indent=1, sort_keys=True))
    md = report(res)
    if a.out:
        a.out.write_text(md)
    else:
        print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
