"""Attention's softcap and sliding window as properties of the operator's graph (issue "FlashAttention's interface"):
FlashAttention-3's normalisation, the key band each query block visits against a brute-force mask, the cost of a
softcap, and graphs without the features unchanged."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ptsolve import ops
from ptsolve.errors import ShapeError
from ptsolve.ops.attention import features, kept_pairs, trip_counts


def _keeps(p: dict, i: int, j: int) -> bool:
    off = p["seq_kv"] - p["seq_q"]
    left, right = p.get("window_left", -1), p.get("window_right", -1)
    return ((not p["causal"] or j <= i + off) and (right < 0 or j <= i + off + right)
            and (left < 0 or j >= i + off - left))


@settings(max_examples=60, deadline=None)
@given(sq=st.integers(1, 300), skv=st.integers(1, 300), causal=st.booleans(), left=st.integers(-1, 320),
       right=st.integers(-1, 320), bm=st.sampled_from([64, 128, 192]), bn=st.sampled_from([64, 128, 176]))
def test_the_band_is_the_masks(sq, skv, causal, left, right, bm, bn):
    """kept_pairs counts the mask's pairs; each query block visits a run of key blocks that holds every key its rows
    see, and starts and ends on a block holding one."""
    if causal and sq > skv:
        return
    p = ops.make("flash_attention", batch=1, heads=1, seq_q=sq, seq_kv=skv, causal=causal, window_left=left,
                 window_right=right).params
    keep = [[_keeps(p, i, j) for j in range(skv)] for i in range(sq)]
    assert kept_pairs(p) == sum(map(sum, keep))
    for b, n in enumerate(trip_counts(p, bm, bn)):
        rows = range(b * bm, min(sq, (b + 1) * bm))
        blocks = sorted({j // bn for i in rows for j in range(skv) if keep[i][j]})
        assert n == (blocks[-1] - blocks[0] + 1 if blocks else 0)


def test_fa3s_normalisation():
    p = {"seq_q": 100, "seq_kv": 300, "causal": False}
    assert features(p) == {}
    assert features(p, window_left=299, window_right=99) == {}  # covers every key: no window
    assert features(p, window_left=298) == {"window_left": 298, "window_right": -1}
    assert features(p | {"causal": True}, window_left=10, window_right=7) == {"window_left": 10, "window_right": -1}
    assert features(p | {"causal": True}, window_right=0) == {}  # causal is a right window of 0
    assert features(p, softcap=30) == {"softcap": 30.0}


@pytest.mark.parametrize("kw,what", [({"softcap": -1.0}, "softcap=-1.0"), ({"softcap": float("inf")}, "softcap=inf"),
                                     ({"softcap": True}, "softcap=True"), ({"window_left": -2}, "window_left=-2"),
                                     ({"window_right": 1.5}, "window_right=1.5")])
def test_bad_features_name_the_value(kw, what):
    with pytest.raises(ShapeError, match=what):
        ops.make("flash_attention", batch=1, heads=2, seq=64, **kw)


def test_a_softcap_costs_rowmax_a_tanh_and_the_plain_graph_is_unchanged():
    t = {"BM": 128, "BN": 128, "depth": 2, "groups": 2}
    plain = ops.make("flash_attention", batch=1, heads=8, seq=2048)
    idle = ops.make("flash_attention", batch=1, heads=8, seq=2048, softcap=0.0, window_left=-1, window_right=-1)
    assert idle.to_json() == plain.to_json() and idle.graph(t).to_json() == plain.graph(t).to_json()
    capped = ops.make("flash_attention", batch=1, heads=8, seq=2048, softcap=30.0)
    a = {x.name: x for x in plain.graph(t).tasks}
    b = {x.name: x for x in capped.graph(t).tasks}
    assert a["rowmax@0"].sfu == 0 and b["rowmax@0"].sfu == 64 * 128 and b["exp2@0"].sfu == a["exp2@0"].sfu
    local = ops.make("flash_attention", batch=1, heads=8, seq=2048, causal=True, window_left=256)
    assert max(local.graph(t).row) == 3 and local.graph(t).useful_flops < ops.make(
        "flash_attention", batch=1, heads=8, seq=2048, causal=True).graph(t).useful_flops
