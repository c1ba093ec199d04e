"""Mamba2 state passing's kernel on an H100/H200 (``pytest -m gpu tests/gpu/test_state_passing_gpu.py``): the
exact-shape kernels of several tilings and the serving layer's class kernels (``ptsolve.ssd``'s CUDA path) against
``ptsolve.ssd.state_passing`` (the PyTorch recurrence in float32) and the harness's float64 one, with and without
initial states and seq_idx's keep flags, ragged sizes (one chunk, a chunk count that is not a multiple of 4, odd
heads and batch), fp16 and bf16 entering states; then the whole forward with many chunks against ``ssd_reference``.

The bounds: the kernel runs the same float32 recurrence (one fused multiply-add per element and chunk, expf), so its
final state is within 2e-5 of the largest magnitude of the float32 reference's, and each entering state is the
float32 one rounded to the dtype: within half an ulp of the dtype (subnormals included) plus that 2e-5. The outputs
are NaN-filled first, so an element the kernel does not write fails.

The cubins (compiled on a CPU machine, carried in $PTSOLVE_CACHE_DIR): ``plans()`` lists the exact-shape ones, and
``python -m ptsolve.serve precompile --only mamba2`` the class kernels.
"""
from __future__ import annotations

import os

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.gpu  # the fixture torch: tests/conftest.py
_CACHE = os.environ.get("PTSOLVE_CACHE_DIR")  # before conftest gives every test its own
OP = "mamba2_state_passing"
REL = 2e-5  # of the largest magnitude: float32 rounding carried through up to 65 chunks


@pytest.fixture(autouse=True)
def _carried_cubins(monkeypatch: pytest.MonkeyPatch) -> None:
    """Use the cubins compiled on the CPU machine and carried along."""
    if _CACHE:
        monkeypatch.setenv("PTSOLVE_CACHE_DIR", _CACHE)


EXACT = [  # (batch, chunks, heads, head_dim, d_state, chunk, dtype, tiling)
    (2, 64, 48, 64, 128, 256, "bf16", {"BE": 2048, "depth": 2, "groups": 1, "ctas": 2}),  # 780m b2 s16k
    (1, 1, 3, 64, 64, 64, "fp16", {"BE": 1024, "depth": 2, "groups": 2, "ctas": 2}),     # one chunk, odd heads
    (3, 5, 8, 64, 128, 128, "fp16", {"BE": 512, "depth": 8, "groups": 1}),               # 5 chunks: keep padded
    (1, 33, 24, 64, 128, 256, "bf16", {"BE": 8192, "depth": 3, "groups": 2}),            # whole state per CTA
    (2, 7, 5, 64, 64, 256, "bf16", {"BE": 4096, "depth": 4, "groups": 1, "ctas": 2}),
]


def _params(case: tuple) -> dict:
    return dict(zip(("batch", "chunks", "heads", "head_dim", "d_state", "chunk", "dtype"), case[:7]))


def plans() -> list:
    """The exact-shape plans these tests launch (precompile them with ``codegen.harness.precompile``)."""
    from codegen.plan import default_plan
    return [default_plan(OP, _params(c), c[7]) for c in EXACT]


def _bounds(torch, ent, fin, ref_ent, ref_fin) -> None:
    """ent (dtype) and fin (float32) against the float32 reference's entering states and final state."""
    assert not torch.isnan(ent).any() and not torch.isnan(fin).any(), "NaN: an element not written"
    scale = max(ref_fin.abs().max().item(), ref_ent.abs().max().item(), 1e-30)
    gap = (fin - ref_fin).abs().max().item()
    assert gap <= REL * scale, f"final state: max err {gap:.3g} > {REL} * {scale:.3g}"
    fi = torch.finfo(ent.dtype)
    ulp = fi.eps * torch.exp2(torch.floor(torch.log2(ref_ent.abs().clamp_min(fi.tiny))))
    over = (ent.float() - ref_ent).abs() - (0.5 * ulp + REL * scale)
    i = int(over.argmax())
    assert over.max().item() <= 0, (f"entering state {ent.flatten()[i].item():.6g} vs the reference's "
                                    f"{ref_ent.flatten()[i].item():.6g} at flat index {i}")


def _ssd_reference(torch, inp: dict, nc: int, dtype) -> tuple:
    """ptsolve.ssd.state_passing on the same inputs (keep as its bool pass_keep), entering in float32."""
    from ptsolve import ssd
    keep = inp["keep"][:, :nc] > 0 if inp["keep"] is not None else None
    return ssd.state_passing(inp["states"].clone(), inp["dA_cumsum"], inp["init"], keep, torch.float32)


