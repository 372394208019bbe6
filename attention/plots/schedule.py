"""Where the bytes go and how long they take: the memory hierarchy, a tiled schedule
step by step, roofline ESTIMATES, and chapter 2's tile-size explorer built from them."""

from __future__ import annotations

import functools

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np

from .. import memory
from . import live
from .style import (
    DTYPE_BYTES,
    MEMORY_COLORS,
    QUADRATIC_TENSORS,
    _ax,
    _nonempty,
    human_bytes,
    tensor_color,
)
from .traffic import traffic_by_algorithm

_GPU_MARKERS = {"A100": "o", "H100": "s", "H200": "D", "CPU": "^"}


def memory_hierarchy_plot(levels: list[dict], ax=None, title: str | None = None):
    """Bandwidth against capacity, both log scale, one marker per (device,
    memory level).

    Each level is a dict with ``device`` ("A100", "H100", "H200", "CPU"), ``kind``
    ("SRAM", "HBM", "DRAM": the colour), ``capacity`` (bytes), ``bandwidth``
    (bytes/s), ``label`` and optionally ``derived=True`` (drawn hollow: computed, not
    a spec number) and ``offset`` (the label's offset in points).
    """
    _nonempty("levels", levels)
    ax = _ax(ax)
    for lv in levels:
        color = MEMORY_COLORS[lv["kind"]]
        hollow = lv.get("derived", False)
        ax.scatter(
            lv["capacity"],
            lv["bandwidth"],
            s=90,
            marker=_GPU_MARKERS.get(lv["device"], "o"),
            facecolors="white" if hollow else color,
            edgecolors=color,
            linewidths=2,
            zorder=3,
        )
        ax.annotate(
            lv["label"],
            (lv["capacity"], lv["bandwidth"]),
            xytext=lv.get("offset", (8, -4)),
            textcoords="offset points",
            fontsize=8,
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("capacity (bytes)")
    ax.set_ylabel("bandwidth (bytes / s)")
    kinds = list(dict.fromkeys(lv["kind"] for lv in levels))
    devices = list(dict.fromkeys(lv["device"] for lv in levels))
    handles = [mpl.patches.Patch(color=MEMORY_COLORS[k], label=k) for k in kinds]
    handles += [
        mpl.lines.Line2D(
            [], [], marker=_GPU_MARKERS.get(g, "o"), linestyle="", color="0.3", label=g
        )
        for g in devices
    ]
    if any(lv.get("derived") for lv in levels):
        handles.append(
            mpl.lines.Line2D(
                [],
                [],
                marker="o",
                linestyle="",
                markerfacecolor="white",
                markeredgecolor="0.3",
                label="derived, not a spec",
            )
        )
    ax.legend(handles=handles, loc="lower left", fontsize=8)
    ax.set_title(title or "Faster means smaller")
    return ax


def _step_events(trace) -> dict:
    """step -> list of Transfers of that step (trace order)."""
    out: dict[int, list] = {}
    for t in trace:
        out.setdefault(t.step, []).append(t)
    return out


def _fmt_transfer(ts, op) -> str:
    names = []
    for t in ts:
        if t.op != op:
            continue
        sub = ",".join(str(b) for b in t.block) if t.block else ""
        names.append(f"{t.tensor}{'[' + sub + ']' if sub else ''}")
    return " ".join(dict.fromkeys(names)) or "-"


def tile_schedule_plot(
    trace,
    step: int,
    n_row_blocks: int,
    n_col_blocks: int,
    ax=None,
    title: str | None = None,
):
    """The grid of (i, j) tiles of S, filled in up to ``step`` of a simulated schedule.

    A tile's colour says where its data went: the colour of S, P, dP or dS when that
    N x N_k tile crossed HBM at that step, SRAM amber when it lived only on chip. Tiles
    done at earlier steps are pale; the current one is outlined. The strips show which
    query block (left) and key block (top) are in SRAM now. ``trace`` comes from
    ``attention.memory.simulate(..., keep_trace=True)``.
    """
    ax = _ax(ax)
    events = _step_events(trace)
    steps = sorted(events)
    if not steps:
        raise ValueError("trace is empty: simulate with keep_trace=True")
    step = int(np.clip(step, steps[0], steps[-1]))
    tr, tc = n_row_blocks, n_col_blocks
    img = np.ones((tr, tc, 4))
    cur = None
    for s in steps:
        if s > step:
            break
        ts = events[s]
        comp = [t for t in ts if t.op == "compute"]
        if not comp:
            continue
        block = comp[0].block
        quad = [
            t.tensor for t in ts if t.tensor in QUADRATIC_TENSORS and t.op != "compute"
        ]
        color = mpl.colors.to_rgba(
            tensor_color(quad[-1]) if quad else MEMORY_COLORS["SRAM"]
        )
        color = color if s == step else (*color[:3], 0.35)
        rows = [block[0]] if block else range(tr)
        cols = [block[1]] if len(block) > 1 else range(tc)
        for i in rows:
            for j in cols:
                img[i, j] = color
        if s == step:
            cur = block
    ax.imshow(img, extent=(0, tc, tr, 0), interpolation="nearest", aspect="auto")
    if tr * tc <= 4096:  # grid lines only while they stay readable
        # one collection per direction, where a grid on minor ticks makes a tick
        # object per line (a tenth of a second of a live move at 64 x 64 blocks);
        # drawn where a grid is (over the tiles, under the outline's zorder)
        grid = dict(colors="0.8", linewidth=0.5, zorder=1.5)
        ax.vlines(np.arange(tc + 1), 0, tr, **grid)
        ax.hlines(np.arange(tr + 1), 0, tc, **grid)
    if cur is not None:
        i0, i1 = (cur[0], cur[0] + 1) if cur else (0, tr)
        j0, j1 = (cur[1], cur[1] + 1) if len(cur) > 1 else (0, tc)
        ax.add_patch(
            mpl.patches.Rectangle(
                (j0, i0), j1 - j0, i1 - i0, fill=False, edgecolor="black", linewidth=2
            )
        )
        # Strips: the resident query block (left, Q's colour) and key block (top, K's).
        ax.add_patch(
            mpl.patches.Rectangle(
                (-0.06 * tc, i0),
                0.04 * tc,
                i1 - i0,
                color=tensor_color("Q"),
                clip_on=False,
            )
        )
        if len(cur) > 1:
            ax.add_patch(
                mpl.patches.Rectangle(
                    (j0, -0.06 * tr),
                    j1 - j0,
                    0.04 * tr,
                    color=tensor_color("K"),
                    clip_on=False,
                )
            )
    ax.set_xlim(0, tc)
    ax.set_ylim(tr, 0)
    # every block numbered while the numbers stay apart (at most 12 an axis: every
    # 2nd or 4th block beyond), beyond 32 blocks the default ticks
    for n, set_ticks in ((tr, ax.set_yticks), (tc, ax.set_xticks)):
        if n <= 32:
            every = next(k for k in (1, 2, 4) if n <= 12 * k)
            at = np.arange(0, n, every)
            set_ticks(at + 0.5, labels=[str(i) for i in at])
    ts = events[step]
    ax.set_xlabel(
        f"key block j (T_c = {tc})\nload: {_fmt_transfer(ts, 'load')}\n"
        f"store: {_fmt_transfer(ts, 'store')}",
        fontsize=8,
    )
    ax.set_ylabel(f"query block i (T_r = {tr})")
    ax.set_title(title or f"step {step + 1} of {len(steps)}", fontsize=10, pad=16)
    return ax


#: How the compulsory count is named wherever it is drawn beside the simulated one.
COMPULSORY_LABEL = (
    "compulsory traffic: each tensor\ncrosses HBM once (an L2 holding\nthe re-reads)"
)


def _scaled(times: dict, factor: float) -> dict:
    return {g: {a: v * factor for a, v in per.items()} for g, per in times.items()}


def roofline_bars(
    estimates: dict,
    ax=None,
    title: str | None = None,
    unit: str = "ms",
    floor: dict | None = None,
):
    """Grouped bars of ESTIMATED times: ``estimates[gpu][algorithm] = time in unit``.

    Estimates from the roofline model, not measurements: the title says so. ``floor``
    (same keys) draws a second estimate of each bar as a black tick across it: the time
    with only the compulsory traffic (``memory.compulsory``), labelled as such.
    """
    _nonempty("estimates", estimates)
    ax = _ax(ax)
    gpus = list(estimates)
    algs = list(dict.fromkeys(a for g in gpus for a in estimates[g]))
    # microseconds past 10,000 read as milliseconds (12.5 ms, not 12500 µs)
    top = max((v for g in gpus for v in estimates[g].values()), default=0.0)
    if unit == "µs" and top >= 1e4:
        unit, estimates = "ms", _scaled(estimates, 1e-3)
        floor = _scaled(floor, 1e-3) if floor else floor
    width = 0.8 / max(len(algs), 1)
    shades = np.linspace(0.35, 0.85, len(algs)) if len(algs) > 1 else [0.5]
    for k, a in enumerate(algs):
        x = np.arange(len(gpus)) + (k - (len(algs) - 1) / 2) * width
        vals = [estimates[g].get(a, np.nan) for g in gpus]
        ax.bar(
            x,
            vals,
            width,
            color=str(shades[k]),
            edgecolor="black",
            linewidth=0.4,
            label=f"{a} (simulated traffic, no L2)" if floor else a,
        )
        if floor:
            lows = [floor[g].get(a, np.nan) for g in gpus]
            ax.hlines(
                lows,
                x - width * 0.45,
                x + width * 0.45,
                colors="black",
                linewidth=2.2,
                label=COMPULSORY_LABEL if k == 0 else None,
            )
    ax.set_xticks(np.arange(len(gpus)), labels=gpus)
    ax.set_ylabel(f"{unit} (ESTIMATE)")
    if floor:  # under the axes: the tallest bars stand at the top left
        ax.legend(
            fontsize=7,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.1),
            ncol=2,
            frameon=False,
        )
    else:
        ax.legend(fontsize=7)
    ax.set_title(title or "roofline ESTIMATE, not a measurement", fontsize=10)
    return ax


