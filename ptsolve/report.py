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


def _gantt_events(tl: Timeline, max_iterations: int | None) -> tuple[list[Any], list[str], list[str]]:
    """(events, rows, task kinds) a Gantt chart draws: the first ``max_iterations`` loop iterations (the epilogue
    dropped when iterations are cut, so the chart does not stretch to the kernel's end), one row per warp role and per
    shared unit (copy engine, tensor cores, MUFU), roles first."""
    ev = [e for e in tl.events if max_iterations is None or e.iteration < max_iterations]
    if max_iterations is not None and tl.trip > max_iterations:
        ev = [e for e in ev if not e.task.startswith(("normalize", "store", "epilogue"))]
    rows = sorted({r for e in ev for r, _, _ in e.holds},
                  key=lambda r: ({"producer": 0, "tma": 1, "tc": 2, "sfu": 3}.get(r, 4), r))
    return ev, rows, sorted({e.task.split("@")[0] for e in ev})


# tab20's colours, so the SVG and the matplotlib chart of one timeline agree
_PALETTE = ("#1f77b4", "#aec7e8", "#ff7f0e", "#ffbb78", "#2ca02c", "#98df8a", "#d62728", "#ff9896", "#9467bd",
            "#c5b0d5", "#8c564b", "#c49c94", "#e377c2", "#f7b6d2", "#7f7f7f", "#c7c7c7", "#bcbd22", "#dbdb8d",
            "#17becf", "#9edae5")


def gantt_svg(tl: Timeline, title: str = "", max_iterations: int | None = 4, width: int = 1400) -> str:
    """The timeline as a standalone SVG document (the chart ``gantt`` draws, without matplotlib: importing it costs
    more than a cached ``optimize`` is allowed to take). ``width`` in pixels; the x axis is cycles."""
    from html import escape

    ev, rows, kinds = _gantt_events(tl, max_iterations)
    color = {k: _PALETTE[i % len(_PALETTE)] for i, k in enumerate(kinds)}
    span = max((b for e in ev for _, _, b in e.holds), default=1) or 1
    left, top, rh, right = 90, 30, 26, 20
    plot = width - left - right
    legend_rows = -(-len(kinds) // 8)
    height = top + rh * len(rows) + 40 + 16 * legend_rows
    x = lambda c: left + plot * c / span  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2:.0f}" y="18" text-anchor="middle" font-size="13">{escape(title)}</text>']
    for i, r in enumerate(rows):
        out.append(f'<text x="{left - 6}" y="{top + rh * i + rh / 2 + 4:.0f}" text-anchor="end" font-size="11">'
                   f'{escape(r)}</text>')
    for e in ev:
        k = e.task.split("@")[0]
        for r, a, b in e.holds:
            y = top + rh * rows.index(r) + 3
            out.append(f'<rect x="{x(a):.2f}" y="{y}" width="{max(x(b) - x(a), 0.5):.2f}" height="{rh - 6}" '
                       f'fill="{color[k]}" stroke="black" stroke-width="0.3"><title>{escape(e.task)} iteration '
                       f'{e.iteration}: cycles {a}-{b}</title></rect>')
            if b - a > span / 40:
                out.append(f'<text x="{x((a + b) / 2):.2f}" y="{y + rh / 2:.0f}" text-anchor="middle" '
                           f'font-size="7">{escape(e.task)}:{e.iteration}</text>')
    axis = top + rh * len(rows)
    out.append(f'<line x1="{left}" y1="{axis}" x2="{left + plot}" y2="{axis}" stroke="black"/>')
    step = 10 ** max(0, len(str(span)) - 1)
    step = step // 2 if span // step < 4 else step
    for c in range(0, span + 1, max(step, 1)):
        out.append(f'<text x="{x(c):.1f}" y="{axis + 14}" text-anchor="middle" font-size="9">{c}</text>')
    out.append(f'<text x="{left + plot / 2:.0f}" y="{axis + 28}" text-anchor="middle" font-size="10">cycles</text>')
    for i, k in enumerate(kinds):
        lx, ly = left + (i % 8) * (plot / 8), axis + 36 + 16 * (i // 8)
        out.append(f'<rect x="{lx:.0f}" y="{ly}" width="10" height="10" fill="{color[k]}"/>'
                   f'<text x="{lx + 14:.0f}" y="{ly + 9}" font-size="9">{escape(k)}</text>')
    return "\n".join([*out, "</svg>"]) + "\n"


def gantt(tl: Timeline, ax: Any = None, title: str = "", max_iterations: int | None = 4) -> Any:
    """Draw a timeline on a matplotlib ``ax`` (one row per warp role and per shared unit: copy engine,
    tensor cores, MUFU), the first ``max_iterations`` loop iterations; returns the ax."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(12, 3.5))
    ev, rows, kinds = _gantt_events(tl, max_iterations)
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
