"""Chapter 8's figures: the cost of selected attention against N (to 1M tokens), its
selection's share, the attention mass a block budget keeps, which blocks each query
picks, and the accuracy a small model trained with a budget reaches."""

from __future__ import annotations

import re

import matplotlib
import matplotlib.pyplot as plt
import numpy as np

from attention.memory import sparse as ms

from .masks import length_label
from .style import _ax


def tokens_label(n: int) -> str:
    """1024 -> "1k", 1048576 -> "1M"."""
    return f"{n >> 20}M" if n >= 1 << 20 and n % (1 << 20) == 0 else length_label(n)


#: One colour per method, the selection dashed in its method's colour.
SPARSE_COLORS = {"dense": "#C44E52", "moba": "#4C72B0", "nsa": "#8172B2",
                 "dsa": "#55A868", "quest": "#CCB974", "oracle": "#333333"}  # fmt: skip


def sparse_cost_figure(
    N_max=1 << 20, d=128, heads=8, block=64, topk=16, dsa=None, axes=None
):
    """Causal prefill FLOPs against N (1k to ``N_max``) for one KV head of ``heads``
    query heads: dense attention, MoBA's selected attention (``topk`` blocks of
    ``block``) plus its gate, and DSA's (``ms.DSA`` unless ``dsa``) plus its indexer;
    each beside dense causal attention of its own heads; right: the selection's share
    of each method's total. Closed forms of ``attention.memory.sparse`` (counts, not
    timings)."""
    dsa = dict(ms.DSA if dsa is None else dsa)
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(9.5, 3.6))
    ns = [2**p for p in range(10, int(np.log2(N_max)) + 1)]
    dense = [ms.dense_causal_flops(n, d, heads=heads) for n in ns]
    moba = [ms.selected_work(n, n, block, topk, d, group=heads).flops for n in ns]
    gate = [ms.gate_cost(n, n, block, topk, d, heads)["flops"] for n in ns]
    dsa_att = [
        ms.selected_work(n, n, 1, dsa["topk"], dsa["d"], dsa["d_v"], dsa["heads"]).flops
        for n in ns
    ]
    dsa_dense = [
        ms.dense_causal_flops(n, dsa["d"], dsa["d_v"], dsa["heads"]) for n in ns
    ]
    idx = [
        ms.indexer_cost(n, n, dsa["topk"], dsa["heads_index"], dsa["d_index"])["flops"]
        for n in ns
    ]
    ax = axes[0]
    ax.plot(ns, dense, color=SPARSE_COLORS["dense"], marker="o", ms=3,
            label=f"dense causal, {heads} heads of {d}")  # fmt: skip
    ax.plot(ns, np.add(moba, gate), color=SPARSE_COLORS["moba"], marker="o", ms=3,
            label=f"MoBA {topk} x {block} + gate")  # fmt: skip
    ax.plot(ns, gate, color=SPARSE_COLORS["moba"], ls="--", label="MoBA's gate")
    ax.plot(ns, dsa_dense, color=SPARSE_COLORS["dense"], ls=":",
            label=f"dense causal, DSA's {dsa['heads']} heads")  # fmt: skip
    ax.plot(ns, np.add(dsa_att, idx), color=SPARSE_COLORS["dsa"], marker="o", ms=3,
            label=f"DSA top {dsa['topk']:,} + indexer")  # fmt: skip
    ax.plot(ns, idx, color=SPARSE_COLORS["dsa"], ls="--", label="DSA's indexer")
    ax.set(ylabel="prefill FLOPs", title="one KV head, causal prefill")
    share = axes[1]
    share.plot(ns, np.divide(gate, np.add(moba, gate)), color=SPARSE_COLORS["moba"],
               marker="o", ms=3, label="MoBA: gate / total")  # fmt: skip
    share.plot(ns, np.divide(idx, np.add(dsa_att, idx)), color=SPARSE_COLORS["dsa"],
               marker="o", ms=3, label="DSA: indexer / total")  # fmt: skip
    share.set(ylabel="selection's share of FLOPs", ylim=(0, 1),
              title="where the selection takes over")  # fmt: skip
    for a, log_y in ((ax, True), (share, False)):
        a.set_xscale("log")
        if log_y:
            a.set_yscale("log")
        a.set_xlabel("context length N")
        a.set_xticks(ns[::2] if len(ns) > 5 else ns)
        a.set_xticklabels([tokens_label(n) for n in a.get_xticks()])
        a.minorticks_off()
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    return axes


