"""Compile generated kernels with nvcc (cached cubins) and launch them through cuda-python: the launch primitive
(``Loaded.launch``, ``Loaded.prepare`` → ``Launch``) that the kernel harness (``codegen.harness``) and the serving
layer (``ptsolve.serve``) build on.

``torch`` and ``cuda.bindings`` are imported inside functions only, so ``import codegen`` works on a
machine with neither (CI compiles kernels there without a GPU).
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ptsolve.errors import CodegenError, DeviceError, ShapeError

from .cuda.common import KernelSource, persistent_grid

_REPORT_RE = {
    "registers": re.compile(r"Used (\d+) registers"),
    "stack_bytes": re.compile(r"(\d+) bytes stack frame"),
    "spill_stores": re.compile(r"(\d+) bytes spill stores"),
    "spill_loads": re.compile(r"(\d+) bytes spill loads"),
    "smem_static": re.compile(r"(\d+) bytes smem"),
}


def cache_dir() -> Path:
    """``$PTSOLVE_CACHE_DIR`` or ``~/.cache/ptsolve``; cubins live under ``cubin/``."""
    return Path(os.environ.get("PTSOLVE_CACHE_DIR", Path.home() / ".cache" / "ptsolve")) / "cubin"


def nvcc_path() -> str:
    """The nvcc binary (``$NVCC``, PATH, or /usr/local/cuda/bin/nvcc); CodegenError if none."""
    for cand in (os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and Path(cand).exists():
            return cand
    raise CodegenError("nvcc not found: install the CUDA toolkit (12.3+) or set $NVCC")


def parse_ptxas(text: str) -> dict[str, Any]:
    """Registers, stack frame, spill stores/loads (bytes) and static smem (bytes) from ``-Xptxas -v``
    output, plus any ptxas warnings (e.g. wgmma serialisation, ignored setmaxnreg)."""
    out: dict[str, Any] = {}
    for key, rx in _REPORT_RE.items():
        vals = [int(v) for v in rx.findall(text)]
        out[key] = max(vals) if vals else 0
    out["warnings"] = [ln.strip() for ln in text.splitlines()
                       if "warning" in ln.lower() or "Performance Loss" in ln or "(C75" in ln]
    out["wgmma_serialized"] = any("serialized" in w for w in out["warnings"])
    return out


@dataclass(frozen=True)
class Compiled:
    """A compiled kernel: the cubin bytes, its cache path and the parsed ptxas report."""

    kernel: KernelSource
    cubin: bytes
    path: Path
    report: dict[str, Any] = field(default_factory=dict)


def _key(ks: KernelSource, extra: tuple[str, ...] = ()) -> str:
    return hashlib.sha256((ks.source + "\0" + " ".join(ks.flags + extra)).encode()).hexdigest()


class NvccError(CodegenError):
    """nvcc exited non-zero; ``returncode`` is its exit status (negative: killed by a signal)."""

    def __init__(self, message: str, returncode: int) -> None:
        super().__init__(message)
        self.returncode = returncode

    def __reduce__(self) -> tuple[Any, tuple[str, int]]:  # crosses process pools whole
        return type(self), (str(self), self.returncode)


NVCC_RUNS = [0]  # nvcc invocations of this process (a warm cubin cache keeps it at 0: tests and drivers read it)


def _nvcc(ks: KernelSource, out_flag: str, out: Path, extra: tuple[str, ...] = ()) -> str:
    NVCC_RUNS[0] += 1
    with tempfile.TemporaryDirectory(prefix="ptsolve_") as td:
        src = Path(td) / f"{ks.name}.cu"
        src.write_text(ks.source)
        cmd = [nvcc_path(), *ks.flags, *extra, out_flag, "-o", str(out), str(src)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            raise NvccError(f"nvcc failed for {ks.name} (exit {r.returncode}):\n{r.stderr[-4000:]}", r.returncode)
        return r.stdout + r.stderr


def _nvcc_stamp() -> str:
    """The nvcc a recorded failure came from (path, size, modification time): another toolkit compiles again."""
    path = Path(nvcc_path()).resolve()
    st = path.stat()
    return f"{path} {st.st_size} {st.st_mtime_ns}"


def compile_kernel(ks: KernelSource, cache: bool = True) -> Compiled:
    """nvcc → cubin for sm_90a, cached under cache_dir() by sha256(source + flags). A compile nvcc refused with an
    exit status is recorded beside (``<key>.failed``, with the nvcc it came from) and raises the same NvccError
    again without running nvcc; ``cache=False`` compiles anew."""
    d = cache_dir()
    d.mkdir(parents=True, exist_ok=True)
    key = _key(ks)
    cubin, rep = d / f"{key}.cubin", d / f"{key}.json"
    if cache and cubin.exists() and rep.exists():
        return Compiled(ks, cubin.read_bytes(), cubin, json.loads(rep.read_text()))
    failed = d / f"{key}.failed"
    if cache and failed.exists():  # the same source, flags and nvcc failed before: the same error, no second run
        rec = json.loads(failed.read_text())
        if rec.get("nvcc") == _nvcc_stamp():
            raise NvccError(rec["error"], rec["returncode"])
    tmp = d / f"{key}.{os.getpid()}.{threading.get_ident()}.tmp"  # threads of one process compile too
    try:
        log = _nvcc(ks, "-cubin", tmp)
    except NvccError as e:
        # an exit status is the compiler's verdict on this source (ptxas out of registers, say); a signal is the
        # machine's (killed, out of memory) and is not kept
        if e.returncode > 0:
            failed.write_text(json.dumps({"error": str(e), "returncode": e.returncode, "nvcc": _nvcc_stamp()}))
        raise
    report = parse_ptxas(log) | {"log": log[-4000:]}
    rep.write_text(json.dumps(report))
    os.replace(tmp, cubin)  # atomic: concurrent compiles of the same key never see half a file
    return Compiled(ks, cubin.read_bytes(), cubin, report)


def ptx_text(ks: KernelSource) -> str:
    """The PTX nvcc generates for ``ks`` (used by tests to look for wgmma / cp.async.bulk.tensor)."""
    with tempfile.TemporaryDirectory(prefix="ptsolve_") as td:
        out = Path(td) / "k.ptx"
        flags = tuple(f for f in ks.flags if f not in ("-Xptxas", "-v"))
        _nvcc(KernelSource(**{**ks.__dict__, "flags": flags}), "-ptx", out)
        return out.read_text()


# ---------------------------------------------------------------------------------------------- device


def _drv():
    try:
        from cuda.bindings import driver
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise DeviceError("cuda-python (cuda.bindings) is not installed; pip install cuda-python") from e
    return driver


def _check(res: Any, what: str) -> Any:
    driver = _drv()
    err, *rest = res if isinstance(res, tuple) else (res,)
    if err != driver.CUresult.CUDA_SUCCESS:
        _, msg = driver.cuGetErrorString(err)
        raise DeviceError(f"{what} failed: {err} ({msg.decode() if isinstance(msg, bytes) else msg})")
    return rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)


def ensure_device() -> int:
    """Initialise the driver, make the primary context current, and check for an sm_90 GPU; returns the
    device ordinal. DeviceError when there is no GPU or it is not Hopper (sm_90a kernels need CC 9.0)."""
    driver = _drv()
    err, = driver.cuInit(0)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise DeviceError(f"no usable NVIDIA GPU: cuInit returned {err}")
    n = _check(driver.cuDeviceGetCount(), "cuDeviceGetCount")
    if n == 0:
        raise DeviceError("no NVIDIA GPU found")
    ctx = _check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if ctx is None or int(ctx) == 0:
        dev = _check(driver.cuDeviceGet(0), "cuDeviceGet")
        ctx = _check(driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
        _check(driver.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    dev = _check(driver.cuCtxGetDevice(), "cuCtxGetDevice")
    A = driver.CUdevice_attribute
    major = _check(driver.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "attr")
    minor = _check(driver.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "attr")
    if (major, minor) != (9, 0):
        raise DeviceError(f"generated kernels target sm_90a (H100/H200); this GPU is sm_{major}{minor}")
    return int(dev)


class Loaded:
    """A cubin loaded into the current context, ready to launch."""

    def __init__(self, comp: Compiled):
        ensure_device()
        driver = _drv()
        self.ks = comp.kernel
        self.report = comp.report
        self._args: dict[tuple[tuple[str, int], ...], list[Any]] = {}
        dev = _check(driver.cuCtxGetDevice(), "cuCtxGetDevice")
        sms = _check(driver.cuDeviceGetAttribute(
            driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev), "SM count")
        g = self.ks.grid
        self.sms = int(sms)
        pt = self.ks.persistent_tiles
        self.grid = (persistent_grid(pt, self.sms, self.ks.cluster), g[1], g[2]) if pt else g
        self.module = _check(driver.cuModuleLoadData(comp.cubin), "cuModuleLoadData")
        self.func = _check(driver.cuModuleGetFunction(self.module, self.ks.name.encode()), "cuModuleGetFunction")
        # the parameters' layout, once: (kind, name, struct format of a scalar) per argument
        self._spec = tuple((k, n, _SCALAR.get(k)) for k, n in (a.split(":") for a in self.ks.args))
        _check(driver.cuFuncSetAttribute(
            self.func, driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            self.ks.smem_bytes), "cuFuncSetAttribute(max dynamic smem)")

    def launch(self, ptrs: dict[str, int], stream: int = 0) -> None:
        """Launch with device pointers ``ptrs[tensor]`` (bytes addresses) for every tensor the kernel's
        arguments name; tensor maps are encoded from the same pointers (and cached per pointer set, so a
        repeated launch costs no host-side encoding)."""
        driver = _drv()
        key = tuple(sorted(ptrs.items()))
        if key not in self._args:
            if len(self._args) > 64:
                self._args.clear()
            self._args[key] = self._pack(ptrs)
        arr = self._args[key][-1]
        g, b = self.grid, self.ks.block
        _check(driver.cuLaunchKernel(self.func, *g, *b, self.ks.smem_bytes, driver.CUstream(stream),
                                     ctypes.addressof(arr), 0), f"cuLaunchKernel({self.ks.name})")

    def prepare(self, values: dict[str, Any], maps: tuple[Any, ...], grid: int, out: str = "") -> Launch:
        """A ready launch of a generic kernel (``KernelSource.generic``) on one shape: ``values`` gives every
        argument by name (``ptr:`` device addresses, 0 for a null pointer; ``i32:`` / ``f32:`` scalars; ``tmap:``
        the address its map describes), ``maps`` the tensor maps of that shape, ``grid`` the number of tiles
        (a persistent kernel launches at most one CTA per SM); ``out``: the pointer argument a call re-points
        (``Launch(stream, out_address)``), or the tensor map argument it re-encodes there (a TMA-store GEMM's C:
        its value here is not read, and every call must name the output)."""
        driver = _drv()
        spec = {m.tensor: m for m in maps}
        # the scalars in one buffer, 8 bytes each (a ptr argument stays re-pointable through its c_uint64 view); a
        # new shape or address prepares a launch, as every layer of a model's forward does: kept cheap
        buf = ctypes.create_string_buffer(8 * len(self._spec))
        base = ctypes.addressof(buf)
        keep: list[Any] = [buf]
        addrs = []
        ptrs: dict[str, Any] = {}
        tmaps: dict[str, tuple[int, Any]] = {}
        slots: dict[str, tuple[int, str]] = {}
        try:
            for i, (kind, name, fmt) in enumerate(self._spec):
                if fmt is None:  # tmap
                    tmaps[name] = (len(addrs), spec[name])
                    if name == out:  # encoded per call (Launch.__call__): zeros until then
                        blank = ctypes.create_string_buffer(128)
                        keep.append(blank)
                        addrs.append(ctypes.addressof(blank))
                        continue
                    tm = tensor_map(spec[name], int(values[name]))
                    keep.append(tm)
                    addrs.append(tm.getPtr())
                    continue
                struct.pack_into(fmt, buf, 8 * i, values[name])
                slots[name] = (8 * i, fmt)
                addrs.append(base + 8 * i)
                if kind == "ptr":
                    ptrs[name] = ctypes.c_uint64.from_buffer(buf, 8 * i)
        except KeyError as e:
            raise DeviceError(f"launch of {self.ks.name} needs a value for {e.args[0]!r}") from None
        arr = (ctypes.c_void_p * len(addrs))(*addrs)
        if out and out not in ptrs and out not in tmaps:
            raise DeviceError(f"{self.ks.name} has no pointer or tensor map argument {out!r} to re-point per call")
        ln = Launch(driver.cuLaunchKernel, driver.CUresult.CUDA_SUCCESS, self.func, (1, 1, 1), self.ks.block,
                    self.ks.smem_bytes, (*keep, arr), ctypes.addressof(arr), self.ks.name, ptrs,
                    ptrs.get(out) if out else None, (arr, tmaps), out if out in tmaps else "")
        ln.slots, ln.buf = slots, buf
        ln.sms = self.sms
        ln.cap = (self.sms, self.ks.cluster) if self.ks.persistent_tiles else None
        ln.regrid(grid)
        return ln

    def _pack(self, ptrs: dict[str, int]) -> list[Any]:
        """Kernel-parameter storage: [objects to keep alive ..., the void* array]."""
        keep: list[Any] = []
        addrs = []
        maps = {m.tensor: m for m in self.ks.tensor_maps}
        ptrs = workspace_ptrs(self.ks) | ptrs  # scratch buffers the caller did not pass: the cached ones
        for arg in self.ks.args:
            kind, tensor = arg.split(":")
            if tensor not in ptrs:
                raise DeviceError(f"launch of {self.ks.name} needs a pointer for {tensor!r}")
            if kind == "tmap":
                tm = encode_tensor_map(maps[tensor], ptrs[tensor])
                keep.append(tm)
                addrs.append(tm.getPtr())
            else:
                v = ctypes.c_uint64(ptrs[tensor])
                keep.append(v)
                addrs.append(ctypes.addressof(v))
        keep.append((ctypes.c_void_p * len(addrs))(*addrs))
        return keep


class Launch:
    """One prepared kernel launch (``Loaded.prepare``): calling it with a stream handle (int) only launches.
    ``ptrs[name].value`` re-points a raw-pointer argument (e.g. a fresh output) before a call, and so does the
    second argument of a call for the ``out`` argument ``prepare`` named: cuLaunchKernel copies the parameters when
    it is called, so one prepared launch serves every output buffer. (Calling libcuda's cuLaunchKernel through
    ctypes instead of cuda-python was measured on an H200 host, 2026-12-01: 4.56 vs 4.37 µs a launch, no gain: the
    driver's own call is the cost.) ``repoint`` moves a tensor map argument to another address of the same
    layout."""

    __slots__ = ("_launch", "_ok", "func", "grid", "block", "smem", "keep", "params", "name", "ptrs", "out", "_head",
                 "_maps", "_at", "out_map", "slots", "buf", "cap", "sms", "tiles", "margin")

    def __init__(self, launch: Any, ok: Any, func: Any, grid: tuple[int, int, int], block: tuple[int, int, int],
                 smem: int, keep: tuple[Any, ...], params: int, name: str, ptrs: dict[str, Any], out: Any = None,
                 maps: tuple[Any, dict[str, tuple[int, Any]]] | None = None, out_map: str = ""):
        self._launch, self._ok, self.func, self.grid, self.block, self.smem = launch, ok, func, grid, block, smem
        self.keep, self.params, self.name = keep, params, name  # keep: the parameter storage params points into
        self.ptrs, self.out = ptrs, out
        self._head = (func, *grid, *block, smem)  # cuLaunchKernel's arguments before the stream
        self._maps = maps  # (the parameter address array, tensor map name -> (its index there, its spec))
        # tensor map name -> (the address it describes now, the map, its spec)
        self._at: dict[str, tuple[int, Any, Any]] = {}
        self.out_map = out_map  # the tensor map argument a call's ``out`` re-encodes ("": out is a pointer)
        self.slots: dict[str, tuple[int, str]] = {}  # scalar argument -> (byte offset in buf, struct format)
        self.buf: Any = None
        self.cap: tuple[int, int] | None = None  # a persistent kernel's (SMs, cluster): its grid is capped there
        self.sms = 0  # the device's SMs (``prepare``); ``cap`` holds those a launch may fill (``leave_free``)
        self.tiles = 0  # the work units of the last ``regrid``
        self.margin = 0  # SMs this launch leaves free (``leave_free``)

    def repoint(self, name: str, ptr: int, spec: Any = None) -> None:
        """Point tensor map argument ``name`` at ``ptr`` from the next call on: a tensor of the layout the map was
        prepared for (its map cached, ``tensor_map``), or of layout ``spec`` (a TensorMapSpec of another shape or
        strides: encoded in place, into 128 bytes this launch keeps for the argument, since such calls come from a
        growing tensor whose maps never repeat; cuLaunchKernel copies the parameters, so the next encode cannot reach
        a launch made before). A launch a CUDA graph captured keeps the map it had then."""
        at = self._at.get(name)
        if at is not None and at[0] == ptr and (spec is None or at[2] == spec):
            return
        if self._maps is None or name not in self._maps[1]:
            raise DeviceError(f"{self.name} has no tensor map argument {name!r} to re-point")
        i, base = self._maps[1][name]
        if spec is None:
            tm = tensor_map(base, ptr)
        else:
            tm = at[1] if at is not None and isinstance(at[1], MapSlot) else MapSlot()
            tm.encode(spec, ptr)
        self._maps[0][i] = tm.getPtr()
        self._at[name] = (ptr, tm, base if spec is None else spec)  # held: the cache of maps may drop it

    def spec(self, name: str) -> Any:
        """The layout (TensorMapSpec) tensor map argument ``name`` was prepared with; KeyError for another name."""
        if self._maps is None or name not in self._maps[1]:
            raise KeyError(f"{self.name} has no tensor map argument {name!r}")
        return self._maps[1][name][1]

    def set(self, values: Mapping[str, Any]) -> None:
        """Write scalar arguments (``i32`` / ``f32`` / ``ptr`` by name) for the calls from now on; KeyError for a
        name the kernel does not take."""
        for name, v in values.items():
            off, fmt = self.slots[name]
            struct.pack_into(fmt, self.buf, off, v)

    def regrid(self, tiles: int) -> None:
        """Launch ``tiles`` CTAs from the next call on (a persistent kernel at most one per SM it may fill, whole
        clusters)."""
        gx = persistent_grid(tiles, *self.cap) if self.cap else tiles
        if not 1 <= gx < 1 << 31:
            raise DeviceError(f"{self.name}: a grid of {gx} CTAs; the shape has no tile or too many")
        self.tiles = tiles
        self.grid = (gx, 1, 1)
        self._head = (self.func, *self.grid, *self.block, self.smem)

    def leave_free(self, sm_margin: int) -> None:
        """Leave ``sm_margin`` of the device's SMs free for other work from the next call on (FlashAttention-3's
        ``sm_margin``: communication kernels running beside this one). A persistent kernel's grid is capped at the
        SMs left (``usable_sms``) and re-made; its CTAs stride the tiles by gridDim.x, so the binary is the same. A
        kernel of one CTA per tile keeps its grid (the hardware schedules its CTAs as SMs free up): the margin is
        only recorded. ShapeError for a margin the device cannot leave."""
        usable = usable_sms(self.sms, sm_margin, self.cap[1] if self.cap else 1)
        self.margin = sm_margin
        if self.cap is not None:
            self.cap = (usable, self.cap[1])
            self.regrid(self.tiles)

    def __call__(self, stream: int, out: int | None = None) -> None:
        """Launch on ``stream`` (a raw CUstream handle); ``out``: the address of the output, when ``prepare`` named
        the argument that takes it."""
        if self.out_map:
            if out is None:
                raise DeviceError(f"{self.name} writes its output through a tensor map: pass the output's address")
            self.repoint(self.out_map, out)
        elif out is not None:
            self.out.value = out
        err, = self._launch(*self._head, _cu_stream(stream), self.params, 0)
        if err != self._ok:
            _check((err,), f"cuLaunchKernel({self.name})")


def usable_sms(sms: int, sm_margin: int, cluster: int = 1) -> int:
    """The SMs a launch may fill on a device of ``sms`` SMs that leaves ``sm_margin`` free: sms − sm_margin, at least
    one cluster of ``cluster`` CTAs (a persistent grid is whole clusters). ShapeError unless 0 <= sm_margin < sms."""
    if isinstance(sm_margin, bool) or not isinstance(sm_margin, int) or not 0 <= sm_margin < sms:
        raise ShapeError(f"sm_margin={sm_margin!r}: SMs left free must be an int from 0 to {sms - 1} (this device "
                         f"has {sms} SMs; 0 uses them all)")
    return max(sms - sm_margin, cluster)


_STREAMS: dict[int, Any] = {}


def _cu_stream(handle: int) -> Any:
    """The cuda-python CUstream of a raw stream handle, made once per handle (a warm launch allocates nothing)."""
    s = _STREAMS.get(handle)
    if s is None:
        s = _STREAMS[handle] = _drv().CUstream(handle)
    return s


_SCALAR = {"ptr": "Q", "i32": "i", "f32": "f"}  # struct formats of the scalar kernel parameters
_TMAPS: dict[tuple[Any, int], Any] = {}


def tensor_map(spec: Any, ptr: int) -> Any:
    """encode_tensor_map, cached by (spec: shape, strides, box; address): cuTensorMapEncodeTiled costs
    microseconds, and a model calls the same few (pointer, shape) pairs again and again."""
    key = (spec, ptr)
    tm = _TMAPS.get(key)
    if tm is None:
        if len(_TMAPS) >= 4096:
            _TMAPS.clear()
        tm = _TMAPS[key] = encode_tensor_map(spec, ptr)
    return tm


def encode_tensor_map(spec: Any, ptr: int) -> Any:
    """cuTensorMapEncodeTiled for ``spec`` (a TensorMapSpec) over global memory at ``ptr``."""
    driver = _drv()
    if ptr % 16:
        raise DeviceError(f"tensor {spec.tensor!r} must be 16-byte aligned for TMA")
    dt, il, sw, l2, oob = _map_modes(spec)
    rank = len(spec.dims)
    return _check(driver.cuTensorMapEncodeTiled(
        dt, rank, ptr, [driver.cuuint64_t(x) for x in spec.dims],
        [driver.cuuint64_t(x) for x in spec.strides_bytes], [driver.cuuint32_t(x) for x in spec.box],
        [driver.cuuint32_t(1)] * rank, il, sw, l2, oob), f"cuTensorMapEncodeTiled({spec.tensor})")


def _map_modes(spec: Any) -> tuple[Any, Any, Any, Any, Any]:
    """The driver's (data type, interleave, swizzle, L2 promotion, out-of-bounds fill) of ``spec``'s map: the one
    choice both encoders (``encode_tensor_map``, ``MapSlot``) make."""
    d = _drv()
    T, S = d.CUtensorMapDataType, d.CUtensorMapSwizzle
    dt = {"fp16": T.CU_TENSOR_MAP_DATA_TYPE_FLOAT16, "bf16": T.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
          "fp32": T.CU_TENSOR_MAP_DATA_TYPE_FLOAT32}[spec.dtype]
    sw = {128: S.CU_TENSOR_MAP_SWIZZLE_128B, 0: S.CU_TENSOR_MAP_SWIZZLE_NONE}[spec.swizzle]
    return (dt, d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, sw,
            d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)


class MapSlot:
    """A CUtensorMap's 128 bytes (64-byte aligned, as the driver requires) encoded in place through libcuda itself
    (ctypes): a growing tensor's map re-encoded per call without building cuda-python's per-argument objects. The
    slot keeps its own argument arrays and rewrites only their values (a growing tensor's sizes and strides change
    every call: arrays built per call cost more than the driver's encode, bench models decode_host)."""

    __slots__ = ("_raw", "addr", "_arrs", "_head", "_tail", "_mode")
    _ENC: list[Any] = []  # libcuda's cuTensorMapEncodeTiled, its argument types set
    _MODES: dict[tuple[str, int], tuple[int, ...]] = {}  # (dtype, swizzle) -> _map_modes as ints, once

    def __init__(self) -> None:
        self._raw = ctypes.create_string_buffer(128 + 64)
        self.addr = (ctypes.addressof(self._raw) + 63) & ~63
        self._mode: tuple[Any, ...] | None = None  # (dtype, swizzle, box) the arrays were laid out for

    def getPtr(self) -> int:  # noqa: N802 (cuda-python's CUtensorMap spelling: both kinds sit in a launch's maps)
        return self.addr

    def encode(self, spec: Any, ptr: int) -> None:
        """Encode ``spec`` over global memory at ``ptr`` into this slot (``encode_tensor_map``'s arguments)."""
        if ptr % 16:
            raise DeviceError(f"tensor {spec.tensor!r} must be 16-byte aligned for TMA")
        if self._mode != (spec.dtype, spec.swizzle, spec.box):
            self._layout(spec)
        dims, strides = self._arrs[0], self._arrs[1]
        dims[:] = spec.dims
        strides[:len(spec.strides_bytes)] = spec.strides_bytes
        err = self._encoder()(self.addr, *self._head, ptr, *self._tail)
        if err:
            _check((_drv().CUresult(err),), f"cuTensorMapEncodeTiled({spec.tensor})")

    def _layout(self, spec: Any) -> None:
        modes = self._MODES.get((spec.dtype, spec.swizzle))
        if modes is None:
            modes = self._MODES[(spec.dtype, spec.swizzle)] = tuple(int(x) for x in _map_modes(spec))
        dt, il, sw, l2, oob = modes
        rank = len(spec.dims)
        self._arrs = ((ctypes.c_uint64 * rank)(), (ctypes.c_uint64 * max(1, rank - 1))(),
                      (ctypes.c_uint32 * rank)(*spec.box), (ctypes.c_uint32 * rank)(*[1] * rank))
        ad = [ctypes.addressof(x) for x in self._arrs]
        self._head, self._tail = (dt, rank), (*ad, il, sw, l2, oob)
        self._mode = (spec.dtype, spec.swizzle, spec.box)

    @classmethod
    def _encoder(cls) -> Any:
        if not cls._ENC:
            c = ctypes
            f = c.CDLL("libcuda.so.1").cuTensorMapEncodeTiled
            f.restype = c.c_int
            f.argtypes = [c.c_void_p, c.c_int, c.c_uint32, c.c_void_p, c.c_void_p, c.c_void_p, c.c_void_p,
                          c.c_void_p, c.c_int, c.c_int, c.c_int, c.c_int]
            cls._ENC.append(f)
        return cls._ENC[0]


_LOADED: dict[str, Loaded] = {}


def load(ks: KernelSource) -> Loaded:
    """Compile (cached) and load ``ks``; loaded modules are kept per process."""
    key = _key(ks)
    if key not in _LOADED:
        _LOADED[key] = Loaded(compile_kernel(ks))
    return _LOADED[key]


# ---------------------------------------------------------------------------------------------- plans and scratch


_EMITTED: dict[str, KernelSource] = {}
_EMITTED_BY_ID: dict[int, tuple[Any, KernelSource]] = {}


def emit_cached(plan: Any) -> KernelSource:
    """emit(plan), memoised by the plan's JSON (repeated launches skip source generation) and, first, by the plan
    object itself (a caller that keeps its plan, e.g. the harness's repeated launches, skips the serialisation)."""
    from .cuda import emit
    hit = _EMITTED_BY_ID.get(id(plan))
    if hit is not None and hit[0] is plan:
        return hit[1]
    try:
        key = plan.to_json()
    except (AttributeError, TypeError, ValueError):
        return emit(plan)  # not a (serialisable) plan: emit raises the CodegenError that says why
    if key not in _EMITTED:
        _EMITTED[key] = emit(plan)
    if len(_EMITTED_BY_ID) >= 1024:
        _EMITTED_BY_ID.clear()
    _EMITTED_BY_ID[id(plan)] = (plan, _EMITTED[key])  # the plan is kept alive with its id
    return _EMITTED[key]


_WORKSPACE: dict[tuple[int, str, str], Any] = {}


_HELD: list[Any] = []  # device buffers of zeroed(): never freed, launches and captured CUDA graphs point into them


def zeroed(nbytes: int, stream: int) -> int:
    """The address of a new device buffer of ``nbytes`` (at least 16) on the current context, zero-filled in order on
    ``stream`` (a raw handle) and held for the process. From the driver, not torch's allocator: a buffer first asked
    for inside a CUDA-graph pool (the warm-up run of torch.compile's ``reduce-overhead``) would otherwise belong to
    that pool, which refuses allocations its graph's outputs do not account for."""
    d = _drv()
    ptr = _check(d.cuMemAlloc(max(16, nbytes)), "cuMemAlloc")
    _HELD.append(ptr)
    _check(d.cuMemsetD8Async(ptr, 0, max(16, nbytes), _cu_stream(stream)), "cuMemsetD8Async")
    return int(ptr)


def workspace_ptrs(ks: KernelSource) -> dict[str, int]:
    """Device pointers of the scratch buffers ``ks.info["workspace"]`` names ({tensor: bytes}; e.g. split-K's fp32
    partial tiles and its per-tile arrival counters), zero-filled once per (device, kernel) and kept: the kernels
    that take them leave them as they found them (counters back at zero), so launches on one stream may share
    them. Empty for kernels without scratch buffers."""
    import torch

    out = {}
    for name, nbytes in sorted(ks.info.get("workspace", {}).items()):
        key = (torch.cuda.current_device(), ks.name, name)
        if key not in _WORKSPACE:
            _WORKSPACE[key] = zeroed(nbytes, torch.cuda.current_stream().cuda_stream)
        out[name] = _WORKSPACE[key]
    return out
