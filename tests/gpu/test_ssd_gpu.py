"""``ptsolve.ssd.mamba_chunk_scan_combined`` on an H100/H200 (``pytest -m gpu tests/gpu/test_ssd_gpu.py``): the
whole SSD forward against the float64 reference (``ssd_reference``), with the error no larger than twice the same
computation's in PyTorch at the input precision (``ssd_forward`` with ssd_torch's kernels rounding their wgmma
operands to the input dtype) plus a floor of 1e-4 of the largest value; and against mamba_ssm's own
``mamba_chunk_scan_combined`` where it imports (``baselines.mamba2.load_combined``). Mamba2-130m…1.3b widths
(head_dim 64, d_state 128, chunk 256, heads 24–64), batch 1–4, ragged lengths, fp16 and bf16, with and without D,
z, initial states, seq_idx. The output's memory is NaN-filled before each call, so a position the kernels do not
write fails. bf16's chunk scan reads CB in float32 (rounded once, in P, as mamba_ssm's): its error against the float64
chunk scan vs that arithmetic, vs bf16 CB, and vs mamba_ssm's Triton chunk scan on the same inputs. The cubins:
``python3 -m ptsolve.serve precompile --only mamba2_`` with PTSOLVE_CACHE_DIR=.cubin_ssd on the CPU machine."""
from __future__ import annotations

import math
import os

import pytest

pytest.importorskip("torch")  # collected everywhere: ssd_torch needs torch
import ssd_torch as kt  # noqa: E402  (tests/ptsolve, on the path: tests/conftest.py)

pytestmark = pytest.mark.gpu  # the fixture torch: tests/conftest.py
_CACHE = os.environ.get("PTSOLVE_CACHE_DIR")  # before conftest gives every test its own


@pytest.fixture(autouse=True)
def _carried_cubins(monkeypatch: pytest.MonkeyPatch) -> None:
    """Use the cubins compiled on the CPU machine and carried along (PTSOLVE_CACHE_DIR=.cubin_ssd)."""
    if _CACHE:
        monkeypatch.setenv("PTSOLVE_CACHE_DIR", _CACHE)


FLOOR = 1e-4  # the rounding floor, relative to the reference's largest magnitude


def _poison(torch, shape, dtype) -> None:
    """Fill and free a block of the output's size, so the caching allocator hands it out NaN-filled."""
    x = torch.full(shape, float("nan"), dtype=dtype, device="cuda")
    del x


def _args(a: dict) -> tuple[list, dict]:
    return ([a[k] for k in ("x", "dt", "A", "B", "C")],
            {k: a[k] for k in ("D", "z", "dt_bias", "initial_states", "seq_idx", "dt_softplus") if k in a})


def _errs(torch, got, low, ref) -> tuple[float, float]:
    e = (got.float() - ref).abs().max().item()
    return e, (low.float() - ref).abs().max().item()


def _check(torch, case, chunk=256, n=128, g=1):
    """Run one case; return (out's error, the low-precision PyTorch forward's error, final states' errors)."""
    from ptsolve import ssd

    h, b, L, dt, D, z, init, seqs = case
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dt]
    a = kt.inputs(b, L, h, 64, n, g, dtype, device="cuda", seed=L + h, D=D, z=z, init=init, seqs=seqs)
    pos, kw = _args(a)
    _poison(torch, (b, L, h, 64), dtype)
    out, fin = ssd.mamba_chunk_scan_combined(*pos, chunk, return_final_states=True, **kw)
    assert out.shape == (b, L, h, 64) and out.dtype == dtype
    assert fin.shape == (b, h, 64, n) and fin.dtype == torch.float32
    ref, rfin = ssd.ssd_reference(*pos, chunk, return_final_states=True, **kw)
    low_kernels = ssd.Kernels(lambda *t: kt.chunk_state(*t, low=dtype), lambda *t: kt.chunk_scan(*t, low=dtype))
    low, lfin = ssd.ssd_forward(*pos, chunk, low_kernels, **kw)
    assert not torch.isnan(out).any(), "NaN in the output (a position not written?)"
    return (*_errs(torch, out, low, ref), *_errs(torch, fin, lfin, rfin), ref.abs().max().item(),
            rfin.abs().max().item())


