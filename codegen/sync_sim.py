"""One CPU simulator of a kernel's synchronisation, for every operator: built from the KernelIR alone.

Each role becomes the list of synchronisation steps its emitted code performs (``loop.role_steps`` lays
the loop out exactly as ``loop.emit_loop`` emits it): the producer waits for a ring slot's release and
fills it, each consumer waits for the slot's fill at its first reader and releases it where the KernelIR
says, takes its tensor-core turns, and at the end of a tile releases the prologue's buffers and the slots
whose release point lies past the last iteration. ``loop.simulate`` runs the roles against each other
(every interleaving that exposes run-ahead) and raises CodegenError on a deadlock. Arrivals are counted per
warpgroup (the kernel's four per-warp arrivals act as one).
"""
from __future__ import annotations

from .kernel_ir import KernelIR
from .loop import LoopOrder, Op, Turns, plan_turns, role_steps, simulate


def loops(ir: KernelIR) -> dict[str, LoopOrder]:
    """Each role's LoopOrder; with enforced turns every consumer runs as many emitted iterations as the
    longest (identical turn sequences)."""
    cons = [r for r in ir.roles if r.group >= 0]
    span = max((LoopOrder(r.loop).stages for r in cons), default=1) if ir.turns else 0
    return {r.name: LoopOrder(r.loop, span if r.group >= 0 else 0) for r in ir.roles}


def turns(ir: KernelIR, lo: dict[str, LoopOrder] | None = None) -> Turns | None:
    """Named-barrier turns enforcing ``ir.tc_order`` (barrier 1 + g is warpgroup g's turn), or None."""
    if not ir.turns:
        return None
    lo = lo or loops(ir)
    tc = [(f"wg{x.split('@')[1]}", x) for x in ir.tc_order]
    return plan_turns({r: o for r, o in lo.items() if r != "producer"}, tc,
                      {r.name: 1 + r.group for r in ir.roles if r.group >= 0})


def owners(ir: KernelIR, tile: int) -> list[str]:
    """The consumer roles that work on a persistent CTA's ``tile``-th tile: all of them (cooperative), or warpgroup
    ``tile mod groups`` alone (ping-pong, ``KernelIR.pingpong``)."""
    cons = [r.name for r in ir.roles if r.group >= 0]
    return [cons[tile % len(cons)]] if ir.pingpong else cons


def tile_turns(ir: KernelIR, tn: Turns | None, role: str) -> tuple[int | None, int | None]:
    """A ping-pong warpgroup's turn per tile: (named barrier it syncs on before its first mma of a tile, the one it
    arrives at once its last mma of the tile is issued, when the CTA has a next tile), from the same turn plan as
    the cooperative kernels' per-iteration turns; (None, None) without turns."""
    if tn is None:
        return None, None
    ops = list(tn.ops.get(role, {}).values())
    return (ops[0][0], ops[-1][1]) if ops else (None, None)


def check(ir: KernelIR) -> None:
    """Simulate ``ir``'s kernel for short and long trip counts and, when persistent, several tiles of different
    lengths in a row; CodegenError if the roles could deadlock."""
    lo = loops(ir)
    tn = turns(ir, lo)
    S = max(o.stages for o in lo.values())
    D = max((r.depth for r in ir.rings), default=1)
    runs = [[T] for T in range(1, S + 2 * D + 4)]
    if ir.persistent:
        runs += [[S + D + 2, 1, 2, S + 1, 1], [1, 1, S + 2, 2]]
    fill_of = {t: r for r in ir.rings for t, _ in r.fills}
    loop_rings = [r for r in ir.rings if r.phase == "loop"]
    pre = next((r for r in ir.rings if r.phase == "pre"), None)
    for tiles in runs:
        prog: dict[str, list[Op]] = {r.name: [] for r in ir.roles}
        if tn is not None and tn.first is not None:
            prog[tn.first[0]].append(("arrive", tn.first[1]))
        rb = 0
        for t, T in enumerate(tiles):
            def prod_ops(name: str, it: int, rb: int = rb) -> list[Op]:
                r = fill_of[name]
                q = rb + it
                rel = 1 if ir.pingpong else len({x.role for x in r.releases})  # ping-pong: the tile's owner frees it
                wait: list[Op] = [("wait", (r.name, "free", q - r.depth), rel)] if q >= r.depth else []
                return [*wait, ("signal", (r.name, "full", q, name))]

            if pre is not None:
                if t and ir.persistent:
                    prog["producer"].append(("wait", ("pre", "free", t - 1), len(pre.releases)))
                prog["producer"] += [("signal", ("pre", "full", t, f)) for f, _ in pre.fills]
            prog["producer"] += role_steps(lo["producer"], T, {}, prod_ops)
            for role in (r for r in ir.roles if r.name in owners(ir, t)):
                rn = role.name

                def cons_ops(name: str, it: int, rb: int = rb, rn: str = rn) -> list[Op]:
                    q, out = rb + it, []
                    for r in loop_rings:
                        for x in r.releases:
                            if x.role == rn and x.task == name and x.mode == "wait" and it >= x.dist:
                                out.append(("signal", (r.name, "free", q - x.dist)))
                        if (rn, name) in r.waiters:
                            out += [("wait", (r.name, "full", q, f), 1) for f, _ in r.fills]
                    for r in loop_rings:
                        for x in r.releases:
                            if x.role == rn and x.task == name and (x.mode == "end" or (x.mode == "commit"
                                                                                        and it >= 1)):
                                out.append(("signal", (r.name, "free", q - (x.dist if x.mode == "commit" else 0))))
                    return out

                pw = dict(pre.waiters).get(rn) if pre is not None else None
                pre_wait: list[Op] = [("wait", ("pre", "full", t, f), 1) for f, _ in pre.fills] if pre else []
                for name, _ in role.pre:
                    if pw == name:
                        prog[rn] += pre_wait
                if pw == "":
                    prog[rn] += pre_wait
                if ir.pingpong:  # the turn is taken once per tile: the whole main loop is one tensor-core turn
                    sync, arrive = tile_turns(ir, tn, rn)
                    prog[rn] += [("sync", sync)] if sync is not None else []
                    prog[rn] += role_steps(lo[rn], T, {}, cons_ops)
                    prog[rn] += [("arrive", arrive)] if arrive is not None and t + 1 < len(tiles) else []
                else:
                    prog[rn] += role_steps(lo[rn], T, {} if tn is None else tn.ops.get(rn, {}), cons_ops)
                for r in loop_rings:  # the end of the tile: releases whose point lies past the last iteration
                    for x in r.releases:
                        if x.role == rn and x.mode in ("wait", "commit"):
                            prog[rn] += [("signal", (r.name, "free", rb + T - k)) for k in range(1, x.dist + 1)
                                         if T - k >= 0]
                if pre is not None and ir.persistent and pw is not None:
                    prog[rn].append(("signal", ("pre", "free", t)))
            rb += T
        simulate(prog, f"{ir.op} kernel with trip counts {tiles}")
