"""The benchmarks and studies that made the evidence in ``results/``: every script that produced a result.

One command runs every study: ``python -m bench <study> [args...]`` (or ``ptsolve bench <study> [args...]``);
``python -m bench --list`` lists them, ``python -m bench <study> --help`` a study's tools. A study is a package
``bench/<study>/`` (its ``main(argv)`` dispatches to its tools: the Python scripts and the device-call shell scripts
in it); what it measured is in ``results/`` (one folder or file per study, each naming the command, device, date
and commit). The library (``ptsolve``, ``codegen``, ``baselines``) never imports ``bench``; ``bench`` imports the
library.
"""
from __future__ import annotations

# study -> one line (the package bench/<study> has main(argv))
STUDIES: dict[str, str] = {
    "ab": "A/B in one process: the one lowering against the old per-op emitters, single fixes, turns, ring depths",
    "choices": "Which structures the solver chooses, predicted against measured gain (no solver runs)",
    "codegen_bench": "The generated GEMM and FlashAttention kernels checked and timed next to cuBLAS and SDPA",
    "compile_verdicts": "What ptxas says about greedy's, CP-SAT's and the declared order's schedules (CPU, nvcc)",
    "exact_ab": "Exact-shape kernels of the serving layer against its classes' and cuBLAS / SDPA (CPU, then GPU)",
    "compile_check": "How often the compiler in the loop moves on from the model's first tiling",
    "decode": "Split-KV decode attention next to SDPA: prepare (CPU), run (GPU), report",
    "decode_combine": "Split-KV decode's merge CTAs against the last piece merging alone",
    "decode_stream": "Long-cache decode: how much K/V ring per CTA streams fastest",
    "decode_tune": "Measured selection for decode shapes (select, pick, confirm)",
    "depth_tie": "The ring-depth tie-break per operator, and GEMM's measured selection",
    "fa3_order_model": "How the cost model ranks the hand FA3 order against its free optimum (CPU)",
    "fa_interface": "FlashAttention's interface feature by feature (softcap, window, seqused, LSE) next to FA4 (GPU)",
    "fa_tune": "Measured selection for the paper attention configurations, FA3 order among the candidates",
    "first_choice": "The exact solver's first choice against the hand FA3-order plan",
    "gemm_heldout": "GEMM on held-out shapes; misaligned K rows",
    "gemm_model": "GEMM's own cost-model constants fitted on measured kernels",
    "gemm_reduce": "Split-K GEMM's reduce CTAs against the last split alone",
    "gemm_skinny": "GEMM on the shapes furthest from cuBLAS: sweeps, clusters, ring deepening, A's box rows",
    "gemm_space": "The GEMM schedule space on 45 shapes timed next to cuBLAS (prepare, precompile, run, report)",
    "gpu_tests": "One device call validating main: every GPU test, compute-sanitizer, the profiler",
    "mi300x": "Correctness and timing of the HIP kernels on an AMD MI300X (never run: no AMD GPU)",
    "models": "Models end to end: Hugging Face Llama next to SDPA, Mamba2 (SSD, whole models) next to mamba_ssm",
    "mutation": "Mutation testing of ptsolve's core modules (mutmut) and issue 10's listed mutations",
    "orders_ab": "The FA3 order as a schedule the exact solver returns, next to the hand plan",
    "peers": "ptsolve.torch next to FlashAttention-4, SDPA cuDNN / FLASH and cuBLAS (prepare, run, report)",
    "placement": "How well each placement rule predicts the GPU (CPU model against the H200 round)",
    "polish": "CP-SAT's polish A/B against the hand plan",
    "regfit": "The register model against ptxas",
    "real_software": "The wall times a newcomer meets: a cached answer, head_dim 96/256, --time-limit, the main job",
    "replay_orders": "The issue order chosen by the asap replay, next to the formula's and the hand plan",
    "round": "The paper-suite GPU round: the schedules as kernels next to the libraries (prepare, compile, run)",
    "sanitize": "What compute-sanitizer runs: small launches of every operator's kernels (precompile first)",
    "sfu_turns": "Named-barrier SFU turns between attention warpgroups, on and off",
    "study": "The measured-selection and fidelity study (prepare, precompile, run, report)",
    "task_costs": "The vector tasks' costs fitted from profiler timelines",
    "tma_store": "GEMM's TMA-store epilogue against the register store",
    "torch_decode": "Decode through ptsolve.torch next to SDPA, and the A/Bs of its binary choices",
    "torch_ops": "ptsolve.torch's custom ops: host overhead, SDPA, a Llama layer, a Mamba2 block",
    "torch_prefill": "Prefill through ptsolve.torch next to SDPA on 85 shapes",
    "tune": "`ptsolve tune` end to end on the GPU, and the profiler plugin",
}
