"""Chapter 2's tile-size explorer and the landing page's teaser: HBM traffic of the
forward (or backward) algorithms per tensor beside their compulsory traffic, the SRAM
need against the chip's, FA1's rule and the schedule over the tiles of S step by
step: the grids (``memory.closed_form``, ``compulsory``, ``simulate`` traces), the
specs, the static twins and the ipywidgets faces, one call each.
"""

from __future__ import annotations

import functools
import itertools

from attention import plots
from attention.plots import live

from . import site
from .common import (
    COMPULSORY_LABEL,
    FONT,
    bars_floor_spec,
    book_colors,
    dtypes,
    flat,
    frame,
    live_png,
    show_png,
    tensor_names,
)
from .settings import STYLE, Choice, Range, check, controls, index
from .site import Explorer

# Grids. Chapter 2 (and the landing page's teaser) cover these exactly.
TILE_N = [2**k for k in range(8, 17)]  # 256 .. 65536
TILE_D = [32, 64, 128, 256]
TILE_B = [16, 32, 64, 128, 256]
FORWARD = ["standard", "flash1", "flash2"]
BACKWARD = ["standard_bwd", "flash2_bwd", "flash2_bwd_split"]
#: On-chip memory per SM a kernel can use (KiB, as NVIDIA's "KB"), and the paper's.
SRAM_KIB = [
    ("T4 (64 KB shared)", 64),
    ("L4 (100 KB shared)", 100),
    ("A100 (164 KB shared)", 164),
    ("A100 L1+shared, the paper's (192 KB)", 192),
    ("H100 (228 KB shared)", 228),
]
#: The step view walks the schedule at this (small) N.
TRACE_N = 256
TRACE_D = 64

#: The settings both faces take (the live sliders' ranges); the static twin shows the
#: points of its grid among them (``TILE_N``, ``TILE_B``, ``SRAM_KIB``).
SETTINGS = {
    "N": Range(64, 65536, 64, label="N"),
    "d": Choice(TILE_D, label="head dim d"),
    "sram_kib": Range(16, 256, 4, label="SRAM (KiB)"),
    "Br": Range(16, 512, 16, label="Br"),
    "Bc": Range(16, 512, 16, label="Bc"),
    "dtype": Choice(plots.DTYPE_BYTES, label="dtype"),
    "algorithm": Choice(FORWARD + BACKWARD, label="algorithm"),
}


def tile_grid(Ns=TILE_N, ds=TILE_D, Bs=TILE_B, algorithms=FORWARD + BACKWARD) -> dict:
    """``memory.closed_form`` of each algorithm at every (N, d, Br, Bc) of the grid.

    ``counts[alg][k]`` is [r_0, w_0, r_1, w_1, ..., sram_peak] over ``tensors[alg]``,
    with k = ((iN * len(ds) + id) * len(Bs) + iBr) * len(Bs) + iBc. Counts are elements;
    they do not depend on the SRAM size or the dtype (which only decide whether the
    tiles fit: ``sram_peak <= M``, the test ``closed_form(..., M=M)`` makes).
    """
    from attention import memory

    tensors, counts = {}, {}
    for alg in algorithms:
        res = [
            memory.closed_form(alg, N, d, Br=br, Bc=bc)
            for N, d, br, bc in itertools.product(Ns, ds, Bs, Bs)
        ]
        tensors[alg] = tensor_names(res)
        counts[alg] = [
            flat(r.per_tensor, tensors[alg]) + [int(r.sram_peak)] for r in res
        ]
    return {
        "N": list(Ns),
        "d": list(ds),
        "B": list(Bs),
        "tensors": tensors,
        "counts": counts,
    }


def compulsory_grid(Ns=TILE_N, ds=TILE_D, algorithms=FORWARD + BACKWARD) -> dict:
    """``memory.compulsory`` of each algorithm at every (N, d): ``counts[alg][k]`` is
    [total elements, *per-tensor reads and writes over ``tensors[alg]``], with
    k = iN * len(ds) + id. Each tensor crosses HBM once: the lower bound an L2 that
    holds the re-reads gets near (the tiles do not change it)."""
    from attention import memory

    tensors, counts = {}, {}
    for alg in algorithms:
        res = [memory.compulsory(alg, N, d) for N, d in itertools.product(Ns, ds)]
        tensors[alg] = tensor_names(res)
        counts[alg] = [[int(r.total)] + flat(r.per_tensor, tensors[alg]) for r in res]
    return {
        "N": list(Ns),
        "d": list(ds),
        "tensors": tensors,
        "counts": counts,
        "label": COMPULSORY_LABEL,
    }


