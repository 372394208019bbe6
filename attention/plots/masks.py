"""Chapter 7's figures: masks as matrices, block masks (full / partial / empty tiles),
the work of a block-sparse forward against N, and models' local/global layer
patterns."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch

from attention import masks as M
from attention.memory import blocksparse as bs

from .style import MASK_COLORS, _ax

#: Tile kinds: full tiles the mask's colour, partial ones lighter, empty ones grey.
BLOCK_COLORS = {"empty": "#EFEFEF", "partial": "#9ECAE1", "full": MASK_COLORS["keep"]}
#: The three masks of the work figure.
WORK_COLORS = {"causal": "#C44E52", "window": "#4C72B0", "document": "#55A868"}
#: Layer kinds in the pattern figure.
LAYER_COLORS = {"local": "#9ECAE1", "global": "#2F4B7C"}


def length_label(n: int) -> str:
    """1024 -> "1k", 131072 -> "128k", 512 -> "512"."""
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else f"{n:,}"


def mask_matrix_plot(mask, N: int, ax=None, title: str = ""):
    """One mask's N x N matrix: visible pairs in the mask colour."""
    ax = _ax(ax)
    dense = M.mask_matrix(mask, N)
    cmap = ListedColormap([MASK_COLORS["masked"], MASK_COLORS["keep"]])
    ax.imshow(dense, cmap=cmap, vmin=0, vmax=1, interpolation="nearest")
    ax.set(title=title, xlabel="key kv_idx", ylabel="query q_idx")
    ax.tick_params(labelsize=7)
    return ax


def block_mask_plot(bm: M.BlockMask, ax=None, title: str | None = None, dense=None):
    """A block mask's tiles coloured by kind; ``dense`` (the N x N matrix) drawn over
    them in thin dark cells when given."""
    ax = _ax(ax)
    cmap = ListedColormap([BLOCK_COLORS[k] for k in ("empty", "partial", "full")])
    ext = (0, bm.kinds.shape[1] * bm.Bc, bm.kinds.shape[0] * bm.Br, 0)
    ax.imshow(bm.kinds, cmap=cmap, vmin=0, vmax=2, extent=ext, interpolation="nearest")
    if dense is not None:
        over = np.ma.masked_where(~dense, dense)
        ax.imshow(
            over,
            cmap=ListedColormap(["#08306B"]),
            alpha=0.35,
            extent=(0, bm.N_k, bm.N_q, 0),
            interpolation="nearest",
        )
    # the tile grid: one collection per direction (a 32k x 32k mask in 64-tiles has
    # 1,026 lines; one Line2D each took seconds), each spanning the axes as axvline's
    grid = dict(colors="white", lw=0.6, capstyle="projecting")
    ax.vlines(
        range(0, ext[1] + 1, bm.Bc), 0, 1, transform=ax.get_xaxis_transform(), **grid
    )
    ax.hlines(
        range(0, ext[2] + 1, bm.Br), 0, 1, transform=ax.get_yaxis_transform(), **grid
    )
    ax.set_xlim(0, bm.N_k)
    ax.set_ylim(bm.N_q, 0)
    if title is None:
        title = f"block {bm.Br}: {bm.visited} of {bm.tiles} tiles visited"
    ax.set(title=title, xlabel="key", ylabel="query")
    ax.tick_params(labelsize=7)
    return ax


def block_legend(fig_or_ax, **kw):
    """The tile-kind legend."""
    handles = [
        Patch(color=BLOCK_COLORS[k], label=f"{k} tile") for k in ("full", "partial")
    ]
    handles.append(Patch(color=BLOCK_COLORS["empty"], label="empty tile (skipped)"))
    return fig_or_ax.legend(handles=handles, **kw)


def block_sparse_work_figure(
    N_max: int = 131072,
    window: int = 4096,
    doc_len: int = 2048,
    d: int = 128,
    block: int = 128,
    bytes_per_elem: int = 2,
    axes=None,
):
    """HBM bytes and FLOPs of one head's block-sparse forward against N (1k to N_max,
    powers of two) for dense causal, a sliding window and causal documents of
    ``doc_len``, from ``attention.memory.blocksparse``'s closed forms."""
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(9.0, 3.6))
    ns = [2**p for p in range(10, int(np.log2(N_max)) + 1)]
    runs = {
        "causal": lambda n: bs.causal_work(n, d, block, block),
        "window": lambda n: bs.window_work(n, d, window, block, block),
        "document": lambda n: bs.document_work(n, d, doc_len, block, block),
    }
    labels = {
        "causal": "dense causal",
        "window": f"window {window:,}",
        "document": f"documents of {length_label(doc_len)}",
    }
    for name, fn in runs.items():
        work = [fn(n) for n in ns]
        kw = dict(color=WORK_COLORS[name], label=labels[name], marker="o", ms=3)
        axes[0].plot(ns, [w.bytes(bytes_per_elem) / 2**20 for w in work], **kw)
        axes[1].plot(ns, [w.flops / 1e9 for w in work], **kw)
    for ax, what in zip(axes, ("HBM traffic (MiB)", "matmul GFLOPs"), strict=True):
        ax.set(xscale="log", yscale="log", xlabel="sequence length N", ylabel=what)
        ax.set_xticks(ns[::2] if len(ns) > 5 else ns)
        ax.set_xticklabels([length_label(n) for n in ax.get_xticks()])
        ax.minorticks_off()
        ax.grid(alpha=0.3)
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=8)
    axes[0].set_title(f"one head, d = {d}, tiles {block} x {block}, 2-byte elements")
    axes[1].set_title("S = QK^T and O = PV over visited tiles")
    return axes


def layer_pattern_figure(patterns: dict, ax=None, n_layers: int | None = None):
    """One row per model: each layer a cell, local (sliding window) or global."""
    ax = _ax(ax)
    names = list(patterns)
    for r, name in enumerate(names):
        kinds = patterns[name][:n_layers] if n_layers else patterns[name]
        for i, kind in enumerate(kinds):
            ax.add_patch(
                plt.Rectangle((i, r + 0.1), 0.9, 0.8, color=LAYER_COLORS[kind], lw=0)
            )
    width = max(len(p[:n_layers] if n_layers else p) for p in patterns.values())
    ax.set_xlim(0, width)
    ax.set_ylim(len(names), 0)
    ax.set_yticks([r + 0.5 for r in range(len(names))], names)
    ax.set_xlabel("layer")
    handles = [Patch(color=c, label=k) for k, c in LAYER_COLORS.items()]
    ax.legend(
        handles=handles,
        loc="lower right",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=8,
        ncol=2,
    )
    return ax


__all__ = [
    "BLOCK_COLORS",
    "block_legend",
    "block_mask_plot",
    "block_sparse_work_figure",
    "layer_pattern_figure",
    "length_label",
    "mask_matrix_plot",
]
