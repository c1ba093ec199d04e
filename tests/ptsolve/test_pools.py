"""ptsolve.pools: results come back as they finish, and no worker outlives the caller."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ptsolve.pools import unordered


def _square(x: int) -> int:
    return x * x


def _alive(pid: int) -> bool:
    try:
        return "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False


@pytest.mark.parametrize("jobs", [1, 2])
def test_every_call_once_with_its_index(jobs: int) -> None:
    got = dict(unordered(_square, [(x,) for x in range(7)], jobs))
    assert got == {x: x * x for x in range(7)}


def test_ctrl_c_ends_the_workers(tmp_path: Path) -> None:
    """SIGINT while the caller waits on two busy workers (ten-minute calls): the caller exits with the interrupt and
    both workers are gone. The workers say they started before the signal, so it lands while both are busy."""
    code = ("import os, sys, time\n"
            "from ptsolve.pools import unordered\n"
            "def busy(ready):\n"
            "    open(os.path.join(ready, str(os.getpid())), 'w').close()\n"
            "    time.sleep(600)\n"
            f"for _ in unordered(busy, [({str(tmp_path)!r},)] * 2, 2):\n"
            "    pass\n")
    root = Path(__file__).resolve().parents[2]
    p = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(root)},
                         stderr=subprocess.PIPE, text=True, preexec_fn=lambda: signal.signal(signal.SIGINT,
                                                                                             signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120  # only a broken pool waits this long; the verdict never depends on it
        while len(list(tmp_path.iterdir())) < 2 and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        workers = [int(f.name) for f in tmp_path.iterdir()]
        assert len(workers) == 2
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=120)
    finally:
        p.kill()
    assert "KeyboardInterrupt" in err
    deadline = time.monotonic() + 60
    while any(_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(w) for w in workers)
