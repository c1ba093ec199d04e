"""The serving layer's exact-shape schedules (ptsolve.serve.exact) against the shape classes' and the peers'.

``python -m bench exact_ab prepare`` (CPU, nvcc + OR-Tools) solves and compiles every shape's exact-shape kernel into
``$PTSOLVE_CACHE_DIR`` (the class kernels too); ``python -m bench exact_ab run --out FILE`` (GPU) times, per shape,
the class's kernel, the exact-shape one through the same launcher, and cuBLAS or SDPA (cuDNN, flash), after checking
each output against float32.
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="exact_ab")
