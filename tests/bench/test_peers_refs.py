"""The peers run's references (bench study ``peers``, ``run.attention_refs`` / ``varlen_refs`` / ``gemm_refs``)
against the harness's float32 attention, on the CPU where torch is installed (skipped where it is not): chunked by
heads, bottom-right causal, packed sequences."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from bench.decode import decode_bench  # noqa: E402
from bench.peers import run  # noqa: E402
from codegen.harness import attention_ref  # noqa: E402


@pytest.mark.parametrize("sq,skv,causal", [(5, 9, True), (9, 9, False), (7, 7, True)])
def test_attention_refs_match_the_harness_reference_in_chunks(monkeypatch, sq, skv, causal):
    monkeypatch.setattr(decode_bench, "REF_CHUNK", sq * skv * 2)  # two heads a chunk: four chunks of eight heads
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, sq, 8, 64, generator=g).half()
    k, v = (torch.randn(2, skv, 2, 64, generator=g).half() for _ in range(2))
    hi, lo = run.attention_refs(q, k, v, causal)
    want = attention_ref(q, k, v, causal)
    assert hi.dtype == torch.float32 and lo.dtype == torch.float16
    assert float((hi - want).abs().max()) < 1e-5
    assert 0 < run.max_err(lo, hi) < 2e-2  # the fp16 computation: close, not equal


def test_varlen_refs_are_the_dense_reference_per_sequence():
    g = torch.Generator().manual_seed(1)
    lq, lk = [3, 1, 6], [4, 1, 9]
    cq, ck = run.cumulative(lq), run.cumulative(lk)
    q = torch.randn(cq[-1], 4, 64, generator=g).half()
    k, v = (torch.randn(ck[-1], 2, 64, generator=g).half() for _ in range(2))
    hi, _ = run.varlen_refs(q, k, v, cq, ck, True)
    for b in range(3):
        want = attention_ref(q[None, cq[b]:cq[b + 1]], k[None, ck[b]:ck[b + 1]], v[None, ck[b]:ck[b + 1]], True)[0]
        assert float((hi[cq[b]:cq[b + 1]] - want).abs().max()) < 1e-5


def test_gemm_refs_and_max_err():
    g = torch.Generator().manual_seed(2)
    a, w = torch.randn(5, 16, generator=g).half(), torch.randn(7, 16, generator=g).half()
    hi, lo = run.gemm_refs(a, w)
    assert hi.shape == (5, 7) and float((hi - a.double().mm(w.double().t()).float()).abs().max()) < 1e-4
    assert run.max_err(lo, hi) < 0.05
    assert run.max_err(torch.full((5, 7), float("nan")), hi) == float("inf")
    assert run.max_err(torch.zeros(5, 6), hi) == float("inf")
