"""Chapter 1's figures of a real model (all-MiniLM-L6-v2, ``attention.pretrained``):
every layer's and head's map of one sentence as thumbnails, one head's map with its
tokens, the mean row entropy per layer and head, and the mass on special tokens per
layer. Layers and heads are numbered from 1 on the figures, as Clark et al. (2019)
number them ("head 1-3" is layer 1, head 3).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from . import live
from .maps import attention_heatmap
from .style import ATTENTION_CMAP, _nonempty

#: One letter per head type on the thumbnails and the entropy grid.
TYPE_LETTERS = {
    "previous": "P",
    "next": "N",
    "self": "S",
    "[SEP]": "E",
    "[CLS]": "C",
    "punctuation": ".",
    "broad": "B",
    "mixed": "",
}
#: Colours of the special-token bars (one per key class).
MASS_COLORS = {"[CLS]": "#2F4B7C", "[SEP]": "#C44E52", "punctuation": "#DD8452"}


def _check_maps(maps, tokens) -> np.ndarray:
    p = np.asarray(maps)
    _nonempty("maps", p)
    if p.ndim != 4 or p.shape[2] != p.shape[3] or p.shape[3] != len(tokens):
        raise ValueError(
            f"maps must be (L, H, N, N) with N = len(tokens) = {len(tokens)}, got "
            f"{p.shape}"
        )
    return p


def _legend_text(types) -> str:
    used = [t for t in TYPE_LETTERS if TYPE_LETTERS[t] and t in set(np.ravel(types))]
    return "   ".join(f"{TYPE_LETTERS[t]} = {t}" for t in used)


def heads_grid_figure(maps, tokens, types=None, title: str | None = None):
    """Every head's (N, N) map as a thumbnail: one column per layer, one row per head
    (12 rows x 6 columns, tall enough to read on a phone), each on its own colour
    scale 0..1; ``types`` (L, H) puts the head type's letter in a corner."""
    p = _check_maps(maps, tokens)
    L, H = p.shape[:2]
    fig, axes = plt.subplots(H, L, figsize=(6.4, 1.02 * H + 0.6), squeeze=False)
    for h in range(H):
        for layer in range(L):
            ax = axes[h, layer]
            ax.imshow(
                p[layer, h],
                cmap=ATTENTION_CMAP,
                vmin=0,
                vmax=1,
                interpolation="nearest",
            )
            ax.set_xticks([])
            ax.set_yticks([])
            for s in ax.spines.values():
                s.set_visible(True)
                s.set_color("#BBBBBB")
            if types is not None and TYPE_LETTERS[types[layer][h]]:
                ax.text(
                    0.96,
                    0.06,
                    TYPE_LETTERS[types[layer][h]],
                    transform=ax.transAxes,
                    ha="right",
                    va="bottom",
                    fontsize=11,
                    fontweight="bold",
                    color="#E8590C",
                )
            if h == 0:
                ax.set_title(f"layer {layer + 1}", fontsize=11)
            if layer == 0:
                ax.set_ylabel(f"head {h + 1}", fontsize=11)
    if title:
        fig.suptitle(title, fontsize=11)
    if types is not None:
        fig.text(0.5, 0.005, _legend_text(types), ha="center", fontsize=10)
    fig.tight_layout(h_pad=0.3, w_pad=0.3, rect=(0, 0.015, 1, 1))
    return fig


def head_map_figure(maps, tokens, layer: int, head: int, ax=None, title=None):
    """One head's map with its tokens on both axes (``layer``, ``head`` from 1)."""
    p = _check_maps(maps, tokens)
    if not (1 <= layer <= p.shape[0] and 1 <= head <= p.shape[1]):
        raise ValueError(
            f"layer must be in 1..{p.shape[0]} and head in 1..{p.shape[1]}, got "
            f"layer={layer}, head={head}"
        )
    own = ax is None  # a figure of its own: laid out here, else by its maker
    if own:
        _, ax = plt.subplots(figsize=(5.2, 4.6))
    attention_heatmap(
        p[layer - 1, head - 1],
        q_labels=tokens,
        k_labels=tokens,
        ax=ax,
        vmax=1.0,
        title=title or f"head {layer}-{head}",
    )
    ax.set_xticks(range(len(tokens)), labels=tokens, rotation=90, fontsize=9)
    ax.set_yticks(range(len(tokens)), labels=tokens, fontsize=9)
    if own:
        ax.figure.tight_layout()
    return ax.figure


def entropy_figure(stats: dict, types=None, ax=None):
    """Mean row entropy (bits) per head (rows) and layer (columns), annotated with its
    value and the head type's letter; white = 0 (a head on one key), dark = near
    uniform over the sentence."""
    ent = np.asarray(stats["entropy"])  # (L, H)
    _nonempty("stats['entropy']", ent)
    L, H = ent.shape
    own = ax is None  # a figure of its own: laid out here, else by its maker
    if own:
        _, ax = live.subplots(figsize=(5.0, 6.4))
    im = ax.imshow(ent.T, cmap="viridis_r", aspect="auto", vmin=0)
    for layer in range(L):
        for h in range(H):
            letter = "" if types is None else TYPE_LETTERS[types[layer][h]]
            v = ent[layer, h]
            ax.text(
                layer,
                h,
                f"{v:.1f} {letter}".strip(),
                ha="center",
                va="center",
                fontsize=9,
                color="white" if v > 0.6 * ent.max() else "black",
            )
    ax.set_xticks(range(L), labels=[str(i + 1) for i in range(L)])
    ax.set_yticks(range(H), labels=[str(i + 1) for i in range(H)])
    ax.set(xlabel="layer", ylabel="head")
    live.colorbar(im, ax, label="mean row entropy (bits)", shrink=0.8)
    if types is not None:
        ax.set_title(_legend_text(types), fontsize=9)
    if own:
        ax.figure.tight_layout()
    return ax.figure


def layer_mass_figure(mass: dict, ax=None):
    """Per layer, the share of a row's weight (mean over heads, rows and sentences)
    on [CLS], on [SEP] and on punctuation, as stacked bars."""
    names = [k for k in MASS_COLORS if k in mass]
    _nonempty("mass", names)
    L = len(mass[names[0]])
    if ax is None:
        _, ax = plt.subplots(figsize=(6.0, 3.4))
    bottom = np.zeros(L)
    x = np.arange(1, L + 1)
    for k in names:
        v = np.asarray(mass[k])
        ax.bar(x, v, bottom=bottom, color=MASS_COLORS[k], label=k, ec="#222", lw=0.4)
        bottom += v
    ax.set(
        xlabel="layer",
        ylabel="share of each row's weight",
        ylim=(0, 1),
        xticks=x,
    )
    ax.axhline(1.0, color="#8C8C8C", lw=0.8, ls="--")
    ax.legend(ncols=3, loc="upper center", bbox_to_anchor=(0.5, 1.16), fontsize=9)
    ax.figure.tight_layout()
    return ax.figure


__all__ = [
    "MASS_COLORS",
    "TYPE_LETTERS",
    "entropy_figure",
    "head_map_figure",
    "heads_grid_figure",
    "layer_mass_figure",
]