CASES = [  # heads, batch, seq, dtype, D, z, initial states, packed sequences
    (24, 1, 777, "fp16", "", False, False, 0),    # Mamba2-130m, ragged
    (32, 2, 1000, "bf16", "h", True, False, 0),   # 370m
    (48, 3, 513, "fp16", "hp", True, True, 0),    # 780m: one position in the last chunk
    (64, 4, 1100, "bf16", "h", False, True, 3),   # 1.3b with seq_idx
    (64, 1, 2047, "fp16", "hp", True, True, 5),
    (24, 2, 512, "bf16", "", False, True, 2),     # whole chunks
    (32, 1, 1, "fp16", "h", True, True, 0),       # one position
    (48, 2, 17, "bf16", "hp", False, False, 2),
    (32, 2, 600, "fp16", "", True, False, 0),     # the z gate alone
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_combined_against_the_reference(torch, case):
    err, lerr, ferr, flerr, scale, fscale = _check(torch, case)
    floor, ffloor = FLOOR * scale, FLOOR * fscale
    assert err <= 2 * lerr + floor, f"out: max err {err:.3g} > 2 * {lerr:.3g} + {floor:.2g}"
    assert ferr <= 2 * flerr + ffloor, f"final states: max err {ferr:.3g} > 2 * {flerr:.3g} + {ffloor:.2g}"


@pytest.mark.parametrize("chunk, n", [(64, 64), (128, 128), (64, 128), (256, 64)])
def test_other_chunk_and_state_sizes(torch, chunk, n):
    err, lerr, ferr, flerr, scale, fscale = _check(torch, (8, 2, 300, "fp16", "h", True, True, 2), chunk=chunk, n=n,
                                                   g=2)
    assert err <= 2 * lerr + FLOOR * scale and ferr <= 2 * flerr + FLOOR * fscale, (err, lerr, ferr, flerr)


def test_strided_inputs_as_a_mamba2_layer_splits_them(torch):
    """x, B, C as views of one projection (Mamba2's xBC split), dt a view too: the same result as contiguous."""
    from ptsolve import ssd

    b, L, h, n = 2, 300, 24, 128
    xbc = torch.randn(b, L, h * 64 + 2 * n, device="cuda", dtype=torch.float16)
    x = xbc[..., : h * 64].view(b, L, h, 64)
    B, C = xbc[..., h * 64: h * 64 + n].view(b, L, 1, n), xbc[..., h * 64 + n:].view(b, L, 1, n)
    dt = torch.randn(b, L, h + 3, device="cuda")[..., :h]
    A = -torch.rand(h, device="cuda") - 1
    got = ssd.mamba_chunk_scan_combined(x, dt, A, B, C, 256, dt_softplus=True)
    want = ssd.mamba_chunk_scan_combined(x.contiguous(), dt.contiguous(), A, B.contiguous(), C.contiguous(), 256,
                                         dt_softplus=True)
    assert torch.equal(got, want)


@pytest.mark.parametrize("dt", ["fp16", "bf16"])
@pytest.mark.parametrize("ep", ["D", "Dp", "z", "Dz", "Dpz"])
def test_fused_epilogue_against_the_unfused_one(torch, ep, dt):
    """ChunkScan's variant with D and z in its store vs the plain kernel's output y with the same epilogue applied in
    float32 (g32 = (y + D·x)·silu(z), unrounded), element by element: the fused kernel starts from the float32
    accumulator that y is the rounding of, so |fused − g32| ≤ ½ ulp(y)·|silu(z)| + ½ ulp(fused) (y's rounding carried
    through the gate, then the fused store's one rounding), plus 1e-5 relative for __expf. A variant that drops,
    doubles or misplaces D or z on any element fails. (Against the float64 formula the two paths differ only by
    rounding luck in bf16, so a max-error comparison there cannot tell them apart.)"""
    from ptsolve import ssd

    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dt]
    b, L, h = 2, 700, 24
    a = kt.inputs(b, L, h, 64, 128, 1, dtype, device="cuda", seed=11, z="z" in ep,
                  D="hp" if "Dp" in ep else "h" if "D" in ep else "")
    x, B, C, D, z = a["x"], a["B"], a["C"], a.get("D"), a.get("z")
    dtc, dA = ssd.chunk_cumsum(a["dt"], a["A"], 256, a["dt_bias"], True)
    cb = ssd.chunk_bmm(C, B, 256)
    st = (torch.randn(b, dtc.shape[2], h, 64, 128, device="cuda") * 0.1).to(dtype)
    _poison(torch, x.shape, dtype)
    fused = ssd._chunk_scan_cuda(cb, x, dtc, dA, C, st, D, z).float()
    y = ssd._chunk_scan_cuda(cb, x, dtc, dA, C, st).float()
    assert not torch.isnan(fused).any()
    g32 = ssd.skip_gate(y, x, D, z)
    gate = torch.nn.functional.silu(z.float()).abs() if z is not None else 1.0
    eps = torch.finfo(dtype).eps

    def ulp(t):  # below the smallest normal the spacing stays tiny·eps (fp16's subnormals: 2^-24)
        return eps * torch.exp2(torch.floor(torch.log2(t.abs().clamp_min(torch.finfo(dtype).tiny))))

    gap = (fused - g32).abs() - (0.5 * ulp(y) * gate + 0.5 * ulp(fused) + 1e-5 * g32.abs())
    i = int(gap.argmax())
    assert gap.max().item() <= 0, (f"fused {fused.flatten()[i]:.5g} vs the gate on y {g32.flatten()[i]:.5g} "
                                   f"(y {y.flatten()[i]:.5g}) at flat index {i}")


