"""The book's figures (matplotlib) and its one palette.

Every chapter draws with these colours, so a colour means the same thing on every
page: Q, K, V, S, P, O are always the same hue, and so are the memory levels
(HBM, SRAM, DRAM). Functions take an optional ``ax`` and return it, so a chapter
can compose them.
"""

from __future__ import annotations

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np

#: Tensors keep their colours in every chapter.
TENSOR_COLORS: dict[str, str] = {
    "Q": "#4C72B0",  # blue
    "K": "#DD8452",  # orange
    "V": "#55A868",  # green
    "S": "#C44E52",  # red: the N x N scores
    "P": "#8172B3",  # purple: the N x N probabilities
    "O": "#937860",  # brown: the output
    "dO": "#B07AA1",
    "dQ": "#7DA3D9",
    "dK": "#F0B27A",
    "dV": "#8FCB9B",
    "l": "#8C8C8C",  # row sums
    "m": "#595959",  # row maxima
    "L": "#3F3F3F",  # log-sum-exp
    "idx": "#CCB974",
}

#: Memory levels keep theirs.
MEMORY_COLORS: dict[str, str] = {
    "HBM": "#2F4B7C",  # dark blue: big and slow
    "SRAM": "#FFA600",  # amber: small and fast
    "DRAM": "#7A7A7A",  # grey: CPU memory
    "read": "#2F4B7C",
    "write": "#D45087",
}

#: Implementations in timing plots.
IMPL_COLORS: dict[str, str] = {
    "naive": "#C44E52",
    "triton": "#4C72B0",
    "numpy": "#937860",
    "sdpa": "#55A868",
    "sdpa-flash": "#55A868",
    "sdpa-efficient": "#8FCB9B",
    "sdpa-cudnn": "#2E7D32",
    "sdpa-math": "#A5A5A5",
}

#: Sequential colour map for attention weights (0 = white, 1 = dark).
ATTENTION_CMAP = "Blues"


def tensor_color(name: str) -> str:
    return TENSOR_COLORS.get(name, "#333333")


def use_book_style() -> None:
    """Matplotlib defaults shared by every chapter."""
    mpl.rcParams.update(
        {
            "figure.dpi": 100,
            "savefig.dpi": 150,
            "figure.figsize": (6.4, 4.0),
            "axes.spines.top": False,
            "axes.spines.right": False,
            "axes.grid": False,
            "axes.titlesize": 11,
            "axes.labelsize": 10,
            "legend.frameon": False,
            "font.size": 10,
        }
    )


def _ax(ax):
    if ax is None:
        _, ax = plt.subplots()
    return ax


def attention_heatmap(
    weights: np.ndarray,
    q_labels=None,
    k_labels=None,
    ax=None,
    title: str | None = None,
    colorbar: bool = True,
    vmax: float | None = None,
):
    """Draw an (N_q, N_k) attention map: rows are queries, columns keys, darker = more weight."""
    ax = _ax(ax)
    w = np.asarray(weights)
    if w.ndim != 2:
        raise ValueError(f"weights must be 2-D (N_q, N_k), got shape {w.shape}")
    im = ax.imshow(w, cmap=ATTENTION_CMAP, vmin=0.0, vmax=vmax or max(float(w.max()), 1e-12),
                   aspect="auto", interpolation="nearest")
    if q_labels is not None:
        ax.set_yticks(range(len(q_labels)), labels=[str(t) for t in q_labels])
    if k_labels is not None:
        ax.set_xticks(range(len(k_labels)), labels=[str(t) for t in k_labels], rotation=90)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    if title:
        ax.set_title(title)
    if colorbar:
        ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="weight")
    return ax


def traffic_bars(per_tensor: dict, ax=None, title: str | None = None, unit: str = "elements"):
    """Stacked bars of HBM reads and writes per tensor.

    ``per_tensor`` maps a tensor name to ``(reads, writes)``.
    """
    ax = _ax(ax)
    names = list(per_tensor)
    reads = np.array([per_tensor[n][0] for n in names], dtype=float)
    writes = np.array([per_tensor[n][1] for n in names], dtype=float)
    x = np.arange(len(names))
    colors = [tensor_color(n) for n in names]
    ax.bar(x, reads, color=colors, edgecolor="black", linewidth=0.5, label="read from HBM")
    ax.bar(x, writes, bottom=reads, color=colors, edgecolor="black", linewidth=0.5,
           hatch="///", alpha=0.6, label="written to HBM")
    ax.set_xticks(x, labels=names)
    ax.set_ylabel(f"HBM traffic ({unit})")
    if title:
        ax.set_title(title)
    ax.legend()
    return ax


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.3g} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n} B"  # unreachable
