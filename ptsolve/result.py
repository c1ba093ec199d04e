"""Result: what every policy returns (PyJobShop-style: status, objective, bound, gap, runtime)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from .ir import SCHEMA_VERSION, check_schema, loads
from .program import SProgram

STATUSES = ("OPTIMAL", "FEASIBLE", "TIME_LIMIT", "INFEASIBLE")


@dataclass(frozen=True)
class Result:
    """The outcome of scheduling one operator (or graph) with one policy.

    objective: kernel cycles of the busiest SM that the program claims (``simulate`` reproduces it).
    bound: the best proven lower bound on that objective over the tilings searched, cycles (None: none).
    gap: (objective - bound) / objective. predicted_us: objective in µs plus launch overhead.
    tflops: the operator's useful FLOPs over predicted_us. solve_s: wall seconds, tiling search included.
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

    @property
    def gap(self) -> float | None:
        if self.objective is None or self.bound is None or self.objective == 0:
            return None
        return max(0.0, (self.objective - self.bound) / self.objective)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["program"] = self.program.to_dict() if self.program else None
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, s: str) -> Result:
        d = loads(s, "Result")
        check_schema(d, "Result")
        d["program"] = SProgram.from_dict(d["program"]) if d["program"] else None
        d["features"] = tuple(d.get("features", ()))
        return cls(**d)

    def __str__(self) -> str:
        if self.program is None:
            return f"{self.solver}: {self.status} after {self.solve_s:.2f} s"
        gap = f", gap {100 * self.gap:.2f}%" if self.gap is not None else ""
        return (f"{self.solver}: {self.status}, {self.predicted_us:.2f} µs ({self.tflops:.0f} TFLOP/s) on {self.hw}, "
                f"tiling {self.tiling}{gap}, {self.solve_s:.2f} s ({self.solved}/{self.tilings} tilings solved)")
