"""A content-hashed schedule cache in SQLite (stdlib), safe with concurrent processes.

Key: sha256 of the operator or graph JSON, the hardware table, the solver settings, the cost model's
grain, the ptsolve version and a fingerprint of ptsolve's own source (so a changed builder, cost model or
policy never serves a stale schedule). A deterministic search's settings include its time limit (ptsolve.optimize):
its result is what that budget returns, so ``get``'s serving of a wall-clock result to a smaller limit (or of a
proven one to any) does not apply to it. Location: ``$PTSOLVE_CACHE_DIR/schedules.sqlite`` (default
``~/.cache/ptsolve``). ``PTSOLVE_CACHE=0`` turns it off.

Every row carries the cache's schema version and the sha256 of its result: a row that fails either, or does not
parse as a Result, is dropped and solved again; a file that is not a readable SQLite database is set aside
(``schedules.sqlite.corrupt``) and rebuilt, with one warning; a cache folder that cannot be written is a
CacheError naming the path and PTSOLVE_CACHE=0.
"""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

from . import arguments
from .errors import CacheError, PtsolveError
from .result import Result

CACHE_SCHEMA = 2  # rows: key, time_limit, result JSON, sha256 of that JSON, this version


class CacheWarning(UserWarning):
    """The schedule cache repaired itself (a corrupt file or row); the result is solved again."""


def cache_dir() -> Path:
    d = os.environ.get("PTSOLVE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "ptsolve")
    return Path(d)


def path() -> Path:
    return cache_dir() / "schedules.sqlite"


def enabled() -> bool:
    """PTSOLVE_CACHE (default on); ConfigError for a value that is not a boolean."""
    return arguments.env_flag("PTSOLVE_CACHE", True)


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


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _open(f: Path) -> sqlite3.Connection:
    c = sqlite3.connect(f, timeout=30, isolation_level=None)
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("CREATE TABLE IF NOT EXISTS results_v2 (key TEXT PRIMARY KEY, time_limit REAL, result TEXT, "
              "sha256 TEXT, schema INTEGER)")
    return c


@contextmanager
def _connect() -> Iterator[sqlite3.Connection]:
    """The cache database, rebuilt once if it is corrupt; CacheError if its folder cannot be used."""
    f = path()
    try:
        f.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CacheError(f"schedule cache {f} cannot be used ({e.strerror or e}); set PTSOLVE_CACHE_DIR to a "
                         "writable folder or PTSOLVE_CACHE=0 to run without it") from e
    try:
        c = _open(f)
    except sqlite3.DatabaseError as e:
        c = _rebuild(f, e)
    try:
        yield c
    finally:
        c.close()


def _rebuild(f: Path, why: Exception) -> sqlite3.Connection:
    if isinstance(why, sqlite3.OperationalError) and not f.exists():
        raise CacheError(f"schedule cache {f} cannot be used ({why}); set PTSOLVE_CACHE_DIR to a writable folder "
                         "or PTSOLVE_CACHE=0 to run without it") from why
    bad = f.with_name(f.name + ".corrupt")
    try:
        for x in (f, f.with_name(f.name + "-wal"), f.with_name(f.name + "-shm")):
            if x.exists():
                os.replace(x, bad if x == f else x.with_name(x.name + ".corrupt"))
        c = _open(f)
    except (OSError, sqlite3.DatabaseError) as e:
        raise CacheError(f"schedule cache {f} is corrupt ({why}) and cannot be rebuilt ({e}); delete it, or set "
                         "PTSOLVE_CACHE=0 to run without it") from e
    warnings.warn(f"schedule cache {f} was corrupt ({why}); moved it to {bad} and started an empty one",
                  CacheWarning, stacklevel=4)
    return c


def get(k: str, time_limit: float) -> Result | None:
    """The cached result under ``k``, unless it was cut short by a smaller time limit than asked now, or its row
    fails its checks (then it is dropped, with a warning, and the caller solves again)."""
    if not enabled():
        return None
    with _connect() as c:
        try:
            row = c.execute("SELECT time_limit, result, sha256, schema FROM results_v2 WHERE key = ?", (k,)).fetchone()
        except sqlite3.DatabaseError as e:
            c.close()
            _rebuild(path(), e).close()
            return None
        if row is None:
            return None
        tl, text, digest, schema = row
        why = ("written by another cache version" if schema != CACHE_SCHEMA else
               "its content does not match its hash" if not isinstance(text, str) or _digest(text) != digest else None)
        r = None
        if why is None:
            try:
                r = Result.from_json(text)
            except PtsolveError as e:
                why = str(e)
        if why is not None:
            c.execute("DELETE FROM results_v2 WHERE key = ?", (k,))
            warnings.warn(f"schedule cache {path()}: dropped a row ({why}); solving again", CacheWarning, stacklevel=2)
            return None
    if r.status == "TIME_LIMIT" and time_limit > tl:
        return None
    return r


def put(k: str, time_limit: float, r: Result) -> None:
    """Store ``r`` atomically (one statement in its own transaction; the last writer wins)."""
    if not enabled():
        return
    text = r.to_json()
    with _connect() as c:
        try:
            c.execute("INSERT OR REPLACE INTO results_v2 VALUES (?, ?, ?, ?, ?)",
                      (k, time_limit, text, _digest(text), CACHE_SCHEMA))
        except sqlite3.DatabaseError as e:
            raise CacheError(f"schedule cache {path()} cannot be written ({e}); free the disk or set PTSOLVE_CACHE=0 "
                             "to run without it") from e
