"""Chapter 5's serving figures: query heads sharing KV heads (MHA, GQA, MQA, MLA), a
paged cache (logical pages -> block table -> physical pool), and one decode step's
traffic per tensor as stacked bars. Sized to read on a phone (390 px wide)."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, Rectangle

from .style import _ax

_Q, _KV, _FREE = "#4C72B0", "#DD8452", "#E6E6E6"
_SEQ = ("#55A868", "#C44E52", "#8172B3", "#CCB974")


def gqa_figure(H_q: int = 8, layouts=(("MHA", 8), ("GQA", 2), ("MQA", 1)), ax=None):
    """One row per layout: H_q query heads (top) and the KV heads they read (bottom),
    a line from query head h to KV head h // (H_q // H_kv)."""
    ax = _ax(ax)
    for r, (name, h_kv) in enumerate(layouts):
        y = -3.6 * r
        g = H_q // h_kv
        for h in range(H_q):
            ax.add_patch(Rectangle((h, y), 0.8, 0.8, color=_Q))
            x_kv = (h // g) * g + (g - 1) / 2
            ax.plot([h + 0.4, x_kv + 0.4], [y, y - 1.2], color="#999", lw=0.8)
        for j in range(h_kv):
            x_kv = j * g + (g - 1) / 2
            ax.add_patch(Rectangle((x_kv, y - 2.0), 0.8, 0.8, color=_KV))
        ax.text(-0.6, y - 0.6, f"{name}\nH_kv={h_kv}", ha="right", va="center")
    ax.set_xlim(-3.2, H_q + 0.2)
    ax.set_ylim(-3.6 * len(layouts) + 1.4, 1.4)
    ax.set_axis_off()
    ax.text(H_q / 2, 1.0, "query heads (blue) read KV heads (orange)", ha="center")
    return ax


def paging_diagram(tables, page_size: int, lengths, num_pages: int, ax=None):
    """Each sequence's logical pages (left), its block-table row (middle, -1 where the
    row is padded), the physical pool (right, coloured by owner, grey when free)."""
    ax = _ax(ax)
    owner = {p: b for b, t in enumerate(tables) for p in t}
    width = max(len(t) for t in tables)
    for b, t in enumerate(tables):
        y = -1.5 * b
        for i in range(width):
            used = i < len(t)
            fill = min(page_size, lengths[b] - i * page_size) if used else 0
            ax.add_patch(
                Rectangle(
                    (i, y),
                    0.9,
                    0.9,
                    fc=_SEQ[b % 4] if used else "w",
                    ec="k",
                    alpha=0.35 + 0.65 * fill / page_size,
                )
            )
            label = str(t[i]) if used else "-1"
            ax.text(width + 1.5 + i * 0.9, y + 0.45, label, ha="center", va="center")
        ax.text(-0.3, y + 0.45, f"seq {b}", ha="right", va="center")
    x0 = 2 * width + 3
    for p in range(num_pages):
        row, col = divmod(p, 4)
        c = _SEQ[owner[p] % 4] if p in owner else _FREE
        ax.add_patch(Rectangle((x0 + col, -1.5 * row), 0.9, 0.9, fc=c, ec="k"))
        ax.text(x0 + col + 0.45, -1.5 * row + 0.45, str(p), ha="center", va="center")
    for x, label in ((width / 2, "logical pages"), (width + 1.5 + 0.45 * width,
                     "block table"), (x0 + 2, "physical pool")):  # fmt: skip
        ax.text(x, 1.3, label, ha="center")
    ax.add_patch(FancyArrowPatch((width + 0.2, 0.45), (width + 1.0, 0.45),
                                 arrowstyle="->", mutation_scale=10))  # fmt: skip
    ax.set_xlim(-2, x0 + 4.2)
    ax.set_ylim(-1.5 * max(len(tables), -(-num_pages // 4)) + 0.5, 1.8)
    ax.set_axis_off()
    return ax


def traffic_bars(rows: dict, ax=None):
    """Stacked horizontal bars: ``rows`` {algorithm: {tensor: bytes}}, one segment per
    tensor, bytes on a 1k/1M axis."""
    ax = _ax(ax)
    names = sorted({t for per in rows.values() for t in per})
    cmap = plt.get_cmap("tab10")
    labelled = set()
    for i, per in enumerate(rows.values()):
        left = 0.0
        for j, t in enumerate(names):
            w = per.get(t, 0)
            label = None if t in labelled or w == 0 else t
            labelled.add(t) if label else None
            ax.barh(i, w, left=left, color=cmap(j % 10), label=label)
            left += w
    ax.legend(fontsize=8, ncol=3, loc="lower right")
    ax.set_yticks(range(len(rows)), list(rows))
    ax.invert_yaxis()
    ax.xaxis.set_major_formatter(
        plt.FuncFormatter(lambda x, _: f"{x / 1e6:g}M" if x >= 1e6 else f"{x / 1e3:g}k")
    )
    ax.set_xlabel("HBM bytes of one decode step")
    return ax
