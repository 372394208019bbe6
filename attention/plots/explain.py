"""Chapters 3 and 4's explanatory figures: straight-through's forward (one-hot) and
backward (soft) passes, and DAT's relative-position-bias lookup (the table, a query, a
deformed point, their displacement). Sized to read on a phone (390 px wide)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from .. import hard
from ..deformable import dat
from .style import ATTENTION_CMAP, SELECTION_COLORS, TENSOR_COLORS


def straight_through_figure(scores, noise, grad_y, tau: float = 1.0, axes=None):
    """Three rows over the keys: the forward's one-hot Gumbel-max sample z; the
    relaxed weights y = softmax((s + g) / tau) that the backward pretends were used;
    and the gradient the scores receive, (1/tau)(diag y - y y^T) dL/dy
    (``hard.straight_through_grad``), nonzero at every key."""
    s, g = np.asarray(scores, float), np.asarray(noise, float)
    gy = np.asarray(grad_y, float)
    if s.ndim != 1 or g.shape != s.shape or gy.shape != s.shape:
        raise ValueError(
            f"scores, noise and grad_y must be one row each (N,), got "
            f"{s.shape}, {g.shape}, {gy.shape}"
        )
    y = hard.gumbel_softmax(s, tau, noise=g)  # (N,)
    z = hard.gumbel_softmax(s, tau, noise=g, hard=True)  # one-hot (N,)
    grad_s = hard.straight_through_grad(y, gy, tau)  # (N,)
    if axes is None:
        _, axes = plt.subplots(3, 1, figsize=(5.2, 5.0), sharex=True)
    j = np.arange(len(s))
    rows = (
        (z, SELECTION_COLORS["hard"], "forward: one-hot $z$"),
        (y, SELECTION_COLORS["soft"], "backward uses $y$"),
        (grad_s, SELECTION_COLORS["gumbel-st"], r"gradient on $s$"),
    )
    for ax, (vals, color, title) in zip(axes, rows):
        ax.bar(j, vals, color=color, width=0.65)
        ax.axhline(0, color="0.6", lw=0.8)
        ax.set_title(title, fontsize=10, loc="left")
    axes[0].set_ylim(0, 1.1)
    axes[1].set_ylim(0, 1.1)
    axes[-1].set_xticks(j, labels=[f"$k_{i}$" for i in j])
    axes[-1].set_xlabel("key")
    return axes


def rpb_lookup_figure(table, query_ij, point_px, axes=None):
    """Left: an H x W query map with one query pixel (star), one deformed point at a
    fractional pixel position (diamond) and their displacement (arrow). Right: the
    (2H - 1) x (2W - 1) bias table, its centre (zero displacement, circle), where the
    displacement reads it (cross) and the four entries the bilinear read mixes.

    table: (2H - 1, 2W - 1); query_ij: the query's (row, column); point_px: the
    point's (x, y) in pixels (``align_corners=False``). Returns the axes and the bias,
    computed by ``attention.deformable.relative_position_bias``.
    """
    tab = np.asarray(table, float)
    if tab.ndim != 2 or tab.shape[0] % 2 == 0 or tab.shape[1] % 2 == 0:
        raise ValueError(f"table must be (2H - 1, 2W - 1), got shape {tab.shape}")
    H, W = (tab.shape[0] + 1) // 2, (tab.shape[1] + 1) // 2
    qi, qj = query_ij
    px, py = map(float, point_px)
    norm = np.array([(2 * px + 1) / W - 1, (2 * py + 1) / H - 1])  # grid_sample coords
    bias_all = dat.relative_position_bias(tab[None], norm.reshape(1, 1, 1, 2), H, W)
    bias = float(bias_all[0, 0, qi * W + qj, 0])
    dx, dy = qj - px, qi - py
    if axes is None:
        _, axes = plt.subplots(
            1, 2, figsize=(6.4, 3.4), gridspec_kw=dict(width_ratios=[1, 1.6])
        )
    ax0, ax1 = axes
    for r in range(H + 1):
        ax0.plot([-0.5, W - 0.5], [r - 0.5, r - 0.5], color="0.85", lw=0.8)
    for c in range(W + 1):
        ax0.plot([c - 0.5, c - 0.5], [-0.5, H - 0.5], color="0.85", lw=0.8)
    ax0.plot(qj, qi, "*", ms=14, color=TENSOR_COLORS["Q"], label="query")
    ax0.plot(px, py, "D", ms=8, color=TENSOR_COLORS["points"], label="deformed point")
    ax0.annotate(
        "", (qj, qi), (px, py), arrowprops=dict(arrowstyle="-|>", lw=1.8, color="black")
    )
    ax0.set(
        xlim=(-0.5, W - 0.5),
        ylim=(H - 0.5, -0.5),
        aspect="equal",
        title=f"Δ = ({dx:g}, {dy:g}) pixels",
    )
    ax0.set_xticks([])
    ax0.set_yticks([])
    ax0.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=1)
    ax1.imshow(tab, cmap=ATTENTION_CMAP, interpolation="nearest")
    cx, cy = W - 1 + dx, H - 1 + dy  # where the displacement reads the table
    for c0 in (np.floor(cx), np.floor(cx) + 1):
        for r0 in (np.floor(cy), np.floor(cy) + 1):
            ax1.add_patch(
                plt.Rectangle(
                    (c0 - 0.5, r0 - 0.5),
                    1,
                    1,
                    fill=False,
                    ec=TENSOR_COLORS["S"],
                    lw=1.5,
                )
            )
    ax1.plot(W - 1, H - 1, "o", ms=8, mfc="none", mec="black", mew=1.5, label="Δ = 0")
    ax1.plot(cx, cy, "x", ms=10, mew=2.5, color=TENSOR_COLORS["S"], label="read at Δ")
    ax1.annotate(
        "",
        (cx, cy),
        (W - 1, H - 1),
        arrowprops=dict(arrowstyle="-|>", lw=1.5, color="black"),
    )
    ax1.set(title=f"table: bias {bias:.2f}", xlabel="W - 1 + Δx", ylabel="H - 1 + Δy")
    ax1.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2)
    return axes, bias
