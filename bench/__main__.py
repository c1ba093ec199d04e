"""``python -m bench <study> [args...]``: run one study (``ptsolve bench <study>`` is the same command);
``python -m bench --list``: the studies, one line each."""
from __future__ import annotations

import importlib
import sys

from bench import STUDIES

USAGE = "usage: python -m bench <study> [args...]   (python -m bench --list: the studies)"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "-l", "--list"):
        if argv[:1] in (["-h"], ["--help"]) or not argv:
            print(USAGE)
        width = max(map(len, STUDIES))
        for name, line in STUDIES.items():
            print(f"{name:<{width}}  {line}")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in STUDIES:
        print(f"bench: no study {name!r}\n{USAGE}", file=sys.stderr)
        return 2
    return int(importlib.import_module(f"bench.{name}").main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
