"""Files at the boundary: JSON a user names is read with one-line errors that name the file, and whatever ptsolve
writes lands whole or not at all (a full disk or a missing permission leaves the old file, never half a new one)."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from .errors import ConfigError, PtsolveError, SchemaError


def read_json(path: str | os.PathLike[str], what: str, kind: type = dict,
              error: type[PtsolveError] | None = None) -> Any:
    """The JSON document in ``path`` (``what`` it should be, for the message), which must be a ``kind`` (dict or
    list). ConfigError when the file cannot be read, SchemaError when it is not such a document; ``error``, when
    given, for both (a hardware table's HardwareError)."""
    p = Path(path)
    unreadable, malformed = error or ConfigError, error or SchemaError
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise unreadable(f"{what} {str(p)!r} does not exist") from None
    except IsADirectoryError:
        raise unreadable(f"{what} {str(p)!r} is a folder; name the file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise unreadable(f"{what} {str(p)!r} cannot be read ({getattr(e, 'strerror', None) or e})") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise malformed(f"{what} {str(p)!r} is not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}); "
                        "is it truncated?") from None
    if not isinstance(doc, kind):
        raise malformed(f"{what} {str(p)!r}: expected a JSON {'object' if kind is dict else 'array'}, got "
                        f"a {type(doc).__name__}")
    return doc


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename: readers see the old file
    or the new one, never a part. ConfigError (the old file intact, no temporary left) when the disk is full or
    the folder is not writable."""
    p = Path(path)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, p)
        tmp = None
    except OSError as e:
        raise ConfigError(f"cannot write {str(p)!r}: {e.strerror or e}; free space or pick another --out") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return p
