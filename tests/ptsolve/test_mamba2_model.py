"""ptsolve.mamba2_model on the CPU: the patched Hugging Face Mamba2 (its glue around the SSD, the cache, prefill and
decode) against transformers' own model in float32, with the SSD's chunk kernels from ssd_torch (PyTorch, float64
formulas) behind ``ptsolve.ssd.ssd_forward``; ``recurrent_step`` against the token-by-token recurrence; the checks
(ShapeError / ConfigError naming the field). ptsolve's CUDA kernels in the same model: tests/gpu/
test_mamba2_model_gpu.py."""
from __future__ import annotations

import copy
import math

import pytest

torch = pytest.importorskip("torch")

import ssd_torch as kt  # noqa: E402  (tests/ptsolve, on the path: tests/conftest.py)

from ptsolve import mamba2_model as pm  # noqa: E402
from ptsolve import ssd  # noqa: E402
from ptsolve.errors import ConfigError, DeviceError, ShapeError  # noqa: E402

KERNELS = ssd.Kernels(kt.chunk_state, kt.chunk_scan)


def torch_scan(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
               dt_softplus=False, dt_limit=(0.0, math.inf), return_final_states=False):
    """``mamba_chunk_scan_combined``'s signature over ``ssd.ssd_forward`` with ssd_torch's kernels (any device)."""
    out, fin = ssd.ssd_forward(x, dt, A, B, C, chunk_size, KERNELS, D, z, dt_bias, initial_states, seq_idx,
                               dt_softplus, dt_limit)
    return (out, fin) if return_final_states else out


TORCH = pm.Backend("torch", torch_scan, pm.recurrent_step)


# ------------------------------------------------------------------------------------------------ recurrent_step

STEP_CASES = [  # b, h, p, n, g, D, z, state dtype, dt_limit
    (1, 2, 3, 4, 1, "", False, torch.float32, (0.0, math.inf)),
    (2, 4, 2, 3, 2, "h", True, torch.float32, (0.0, math.inf)),
    (3, 6, 4, 2, 3, "hp", True, torch.float64, (0.01, 0.05)),
    (2, 4, 2, 5, 4, "h", False, torch.bfloat16, (0.0, math.inf)),
]


@pytest.mark.parametrize("case", STEP_CASES)
def test_recurrent_step_is_the_recurrence(case):
    """Five steps from an initial state equal ssd_torch's float64 recurrence (state and outputs), the state
    updated in place (its storage kept)."""
    b, h, p, n, g, D, z, sdt, limit = case
    a = kt.inputs(b, 5, h, p, n, g, torch.float32, D=D, z=z, init=True, seed=h * 7 + n)
    state = a["initial_states"].to(sdt).clone()
    a["initial_states"] = state.clone()  # the recurrence starts from the same (rounded) state
    ptr = state.data_ptr()
    ys = [pm.recurrent_step(state, a["x"][:, t], a["dt"][:, t], a["A"], a["B"][:, t], a["C"][:, t], D=a.get("D"),
                            z=a["z"][:, t] if z else None, dt_bias=a["dt_bias"], dt_softplus=True, dt_limit=limit)
          for t in range(5)]
    want_y, want_h = kt.recurrence(**a, dt_limit=limit)
    tol = 1e-5 if sdt != torch.bfloat16 else 2e-2  # a bf16 state is rounded after every step
    assert state.data_ptr() == ptr and state.dtype == sdt
    assert (torch.stack(ys, 1).double() - want_y).abs().max().item() <= tol * max(1.0, want_y.abs().max().item())
    assert (state.double() - want_h).abs().max().item() <= tol * max(1.0, want_h.abs().max().item())


def test_recurrent_step_takes_any_float_parameters():
    """float64 A, dt_bias and D (a float64 model's parameters) with float32 activations: the step stays float32."""
    a = kt.inputs(2, 1, 4, 2, 3, 2, torch.float32, D="h", init=True, seed=3)
    p64 = {k: a[k].double() for k in ("A", "dt_bias", "D")}
    s1, s2 = a["initial_states"].clone(), a["initial_states"].clone()
    args = (a["x"][:, 0], a["dt"][:, 0])
    y1 = pm.recurrent_step(s1, *args, p64["A"], a["B"][:, 0], a["C"][:, 0], D=p64["D"], dt_bias=p64["dt_bias"],
                           dt_softplus=True)
    y2 = pm.recurrent_step(s2, *args, a["A"], a["B"][:, 0], a["C"][:, 0], D=a["D"], dt_bias=a["dt_bias"],
                           dt_softplus=True)
    assert y1.dtype == torch.float32 and (y1 - y2).abs().max().item() < 1e-5 and (s1 - s2).abs().max() < 1e-5


