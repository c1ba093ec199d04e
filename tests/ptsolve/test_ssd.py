"""ptsolve.ssd on the CPU: the float64 reference against a token-by-token recurrence, the steps that run in PyTorch
(chunk cumsum, seq_idx's masks, state passing, CB, the D / z epilogue) against it through the whole forward with
PyTorch stand-ins for the two chunk kernels (ssd_torch), and the argument checks. The kernels themselves:
tests/gpu/test_ssd_gpu.py."""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import ssd_torch as kt  # noqa: E402  (tests/ptsolve, on the path: tests/conftest.py)
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from strategies import examples  # noqa: E402

from ptsolve import ssd  # noqa: E402
from ptsolve.errors import DeviceError, PtsolveError, ShapeError  # noqa: E402

KERNELS = ssd.Kernels(kt.chunk_state, kt.chunk_scan)  # float64 formulas: the forward's own steps are what is tested
ARGS = ("D", "z", "dt_bias", "initial_states", "seq_idx", "dt_softplus")


def _split(a: dict) -> tuple[list, dict]:
    return [a[k] for k in ("x", "dt", "A", "B", "C")], {k: a[k] for k in ARGS if k in a}


def _close(got: torch.Tensor, want: torch.Tensor, tol: float = 1e-9) -> None:
    err = (got.double() - want.double()).abs().max().item() if want.numel() else 0.0
    scale = max(1.0, want.double().abs().max().item() if want.numel() else 0.0)
    assert err <= tol * scale, f"max abs err {err:.3g} (scale {scale:.3g})"


CASES = [  # b, L, h, p, n, g, D, z, init, seqs
    (1, 7, 2, 3, 4, 1, "", False, False, 0),
    (2, 13, 4, 2, 3, 2, "h", True, True, 0),
    (2, 16, 2, 4, 2, 1, "hp", False, True, 3),
    (3, 11, 4, 2, 2, 4, "hp", True, False, 4),
    (1, 1, 2, 2, 2, 1, "h", True, True, 0),
]


@pytest.mark.parametrize("case", CASES)
def test_reference_is_the_recurrence(case):
    b, L, h, p, n, g, D, z, init, seqs = case
    a = kt.inputs(b, L, h, p, n, g, torch.float64, D=D, z=z, init=init, seqs=seqs, seed=L)
    pos, kw = _split(a)
    out, fin = ssd.ssd_reference(*pos, 4, return_final_states=True, **kw)
    y, hT = kt.recurrence(*pos, **kw)
    assert out.dtype == fin.dtype == torch.float32
    _close(out, y, 1e-6)
    _close(fin, hT, 1e-6)


def test_reference_without_final_states_returns_out_only():
    a = kt.inputs(1, 5, 2, 2, 2, seed=1)
    pos, kw = _split(a)
    out = ssd.ssd_reference(*pos, 4, **kw)
    assert isinstance(out, torch.Tensor) and out.shape == (1, 5, 2, 2)


@settings(max_examples=examples(25), deadline=None)
@given(b=st.integers(1, 2), L=st.integers(1, 20), h=st.sampled_from([1, 2, 4]), g=st.sampled_from([1, 2]),
       chunk=st.sampled_from([1, 3, 4, 8]), D=st.sampled_from(["", "h", "hp"]), z=st.booleans(),
       init=st.booleans(), seqs=st.integers(0, 4), softplus=st.booleans(), limit=st.booleans(),
       seed=st.integers(0, 1 << 20))
def test_forward_steps_match_the_reference(b, L, h, g, chunk, D, z, init, seqs, softplus, limit, seed):
    """The chunked forward (cumsum, seq_idx masks, state passing, CB, epilogue; the kernels' formulas in float64)
    equals the quadratic reference, ragged lengths and packed sequences included."""
    g = min(g, h)
    a = kt.inputs(b, L, h, 2, 3, g, torch.float64, D=D, z=z, init=init, seqs=min(seqs, L), seed=seed)
    pos, kw = _split(a)
    kw["dt_softplus"] = softplus
    dt_limit = (0.01, 0.5) if limit else (0.0, math.inf)
    out, fin = ssd.ssd_forward(*pos, chunk, KERNELS, dt_limit=dt_limit, **kw)
    rout, rfin = ssd.ssd_reference(*pos, chunk, return_final_states=True, dt_limit=dt_limit, **kw)
    _close(out, rout, 1e-6)
    _close(fin, rfin, 1e-6)


def test_chunk_cumsum_is_mamba_ssms():
    """dt + bias, softplus (identity above 20), the clamp (a negative dt becomes 0 under (0, inf)), 0 past L; dA's
    running sum restarts every chunk."""
    dt = torch.tensor([[[-1.0], [0.5], [25.0], [-30.0], [2.0]]])  # (b=1, L=5, h=1)
    A = torch.tensor([-2.0])
    d, dA = ssd.chunk_cumsum(dt, A, 2, dt_bias=torch.tensor([0.5]), dt_softplus=True, dt_limit=(0.0, 10.0))
    want = [math.log1p(math.exp(-0.5)), math.log1p(math.exp(1.0)), 10.0, math.log1p(math.exp(-29.5)),
            math.log1p(math.exp(2.5)), 0.0]
    assert d.shape == dA.shape == (1, 1, 3, 2) and d.dtype == torch.float32
    _close(d.flatten(), torch.tensor(want), 1e-6)
    w = torch.tensor(want).view(3, 2) * -2.0
    _close(dA.flatten(), torch.cumsum(w, dim=1).flatten(), 1e-6)
    d2, _ = ssd.chunk_cumsum(torch.tensor([[[-1.0]]]), A, 1)
    assert d2.item() == 0.0  # the default clamp


