"""Build a HIP kernel for gfx942 with clang-19 (no ROCm install) and read what the compiler reports.

``clang-19 -x hip --offload-arch=gfx942 -nogpulib -nogpuinc --cuda-device-only -O3 --no-gpu-bundle-output
-Rpass-analysis=kernel-resource-usage`` (lld-19 links the code object, found through ``/usr/lib/llvm-19/bin`` on
PATH); the remarks give SGPRs, VGPRs, AGPRs, scratch, spills, LDS and occupancy; ``llvm-objdump-19 -d`` the ISA.
Builds are cached under ``$PTSOLVE_CACHE_DIR/hsaco`` by sha256(source + flags).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ptsolve.errors import CodegenError

from .common import ARCH, HipSource

LLVM_BIN = Path("/usr/lib/llvm-19/bin")
FLAGS = ("-x", "hip", f"--offload-arch={ARCH}", "-nogpulib", "-nogpuinc", "--cuda-device-only", "-O3",
         "--no-gpu-bundle-output", "-Rpass-analysis=kernel-resource-usage")
_REMARKS = {"sgpr": "SGPRs", "vgpr": "VGPRs", "agpr": "AGPRs", "scratch_bytes": r"ScratchSize \[bytes/lane\]",
            "occupancy": r"Occupancy \[waves/SIMD\]", "sgpr_spill": "SGPRs Spill", "vgpr_spill": "VGPRs Spill",
            "lds_bytes": r"LDS Size \[bytes/block\]"}


@dataclass(frozen=True)
class HipReport:
    """One build: the code object's bytes, the compiler's resource usage (registers per lane, spills, scratch bytes
    per lane, LDS bytes per workgroup, occupancy in waves per SIMD), the ISA text and its MFMA count."""

    name: str
    code_object: bytes
    sgpr: int
    vgpr: int
    agpr: int
    scratch_bytes: int
    sgpr_spill: int
    vgpr_spill: int
    lds_bytes: int
    occupancy: int
    isa: str
    cached: bool = False

    @property
    def mfma(self) -> int:
        """v_mfma instructions in the ISA."""
        return len(re.findall(r"^\s*v_mfma_", self.isa, re.M))

    def summary(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k not in ("code_object", "isa")}
        return d | {"mfma": self.mfma, "code_object_bytes": len(self.code_object)}


def clang_path() -> str | None:
    """clang-19 (``$PTSOLVE_HIP_CLANG``, PATH or /usr/lib/llvm-19/bin), or None when it is not installed."""
    for cand in (os.environ.get("PTSOLVE_HIP_CLANG"), shutil.which("clang-19"), str(LLVM_BIN / "clang")):
        if cand and Path(cand).exists():
            return cand
    return None


def _objdump(clang: str) -> str:
    for cand in (shutil.which("llvm-objdump-19"), str(Path(clang).parent / "llvm-objdump"),
                 str(LLVM_BIN / "llvm-objdump")):
        if cand and Path(cand).exists():
            return cand
    raise CodegenError("llvm-objdump-19 not found: apt-get install llvm-19 (see .ci/hip_toolchain.sh)")


def parse_remarks(text: str, name: str) -> dict[str, int]:
    """The resource-usage remarks of kernel ``name`` from clang's -Rpass-analysis=kernel-resource-usage output."""
    blocks = re.split(r"remark: Function Name: ", text)
    body = next((b for b in blocks[1:] if b.split()[0] == name), None)
    if body is None:
        raise CodegenError(f"clang printed no resource usage for {name}; was -Rpass-analysis dropped?")
    out = {}
    for key, label in _REMARKS.items():
        m = re.search(rf"remark:\s+{label}: (\d+)", body)
        if m is None:
            raise CodegenError(f"clang's resource usage for {name} has no {label!r} line")
        out[key] = int(m.group(1))
    return out


def cache_dir() -> Path:
    return Path(os.environ.get("PTSOLVE_CACHE_DIR", Path.home() / ".cache" / "ptsolve")) / "hsaco"


def compile(src: HipSource, cache: bool = True, timeout: float = 300.0) -> HipReport:  # noqa: A001
    """Build ``src`` for gfx942 and report its resources; CodegenError when clang-19 is missing or fails."""
    clang = clang_path()
    if clang is None:
        raise CodegenError("clang-19 not found: apt-get install clang-19 lld-19 llvm-19 (.ci/hip_toolchain.sh), or "
                           "set $PTSOLVE_HIP_CLANG")
    key = hashlib.sha256((src.source + "\0" + " ".join(FLAGS) + "\0" + clang).encode()).hexdigest()[:24]
    d = cache_dir()
    meta, obj = d / f"{key}.json", d / f"{key}.hsaco"
    if cache and meta.exists() and obj.exists():
        m = json.loads(meta.read_text())
        return HipReport(**m, code_object=obj.read_bytes(), cached=True)
    env = dict(os.environ)
    env["PATH"] = f"{LLVM_BIN}{os.pathsep}{env.get('PATH', '')}"  # ld.lld for the device link
    with tempfile.TemporaryDirectory(prefix="pts_hip_") as tmp:
        k, o = Path(tmp) / "k.hip", Path(tmp) / "k.hsaco"
        k.write_text(src.source)
        try:
            p = subprocess.run([clang, *FLAGS, "-o", str(o), str(k)], capture_output=True, text=True, env=env,
                               timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise CodegenError(f"clang-19 took more than {timeout:.0f} s on {src.name}") from e
        if p.returncode != 0 or not o.exists():
            errs = "\n".join(ln for ln in p.stderr.splitlines() if "error" in ln)[:4000]
            raise CodegenError(f"clang-19 failed on {src.name} (exit {p.returncode}):\n{errs or p.stderr[-4000:]}")
        res = parse_remarks(p.stderr, src.name)
        dis = subprocess.run([_objdump(clang), "-d", str(o)], capture_output=True, text=True, timeout=timeout)
        if dis.returncode != 0:
            raise CodegenError(f"llvm-objdump failed on {src.name}: {dis.stderr[-2000:]}")
        code = o.read_bytes()
    rep = HipReport(name=src.name, code_object=code, isa=dis.stdout, **res)
    if cache:
        d.mkdir(parents=True, exist_ok=True)
        obj.write_bytes(code)
        meta.write_text(json.dumps({k: v for k, v in asdict(rep).items() if k not in ("code_object", "cached")}))
    return rep
