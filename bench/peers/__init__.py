"""The user path (``ptsolve.torch``) against the fastest public Hopper kernels (issue 35): FlashAttention-4, SDPA
cuDNN and FLASH, cuBLAS, on a public suite of prefill, varlen, decode and GEMM shapes.

Results: results/peers/h200.json and h200.md. Tools: ``suite`` (the rows), ``prepare`` (CPU: every cubin the run
needs, the exact-shape plans), ``run`` (GPU: one process, every row checked and timed), ``report`` (the markdown
from the JSON), ``wheels`` (FlashAttention-4's wheels for the device) and ``device`` (the device call).

**FlashAttention-4 on the GPU machine.** It has no network; Python 3.12, torch 2.11.0+cu130, cuda-bindings, einops,
protobuf and typing-extensions are installed. ``bash bench/peers/wheels.sh`` (here, with network) downloads into
``.whl/`` (git-ignored) exactly what FlashAttention-4 needs beyond that: flash_attn_4 4.0.0b40, nvidia-cutlass-dsl
with its libs-base, libs-core and the CUDA 13 libs (``libs-cu13``: the device's driver 580 is CUDA 13.0, and the DSL
picks the newest flavour the driver supports), quack-kernels, apache-tvm-ffi and torch-c-dlpack-ext. They come to
about 98 MiB (``libs-cu13`` alone 88 MiB), more than one device call carries (64 MiB with the working tree), so the
script also writes them as one tar split in two: ``.whl/a`` (the first ``SPLIT_MIB``, default 50 MiB) and ``.whl/b``
(the rest). Two calls carry them, the machine staying warm in between (its idle release is short: make the second
call at once)::

    run(carry=[".whl/a"], command="bash bench/peers/device.sh stage")
    run(carry=[".whl/b", ".cubin_peers_pack"], command="LIMIT=2 bash bench/peers/device.sh")   # smoke
    run(carry=[".cubin_peers_pack"], command="bash bench/peers/device.sh")                      # full run

A run longer than one call (FA4 compiles a kernel per new configuration) goes in parts, e.g. ``ONLY=prefill/`` and
``ONLY=varlen/,decode/,gemm/``, merged by ``python -m bench peers report p1.json p2.json --json-out
results/peers/h200.json --out results/peers/h200.md`` (FA4's compile cache in /tmp carries over on a warm machine).

``device.sh`` joins the parts, installs them (``python3 -m pip install -q --no-index --no-deps --no-compile
--no-cache-dir --upgrade --target /tmp/site <wheels>``) and exports ``PYTHONPATH=/tmp/site`` plus
``/tmp/site/nvidia_cutlass_dsl/dsl_packages`` (the DSL's ``.pth`` file, which puts ``cutlass`` on the path, is not
read from a ``PYTHONPATH`` folder). Without the wheels the run goes on: the ``fa4`` key is absent from every row and
the report says why. ``pip install -e .[peers]`` installs the same on a machine with network.

**The cubins.** ``python -m bench peers prepare`` (CPU with nvcc 13 and OR-Tools) compiles every fp16 class kernel
of the user path and solves and compiles the exact-shape kernel of every row, into ``.cubin_peers/`` and the pack
``.cubin_peers_pack/cache.tar.xz`` that the device call carries and unpacks (``PTSOLVE_CACHE_DIR``).
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="run")
