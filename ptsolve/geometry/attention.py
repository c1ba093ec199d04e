"""FlashAttention's tile geometry, shared by its graph builders (ptsolve.ops.attention) and the CUDA emitter
(codegen.cuda.attention): how many head-dim columns the tensor-core tiles hold."""
from __future__ import annotations

from ..tiling import cdiv

# 16-bit elements in one 128-byte swizzle atom: the width of a TMA box and of a wgmma operand's chunk on sm_90a
SWIZZLE_COLS = 64


def head_cols(head_dim: int, arch: str | None = None) -> int:
    """Head-dim columns of the Q, K, V shared-memory tiles and of O's accumulator: ``head_dim`` rounded up to whole
    128-byte swizzle atoms on sm_90a (``arch`` None or ``sm_*``). TMA zero-fills the columns past ``head_dim``, so
    Q·Kᵀ runs only the k-steps that carry data, while P·V, whose N is the head dim, runs the padded width (a wgmma
    B operand in MN-major layout is built of whole atoms): head_dim 96 costs P·V as 128. MI300X's LDS tiles are
    unswizzled: ``head_dim`` itself there."""
    if arch is not None and not arch.startswith("sm_"):
        return head_dim
    return cdiv(head_dim, SWIZZLE_COLS) * SWIZZLE_COLS
