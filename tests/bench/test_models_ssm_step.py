"""bench/models/ssm_step.py on the CPU: its rows cover Mamba2-130m to 2.7b heads at batch 1 to 64, --rows is checked,
and its roofline is the float32 state read and written once. Its GPU run: device.sh's ssm_step step."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.models import ssm_step as bench

ROOT = Path(__file__).resolve().parents[2]


def test_rows_cover_the_models_and_batches():
    assert {bench.MODELS[m] for m, _ in bench.ROWS.values()} == {24, 32, 48, 64, 80}
    assert {b for _, b in bench.ROWS.values()} == {1, 8, 64}
    assert len(bench.ROWS) == 15


def test_unknown_row_is_refused():
    got = subprocess.run([sys.executable, "-m", "bench", "models", "ssm_step", "--out", "/dev/null", "--rows", "9b"],
                         cwd=ROOT, capture_output=True, text=True)
    assert got.returncode != 0 and "no row '9b'" in got.stderr
