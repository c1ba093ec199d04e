"""A content-hashed schedule cache in SQLite (stdlib), safe with concurrent processes.

Key: sha256 of the operator or graph JSON, the hardware table, the solver settings, the cost model's
grain, the ptsolve version and a fingerprint of ptsolve's own source (so a changed builder, cost model or
policy never serves a stale schedule). Location: ``$PTSOLVE_CACHE_DIR/schedules.sqlite`` (default
``~/.cache/ptsolve``). ``PTSOLVE_CACHE=0`` turns it off.
"""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from functools import lru_cache
from pathlib import Path
from typing import Any

from .result import Result


def cache_dir() -> Path:
    d = os.environ.get("PTSOLVE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "ptsolve")
    return Path(d)


def enabled() -> bool:
    return os.environ.get("PTSOLVE_CACHE", "1") not in ("0", "false", "no")


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """sha256 of every .py and .json file of the ptsolve package, in sorted order."""
    h = hashlib.sha256()
    root = Path(__file__).parent
    for f in sorted(root.rglob("*")):
        if f.suffix in (".py", ".json") and "__pycache__" not in f.parts:
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def key(*parts: Any) -> str:
    """sha256 over the JSON of ``parts`` and the code fingerprint (sorted keys: same content, same key)."""
    return hashlib.sha256(json.dumps([parts, code_fingerprint()], sort_keys=True, default=str).encode()).hexdigest()


def _connect() -> sqlite3.Connection:
    d = cache_dir()
    d.mkdir(parents=True, exist_ok=True)
    c = sqlite3.connect(d / "schedules.sqlite", timeout=30, isolation_level=None)
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY, time_limit REAL, result TEXT)")
    return c


def get(k: str, time_limit: float) -> Result | None:
    """The cached result under ``k``, unless it was cut short by a smaller time limit than asked now."""
    if not enabled():
        return None
    with _connect() as c:
        row = c.execute("SELECT time_limit, result FROM results WHERE key = ?", (k,)).fetchone()
    if row is None:
        return None
    r = Result.from_json(row[1])
    if r.status == "TIME_LIMIT" and time_limit > row[0]:
        return None
    return r


def put(k: str, time_limit: float, r: Result) -> None:
    """Store ``r`` atomically (one statement in its own transaction; the last writer wins)."""
    if not enabled():
        return
    with _connect() as c:
        c.execute("INSERT OR REPLACE INTO results VALUES (?, ?, ?)", (k, time_limit, r.to_json()))
