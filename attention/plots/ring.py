"""Chapter 6's figures: the ring schedule (device x step), causal load balance, the
overlap threshold per link, and a measured timeline of ring attention's ranks.

Colours from ``attention.plots.style``: K/V shards in K's orange, compute in O's brown,
transfers in HBM's dark blue (data leaving the chip), waiting in light grey. Sized to
stay readable on a 390 px phone screen (few labels, large marks).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.collections import PolyCollection
from matplotlib.colors import to_rgba
from matplotlib.patches import Patch, PathPatch, Rectangle
from matplotlib.path import Path

from attention import ring as _ring
from attention.memory import ring as _mring

from . import live
from .style import MEMORY_COLORS, TENSOR_COLORS

COMPUTE = TENSOR_COLORS["O"]
SHARD = TENSOR_COLORS["K"]
SEND = MEMORY_COLORS["HBM"]
WAIT = "#D9D9D9"
IDLE = "#F2F2F2"


def ring_schedule_figure(
    P: int = 4,
    N: int | None = None,
    causal: bool = False,
    layout: str = "contiguous",
    ax=None,
):
    """Device x step grid: in each cell, the compute on the K/V shard the device holds
    (top box, labelled with the shard, shaded by its share of a full block) and, under
    it, the transfer of that same shard to the next device, which runs during the
    compute; the last step sends nothing."""
    N = 8 * P if N is None else N
    work = _mring.pairs_matrix(N, P, layout, causal)  # (t, r), the closed form
    full = _mring.shard_lengths(N, P, layout).max() ** 2
    holds = _ring.ring_holds(P)
    if ax is None:
        _, ax = plt.subplots(figsize=(1.25 * P + 1.6, 0.62 * P + 1.3))
    for t in range(P):
        for r in range(P):
            frac = work[t, r] / full
            ax.add_patch(  # the compute of step t: top of the cell
                Rectangle(
                    (t + 0.05, r + 0.06),
                    0.8,
                    0.5,
                    facecolor=COMPUTE,
                    alpha=0.15 + 0.85 * frac if frac else 1.0,
                    edgecolor="#333333",
                    lw=0.6,
                    hatch=None if frac else "//",
                    fill=bool(frac),
                )
            )
            ax.text(
                t + 0.45,
                r + 0.31,
                f"KV{holds[t, r]}",
                ha="center",
                va="center",
                fontsize=9,
                color="white" if frac > 0.55 else "black",
            )
            if t < P - 1:  # the send of the same shard, under its compute box
                ax.add_patch(
                    Rectangle(
                        (t + 0.05, r + 0.64), 0.8, 0.2, facecolor=SEND, edgecolor="none"
                    )
                )
                ax.text(
                    t + 0.45,
                    r + 0.74,
                    f"to {(r + 1) % P}",
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="white",
                )
    ax.set_xlim(-0.05, P)
    ax.set_ylim(P, 0)
    ax.set_xticks(np.arange(P) + 0.45, [str(t) for t in range(P)])
    ax.set_yticks(np.arange(P) + 0.45, [f"dev {r}" for r in range(P)])
    ax.set_xlabel("ring step t")
    ax.tick_params(length=0)
    for side in ("left", "bottom"):
        ax.spines[side].set_visible(False)
    handles = [
        Patch(facecolor=COMPUTE, label="compute on held K/V"),
        Patch(facecolor=SEND, label="meanwhile: send it to dev r+1"),
    ]
    if causal:
        handles.append(
            Patch(
                facecolor="white",
                edgecolor="#333333",
                hatch="//",
                label="masked: nothing to do",
            )
        )
    ax.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.14),
        ncol=2 if len(handles) < 3 else 3,
        fontsize=8,
        handlelength=1.2,
    )
    return ax


def _cells(x, y, height, width: float = 0.9) -> np.ndarray:
    """The corners of rectangles (x, y, width, height), one row each, as
    ``PolyCollection`` takes them (closed, counter-clockwise as ``Rectangle``)."""
    x0, y0 = np.asarray(x, float), np.asarray(y, float)
    x1, y1 = x0 + width, y0 + np.asarray(height, float)
    return np.stack(
        [np.stack(c, axis=-1) for c in ((x0, y0), (x1, y0), (x1, y1), (x0, y1))],
        axis=1,
    )


def load_balance_figure(
    N: int = 64,
    P: int = 4,
    layouts=("contiguous", "zigzag"),
    causal: bool = True,
    axes=None,
    legend_inside: bool = False,
):
    """Work (visible pairs, as a share of a full shard x shard block) per device and
    step, one panel per layout; idle device-steps hatched; the idle fraction (every
    step lasting as long as its busiest device) in each title. The legend goes below
    the panels, outside the figure (a tight box holds it), or with ``legend_inside``
    in two columns inside the canvas under the panels (a live face's narrow figure,
    cut to its drawn pixels)."""
    if axes is None:
        _, axes = live.subplots(
            1, len(layouts), figsize=(3.1 * len(layouts), 3.2), sharey=True
        )
    axes = np.atleast_1d(axes)
    for ax, layout in zip(axes, layouts):
        work = _mring.pairs_matrix(N, P, layout, causal)  # (t, r), the closed form
        full = _mring.shard_lengths(N, P, layout).max() ** 2
        step_len = work.max(axis=1)  # the busiest device sets each step's length
        # One collection of busy cells and one hatched path of idle ones, not 2 P^2
        # patches: P = 32 draws at once, the same pixels.
        longest = step_len[:, None]
        busy = np.divide(work, longest, out=np.zeros(work.shape), where=longest > 0)
        t, r = np.meshgrid(np.arange(P), np.arange(P), indexing="ij")
        t, r, busy, frac = t.ravel(), r.ravel(), busy.ravel(), (work / full).ravel()
        ax.add_collection(
            PolyCollection(
                _cells(r, t, 0.9 * busy),
                facecolors=[to_rgba(COMPUTE, 0.3 + 0.7 * f) for f in frac],
                edgecolors="none",
            )
        )
        ax.add_artist(  # the idle parts, one path: hatched in one pass (the limits
            PathPatch(  # are set below: no scan of its P^2 cells' curves for them)
                Path.make_compound_path_from_polys(
                    _cells(r, t + 0.9 * busy, 0.9 * (1 - busy))
                ),
                facecolor=IDLE,
                edgecolor="#999999",
                hatch="///",
                lw=0.3,
                snap=True,  # as each cell alone would be (a long path is not snapped)
            )
        )
        ax.set_xlim(0, P)
        ax.set_ylim(P, 0)
        every = max(1, P // 8)  # at most 8 labels a side: P = 32 reads 0, 4, .., 28
        ticks = np.arange(0, P, every)
        ax.set_xticks(ticks + 0.45, [str(r) for r in ticks])
        ax.set_yticks(ticks + 0.45, [str(t) for t in ticks])
        ax.set_xlabel("device r")
        idle = _ring.idle_fraction(work)
        ax.set_title(f"{layout}: idle {100 * idle:.0f}%")
        ax.tick_params(length=0)
    axes[0].set_ylabel("ring step t (down)")
    # below the panels, outside the figure: inline and saved figures use a tight bbox;
    # the shades are the alphas above, for a full block, half and a quarter of one
    shades = [
        Patch(facecolor=COMPUTE, alpha=0.3 + 0.7 * f, label=name)
        for f, name in ((1.0, "full block"), (0.5, "half"), (0.25, "quarter"))
    ]
    axes[0].figure.legend(
        handles=[
            *shades,
            Patch(
                facecolor=IDLE, edgecolor="#999999", hatch="///", label="idle (waiting)"
            ),
        ],
        title="computing (shade: share of a full shard x shard block)",
        title_fontsize=9,
        loc="lower center" if legend_inside else "upper center",
        bbox_to_anchor=(0.5, 0.01 if legend_inside else 0.0),
        ncol=2 if legend_inside else 4,
        fontsize=9,
    )
    return axes


def overlap_figure(
    gpu: str = "H100",
    dtype: str = "bfloat16",
    H: int = 32,
    H_kv: int | None = None,
    d: int = 128,
    links=None,
    ax=None,
):
    """ESTIMATED time of one non-causal ring step against the shard length n (log-log):
    compute on ``gpu`` at its peak (one line) and the K/V transfer over each link (one
    line each); dots mark each link's threshold n* where compute starts to hide it."""
    H_kv = H if H_kv is None else H_kv
    links = list(_mring.LINKS) if links is None else list(links)
    ax = plt.subplots(figsize=(6.0, 3.6))[1] if ax is None else ax
    n = np.geomspace(256, 2**18, 200)
    b = _mring.DTYPE_BYTES[dtype]
    F = _mring.peak_flops(gpu, dtype)
    compute = 4 * n**2 * H * d / F * 1e3  # ms
    ax.plot(n, compute, color=COMPUTE, lw=2.5, label=f"compute ({gpu}, peak)")
    greys = ["#2F4B7C", "#665191", "#A05195", "#D45087", "#F95D6A"]
    for link, c in zip(links, greys):
        spec = _mring.LINKS[link]
        x = 2 * n * H_kv * d * b / (spec.gbps * 1e9) * 1e3
        ax.plot(n, x, color=c, lw=1.6, ls="--", label=f"send K/V: {link}")
        n_star = _mring.overlap_threshold(gpu, link, dtype, H, H_kv)
        y = 2 * n_star * H_kv * d * b / (spec.gbps * 1e9) * 1e3
        ax.plot([n_star], [y], "o", color=c, ms=6)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("shard length n = N / P (tokens)")
    ax.set_ylabel("time per step (ms, estimate)")
    ax.legend(fontsize=8, loc="upper left")
    return ax


