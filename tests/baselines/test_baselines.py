"""CPU-only checks of the baseline suite's data: config counts, numbering and FLOP formulas.

Nothing here needs torch or a GPU (``baselines.configs`` and the pure helpers of ``baselines.timing``
import without torch); the GPU side is exercised by ``python3 baselines/run_gpu.py`` on the GPU machine.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# baselines/ is not part of the installed package: import it from the checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from baselines import configs  # noqa: E402
from baselines.timing import _quantile, tflops  # noqa: E402


def test_twenty_fa_configs_each_way() -> None:
    assert len(configs.FA_CONFIGS) == 20
    assert len(configs.FA_CAUSAL_CONFIGS) == 20
    assert [c["name"] for c in configs.FA_CONFIGS] == [f"FA{i}" for i in range(20)]
    assert [c["name"] for c in configs.FA_CAUSAL_CONFIGS] == [f"FA{i}c" for i in range(20)]
    assert not any(c["causal"] for c in configs.FA_CONFIGS)
    assert all(c["causal"] for c in configs.FA_CAUSAL_CONFIGS)


def test_fa_numbering() -> None:
    # i = 10 * model + 5 * bs + seq
    fa7 = configs.by_name("FA7")
    assert (fa7["model"], fa7["heads"], fa7["kv_heads"], fa7["batch"], fa7["seq"]) == ("llama3-8b", 32, 8, 64, 2048)
    fa13 = configs.by_name("FA13c")
    assert (fa13["model"], fa13["heads"], fa13["batch"], fa13["seq"], fa13["causal"]) == (
        "llama3-70b",
        64,
        1,
        4096,
        True,
    )
    assert all(c["head_dim"] == 128 for c in configs.FA_CONFIGS)
    shapes = {(c["heads"], c["batch"], c["seq"]) for c in configs.FA_CONFIGS}
    assert len(shapes) == 20  # all distinct


def test_other_families() -> None:
    assert [(c["m"], c["n"], c["k"]) for c in configs.GEMM_CONFIGS] == [
        (4096, 1024, 4096),
        (8192, 14336, 4096),
        (8192, 8192, 28672),
        (8192, 8192, 8192),
    ]
    for fam in (configs.CHUNK_SCAN_CONFIGS, configs.CHUNK_STATE_CONFIGS):
        assert len(fam) == 10
        assert {(c["batch"], c["seq"]) for c in fam} == {
            (b, s) for b in (1, 64) for s in (1024, 2048, 4096, 8192, 16384)
        }
        assert all(
            (c["heads"], c["head_dim"], c["d_state"], c["chunk"], c["ngroups"]) == (64, 64, 128, 256, 1) for c in fam
        )
    names = [c["name"] for c in configs.all_configs()]
    assert len(names) == len(set(names)) == 64


def test_attention_flops_by_hand() -> None:
    # FA0: 4 * 1 * 32 * 512 * 512 * 128
    assert configs.by_name("FA0")["flops"] == 4_294_967_296
    # causal: 4 * 1 * 32 * 128 * (512 * 513 / 2) = 16384 * 131328
    assert configs.by_name("FA0c")["flops"] == 2_151_677_952
    # causal is a little over half of non-causal: (S + 1) / (2 S)
    fa19, fa19c = configs.by_name("FA19"), configs.by_name("FA19c")
    assert fa19["flops"] == 4 * 64 * 64 * 8192 * 8192 * 128
    assert fa19c["flops"] / fa19["flops"] == pytest.approx(8193 / (2 * 8192))


def test_gemm_flops_by_hand() -> None:
    assert configs.by_name("GEMM3")["flops"] == 1_099_511_627_776  # 2 * 8192^3
    assert configs.by_name("GEMM0")["flops"] == 2 * 4096 * 1024 * 4096


def test_mamba_flops_by_hand() -> None:
    # B=1, S=1024: 4 chunks of Q=256; P=64, N=128, H=64.
    # ChunkScan per (chunk, head): P*Q*(Q+1) + 2*Q*N*P = 4_210_688 + 4_194_304 = 8_404_992
    assert configs.by_name("CS0")["flops"] == 4 * 64 * 8_404_992 == 2_151_677_952
    # ChunkState per (chunk, head): 2*Q*N*P = 4_194_304
    assert configs.by_name("ST0")["flops"] == 4 * 64 * 4_194_304 == 1_073_741_824
    # B=64, S=16384: 64 chunks
    assert configs.by_name("ST9")["flops"] == 64 * 64 * 64 * 4_194_304
    # a seq that is not a multiple of the chunk rounds the chunk count up
    from ptsolve.ops import mamba2_chunk_state
    assert mamba2_chunk_state(1, 300, 64, 64, 128, 256).useful_flops == 2 * 64 * 4_194_304


def test_timing_helpers() -> None:
    assert tflops(1_000_000_000_000, 1.0) == pytest.approx(1000.0)  # 1e12 FLOP in 1 ms = 1000 TFLOP/s
    xs = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert _quantile(xs, 0.0) == 1.0
    assert _quantile(xs, 0.5) == 3.0
    assert _quantile(xs, 0.2) == pytest.approx(1.8)
    assert _quantile([7.0], 0.8) == 7.0