def test_torch_compile_runs_the_registered_op(torch):
    """Under torch.compile (fullgraph) the forward is the op ``torch.ops.ptsolve.mamba_chunk_scan_combined``: the
    eager result, bit for bit."""
    from ptsolve import ssd

    a = kt.inputs(2, 300, 24, 64, 128, 1, torch.bfloat16, device="cuda", seed=5, D="h", z=True, init=True)
    pos, kw = _args(a)
    f = torch.compile(lambda *t: ssd.mamba_chunk_scan_combined(*t, 256, return_final_states=True, **kw),
                      fullgraph=True)
    out, fin = f(*pos)
    eout, efin = ssd.mamba_chunk_scan_combined(*pos, 256, return_final_states=True, **kw)
    assert torch.equal(out, eout) and torch.equal(fin, efin)


def test_cuda_graph_capture_replays_new_inputs(torch):
    """The forward captured in a CUDA graph (no host sync in it; the kernels' launches prepared during the capture)
    and replayed on new inputs copied into the captured ones gives the eager result of those inputs."""
    from ptsolve import ssd

    mk = [kt.inputs(2, 400, 32, 64, 128, 1, torch.float16, device="cuda", seed=s, D="h", z=True, init=True,
                    seqs=2) for s in (1, 2)]
    pos, kw = _args(mk[0])
    for _ in range(2):  # warm: classes, kernels, prepared launches of the eager addresses
        ssd.mamba_chunk_scan_combined(*pos, 256, return_final_states=True, **kw)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out, fin = ssd.mamba_chunk_scan_combined(*pos, 256, return_final_states=True, **kw)
    for k, v in mk[1].items():
        if isinstance(v, torch.Tensor):
            mk[0][k].copy_(v)
    g.replay()
    torch.cuda.synchronize()
    pos2, kw2 = _args(mk[1])
    eout, efin = ssd.mamba_chunk_scan_combined(*pos2, 256, return_final_states=True, **kw2)
    # cuBLAS may pick another CB algorithm under capture: equal up to rounding, and far from the first inputs' result
    for got, want in ((out, eout), (fin, efin)):
        assert (got.float() - want.float()).abs().max() <= 1e-3 * want.float().abs().max()


