"""Models end to end (issue 37): Hugging Face Llama with ``attn_implementation="ptsolve"`` next to SDPA (FLASH and
cuDNN, and torch's default choice), prefill and decode with transformers' dynamic cache; Mamba2's whole SSD forward
(``ptsolve.ssd.mamba_chunk_scan_combined``) and its chunk kernels next to mamba_ssm's; Hugging Face Mamba2 models on
ptsolve's SSD (``ptsolve.mamba2_model``) next to the same models on mamba_ssm's kernels.

Results: results/models/h200.json and h200.md. Tools: ``llama`` (GPU: one process, every row's logits compared with
SDPA's, writing the JSON), ``ssd`` (GPU: the SSD rows ssd_combined / chunk_scan / chunk_state next to mamba_ssm, in
one process, writing their JSON), ``mamba2`` (GPU: Mamba2 130m–1.3b prefill and decode rows next to mamba_ssm's path,
in one process, writing their JSON) and ``report`` (the markdown from ``llama``'s JSON).
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="llama")
