"""A Hugging Face Mamba2ForCausalLM on ptsolve's SSD (``ptsolve.mamba2_model.patch``) on an H100/H200
(``pytest -m gpu tests/gpu/test_mamba2_model_gpu.py``): Mamba2-130m's sizes (d_model 768, d_state 128, head_dim 64,
expand 2, one group, chunk 256) with 4 of its 24 layers, random weights (seed 0), bf16.

The reference is transformers' own model (its PyTorch path) on the same weights in float32. The tolerance is a
peer's: ptsolve's largest logit error against the reference must be at most twice the largest of the bf16 peers'
own errors on the same tokens — transformers' model in bf16 (its glue rounds as ours does: in_proj, conv1d, norm,
out_proj in bf16) and, where mamba_ssm imports, the same patched glue on mamba_ssm's Triton kernels
(``baselines.mamba2_model``), which round the SSD's operands (x, B, C, the entering states) to bf16 as ptsolve's
do — plus 1e-3 of the largest reference logit (a floor for rows where the peers happen to round exactly). A wrong
gate, skip, state hand-over or dt gives errors of the logits' own size and fails it.

Prefill at ragged lengths (not multiples of the chunk, one shorter than a chunk), then greedy decode of 8 tokens
(each model fed the reference's greedy tokens, so every step compares the same inputs) and a 300-token prefill
continuing from the cache (the initial-state path of the chunked scan); decode must run the recurrent step and never
the chunked scan.
"""
from __future__ import annotations

import copy
import inspect
import os
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.gpu  # the fixture torch: tests/conftest.py
_CACHE = os.environ.get("PTSOLVE_CACHE_DIR")  # before conftest gives every test its own
LAYERS, STEPS, MORE = 4, 8, 300
FLOOR = 1e-3  # of the largest reference logit


@pytest.fixture(autouse=True)
def _carried_cubins(monkeypatch: pytest.MonkeyPatch) -> None:
    """Use the cubins compiled on the CPU machine and carried along (PTSOLVE_CACHE_DIR=.cubin_ssd)."""
    if _CACHE:
        monkeypatch.setenv("PTSOLVE_CACHE_DIR", _CACHE)


@pytest.fixture(autouse=True)
def _transformers_own_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers' Mamba2 on its PyTorch functions, whatever it found at import: where ``import mamba_ssm`` works
    (or ran after baselines.mamba2 registered its bare package), its kernel lookup picks mamba_ssm's Triton kernels
    for the unpatched model; this test's reference is transformers' own code, so each of those module functions is
    replaced, for the test's duration, by the PyTorch function it wraps (``inspect.unwrap``)."""
    try:
        from transformers.models.mamba2 import modeling_mamba2 as mm
    except Exception:  # noqa: BLE001 - no torch / transformers here: the fixtures skip
        return
    for name in ("mamba2_chunk_scan", "mamba2_selective_state_update", "causal_conv1d_fn", "causal_conv1d_update"):
        if hasattr(mm, name):
            monkeypatch.setattr(mm, name, inspect.unwrap(getattr(mm, name)))


