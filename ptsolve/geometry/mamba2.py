"""Mamba2 ChunkScan's fused epilogues, shared by its graph builder (ptsolve.ops.chunk_scan), its emitter
(codegen.cuda.chunk_scan) and the serving layer's variant classes."""
from __future__ import annotations

# mamba_ssm's D skip and z gate in ChunkScan's store, out = (out + D·x)·silu(z): "D" D per head, "Dp" D per
# (head, p), "z" the gate alone, and both; no epilogue is the parameter's absence
EPILOGUES = ("D", "Dp", "z", "Dz", "Dpz")
