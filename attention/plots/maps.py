"""Maps: attention weights and masks as heatmaps, Gumbel-softmax weights, and the
sampling points of deformable attention drawn over an image (chapters 1, 3 and 4)."""

from __future__ import annotations

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np

from . import live
from .style import ATTENTION_CMAP, MASK_COLORS, SELECTION_COLORS, TENSOR_COLORS, _ax


def attention_heatmap(
    weights: np.ndarray,
    q_labels=None,
    k_labels=None,
    ax=None,
    title: str | None = None,
    colorbar: bool = True,
    vmax: float | None = None,
    mask: np.ndarray | None = None,
):
    """Draw an (N_q, N_k) attention map: rows are queries, columns keys, darker = more
    weight.

    ``mask`` (boolean, the shape of ``weights``, True where a query may attend): hidden
    cells are drawn grey and hatched, as ``mask_heatmap`` draws them, so a masked zero
    never looks like a small weight; a legend entry says "masked".
    """
    w = np.asarray(weights)
    if w.ndim != 2 or w.size == 0:
        raise ValueError(
            f"weights must be a non-empty 2-D (N_q, N_k) matrix, got shape {w.shape}"
        )
    ax = _ax(ax)
    im = ax.imshow(
        w,
        cmap=ATTENTION_CMAP,
        vmin=0.0,
        vmax=vmax or max(float(w.max()), 1e-12),
        aspect="auto",
        interpolation="nearest",
    )
    if mask is not None:
        _hatch_masked(ax, mask, w.shape)
    if q_labels is not None:
        ax.set_yticks(range(len(q_labels)), labels=[str(t) for t in q_labels])
    if k_labels is not None:
        ax.set_xticks(
            range(len(k_labels)), labels=[str(t) for t in k_labels], rotation=90
        )
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    if title:
        ax.set_title(title)
    if colorbar:
        live.colorbar(im, ax, fraction=0.046, pad=0.04, label="weight")
    return ax


#: How a masked cell of an attention map is drawn: the grey of ``mask_heatmap``'s hidden
#: cells, hatched in a darker grey so it cannot pass for a small weight.
MASKED_HATCH = "0.55"


def _hatch_masked(ax, mask, shape) -> None:
    """Cover the hidden cells of ``mask`` (False = masked) with grey, hatched
    rectangles: one per run of masked cells in a row, so the hatching reads as one
    region."""
    m = np.asarray(mask)
    if m.shape != tuple(shape) or m.dtype != bool:
        raise ValueError(
            f"mask must be a boolean array of shape {tuple(shape)}, got "
            f"shape {m.shape} dtype {m.dtype}"
        )
    for i, row in enumerate(m):
        j = 0
        while j < len(row):
            if row[j]:
                j += 1
                continue
            j0 = j
            while j < len(row) and not row[j]:
                j += 1
            ax.add_patch(
                mpl.patches.Rectangle(
                    (j0 - 0.5, i - 0.5),
                    j - j0,
                    1,
                    facecolor=MASK_COLORS["masked"],
                    edgecolor=MASKED_HATCH,
                    hatch="////",
                    linewidth=0,
                    zorder=2,
                )
            )
    if not m.all():
        ax.legend(
            handles=[
                mpl.patches.Patch(
                    facecolor=MASK_COLORS["masked"],
                    edgecolor=MASKED_HATCH,
                    hatch="////",
                    label="masked",
                )
            ],
            loc="upper right",
            fontsize=8,
            framealpha=1.0,
        )  # causal: on the mask


