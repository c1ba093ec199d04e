"""What kind of schedule a program is, in the words kernel engineers use, and Gantt charts."""
from __future__ import annotations

from typing import Any

from .cost import timings
from .hw import Hardware
from .program import SProgram
from .simulate import Timeline


def features(p: SProgram, hw: Hardware) -> list[str]:
    """Named patterns the schedule contains.

    ping-pong: one warpgroup's softmax (a task on the MUFU) overlaps, modulo ii, another warpgroup's
    tensor-core work. intra-warpgroup overlap: a warpgroup issues PV of iteration i after QK of iteration
    i+1, so PV runs under the softmax of i+1 (FA3 §3.2). Also the pipeline depth.
    """
    g, tm, ii = p.graph, timings(p.graph, hw), p.ii
    out = []
    loop = [t for t in g.phase("loop")]
    sfu = [t for t in loop if t.sfu and t.group >= 0]
    mma = [t for t in loop if t.kind == "mma"]
    for a in sfu:
        a0, a1 = p.start[a.name] % ii, p.start[a.name] % ii + tm[a.name].busy("sfu")
        for b in mma:
            if b.group == a.group:
                continue
            b0 = p.start[b.name] % ii
            b1 = b0 + tm[b.name].busy("tc")
            if any(a0 < b1 + k * ii and b0 + k * ii < a1 for k in (-1, 0, 1)):
                out.append(f"ping-pong: {a.name} overlaps {b.name} on the tensor cores")
                break
        if out:
            break
    for grp in range(g.groups):
        qk = [t for t in mma if t.group == grp and "k" in t.reads]
        pv = [t for t in mma if t.group == grp and "v" in t.reads]
        if qk and pv and p.start[pv[0].name] >= p.start[qk[0].name] + ii:
            out.append(f"intra-warpgroup overlap in wg{grp}: {pv[0].name} of iteration i issues after "
                       f"{qk[0].name} of iteration i+1 and runs under that iteration's softmax (FA3's order)")
            break
    stages = 1 + max(p.stage(t.name) for t in loop)
    out.append(f"{stages}-stage software pipeline, ii={ii} cycles")
    return out


def gantt(tl: Timeline, ax: Any = None, title: str = "", max_iterations: int | None = 4) -> Any:
    """Draw a timeline on a matplotlib ``ax`` (one row per warp role and per shared unit: copy engine,
    tensor cores, MUFU), the first ``max_iterations`` loop iterations; returns the ax."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(12, 3.5))
    ev = [e for e in tl.events if max_iterations is None or e.iteration < max_iterations]
    if max_iterations is not None and tl.trip > max_iterations:
        ev = [e for e in ev if not e.task.startswith(("normalize", "store", "epilogue"))]
    rows = sorted({r for e in ev for r, _, _ in e.holds},
                  key=lambda r: ({"producer": 0, "tma": 1, "tc": 2, "sfu": 3}.get(r, 4), r))
    kinds = sorted({e.task.split("@")[0] for e in ev})
    cmap = plt.get_cmap("tab20")
    color = {k: cmap(i % 20) for i, k in enumerate(kinds)}
    span = max((b for e in ev for _, _, b in e.holds), default=1)
    for e in ev:
        k = e.task.split("@")[0]
        for r, a, b in e.holds:
            y = rows.index(r)
            ax.barh(y, b - a, left=a, color=color[k], edgecolor="black", lw=0.3)
            if b - a > span / 40:
                ax.text((a + b) / 2, y, f"{e.task}:{e.iteration}", ha="center", va="center", fontsize=5)
    ax.set_yticks(range(len(rows)), rows)
    ax.set_xlabel("cycles")
    ax.set_title(title)
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=color[k]) for k in kinds], labels=kinds, fontsize=6,
              ncol=min(len(kinds), 8), loc="upper center", bbox_to_anchor=(0.5, -0.25), frameon=False)
    return ax