@pytest.mark.parametrize("case", EXACT, ids=lambda c: "-".join(map(str, c[:7])))
@pytest.mark.parametrize("keep,init", [(False, False), (True, True), (False, True), (True, False)])
def test_exact_kernel_matches_ssd_state_passing(torch, case, keep, init):
    from codegen.harness.state_passing import inputs, reference, run_state_passing
    from codegen.plan import default_plan

    p = _params(case)
    plan = default_plan(OP, p, case[7])
    inp = inputs(p, seed=p["chunks"] * 7 + p["heads"], keep=keep, init=init)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[p["dtype"]]
    out = torch.full(inp["states"].shape, float("nan"), device="cuda", dtype=dtype)
    fin = torch.full((p["batch"], p["heads"], p["head_dim"], p["d_state"]), float("nan"), device="cuda")
    run_state_passing(**inp, plan=plan, out=out, fin=fin)
    torch.cuda.synchronize()
    ref_ent, ref_fin = _ssd_reference(torch, inp, p["chunks"], dtype)
    _bounds(torch, out, fin, ref_ent, ref_fin)
    d_ent, d_fin = reference(**inp)  # the float64 recurrence: the float32 reference is itself that close
    assert (ref_fin.double() - d_fin).abs().max().item() <= REL * d_fin.abs().max().item()
    assert (ref_ent.double() - d_ent).abs().max().item() <= REL * d_ent.abs().max().item()


CLASS_CASES = [  # (batch, chunks, heads, d_state, chunk, dtype, initial states, packed sequences)
    (2, 64, 48, 128, 256, "bf16", True, 3),   # Mamba2-780m batch 2, seq 16k: the slow row of bench models ssd
    (1, 32, 32, 128, 256, "fp16", False, 0),  # 370m batch 1, seq 8k
    (4, 9, 64, 64, 128, "bf16", True, 0),
    (3, 1, 7, 128, 64, "fp16", True, 2),      # one chunk
    (1, 130, 8, 64, 64, "bf16", False, 5),    # many chunks
]


@pytest.mark.parametrize("case", CLASS_CASES, ids=lambda c: "-".join(map(str, c)))
def test_class_kernel_matches_ssd_state_passing(torch, case):
    """``ssd.PTSOLVE_KERNELS.state_passing`` (the class kernel the forward runs) against ``ssd.state_passing``, with
    seq_idx's pass_keep where the case packs sequences; the chunk states are left as they were."""
    from ptsolve import ssd

    b, nc, h, n, Q, dt, init, seqs = case
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dt]
    g = torch.Generator(device="cuda").manual_seed(nc * 31 + h)
    states = torch.randn(b, nc, h, 64, n, device="cuda", generator=g)
    dA = torch.cumsum(-torch.rand(b, h, nc, Q, device="cuda", generator=g) * (2.0 / Q), dim=-1)  # decay ~ e^-1
    h0 = torch.randn(b, h, 64, n, device="cuda", generator=g) if init else None
    keep = None
    if seqs:
        L = nc * Q - Q // 3
        cuts = torch.sort(torch.randperm(L - 1, generator=torch.Generator().manual_seed(seqs))[: seqs - 1] + 1).values
        seq_idx = torch.bucketize(torch.arange(L), cuts, right=True).int().expand(b, L).cuda()
        keep = ssd.seq_masks(seq_idx, Q).pass_keep
        assert not keep.all()  # a restart to check
    before = states.clone()
    ent, fin = ssd.PTSOLVE_KERNELS.state_passing(states, dA, h0, keep, dtype)
    torch.cuda.synchronize()
    assert torch.equal(states, before) and ent.dtype == dtype and fin.dtype == torch.float32
    ref_ent, ref_fin = ssd.state_passing(before.clone(), dA, h0, keep, torch.float32)
    _bounds(torch, ent, fin, ref_ent, ref_fin)


@pytest.mark.parametrize("case", [(8, 2, 65 * 64 - 21, "bf16", "h", True, True, 4),
                                  (16, 1, 40 * 64, "fp16", "hp", False, False, 0)],
                         ids=["65chunks-init-seq_idx", "40chunks"])
def test_combined_with_many_chunks_against_the_reference(torch, monkeypatch, case):
    """The whole forward (``mamba_chunk_scan_combined``) with 65 and 40 chunks of 64 against ``ssd_reference``, with
    test_ssd_gpu's bound; the state passing that ran is the kernel (counted), not the PyTorch loop."""
    from test_ssd_gpu import FLOOR, _check

    from ptsolve import ssd

    calls = []

    def counted(*a, **k):
        calls.append(a[0].shape)
        return ssd._state_passing_cuda(*a, **k)

    monkeypatch.setattr(ssd, "PTSOLVE_KERNELS", ssd.PTSOLVE_KERNELS._replace(state_passing=counted))
    err, lerr, ferr, flerr, scale, fscale = _check(torch, case, chunk=64, n=128)
    h, b, L = case[:3]
    assert calls == [(b, -(-L // 64), h, 64, 128)]
    assert err <= 2 * lerr + FLOOR * scale, f"out: max err {err:.3g} > 2 * {lerr:.3g} + {FLOOR * scale:.2g}"
    assert ferr <= 2 * flerr + FLOOR * fscale, f"final: max err {ferr:.3g} > 2 * {flerr:.3g} + {FLOOR * fscale:.2g}"
