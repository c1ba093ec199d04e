"""Result: what every policy returns (PyJobShop-style: status, objective, bound, gap, runtime)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .errors import SchemaError
from .ir import SCHEMA_VERSION, check_schema, loads
from .program import SProgram

STATUSES = ("OPTIMAL", "FEASIBLE", "TIME_LIMIT", "INFEASIBLE")
_N = type(None)
# what each field of a Result's JSON may hold (an int is a number; true/false is not)
FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "program": (dict, _N), "solver": (str,), "status": (str,), "objective": (int, _N), "bound": (int, _N),
    "solve_s": (int, float), "predicted_us": (int, float, _N), "tflops": (int, float, _N), "hw": (str,),
    "tiling": (dict,), "tilings": (int,), "solved": (int,), "features": (list,), "cached": (bool,),
    "provenance": (dict,), "schema": (int,), "kernel_check": (dict, _N), "rejected": (list,),
    "measured_us": (int, float, _N), "measured": (list,)}
OPTIONAL = {"cached", "provenance", "kernel_check", "rejected", "measured_us", "measured"}  # older files lack them


@dataclass(frozen=True)
class Result:
    """The outcome of scheduling one operator (or graph) with one policy.

    objective: kernel cycles of the busiest SM that the program claims (``simulate`` reproduces it).
    bound: the best proven lower bound on that objective over the tilings searched, cycles (None: none).
    gap: (objective - bound) / objective. predicted_us: objective in µs plus launch overhead.
    tflops: the operator's useful FLOPs over predicted_us. solve_s: wall seconds, tiling search included, of the
    search that produced it (``cached``: an earlier one, on ``provenance["date"]``).
    """

    program: SProgram | None
    solver: str
    status: str
    objective: int | None
    bound: int | None
    solve_s: float
    predicted_us: float | None
    tflops: float | None
    hw: str
    tiling: dict[str, int] = field(default_factory=dict)
    tilings: int = 0          # candidate tilings that fit the EU
    solved: int = 0           # tilings given to the policy (the rest were pruned by their lower bound)
    features: tuple[str, ...] = ()
    cached: bool = False
    provenance: dict[str, str] = field(default_factory=dict)  # date, commit, ptsolve version, machine
    schema: int = SCHEMA_VERSION
    # the compiler in the loop (ptsolve.kernelcheck): the verdict on this schedule's kernel, and the tilings whose
    # better-predicted schedules the compiler rejected on the way, with why
    kernel_check: dict[str, Any] | None = None
    rejected: tuple[tuple[dict[str, int], str], ...] = ()
    # measured selection (ptsolve.tune): this kernel's measured time, µs, and every timed candidate's
    measured_us: float | None = None
    measured: tuple[dict[str, Any], ...] = ()

    @property
    def gap(self) -> float | None:
        if self.objective is None or self.bound is None or self.objective == 0:
            return None
        return max(0.0, (self.objective - self.bound) / self.objective)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["program"] = self.program.to_dict() if self.program else None
        d["gap"] = self.gap  # saved for readers of the file; derived, so from_json drops it
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, s: str) -> Result:
        d = loads(s, "Result")
        check_schema(d, "Result")
        d.pop("gap", None)
        names = {f.name for f in fields(cls)}
        missing, extra = sorted(names - set(d) - OPTIONAL), sorted(set(d) - names)
        if missing or extra:
            raise SchemaError(f"Result JSON: missing fields {missing}, unknown fields {extra}; is this a Result? "
                              "Write one with Result.to_json()")
        if d["status"] not in STATUSES:
            raise SchemaError(f"Result JSON: status {d['status']!r} is not one of {STATUSES}")
        for k, kinds in FIELD_TYPES.items():  # a value of the wrong kind is refused here, not used later
            if k in d and not (isinstance(d[k], kinds) and not (isinstance(d[k], bool) and bool not in kinds)):
                want = " or ".join("null" if t is type(None) else {"int": "a whole number", "float": "a number",
                                                                   "str": "a string", "dict": "an object",
                                                                   "list": "an array", "bool": "true or false"}
                                   [t.__name__] for t in kinds)
                raise SchemaError(f"Result JSON: field {k!r} must be {want}, got {d[k]!r}")
        try:
            d["program"] = SProgram.from_dict(d["program"]) if d["program"] else None
            d["features"] = tuple(d["features"])
            d["rejected"] = tuple((dict(t), str(w)) for t, w in d.get("rejected", ()))
            d["measured"] = tuple(d.get("measured", ()))
            return cls(**d)
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            if isinstance(e, SchemaError):
                raise
            raise SchemaError(f"Result JSON is malformed: {e!r}; write it with Result.to_json()") from e

    def label(self) -> str:
        """Status, gap and bound in words: what the result proves."""
        if self.objective is None:
            return self.status
        if self.status == "OPTIMAL":
            return "OPTIMAL (proven: gap 0%)"
        if self.bound is None:
            return f"{self.status} (no lower bound)"
        return f"{self.status} (gap {100 * (self.gap or 0):.2f}%, bound {self.bound} cycles)"

    def timing(self) -> str:
        """How long the search took, or, for a cache hit, when and how long the original search took."""
        if self.cached:
            return f"from cache (solved on {self.provenance.get('date', 'an unknown date')} in {self.solve_s:.2f} s)"
        return f"{self.solve_s:.2f} s"

    def __str__(self) -> str:
        if self.program is None:
            return f"{self.solver}: {self.status}, {self.timing()}"
        return (f"{self.solver}: {self.label()}, {self.predicted_us:.2f} µs ({self.tflops:.0f} TFLOP/s) on {self.hw}, "
                f"tiling {self.tiling}, {self.timing()} ({self.solved}/{self.tilings} tilings solved)"
                + (f"; measured {self.measured_us:.2f} µs" if self.measured_us is not None else "")
                + (f"; kernel {self.kernel_summary()}" if self.kernel_check else ""))

    def kernel_summary(self) -> str:
        """The compiler's verdict in words (and how many tilings it rejected on the way)."""
        k = self.kernel_check or {}
        what = k.get("status", "not compile-checked")
        if what == "ok":
            # in the target's words: AMD's matrix cores have no wgmma (older files name no target: NVIDIA's)
            mma = {"gfx942": "MFMA"}.get(k.get("target", ""), "wgmma pipelined")
            what = f"compile-checked ({k.get('registers')} registers, no spills, {mma})"
            if self.program.registers:
                what += "; ptxas, not the model's register estimate, fit this tiling"
        elif k.get("reason"):
            what = f"{what} ({k['reason']})"
        # optimize rejects only tilings predicted better than its answer; tune's walk (measured) rejects any it met
        kind = "tiling(s) met while collecting the candidates" if self.measured else "better-predicted tiling(s)"
        return what + (f", {len(self.rejected)} {kind} rejected by the compiler" if self.rejected else "")