def test_state_passing_is_the_sequential_recurrence():
    """s_c = keep_c·exp(dA_c[−1])·s_{c−1} + states_c, in place in float32; entering states shifted by one."""
    gen = torch.Generator().manual_seed(3)
    b, nc, h, p, n = 2, 5, 3, 2, 2
    states = torch.randn(b, nc, h, p, n, generator=gen)
    dA = -torch.rand(b, h, nc, 4, generator=gen).cumsum(-1)
    init = torch.randn(b, h, p, n, generator=gen)
    keep = torch.rand(b, nc, generator=gen) > 0.3
    want, s = [], init.clone()
    for c in range(nc):
        want.append(s.clone())
        s = keep[:, c, None, None, None] * torch.exp(dA[:, :, c, -1])[..., None, None] * s + states[:, c]
    entering, final = ssd.state_passing(states.clone(), dA, init, keep, torch.float16)
    assert entering.dtype == torch.float16 and final.dtype == torch.float32
    _close(entering.float(), torch.stack(want, 1), 1e-3)
    _close(final, s, 1e-6)
    entering, _ = ssd.state_passing(states.clone(), dA)
    assert entering[:, 0].abs().max() == 0  # no initial states: the first chunk enters from 0


def test_chunk_bmm_in_the_input_dtype():
    gen = torch.Generator().manual_seed(4)
    C, B = torch.randn(2, 7, 2, 8, generator=gen).half(), torch.randn(2, 7, 2, 8, generator=gen).half()
    cb = ssd.chunk_bmm(C.float(), B.float(), 4)
    assert cb.shape == (2, 2, 2, 4, 4)
    want = torch.einsum("bmgn,bkgn->bgmk", C[:, 4:].float(), B[:, 4:].float())
    _close(cb[:, 1, :, :3, :3], want, 1e-6)
    assert cb[:, 1, :, 3].abs().max() == 0 and cb[:, 1, :, :, 3].abs().max() == 0  # past L


def test_chunk_bmm_gives_float32_cb_for_bf16():
    """bf16 C and B give CB in float32 (the products exact, float32 sums: one rounding, ChunkScan's P); fp16 ones in
    fp16 (``geometry.mamba2.DEFAULT_CB_DTYPE``); ``out_dtype`` picks either, and nothing else."""
    gen = torch.Generator().manual_seed(5)
    C, B = (torch.randn(2, 300, 2, 64, generator=gen).bfloat16() for _ in range(2))
    want = torch.einsum("bcmgn,bckgn->bcgmk", *(torch.nn.functional.pad(t.double(), (0, 0, 0, 0, 0, 84))
                                               .view(2, 3, 128, 2, 64) for t in (C, B)))
    cb = ssd.chunk_bmm(C, B, 128)
    assert cb.dtype == torch.float32 and cb.shape == (2, 3, 2, 128, 128)
    err32 = (cb.double() - want).abs().max().item()
    err16 = (ssd.chunk_bmm(C, B, 128, out_dtype=torch.bfloat16).double() - want).abs().max().item()
    assert err32 <= 64 * 2.0 ** -24 * want.abs().max().item() and err32 < err16 / 100, (err32, err16)
    assert ssd.chunk_bmm(C.half(), B.half(), 128).dtype == torch.float16
    assert ssd.chunk_bmm(C.half(), B.half(), 128, out_dtype=torch.float32).dtype == torch.float32
    assert ssd.cb_dtype(torch.bfloat16) == torch.float32 and ssd.cb_dtype(torch.float64) == torch.float64
    keep = torch.zeros(2, 3, 1, 128, 128, dtype=torch.bool)
    assert ssd.chunk_bmm(C, B, 128, keep).abs().max() == 0
    with pytest.raises(ShapeError, match="out_dtype=torch.float16"):
        ssd.chunk_bmm(C, B, 128, out_dtype=torch.float16)


def test_seq_masks_follow_mamba_ssms_kernels():
    seq = torch.tensor([[0, 0, 0, 1, 1, 1, 2]])  # chunks of 3: [0 0 0] [1 1 1] [2]
    m = ssd.seq_masks(seq, 3)
    assert m.pass_keep.tolist() == [[True, False, False]]
    assert m.c_keep.flatten().tolist() == [True, True, True, False, False, False, False]
    m = ssd.seq_masks(torch.tensor([[0, 1, 1, 1, 1, 2]]), 4)  # [0 1 1 1] [1 2]
    assert m.state_keep.flatten().tolist() == [False, True, True, True, False, True, False, False]
    assert m.c_keep.flatten().tolist() == [True, False, False, False, True, False]
    assert m.cb_keep[0, 0, 0].int().tolist() == [[1, 0, 0, 0], [0, 1, 1, 1], [0, 1, 1, 1], [0, 1, 1, 1]]


