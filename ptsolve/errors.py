"""The PtsolveError family: every error a user can cause says what was wrong and how to fix it."""
from __future__ import annotations


class PtsolveError(Exception):
    """Base class of every error ptsolve raises on purpose."""


class ShapeError(PtsolveError, ValueError):
    """A dimension is zero, negative, or does not fit the operator or the hardware."""


class GraphError(PtsolveError, ValueError):
    """An sTask-graph is malformed (unknown task, zero-distance cycle, duplicate name)."""


class SchemaError(PtsolveError, ValueError):
    """JSON that is malformed or written by an incompatible schema version."""


class HardwareError(PtsolveError, ValueError):
    """Unknown hardware name or a malformed hardware table."""


class InfeasibleError(PtsolveError):
    """No schedule or tiling satisfies the constraints; the message names the constraint."""


class SolverError(PtsolveError):
    """Unknown solver, bad solver option, or a solver back-end that is not installed."""


class CodegenError(PtsolveError):
    """A program the code generator cannot emit, or a value unsafe to place in source."""


class UnsupportedOperatorError(CodegenError):
    """The code generator builds no schedule of these operator parameters (a head_dim, dtype or size it lacks),
    whatever the tiling: the compiler in the loop stops asking (ptsolve.kernelcheck's scope "operator")."""


class DeviceError(PtsolveError, RuntimeError):
    """No GPU, the wrong architecture, or a launch for a shape the kernel was not built for."""


class ConfigError(PtsolveError, ValueError):
    """A PTSOLVE_* environment variable or a CLI option with a value ptsolve cannot use."""


class CacheError(PtsolveError):
    """The schedule cache cannot be used (its folder is not writable, or it cannot be rebuilt)."""