def mask_heatmap(
    mask: np.ndarray,
    ax=None,
    title: str | None = None,
    q_labels=None,
    k_labels=None,
    diagonal: bool = False,
    legend: bool = False,
):
    """Draw a boolean (N_q, N_k) mask: dark where query i may attend to key j, light
    where hidden.

    ``diagonal=True`` draws the line j = i + N_k - N_q through the last key each query
    sees under the bottom-right aligned causal mask (the main diagonal when N_q == N_k).
    """
    if np.ndim(mask) != 2 or np.size(mask) == 0:
        raise ValueError(
            f"mask must be a non-empty (N_q, N_k) matrix, got shape {np.shape(mask)}"
        )
    ax = _ax(ax)
    m = np.asarray(mask)
    if m.ndim != 2 or m.dtype != bool:
        raise ValueError(
            f"mask must be a 2-D boolean array, got shape {m.shape} dtype {m.dtype}"
        )
    n_q, n_k = m.shape
    cmap = mpl.colors.ListedColormap([MASK_COLORS["masked"], MASK_COLORS["keep"]])
    ax.imshow(
        m.astype(np.int8),
        cmap=cmap,
        vmin=0,
        vmax=1,
        interpolation="nearest",
        aspect="equal",
    )
    ax.set_xticks(np.arange(-0.5, n_k, 1), minor=True)
    ax.set_yticks(np.arange(-0.5, n_q, 1), minor=True)
    ax.grid(which="minor", color="white", linewidth=1.0)
    ax.tick_params(which="minor", length=0)
    ax.set_xticks(
        range(n_k),
        labels=[str(t) for t in (k_labels if k_labels is not None else range(n_k))],
    )
    ax.set_yticks(
        range(n_q),
        labels=[str(t) for t in (q_labels if q_labels is not None else range(n_q))],
    )
    ax.set_xlabel("key j")
    ax.set_ylabel("query i")
    if diagonal:
        i = np.array([-0.5, n_q - 0.5])
        ax.plot(i + (n_k - n_q), i, color="black", linestyle="--", linewidth=1.0)
        ax.set_xlim(-0.5, n_k - 0.5)
        ax.set_ylim(n_q - 0.5, -0.5)
    if title:
        ax.set_title(title)
    if legend:
        handles = [
            mpl.patches.Patch(facecolor=MASK_COLORS["keep"], label="may attend"),
            mpl.patches.Patch(
                facecolor=MASK_COLORS["masked"], edgecolor="0.7", label="masked"
            ),
        ]
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return ax


def gumbel_softmax_figure(
    scores: np.ndarray, noise: np.ndarray, tau: float = 1.0, row: int = 0
):
    """Gumbel-softmax weights y = softmax((s + g) / tau) of an (N_q, N_k) score matrix.

    Left: the map of y (white = 0, dark = 1). Right: row ``row`` of y as bars, beside
    the softmax p of the scores (the distribution the one-hot samples follow) and the
    Gumbel-max sample argmax(s + g) that y tends to as tau -> 0. Returns the figure.
    """
    s, g = np.asarray(scores, dtype=float), np.asarray(noise, dtype=float)
    if s.ndim != 2 or s.size == 0:
        raise ValueError(
            f"scores must be a non-empty (N_q, N_k) matrix, got shape {s.shape}"
        )
    if g.shape != s.shape:
        raise ValueError(f"noise must have the scores' shape {s.shape}, got {g.shape}")
    if (
        isinstance(tau, bool)
        or not isinstance(tau, (int, float, np.floating))
        or not np.isfinite(tau)
        or tau <= 0
    ):
        raise ValueError(f"tau must be a finite number > 0, got {tau!r}")
    if (
        isinstance(row, bool)
        or not isinstance(row, (int, np.integer))
        or not 0 <= row < s.shape[0]
    ):
        raise ValueError(f"row must be an int in 0..{s.shape[0] - 1}, got {row!r}")
    z = (s + g) / tau
    y = np.exp(z - z.max(-1, keepdims=True))
    y /= y.sum(-1, keepdims=True)  # (N_q, N_k)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    fig, (ax0, ax1) = live.subplots(1, 2, figsize=(11, 3.8), width_ratios=[1, 1.3])
    attention_heatmap(
        y, ax=ax0, vmax=1.0, title=f"Gumbel-softmax weights, τ = {tau:.3g}"
    )
    ax0.axhline(row, color=SELECTION_COLORS["hard"], lw=1.0, ls=":")
    j = np.arange(s.shape[1])
    ax1.bar(
        j,
        y[row],
        color=SELECTION_COLORS["soft"],
        alpha=0.85,
        label=f"y (τ = {tau:.3g})",
    )
    ax1.step(
        j,
        p[row],
        where="mid",
        color="black",
        lw=1.2,
        label="softmax p (τ = 1, no noise)",
    )
    k = int(np.argmax(s[row] + g[row]))
    ax1.plot(
        [k],
        [1.0],
        marker="v",
        ms=9,
        color=SELECTION_COLORS["hard"],
        ls="none",
        label="Gumbel-max sample argmax(s + g)",
    )
    ax1.set_ylim(0, 1.08)
    ax1.set_xlabel("key")
    ax1.set_ylabel(f"weight (query {row})")
    ax1.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    return fig


