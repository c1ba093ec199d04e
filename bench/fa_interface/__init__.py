"""FlashAttention's interface, feature by feature (issue 36): softcap, sliding window (causal and both edges), varlen's
``seqused``, the log-sum-exp, each at head_dim 64, 96, 128, 192 and 256, through ``ptsolve.torch`` as a user calls it,
checked against an fp32 reference (FlashAttention's rule) and timed next to FlashAttention-4 where it takes the case.

Results: results/fa_interface/h200.json and h200.md. Tools: ``run`` (GPU: one process, every case checked and timed,
the JSON and the markdown) and ``report`` (the markdown from a JSON). The device call is the peers study's
(``STUDY=fa_interface bash bench/peers/device.sh``: FlashAttention-4's wheels, the carried cubins).
"""
from bench._study import dispatch


def main(argv: list[str] | None = None) -> int:
    return dispatch(__name__, argv, default="run")
