"""Chapter 5's figures: the roofline of prefill against decode, the grid against the
SMs with and without splits, the cache wasted by pre-allocation against pages, and the
explorer's figure. Sized to read on a phone (390 px wide)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from .. import decode, memory
from .style import MEMORY_COLORS, TENSOR_COLORS, _ax

#: One colour per GPU preset, in the order of ``memory.GPUS``' chapter-5 list.
GPU_ORDER = ("T4", "L4", "A100", "H100", "H200")
GPU_COLORS = {
    "T4": "#8C8C8C",
    "L4": "#CCB974",
    "A100": "#55A868",
    "H100": "#4C72B0",
    "H200": "#2F4B7C",
}


def decode_roofline_figure(points: dict, gpus=GPU_ORDER, ax=None):
    """Roofline of each preset (attainable TFLOP/s = min(peak, intensity x bandwidth),
    log-log) with vertical markers at the ``points`` {label: FLOPs per byte}."""
    ax = _ax(ax)
    x = np.geomspace(0.25, 1e4, 200)
    for g in gpus:
        s = memory.GPUS[g]
        ax.plot(
            x,
            np.minimum(s.peak_tflops, x * s.hbm_tbps),
            color=GPU_COLORS[g],
            lw=2,
            label=f"{g} (ridge {s.ridge:.0f})",
        )
    for i, (label, ai) in enumerate(points.items()):
        ax.axvline(
            ai, color="#C44E52" if "decode" in label else "#333333", ls="--", lw=1
        )
        ax.text(
            ai * 1.08, 0.3 * 2.2 ** (i % 3), label, fontsize=8, rotation=90, va="bottom"
        )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="arithmetic intensity (FLOP / byte)",
        ylabel="attainable TFLOP/s (ESTIMATE)",
    )
    ax.legend(fontsize=8, loc="lower right")
    return ax


def grid_fill_figure(
    H_kv: int = 8,
    group: int = 4,
    gpu: str = "H100",
    batches=(1, 4, 16),
    splits=(1, 2, 4, 8, 16, 32),
    ax=None,
):
    """Fraction of the SMs busy (``memory.grid_fill``) against the split count, one
    line per batch; dotted: FlashAttention-2's grid of B x H_q programs."""
    ax = _ax(ax)
    sms = memory.GPUS[gpu].sms
    colors = plt.cm.Blues(np.linspace(0.45, 0.95, len(batches)))
    for B, c in zip(batches, colors):
        ax.plot(
            splits,
            [100 * memory.grid_fill(B * H_kv * S, sms) for S in splits],
            "o-",
            color=c,
            label=f"B = {B}: B·H_kv·S programs",
        )
        ax.axhline(
            100 * memory.grid_fill(B * H_kv * group, sms), color=c, ls=":", lw=1.2
        )
    ax.set(
        xscale="log",
        xlabel="splits S",
        ylabel="SMs busy (%)",
        ylim=(0, 105),
        title=f"{gpu}: {sms} SMs, H_kv = {H_kv}, H_q = {H_kv * group}",
    )
    ax.set_xticks(splits, labels=[str(s) for s in splits])
    ax.legend(fontsize=8, loc="lower right")
    return ax


def paging_waste_figure(lengths, max_len: int, page_sizes=(16, 32, 128), ax=None):
    """Percent of the reserved cache slots left empty: pre-allocated to ``max_len``,
    then in pages (``decode.contiguous_waste``, ``decode.paged_waste``)."""
    ax = _ax(ax)
    c = decode.contiguous_waste(lengths, max_len)
    rows = [("pre-allocated", c)] + [
        (f"pages of {p}", decode.paged_waste(lengths, p)) for p in page_sizes
    ]
    pct = [100 * w["wasted"] / w["reserved"] for _, w in rows]
    bars = ax.bar(
        range(len(rows)),
        pct,
        color=[TENSOR_COLORS["K"]] + [MEMORY_COLORS["HBM"]] * len(page_sizes),
        edgecolor="black",
        linewidth=0.5,
    )
    ax.bar_label(bars, labels=[f"{p:.1f}%" for p in pct], fontsize=8)
    ax.set_xticks(range(len(rows)), labels=[n for n, _ in rows], fontsize=8)
    ax.set_ylabel("reserved cache wasted (%)")
    return ax
