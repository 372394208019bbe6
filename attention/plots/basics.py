"""Chapter 1's explanatory figures: attention as a soft dictionary lookup, and the
positional encodings (the sinusoidal table, RoPE's rotations and its offset-only
score). Sized to read on a phone (390 px wide)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from .. import positions
from ..core import softmax
from .style import SELECTION_COLORS, TENSOR_COLORS


def soft_lookup_figure(
    query, keys, values, key_labels=None, scale: float = 1.0, axes=None
):
    """Left: 2-D keys (orange arrows) and the query (blue). Right: the weights a hard
    lookup (the best-matching key, outlined) and attention (softmax of the scaled dot
    products, filled) give each key, with the value each key holds.

    query: (2,), keys: (n, 2), values: (n,) numbers. Returns the axes and the two
    outputs ``(hard, soft)``.
    """
    q, kk = np.asarray(query, float), np.asarray(keys, float)
    vals = np.asarray(values, float)
    if q.shape != (2,) or kk.ndim != 2 or kk.shape[1] != 2 or vals.shape != (len(kk),):
        raise ValueError(
            f"need query (2,), keys (n, 2), values (n,); got {q.shape}, "
            f"{kk.shape}, {vals.shape}"
        )
    labels = key_labels or [f"$k_{j + 1}$" for j in range(len(kk))]
    scores = kk @ q * scale  # (n,)
    p = softmax(scores)
    best = int(np.argmax(scores))
    hard, soft = float(vals[best]), float(p @ vals)
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(6.4, 3.0))
    ax0, ax1 = axes
    lim = 1.25 * max(np.abs(kk).max(), np.abs(q).max())
    for j, kv in enumerate(kk):
        ax0.annotate(
            "",
            kv,
            (0, 0),
            arrowprops=dict(arrowstyle="-|>", lw=2, color=TENSOR_COLORS["K"]),
        )
        ax0.text(*(kv * 1.12), labels[j], ha="center", va="center", fontsize=10)
    ax0.annotate(
        "",
        q,
        (0, 0),
        arrowprops=dict(arrowstyle="-|>", lw=2.5, color=TENSOR_COLORS["Q"]),
    )
    ax0.text(
        *(q * 1.15),
        "$q$",
        ha="center",
        va="center",
        fontsize=11,
        color=TENSOR_COLORS["Q"],
    )
    ax0.set(
        xlim=(-lim, lim), ylim=(-lim, lim), aspect="equal", title="keys and a query"
    )
    ax0.axis("off")
    x = np.arange(len(kk))
    ax1.bar(x, p, color=SELECTION_COLORS["soft"], width=0.6, label="attention")
    ax1.bar(
        x,
        np.eye(len(kk))[best],
        fill=False,
        width=0.8,
        lw=2,
        edgecolor=SELECTION_COLORS["hard"],
        label="dictionary",
    )
    ax1.set_xticks(x, labels=[f"{lab}\nv = {v:g}" for lab, v in zip(labels, vals)])
    ax1.set(
        ylim=(0, 1.15), ylabel="weight", title=f"output: hard {hard:g}, soft {soft:.2f}"
    )
    ax1.legend(fontsize=8, loc="upper right")
    return axes, (hard, soft)


def positions_figure(
    n_positions: int = 64,
    d: int = 64,
    rope_d: int = 8,
    q=None,
    k=None,
    max_offset: int = 64,
    axes=None,
):
    """Three panels: the sinusoidal table (positions x dimensions, a heatmap); RoPE
    turning one query pair at positions 0..7 for its two fastest frequencies (of
    ``rope_d`` dimensions); and the score of a rotated (q, k) pair of ``d`` dimensions
    against the offset n - m, drawn from query positions 0 and 100 (the dots land on
    one curve: only the offset matters).

    q, k: (d,) vectors (default all ones, whose score decays with the offset).
    """
    if axes is None:
        fig = plt.figure(figsize=(6.4, 6.6))
        gs = fig.add_gridspec(2, 2, height_ratios=[1.1, 1])
        axes = [
            fig.add_subplot(gs[0, :]),
            fig.add_subplot(gs[1, 0]),
            fig.add_subplot(gs[1, 1]),
        ]
    ax0, ax1, ax2 = axes
    pe = positions.sinusoidal_table(n_positions, d)
    im = ax0.imshow(
        pe, aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest"
    )
    ax0.set(
        xlabel="dimension (sin even, cos odd)",
        ylabel="position t",
        title="sinusoidal table: fast on the left, slow on the right",
    )
    plt.colorbar(im, ax=ax0, fraction=0.04, pad=0.02)
    theta = positions.frequencies(rope_d)
    for i, style in ((0, "-"), (1, "--")):
        x0 = np.zeros((8, rope_d))
        x0[:, 2 * i] = 1.0  # the pair (1, 0) in coordinates (2i, 2i+1)
        r = positions.rope(x0, np.arange(8.0))
        pts = r[:, 2 * i : 2 * i + 2]  # (8, 2)
        color = TENSOR_COLORS["Q"] if i == 0 else "0.5"
        ax1.plot(
            *pts.T,
            style,
            color=color,
            lw=1,
            alpha=0.6,
            label=f"pair {i}: θ = {theta[i]:.2g}",
        )
        ax1.scatter(
            *pts.T, c=np.arange(8), cmap="viridis", s=30, zorder=3, edgecolors=color
        )
    ax1.add_patch(plt.Circle((0, 0), 1, fill=False, color="0.85"))
    ax1.set(
        xlim=(-1.5, 1.5),
        ylim=(-1.5, 1.5),
        aspect="equal",
        title="RoPE: one pair at t = 0..7",
    )
    ax1.axis("off")
    ax1.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, 0.02))
    qv = np.ones(d) if q is None else np.asarray(q, float)
    kv = np.ones(d) if k is None else np.asarray(k, float)
    off = np.arange(0, max_offset + 1)
    ax2.plot(
        off,
        positions.rope_score(qv, kv, 0, off),
        color=TENSOR_COLORS["S"],
        lw=1.5,
        label="query at 0",
    )
    ax2.plot(
        off[::4],
        positions.rope_score(qv, kv, 100, 100 + off[::4]),
        "o",
        color="black",
        ms=3,
        label="query at 100",
    )
    ax2.set(
        xlabel="offset n - m",
        ylabel="score $q_m' \\cdot k_n'$",
        title="score vs offset",
    )
    ax2.legend(fontsize=8, loc="upper right")
    return axes