_EXPLORER_GROUPS = (
    ["standard", "flash1", "flash2"],
    ["standard_bwd", "flash2_bwd", "flash2_bwd_split"],
)


def _explorer_group(algorithm: str) -> list[str]:
    """The forward or backward algorithms the tile explorer compares ``algorithm``
    with; ValueError naming it when it is neither."""
    for group in _EXPLORER_GROUPS:
        if algorithm in group:
            return list(group)
    names = [a for g in _EXPLORER_GROUPS for a in g]
    raise ValueError(f"algorithm must be one of {names}, got {algorithm!r}")


@functools.lru_cache(maxsize=1)
def _schedule(algorithm: str, N: int, d: int, Br: int, Bc: int):
    """``memory.simulate(algorithm, N, d, Br=Br, Bc=Bc, keep_trace=True)``, the last one
    kept. The SRAM size only decides whether the tiles fit (the closed forms check that
    first, with it): the schedule is the same for every size that holds them, so the
    explorer's SRAM slider redraws without simulating again."""
    return memory.simulate(algorithm, N, d, Br=Br, Bc=Bc, keep_trace=True)


#: The live tile explorer's three panels (traffic, schedule, roofline), laid out once:
#: the legends under the panels inside the canvas (a live face then crops it in one
#: draw); the panels as tall as on a 4.6 in figure of default margins. The closed-form
#: figure of ``explorers.tile_size`` draws into the same panels.
LIVE_PANELS = dict(
    figsize=(15, 5.4),
    gridspec_kw=dict(wspace=0.3, width_ratios=[1.1, 1, 1.1], bottom=0.24, top=0.898),
)