def mass_kept_figure(curves: dict, block_sizes, ks, axes=None):
    """Mean share of attention mass kept against the budget k (blocks), one panel per
    block size, one line per method (``attention.sparse_mass.mass_curves``)."""
    block_sizes, ks = list(block_sizes), list(ks)
    if axes is None:
        _, axes = plt.subplots(1, len(block_sizes), figsize=(2.6 * len(block_sizes), 3),
                               sharey=True, squeeze=False)  # fmt: skip
        axes = axes[0]
    for a, bs in enumerate(block_sizes):
        ax = _ax(axes[a])
        for m, arr in curves.items():
            ax.plot(ks, arr[a], marker="o", ms=2, color=SPARSE_COLORS[m], label=m)
        ax.set(title=f"blocks of {bs}", xlabel="budget k (blocks)", ylim=(0, 1.02))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("attention mass kept")
    axes[0].legend(fontsize=7)
    return axes


def chosen_blocks_figure(p, selections: dict, block_size: int, axes=None, vmax=None):
    """Which key blocks each query row reads, drawn over the attention map: one panel
    per rule of ``selections`` ({name: kv_indices (N_q, S)}, -1 padding), the map p
    (N_q, N_k) in grey and each row's chosen blocks tinted in the rule's colour
    (``SPARSE_COLORS``, keyed by the name's first word, lower-cased)."""
    p = np.asarray(p, dtype=float)
    n_q, n_k = p.shape
    if axes is None:
        _, axes = plt.subplots(1, len(selections), figsize=(2.4 * len(selections), 2.6),
                               squeeze=False)  # fmt: skip
        axes = axes[0]
    vmax = np.quantile(p, 0.99) if vmax is None else vmax
    block_of = np.arange(n_k) // block_size
    for ax, (name, idx) in zip(axes, selections.items()):
        idx = np.asarray(idx)
        chosen = (block_of[None, :, None] == idx[:, None, :]).any(-1)  # (N_q, N_k)
        color = matplotlib.colors.to_rgb(
            SPARSE_COLORS.get(re.match(r"\w*", name)[0].lower(), "#4C72B0")
        )
        tint = np.zeros((n_q, n_k, 4))
        tint[..., :3], tint[..., 3] = color, 0.45 * chosen
        ax.imshow(p, cmap="Greys", vmin=0, vmax=vmax, aspect="auto",
                  interpolation="nearest")  # fmt: skip
        ax.imshow(tint, aspect="auto", interpolation="nearest")
        ax.set(title=name, xlabel="key position", xticks=[], yticks=[])
    axes[0].set_ylabel("query position")
    return axes


def budget_accuracy_figure(record: dict, ax=None):
    """Accuracy against the budget k (blocks) of a recorded ``attention.sparse_train``
    run: trained with MoBA's selection, and the dense-trained model selected at
    inference; dense attention and chance as horizontal lines; the needle's hit rate
    (the share of queries whose chosen blocks hold it) dotted."""
    ax = _ax(ax)
    cfg = record["config"]
    ks = sorted(int(k) for k in record["selected"])

    def series(key, field):
        return [record[key][k if k in record[key] else str(k)][field] for k in ks]

    moba, nsa = SPARSE_COLORS["moba"], SPARSE_COLORS["nsa"]
    ax.plot(ks, series("selected", "accuracy"), marker="o", ms=4, color=moba,
            label="trained with MoBA's selection")  # fmt: skip
    ax.plot(ks, series("selected", "hit"), ls=":", color=moba,
            label="needle among the chosen blocks")  # fmt: skip
    ax.plot(ks, series("dense_selected", "accuracy"), marker="s", ms=4, ls="--",
            color=nsa, label="trained dense, selected at inference")  # fmt: skip
    ax.axhline(record["dense"]["accuracy"], color=SPARSE_COLORS["dense"],
               label="dense attention")  # fmt: skip
    ax.axhline(1 / cfg["n_values"], color="#8C8C8C", ls=":", label="chance")
    n_blocks = -(-cfg["n"] // cfg["block_size"])
    ax.set_xticks(ks, [f"{k}\n({k / n_blocks:.0%})" for k in ks])
    ax.set(xlabel=f"budget k (blocks of {cfg['block_size']}; share of the "
           f"{cfg['n']} keys)", ylabel="recall accuracy", ylim=(0, 1.03))  # fmt: skip
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return ax
