"""bench/models/mamba2.py on the CPU: its rows, its --rows check, and its prefill / decode turns with two CPU
backends (ssd_torch's kernels behind the patched model): times for both, the logit difference 0 for identical
backends and not for different ones, the decode fed the lead's greedy tokens. Its GPU run: the report's command."""
from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from bench.models import mamba2 as bench  # noqa: E402
from ptsolve import mamba2_model as pm  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_rows_cover_the_issues_range():
    assert {m for m, *_ in bench.ROWS.values()} == {"130m", "370m", "780m", "1.3b"}
    pre = [(b, s) for _, ph, b, s in bench.ROWS.values() if ph == "prefill"]
    assert min(b for b, _ in pre) == 1 and max(b for b, _ in pre) == 8
    assert min(s for _, s in pre) == 512 and max(s for _, s in pre) >= 4096
    assert any(s % 256 for _, s in pre)  # a ragged prompt


def test_unknown_row_is_refused():
    got = subprocess.run([sys.executable, "-m", "bench", "models", "mamba2", "--out", "/dev/null", "--rows", "9b_x"],
                         cwd=ROOT, capture_output=True, text=True)
    assert got.returncode != 0 and "no row '9b_x'" in got.stderr


@pytest.fixture()
def setup(monkeypatch):
    hf = pytest.importorskip("transformers")
    import test_mamba2_model as tm  # tests/ptsolve: the CPU backend and a small config

    try:
        pm._mixer_class()
    except Exception as e:  # noqa: BLE001 - not transformers 5.17's API
        pytest.skip(str(e))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    torch.manual_seed(0)
    model = hf.Mamba2ForCausalLM(tm._config(hf)).eval()
    ids = torch.randint(0, 97, (2, 19), generator=torch.Generator().manual_seed(0))
    return hf, tm, model, ids


def test_prefill_and_decode_turns(setup):
    hf, tm, model, ids = setup
    same = {"ptsolve": tm.TORCH, "mamba_ssm": pm.Backend("copy", tm.torch_scan, pm.recurrent_step)}

    def no_d(*a, D=None, **kw):
        return pm.recurrent_step(*a, **kw)

    def no_d_scan(*a, D=None, **kw):
        return tm.torch_scan(*a, **kw)
    other = {"ptsolve": pm.Backend("no_d", no_d_scan, no_d), "mamba_ssm": tm.TORCH}
    with torch.no_grad():
        ms, err = bench._prefill(model, same, ids, reps=1)
        assert set(ms) == {"ptsolve", "mamba_ssm"} and min(ms.values()) > 0 and err == 0
        assert bench._prefill(model, other, ids, reps=1)[1] > 1e-3
        ms, err = bench._decode(model, same, ids, steps=3, rounds=2)
        assert min(ms.values()) > 0 and err == 0
        assert bench._decode(model, other, ids, steps=3, rounds=2)[1] > 1e-3
        # the lead's greedy tokens are transformers' own greedy decode
        st = {"cache": hf.DynamicCache(config=model.config), "logits": []}
        pm.patch(model, tm.TORCH)
        st["logits"].append(model(ids, cache_params=st["cache"], use_cache=True).logits[:, -1])
        toks: list = []
        bench._segment(model, st, toks, 4, lead=True)
        want = pm.unpatch(copy.deepcopy(model)).generate(ids, max_new_tokens=4, do_sample=False)[:, -4:]
    assert torch.equal(torch.cat(toks, 1), want)
