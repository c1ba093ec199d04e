"""Mamba2's decode step (``mamba2_ssm_step``) in the serving layer: classes by dtype (x, z, B, C and y), head_dim and
d_state; batch, heads, ngroups and the state's dtype (float32, or the activations' dtype: a run-time flag of the same
binary) are kernel arguments. ``ssm_step`` is the launcher ``ptsolve.mamba2_model.recurrent_step`` calls on CUDA
tensors: one launch per token and layer, the state updated in place.

The prepared launch is kept per (class, sizes, strides, flags, dt limits), not per address: a decode step's x, B, C
and dt are fresh tensors every token, so each call writes the ten pointer arguments and launches."""
from __future__ import annotations

from typing import Any

from ptsolve.errors import ShapeError

from . import prepared
from .classes import DTYPES, OpClasses, ShapeClass, register, state_class
from .kernels import kernel

SSM_STEP = "mamba2_ssm_step"
STEP_HEAD_DIMS, STEP_D_STATES = (64,), (64, 128)
_PTRS = ("state", "x", "dt", "A", "B", "C", "D", "z", "dt_bias", "y")
_DTYPES = {"torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float32": "fp32"}
_FLAGS: dict[tuple[Any, ...], int] = {}  # (class, the parameters' dtypes, D's rank, softplus) -> FLAGS


def ssm_step_class(dtype: str, head_dim: int, d_state: int) -> ShapeClass:
    """The decode-step class of a shape (dtype: x's); ShapeError for sizes the table does not cover."""
    return state_class(SSM_STEP, dtype, head_dim, d_state, STEP_HEAD_DIMS, STEP_D_STATES,
                       "ptsolve's decode-step kernels")


# Mamba2-780m's 48 heads at batch 4, float32 state. The class's tiling serves every batch: solved here, it is within
# the model's 10% of each shape's own best from batch 1 (launch-bound: the tiles must be row blocks, not whole (batch,
# head) states, to reach the SMs) to batch 64 (HBM-bound) at 24 to 64 heads; solved at batch 8 and 64 heads it takes
# whole states (PT = 64) and leaves most SMs idle at batch 1
register(SSM_STEP, OpClasses(
    key=lambda c: f"{c.op}/{c.dtype}/p{c.head_dim}/n{c.d_state}",
    representative=lambda c: {"batch": 4, "heads": 48, "head_dim": c.head_dim, "d_state": c.d_state, "groups": 1,
                              "dtype": c.dtype, "state_dtype": "fp32"},
    classes=lambda: [ssm_step_class(d, hd, n) for d in DTYPES for hd in STEP_HEAD_DIMS for n in STEP_D_STATES]))


def _kind(t: Any) -> str:
    return _DTYPES.get(str(t.dtype), str(t.dtype))


def ssm_step_flags(c: ShapeClass, dt: Any, A: Any, D: Any, dt_bias: Any, dt_softplus: bool) -> int:
    """The kernel's FLAGS (codegen.cuda.ssm_step): softplus, a (heads, head_dim) D, and which of dt, A, dt_bias and
    a (heads,) D are float32 (the others in the class's dtype); ShapeError naming a tensor in neither."""
    from codegen.cuda import ssm_step as k

    flags = k.FLAG_SOFTPLUS if dt_softplus else 0
    for name, t, bit in (("dt", dt, k.FLAG_DT32), ("A", A, k.FLAG_A32), ("dt_bias", dt_bias, k.FLAG_BIAS32),
                         ("D", D, k.FLAG_D32)):
        if t is None:
            continue
        kind = _kind(t)
        if name == "D" and t.dim() == 2:
            if kind != "fp32":
                raise ShapeError(f"{SSM_STEP}: a (heads, head_dim) D must be float32, got {t.dtype}; convert it")
            flags |= k.FLAG_D_ROWS
        elif kind == "fp32":
            flags |= bit
        elif kind != c.dtype:
            raise ShapeError(f"{SSM_STEP} (class {c.key}): {name} must be float32 or {c.dtype}, got {t.dtype}")
    return flags