def tile_explorer_figure(
    N: int = 1024,
    d: int = 64,
    sram_kib: int = 192,
    Br: int = 64,
    Bc: int = 64,
    dtype: str = "float16",
    algorithm: str = "flash2",
    step: int = 0,
    max_tiles: int = 16384,
    text_panel: bool = False,
):
    """The chapter-2 tile-size explorer: everything ``attention.memory`` says about one
    setting.

    Panels: HBM traffic of standard, FA1 and FA2 (or of the backward passes, if
    ``algorithm`` is one), counted by ``memory.closed_form`` (the simulator's counts,
    no L2), each bar with a black tick at the compulsory traffic (``memory.compulsory``:
    each tensor crosses HBM once, the floor an L2 holding the re-reads gets near); the
    chosen algorithm's schedule over the tiles of S at ``step`` (the one algorithm
    simulated); roofline time ESTIMATES for A100, H100 and H200, from both counts. The
    SRAM holds ``sram_kib`` KiB of ``dtype`` elements. Tiles that do not fit draw the
    reason instead; more than ``max_tiles`` tiles are counted but not drawn (and nothing
    is simulated).
    ``text_panel=True`` adds the numbers as a text panel inside the figure (on its way
    out); ``tile_explorer_summary`` gives them as text to print under it. Returns the
    figure.
    """
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    bpe = DTYPE_BYTES[dtype]
    M = int(sram_kib) * 1024 // bpe
    fa1_br, fa1_bc = memory.fa1_block_sizes(M, d)
    fa1_need = memory.sram_need("flash1", N, d, fa1_br, fa1_bc)
    fits = "fit" if fa1_need <= M else "do NOT fit: the rule holds up to constants"
    rule = (
        f"FA1 rule: Bc = ceil(M/4d) = {fa1_bc}, "
        f"Br = min(ceil(M/4d), d) = {fa1_br};\n"
        f"  its flash1 tiles need {fa1_need} elements ({fits})"
    )
    group = _explorer_group(algorithm)
    t_r, t_c = memory.cdiv(N, Br), memory.cdiv(N, Bc)
    animate = t_r * t_c <= max_tiles
    try:
        # The counts of every algorithm from the closed forms (the same counts simulate
        # gives); only the algorithm whose schedule is drawn is simulated (its trace).
        results = {a: memory.closed_form(a, N, d, Br=Br, Bc=Bc, M=M) for a in group}
        chosen = _schedule(algorithm, N, d, Br, Bc) if animate else results[algorithm]
    except ValueError as err:
        fig, ax = live.subplots(figsize=(11, 2.2))
        ax.axis("off")
        ax.text(
            0,
            0.75,
            f"Invalid choice: {err}",
            wrap=True,
            fontsize=10,
            color="#C44E52",
            va="top",
        )
        ax.text(0, 0.2, rule, fontsize=9, va="top", wrap=True)
        return fig
    floor = {a: memory.compulsory(a, N, d) for a in group}
    if text_panel:
        fig = plt.figure(figsize=(12, 8.2))
        gs = fig.add_gridspec(2, 2, height_ratios=[1, 1.05], hspace=0.55, wspace=0.28)
        slots = [fig.add_subplot(g) for g in (gs[0, 0], gs[0, 1], gs[1, 0])]
    else:
        fig, slots = live.subplots(1, 3, **LIVE_PANELS)
    traffic_by_algorithm(
        results,
        bytes_per_elem=bpe,
        ax=slots[0],
        floor=floor,
        title=f"HBM traffic, N = {N}, d = {d}, Br = {Br}, Bc = {Bc}, {dtype}",
    )
    ax = slots[1]
    if animate:
        tile_schedule_plot(
            chosen.trace,
            step,
            t_r,
            t_c,
            ax=ax,
            title=f"{algorithm}: step "
            f"{min(step, chosen.steps - 1) + 1} of {chosen.steps}",
        )
    else:
        ax.axis("off")
        ax.text(
            0,
            0.5,
            f"{t_r} x {t_c} = {t_r * t_c} tiles: too many to draw.\n"
            f"Shrink N or grow Br, Bc to see the schedule.",
            fontsize=10,
        )
    est, low, lines = {}, {}, []
    for g, spec in memory.GPUS.items():
        est[g], low[g] = {}, {}
        for a, r in results.items():
            fl = memory.matmul_flops(a, N, d)
            est[g][a] = memory.roofline_ms(fl, r.bytes(bpe), spec) * 1e3  # microseconds
            low[g][a] = memory.roofline_ms(fl, floor[a].bytes(bpe), spec) * 1e3
    for a, r in results.items():
        ai = memory.arithmetic_intensity(memory.matmul_flops(a, N, d), r.bytes(bpe))
        lines.append(f"{a}: {human_bytes(r.bytes(bpe))}, {ai:.0f} FLOP/byte")
    ax = slots[2]
    roofline_bars(
        est,
        ax=ax,
        unit="µs",
        floor=low,
        title="roofline ESTIMATE of one head, not a measurement",
    )
    if not text_panel:
        return fig
    ax2 = fig.add_subplot(gs[1, 1])
    ax2.axis("off")
    ridge = ", ".join(f"{g} {s.ridge:.0f}" for g, s in memory.GPUS.items())
    text = (
        "Arithmetic intensity (matmul FLOPs / HBM byte):\n  "
        + "\n  ".join(lines)
        + f"\nRidge (peak FLOP/s / HBM B/s): {ridge}\n\n"
        + f"SRAM: {sram_kib} KiB = M = {M} {dtype} elements;\n"
        + f"  the tiles of {algorithm} need {chosen.sram_peak}.\n"
        + rule
        + "\n\nEstimate = max(FLOPs / peak, bytes / HBM bandwidth), with\n"
        + "\n".join(
            f"  {s.name}: {s.peak_tflops:g} TFLOP/s, {s.hbm_tbps:g} TB/s"
            for s in memory.GPUS.values()
        )
    )
    ax2.text(0, 1, text, va="top", fontsize=8, family="monospace", wrap=True)
    return fig


