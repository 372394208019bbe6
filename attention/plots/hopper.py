"""Chapter 2's FlashAttention-3 timeline: a small schedule model of one thread block on
Hopper (a producer warp issuing TMA loads, consumer warpgroups sharing the tensor
cores) and its drawing. A SCHEMATIC from the book's model, not a measurement: the
durations are inputs.

The model, after the FA3 paper's Figure 1 and Section 3.1 (Shah et al., 2024):

* the producer loads K_j then V_j, each taking ``t_load``, into a ring of ``stages``
  shared-memory buffers; block j's buffer is free again once every warpgroup's
  O += P V_j of block j - stages has finished;
* a consumer warpgroup, per key block j, runs S = Q K_j^T (GEMM0, ``t_gemm``), its
  softmax (``t_softmax``: exponentials and rescaling, off the tensor cores), then
  O += P V_j (GEMM1, ``t_gemm``);
* the tensor cores run one GEMM at a time. A warpgroup issues its GEMM1 of block j and
  GEMM0 of block j + 1 together and the warpgroups take turns (ping-pong, the paper's
  named barriers), so with two warpgroups one's softmax runs while the other's GEMMs
  do; with one, the tensor cores idle during every softmax.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from .style import TENSOR_COLORS

#: What each kind of interval is drawn in: loads in K's and V's colours, GEMM0 in S's
#: (it makes scores), softmax in P's, GEMM1 in O's.
TIMELINE_COLORS = {
    "load K": TENSOR_COLORS["K"],
    "load V": TENSOR_COLORS["V"],
    "GEMM0": TENSOR_COLORS["S"],
    "softmax": TENSOR_COLORS["P"],
    "GEMM1": TENSOR_COLORS["O"],
}


def _check_positive(name, x):
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not x > 0:
        raise ValueError(f"{name} must be a positive number, got {x!r}")
    return float(x)


def fa3_timeline(
    n_blocks: int = 4,
    warpgroups: int = 2,
    t_gemm: float = 1.0,
    t_softmax: float = 1.0,
    t_load: float = 0.5,
    stages: int = 2,
) -> list[dict]:
    """Intervals of the model above: dicts ``unit`` ("producer", "WG1", ...), ``op``
    (a ``TIMELINE_COLORS`` key), ``block`` (the key block j), ``start``, ``end``.

    Each consumer warpgroup owns its own query tile and sweeps the same ``n_blocks``
    key blocks; the warpgroups take their turns on the tensor cores in a fixed order.
    """
    for name, v in (
        ("n_blocks", n_blocks),
        ("warpgroups", warpgroups),
        ("stages", stages),
    ):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    t_gemm, t_softmax = (
        _check_positive("t_gemm", t_gemm),
        _check_positive("t_softmax", t_softmax),
    )
    t_load = _check_positive("t_load", t_load)
    wgs = [f"WG{w + 1}" for w in range(warpgroups)]
    ev: list[dict] = []
    k_ready, v_ready, freed = {}, {}, {}  # block -> time
    t = 0.0
    # The producer runs ahead; its loads wait only on a free buffer, which depends on
    # the consumers, so loads and GEMMs are scheduled together, block by block.
    gemm1_done = {w: {} for w in wgs}

    def load(j, t):
        start = max(t, freed.get(j - stages, 0.0))
        ev.append(
            dict(unit="producer", op="load K", block=j, start=start, end=start + t_load)
        )
        k_ready[j] = start + t_load
        ev.append(
            dict(
                unit="producer",
                op="load V",
                block=j,
                start=start + t_load,
                end=start + 2 * t_load,
            )
        )
        v_ready[j] = start + 2 * t_load
        return v_ready[j]

    for j in range(min(stages, n_blocks)):
        t = load(j, t)
    tc_free = 0.0
    wg_free = {w: 0.0 for w in wgs}  # when the warpgroup's last softmax ended
    # Each warpgroup's GEMM "phases": phase j issues GEMM1 of block j - 1 (if any)
    # then GEMM0 of block j (if any); its softmax of block j follows.
    for phase in range(n_blocks + 1):
        for w in wgs:
            ops = []
            if phase >= 1:
                ops.append(("GEMM1", phase - 1, v_ready[phase - 1]))
            if phase < n_blocks:
                ops.append(("GEMM0", phase, k_ready[phase]))
            start_wg = wg_free[w]
            for op, j, ready in ops:
                start = max(tc_free, start_wg, ready)
                ev.append(dict(unit=w, op=op, block=j, start=start, end=start + t_gemm))
                tc_free = start_wg = start + t_gemm
                if op == "GEMM1":
                    gemm1_done[w][j] = start + t_gemm
                    if all(j in gemm1_done[x] for x in wgs):
                        freed[j] = max(gemm1_done[x][j] for x in wgs)
                        if j + stages < n_blocks:
                            t = load(j + stages, t)
            if phase < n_blocks:
                g0 = ev[-1]["end"]
                ev.append(
                    dict(
                        unit=w, op="softmax", block=phase, start=g0, end=g0 + t_softmax
                    )
                )
                wg_free[w] = g0 + t_softmax
    return sorted(ev, key=lambda e: (e["start"], e["unit"]))


def tensor_core_busy(events: list[dict]) -> float:
    """The fraction of the timeline's span during which a GEMM runs."""
    busy = sum(e["end"] - e["start"] for e in events if e["op"].startswith("GEMM"))
    return busy / max(e["end"] for e in events)


def fa3_timeline_figure(panels: dict, axes=None):
    """One Gantt chart per ``{title: events}`` (from ``fa3_timeline``), stacked, on a
    shared time axis; each interval is labelled with its key block."""
    if axes is None:
        _, axes = plt.subplots(
            len(panels), 1, figsize=(6.4, 1.5 + 1.1 * len(panels) * 1.6), sharex=True
        )
    axes = list(axes) if hasattr(axes, "__len__") else [axes]
    for ax, (title, events) in zip(axes, panels.items()):
        units = list(dict.fromkeys(["producer"] + [e["unit"] for e in events]))
        for e in events:
            y = len(units) - 1 - units.index(e["unit"])
            ax.barh(
                y,
                e["end"] - e["start"],
                left=e["start"],
                height=0.7,
                color=TIMELINE_COLORS[e["op"]],
                edgecolor="white",
                linewidth=1,
            )
            ax.text(
                (e["start"] + e["end"]) / 2,
                y,
                str(e["block"]),
                ha="center",
                va="center",
                fontsize=8,
                color="white",
            )
        ax.set_yticks(
            range(len(units)),
            labels=[
                "producer\n(TMA)" if u == "producer" else u for u in reversed(units)
            ],
        )
        ax.set_title(
            f"{title}: tensor cores busy {tensor_core_busy(events):.0%}",
            fontsize=10,
            loc="left",
        )
        ax.spines["left"].set_visible(False)
        ax.tick_params(axis="y", length=0)
    axes[-1].set_xlabel("time (units of one GEMM)")
    handles = [
        plt.Rectangle((0, 0), 1, 1, color=c, label=k)
        for k, c in TIMELINE_COLORS.items()
    ]
    axes[-1].legend(
        handles=handles,
        loc="upper center",
        ncol=3,
        fontsize=9,
        bbox_to_anchor=(0.5, -0.45),
    )
    return axes
