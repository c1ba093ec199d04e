"""ptsolve.torch's custom ops: host overhead, SDPA, a Llama layer, a Mamba2 block.

Results: results/torch_h200/, results/torch_h200.md, results/mamba2_block_h200/. ``python -m bench torch_ops [args...]``
runs ``torch_bench``; ``python -m bench torch_ops <tool> [args...]`` another tool; ``python -m bench torch_ops --help``
lists the tools.
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="torch_bench")