def _norm_to_pixels(points, height: int, width: int) -> np.ndarray:
    """Normalised (x, y) in [-1, 1] -> pixel (column, row) with align_corners=False."""
    p = np.asarray(points, dtype=float)
    return ((p + 1.0) * np.array([width, height]) - 1.0) / 2.0


def _show_image(ax, image):
    img = np.asarray(image)
    ax.imshow(img, cmap="gray" if img.ndim == 2 else None, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])


def deformable_points_plot(image, reference, points, ax=None, title: str | None = None):
    """Reference points (white dots) and arrows to the deformed points p + Δp (K's
    colour) over an image. ``reference`` and ``points`` are (N, 2) normalised (x, y)
    covering the image with ``align_corners=False``."""
    ax = _ax(ax)
    h, w = np.asarray(image).shape[:2]
    _show_image(ax, image)
    ref = _norm_to_pixels(reference, h, w)
    pts = _norm_to_pixels(points, h, w)
    ax.quiver(
        ref[:, 0],
        ref[:, 1],
        pts[:, 0] - ref[:, 0],
        pts[:, 1] - ref[:, 1],
        angles="xy",
        scale_units="xy",
        scale=1,
        color=TENSOR_COLORS["K"],
        width=0.006,
    )
    ax.scatter(
        ref[:, 0],
        ref[:, 1],
        s=12,
        c="white",
        edgecolors="black",
        linewidths=0.5,
        zorder=3,
        label="reference p",
    )
    ax.scatter(
        pts[:, 0],
        pts[:, 1],
        s=10,
        c=TENSOR_COLORS["K"],
        zorder=3,
        label="deformed p + Δp",
    )
    ax.set_xlim(-0.5, w - 0.5)
    ax.set_ylim(h - 0.5, -0.5)
    ax.legend(loc="lower right", fontsize=7, frameon=True)
    if title:
        ax.set_title(title)
    return ax


def sampled_attention_plot(
    image, points, weights, query_xy, ax=None, title: str | None = None
):
    """One query's attention weights over sampled points, drawn on the image: each
    point's area and shade grow with its weight; the query is a star in Q's colour.
    ``points`` (N, 2) normalised (x, y); ``weights`` (N,); ``query_xy`` the query's
    pixel (column, row)."""
    ax = _ax(ax)
    h, w = np.asarray(image).shape[:2]
    _show_image(ax, image)
    pts = _norm_to_pixels(points, h, w)
    wts = np.asarray(weights, dtype=float)
    order = np.argsort(wts)
    ax.scatter(
        pts[order, 0],
        pts[order, 1],
        s=20 + 400 * wts[order] / max(wts.max(), 1e-12),
        c=wts[order],
        cmap=ATTENTION_CMAP,
        vmin=0,
        vmax=max(wts.max(), 1e-12),
        edgecolors=TENSOR_COLORS["K"],
        linewidths=0.8,
        zorder=3,
    )
    ax.scatter(
        [query_xy[0]],
        [query_xy[1]],
        marker="*",
        s=220,
        c=TENSOR_COLORS["Q"],
        edgecolors="white",
        linewidths=0.8,
        zorder=4,
    )
    ax.set_xlim(-0.5, w - 0.5)
    ax.set_ylim(h - 0.5, -0.5)
    if title:
        ax.set_title(title)
    return ax