@pytest.mark.parametrize("over, match", [
    ({"x": torch.zeros(2, 4, 3)}, "x must be"),
    ({"dt": torch.zeros(2, 5)}, "dt must be"),
    ({"A": torch.zeros(3)}, "A must be"),
    ({"C": torch.zeros(2, 2, 4)}, "C must be"),
    ({"B": torch.zeros(2, 3, 5), "C": torch.zeros(2, 3, 5)}, "multiple of ngroups=3"),
    ({"D": torch.zeros(4, 3)}, "D must be"),
    ({"z": torch.zeros(2, 4)}, "z must be"),
    ({"dt_bias": torch.zeros(2)}, "dt_bias must be"),
])
def test_recurrent_step_names_the_bad_argument(over, match):
    a = {"state": torch.zeros(2, 4, 2, 5), "x": torch.zeros(2, 4, 2), "dt": torch.zeros(2, 4), "A": torch.zeros(4),
         "B": torch.zeros(2, 2, 5), "C": torch.zeros(2, 2, 5)}
    with pytest.raises(ShapeError, match=match):
        pm.recurrent_step(**{**a, **over})


@pytest.mark.parametrize("geo, match", [
    (pm.Geometry(24, 32, 1, 128, 256, 768), "head_dim=32"),
    (pm.Geometry(24, 64, 1, 32, 256, 1536), "state_size=32"),
    (pm.Geometry(24, 64, 1, 128, 100, 1536), "chunk_size=100"),
    (pm.Geometry(24, 64, 5, 128, 256, 1536), "multiple of n_groups=5"),
])
def test_ptsolve_check_names_the_config_field(geo, match):
    with pytest.raises(ShapeError, match=match):
        pm.check_ptsolve(geo)


def test_ptsolve_check_takes_the_shapes_md_configs():
    for heads in (24, 32, 48, 64):  # Mamba2-130m … 1.3b
        pm.check_ptsolve(pm.Geometry(heads, 64, 1, 128, 256, heads * 64))


# ------------------------------------------------------------------------------------------------ the model

@pytest.fixture(scope="module")
def hf():
    """transformers' Mamba2 (5.17's API: skipped elsewhere)."""
    tr = pytest.importorskip("transformers")
    try:
        pm._mixer_class()
    except ConfigError as e:
        pytest.skip(str(e))
    return tr


def _config(hf, **kw):
    base = {"vocab_size": 97, "hidden_size": 64, "num_hidden_layers": 2, "state_size": 16, "head_dim": 16,
            "expand": 2, "n_groups": 2, "chunk_size": 8, "num_heads": 8}
    return hf.Mamba2Config(**{**base, **kw})


def _pair(hf, backend=TORCH, seed=0, **kw):
    torch.manual_seed(seed)
    cfg = _config(hf, **kw)
    ref = hf.Mamba2ForCausalLM(cfg).eval()
    return cfg, ref, pm.patch(copy.deepcopy(ref), backend)


def _run(hf, cfg, model, ids, steps, mask=None):
    """Logits (b, L + steps + 3, vocab): a prefill of ``ids``, ``steps`` greedy decode steps, then a 3-token
    continuation (prefill from the cached state), on one cache."""
    cache = hf.DynamicCache(config=cfg)
    with torch.no_grad():
        out = model(ids, cache_params=cache, use_cache=True, attention_mask=mask)
        logits = [out.logits]
        for _ in range(steps):
            out = model(out.logits[:, -1:].argmax(-1), cache_params=cache, use_cache=True)
            logits.append(out.logits)
        logits.append(model(ids[:, :3], cache_params=cache, use_cache=True).logits)
    return torch.cat(logits, 1)


def _err(a, b):
    return (a - b).abs().max().item() / max(1.0, b.abs().max().item())


@pytest.mark.parametrize("kw, L", [({}, 21), ({"n_groups": 1}, 16), ({"n_groups": 4, "chunk_size": 4}, 3)])
def test_patched_model_is_transformers(hf, kw, L):
    """Prefill (ragged lengths: not a multiple of the chunk, shorter than the conv), greedy decode and a prefill
    continuing from the cache give transformers' own logits (float32) within float32 rounding."""
    cfg, ref, pat = _pair(hf, **kw)
    ids = torch.randint(0, cfg.vocab_size, (2, L), generator=torch.Generator().manual_seed(L))
    assert _err(_run(hf, cfg, pat, ids, 4), _run(hf, cfg, ref, ids, 4)) < 1e-5


def test_dt_limit_prefill_is_transformers(hf):
    """A time_step_limit that clamps: the prefill is transformers' (whose decode step does not clamp, see
    test_decode_continues_the_prefill)."""
    cfg, ref, pat = _pair(hf, time_step_limit=(0.02, 0.08))
    ids = torch.randint(0, cfg.vocab_size, (2, 13), generator=torch.Generator().manual_seed(13))
    with torch.no_grad():
        assert _err(pat(ids).logits, ref(ids).logits) < 1e-5


