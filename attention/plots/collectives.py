"""Chapter 6's pictures of data movement: the four collectives (send/recv, all-gather,
reduce-scatter, all-to-all) as small multiples of ranks x chunks, the three layouts
(which tokens each rank holds, beside its causal work per ring step) and
DeepSpeed-Ulysses' two all-to-alls (sequence-sharded -> head-sharded -> back).

One colour per rank (a chunk keeps the colour of the rank it came from), so a reader
follows a chunk by its colour; labels name the chunk. Sized for a 390 px phone screen:
few labels, large marks, no text under 9 pt.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch, Rectangle

from attention import ring as _ring
from attention.checks import check_int
from attention.memory import ring as _mring

#: One colour per rank (colour-blind-safe, Tol's "bright" scheme).
RANK_COLORS = ("#4477AA", "#EE6677", "#228833", "#CCBB44", "#66CCEE", "#AA3377")
EMPTY = "#F2F2F2"


def rank_color(r: int) -> str:
    return RANK_COLORS[r % len(RANK_COLORS)]


def _grid(ax, cells, P, n_slots, x0, title):
    """Draw a P x n_slots grid at x offset ``x0``: ``cells[(r, j)] = (colour, label,
    alpha)``; empty slots light grey."""
    for r in range(P):
        for j in range(n_slots):
            color, label, alpha = cells.get((r, j), (EMPTY, "", 1.0))
            ax.add_patch(
                Rectangle(
                    (x0 + j, r),
                    0.92,
                    0.86,
                    facecolor=color,
                    alpha=alpha,
                    edgecolor="#555555" if color == EMPTY else "none",
                    lw=0.4,
                )
            )
            if label:
                ax.text(
                    x0 + j + 0.46, r + 0.45, label, ha="center", va="center",
                    fontsize=9, color="white" if alpha > 0.6 else "black",
                )  # fmt: skip
    ax.text(x0 + n_slots / 2, -0.35, title, ha="center", va="bottom", fontsize=9)


def _collective_cells(kind: str, P: int):
    """(before, after, n_slots) cell maps of one collective over P ranks."""
    before, after = {}, {}
    if kind == "send/recv":  # one ring step: rank r sends its chunk to r + 1
        for r in range(P):
            before[(r, 0)] = (rank_color(r), f"{r}", 1.0)
            after[(r, 0)] = (rank_color((r - 1) % P), f"{(r - 1) % P}", 1.0)
        return before, after, 1
    for r in range(P):
        for j in range(P):
            if kind == "all-gather":  # every rank ends with every chunk
                if j == r:
                    before[(r, j)] = (rank_color(r), f"{r}", 1.0)
                after[(r, j)] = (rank_color(j), f"{j}", 1.0)
            elif kind == "reduce-scatter":  # partial sums of chunk j on every rank
                before[(r, j)] = (rank_color(j), f"{j}", 0.35)
                if j == r:
                    after[(r, j)] = (rank_color(j), f"Σ{j}", 1.0)
            elif kind == "all-to-all":  # piece (r -> j): a transpose
                before[(r, j)] = (rank_color(r), f"{r}{j}", 1.0)
                after[(r, j)] = (rank_color(j), f"{j}{r}", 1.0)
            else:
                raise ValueError(
                    "kind must be 'send/recv', 'all-gather', 'reduce-scatter' or "
                    f"'all-to-all', got {kind!r}"
                )
    return before, after, P


#: The collectives chapter 6 uses, in the order it introduces them.
COLLECTIVES = ("send/recv", "all-gather", "reduce-scatter", "all-to-all")


def collectives_figure(P: int = 4, kinds=COLLECTIVES, axes=None):
    """Small multiples: for each collective, the chunks every rank holds before (left)
    and after (right). Rows are ranks; a chunk keeps its source rank's colour.
    send/recv: one ring step (rank r to r+1). all-gather: every rank ends with every
    chunk. reduce-scatter: partial sums (pale) of chunk j on every rank end summed on
    rank j. all-to-all: piece "rj" (from rank r, for rank j) moves to rank j, a
    transpose."""
    P = check_int("P", P, 2)
    kinds = list(kinds)
    if axes is None:
        _, axes = plt.subplots(2, 2, figsize=(6.4, 5.6))
    axes = np.atleast_1d(axes).ravel()
    for ax, kind in zip(axes, kinds):
        before, after, n = _collective_cells(kind, P)
        _grid(ax, before, P, n, 0, "before")
        _grid(ax, after, P, n, n + 1.2, "after")
        ax.annotate(
            "", xy=(n + 1.1, P / 2), xytext=(n + 0.05, P / 2),
            arrowprops={"arrowstyle": "->", "lw": 1.5, "color": "#333333"},
        )  # fmt: skip
        pad = (P - n) / 2  # every panel as wide as a P-chunk one
        ax.set_xlim(-0.1 - pad, 2 * n + 1.3 + pad)
        ax.set_ylim(P + 0.1, -0.9)
        ax.set_yticks(np.arange(P) + 0.43, [f"rank {r}" for r in range(P)])
        ax.set_xticks([])
        ax.tick_params(length=0, labelsize=9)
        for side in ("left", "bottom", "top", "right"):
            ax.spines[side].set_visible(False)
        ax.set_title(kind, fontsize=11, pad=14)
    axes[0].figure.tight_layout()
    return axes


def layouts_figure(N: int = 16, P: int = 4, layouts=_ring.LAYOUTS, axes=None):
    """One row per layout: left, the N tokens as a strip coloured by the rank that holds
    them (contiguous and zig-zag cut 2P chunks of N / 2P tokens; striped deals single
    tokens); right, the causal work matrix (visible pairs per ring step and device, the
    closed form ``attention.memory.ring.pairs_matrix``), written in each cell."""
    layouts = list(layouts)
    if axes is None:
        _, axes = plt.subplots(
            len(layouts), 2, figsize=(6.4, 1.55 * len(layouts) + 0.6),
            gridspec_kw={"width_ratios": [1.9, 1.0]},
        )  # fmt: skip
    axes = np.atleast_2d(axes)
    for (ax_s, ax_w), layout in zip(axes, layouts):
        owner = np.empty(N, dtype=int)
        for r in range(P):
            owner[_ring.shard_positions(N, r, P, layout)] = r
        for i in range(N):
            ax_s.add_patch(
                Rectangle((i, 0), 0.94, 1, facecolor=rank_color(owner[i]), lw=0)
            )
        if layout != "striped":  # chunk boundaries of the 2P chunks
            for s, e in _ring.chunk_bounds(N, 2 * P):
                ax_s.text(
                    (s + e) / 2 - 0.03, 0.5, str(owner[s]), ha="center",
                    va="center", fontsize=9, color="white",
                )  # fmt: skip
        ax_s.set_xlim(0, N)
        ax_s.set_ylim(0, 1)
        ax_s.set_yticks([])
        ax_s.set_xticks([0, N // 2, N], ["0", f"{N // 2}", f"{N}"])
        ax_s.tick_params(labelsize=9, length=2)
        ax_s.set_title(f"{layout}: tokens by rank", fontsize=10, loc="left")
        for side in ("left", "top", "right"):
            ax_s.spines[side].set_visible(False)
        work = _mring.pairs_matrix(N, P, layout, True)  # (step, device)
        ax_w.imshow(work, cmap="Oranges", vmin=0, vmax=work.max() * 1.25)
        for t in range(P):
            for r in range(P):
                ax_w.text(r, t, str(work[t, r]), ha="center", va="center", fontsize=8)
        ax_w.set_xticks(range(P), [str(r) for r in range(P)])
        ax_w.set_yticks(range(P), [str(t) for t in range(P)])
        ax_w.tick_params(labelsize=9, length=0)
        ax_w.set_title("pairs (step x rank)", fontsize=10)
    axes[-1, 0].set_xlabel("token position")
    axes[-1, 1].set_xlabel("rank")
    for ax in axes[:, 1]:
        ax.set_ylabel("step", fontsize=9)
    axes[0, 0].figure.tight_layout()
    return axes


def ulysses_figure(P: int = 4, H: int = 4, ax=None):
    """DeepSpeed-Ulysses' data movement on a grid of sequence chunks (rows) x heads
    (columns), coloured by the rank that holds each (chunk, head) cell: q, k, v start
    sequence-sharded (rank r holds row r, every head), an all-to-all makes them
    head-sharded (rank s holds H / P heads of every chunk) for ordinary attention, and
    a second all-to-all returns o to the sequence shards."""
    P = check_int("P", P, 2)
    H = check_int("H", H, P)
    if H % P:
        raise ValueError(f"P={P} must divide H={H}: Ulysses gives each rank H/P heads")
    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 2.9))
    gap = 1.6
    titles = ("q, k, v: by sequence", "attention: by heads", "o: by sequence")
    for panel, title in enumerate(titles):
        x0 = panel * (H + gap)
        for c in range(P):
            for h in range(H):
                owner = h // (H // P) if panel == 1 else c
                ax.add_patch(
                    Rectangle(
                        (x0 + h, c), 0.92, 0.88, facecolor=rank_color(owner), lw=0
                    )
                )
        ax.text(x0 + H / 2, -0.3, title, ha="center", va="bottom", fontsize=9)
        ax.text(x0 + H / 2, P + 0.15, "heads", ha="center", va="top", fontsize=9)
        if panel < 2:
            ax.annotate(
                "", xy=(x0 + H + gap - 0.15, P / 2), xytext=(x0 + H + 0.1, P / 2),
                arrowprops={"arrowstyle": "->", "lw": 1.5, "color": "#333333"},
            )  # fmt: skip
            ax.text(
                x0 + H + gap / 2, P / 2 - 0.25, "all-to-all", ha="center",
                va="bottom", fontsize=8, rotation=90,
            )  # fmt: skip
    ax.set_xlim(-0.1, 3 * H + 2 * gap)
    ax.set_ylim(P + 0.7, -0.8)
    ax.set_yticks(np.arange(P) + 0.44, [f"chunk {c}" for c in range(P)])
    ax.set_xticks([])
    ax.tick_params(length=0, labelsize=9)
    for side in ("left", "bottom", "top", "right"):
        ax.spines[side].set_visible(False)
    ax.legend(
        handles=[Patch(facecolor=rank_color(r), label=f"rank {r}") for r in range(P)],
        loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=P, fontsize=9,
        handlelength=1.2,
    )  # fmt: skip
    return ax