def tile_explorer_summary(
    N: int = 1024,
    d: int = 64,
    sram_kib: int = 192,
    Br: int = 64,
    Bc: int = 64,
    dtype: str = "float16",
    algorithm: str = "flash2",
) -> str:
    """The numbers behind ``tile_explorer_figure`` as a short text, one fact a line:
    traffic and arithmetic intensity per algorithm, simulated (no L2) and compulsory
    (each tensor once), the GPUs' ridge points, what the SRAM holds and what the tiles
    need, and the FA1 rule's tiles. From the closed forms: nothing is simulated."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    bpe = DTYPE_BYTES[dtype]
    M = int(sram_kib) * 1024 // bpe
    results = {
        a: memory.closed_form(a, N, d, Br=Br, Bc=Bc, M=M)
        for a in _explorer_group(algorithm)
    }
    fa1_br, fa1_bc = memory.fa1_block_sizes(M, d)
    fa1_need = memory.sram_need("flash1", N, d, fa1_br, fa1_bc)
    lines = [
        f"{'':<18}{'simulated (no L2)':>28}{'compulsory':>24}",
        f"{'algorithm':<18}{'HBM traffic':>16}{'FLOP/byte':>12}"
        f"{'HBM traffic':>13}{'FLOP/byte':>11}",
    ]
    for a, r in results.items():
        fl = memory.matmul_flops(a, N, d)
        once = memory.compulsory(a, N, d).bytes(bpe)
        ai, ai_once = (memory.arithmetic_intensity(fl, b) for b in (r.bytes(bpe), once))
        lines.append(
            f"{a:<18}{human_bytes(r.bytes(bpe)):>16}{ai:>12.0f}"
            f"{human_bytes(once):>13}{ai_once:>11.0f}"
        )
    ridge = ", ".join(f"{g} {s.ridge:.0f}" for g, s in memory.GPUS.items())
    lines += [
        f"ridge points (peak FLOP/s / HBM bytes/s): {ridge}",
        f"SRAM: {sram_kib} KiB = M = {M} {dtype} elements; "
        f"the tiles of {algorithm} need {results[algorithm].sram_peak}",
        f"FA1 rule: Bc = ceil(M/4d) = {fa1_bc}, "
        f"Br = min(ceil(M/4d), d) = {fa1_br}; "
        f"its tiles need {fa1_need} elements "
        f"({'fit' if fa1_need <= M else 'do NOT fit'})",
    ]
    return "\n".join(lines)