#: Colours of MSDA's heads in ``msda_points_figure`` (K's orange first: the
#: points are keys).
HEAD_COLORS = ("#DD8452", "#4C9F9F", "#8172B3", "#C44E52", "#55A868", "#937860")


def msda_points_figure(
    levels, locations, weights, queries_xy, n_heads_shown: int = 2, query_labels=None
):
    """Multi-scale deformable attention: one panel per pyramid level, the sampling
    points of a few queries on it (marker shape per query, colour per head, area =
    attention weight), the queries as stars, and a legend for shapes and colours under
    the panels.
    ``levels``: list of 2-D arrays; ``locations`` (n_q, H, L, P, 2) in [0, 1];
    ``weights`` (n_q, H, L, P); ``queries_xy`` (n_q, 2) in [0, 1]; ``query_labels``
    names the queries in the legend."""
    n_l = len(levels)
    fig, axes = plt.subplots(1, n_l, figsize=(3.2 * n_l, 3.4))
    axes = np.atleast_1d(axes)
    markers = ["o", "s", "^", "D", "v", "P"]
    loc = np.asarray(locations)[:, :n_heads_shown]
    wts = np.asarray(weights)[:, :n_heads_shown]
    n_q, n_h = loc.shape[:2]
    wmax = max(float(wts.max()), 1e-12)
    for lvl, ax in enumerate(axes):
        img = np.asarray(levels[lvl])
        h, w = img.shape[:2]
        _show_image(ax, img)
        for qi in range(n_q):
            for hi in range(n_h):
                xy = loc[qi, hi, lvl].reshape(-1, 2) * np.array([w, h]) - 0.5  # (P, 2)
                ww = wts[qi, hi, lvl].reshape(-1)
                ax.scatter(
                    xy[:, 0],
                    xy[:, 1],
                    s=15 + 160 * ww / wmax,
                    marker=markers[qi % 6],
                    c=HEAD_COLORS[hi % len(HEAD_COLORS)],
                    edgecolors="black",
                    linewidths=0.4,
                    zorder=3,
                    alpha=0.9,
                )
            qx, qy = np.asarray(queries_xy[qi]) * np.array([w, h]) - 0.5
            ax.scatter(
                [qx],
                [qy],
                marker="*",
                s=140,
                c=TENSOR_COLORS["Q"],
                edgecolors="white",
                linewidths=0.6,
                zorder=4,
            )
        ax.set_xlim(-0.5, w - 0.5)
        ax.set_ylim(h - 0.5, -0.5)
        ax.set_title(f"level {lvl}: {h} x {w}")
    labels = (
        list(query_labels)
        if query_labels is not None
        else [f"query {qi}" for qi in range(n_q)]
    )
    line = mpl.lines.Line2D
    handles = [
        line(
            [],
            [],
            ls="",
            marker="*",
            ms=11,
            mfc=TENSOR_COLORS["Q"],
            mec="white",
            label="query (star)",
        )
    ]
    handles += [
        line(
            [],
            [],
            ls="",
            marker=markers[qi % 6],
            ms=7,
            mfc="white",
            mec="black",
            label=f"points of {labels[qi]}",
        )
        for qi in range(n_q)
    ]
    handles += [
        line(
            [],
            [],
            ls="",
            marker="o",
            ms=7,
            mec="black",
            mfc=HEAD_COLORS[hi % len(HEAD_COLORS)],
            label=f"head {hi}",
        )
        for hi in range(n_h)
    ]
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.legend(
        handles=handles,
        loc="lower center",
        ncol=len(handles),
        frameon=False,
        fontsize=8,
        title="marker area = attention weight",
        title_fontsize=8,
    )
    return fig
