"""Measured selection for the paper's attention configurations, with the FA3 order in the candidates: ``ptsolve.tune``'s
candidates with two policies (``cpsat``: the free optimum; ``cpsat-orders``: the best schedule with the operator's
declared FA3 issue order pinned, OpSpec.orders) on the model's best tilings, timed on the GPU next to the committed
exact schedule (``results/sched_polish``) and the hand FA3-order plan (``codegen.harness.hand``), in one process
(``bench/ab/regress_ab.py``'s harness). ``select`` runs every candidate; ``confirm`` re-times the pick (chosen by
``select``'s run, written to ``picks.json``) against exact and hand in a second run, so the pick's margin is not
the selection's own noise.

    python -m bench fa_tune fa_tune emit                                            # CPU: candidates, sources
    PTSOLVE_CACHE_DIR=$PWD/.cubin_fat python -m bench fa_tune fa_tune compile       # CPU
    PTSOLVE_CACHE_DIR=$PWD/.cubin_fat python -m bench fa_tune fa_tune               # GPU: select
    python -m bench fa_tune fa_tune pick <select log>                               # CPU: picks.json
    FA_TUNE=confirm PTSOLVE_CACHE_DIR=... python -m bench fa_tune fa_tune           # GPU: confirm
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parents[2] / "results/fa_tune"  # the study's data
sys.path.insert(0, str(ROOT))

from bench.ab import regress_ab as R  # noqa: E402

CONFIGS = ("FA2", "FA3", "FA3c", "FA8", "FA8c", "FA13c", "FA14", "FA17c")
K = 4  # candidates per configuration
TIME_LIMIT = 30.0  # CP-SAT seconds per solve
CONFIRM = os.environ.get("FA_TUNE") == "confirm"
R.AB = HERE / "sources.json"
R.NAMES = list(CONFIGS)
R.COLS = ["exact", "pick", "hand", "exact_again"] if CONFIRM else ["exact", *(f"c{i}" for i in range(K)), "hand"]
R.RATIOS = [("pick", "exact"), ("pick", "hand"), ("exact", "hand"), ("exact_again", "exact")] if CONFIRM else \
    [("c0", "exact"), ("exact", "hand")]
R.__file__ = __file__


def emit() -> None:
    import ptsolve
    from codegen.cuda import emit as emit_source
    from codegen.harness import hand
    from codegen.plan import plan_from_program
    from ptsolve.result import Result
    from ptsolve.tune import candidates

    out, info = {}, {}
    for c in CONFIGS:
        exact = Result.from_json((ROOT / "results/sched_polish" / f"{c}_cpsat.json").read_text())
        g = exact.program.graph
        op = ptsolve.ops.make(g.op, **g.params)
        cands, rejected = candidates(op, "h200", K, solver="cpsat,cpsat-orders", time_limit=TIME_LIMIT,
                                     progress=lambda s, c=c: print(c, s, flush=True))
        row = {"exact": dataclasses.asdict(emit_source(plan_from_program(exact.program, "h200"), "h200")),
               "hand": dataclasses.asdict(emit_source(hand(g.op, dict(g.params)), "h200"))}
        for cd in cands:
            row[f"c{cd.rank}"] = dataclasses.asdict(emit_source(plan_from_program(cd.result.program, "h200"), "h200"))
        row["exact_again"] = row["exact"]
        out[c] = row
        info[c] = {"exact": {"tiling": exact.tiling, "predicted_us": exact.predicted_us},
                   "candidates": [{"rank": cd.rank, "policy": cd.result.program.policy, "status": cd.result.status,
                                   "tiling": cd.result.tiling, "predicted_us": cd.result.predicted_us,
                                   "program": cd.result.program.to_json(), "check": cd.check.status}
                                  for cd in cands],
                   "rejected": [[t, why] for t, why in rejected]}
        print(c, [(x["policy"], x["tiling"], round(x["predicted_us"], 1)) for x in info[c]["candidates"]], flush=True)
        R.AB.write_text(json.dumps(out, indent=0, sort_keys=True))
        (HERE / "candidates.json").write_text(json.dumps(info, indent=1, sort_keys=True))


def pick(log: Path) -> None:
    """picks.json: per configuration the candidate the select run timed fastest (the model's earlier on a tie),
    and the sources' ``pick`` column for the confirm run."""
    times: dict[str, dict[str, float]] = {}
    for line in log.read_text().splitlines():
        m = re.match(r"^(FA\w+)\s+(exact .*?)(\s+\w+/\w+ |\s+\[)", line)
        if m:
            times[m.group(1)] = {k: float(v) for k, v in re.findall(r"(\w+) ([\d.]+)", m.group(2))}
    src = json.loads(R.AB.read_text())
    picks = {}
    for c in CONFIGS:
        us = times[c]
        cands = sorted((k for k in us if re.fullmatch(r"c\d+", k)), key=lambda k: (us[k], int(k[1:])))
        best = cands[0]
        picks[c] = {"pick": best, "select_us": us}
        src[c]["pick"] = src[c][best]
    R.AB.write_text(json.dumps(src, indent=0, sort_keys=True))
    (HERE / "picks.json").write_text(json.dumps(picks, indent=1, sort_keys=True))
    print(json.dumps({c: (p["pick"], p["select_us"][p["pick"]]) for c, p in picks.items()}))


if __name__ == "__main__":
    if sys.argv[1:2] == ["pick"]:
        pick(Path(sys.argv[2]))
    else:
        R.cli(emit)
