"""Software-pipelined loops, for every back end: turning one role's loop order into code (prologue /
steady-state loop / epilogue), checking that an order respects its dependencies, the tensor-core turns between
consumer roles, and a CPU simulation of the roles' synchronisation showing they cannot deadlock. The text of a
target's own instructions (wgmma waits, named barriers, semaphores) comes from its back end; here only the loop.

Semantics (from ``codegen.plan``): iteration ``j`` of the emitted loop runs task ``t`` (stage ``s``) for
reduction iteration ``it = j - s``. With S stages the loop runs j = 0 .. T + S - 2; the first S - 1 values
of j are the prologue, the last S - 1 the epilogue; in between every task runs (the steady state).

Tensor-core turns (``plan_turns``): the plan's ``tc_order`` [x_0, ..., x_{n-1}] is the order in which the
tensor cores serve the mma tasks within one emitted iteration j, so over the whole loop they are served in
the order (j, k) for j = 0, 1, ... and k = 0 .. n-1 (x_k of iteration j works on reduction iteration
j - stage). Where x_k and x_{k+1} (cyclically) belong to different warpgroups A and B, A arrives at B's named
barrier after issuing x_k and B syncs on it before issuing x_{k+1}: the FA3 ping-pong, generalised. Every
role runs the same number of emitted iterations (the largest stage count of all roles) and performs the
turn operations of every x_k in every iteration, also where x_k has no reduction iteration there (prologue,
epilogue, short causal rows): the roles' turn sequences then match for any trip count T (which all
warpgroups of a CTA share), so they cannot fall out of step; ``simulate`` checks this, with the mbarriers.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ptsolve.errors import CodegenError

Body = Callable[[str, str, "int | None", "Mapping[str, int] | None"], str]
"""body(task, it_expr, parity_of_it or None, wait depths or None (= wait for everything)) -> C++ code."""

SIM_EXTRA = 6  # iterations simulated beyond the prologue; the commit sequence is periodic well before that


@dataclass(frozen=True)
class LoopOrder:
    """One role's loop body: ``ops`` = [(task base name, stage)] in issue order."""

    ops: tuple[tuple[str, int], ...]
    span: int = 0  # at least this many stages: roles that take tensor-core turns run equally many iterations

    @property
    def stages(self) -> int:
        return max(1 + max((s for _, s in self.ops), default=0), self.span)

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


def emit_loop(order: LoopOrder, trips: str | int, body: Body, nbuf: int, steady: Mapping[str, Mapping[str, int]],
              commits: set[str] = frozenset(), min_trips: int = 1,
              turn: Mapping[str, tuple[str, str]] | None = None, tail: str = "") -> str:
    """C++ for one role's loop: prologue (j = 0 .. S-2), steady loop (j = S-1 .. T-1), epilogue
    (j = max(T, S-1) .. T+S-2). ``trips`` (T) is the number of reduction iterations, an int or a C expression.

    Prologue and epilogue tasks are guarded by their iteration's existence and wait at depth 0; the
    prologue commits an empty wgmma group in place of each committing task that has no iteration yet, so
    the steady loop's wait depths (``steady``, from ``codegen.cuda.schedule.wait_depths``) hold from its first
    iteration. The steady loop only runs when T >= S, i.e. when the prologue ran in full.
    ``nbuf`` 2 makes every task see the compile-time parity of its iteration (double-buffered registers):
    the steady loop is unrolled by two and the epilogue emitted for both parities of its first j.
    ``min_trips`` is a lower bound on T: guards it implies are left out, which keeps paths that cannot
    happen out of ptxas's view (on such paths it would serialise the wgmma pipeline).
    ``turn`` = {task: (code before, code after)}: the tensor-core turn operations (``plan_turns``). They
    run at the task's place in every emitted iteration (max(T, S-1) + S - 1 of them), outside the guards and
    also where the task has no iteration, so roles with equal S perform the same turn sequence for any T.
    ``tail``: code at the end of every steady iteration, before the next one starts (the back end's).
    """
    S = order.stages
    if isinstance(trips, int):
        min_trips = max(min_trips, trips)
    lp = _Loop(order, str(trips), body, nbuf, steady, commits, dict(turn or {}), tail)
    out = [f"// loop: {S} stage(s): prologue {S - 1}, steady loop, epilogue {S - 1}", *lp.prologue(min_trips),
           lp.steady_loop()]
    if S > 1 and min_trips >= S - 1:  # the epilogue starts at j = T: task s runs in step e iff s > e
        out.append(lp.epilogue_known())
    elif S > 1:
        out.append(lp.epilogue_guarded())
    return "\n".join(c for c in out if c)


