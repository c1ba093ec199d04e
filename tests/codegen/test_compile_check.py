"""The compiler check's kernel key (codegen.compile_check.cuda_kernel_key): one key per kernel source, so the search
compiles each kernel once however many schedules emit it. No nvcc needed: the key is the emitted source's."""
from __future__ import annotations

import sys
from dataclasses import replace

import pytest

pytest.importorskip("ortools")

import ptsolve  # noqa: E402
from codegen.compile_check import check_cuda, check_cuda_generic, cuda_kernel_key  # noqa: E402
from codegen.cuda import emit  # noqa: E402
from ptsolve.hw import load  # noqa: E402

H200 = load("h200")
FA = ptsolve.ops.flash_attention(batch=1, heads=8, kv_heads=2, seq=1024, head_dim=128, causal=False)
T = {"BM": 128, "BN": 128, "depth": 2, "groups": 2, "persistent": 1}


def _program(solver: str):
    return sys.modules["ptsolve.search"].search(FA, H200, solver=solver, fix=T, executor="serial").program


def test_one_kernel_one_key_and_another_kernel_another():
    """A schedule relabelled is the same kernel (same source, same key); greedy's schedule of the tiling is another
    kernel; the key is what nvcc would be given, source and flags."""
    p, g = _program("cpsat"), _program("greedy")
    assert emit(p, H200).source == emit(replace(p, policy="other"), H200).source
    assert cuda_kernel_key(p, H200) == cuda_kernel_key(replace(p, policy="other"), H200)
    assert emit(p, H200).source != emit(g, H200).source
    assert cuda_kernel_key(p, H200) != cuda_kernel_key(g, H200)
    assert cuda_kernel_key(p, H200) != cuda_kernel_key(p, H200, generic=True)


def test_the_registered_checks_carry_their_keys():
    p = _program("cpsat")
    assert check_cuda.kernel_key(p, H200) == cuda_kernel_key(p, H200)
    assert check_cuda_generic.kernel_key(p, H200) == cuda_kernel_key(p, H200, generic=True)


def test_a_program_the_generator_refuses_has_no_key(monkeypatch):
    """Where the generator refuses the program the key is None: the search asks about it as a schedule of its own,
    and the check says why."""
    import codegen.compile_check as cc

    def refuse(*a, **k):
        raise ptsolve.errors.CodegenError("no such kernel")
    monkeypatch.setattr(cc, "_cuda_source", refuse)
    assert cuda_kernel_key(_program("cpsat"), H200) is None


def test_a_refused_compile_is_recorded_and_raised_again_without_nvcc(tmp_path, monkeypatch):
    """An nvcc exit status (ptxas out of registers, say) is kept beside the cubins: the same source and flags raise
    the same NvccError without a second nvcc run, until another nvcc is installed or ``cache=False``; a run killed
    by a signal is not kept."""
    import subprocess
    from types import SimpleNamespace

    from codegen import runtime
    from codegen.cuda.common import KernelSource

    fake = tmp_path / "nvcc"
    fake.write_text("x")
    monkeypatch.setattr(runtime, "nvcc_path", lambda: str(fake))
    monkeypatch.setenv("PTSOLVE_CACHE_DIR", str(tmp_path / "cache"))
    runs = []
    status = [255]

    def run(cmd, **kw):
        runs.append(cmd)
        return SimpleNamespace(returncode=status[0], stdout="", stderr="ptxas error   : C7602 Insufficient registers")
    monkeypatch.setattr(subprocess, "run", run)
    ks = KernelSource(source="__global__ void k() {}", name="k", op="gemm", params={}, grid=(1, 1, 1),
                      block=(128, 1, 1), smem_bytes=0, tensor_maps=(), args=())
    for _ in range(2):
        with pytest.raises(runtime.NvccError, match="C7602") as e:
            runtime.compile_kernel(ks)
        assert e.value.returncode == 255
    assert len(runs) == 1
    import pickle
    back = pickle.loads(pickle.dumps(e.value))  # from a pool's worker
    assert (str(back), back.returncode) == (str(e.value), 255)
    with pytest.raises(runtime.NvccError):
        runtime.compile_kernel(ks, cache=False)
    assert len(runs) == 2
    fake.write_text("another toolkit")  # a new nvcc: compiled again
    with pytest.raises(runtime.NvccError):
        runtime.compile_kernel(ks)
    assert len(runs) == 3
    other = replace(ks, source="__global__ void k() { }")
    status[0] = -9  # killed: not the source's verdict
    for n in (4, 5):
        with pytest.raises(runtime.NvccError):
            runtime.compile_kernel(other)
        assert len(runs) == n
