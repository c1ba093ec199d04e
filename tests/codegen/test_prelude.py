"""The prelude's own fp16/bf16 declarations (codegen.cuda.common.PRELUDE, which includes none of cuda.h, cuda_fp16.h,
cuda_bf16.h: parsing them was ~0.2 s of every nvcc run) compile to the very machine code of the CUDA headers'
functions: one kernel calls each conversion through the headers, its twin through pts_*, and ptxas's .text is
byte-identical (nvcc 13.0, sm_90a). A swapped operand or another instruction fails here, before any GPU."""
from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest
from test_cuda import _have_nvcc

from codegen.cuda.common import NVCC_FLAGS, PRELUDE, PRELUDE_END

# one kernel per conversion the kernels call, on a word ``w`` read from ``in`` and floats read from ``fin``, writing
# ``out``/``fout`` (restricted pointers: how the optimizer reads their aliasing is not what is compared here)
CASES = {
    "h2f2": "const float2 h = H2F2(*reinterpret_cast<const HALF2*>(&w)); fout[i] = h.x + 3.f * h.y;",
    "b2f2": "const float2 h = B2F2(*reinterpret_cast<const BF162*>(&w)); fout[i] = h.x + 3.f * h.y;",
    "h2f": "fout[i] = H2F(*reinterpret_cast<const HALF*>(&w)) + B2F(reinterpret_cast<const BF16*>(&w)[1]);",
    "f2h2": "HALF2 h = F2H2(fin[i], fin[i + 32]); out[i] = *reinterpret_cast<uint32_t*>(&h);",
    "f2b2": "BF162 h = F2B2(fin[i], fin[i + 32]); out[i] = *reinterpret_cast<uint32_t*>(&h);",
    "f2h": "HALF h = F2H(fin[i]); BF16 b = F2B(fin[i + 32]); "
           "out[i] = *reinterpret_cast<uint16_t*>(&h) | uint32_t(*reinterpret_cast<uint16_t*>(&b)) << 16;",
}
BODY = "".join(f"""
extern "C" __global__ void {k}(const uint32_t* __restrict__ in, const float* __restrict__ fin,
                               uint32_t* __restrict__ out, float* __restrict__ fout) {{
  const int i = threadIdx.x;
  const uint32_t w = in[i];
  {c}
}}""" for k, c in CASES.items())
NAMES = {  # placeholder: (the CUDA headers' name, the prelude's)
    "HALF2": ("__half2", "pts_half2"), "BF162": ("__nv_bfloat162", "pts_bf162"), "HALF": ("__half", "pts_half"),
    "BF16": ("__nv_bfloat16", "pts_bf16"), "H2F2": ("__half22float2", "pts_half22float2"),
    "B2F2": ("__bfloat1622float2", "pts_bf1622float2"), "H2F": ("__half2float", "pts_half2float"),
    "B2F": ("__bfloat162float", "pts_bf162float"), "F2H2": ("__floats2half2_rn", "pts_floats2half2_rn"),
    "F2B2": ("__floats2bfloat162_rn", "pts_floats2bf162_rn"), "F2H": ("__float2half_rn", "pts_float2half_rn"),
    "F2B": ("__float2bfloat16_rn", "pts_float2bf16_rn")}


def _body(which: int) -> str:
    return re.sub(r"\b(" + "|".join(sorted(NAMES, key=len, reverse=True)) + r")\b", lambda m: NAMES[m[1]][which], BODY)


def _text(cubin: bytes) -> dict[str, bytes]:
    """The cubin's executable sections (ELF64 section headers), by name."""
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    entsize, num, strndx = struct.unpack_from("<HHH", cubin, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * entsize) for i in range(num)]
    names = secs[strndx][4]

    def name(off: int) -> str:
        return cubin[names + off: cubin.index(b"\0", names + off)].decode()
    return {name(s[0]): cubin[s[4]: s[4] + s[5]] for s in secs if name(s[0]).startswith(".text")}


def _compile(src: str, tmp: Path, tag: str) -> bytes:
    import subprocess

    from codegen.runtime import nvcc_path
    cu, out = tmp / f"{tag}.cu", tmp / f"{tag}.cubin"
    cu.write_text(src)
    flags = [f for f in NVCC_FLAGS if f != "-lineinfo"]  # line tables name the source's lines, which differ
    subprocess.run([nvcc_path(), *flags, "-cubin", "-o", str(out), str(cu)], check=True, capture_output=True)
    return out.read_bytes()


def test_the_prelude_includes_none_of_the_heavy_headers() -> None:
    assert re.findall(r"#include <([^>]+)>", PRELUDE) == ["stdint.h"]


@pytest.mark.skipif(not _have_nvcc(), reason="nvcc not available")
def test_prelude_conversions_are_the_headers_machine_code(tmp_path: Path) -> None:
    headers = "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n#include <stdint.h>\n" + _body(0)
    ours = PRELUDE + PRELUDE_END + _body(1)
    theirs, mine = _text(_compile(headers, tmp_path, "headers")), _text(_compile(ours, tmp_path, "prelude"))
    assert sorted(theirs) == sorted(mine) == sorted(f".text.{k}" for k in CASES)
    assert [k for k in CASES if theirs[f".text.{k}"] != mine[f".text.{k}"]] == []