@pytest.mark.parametrize("kw", [{}, {"n_groups": 1, "chunk_size": 4}, {"time_step_limit": (0.02, 0.08)}])
def test_decode_continues_the_prefill(hf, kw):
    """The recurrent step on the cache gives what the chunked scan gives for the same tokens: a prefill of the first
    k tokens then the rest decoded one by one equals one prefill of all of them (dt_limit clamped on both)."""
    cfg, _, pat = _pair(hf, seed=4, **kw)
    ids = torch.randint(0, cfg.vocab_size, (2, 15), generator=torch.Generator().manual_seed(4))
    cache = hf.DynamicCache(config=cfg)
    with torch.no_grad():
        whole = pat(ids).logits
        got = [pat(ids[:, :6], cache_params=cache, use_cache=True).logits]
        got += [pat(ids[:, t:t + 1], cache_params=cache, use_cache=True).logits for t in range(6, 15)]
    assert _err(torch.cat(got, 1), whole) < 1e-5


def test_padding_mask_is_applied_as_transformers_does(hf):
    cfg, ref, pat = _pair(hf, seed=1)
    ids = torch.randint(0, cfg.vocab_size, (2, 11), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 11, dtype=torch.long)
    mask[1, :4] = 0  # left padding
    assert _err(_run(hf, cfg, pat, ids, 2, mask), _run(hf, cfg, ref, ids, 2, mask)) < 1e-5


def test_generate_gives_transformers_tokens(hf):
    cfg, ref, pat = _pair(hf, seed=2)
    ids = torch.randint(0, cfg.vocab_size, (2, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = ref.generate(ids, max_new_tokens=6, do_sample=False)
        got = pat.generate(ids, max_new_tokens=6, do_sample=False)
    assert torch.equal(got, want)


def test_the_comparison_bites(hf):
    """A backend whose step forgets D, or whose scan forgets the initial state, is caught by the same check."""
    cfg, ref, _ = _pair(hf)
    ids = torch.randint(0, cfg.vocab_size, (2, 10), generator=torch.Generator().manual_seed(9))
    want = _run(hf, cfg, ref, ids, 3)

    def no_d(*a, D=None, **kw):
        return pm.recurrent_step(*a, **kw)

    def no_init(*a, initial_states=None, **kw):
        return torch_scan(*a, **kw)
    for bad in (pm.Backend("no_d", torch_scan, no_d), pm.Backend("no_init", no_init, pm.recurrent_step)):
        pat = pm.patch(copy.deepcopy(ref), bad)
        assert _err(_run(hf, cfg, pat, ids, 3), want) > 1e-3


def test_patch_checks_every_mixer_first(hf):
    """A geometry ptsolve's kernels do not cover is a ShapeError naming the field, and no mixer is patched."""
    torch.manual_seed(0)
    model = hf.Mamba2ForCausalLM(_config(hf))  # head_dim 16, state 16, chunk 8: outside the kernels' classes
    with pytest.raises(ShapeError, match="head_dim=16"):
        pm.patch(model)
    assert not any(hasattr(m, "_ptsolve_backend") for m in model.modules())
    model.backbone.layers[1].mixer.num_heads = 6  # the config refuses 6·16 ≠ 2·64; a mixer changed after it
    with pytest.raises(ShapeError, match="layer 1: num_heads·head_dim"):
        pm.patch(model, TORCH)
    assert not any(hasattr(m, "_ptsolve_backend") for m in model.modules())  # layer 0 passed, and is not patched
    with pytest.raises(ConfigError, match="no Mamba2Mixer"):
        pm.patch(torch.nn.Linear(2, 2))


def test_unpatch_restores_transformers_forward(hf):
    cfg, ref, pat = _pair(hf)
    pm.unpatch(pat)
    assert not any(hasattr(m, "_ptsolve_backend") or "forward" in vars(m) for m in pat.modules())
    ids = torch.randint(0, cfg.vocab_size, (1, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(pat(ids).logits, ref(ids).logits)


def test_ptsolve_backend_runs_ptsolves_ssd(hf):
    """The default backend calls ptsolve.ssd.mamba_chunk_scan_combined: on CPU tensors its device check answers."""
    torch.manual_seed(0)
    model = pm.patch(hf.Mamba2ForCausalLM(_config(hf, hidden_size=64, num_heads=2, head_dim=64, state_size=64,
                                                  n_groups=1, chunk_size=64)).to(torch.bfloat16).eval())
    with torch.no_grad(), pytest.raises(DeviceError, match="CUDA tensors"):
        model(torch.zeros(1, 5, dtype=torch.long))
