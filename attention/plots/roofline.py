"""Chapter 2's roofline: attainable FLOP/s against arithmetic intensity (log-log), the
roofs of three GPUs, and attention's forward placed on it by the memory model.

Every point is an ESTIMATE from ``attention.memory``: matmul FLOPs over the HBM bytes of
the simulator (every K/V re-read misses L2) or of the compulsory count (each tensor
crosses HBM once). The roofs are the published peaks of ``memory.GPUS``.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from .. import memory
from .decode import GPU_COLORS
from .style import IMPL_COLORS, _ax

#: The algorithms the figure places, and their colours (standard = naive's red).
ROOFLINE_ALGORITHMS = {
    "standard": IMPL_COLORS["naive"],
    "flash2": IMPL_COLORS["triton"],
}
_SHAPE_MARKERS = ("o", "s", "D", "^")


def roofline_points(
    shapes,
    algorithms=("standard", "flash2"),
    Br: int = 64,
    Bc: int = 64,
    bytes_per_elem: int = 2,
) -> list[dict]:
    """One point per (shape, algorithm, count): ``N``, ``d``, ``algorithm``, ``count``
    ("simulated" or "compulsory"), ``flops``, ``bytes`` and ``intensity`` (FLOP/byte).

    shapes: ``[(N, d), ...]``. The compulsory count is given for the FlashAttention
    algorithms only: standard attention's S and P are written and read back whole, so
    an L2 cannot remove them and its simulated count is what HBM sees.
    """
    pts = []
    for N, d in shapes:
        for alg in algorithms:
            flops = memory.matmul_flops(alg, N, d)
            counts = {"simulated": memory.closed_form(alg, N, d, Br=Br, Bc=Bc)}
            if alg != "standard":
                counts["compulsory"] = memory.compulsory(alg, N, d)
            for count, t in counts.items():
                nbytes = t.bytes(bytes_per_elem)
                pts.append(
                    dict(
                        N=N,
                        d=d,
                        algorithm=alg,
                        count=count,
                        flops=flops,
                        bytes=nbytes,
                        intensity=flops / nbytes,
                    )
                )
    return pts


def roofline_figure(points: list[dict], gpus=("A100", "H100", "H200"), ax=None):
    """Roofs of ``gpus`` (attainable TFLOP/s = min(peak, intensity x bandwidth)) and
    ``points`` from ``roofline_points`` drawn ON the roof of the first GPU.

    Colour: the algorithm; filled: simulated bytes (no L2), hollow: compulsory bytes;
    marker shape: the (N, d) shape. A dotted vertical line marks each ridge point.
    """
    ax = _ax(ax)
    lo = min(p["intensity"] for p in points) / 3
    hi = max(
        max(p["intensity"] for p in points) * 3,
        max(memory.GPUS[g].ridge for g in gpus) * 5,
    )
    x = np.geomspace(lo, hi, 300)
    for g in gpus:
        s = memory.GPUS[g]
        ax.plot(
            x,
            np.minimum(s.peak_tflops, x * s.hbm_tbps),
            color=GPU_COLORS[g],
            lw=2,
            label=g,
        )
        ax.axvline(s.ridge, color=GPU_COLORS[g], ls=":", lw=1)
    first = memory.GPUS[gpus[0]]
    shapes = list(dict.fromkeys((p["N"], p["d"]) for p in points))
    for p in points:
        y = min(first.peak_tflops, p["intensity"] * first.hbm_tbps)
        c = ROOFLINE_ALGORITHMS.get(p["algorithm"], "#333333")
        hollow = p["count"] == "compulsory"
        ax.scatter(
            p["intensity"],
            y,
            s=70,
            zorder=4,
            linewidths=2,
            edgecolors=c,
            marker=_SHAPE_MARKERS[shapes.index((p["N"], p["d"])) % 4],
            facecolors="white" if hollow else c,
        )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="arithmetic intensity (FLOP / byte)",
        ylabel="attainable TFLOP/s (ESTIMATE)",
    )
    ax.set_ylim(top=max(memory.GPUS[g].peak_tflops for g in gpus) * 2.2)
    handles = [
        plt.Line2D([], [], color=GPU_COLORS[g], lw=2, label=f"{g} roof") for g in gpus
    ]
    handles += [
        plt.Line2D([], [], marker="o", ls="", color=c, label=a)
        for a, c in ROOFLINE_ALGORITHMS.items()
        if any(p["algorithm"] == a for p in points)
    ]
    handles += [
        plt.Line2D(
            [],
            [],
            marker="o",
            ls="",
            markerfacecolor="white",
            markeredgecolor="0.3",
            label="compulsory bytes",
        )
    ]
    handles += [
        plt.Line2D(
            [],
            [],
            marker=_SHAPE_MARKERS[i % 4],
            ls="",
            color="0.4",
            label=f"N = {N}, d = {d}",
        )
        for i, (N, d) in enumerate(shapes)
    ]
    ax.text(
        lo * 1.3, first.peak_tflops * 1.25, "memory-bound", fontsize=9, color="0.35"
    )
    ax.text(
        hi / 1.3,
        first.peak_tflops * 1.25,
        "compute-bound",
        fontsize=9,
        color="0.35",
        ha="right",
    )
    ax.legend(
        handles=handles,
        fontsize=9,
        loc="upper center",
        ncol=2,
        bbox_to_anchor=(0.5, -0.2),
    )
    return ax
