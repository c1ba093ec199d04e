"""Turning one role's loop order into code: prologue / steady-state loop / epilogue, plus the bookkeeping
the async tensor-core work needs (which ``wgmma.wait_group`` depth each task may use, how many register
buffers a value needs, whether the order respects the dependencies, the tensor-core turn between
warpgroups).

Semantics (from ``codegen.plan``): iteration ``j`` of the emitted loop runs task ``t`` (stage ``s``) for
reduction iteration ``it = j - s``. With S stages the loop runs j = 0 .. T + S - 2; the first S - 1 values
of j are the prologue, the last S - 1 the epilogue; in between every task runs (the steady state).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ptsolve.errors import CodegenError

Body = Callable[[str, str, "int | None", "Mapping[str, int] | None"], str]
"""body(task, it_expr, parity_of_it or None, wait depths or None (= wait for everything)) -> C++ code."""

SIM_EXTRA = 6  # iterations simulated beyond the prologue; the commit sequence is periodic well before that


@dataclass(frozen=True)
class LoopOrder:
    """One role's loop body: ``ops`` = [(task base name, stage)] in issue order."""

    ops: tuple[tuple[str, int], ...]

    @property
    def stages(self) -> int:
        return 1 + max((s for _, s in self.ops), default=0)

    def flatten(self, trips: int) -> list[tuple[int, str, int]]:
        """(j, task, it) in emitted order for ``trips`` reduction iterations."""
        out = []
        for j in range(trips + self.stages - 1):
            for name, s in self.ops:
                if 0 <= j - s < trips:
                    out.append((j, name, j - s))
        return out


def check_deps(role: str, order: LoopOrder, deps: Mapping[str, Sequence[tuple[str, int]]]) -> None:
    """Raise CodegenError when a task would run before one it depends on (``deps[t]`` = [(task, offset)]:
    iteration ``it`` of ``t`` needs iteration ``it + offset`` of ``task``)."""
    trips = order.stages + SIM_EXTRA
    pos = {(name, it): k for k, (_, name, it) in enumerate(order.flatten(trips))}
    present = {n for n, _ in order.ops}
    for (name, it), k in pos.items():
        for dep, off in deps.get(name, ()):
            if dep not in present or not 0 <= it + off < trips:
                continue
            if pos[(dep, it + off)] > k:
                rel = "the same iteration" if off == 0 else f"iteration it{off:+d}"
                raise CodegenError(f"plan order for {role}: {name} (iteration it) is issued before {dep} of {rel}, "
                                   f"which it depends on; reorder the tasks or change their stages")


def buffers_needed(order: LoopOrder, producer: str, readers: Sequence[str]) -> int:
    """Register buffers for a value written by ``producer`` (async) and read by ``readers``: 1 when every
    reader of iteration it runs before the producer of it+1, 2 when before that of it+2."""
    trips = order.stages + SIM_EXTRA
    pos = {(name, it): k for k, (_, name, it) in enumerate(order.flatten(trips))}
    need = 1
    for it in range(trips):
        last = max(pos[(r, it)] for r in readers)
        for nb in (1, 2):
            nxt = pos.get((producer, it + nb))
            if nxt is not None and nxt < last:
                need = max(need, nb + 1)
    if need > 2:
        raise CodegenError(f"plan order keeps more than two {producer} results live at once; at most one stage of "
                           "look-ahead between the tensor-core task and its readers is supported")
    return need


def wait_depths(order: LoopOrder, commits: set[str], needs: Mapping[str, Sequence[tuple[str, int]]]
                ) -> dict[str, dict[str, int]]:
    """``wgmma.wait_group`` depth of each task in the steady loop.

    A task with ``needs[t] = [(dep, off)]`` must see the wgmma group committed by ``dep`` of iteration
    ``it + off`` complete; the depth is the number of groups committed after that one so far (a task that
    commits a group itself waits after its own commit). The prologue commits an empty group for every
    committing task whose iteration does not exist yet (see ``emit_loop``), so the sequence of groups is
    periodic from the first steady iteration and one depth per task is exact for all of them.
    """
    S = order.stages
    trips = S + SIM_EXTRA
    committed: list[tuple[str, int]] = []
    steady: dict[str, dict[str, int]] = {}
    for j in range(trips):
        for name, s in order.ops:
            it = j - s
            if name in commits:
                committed.append((name, it))  # it < 0: the prologue's empty group
            if j < S - 1:
                continue
            depths = steady.setdefault(name, {})
            for dep, off in needs.get(name, ()):
                if it + off < 0:
                    continue  # nothing to wait for; the other iterations set the depth
                tgt = (dep, it + off)
                if tgt not in committed:
                    raise CodegenError(f"{name} waits for {dep} of iteration it{off:+d}, which is not issued before it")
                d = len(committed) - 1 - committed.index(tgt)
                depths[dep] = min(depths.get(dep, d), d, 7)
    return steady