def sram_table(Ns=TILE_N, ds=TILE_D, srams=SRAM_KIB) -> dict:
    """M (elements) for each SRAM size and dtype (``M[si][ti]``), and FA1's rule there:
    ``rule["si,ti,di,Ni"]`` = [Br, Bc] of ``memory.fa1_block_sizes(M, d)`` and the SRAM
    its flash1 tiles need at N (``memory.sram_need``)."""
    from attention import memory

    M, rule = [], {}
    for si, (_, kib) in enumerate(srams):
        row = []
        for ti, (_, bpe) in enumerate(dtypes()):
            m = kib * 1024 // bpe
            row.append(m)
            for di, d in enumerate(ds):
                br, bc = memory.fa1_block_sizes(m, d)
                for ni, N in enumerate(Ns):
                    need = memory.sram_need("flash1", N, d, br, bc)
                    rule[f"{si},{ti},{di},{ni}"] = [br, bc, need]
        M.append(row)
    return {"M": M, "rule": rule}


def _fmt(events, op) -> str:
    names = [
        f"{t.tensor}[{','.join(map(str, t.block))}]" if t.block else t.tensor
        for t in events
        if t.op == op
    ]
    return " ".join(dict.fromkeys(names)) or "-"


def schedule_steps(algorithm: str, N: int, d: int, Br: int, Bc: int) -> list[list]:
    """The steps of ``memory.simulate(algorithm, ..., keep_trace=True)``, one row each:
    [i, j, tensor, loads, stores]. (i, j) is the tile of S computed on chip (j = -1: the
    whole query block i, a row pass); ``tensor`` is the N x N_k tensor (S, P, dP or dS)
    whose tile crossed HBM at that step, or "SRAM" if it lived only on chip."""
    from attention import memory, plots

    t = memory.simulate(algorithm, N, d, Br=Br, Bc=Bc, keep_trace=True)
    steps: dict[int, list] = {}
    for ev in t.trace:
        steps.setdefault(ev.step, []).append(ev)
    rows = []
    for s in sorted(steps):
        ev = steps[s]
        comp = [e for e in ev if e.op == "compute"]
        block = comp[0].block if comp else ()
        quad = [
            e.tensor
            for e in ev
            if e.tensor in plots.QUADRATIC_TENSORS and e.op != "compute"
        ]
        rows.append(
            [
                block[0] if block else -1,
                block[1] if len(block) > 1 else -1,
                quad[-1] if quad else "SRAM",
                _fmt(ev, "load"),
                _fmt(ev, "store"),
            ]
        )
    return rows


def schedule_table(
    N=TRACE_N, d=TRACE_D, Bs=TILE_B, algorithms=FORWARD + BACKWARD
) -> dict:
    """``schedule_steps`` of each algorithm at every (Br, Bc), keyed "alg,Br,Bc", with
    the grid's T_r = ceil(N/Br) and T_c = ceil(N/Bc)."""
    from attention import memory

    return {
        "N": N,
        "d": d,
        "runs": {
            f"{a},{br},{bc}": {
                "tr": memory.cdiv(N, br),
                "tc": memory.cdiv(N, bc),
                "steps": schedule_steps(a, N, d, br, bc),
            }
            for a in algorithms
            for br in Bs
            for bc in Bs
        },
    }


def tiles_spec(height: int = 240) -> dict:
    """The grid of (i, j) tiles of S at one step of a schedule. Data "tiles":
    {i, j, fill (a tensor, "SRAM" or "pending"), current (bool)}."""
    colors = book_colors()
    fills = ["S", "P", "dP", "dS", "SRAM", "pending"]
    rng = [colors[f] for f in fills[:-1]] + ["#ffffff"]
    return {
        **frame(height),
        "data": {"name": "tiles"},
        "mark": {"type": "rect", "stroke": "#cccccc", "strokeWidth": 0.5},
        "encoding": {
            "x": {
                "field": "j",
                "type": "ordinal",
                "title": "key block j",
                "axis": {"labelAngle": 0},
            },
            "y": {"field": "i", "type": "ordinal", "title": "query block i"},
            "color": {
                "field": "fill",
                "type": "nominal",
                "scale": {"domain": fills, "range": rng},
                "legend": {"orient": "bottom", "title": "tile went to", "columns": 3},
            },
            "opacity": {
                "condition": {
                    "test": ("datum.current || datum.fill == 'pending'"),
                    "value": 1.0,
                },
                "value": 0.35,
            },
            "strokeWidth": {
                "condition": {"test": "datum.current", "value": 2.5},
                "value": 0.5,
            },
            "stroke": {
                "condition": {"test": "datum.current", "value": "#000000"},
                "value": "#cccccc",
            },
            "tooltip": [{"field": "i"}, {"field": "j"}, {"field": "fill"}],
        },
        **FONT,
    }