@dataclass(frozen=True)
class _Loop:
    """The parts of one role's emitted loop (``emit_loop``'s arguments, ``T`` the trip count's C text)."""

    order: LoopOrder
    T: str
    body: Body
    nbuf: int
    steady: Mapping[str, Mapping[str, int]]
    commits: set[str]
    turn: dict[str, tuple[str, str]]
    tail: str = ""

    def par(self, it_parity: int) -> int | None:
        return it_parity % 2 if self.nbuf == 2 else None

    def wrap(self, name: str, code: str) -> str:
        """``code`` (the task, its guarded form, or nothing) between the task's turn operations."""
        if name not in self.turn:
            return code
        pre, post = self.turn[name]
        return "\n".join(c for c in (pre, code, post) if c)

    def prologue(self, min_trips: int) -> list[str]:
        """j = 0 .. S-2: the tasks whose iteration exists (guarded unless ``min_trips`` implies it), an empty
        commit group in place of a committing task that has none yet."""
        out = []
        for j in range(self.order.stages - 1):
            out.append(f"// prologue j={j}")
            for name, s in self.order.ops:
                if s <= j:
                    it = j - s
                    guard = "" if it < min_trips else f"if ({it} < {self.T}) "
                    out.append(self.wrap(name, f"{guard}{{  // {name} it={it}\n"
                                               f"{self.body(name, str(it), self.par(it), None)}\n}}"))
                elif name in self.commits:
                    out.append(self.wrap(name, f"wg_commit();  // empty group in place of {name} it={j - s}"))
                else:
                    out.append(self.wrap(name, ""))
        return out

    def steady_body(self, jvar: str, jpar: int | None) -> str:
        parts = []
        for name, s in self.order.ops:
            it = f"({jvar} - {s})" if s else jvar
            p = None if jpar is None else (jpar - s) % 2
            parts.append(self.wrap(name, f"{{  // {name}\n{self.body(name, it, p, self.steady.get(name, {}))}\n}}"))
        return "\n".join([*parts, self.tail] if self.tail else parts)

    def steady_loop(self) -> str:
        """j = S-1 .. T-1; unrolled by two (each half with its compile-time parity) for double-buffered registers."""
        j0, T = self.order.stages - 1, self.T
        if self.nbuf == 1:
            return f"#pragma unroll 1\nfor (int j = {j0}; j < {T}; ++j) {{\n{self.steady_body('j', None)}\n}}"
        p0 = j0 % 2
        return (f"{{\nint j = {j0};\n#pragma unroll 1\nfor (; j + 1 < {T}; j += 2) {{\n"
                f"{{\n{self.steady_body('j', p0)}\n}}\n"
                f"{{\nconst int j1 = j + 1;\n{self.steady_body('j1', 1 - p0)}\n}}\n}}\n"
                f"if (j < {T}) {{\n{self.steady_body('j', p0)}\n}}\n}}")

    def _epi_known(self, tpar: int | None) -> str:
        steps = []
        for e in range(self.order.stages - 1):
            for name, s in self.order.ops:
                if s > e:
                    p = None if tpar is None else (tpar + e - s) % 2
                    steps.append(self.wrap(name, f"{{  // epilogue {name}\n"
                                                 f"{self.body(name, f'({self.T} + {e - s})', p, None)}\n}}"))
                else:
                    steps.append(self.wrap(name, ""))
        return "\n".join(c for c in steps if c)

    def epilogue_known(self) -> str:
        """The epilogue where T >= S - 1 is known: it starts at j = T, no guards (per parity of T with two buffers)."""
        if self.nbuf == 1:
            return "// epilogue\n" + self._epi_known(None)
        return f"// epilogue\nif (({self.T}) & 1) {{\n{self._epi_known(1)}\n}} else {{\n{self._epi_known(0)}\n}}"

    def _epi(self, jpar: int | None) -> str:
        parts = []
        for e in range(self.order.stages - 1):
            parts.append(f"{{ const int je = ej0 + {e};")
            for name, s in self.order.ops:
                p = None if jpar is None else (jpar + e - s) % 2
                parts.append(self.wrap(name, f"if (je - {s} >= 0 && je - {s} < {self.T}) {{  // {name}\n"
                                             f"{self.body(name, f'(je - {s})', p, None)}\n}}"))
            parts.append("}")
        return "\n".join(parts)

    def epilogue_guarded(self) -> str:
        """The epilogue where T may be shorter than S - 1: it starts at max(T, S-1), each task guarded."""
        S, T = self.order.stages, self.T
        head = f"// epilogue\n{{\nconst int ej0 = ({T}) > {S - 1} ? ({T}) : {S - 1};\n"
        if self.nbuf == 1:
            return head + self._epi(None) + "\n}"
        return head + f"if (ej0 & 1) {{\n{self._epi(1)}\n}} else {{\n{self._epi(0)}\n}}\n}}"