def _mamba_combined():
    try:
        from baselines.mamba2 import load_combined
        return load_combined()
    except ImportError as e:
        pytest.skip(f"mamba_ssm is not importable ({e}); baselines/build_mamba_wheel.sh builds it")


@pytest.mark.parametrize("case", CASES[:6], ids=lambda c: "-".join(map(str, c)))
def test_against_mamba_ssm(torch, case):
    """mamba_ssm's own mamba_chunk_scan_combined on the same inputs: both near the reference, ptsolve's error at
    most twice Triton's plus the floor; the final states likewise."""
    from ptsolve import ssd

    combined = _mamba_combined()
    h, b, L, dt, D, z, init, seqs = case
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dt]
    a = kt.inputs(b, L, h, 64, 128, 1, dtype, device="cuda", seed=L + h, D=D, z=z, init=init, seqs=seqs)
    pos, kw = _args(a)
    out, fin = ssd.mamba_chunk_scan_combined(*pos, 256, return_final_states=True, **kw)
    tout, tfin = combined(*pos, 256, return_final_states=True, **kw)
    ref, rfin = ssd.ssd_reference(*pos, 256, return_final_states=True, **kw)
    err, terr = _errs(torch, out, tout, ref)
    assert err <= 2 * terr + FLOOR * ref.abs().max().item(), f"out: ptsolve {err:.3g}, mamba_ssm {terr:.3g}"
    ferr, tferr = _errs(torch, fin, tfin, rfin)
    assert ferr <= 2 * tferr + FLOOR * rfin.abs().max().item(), f"final: ptsolve {ferr:.3g}, mamba_ssm {tferr:.3g}"
    assert math.isfinite(err)


def _rms(torch, got, ref) -> float:
    return (got.double() - ref).pow(2).mean().sqrt().item()


def _scan_case(torch) -> dict:
    """The bf16 case whose whole forward missed mamba_ssm's accuracy with bf16 CB (370m's widths: 32 heads, batch 2,
    seq 1000, D per head, z; 0.688 vs 0.312 max error, H200): its chunk scan's inputs, the entering states of the
    float64 state passing rounded to bf16, CB exact (float64), from chunk_bmm (float32, the default) and rounded to
    bf16, and the float64 chunk scan of the exact CB on the same inputs."""
    from codegen.harness.mamba2 import chunk_scan_reference
    from ptsolve import ssd

    h, b, L = 32, 2, 1000
    a = kt.inputs(b, L, h, 64, 128, 1, torch.bfloat16, device="cuda", seed=L + h, D="h", z=True)
    x, B, C = a["x"], a["B"], a["C"]
    dtc, dA = ssd.chunk_cumsum(a["dt"], a["A"], 256, a["dt_bias"], True)
    own = kt.chunk_state(B, x, dtc, dA).double()
    ent = torch.zeros_like(own)  # s_c enters chunk c + 1: the recurrence in float64, no initial state
    for c in range(1, own.shape[1]):
        ent[:, c] = torch.exp(dA[:, :, c - 1, -1].double())[..., None, None] * ent[:, c - 1] + own[:, c - 1]
    st = ent.to(torch.bfloat16)
    cb64 = ssd.chunk_bmm(C.double(), B.double(), 256)
    return {"x": x, "dt": dtc, "dA": dA, "C": C, "states": st, "cb64": cb64, "cb32": ssd.chunk_bmm(C, B, 256),
            "cb16": ssd.chunk_bmm(C, B, 256, out_dtype=torch.bfloat16),
            "ref": chunk_scan_reference(cb64, x, dtc, dA, C, st)}


