"""The serving layer: ptsolve's schedules as shape-generic kernels that PyTorch users call (``ptsolve.torch``).

This package is the one place where the core's face (``ptsolve.optimize``, the operators, the simulator) meets the
code generator (``codegen``: lowering, emitters, nvcc, the launch primitive). The rest of ``ptsolve`` never imports
``codegen``, and ``codegen`` never imports this package; ``tests/layering.toml`` and ``tests/test_layering.py``
hold that.

A *shape class* (``classes.ShapeClass``) is what changes the schedule or the binary: the operator, the dtype and, for
attention, head_dim, causal and the GQA ratio's bucket; for split-KV decode (seq_q <= ``DECODE_MAX_SEQ_Q``) head_dim,
causal and the consumer warpgroups its packed query tile needs (each with a softcap variant, its plain class's schedule
with the tanh: ``OpClasses.derived``); for Mamba2's chunk kernels head_dim, d_state and chunk; for its decode step
(``ssm_step``) head_dim and d_state. The sizes that do not (batch, sequence lengths, heads; GEMM's M, N, K; Mamba2's
batch, seq, heads and ngroups, the decode step's state dtype) are kernel arguments (``lower(..., generic=True)``). The
rooms:

- ``classes``: ``ShapeClass`` and the table of operators that have classes (``register``, one line per operator);
- ``gemm``, ``attention``, ``decode``, ``mamba2``, ``ssm_step``: each operator's classes and launchers, in its own
  module;
- ``table``: the schedule table (``schedule_table.json``, ``python3 -m ptsolve.serve table``), or a class solved
  on first use where OR-Tools is installed;
- ``kernels``: each class's generic kernel, emitted once per process and compiled once (the cubin cached on disk);
- ``prepared``: the launch cache (a warm call is a dict lookup and a ``cuLaunchKernel`` on the current stream);
- ``build``: the table's command line (``python3 -m ptsolve.serve table|precompile``, or ``ptsolve serve ...``).

The launchers take torch tensors: ``attention.attention``, ``decode.decode`` and ``gemm.gemm`` (reached through
their modules, whose names they share), ``chunk_scan``, ``chunk_state``, ``state_passing``, ``ssm_step`` and every
``*_launch``
(re-exported here).
``ptsolve.torch`` is the user's front door over them. Importing this package imports neither torch nor cuda-python.
"""
from __future__ import annotations

# the operators' modules register their classes on import: this order is the table's and ``classes()``'s
from .gemm import gemm_class, gemm_launch  # isort: skip
from .mamba2 import (MAMBA_OPS, STATE_PASSING, chunk_scan, chunk_scan_launch, chunk_state,  # isort: skip
                     chunk_state_launch, mamba_class, mamba_params, state_passing, state_passing_class,
                     state_passing_launch, state_passing_params)
from .attention import (GQA_BUCKETS, HEAD_DIMS, AttentionFamily, attention_class, attention_family,  # isort: skip
                        attention_launch, gqa_bucket)
from .decode import (DECODE_HEAD_DIMS, DECODE_MAX_SEQ_Q, DECODE_REP_SPLITS, DECODE_REPLAY_TRIPS,  # isort: skip
                     DecodeFamily, decode_bucketed, decode_class, decode_launch, decode_pick, decode_retime,
                     decode_splits, decode_variants)
from .build import build_table  # noqa: E402
from .classes import (  # noqa: E402
                     DTYPES,
                     HW,
                     OpClasses,
                     ShapeClass,
                     class_fix,
                     classes,
                     register,
                     representative,
                     variants,  # noqa: E402
)
from .kernels import ClassKernel, compile_class, kernel  # noqa: E402
from .prepared import current_stream  # noqa: E402
from .ssm_step import SSM_STEP, ssm_step, ssm_step_class, ssm_step_flags, ssm_step_params  # noqa: E402
from .table import TABLE, class_program, load_table, schedule, solve, solvers_installed, table_path  # noqa: E402

__all__ = ["DECODE_HEAD_DIMS", "DECODE_MAX_SEQ_Q", "DECODE_REPLAY_TRIPS", "DECODE_REP_SPLITS", "DTYPES",
           "GQA_BUCKETS", "HEAD_DIMS", "HW", "AttentionFamily", "DecodeFamily",
           "MAMBA_OPS", "SSM_STEP", "STATE_PASSING", "TABLE", "ClassKernel", "OpClasses", "ShapeClass",
           "attention_class",
           "attention_family", "attention_launch", "build_table", "chunk_scan", "chunk_scan_launch", "chunk_state",
           "chunk_state_launch",
           "class_fix", "class_program", "classes", "compile_class", "current_stream", "decode_bucketed",
           "decode_class", "decode_launch", "decode_pick", "decode_retime", "decode_splits", "decode_variants",
           "gemm_class", "gemm_launch", "gqa_bucket", "kernel", "load_table", "mamba_class", "mamba_params",
           "register", "representative", "schedule", "solve", "solvers_installed",
           "ssm_step", "ssm_step_class", "ssm_step_flags", "ssm_step_params", "state_passing",
           "state_passing_class", "state_passing_launch", "state_passing_params", "table_path", "variants"]