class Counted:
    """A backend function that counts its calls."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *a, **kw):
        self.calls += 1
        return self.fn(*a, **kw)


@pytest.fixture(scope="module")
def models(torch):
    """ref (float32, transformers' own path), hf_bf16 (transformers' own path, bf16), pt (ptsolve, bf16, counting
    its scan and step calls) and mamba (mamba_ssm's kernels, bf16; None where mamba_ssm does not import)."""
    tr = pytest.importorskip("transformers")
    import ptsolve.mamba2_model as pm
    from ptsolve.errors import ConfigError
    try:
        pm._mixer_class()
    except ConfigError as e:
        pytest.skip(str(e))
    cfg = tr.Mamba2Config(vocab_size=50288, hidden_size=768, num_hidden_layers=LAYERS, state_size=128, head_dim=64,
                          expand=2, n_groups=1, chunk_size=256, num_heads=24)
    torch.manual_seed(0)
    with torch.device("cuda"):
        base = tr.Mamba2ForCausalLM(cfg).to(torch.bfloat16).eval()
    scan, step = Counted(pm.PTSOLVE.scan), Counted(pm.PTSOLVE.step)
    pt = pm.patch(copy.deepcopy(base), pm.Backend("ptsolve", scan, step, pm.check_ptsolve))
    try:
        from baselines.mamba2_model import patch_mamba_ssm
        mamba = patch_mamba_ssm(copy.deepcopy(base))
    except ImportError as e:
        print(f"mamba_ssm not importable ({e}): transformers' bf16 model is the only peer")
        mamba = None
    return SimpleNamespace(cfg=cfg, tr=tr, ref=copy.deepcopy(base).float(), hf_bf16=base, pt=pt, mamba=mamba,
                           scan=scan, step=step)


def _ids(torch, cfg, batch, L, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(0, cfg.vocab_size, (batch, L), device="cuda", generator=g)


def _check(torch, got, want, peers, what):
    """ptsolve's largest logit error within twice the largest bf16 peer's, plus the floor."""
    err = (got.float() - want).abs().max().item()
    perr = {k: (v.float() - want).abs().max().item() for k, v in peers.items()}
    tol = 2 * max(perr.values()) + FLOOR * want.abs().max().item()
    assert err <= tol, f"{what}: ptsolve {err:.4g} > {tol:.4g} (peers {perr}, largest logit {want.abs().max():.3g})"


def _peers(m):
    return {"transformers_bf16": m.hf_bf16, **({"mamba_ssm": m.mamba} if m.mamba is not None else {})}


@pytest.mark.parametrize("batch, L", [(2, 700), (1, 256), (3, 37)])
def test_prefill_logits(torch, models, batch, L):
    ids = _ids(torch, models.cfg, batch, L, seed=L)
    with torch.no_grad():
        want = models.ref(ids).logits.float()
        peers = {k: m(ids).logits for k, m in _peers(models).items()}
        got = models.pt(ids).logits
    assert got.shape == want.shape and torch.isfinite(got).all()
    _check(torch, got, want, peers, f"prefill b{batch} L{L}")


def _generate(torch, m, model, ids, forced):
    """Logits (b, L + STEPS + MORE, vocab): a prefill of ``ids`` into a fresh cache, STEPS decode steps fed
    ``forced``'s tokens (the model's own greedy ones where None, returned), then MORE tokens prefilled from the
    cache; and the tokens fed."""
    cache = m.tr.DynamicCache(config=m.cfg)
    out = model(ids, cache_params=cache, use_cache=True)
    logits, toks = [out.logits.float()], []
    for i in range(STEPS):
        toks.append(out.logits[:, -1:].argmax(-1) if forced is None else forced[i])
        out = model(toks[-1], cache_params=cache, use_cache=True)
        logits.append(out.logits.float())
    more = _ids(torch, m.cfg, ids.shape[0], MORE, seed=7)
    logits.append(model(more, cache_params=cache, use_cache=True).logits.float())
    return torch.cat(logits, 1), toks


def test_decode_and_continued_prefill(torch, models):
    """Greedy decode of 8 tokens after a ragged prefill, then a prefill from the cache: every step's logits within
    the tolerance; the 8 steps ran ptsolve's recurrent step once per layer each, and the chunked scan only for
    the two prefills."""
    ids = _ids(torch, models.cfg, 2, 700, seed=3)
    with torch.no_grad():
        want, toks = _generate(torch, models, models.ref, ids, None)
        peers = {k: _generate(torch, models, m, ids, toks)[0] for k, m in _peers(models).items()}
        scans, steps = models.scan.calls, models.step.calls
        got, _ = _generate(torch, models, models.pt, ids, toks)
    assert (models.scan.calls - scans, models.step.calls - steps) == (2 * LAYERS, STEPS * LAYERS)
    L = ids.shape[1]
    for what, sl in (("prefill", slice(0, L)), ("decode", slice(L, L + STEPS)), ("continued", slice(L + STEPS, None))):
        _check(torch, got[:, sl], want[:, sl], {k: v[:, sl] for k, v in peers.items()}, what)
    d = slice(L - 1, L + STEPS - 1)  # the logits that chose the 8 tokens
    agree = {k: (got[:, d].argmax(-1) == v[:, d].argmax(-1)).float().mean().item() for k, v in peers.items()}
    print(f"greedy tokens equal to the peers' (fraction): {agree}")


def test_unsupported_config_is_refused(torch, models):
    """head_dim 32 (heads 48): a ShapeError naming the field before anything runs."""
    import ptsolve.mamba2_model as pm
    from ptsolve.errors import ShapeError
    cfg = models.tr.Mamba2Config(vocab_size=128, hidden_size=768, num_hidden_layers=1, state_size=128, head_dim=32,
                                 expand=2, n_groups=1, chunk_size=256, num_heads=48)
    with torch.device("cuda"):
        model = models.tr.Mamba2ForCausalLM(cfg).to(torch.bfloat16)
    with pytest.raises(ShapeError, match="head_dim=32"):
        pm.patch(model)