def emit_loop(order: LoopOrder, trips: str | int, body: Body, nbuf: int, steady: Mapping[str, Mapping[str, int]],
              commits: set[str] = frozenset(), min_trips: int = 1,
              turn: tuple[str, str, frozenset[str]] | None = None) -> str:
    """C++ for one role's loop: prologue (j = 0 .. S-2), steady loop (j = S-1 .. T-1), epilogue
    (j = max(T, S-1) .. T+S-2). ``trips`` (T) is the number of reduction iterations, an int or a C expression.

    Prologue and epilogue tasks are guarded by their iteration's existence and wait at depth 0; the
    prologue commits an empty wgmma group in place of each committing task that has no iteration yet, so
    the steady loop's wait depths (``steady``, from ``wait_depths``) hold from its first iteration. The
    steady loop only runs when T >= S, i.e. when the prologue ran in full.
    ``nbuf`` 2 makes every task see the compile-time parity of its iteration (double-buffered registers):
    the steady loop is unrolled by two and the epilogue emitted for both parities of its first j.
    ``min_trips`` is a lower bound on T: guards it implies are left out, which keeps paths that cannot
    happen out of ptxas's view (on such paths it would serialise the wgmma pipeline).
    ``turn`` = (wait code, pass code, tensor-core task names): in every emitted iteration the role waits
    for its turn before its first tensor-core task and passes the turn on after its last one (the
    tensor-core order between warpgroups, e.g. ping-pong). Needs unguarded prologue and epilogue.
    """
    S = order.stages
    if isinstance(trips, int):
        min_trips = max(min_trips, trips)
    T = str(trips)
    out = [f"// loop: {S} stage(s): prologue {S - 1}, steady loop, epilogue {S - 1}"]

    def par(it_parity: int) -> int | None:
        return it_parity % 2 if nbuf == 2 else None

    def with_turn(parts: list[tuple[str, str]]) -> list[str]:
        """parts = [(task, code)] of one iteration; add the turn wait/pass around its tensor-core tasks."""
        if turn is None:
            return [c for _, c in parts]
        wait, pas, tc = turn
        idx = [k for k, (n, _) in enumerate(parts) if n in tc]
        if not idx:
            return [c for _, c in parts]
        out_ = [c for _, c in parts]
        out_[idx[0]] = f"{wait}\n{out_[idx[0]]}"
        out_[idx[-1]] = f"{out_[idx[-1]]}\n{pas}"
        return out_

    if turn is not None and (min_trips < S - 1 or S > 1 + min_trips):
        raise CodegenError("tensor-core turn order needs a prologue and epilogue without guards")
    for j in range(S - 1):
        out.append(f"// prologue j={j}")
        parts = []
        for name, s in order.ops:
            if s <= j:
                it = j - s
                guard = "" if it < min_trips else f"if ({it} < {T}) "
                parts.append((name, f"{guard}{{  // {name} it={it}\n{body(name, str(it), par(it), None)}\n}}"))
            elif name in commits:
                parts.append(("", f"wg_commit();  // empty group in place of {name} it={j - s}"))
        out += with_turn(parts)

    def steady_body(jvar: str, jpar: int | None) -> str:
        parts = []
        for name, s in order.ops:
            it = f"({jvar} - {s})" if s else jvar
            p = None if jpar is None else (jpar - s) % 2
            parts.append((name, f"{{  // {name}\n{body(name, it, p, steady.get(name, {}))}\n}}"))
        return "\n".join(with_turn(parts))

    j0 = S - 1
    if nbuf == 1:
        out.append(f"#pragma unroll 1\nfor (int j = {j0}; j < {T}; ++j) {{\n{steady_body('j', None)}\n}}")
    else:
        p0 = j0 % 2
        out.append(f"{{\nint j = {j0};\n#pragma unroll 1\nfor (; j + 1 < {T}; j += 2) {{\n"
                   f"{{\n{steady_body('j', p0)}\n}}\n{{\nconst int j1 = j + 1;\n{steady_body('j1', 1 - p0)}\n}}\n}}\n"
                   f"if (j < {T}) {{\n{steady_body('j', p0)}\n}}\n}}")
    if S > 1 and min_trips >= S - 1:  # the epilogue starts at j = T: task s runs in step e iff s > e
        def epi_known(tpar: int | None) -> str:
            steps = []
            for e in range(S - 1):
                parts = []
                for name, s in order.ops:
                    if s > e:
                        p = None if tpar is None else (tpar + e - s) % 2
                        parts.append((name, f"{{  // epilogue {name}\n{body(name, f'({T} + {e - s})', p, None)}\n}}"))
                steps += with_turn(parts)
            return "\n".join(steps)
        if nbuf == 1:
            out.append("// epilogue\n" + epi_known(None))
        else:
            out.append(f"// epilogue\nif (({T}) & 1) {{\n{epi_known(1)}\n}} else {{\n{epi_known(0)}\n}}")
    elif S > 1:
        def epi(jpar: int | None) -> str:
            parts = []
            for e in range(S - 1):
                parts.append(f"{{ const int je = ej0 + {e};")
                for name, s in order.ops:
                    p = None if jpar is None else (jpar + e - s) % 2
                    parts.append(f"if (je - {s} >= 0 && je - {s} < {T}) {{  // {name}\n"
                                 f"{body(name, f'(je - {s})', p, None)}\n}}")
                parts.append("}")
            return "\n".join(parts)
        head = f"// epilogue\n{{\nconst int ej0 = ({T}) > {S - 1} ? ({T}) : {S - 1};\n"
        if nbuf == 1:
            out.append(head + epi(None) + "\n}")
        else:
            out.append(head + f"if (ej0 & 1) {{\n{epi(1)}\n}} else {{\n{epi(0)}\n}}\n}}")
    return "\n".join(out)