def static_tile_size_explorer(
    N: int = 1024,
    d: int = 64,
    sram_kib: int = 192,
    Br: int = 64,
    Bc: int = 64,
    dtype: str = "float16",
    algorithm: str = "flash2",
) -> Explorer:
    """Chapter 2's tile-size explorer for the static site: HBM bytes of the forward (or
    backward) algorithms per tensor (simulated, no L2) with each one's compulsory
    traffic beside it (``memory.compulsory``), the chosen algorithm's SRAM need against
    M (``sram_kib``, one of ``SRAM_KIB``), FA1's rule, and its schedule over the tiles
    of S step by step at N = ``TRACE_N``."""
    check(SETTINGS, N=N, d=d, sram_kib=sram_kib, Br=Br, Bc=Bc, dtype=dtype)
    check(SETTINGS, algorithm=algorithm)
    grid = tile_grid()
    fwd_t = tensor_names_of(grid, FORWARD)
    bwd_t = tensor_names_of(grid, BACKWARD)
    types = dtypes()
    sram_i = index("sram_kib", sram_kib, [kib for _, kib in SRAM_KIB])
    config = {
        "grid": grid,
        "sram": sram_table(),
        "schedule": schedule_table(),
        "compulsory": compulsory_grid(),
        "groups": {"fwd": FORWARD, "bwd": BACKWARD},
        "dtypes": types,
        "srams": SRAM_KIB,
        "init": {
            "N": index("N", N, TILE_N),
            "d": index("d", d, TILE_D),
            "sram": sram_i,
            "Br": index("Br", Br, TILE_B),
            "Bc": index("Bc", Bc, TILE_B),
            "dtype": index("dtype", dtype, [n for n, _ in types]),
            "algorithm": index("algorithm", algorithm, FORWARD + BACKWARD),
            "step": 0,
        },
        "specs": {
            "bars_fwd": bars_floor_spec(fwd_t),
            "bars_bwd": bars_floor_spec(bwd_t),
            "tiles": tiles_spec(),
        },
    }
    return Explorer(
        "tile",
        config,
        "Tile-size explorer (chapter 2)",
        "explorers.tile_size_explorer()",
    )


def tensor_names_of(grid: dict, algorithms: list[str]) -> list[str]:
    return list(dict.fromkeys(t for a in algorithms for t in grid["tensors"][a]))


#: A setting whose simulation (of the chosen algorithm, the one whose schedule is
#: drawn) would record more events than this is drawn from the closed forms alone
#: (same counts, no schedule): a slider redraw stays well under a second.
SIMULATE_EVENTS = 1_500_000
#: The tile explorer's schedule panel draws at most this many tiles of S (as the
#: figure's ``max_tiles``); beyond it the step slider is switched off.
MAX_TILES = 16384


def tile_schedule_state(N: int, d: int, M: int, Br: int, Bc: int, algorithm: str):
    """What the tile explorer's step slider can show: ``(steps, None)`` with the number
    of steps of ``algorithm``'s schedule, or ``(0, reason)`` when there is no schedule
    to step through (the tiles do not fit in ``M`` elements of SRAM, or too many tiles
    to draw). From ``memory.closed_form``: nothing is simulated."""
    from attention import memory

    try:
        form = memory.closed_form(algorithm, N, d, Br=Br, Bc=Bc, M=M)
    except ValueError as err:  # the tiles do not fit in M
        return 0, f"step: off, the tiles do not fit in SRAM. {err}"
    tiles = memory.cdiv(N, Br) * memory.cdiv(N, Bc)
    if tiles > MAX_TILES:
        return 0, (
            f"step: off, {tiles:,} tiles of S are too many to draw (at most "
            f"{MAX_TILES:,}); shrink N or grow Br, Bc"
        )
    return form.steps, None


