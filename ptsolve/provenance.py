"""Where and when a result was produced: date (UTC), git commit of this checkout, ptsolve version, machine."""
from __future__ import annotations

import datetime
import os
import platform
import subprocess
from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=1)
def _commit() -> str:
    here = Path(__file__).parent
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=here,
                                check=False, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=here, check=False, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (commit + ("+dirty" if dirty else "")) if commit else "unknown (not a git checkout)"


def stamp() -> dict[str, str]:
    """{"date", "commit", "ptsolve", "machine"} for the record of a result."""
    from . import __version__
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": _commit(), "ptsolve": __version__,
            "machine": f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}"}
