"""Chapter 1's figures of a causal language model (SmolLM2-135M,
``attention.pretrained.decoder_heads``): the loss per position over a sequence repeated
twice, a score per layer and head as a 30 x 9 grid, and one head's map on a repeated
sequence with the induction stripe marked. Layers and heads are numbered from 1, as on
MiniLM's figures ("head 19-7" is layer 19, head 7). Large type: the figures are read on
phones.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from . import live
from .style import ATTENTION_CMAP, _nonempty

#: The colours of the two copies in the loss figure.
COPY_COLORS = ("#C44E52", "#2F4B7C")
#: The outline of a chosen head on a grid.
MARK = "#E8590C"


def copy_loss_figure(losses, length: int, ax=None):
    """The loss (nats) of each token of sequences repeated twice, ``losses``
    (n_seq, N - 1) as ``model.loss`` gives them (entry t: token t + 1): the mean over
    the sequences as a line, the band between the lowest and the highest, the first
    copy and the second in two colours."""
    loss = np.asarray(losses, dtype=np.float64)
    _nonempty("losses", loss)
    if loss.ndim != 2 or loss.shape[1] + 1 < 2 * length:
        raise ValueError(
            f"losses must be (n_seq, N - 1) with N >= 2 length, got {loss.shape}"
        )
    n = loss.shape[1] + 1
    start = n - 2 * length
    own = ax is None
    if own:
        _, ax = plt.subplots(figsize=(7.0, 4.4))
    pos = np.arange(1, n)  # the position of the token each loss scores
    for k, (a, b) in enumerate(((start, start + length), (start + length, n))):
        sel = (pos >= a) & (pos < b)
        x, y = pos[sel] - start, loss[:, sel]
        label = ("first copy", "second copy")[k]
        ax.fill_between(x, y.min(0), y.max(0), color=COPY_COLORS[k], alpha=0.2, lw=0)
        ax.plot(x, y.mean(0), color=COPY_COLORS[k], lw=2.2, label=label)
    ax.axvline(length - 0.5, color="#555555", ls="--", lw=1)
    ax.set_xlabel("position in the repeated sequence", fontsize=13)
    ax.set_ylabel("loss of the token (nats)", fontsize=13)
    ax.tick_params(labelsize=12)
    ax.set_ylim(0, None)
    ax.legend(fontsize=12, loc="upper right")
    if own:
        ax.figure.tight_layout()
    return ax.figure


def score_grid(
    scores, title: str, ax=None, mark=None, vmax: float = 1.0, cmap: str = "magma_r"
):
    """One score per layer and head (``scores`` (layers, heads)) as a grid: layers
    down, heads across, white 0 and dark ``vmax``; ``mark`` (layer, head) from 1
    outlines one head."""
    s = np.asarray(scores, dtype=np.float64)
    _nonempty("scores", s)
    if s.ndim != 2:
        raise ValueError(f"scores must be (layers, heads), got {s.shape}")
    L, H = s.shape
    own = ax is None
    if own:
        _, ax = live.subplots(figsize=(3.6, 7.4))
    im = ax.imshow(
        s,
        cmap=cmap,
        vmin=0,
        vmax=vmax,
        aspect="auto",
        interpolation="nearest",
        extent=(0.5, H + 0.5, L + 0.5, 0.5),
    )
    ax.set_xticks(range(1, H + 1))
    ax.set_yticks([1, *range(5, L + 1, 5)])
    ax.set_xlabel("head", fontsize=12)
    ax.set_ylabel("layer", fontsize=12)
    ax.tick_params(labelsize=11)
    ax.set_title(title, fontsize=12)
    ax.figure.colorbar(im, ax=ax, orientation="horizontal", fraction=0.04, pad=0.09)
    if mark is not None:
        layer, head = mark
        ax.add_patch(
            plt.Rectangle((head - 0.5, layer - 0.5), 1, 1, fill=False, ec=MARK, lw=2.5)
        )
    if own:
        ax.figure.tight_layout()
    return ax.figure


def score_grids_figure(grids: dict, marks: dict | None = None):
    """Two or three ``score_grid`` panels side by side ({title: (layers, heads)}),
    each with its own ``marks[title]`` head outlined."""
    marks = marks or {}
    fig, axes = plt.subplots(1, len(grids), figsize=(3.4 * len(grids), 7.6))
    for ax, (title, s) in zip(np.atleast_1d(axes), grids.items()):
        score_grid(s, title, ax=ax, mark=marks.get(title))
    fig.tight_layout()
    return fig


def induction_map_figure(p, length: int, title: str, ax=None, labels=None):
    """One head's causal map ``p`` (N, N) on a sequence whose last 2 ``length`` tokens
    are two copies: the weights, and the induction stripe (query i on key
    i - length + 1) outlined by a dashed line."""
    w = np.asarray(p, dtype=np.float64)
    n = w.shape[-1]
    start = n - 2 * length
    own = ax is None
    if own:
        _, ax = live.subplots(figsize=(6.2, 6.0))
    ax.imshow(w, cmap=ATTENTION_CMAP, vmin=0, vmax=1, interpolation="nearest")
    q = np.array([start + length - 0.5, n - 0.5])
    for off in (-0.5, 0.5):  # the stripe j = i - length + 1, between two lines
        ax.plot(q - length + 1 + off, q, color=MARK, ls="--", lw=1.2)
    ax.set_xlabel("key position", fontsize=13)
    ax.set_ylabel("query position", fontsize=13)
    ax.tick_params(labelsize=11)
    ax.set_title(title, fontsize=13)
    if labels is not None:
        ax.set_xticks(range(n), labels=labels, rotation=90, fontsize=9)
        ax.set_yticks(range(n), labels=labels, fontsize=9)
    if own:
        ax.figure.tight_layout()
    return ax.figure


__all__ = [
    "COPY_COLORS",
    "MARK",
    "copy_loss_figure",
    "induction_map_figure",
    "score_grid",
    "score_grids_figure",
]
