"""GEMM in the serving layer: one class per dtype and C epilogue (M, N and K are kernel arguments) and its launcher."""
from __future__ import annotations

from typing import Any

from . import exact, prepared
from .classes import DTYPES, OpClasses, ShapeClass, dtype_ok, register
from .kernels import kernel

# the epilogue of the class whose kernel stores C from registers: C's rows need no 16-byte pitch (N any), where the
# TMA store the plain class's schedule takes needs N a multiple of 8
REGS = "regs"


def gemm_class(dtype: str, n: int = 0) -> ShapeClass:
    """The GEMM class of a dtype for an output of ``n`` columns (0: any multiple of 8); ShapeError for a dtype the
    kernels do not take. N not a multiple of 8 gets the register-store class (``.../regs``)."""
    dtype_ok(dtype)
    return ShapeClass("gemm", dtype, epilogue=REGS if n % 8 else "")


def _fix(c: ShapeClass) -> dict[str, int]:
    # one K range: one generic kernel serves every M, N, K, and split-K's workspace is sized per shape; the
    # register-store class pins the TMA store off
    return {"splits": 1} | ({"tma_store": 0} if c.epilogue == REGS else {})


register("gemm", OpClasses(key=lambda c: f"gemm/{c.dtype}" + (f"/{c.epilogue}" if c.epilogue else ""),
                           representative=lambda c: {"M": 4096, "N": 4096, "K": 4096, "dtype": c.dtype},
                           classes=lambda: [gemm_class(d, n) for d in DTYPES for n in (0, 1)], fix=_fix))


def gemm(a: Any, b: Any, out: Any, c: ShapeClass) -> None:
    """Launch ``c``'s kernel: out [M, N] (contiguous) = a [M, K] · b [N, K]ᵀ (rows contiguous, row strides
    multiples of 8 elements; the caller checks)."""
    gemm_launch(a, b, c)(prepared.current_stream(a.get_device()), out.data_ptr())


def gemm_launch(a: Any, b: Any, c: ShapeClass) -> Any:
    """The prepared launch of ``gemm`` for these inputs; call it with the stream and the output's address."""
    key = ("gemm", c, a.data_ptr(), b.data_ptr(), a.shape, a.stride(), b.shape, b.stride())
    ln = prepared.LAUNCHES.get(key)
    if ln is not None:
        return ln
    params = {"M": a.shape[0], "N": b.shape[0], "K": a.shape[1], "dtype": c.dtype}
    ck, final = exact.serving(c, params, lambda x: _gemm_launch(a, b, c, x),
                              lambda: a.new_empty(a.shape[0], b.shape[0]))
    return prepared.keep(key, _gemm_launch(a, b, c, ck or kernel(c)), final)


def _gemm_launch(a: Any, b: Any, c: ShapeClass, ck: Any) -> Any:
    from codegen.cuda.common import TensorMapSpec
    from codegen.cuda.gemm import c_map, sizes
    from ptsolve.geometry.gemm import a_rows
    from ptsolve.tiling import cluster_of

    t = ck.ir.tiling
    (M, K), N = a.shape, b.shape[0]
    # the boxes the kernel's loads expect: an exact-shape kernel loads only A's rows up to M (``a_rows``), a generic one
    # the whole tile; a cluster's CTA its share of B's
    rows = t["BM"] if ck.ks.generic else a_rows(M, t["BM"])
    maps = (TensorMapSpec("a", c.dtype, (K, M), (a.stride(0) * 2,), (64, rows)),
            TensorMapSpec("b", c.dtype, (K, N), (b.stride(0) * 2,), (64, t["BN"] // cluster_of(t))))
    if t.get("tma_store", 0):  # C [M, N], contiguous (the caller's new tensor), through its map: encoded per call
        maps += (c_map(c.dtype, M, N, t),)
    sz = sizes({"M": M, "N": N, "K": K}, t)
    vals = {"a": a.data_ptr(), "b": b.data_ptr(), "c": 0, **sz}
    return ck.prepare(vals, maps, sz["NTILES"], out="c")