# ------------------------------------------------------------------------------------------ tensor-core turns


@dataclass(frozen=True)
class Turns:
    """Named-barrier turn operations that enforce a ``tc_order`` between roles.

    ``ops[role][task] = (bar to sync on before issuing the task or None, bar to arrive at after issuing it
    or None)``; ``first = (role, bar)``: the role that arrives once per CTA before its loop, handing the very
    first turn to the owner of ``tc_order[0]`` (later tiles of a persistent CTA continue the sequence).
    ``handoffs`` lists (from role, task, to role, task, bar) for people and tests.
    """

    ops: dict[str, dict[str, tuple[int | None, int | None]]]
    first: tuple[str, int] | None
    handoffs: tuple[tuple[str, str, str, str, int], ...] = field(default=())


def plan_turns(loops: Mapping[str, LoopOrder], tc_order: Sequence[tuple[str, str]],
               bar_of: Mapping[str, int]) -> Turns | None:
    """The turn operations enforcing ``tc_order`` = [(role, task)] (the order within one emitted iteration;
    cyclic across iterations), or None when it involves fewer than two roles (nothing to enforce).

    Consecutive entries of one role need no barrier. A handoff into role B always uses B's barrier
    ``bar_of[B]``: B syncs on it once per handoff and the giving role arrives once, and the next arrival on it
    can only come after B has issued (the chain of turns runs through B), so generations never mix.
    Raises CodegenError when a role's loop issues its tensor-core tasks in another order than tc_order
    lists them: the turns could then only deadlock or fail to enforce the order.
    """
    roles = {r for r, _ in tc_order}
    if len(roles) < 2:
        return None
    for r in sorted(roles):
        want = [t for rr, t in tc_order if rr == r]
        have = [t for t, _ in loops[r].ops if t in want]
        if have != want:
            raise CodegenError(f"tc_order serves {r}'s tensor-core tasks in the order {want}, but {r}'s loop issues "
                               f"them as {have}; a turn order that contradicts the issue order would deadlock")
    n = len(tc_order)
    ops: dict[str, dict[str, tuple[int | None, int | None]]] = {r: {} for r in roles}
    hand = []
    for k, (r, t) in enumerate(tc_order):
        pr, _ = tc_order[k - 1]
        nr, nt = tc_order[(k + 1) % n]
        ops[r][t] = (bar_of[r] if pr != r else None, bar_of[nr] if nr != r else None)
        if nr != r:
            hand.append((r, t, nr, nt, bar_of[nr]))
    last, first = tc_order[-1][0], tc_order[0][0]
    return Turns(ops, (last, bar_of[first]) if last != first else None, tuple(hand))


Op = tuple[Any, ...]
"""A simulated step: ("sync", bar) | ("arrive", bar) | ("wait", key, count) | ("signal", key) | ("mark", text)."""