def _closed_form_tile_figure(N, d, sram_kib, Br, Bc, dtype, algorithm, events):
    """The tile explorer's figure for settings too big to simulate: HBM traffic
    and roofline ESTIMATES from ``memory.closed_form`` (the same counts
    ``simulate`` would give)."""
    from attention import memory, plots

    bpe = plots.DTYPE_BYTES[dtype]
    M = int(sram_kib) * 1024 // bpe
    group = BACKWARD if algorithm in BACKWARD else FORWARD
    results, unfit = {}, []
    for a in group:  # the chosen algorithm's tiles fit; a sibling's may not
        try:
            results[a] = memory.closed_form(a, N, d, Br=Br, Bc=Bc, M=M)
        except ValueError:
            unfit.append(a)
    floor = {a: memory.compulsory(a, N, d) for a in results}
    # the panels of the simulated figure (the picture keeps its size and layout as a
    # slider crosses SIMULATE_EVENTS); the text where the schedule is drawn
    fig, (ax0, ax2, ax1) = live.subplots(1, 3, **plots.schedule.LIVE_PANELS)
    plots.traffic_by_algorithm(
        results,
        bytes_per_elem=bpe,
        ax=ax0,
        floor=floor,
        title=f"HBM traffic, N = {N}, d = {d}, Br = {Br}, Bc = {Bc},\n"
        f"{dtype} (closed form)",  # two lines: one overflows the panel
    )

    def estimate(counts):
        return {
            g: {
                a: memory.roofline_ms(memory.matmul_flops(a, N, d), r.bytes(bpe), spec)
                * 1e3
                for a, r in counts.items()
            }
            for g, spec in memory.GPUS.items()
        }

    plots.roofline_bars(
        estimate(results),
        ax=ax1,
        unit="µs",
        floor=estimate(floor),
        title="roofline ESTIMATE of one head, not a measurement",
    )
    ax2.axis("off")
    text = (
        f"Counted by memory.closed_form:\nsimulating these {events:,} events\n"
        f"in Python would take too long\n(no schedule drawn).\n\nThe numbers are "
        f"printed\nunder the figure."
    )
    if unfit:
        text += f"\n\nNot drawn: the tiles of\n{', '.join(unfit)} do not fit\nin SRAM."
    ax2.text(0, 1, text, va="top", fontsize=10)
    return fig


def tile_figure(N, d, sram_kib, Br, Bc, dtype, algorithm, step):
    """The live face's figure at one setting: ``plots.tile_explorer_figure`` (the
    counts from the closed forms; only the chosen algorithm is simulated, for its
    schedule), or, past ``SIMULATE_EVENTS``, the closed forms alone."""
    from attention import memory

    kw = dict(N=N, d=d, sram_kib=sram_kib, Br=Br, Bc=Bc, dtype=dtype)
    M = int(sram_kib) * 1024 // plots.DTYPE_BYTES[dtype]
    try:
        events = memory.closed_form(algorithm, N, d, Br=Br, Bc=Bc, M=M).events
    except ValueError:
        # The tiles do not fit: the figure says why, simulating nothing.
        events = 0
    if events > SIMULATE_EVENTS:
        return _closed_form_tile_figure(algorithm=algorithm, events=events, **kw)
    return plots.tile_explorer_figure(
        algorithm=algorithm, step=step, max_tiles=MAX_TILES, text_panel=False, **kw
    )


@functools.lru_cache(maxsize=256)
def tile_png(N, d, sram_kib, Br, Bc, dtype, algorithm, step) -> str:
    """``tile_figure`` as a PNG, cached: a slider moved back to a setting it showed
    redraws at once (each PNG is some 100 KB; 256 of them at most)."""
    return live_png(tile_figure, N, d, sram_kib, Br, Bc, dtype, algorithm, step)


