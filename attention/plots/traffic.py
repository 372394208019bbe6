"""HBM traffic figures: bytes per tensor and per algorithm, from ``attention.memory``'s
simulator (tile by tile) beside its closed forms (chapters 1, 3 and 4)."""

from __future__ import annotations

import functools

import matplotlib as mpl
import numpy as np

from .. import memory
from ..checks import check_int
from . import live
from .style import (
    DTYPE_BYTES,
    POW2_LABELS,
    SELECTION_COLORS,
    _ax,
    _nonempty,
    _unit,
    human_bytes,
    tensor_color,
)


def traffic_bars(
    per_tensor: dict, ax=None, title: str | None = None, unit: str = "elements"
):
    """Stacked bars of HBM reads and writes per tensor.

    ``per_tensor`` maps a tensor name to ``(reads, writes)``.
    """
    _nonempty("per_tensor", per_tensor)
    ax = _ax(ax)
    names = list(per_tensor)
    reads = np.array([per_tensor[n][0] for n in names], dtype=float)
    writes = np.array([per_tensor[n][1] for n in names], dtype=float)
    x = np.arange(len(names))
    colors = [tensor_color(n) for n in names]
    ax.bar(
        x, reads, color=colors, edgecolor="black", linewidth=0.5, label="read from HBM"
    )
    ax.bar(
        x,
        writes,
        bottom=reads,
        color=colors,
        edgecolor="black",
        linewidth=0.5,
        hatch="///",
        alpha=0.6,
        label="written to HBM",
    )
    ax.set_xticks(x, labels=names)
    ax.set_ylabel(f"HBM traffic ({unit})")
    if title:
        ax.set_title(title)
    ax.legend()
    return ax


#: Legend groups of ``traffic_by_algorithm``: each legend column is one group, so a
#: light shade (a gradient) is read beside its group's header rather than among a
#: dozen swatches.
TENSOR_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("inputs", ("Q", "K", "V")),
    ("N × N", ("S", "P", "dP", "dS")),
    ("output, stats", ("O", "l", "m", "L", "D")),
    ("gradients", ("dO", "dQ", "dK", "dV")),
)


def _by_group(tensors) -> list[str]:
    """Tensor names in legend-group order; names in no group keep their order at
    the end."""
    tensors = list(tensors)
    known = [t for _, members in TENSOR_GROUPS for t in members if t in tensors]
    return known + [t for t in tensors if t not in known]


def _label_segments(ax, results, tensors, names, scale, top) -> None:
    """Write each tensor's name inside its block of a bar, where the block is
    tall enough."""
    for xi, n in enumerate(names):
        y = 0.0
        for t in tensors:
            h = sum(results[n].per_tensor.get(t, (0, 0))) * scale
            if h >= 0.06 * top:
                ax.text(
                    xi,
                    y + h / 2,
                    t,
                    ha="center",
                    va="center",
                    fontsize=8,
                    bbox={
                        "boxstyle": "round,pad=0.1",
                        "fc": "white",
                        "ec": "none",
                        "alpha": 0.7,
                    },
                )
            y += h


def _grouped_legend(ax, tensors) -> None:
    """A legend under the axes, one column per group: a bold header, then
    its tensors."""
    blank = mpl.patches.Patch(visible=False)
    columns = []
    for header, members in TENSOR_GROUPS:
        shown = [t for t in members if t in tensors]
        if shown:
            columns.append(
                [(blank, header)]
                + [(mpl.patches.Patch(color=tensor_color(t)), t) for t in shown]
            )
    rest = [t for t in tensors if not any(t in m for _, m in TENSOR_GROUPS)]
    if rest:
        columns.append(
            [(blank, "other")]
            + [(mpl.patches.Patch(color=tensor_color(t)), t) for t in rest]
        )
    columns.append(
        [
            (blank, "HBM"),
            (mpl.patches.Patch(facecolor="white", edgecolor="black"), "read"),
            (
                mpl.patches.Patch(facecolor="white", edgecolor="black", hatch="///"),
                "written",
            ),
        ]
    )
    rows = max(len(c) for c in columns)
    entries = [e for c in columns for e in c + [(blank, "")] * (rows - len(c))]
    leg = ax.legend(
        [h for h, _ in entries],
        [lbl for _, lbl in entries],
        ncol=len(columns),
        fontsize=7,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.1),
        frameon=False,
        handlelength=1.2,
        columnspacing=1.0,
    )
    for k, text in enumerate(leg.get_texts()):
        if k % rows == 0:
            text.set_fontweight("bold")


