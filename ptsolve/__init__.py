"""ptsolve: exact pipeline schedules for GPU kernels, checked by simulation and on the GPU."""
from __future__ import annotations

from . import hw, ops
from .errors import PtsolveError
from .ir import Buffer, Edge, STask, STaskGraph
from .optimize import optimize
from .program import Barrier, SProgram
from .result import Result
from .simulate import Timeline, simulate
from .validate import Validity, check_valid

__version__ = "0.1.0"

__all__ = ["Barrier", "Buffer", "Edge", "PtsolveError", "SProgram", "STask", "STaskGraph", "Timeline", "Validity",
           "Result", "check_valid", "hw", "ops", "optimize", "simulate", "__version__"]
