"""The GPU tests' gate: skip (never fail) where the generated sm_90a kernels cannot run."""
from __future__ import annotations

from typing import Any

import pytest


def require_hopper() -> Any:
    """torch, if this machine has torch, cuda-python and an sm_90 GPU (H100/H200); else skip the test."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("cuda.bindings")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("generated kernels need sm_90 (H100/H200)")
    return torch