def ssm_step_params(c: ShapeClass, state: Any, x: Any, B: Any) -> dict[str, Any]:
    """The operator parameters of a decode step of class ``c``: state (b, h, p, n) float32 or in the class's dtype,
    x (b, h, p), B (b, g, n); ShapeError naming the tensor otherwise."""
    from ptsolve.ops.ssm_step import validate

    b, h, p, n = state.shape
    sd = _kind(state)
    if sd not in ("fp32", c.dtype) or (p, n) != (c.head_dim, c.d_state) or _kind(x) != c.dtype:
        raise ShapeError(f"{SSM_STEP} (class {c.key}): state must be float32 or {c.dtype} of shape (batch, heads, "
                         f"{c.head_dim}, {c.d_state}) and x {c.dtype}; got state {state.dtype} {tuple(state.shape)}, "
                         f"x {x.dtype}")
    return validate({"batch": b, "heads": h, "head_dim": p, "d_state": n, "groups": B.shape[1], "dtype": c.dtype,
                     "state_dtype": sd})


def ssm_step(state: Any, x: Any, dt: Any, A: Any, B: Any, C: Any, D: Any, z: Any, dt_bias: Any, dt_softplus: bool,
             dt_limit: tuple[float, float], y: Any, c: ShapeClass) -> Any:
    """One decode step with class ``c``'s generic kernel: ``state`` (b, h, p, n) updated in place and y (b, h, p)
    written, contiguous in the class's dtype. The caller (``ptsolve.mamba2_model``) has checked the shapes and the
    layouts the kernel's bulk copies need: state contiguous; x, z (b, h, p) and B, C (b, g, n) contiguous but for
    their batch stride, a multiple of 8 elements; dt (b, h) with dt.stride(1) == 1; A, dt_bias, D contiguous; every
    address 16-byte aligned (dt, A, dt_bias and a (h,) D need not be). Returns y."""
    strides = (x.stride(0), 0 if z is None else z.stride(0), dt.stride(0), B.stride(0), C.stride(0))
    lo, hi = float(dt_limit[0]), float(dt_limit[1])
    # the flags follow from the dtypes (and D's rank): worked out once per combination, a dict lookup per token after
    fk = (c, dt.dtype, A.dtype, None if dt_bias is None else dt_bias.dtype,
          None if D is None else (D.dtype, D.dim()), bool(dt_softplus))
    flags = _FLAGS.get(fk)
    if flags is None:
        flags = _FLAGS[fk] = ssm_step_flags(c, dt, A, D, dt_bias, dt_softplus)
    key = ("ssm_step", c, state.shape, B.shape[1], state.dtype, strides, flags, lo, hi)
    ln = prepared.LAUNCHES.get(key)
    if ln is None:
        ln = prepared.keep(key, _ssm_step_launch(state, x, B, strides, flags, lo, hi, c))
    p = ln.ptrs
    for name, t in zip(_PTRS[:-1], (state, x, dt, A, B, C, D, z, dt_bias)):
        p[name].value = 0 if t is None else t.data_ptr()
    ln(prepared.current_stream(x.get_device()), y.data_ptr())
    return y


def _ssm_step_launch(state: Any, x: Any, B: Any, strides: tuple[int, ...], flags: int, lo: float, hi: float,
                     c: ShapeClass) -> Any:
    from codegen.cuda.ssm_step import maps, sizes

    p = ssm_step_params(c, state, x, B)
    ck = kernel(c)
    sz = sizes(p, ck.ir.tiling)
    if sz["NTILES"] >= 1 << 31 or any(s >= 1 << 31 for s in strides):
        raise ShapeError(f"{SSM_STEP}: {sz['NTILES']} tiles or batch strides {strides} beyond 32-bit kernel "
                         "arguments; split the batch")
    vals = dict.fromkeys(_PTRS, 0) | dict(zip(("SX", "SZ", "SDT", "SB", "SC"), strides)) | sz | {
        "FLAGS": flags, "DT_LO": lo, "DT_HI": hi}  # float32 arguments: an infinite limit stays infinite
    return ck.prepare(vals, maps(p, ck.ir.tiling), sz["NTILES"], out="y")
