"""Shared fixtures. GPU tests are marked ``gpu`` and deselected by default (pyproject addopts);
run them on the GPU machine with ``pytest -m gpu``."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
# the test folders mirror the packages; a test reuses another's fixtures by module name (names are unique)
for _d in sorted(p for p in Path(__file__).resolve().parent.rglob("*") if p.is_dir() and p.name != "data"
                 and "data" not in p.parts and not p.name.startswith((".", "__"))):
    sys.path.insert(1, str(_d))


# the caller's cache (a GPU run's carried cubins), read before any test replaces the variable
_CALLER_CUBINS = Path(os.environ["PTSOLVE_CACHE_DIR"]) / "cubin" if os.environ.get("PTSOLVE_CACHE_DIR") else None


@pytest.fixture(autouse=True)
def _isolated_cache(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test gets its own schedule cache so results never leak between tests, and its own default output
    folder (the CLI's ~/ptsolve-out). A GPU test whose caller set PTSOLVE_CACHE_DIR shares that cache's cubins
    (content-addressed by source and flags, so nothing a test decides leaks through them): the kernels compiled on
    the CPU machine and carried are loaded, not compiled again on the GPU machine."""
    cache = tmp_path_factory.mktemp("cache")
    if _CALLER_CUBINS is not None and _CALLER_CUBINS.is_dir() and request.node.get_closest_marker("gpu"):
        (cache / "cubin").symlink_to(_CALLER_CUBINS, target_is_directory=True)
    monkeypatch.setenv("PTSOLVE_CACHE_DIR", str(cache))
    monkeypatch.setenv("PTSOLVE_OUT_DIR", str(tmp_path_factory.mktemp("out")))
    # the compiler in the loop costs seconds per schedule: tests that are about it switch it on themselves
    monkeypatch.setenv("PTSOLVE_COMPILE_CHECK", "0")
    os.environ.pop("PTSOLVE_CALIBRATION_DIR", None)


@pytest.fixture(scope="module")
def torch():
    """torch on an H100/H200: the GPU tests' (skipped where there is none, ``hopper.require_hopper``)."""
    from hopper import require_hopper
    return require_hopper()


@pytest.fixture(scope="module")
def pt(torch):
    """``ptsolve.torch`` on an H100/H200 (tests/serve/test_torch_cpu.py has its own, without a GPU)."""
    import ptsolve.torch as pt
    return pt
