"""Models end to end (issue 37): Hugging Face Llama with ``attn_implementation="ptsolve"`` next to SDPA (FLASH and
cuDNN, and torch's default choice), prefill and decode with transformers' dynamic cache.

Results: results/models/h200.json and h200.md. Tools: ``llama`` (GPU: one process, every row's logits compared with
SDPA's, writing the JSON) and ``report`` (the markdown from the JSON).
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="llama")