def timeline_figure(spans, ax=None, title: str | None = None):
    """Measured spans of a ring run, one row per rank: ``spans`` is a list of dicts
    {rank, step, kind ("compute", "wait" or "send"), start, end} (seconds, any common
    origin), as ``kernels.ring.ring_timeline`` returns them. Compute spans carry their
    step number."""
    spans = list(spans)
    if not spans:
        raise ValueError("spans is empty: nothing to draw")
    t0 = min(s["start"] for s in spans)
    ranks = sorted({int(s["rank"]) for s in spans})
    colors = {"compute": COMPUTE, "wait": WAIT, "send": SEND}
    rows = {"compute": (0.15, 0.5), "wait": (0.15, 0.5), "send": (0.68, 0.2)}
    ax = plt.subplots(figsize=(6.4, 0.55 * len(ranks) + 1.4))[1] if ax is None else ax
    for s in spans:
        kind = s["kind"]
        if kind not in colors:
            raise ValueError(f"span kind must be compute, wait or send, got {kind!r}")
        y0, h = rows[kind]
        y = ranks.index(int(s["rank"]))
        start, end = (s["start"] - t0) * 1e3, (s["end"] - t0) * 1e3
        ax.broken_barh(
            [(start, max(end - start, 1e-6))],
            (y + y0, h),
            facecolors=colors[kind],
            edgecolor="white",
            lw=0.3,
        )
        if kind == "compute" and end - start > 0:
            ax.text(
                (start + end) / 2,
                y + y0 + h / 2,
                str(s.get("step", "")),
                ha="center",
                va="center",
                fontsize=7,
                color="white",
            )
    ax.set_ylim(len(ranks), 0)
    ax.set_yticks(np.arange(len(ranks)) + 0.45, [f"rank {r}" for r in ranks])
    ax.set_xlabel("time since the first span (ms)")
    ax.legend(
        handles=[Patch(facecolor=c, label=k) for k, c in colors.items()],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.25),
        ncol=3,
        fontsize=8,
    )
    if title:
        ax.set_title(title)
    return ax
