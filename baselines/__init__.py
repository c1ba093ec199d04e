"""Baselines that ptsolve's kernels are measured against (DESIGN.md §6-7).

- ``configs``: the paper's benchmark suite as plain data, with the FLOP count of each config.
- ``timing``: CUDA-event timing with an L2 flush between runs.
- ``attention``: PyTorch SDPA, FLASH (FlashAttention-2) and cuDNN backends (``sdpa``: one call on (B, H, S, D)
  inputs, causal bottom-right, absent where the backend refuses).
- ``gemm``: cuBLAS through ``torch.matmul``.
- ``fa4``: FlashAttention-4 (``flash-attn-4``, the ``peers`` extra): dense, varlen and decode forms, its arguments
  probed at run time, absent (with the reason) where it refuses a shape.
- ``mamba2``: the official Mamba2 Triton kernels (``mamba-ssm``) for ChunkScan and ChunkState, and ``compare``,
  which times ptsolve's kernels next to them.
- ``run_gpu``: the whole suite in one command on the GPU machine.

Only ``configs`` and ``fa4`` are importable without torch; the other modules import torch inside their functions.
"""