def test_skip_gate():
    gen = torch.Generator().manual_seed(5)
    out, x, z = (torch.randn(2, 3, 4, 5, generator=gen) for _ in range(3))
    Dh, Dhp = torch.randn(4, generator=gen), torch.randn(4, 5, generator=gen)
    _close(ssd.skip_gate(out, x, Dh, None), out + x * Dh[:, None], 1e-6)
    _close(ssd.skip_gate(out, x, Dhp, z), (out + x * Dhp) * z * torch.sigmoid(z), 1e-6)
    assert ssd.skip_gate(out, x, None, None) is out


# ----------------------------------------------------------------------------------------- the errors

def _gpu_args(**over):
    a = kt.inputs(1, 8, 2, 64, 128, dtype=torch.float16)
    a.update(over)
    pos, kw = _split(a)
    return pos, kw


@pytest.mark.parametrize("over, match", [
    ({"dt": torch.zeros(1, 8, 3)}, "dt must be"),
    ({"A": torch.zeros(2, 1)}, "A must be"),
    ({"D": torch.zeros(3)}, "D must be"),
    ({"z": torch.zeros(1, 8, 2, 63)}, "z must be"),
    ({"initial_states": torch.zeros(1, 2, 64, 64)}, "initial_states must be"),
    ({"seq_idx": torch.zeros(1, 7, dtype=torch.int32)}, "seq_idx must be"),
    ({"seq_idx": torch.zeros(1, 8)}, "integer tensor"),
    ({"B": torch.zeros(1, 8, 2, 128, dtype=torch.bfloat16)}, "C must be|dtype"),
    ({"C": torch.zeros(1, 8, 1, 128, dtype=torch.bfloat16)}, "x's dtype"),
    ({"B": torch.zeros(1, 8, 3, 128, dtype=torch.float16)}, "multiple of ngroups"),
])
def test_bad_arguments_name_the_argument(over, match):
    pos, kw = _gpu_args(**over)
    with pytest.raises(ShapeError, match=match):
        ssd.mamba_chunk_scan_combined(*pos, 64, **kw)


def test_unsupported_features_say_what_to_do():
    pos, kw = _gpu_args()
    with pytest.raises(ShapeError, match="return_varlen_states.*mamba_ssm"):
        ssd.mamba_chunk_scan_combined(*pos, 64, cu_seqlens=torch.tensor([0, 8]), return_varlen_states=True, **kw)
    with pytest.raises(ShapeError, match="state_dtype"):
        ssd.mamba_chunk_scan_combined(*pos, 64, state_dtype=torch.float32, **kw)
    with pytest.raises(ShapeError, match="dt_limit"):
        ssd.mamba_chunk_scan_combined(*pos, 64, dt_limit=(1.0, 0.5), **kw)
    with pytest.raises(ShapeError, match="chunk_size"):
        ssd.mamba_chunk_scan_combined(*pos, 0, **kw)
    with pytest.raises(ShapeError, match="chunk=100"):
        ssd.mamba_chunk_scan_combined(*pos, 100, **kw)
    with pytest.raises(ShapeError, match="torch.float32"):
        ssd.mamba_chunk_scan_combined(*[t.float() for t in pos], 64, **kw)
    p2, kw2 = _gpu_args(x=torch.zeros(1, 8, 2, 32, dtype=torch.float16))
    with pytest.raises(ShapeError, match="head_dim=32"):
        ssd.mamba_chunk_scan_combined(*p2, 64, **kw2)
    h96 = torch.zeros(1, 8, 1, 96, dtype=torch.float16)
    p2, kw2 = _gpu_args(B=h96, C=h96)
    with pytest.raises(ShapeError, match="d_state=96"):
        ssd.mamba_chunk_scan_combined(*p2, 64, **kw2)
    with pytest.raises(DeviceError, match="CUDA.*ssd_reference"):
        ssd.mamba_chunk_scan_combined(*pos, 64, **kw)  # CPU tensors: the kernels need a GPU
    assert issubclass(ShapeError, PtsolveError)


def test_registered_op_gives_the_shapes():
    """``torch.ops.ptsolve.mamba_chunk_scan_combined``'s fake implementation (what torch.compile traces with)."""
    def meta(*shape, dtype=torch.float16):
        return torch.empty(*shape, device="meta", dtype=dtype)

    out, fin = torch.ops.ptsolve.mamba_chunk_scan_combined(
        meta(2, 300, 8, 64), meta(2, 300, 8, dtype=torch.float32), meta(8, dtype=torch.float32), meta(2, 300, 2, 128),
        meta(2, 300, 2, 128), 256, None, meta(2, 300, 8, 64), None, None, None, True, 0.0, math.inf)
    assert out.shape == (2, 300, 8, 64) and out.dtype == torch.float16
    assert fin.shape == (2, 8, 64, 128) and fin.dtype == torch.float32
