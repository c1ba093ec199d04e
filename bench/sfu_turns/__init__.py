"""Named-barrier SFU turns between attention warpgroups, on and off.

Results: results/sfu_turns/. ``python -m bench sfu_turns [args...]`` runs ``sfu_turns_ab``; ``python -m bench sfu_turns
<tool> [args...]`` another tool; ``python -m bench sfu_turns --help`` lists the tools.
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="sfu_turns_ab")