def role_steps(order: LoopOrder, trips: int, turn: Mapping[str, tuple[int | None, int | None]],
               task_ops: Callable[[str, int], Iterable[Op]]) -> list[Op]:
    """What one role's emitted loop does for ``trips`` reduction iterations, as ``emit_loop`` lays it out:
    every (task, stage) of every emitted iteration (prologue j = 0 .. S-2, steady loop, epilogue
    j = max(T, S-1) .. max(T, S-1) + S-2), its turn sync before and turn arrive after (whether or not the task
    has an iteration there), and ``task_ops(task, it)`` where it has one."""
    out: list[Op] = []
    S = order.stages
    for j in range(max(trips, S - 1) + S - 1):
        for name, s in order.ops:
            w, p = turn.get(name, (None, None))
            if w is not None:
                out.append(("sync", w))
            if 0 <= j - s < trips:
                out.append(("mark", f"{name} it={j - s}"))
                out += task_ops(name, j - s)
            if p is not None:
                out.append(("arrive", p))
    return out


def simulate(programs: Mapping[str, Sequence[Op]], what: str, threshold: int = 2) -> None:
    """Run the roles' step lists against each other on the CPU and raise CodegenError if they deadlock or
    misuse a named barrier.

    Named barriers (``threshold`` roles each; the hardware counts 128 threads per warpgroup): ``sync`` waits
    until the barrier's generation is complete, ``arrive`` contributes without waiting. A generation must be
    one sync and one arrive of another role; two arrivals in one generation would let the barrier complete
    without its waiter (the turn passed twice). ``wait key n`` blocks until ``signal key`` ran n times
    (mbarrier phases, TMA ring slots). Each role runs as far ahead as it can before the next one moves (the
    schedule that exposes run-ahead errors); the roles are tried in both orders.
    """
    for names in (list(programs), list(programs)[::-1]):
        pc = dict.fromkeys(names, 0)
        counts: dict[Any, int] = {}
        bars: dict[int, dict[str, Any]] = {}
        waiting: dict[str, tuple[int, int]] = {}  # role -> (bar, generation) it synced on
        gen: dict[int, int] = {}

        progress = True
        while progress:
            progress = False
            for r in names:
                prog = programs[r]
                while pc[r] < len(prog):
                    op = prog[pc[r]]
                    if r in waiting:
                        b, g0 = waiting[r]
                        if gen.get(b, 0) == g0:
                            break
                        del waiting[r]
                        pc[r] += 1
                        progress = True
                        continue
                    kind = op[0]
                    if kind == "wait":
                        if counts.get(op[1], 0) < op[2]:
                            break
                    elif kind == "signal":
                        counts[op[1]] = counts.get(op[1], 0) + 1
                    elif kind in ("sync", "arrive"):
                        st = bars.setdefault(op[1], {"sync": [], "arrive": []})
                        st[kind].append(r)
                        if len(st["sync"]) > 1 or len(st["arrive"]) > 1:
                            raise CodegenError(f"{what}: named barrier {op[1]} gets {kind} from {r} while "
                                               f"{st['sync'] + st['arrive']} already counted in the same generation; "
                                               "the tensor-core turn would be passed to the wrong warpgroup")
                        if kind == "sync":
                            waiting[r] = (op[1], gen.get(op[1], 0))
                        if len(st["sync"]) + len(st["arrive"]) == threshold:
                            if st["arrive"] and st["sync"] and st["arrive"] == st["sync"]:
                                raise CodegenError(f"{what}: {r} both syncs on and arrives at barrier {op[1]}")
                            bars.pop(op[1])
                            gen[op[1]] = gen.get(op[1], 0) + 1
                        if kind == "sync":
                            progress = True
                            continue  # re-examined at the top: passes once the generation is complete
                    pc[r] += 1
                    progress = True
        stuck = {r: pc[r] for r in names if pc[r] < len(programs[r])}
        if stuck:
            where = []
            for r, k in stuck.items():
                prog = programs[r]
                last = next((prog[i][1] for i in range(k - 1, -1, -1) if prog[i][0] == "mark"), "start")
                where.append(f"{r} at {prog[k]} after {last}")
            raise CodegenError(f"{what}: the roles would deadlock ({'; '.join(where)}); "
                               "the tensor-core order cannot be enforced with this loop order")
