"""Fit of ``follow_cycles`` (flash_decode's op constant in ptsolve/hw/h200.calibrated.json): the tail the merge CTAs
of a split-KV launch add when they queue behind its pieces (ptsolve.program.follow_tail). For each candidate value,
how often the re-timed class programs (ptsolve.serve, the shipped one- and two-CTA binaries) order two measured
launches of one shape as the H200 did (a difference under 2% counts as agreement):
- ``device_kv/mha_ctas.json`` (13:29Z): every piece count up to 16 of both binaries on 7 MHA / GQA shapes: the
  model's pick among them against the measured best;
- ``device_ctas2`` (14:13Z) against ``device`` (14:17Z): 21 shapes on the two-CTA binary at its pieces and on the
  one-CTA binary at its own (two processes);
- ``device_pick/pick_ab.json``: the launches before and after this model change, side by side in one process.

    python -m bench torch_decode follow_fit
"""
from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[2] / "results/torch_decode"  # the study's data
sys.path.insert(0, str(HERE.parents[1]))

from ptsolve import serve  # noqa: E402
from ptsolve.hw import Hardware  # noqa: E402
from ptsolve.hw import load as load_hw  # noqa: E402

GRID = (0, 3000, 6000, 9000, 12000, 16000)
MHA = {"gpt2_b1_k1024": (12, 12, 1, 1024), "gpt2_b16_k1024": (12, 12, 16, 1024), "gpt2_b64_k1024": (12, 12, 64, 1024),
       "gpt2_b16_k8192": (12, 12, 16, 8192), "gpt2_b64_k2047": (12, 12, 64, 2047),
       "qwen2.5-0.5b_b16_k4097": (14, 2, 16, 4097), "qwen2.5-0.5b_b1_k32768": (14, 2, 1, 32768)}


def predict(key: str, p: dict[str, Any], s: int, hw: Hardware, bucket: bool = True) -> float:
    """Predicted µs of class ``key``'s binary at ``s`` pieces on shape ``p``, as ptsolve.serve re-times it (at the
    cache length's bucket, unless ``bucket`` is false)."""
    c = next(c for c in serve.classes() if c.key == key)
    q = dict(p, dtype="fp16")
    return serve.decode_retime(c, serve.decode_bucketed(c, q) if bucket else q, s, hw)


def agree(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Do predictions ``b`` order two launches as measurements ``a`` do (or are the measurements within 2%)?"""
    return (a[0] < a[1]) == (b[0] < b[1]) or abs(math.log(a[0] / a[1])) < 0.02


def score(hw: Hardware) -> tuple[float, int, int, int, int]:
    """(mha_ctas: geomean of best / picked, pairs agreeing, pairs, A/B agreeing, A/B pairs)."""
    mha = json.loads((HERE / "device_kv" / "mha_ctas.json").read_text())["shapes"]
    keys = {"shipped": "flash_decode/fp16/d64/full/wg1", "ctas2_d3": "flash_decode/fp16/d64/full/wg1/ctas2"}
    q = []
    for n, (H, Hkv, B, S) in MHA.items():
        p = {"batch": B, "heads": H, "kv_heads": Hkv, "seq_q": 1, "seq_kv": S, "head_dim": 64, "causal": False}
        u = {k: v for k, v in mha[n]["us"].items() if k.split("/")[0] in keys}
        pr = {k: predict(keys[k.split("/")[0]], p, int(k.split("/s")[1]), hw, bucket=False) for k in u}
        q.append(min(u.values()) / u[min(pr, key=lambda k: (pr[k], int(k.split("/s")[1])))])
    two = json.loads((HERE / "device_ctas2" / "torch_decode.json").read_text())["shapes"]
    one = json.loads((HERE / "device" / "torch_decode.json").read_text())["shapes"]
    pairs = [(x["params"], (x["binary"], x["splits"], x["us"]["pt.flash_attention"]),
              (x["binary"].replace("/ctas2", ""), one[n]["splits"], one[n]["us"]["pt.flash_attention"]))
             for n, x in sorted(two.items()) if "ctas2" in x["binary"]]
    ok = sum(agree((a[2], b[2]), (predict(a[0], p, a[1], hw), predict(b[0], p, b[1], hw))) for p, a, b in pairs)
    ab = json.loads((HERE / "device_pick" / "pick_ab.json").read_text())["shapes"]
    ab_ok = sum(agree((x["us"]["old"], x["us"]["new"]), (predict(*x["old"][:1], x["params"], x["old"][1], hw),
                                                         predict(*x["new"][:1], x["params"], x["new"][1], hw)))
                for x in ab.values())
    return math.exp(sum(map(math.log, q)) / len(q)), ok, len(pairs), ab_ok, len(ab)


def main() -> None:
    base = load_hw(serve.HW)
    print("| follow_cycles | mha_ctas: best / picked (geomean) | two-run pairs ordered right "
          "| A/B pairs ordered right |")
    print("|---|---|---|---|")
    for x in GRID:
        oc = dict(base.op_constants)
        oc["flash_decode"] = dict(oc.get("flash_decode", {}), follow_cycles=x)
        g, ok, n, ab_ok, ab_n = score(dataclasses.replace(base, op_constants=oc))
        print(f"| {x} | {g:.3f} | {ok} / {n} | {ab_ok} / {ab_n} |")


if __name__ == "__main__":
    main()
