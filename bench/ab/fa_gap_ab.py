"""Issue 8's last same-schedule gap, bisected from both ends: FA17c / FA8c (the two large causal GQA shapes) ran
2.9% / 4.9% slower through the one-lowering skeleton than through the old FlashAttention emitter, from the same
committed schedule (results/skeleton_h200.md). The two sources differ in a handful of places (helpers, producer and
loop structure are identical); each column moves one of them from the new kernel back to the old emitter's form
(``now_*``) or the other way (``old_*``), so the column that closes (or opens) the gap names its cause.

    python -m bench ab fa_gap_ab emit                          # CPU: now = main's skeleton, + the variants
    PTSOLVE_CACHE_DIR=$PWD/.cubin_gap python -m bench ab fa_gap_ab compile
    PTSOLVE_CACHE_DIR=$PWD/.cubin_gap python -m bench ab fa_gap_ab          # GPU

Columns: ``old`` (the old emitter, commit ae3a8a0; ``old_again`` the same kernel timed twice: the noise), ``now``
(main's skeleton from results/schedules_h200 through plan_from_program), ``now_mask``: the causal mask as the old
emitter wrote it (key and row per element), ``now_tail``: no release of the last V slot / prologue buffers after
the loop of a non-persistent tile (nothing refills them), ``now_w0``: without the ``wg_wait<0>`` that opens the
first iteration's exp2 and rowsum (the rowmax before them has waited already), ``now_allold``: these three, no
``__syncwarp`` before a lane-0 release and the old emitter's ``wg_wait<1>`` in the steady rescale together
(``now_sync_w1``: only the last two);
``old_mask``: the old kernel with the new mask.
"""
from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.ab import regress_ab as R  # noqa: E402

R.AB = ROOT / "results/ab/fa_gap_sources.json"
R.NAMES = ["FA17c_cpsat", "FA8c_cpsat"]
R.COLS = ["old", "old_again", "now", "now_mask", "now_tail", "now_w0", "now_sync_w1", "now_allold", "old_mask"]
R.RATIOS = [("now", "old"), ("now_sync_w1", "old"), ("now_allold", "old")]
R.ROUNDS = 60
R.__file__ = __file__  # the smoke test re-runs this script in a child process

NEW_MASK = re.compile(
    r"    const int k0 = kb \+ 2 \* \(lane & 3\), kl = SKVB - k0;\n"
    r"    const int kr = m0 \+ ROW0 \+ w \* 16 \+ \(lane >> 2\) \+ OFF - k0; \(void\)kr; \(void\)kl;\n"
    r"((?:#pragma unroll\n +for .*\n){3})"
    r"          const int dk = 8 \* j \+ c - 8 \* hh;.*\n"
    r"          if \(CAUSAL \? dk > kr : dk \+ 8 \* hh >= kl\) (sacc\d)\[4 \* j \+ 2 \* hh \+ c\] = -INFINITY;\n")
OLD_MASK_NEW = (r"\1          const int key = kb + 8 * j + 2 * (lane & 3) + c;\n"
                r"          const int row = m0 + ROW0 + w * 16 + (lane >> 2) + 8 * hh;\n"
                r"          if (key >= SKVB || (CAUSAL && key > row + OFF)) \2[4 * j + 2 * hh + c] = -INFINITY;\n")
OLD_MASK = re.compile(
    r"((?:#pragma unroll\n +for .*\n){3})"
    r"          const int key = kb \+ 8 \* j \+ 2 \* \(lane & 3\) \+ c;\n"
    r"          const int row = m0 \+ ROW0 \+ w \* 16 \+ \(lane >> 2\) \+ 8 \* hh;\n"
    r"          if \(key >= SKV \|\| \(CAUSAL && key > row \+ OFF\)\) "
    r"(sacc\d)\[4 \* j \+ 2 \* hh \+ c\] = -INFINITY;\n")
NEW_MASK_OLD = (r"    const int k0 = kb + 2 * (lane & 3), kl = SKV - k0;\n"
                r"    const int kr = m0 + ROW0 + w * 16 + (lane >> 2) + OFF - k0; (void)kr; (void)kl;\n\1"
                r"          const int dk = 8 * j + c - 8 * hh;\n"
                r"          if (CAUSAL ? dk > kr : dk + 8 * hh >= kl) \2[4 * j + 2 * hh + c] = -INFINITY;\n")
TAIL = re.compile(r"if \(T >= 1\) \{  // v of iteration T-1\n    __syncwarp\(\);\n    if \(lane == 0\) "
                  r"mbar_arrive\(&v_empty\[\(rbase \+ T - 1\) % \d\]\);\n\}\n")
W0 = re.compile(r"(\{  // (?:exp2|rowsum)@\d it=0\n\{ const int it_ = 0; const int q_ = rbase \+ it_; \(void\)q_;\n)"
                r"  wg_wait<0>\(\);\n")
WAIT1 = re.compile(r"(\{  // rescale@\d\n\{ const int it_ = j; const int q_ = rbase \+ it_; \(void\)q_;\n)")


def _sub(pat: re.Pattern, repl: str, src: str, at_least: int) -> str:
    out, n = pat.subn(repl, src)
    if n < at_least:
        raise SystemExit(f"{pat.pattern[:60]!r}: {n} replacements, expected at least {at_least}")
    return out


def emit() -> None:
    from codegen.cuda import emit as emit_source
    old = json.loads((ROOT / "results/ab/regress_sources.json").read_text())["old"]
    out = {}
    for n in R.NAMES:
        now = emit_source(R._plan(n), "h200")
        o = R.ks_of(old[n])
        s = now.source
        v = {"now_mask": _sub(NEW_MASK, OLD_MASK_NEW, s, 2),
             "now_tail": _sub(TAIL, "", s, 2) if "PERSISTENT = false" in s else None,
             "now_w0": _sub(W0, r"\1", s, 1)}
        allold = _sub(W0, r"\1", _sub(NEW_MASK, OLD_MASK_NEW, s, 2), 1)
        allold = _sub(TAIL, "", allold, 2).replace("__syncwarp();\n    if (lane == 0) mbar_arrive",
                                                   "if (lane == 0) mbar_arrive")
        v["now_allold"] = _sub(WAIT1, r"\1  wg_wait<1>();\n", allold, 2)
        nosync = s.replace("__syncwarp();\n    if (lane == 0) mbar_arrive", "if (lane == 0) mbar_arrive")
        v["now_sync_w1"] = _sub(WAIT1, r"\1  wg_wait<1>();\n", nosync, 2)
        row = {"old": old[n], "now": dataclasses.asdict(now)}
        row |= {k: dataclasses.asdict(dataclasses.replace(now, source=src)) for k, src in v.items() if src}
        row["old_mask"] = dataclasses.asdict(dataclasses.replace(o, source=_sub(OLD_MASK, NEW_MASK_OLD, o.source, 2)))
        out[n] = row
        print(n, sorted(row), flush=True)
    R.AB.write_text(json.dumps(out, indent=0, sort_keys=True))


if __name__ == "__main__":
    R.cli(emit)