def live_tile_size_explorer(
    N: int = 1024,
    d: int = 64,
    sram_kib: int = 192,
    Br: int = 64,
    Bc: int = 64,
    dtype: str = "float16",
    algorithm: str = "flash2",
):
    """Sliders for N, d, SRAM size, Br, Bc, dtype, algorithm and the schedule's step.

    Each change redraws ``attention.plots.tile_explorer_figure``: HBM reads and writes
    per algorithm and tensor (simulated, no L2, beside the compulsory traffic), the
    tiles in SRAM at the chosen step, and roofline ESTIMATES for A100, H100 and H200
    from both counts; ``plots.tile_explorer_summary`` prints the numbers under the
    figure. Tiles larger than the SRAM draw the reason instead, and switch the step
    slider off (the label beside it says why), as do more tiles than can be drawn.
    Settings too big to simulate quickly (``SIMULATE_EVENTS``) are drawn from the closed
    forms, so no slider position can stall the kernel. "Use the FA1 rule" sets Br and Bc
    from the SRAM size. Returns the widget box.
    """
    import html

    import ipywidgets as widgets

    from attention import memory, plots

    check(SETTINGS, N=N, d=d, sram_kib=sram_kib, Br=Br, Bc=Bc, dtype=dtype)
    check(SETTINGS, algorithm=algorithm)
    values = dict(N=N, d=d, sram_kib=sram_kib, Br=Br, Bc=Bc, dtype=dtype)
    c = controls(SETTINGS, {**values, "algorithm": algorithm}, continuous_update=False)
    n_s, d_m, m_s, br_s, bc_s, dt_m, alg_m = c.values()
    step_s = widgets.IntSlider(
        value=0, min=0, max=0, description="step", continuous_update=False, style=STYLE
    )
    step_note = widgets.HTML(value="")
    rule_b = widgets.Button(description="Use the FA1 rule for Br, Bc")
    out = widgets.Output()
    summary = widgets.HTML(value="")  # the numbers, printed under the figure
    busy = {"on": False}

    def sram_elements() -> int:
        return m_s.value * 1024 // plots.DTYPE_BYTES[dt_m.value]

    def update_step() -> None:
        steps, why = tile_schedule_state(
            n_s.value, d_m.value, sram_elements(), br_s.value, bc_s.value, alg_m.value
        )
        step_s.max = max(steps - 1, 0)
        step_s.disabled = why is not None
        if why is not None:
            step_s.value = 0
        step_note.value = "" if why is None else f"<i>{why}</i>"

    def numbers() -> str:
        try:
            text = plots.tile_explorer_summary(
                N=n_s.value,
                d=d_m.value,
                sram_kib=m_s.value,
                Br=br_s.value,
                Bc=bc_s.value,
                dtype=dt_m.value,
                algorithm=alg_m.value,
            )
        except ValueError:  # the tiles do not fit: the figure gives the reason
            return ""
        style = "font-size: 12px; line-height: 1.3"
        return f"<pre style='{style}'>{html.escape(text)}</pre>"

    def redraw(change=None):
        if busy["on"]:
            return
        busy["on"] = True
        try:
            if change is None or change["owner"] is not step_s:
                update_step()
                summary.value = numbers()
            show_png(
                out,
                tile_png(
                    n_s.value,
                    d_m.value,
                    m_s.value,
                    br_s.value,
                    bc_s.value,
                    dt_m.value,
                    alg_m.value,
                    step_s.value,
                ),
            )
        finally:
            busy["on"] = False

    def use_rule(_button):
        br, bc = memory.fa1_block_sizes(sram_elements(), d_m.value)
        busy["on"] = True  # one redraw for both sliders
        br_s.value = min(max(br, br_s.min), br_s.max)
        bc_s.value = min(max(bc, bc_s.min), bc_s.max)
        busy["on"] = False
        redraw()

    for w in (n_s, d_m, m_s, br_s, bc_s, dt_m, alg_m, step_s):
        w.observe(redraw, names="value")
    rule_b.on_click(use_rule)
    redraw()
    panel = widgets.VBox(
        [
            widgets.HBox([n_s, d_m, m_s, dt_m]),
            widgets.HBox([br_s, bc_s, rule_b]),
            widgets.HBox([alg_m, step_s, step_note]),
        ]
    )
    return widgets.VBox([panel, out, summary])


def tile_size_explorer(
    N: int = 1024,
    d: int = 64,
    sram_kib: int = 192,
    Br: int = 64,
    Bc: int = 64,
    dtype: str = "float16",
    algorithm: str = "flash2",
):
    """Chapter 2: HBM traffic of the forward (or backward) algorithms beside their
    compulsory traffic, the SRAM need against ``sram_kib`` KiB, FA1's rule and the
    schedule over the tiles of S, step by step. The static twin on the built site
    (``N``, ``Br``, ``Bc``, ``sram_kib`` points of its grid), ipywidgets elsewhere."""
    face = static_tile_size_explorer if site.ON_SITE else live_tile_size_explorer
    return face(
        N=N, d=d, sram_kib=sram_kib, Br=Br, Bc=Bc, dtype=dtype, algorithm=algorithm
    )


__all__ = [
    "compulsory_grid",
    "schedule_steps",
    "schedule_table",
    "sram_table",
    "tile_figure",
    "tile_grid",
    "tile_png",
    "tile_schedule_state",
    "tile_size_explorer",
]
