"""Helpers of the operator builders: parameter checks, buffers and tasks. The vocabulary every layer shares (the
tiling's facts, the operator registry, the hardware budgets) lives in ptsolve.tiling, ptsolve.opspec and ptsolve.hw;
it is re-exported here for the builders and for code written against this module."""
from __future__ import annotations

from typing import Any

from ..errors import ShapeError
from ..hw import sms_of
from ..ir import Buffer, STask
from ..opspec import REGISTRY, Operator, OpSpec, TextbookPlan, make, register
from ..tiling import Tiling, cdiv

__all__ = ["MMA_K", "REGISTRY", "WG_ROWS", "OpSpec", "Operator", "TextbookPlan", "Tiling", "cdiv", "check_keys",
           "dtype_ok", "make", "positive", "reg", "register", "smem", "sms_of", "task"]

# rows of one wgmma instruction and its K step (fp16/bf16): warpgroup tiles come in these units
WG_ROWS = 64
MMA_K = 16


def positive(**dims: int) -> None:
    """Raise ShapeError naming the first dimension that is not a positive integer."""
    for k, v in dims.items():
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ShapeError(f"{k} must be a positive integer, got {v!r}")


def check_keys(op: str, p: dict[str, Any], required: tuple[str, ...], defaults: dict[str, Any]) -> dict[str, Any]:
    """Fill ``defaults``; raise ShapeError naming missing and unknown parameters."""
    p = {**defaults, **p}
    missing = [k for k in required if k not in p]
    unknown = sorted(set(p) - set(required) - set(defaults))
    if missing or unknown:
        what = ([f"missing {', '.join(missing)}"] if missing else []) + ([f"unknown {', '.join(unknown)}"] if unknown
                                                                          else [])
        raise ShapeError(f"{op}: {'; '.join(what)} (parameters: {', '.join(required)}"
                         + (f"; optional: {', '.join(defaults)}" if defaults else "") + ")")
    return p


def dtype_ok(dtype: str) -> None:
    if dtype not in ("fp16", "bf16"):
        raise ShapeError(f"dtype {dtype!r} is not supported; use 'fp16' or 'bf16'")


def smem(name: str, nbytes: int) -> Buffer:
    return Buffer(name, "smem", int(nbytes))


def reg(name: str, nbytes: int) -> Buffer:
    return Buffer(name, "reg", int(nbytes))


def task(name: str, kind: str, **kw: Any) -> STask:
    return STask(name=name, kind=kind, **kw)