def traffic_by_algorithm(
    results: dict,
    bytes_per_elem: int = 2,
    ax=None,
    title: str | None = None,
    floor: dict | None = None,
):
    """Stacked bars of HBM bytes per algorithm, split by tensor: reads solid, writes
    hatched.

    ``results`` maps an algorithm name to its ``attention.memory.Traffic``. ``floor``
    (same keys, optional) maps each to its compulsory ``Traffic``
    (``memory.compulsory``): drawn as a black tick across the bar and labelled, so the
    simulated count (no L2) and the lower bound stand side by side.
    """
    _nonempty("results", results)
    ax = _ax(ax)
    names = list(results)
    tensors = _by_group(
        dict.fromkeys(t for r in results.values() for t in r.per_tensor)
    )
    div, unit = _unit(max(r.total for r in results.values()) * bytes_per_elem)
    x = np.arange(len(names))
    bottom = np.zeros(len(names))
    for t in tensors:
        for k, (hatch, alpha) in enumerate((("", 1.0), ("///", 0.6))):
            h = np.array(
                [results[n].per_tensor.get(t, (0, 0))[k] for n in names], dtype=float
            )
            h = h * bytes_per_elem / div
            if not h.any():
                continue
            ax.bar(
                x,
                h,
                bottom=bottom,
                color=tensor_color(t),
                hatch=hatch,
                alpha=alpha,
                edgecolor="black",
                linewidth=0.4,
            )
            bottom += h
    for xi, tot in zip(x, bottom):
        ax.text(xi, tot, f"{tot:.3g}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, labels=names)
    ax.set_ylabel(f"HBM traffic ({unit})")
    # headroom for the totals, and with ``floor`` for its two-line legend in the
    # upper right (at 1.15 it covered a bar as tall as the tallest and its total)
    ax.set_ylim(0, bottom.max() * (1.4 if floor else 1.15))
    _label_segments(ax, results, tensors, names, bytes_per_elem / div, bottom.max())
    _grouped_legend(ax, tensors)
    if floor:
        lows = [floor[n].total * bytes_per_elem / div for n in names]
        ax.hlines(lows, x - 0.42, x + 0.42, colors="black", linewidth=2.4, zorder=4)
        grouped = ax.get_legend()
        ax.add_artist(grouped)
        grouped.set_clip_on(False)  # under the axes: measured whole by a tight bbox
        ax.legend(
            handles=[
                mpl.patches.Patch(
                    facecolor="0.85",
                    edgecolor="black",
                    label="bar: simulated, no L2 (re-reads from HBM)",
                ),
                mpl.lines.Line2D(
                    [],
                    [],
                    color="black",
                    linewidth=2.4,
                    label="tick: compulsory, each tensor crosses\n"
                    "HBM once (an L2 holding the re-reads)",
                ),
            ],
            loc="upper right",
            fontsize=7,
            framealpha=0.9,
        )
    if title:
        ax.set_title(title)
    return ax


# Tensors whose counts coincide share a line: the first drawn thick, the second dashed
# on top.
_TRAFFIC_STYLES = {
    "Q": ("-", 3.0),
    "O": ("--", 1.5),
    "K": ("-", 3.0),
    "V": ("--", 1.5),
    "S": ("-", 3.0),
    "P": ("--", 1.5),
}
_TRAFFIC_FORMULAS = {
    "Q": "m d (read)",
    "O": "m d (written)",
    "K": "⌈m/Br⌉ n d",
    "V": "⌈m/Br⌉ n d",
    "S": "2 m n",
    "P": "2 m n",
}


@functools.lru_cache(maxsize=256)
def standard_traffic(n_q: int, d: int, Br: int, Bc: int, n_k: int, simulated: bool):
    """The counts of standard attention, ``memory.simulate("standard", ...)`` (tile by
    tile, checked against the closed form: a ValueError if they ever disagree) or
    ``memory.closed_form`` (``simulated=False``: the same counts at once), cached per
    argument tuple: a live figure asks for the same points again at each move."""
    form = memory.closed_form("standard", n_q, d, Br=Br, Bc=Bc, N_k=n_k)
    if not simulated:
        return form
    sim = memory.simulate("standard", n_q, d, Br=Br, Bc=Bc, N_k=n_k, keep_trace=False)
    if sim.per_tensor != form.per_tensor:
        raise ValueError(
            f"simulation and closed form disagree at m={n_q}, n={n_k}: "
            f"{sim.per_tensor} vs {form.per_tensor}"
        )
    return sim


def naive_traffic_vs_length(
    ns,
    d: int = 64,
    bytes_per_elem: int = 2,
    m: int | None = None,
    Br: int = 64,
    Bc: int = 64,
    ax=None,
    title: str | None = None,
    simulated: bool = True,
):
    """HBM bytes of standard (materialising) attention against the key length n,
    per tensor.

    Markers are counted by ``attention.memory.simulate("standard", ...)`` tile by
    tile; the lines are its closed form (a ValueError is raised if the two ever
    disagree). ``simulated=False`` (the live explorer, which must answer at once)
    takes the markers from the closed form too: the same numbers, which the simulated
    figure checks, and the legend says so. ``m`` queries attend over n keys;
    ``m=None`` is self-attention (m = n). Log-log axes.
    """
    _nonempty("ns", ns)
    ax = _ax(ax)
    ns = sorted({int(n) for n in ns})
    d, Br, Bc = int(d), int(Br), int(Bc)
    sims, forms = [], []
    for n in ns:
        n_q = n if m is None else int(m)
        sims.append(standard_traffic(n_q, d, Br, Bc, n, bool(simulated)))
        forms.append(memory.closed_form("standard", n_q, d, Br=Br, Bc=Bc, N_k=n))
    for t in ("Q", "O", "K", "V", "S", "P"):
        if t not in sims[-1].per_tensor:
            continue
        sim = (
            np.array([sum(s.per_tensor.get(t, (0, 0))) for s in sims]) * bytes_per_elem
        )
        form = (
            np.array([sum(f.per_tensor.get(t, (0, 0))) for f in forms]) * bytes_per_elem
        )
        style, width = _TRAFFIC_STYLES.get(t, ("-", 1.5))
        ax.loglog(
            ns,
            form,
            style,
            color=tensor_color(t),
            linewidth=width,
            label=f"{t}: {_TRAFFIC_FORMULAS.get(t, '')}",
        )
        ax.loglog(ns, sim, "o", color=tensor_color(t), markersize=3.5)
    total = np.array([s.total for s in sims]) * bytes_per_elem
    ax.loglog(ns, total, "-", color="black", linewidth=1.0, label="total")
    ax.set_xscale("log", base=2)  # the lengths double: 16, 64, 256, 1k, 4k
    ax.xaxis.set_major_formatter(POW2_LABELS)
    ax.minorticks_off()  # a tick per decade reads; ~100 minor ones cost a live move
    ax.set_xlabel("key length n" + (" (m = n)" if m is None else f" (m = {m} queries)"))
    ax.set_ylabel(f"HBM traffic (bytes at {bytes_per_elem} B/element)")
    ax.set_title(
        title
        or ("self-attention, m = n" if m is None else f"cross-attention, m = {m}")
        + f", d = {d}, Br = {Br}"
    )
    ax.legend(
        ncol=2,
        fontsize=8,
        title="lines: closed form, markers: "
        + ("simulated" if simulated else "closed form (= simulated)"),
        title_fontsize=8,
        loc="upper left",
    )
    return ax


#: ``naive_traffic_figure``'s panels, laid out once at ``tight_layout``'s margins for
#: the widest labels of chapter 1's explorer (corners tested): a move lays nothing out.
NAIVE_PANELS = dict(
    figsize=(11.5, 4.2),
    gridspec_kw=dict(
        width_ratios=[1.35, 1.0], left=0.061, right=0.987, bottom=0.14, top=0.861,
        wspace=0.2,
    ),
)  # fmt: skip


def naive_traffic_figure(
    n: int = 1024,
    m: int | None = None,
    d: int = 64,
    dtype: str = "float16",
    Br: int = 64,
    Bc: int = 64,
    n_range: tuple[int, int] = (16, 8192),
    simulated: bool = True,
):
    """The chapter-1 traffic figure: bytes against n (left), and per tensor at
    (m, n) (right).

    ``m=None`` is self-attention. Both panels come from ``attention.memory.simulate``
    ("standard"); the left one also draws the closed form. ``simulated=False`` draws
    the same numbers from the closed form alone (``naive_traffic_vs_length``): what the
    live explorer shows, at once at any n. Returns the figure.
    """
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    n, d = check_int("n", n, 1), check_int("d", d, 1)
    m = None if m is None else check_int("m", m, 1)
    Br, Bc = check_int("Br", Br, 1), check_int("Bc", Bc, 1)
    bpe = DTYPE_BYTES[dtype]
    lo, hi = n_range
    ns = [int(x) for x in np.geomspace(lo, hi, int(round(np.log2(hi / lo))) + 1)] + [
        int(n)
    ]
    fig, (ax0, ax1) = live.subplots(1, 2, **NAIVE_PANELS)
    naive_traffic_vs_length(
        ns, d=d, bytes_per_elem=bpe, m=m, Br=Br, Bc=Bc, ax=ax0, simulated=simulated
    )
    ax0.axvline(n, color="0.5", linewidth=0.8)
    n, d, Br, Bc = int(n), int(d), int(Br), int(Bc)
    n_q = n if m is None else int(m)
    t = standard_traffic(n_q, d, Br, Bc, n, bool(simulated))
    mib = bpe / 2**20
    order = [k for k in ("Q", "K", "V", "S", "P", "O") if k in t.per_tensor]
    order += [k for k in t.per_tensor if k not in order]
    per = {k: (t.per_tensor[k][0] * mib, t.per_tensor[k][1] * mib) for k in order}
    traffic_bars(per, ax=ax1, unit="MiB")
    ax1.set_ylim(0, 1.3 * max(r + w for r, w in per.values()))
    ax1.legend(loc="upper left", ncol=2)
    sp = sum(sum(t.per_tensor.get(k, (0, 0))) for k in ("S", "P")) / t.total
    ax1.set_title(
        f"m = {n_q}, n = {n}, d = {d}, {dtype}\n"
        f"{human_bytes(t.bytes(bpe))} in all, {sp:.0%} of it S and P"
    )
    return fig


def _count(simulated: bool, algorithm: str, *args, **kw):
    """``memory.simulate(..., keep_trace=False)``, or ``memory.closed_form`` (the same
    counts, from the formula) where ``simulated`` is False."""
    if simulated:
        return memory.simulate(algorithm, *args, keep_trace=False, **kw)
    return memory.closed_form(algorithm, *args, **kw)


#: ``selection_traffic_figure``'s panels, laid out once: the margins ``tight_layout``
#: asks for at the widest labels over chapter 3's explorer settings (N, d, k at their
#: ends; the tests check them), so a live move lays nothing out.
SELECTION_PANELS = dict(
    figsize=(12, 4.2),
    gridspec_kw=dict(left=0.063, right=0.987, bottom=0.276, top=0.913, wspace=0.17),
)


def selection_traffic_figure(
    N: int = 4096,
    d: int = 64,
    k: int = 8,
    Br: int = 64,
    Bc: int = 64,
    bytes_per_elem: int = 2,
    ns=None,
    simulated: bool = True,
):
    """HBM traffic of soft, hard and top-k attention (``attention.memory``, registered
    by ``attention.hard``): total bytes against N (closed form: lines; simulated:
    dots), and the per-tensor split at N. ``simulated=False`` (the live explorer)
    takes the dots from the closed form too: the same numbers at once, which the
    simulated figure and the tests check, and the title says so. Returns the
    figure."""
    from attention import hard  # noqa: F401  (registers soft, hard, topk)

    ns = (
        np.unique(np.geomspace(256, 65536, 9).astype(int))
        if ns is None
        else np.asarray(ns)
    )
    kw = {"soft": {}, "hard": {}, "topk": {"k": k}}
    label = {"soft": "soft", "hard": "hard (argmax)", "topk": f"top-k (k = {k})"}
    fig, (ax0, ax1) = live.subplots(1, 2, **SELECTION_PANELS)
    for name, extra in kw.items():
        tot = [
            memory.closed_form(name, int(n), d, Br=Br, Bc=Bc, **extra).bytes(
                bytes_per_elem
            )
            for n in ns
        ]
        ax0.plot(ns, tot, color=SELECTION_COLORS[name], lw=2, label=label[name])
        small = [n for n in ns if n <= 4096]
        sim = [
            _count(simulated, name, int(n), d, Br=Br, Bc=Bc, **extra).bytes(
                bytes_per_elem
            )
            for n in small
        ]
        ax0.plot(small, sim, "o", color=SELECTION_COLORS[name], ms=5)
    ax0.axvline(N, color="#8C8C8C", lw=0.8, ls=":")
    ax0.set_xscale("log", base=2)
    ax0.xaxis.set_major_formatter(POW2_LABELS)
    ax0.set_yscale("log")
    ax0.minorticks_off()  # a tick per decade reads; 48 minor ones cost a live move
    ax0.set_xlabel("sequence length N (N_q = N_k)")
    ax0.set_ylabel("HBM traffic (bytes)")
    ax0.set_title(
        f"one head, d = {d}, Br = {Br}: lines closed form, dots "
        + ("simulated" if simulated else "closed form (= simulated)")
    )
    ax0.legend()
    results = {
        label[n]: memory.closed_form(n, N, d, Br=Br, Bc=Bc, **e) for n, e in kw.items()
    }
    traffic_by_algorithm(
        results,
        bytes_per_elem=bytes_per_elem,
        ax=ax1,
        title=f"per tensor at N = {N} (closed form)",
    )
    return fig


#: ``deformable_traffic_figure``'s panels, laid out once: the margins ``tight_layout``
#: asks for at the widest labels of the explorer's settings (its tests check every
#: corner of them), so a live move lays nothing out and the picture keeps its place
#: (the crop to the drawing trims what a narrower label leaves blank).
DEFORM_PANELS = dict(
    figsize=(11.5, 4.0),
    gridspec_kw=dict(
        width_ratios=[1.1, 1], left=0.066, right=0.987, bottom=0.295, top=0.909,
        wspace=0.154,
    ),
)  # fmt: skip

_DEFORM_ALGS = {
    "dense": "dense-image",
    "DAT fused": "dat",
    "DAT unfused": "dat-unfused",
    "MSDA": "msda",
}
DEFORM_STYLES = {
    "dense": ("#C44E52", "-"),
    "DAT fused": ("#4C72B0", "-"),
    "DAT unfused": ("#4C72B0", "--"),
    "MSDA": ("#55A868", "-"),
}


def _deform_kwargs(
    alg: str, side: int, d: int, r: int, n_points: int, n_levels: int
) -> dict:
    if alg == "msda":
        return dict(n_queries=side * side, d=d, n_levels=n_levels, n_points=n_points)
    kw = dict(height=side, width=side, d=d)
    if alg.startswith("dat"):
        kw["r"] = r
    return kw


def deformable_traffic_figure(
    side: int = 64,
    d: int = 32,
    r: int = 4,
    n_points: int = 4,
    n_levels: int = 4,
    bytes_per_elem: int = 2,
    simulated: bool = True,
):
    """HBM traffic of one head over a side x side map (every position a query): dense
    attention, DAT fused and unfused (grid_sample writes K̃, Ṽ) and MSDA.

    Left: per-tensor bars from the simulator at the chosen size. Right: total bytes
    against the map side from the closed forms (lines) and the simulator at a few
    sizes (dots). ``simulated=False`` (the live explorer) counts the bars and dots by
    the closed forms: the same numbers at once, and the right title says so.
    """
    from attention import deformable  # noqa: F401  (registers the algorithms)

    fig, (ax1, ax2) = live.subplots(1, 2, **DEFORM_PANELS)
    results = {
        name: _count(
            simulated, alg, **_deform_kwargs(alg, side, d, r, n_points, n_levels)
        )
        for name, alg in _DEFORM_ALGS.items()
    }
    traffic_by_algorithm(
        results,
        bytes_per_elem=bytes_per_elem,
        ax=ax1,
        title=f"{side} x {side} map, d = {d}, r = {r}, L·P = {n_levels} x {n_points}",
    )
    ax1.tick_params(axis="x", labelsize=8)
    sides = np.unique(np.geomspace(16, 512, 24).astype(int))
    for name, alg in _DEFORM_ALGS.items():
        color, ls = DEFORM_STYLES[name]
        tot = [
            memory.closed_form(
                alg, **_deform_kwargs(alg, s, d, r, n_points, n_levels)
            ).total
            * bytes_per_elem
            for s in sides
        ]
        ax2.plot(sides, tot, color=color, linestyle=ls, label=name)
        sim_sides = [16, 32, 64]
        sims = [
            _count(
                simulated, alg, **_deform_kwargs(alg, s, d, r, n_points, n_levels)
            ).total
            * bytes_per_elem
            for s in sim_sides
        ]
        ax2.scatter(sim_sides, sims, color=color, s=18, zorder=3)
    ax2.axvline(side, color="#8C8C8C", linewidth=0.8, linestyle=":")
    ax2.set_xscale("log", base=2)
    ax2.xaxis.set_major_formatter(POW2_LABELS)
    ax2.set_yscale("log")
    # Eight decades: a tick per decade reads; the 64 minor ticks would not (and cost
    # a third of a live move's drawing).
    ax2.minorticks_off()
    ax2.set_xlabel("map side (H = W); queries = H·W")
    ax2.set_ylabel("HBM bytes (one head)")
    ax2.set_title(
        "closed form (lines), simulated (dots)"
        if simulated
        else "closed form (lines and dots, = simulated)"
    )
    ax2.legend(fontsize=8)
    return fig
