"""The CUDA back end's own pipeline bookkeeping: which ``wgmma.wait_group`` depth each consumer task may use in
the steady loop (``wait_depths``), where an operator's early register write can move (``early_writes``), and the
PTX named-barrier text of the tensor-core turns (``turn_code``). The loop itself is ``codegen.loop``'s."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ptsolve.errors import CodegenError

from ..kernel_ir import Role
from ..loop import SIM_EXTRA, LoopOrder, Turns


def wait_depths(order: LoopOrder, commits: set[str], needs: Mapping[str, Sequence[tuple[str, int]]]
                ) -> dict[str, dict[str, int]]:
    """``wgmma.wait_group`` depth of each task in the steady loop: ``{task: {"depth": n}}``, or ``{task: {}}``
    when an earlier wait of the role already covered everything it needs (no wait is emitted: a weaker wait
    after a stronger one would make ptxas assume the later groups' registers still in flight and serialise).

    A task with ``needs[t] = [(dep, off)]`` must see the wgmma group committed by ``dep`` of iteration
    ``it + off`` complete; its depth is the number of groups committed after that one so far (a task that
    commits a group itself waits after its own commit). The prologue commits an empty group for every
    committing task whose iteration does not exist yet, and its tasks (like the epilogue's) wait for everything
    (see ``emit_loop``), so the sequence of groups is periodic from the first steady iteration and one depth per
    task holds for all of them. Depths are found as a fixpoint of the waits actually emitted.
    """
    S = order.stages
    trips = S + SIM_EXTRA
    decided: dict[str, dict[str, int]] = {}
    for _ in range(8):
        committed: list[tuple[str, int]] = []
        done = 0  # groups [0, done) are known complete
        found: dict[str, int | None] = {}
        for j in range(trips):
            for name, s in order.ops:
                it = j - s
                if name in commits:
                    committed.append((name, it))  # it < 0: the prologue's empty group
                req = []
                for dep, off in needs.get(name, ()):
                    if it + off < 0:
                        continue  # nothing to wait for; the other iterations set the depth
                    tgt = (dep, it + off)
                    if tgt not in committed:
                        raise CodegenError(f"{name} waits for {dep} of iteration it{off:+d}, which is not issued "
                                           "before it")
                    k = committed.index(tgt)
                    if k >= done:
                        req.append(len(committed) - 1 - k)
                if j >= S - 1 and it >= 0:
                    cur = found.get(name)
                    found[name] = min([*req, *([] if cur is None else [cur]), 7]) if req else cur
                if j < S - 1:
                    d = 0 if name in needs and it >= 0 else None
                else:
                    d = decided.get(name, {}).get("depth") if decided else (min(req, default=None))
                if d is not None:
                    done = max(done, len(committed) - d)
        new = {n: ({} if found.get(n) is None else {"depth": found[n]}) for n in needs}
        if new == decided:
            break
        decided = new
    return decided


def early_writes(opk: Any, role: Role, loop: LoopOrder, commits: set[str], needs: dict[str, list],
                 steady: dict[str, dict[str, int]]) -> tuple[dict[str, list], dict[str, dict[str, int]], set[str]]:
    """Where an operator lets an earlier task of the iteration do a later task's write of the register buffer that
    task allocates (``OpKernel.early``), do it when that is free: the earlier task then needs what the later one
    waits for (the wgmma readers of the buffer's older copy complete, from the KernelIR's waits), and in the steady
    loop an earlier wait of the role must already cover it (no wait is added there; the prologue and epilogue wait
    for everything anyway). Where the later task runs a stage behind the earlier one the write moves into the
    previous emitted iteration, before the loop's back edge, which ptxas does not schedule across; left in the
    later task it lands between that task's tensor-core turn (``bar.sync``) and its wgmma issue, since ptxas moves
    register work across ``bar.sync`` towards its use (FlashAttention's second warpgroup: 32 F2FP there). Within
    one stage it moves too: one warpgroup packing early and the other late measured 1% slower on the H200 than
    both early (causal FA3c / FA13c, bench study ab). Returns (needs, steady wait depths, tasks
    whose bodies take the early form)."""
    stage = dict(loop.ops)
    tag = f"@{role.group}"
    early: set[str] = set()
    for late, first in opk.early.items():
        t, e = late + tag, first + tag
        if t not in stage or e not in stage or t not in needs or e in needs or stage[t] < stage[e]:
            continue
        aug = {**needs, e: list(needs[t])}
        try:
            st = wait_depths(loop, commits, aug)
        except CodegenError:
            continue  # a reader of the older copy is issued after the earlier task: not possible there
        if st.get(e) == {} and all(st.get(k) == v for k, v in steady.items()):
            needs, steady = aug, st
            early |= {t, e}
    return needs, steady, early


def turn_code(tn: Turns, role: str, threads: int) -> dict[str, tuple[str, str]]:
    """``emit_loop``'s ``turn`` argument for ``role``: PTX named-barrier statements per task (``bar.sync`` on
    the turn's barrier before the task, ``bar.arrive`` at the next one after it)."""
    out = {}
    for task, (w, p) in tn.ops.get(role, {}).items():
        pre = "" if w is None else (f'asm volatile("bar.sync {w}, {threads};" ::: "memory");  '
                                    f"// wait for the turn before {task}")
        post = "" if p is None else (f'asm volatile("bar.arrive {p}, {threads};" ::: "memory");  '
                                     f"// {task} issued: pass the turn on")
        out[task] = (pre, post)
    return out