def test_float32_cb_rounds_once_as_mamba_ssm(torch):
    """bf16 ChunkScan with float32 CB (chunk_bmm's default: cuBLAS's bf16-in float32-out GEMM) is mamba_ssm's
    arithmetic, P = CB·exp(ΔdA)·dt rounded once: its RMS error against the float64 chunk scan is at most 5% over that
    arithmetic's (ssd_torch with the decayed float32 CB rounded once to bf16), and its max error within half a bf16
    ulp of the largest output of it; with bf16 CB (rounded twice) the RMS error is at least 10% larger (+21% in that
    arithmetic on the CPU). The max error cannot tell the two apart: the output's own rounding at |y| ≈ 111 decides
    it (0.377 both, CPU)."""
    from ptsolve import ssd

    s = _scan_case(torch)
    cb32, ref = s["cb32"], s["ref"]
    assert cb32.dtype == torch.float32
    assert (cb32.double() - s["cb64"]).abs().max().item() <= 64 * 2.0 ** -24 * s["cb64"].abs().max().item()
    ins = (s["x"], s["dt"], s["dA"], s["C"], s["states"])
    _poison(torch, s["x"].shape, torch.bfloat16)
    y32 = ssd._chunk_scan_cuda(cb32, *ins)
    y16 = ssd._chunk_scan_cuda(s["cb16"], *ins)
    assert not torch.isnan(y32).any() and not torch.isnan(y16).any()
    once = kt.chunk_scan(cb32, *ins, low=torch.bfloat16)
    e32, e16, eonce = (_rms(torch, y, ref) for y in (y32, y16, once))
    assert e32 <= 1.05 * eonce, f"float32 CB: RMS error {e32:.4g} vs {eonce:.4g} with P rounded once"
    assert e16 >= 1.1 * e32, f"bf16 CB: RMS error {e16:.4g}, float32 CB {e32:.4g}"
    half_ulp = 0.5 * torch.finfo(torch.bfloat16).eps * 2.0 ** math.floor(math.log2(ref.abs().max().item()))
    m32, monce = ((y.double() - ref).abs().max().item() for y in (y32, once))
    assert m32 <= monce + half_ulp, f"float32 CB: max error {m32:.4g} vs {monce:.4g} with P rounded once"


def test_float32_cb_chunk_scan_against_mamba_ssms(torch):
    """The same chunk scan by mamba_ssm's Triton ``_chunk_scan_fwd`` on the same float32 CB and inputs: ptsolve's
    RMS error at most 5% over Triton's, its max error within half a bf16 ulp of the largest output of Triton's."""
    from ptsolve import ssd

    try:
        from baselines.mamba2 import load_kernels
        kern = load_kernels()
    except ImportError as e:
        pytest.skip(f"mamba_ssm is not importable ({e}); baselines/build_mamba_wheel.sh builds it")
    s = _scan_case(torch)
    ins = (s["x"], s["dt"], s["dA"], s["C"], s["states"])
    y = ssd._chunk_scan_cuda(s["cb32"], *ins)
    tri = kern.chunk_scan_fwd(s["cb32"], *ins)[0]
    ref = s["ref"]
    e, et = _rms(torch, y, ref), _rms(torch, tri, ref)
    assert e <= 1.05 * et, f"RMS error: ptsolve {e:.4g}, mamba_ssm {et:.4g}"
    half_ulp = 0.5 * torch.finfo(torch.bfloat16).eps * 2.0 ** math.floor(math.log2(ref.abs().max().item()))
    m, mt = ((t.double() - ref).abs().max().item() for t in (y, tri))
    assert m <= mt + half_ulp, f"max error: ptsolve {m:.4g}, mamba_ssm {mt:.4g}"
