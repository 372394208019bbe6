"""Chapter 6's context-parallel explorer: sequence length, devices, heads, head dim,
dtype, causal, layout, link and GPU -> per-step compute and transfer time, overlap,
per-device memory and idle fraction of ring attention, beside all-gather context
parallelism (one all-gather of K/V, exposed, then one attention call) and
DeepSpeed-Ulysses.

Every number is computed here, in Python, by ``attention.memory.ring`` (closed forms
and peak-rate ESTIMATES) and ``attention.ring`` (the work per device and step): once
per combination for the static site (``ring_grid``, drawn by ``_static/explorers.js``,
which only looks rows up) and on demand for the live ipywidgets version.
``context_parallel_explorer`` returns whichever fits where it runs.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np

from attention import ring as _ring
from attention.memory import ring as _mring

from . import site
from .common import FONT, GREEN, GREY, PURPLE, cached_png, frame, show_png
from .settings import Choice, check, controls
from .site import Explorer

#: The grid of the static twin (the live version takes these values too).
RING_N = [16384, 65536, 262144, 1048576]
RING_P = [2, 4, 8, 16, 32]
#: (label, H, H_kv)
RING_HEADS = [
    ("8 (MHA)", 8, 8),
    ("32 (MHA)", 32, 32),
    ("32 q / 8 kv (GQA)", 32, 8),
    ("64 q / 8 kv (GQA)", 64, 8),
]
RING_D = [64, 128]
RING_DTYPES = ["bfloat16", "float32"]  # float16 is bfloat16's twin (2 bytes, same peak)
RING_LAYOUTS = ["contiguous", "zigzag"]
RING_LINKS = ["NVLink 4", "PCIe 5 x16", "InfiniBand NDR"]
RING_GPUS = ["A100", "H100", "H200"]
#: The NVLink generation each GPU has (its SXM form): an NVLink of another generation
#: is a hypothetical pair, labelled so in the readout as chapter 6 labels it; PCIe and
#: InfiniBand pair with any of them.
NATIVE_NVLINK = {"A100": "NVLink 3", "H100": "NVLink 4", "H200": "NVLink 4"}

#: The fields of one row of ``ring_grid()["rows"]`` (times in ms, ESTIMATES at peak).
ROW_FIELDS = [
    "compute_ms",
    "transfer_ms",
    "total_ms",
    "serial_ms",
    "hidden_pct",
    "ulysses_ms",
    "ulysses_a2a_ms",
    "allgather_ms",
    "allgather_total_ms",
    "allgather_pct",
]
#: The entries of one row of ``ring_grid()["memory"]`` (bytes per device).
MEMORY_FIELDS = ["ring", "ulysses", "allgather_kv"]


def _sig(x: float, digits: int = 4) -> float:
    return float(f"{x:.{digits}g}")


def ring_row(
    N: int,
    P: int,
    H: int,
    H_kv: int,
    d: int,
    dtype: str,
    causal: bool,
    layout: str,
    gpu: str,
    link: str,
) -> dict:
    """One configuration's ESTIMATES (ms, at peak rates): the busiest step's compute,
    one step's K/V transfer, the ring's total with overlap (double-buffered) and
    without, the share of transfer time hidden, and DeepSpeed-Ulysses (compute plus
    its two all-to-alls, not overlapped; None where P does not divide the heads).

    All-gather context parallelism, as chapter 6 computes it: the busiest device's
    ``allgather_closed_form`` K/V volume at the link's per-direction peak
    (``allgather_ms``, exposed: the gather does not hide behind the attention it
    feeds), plus one attention call over the device's queries and all keys (the
    ring's FLOPs of that device summed over its steps) in ``allgather_total_ms``;
    ``allgather_pct`` is the gather as a share of that attention."""
    counts = _mring.ring_closed_form(N, P, H, d, H_kv, 1, causal, layout)
    t = _mring.ring_times(counts, gpu, link, dtype)
    bw = _mring.LINKS[link].gbps * 1e9
    b = _mring.DTYPE_BYTES[dtype]
    gather = (
        _mring.allgather_closed_form(N, P, H, d, H_kv)["kv_received"].max() * b / bw
    )
    attend = counts.flops.sum(axis=0).max() / _mring.peak_flops(gpu, dtype)
    row = {
        "compute_ms": float(t["compute_s"].max() * 1e3),
        "transfer_ms": float(t["transfer_s"].max() * 1e3),
        "total_ms": t["total_s"] * 1e3,
        "serial_ms": t["serial_s"] * 1e3,
        "hidden_pct": 100.0 * t["hidden"],
        "ulysses_ms": None,
        "ulysses_a2a_ms": None,
        "allgather_ms": float(gather * 1e3),
        "allgather_total_ms": float((gather + attend) * 1e3),
        "allgather_pct": float(100.0 * gather / attend),
    }
    if H % P == 0 and H_kv % P == 0:
        u = _mring.ulysses_closed_form(N, P, H, d, H_kv)
        a2a = max(u["sent"].max(), u["received"].max()) * b / bw
        pairs = N * (N + 1) // 2 if causal else N * N
        comp = 4 * pairs * (H // P) * d / _mring.peak_flops(gpu, dtype)
        row["ulysses_ms"], row["ulysses_a2a_ms"] = (comp + a2a) * 1e3, a2a * 1e3
    return row


def memory_row(N: int, P: int, H: int, H_kv: int, d: int, dtype: str) -> list:
    """``MEMORY_FIELDS`` per device: ring bytes and Ulysses bytes or None
    (``memory_per_device``), and the all of K/V that all-gather context parallelism
    holds during attention (``allgather_closed_form``'s ``kv_held``, in bytes)."""
    ring = _mring.memory_per_device(N, P, H, d, H_kv, 1, dtype, "ring")
    uly = (
        _mring.memory_per_device(N, P, H, d, H_kv, 1, dtype, "ulysses")
        if H % P == 0 and H_kv % P == 0
        else None
    )
    kv = _mring.allgather_closed_form(N, P, H, d, H_kv)["kv_held"].max()
    return [ring, uly, int(kv) * _mring.DTYPE_BYTES[dtype]]


def work_shares(N: int, P: int, causal: bool, layout: str) -> list[list[float]]:
    """work[t][r] as a share of a full (largest shard)^2 block, 3 decimals."""
    w = _mring.pairs_matrix(N, P, layout, causal)
    full = int(_mring.shard_lengths(N, P, layout).max()) ** 2
    return np.round(w / full, 3).tolist()


@functools.lru_cache(maxsize=1)
def ring_grid() -> dict:
    """The static twin's data: rows in the order of ``itertools.product(N, P, heads, d,
    dtype, causal, layout, gpu, link)``, each ``ROW_FIELDS`` (4 significant digits);
    memory per (N, P, heads, d, dtype); idle fraction per (N, P, causal, layout); the
    work shares per (N, P, causal, layout) as indices into a table of distinct
    matrices (they differ across N only by the causal diagonal's (n+1)/2n)."""
    rows = []
    for N, P, (_, H, H_kv), d, dt, c, lay, g, ln in itertools.product(
        RING_N,
        RING_P,
        RING_HEADS,
        RING_D,
        RING_DTYPES,
        (False, True),
        RING_LAYOUTS,
        RING_GPUS,
        RING_LINKS,
    ):
        r = ring_row(N, P, H, H_kv, d, dt, c, lay, g, ln)
        rows.append([None if r[f] is None else _sig(r[f]) for f in ROW_FIELDS])
    memory = [
        memory_row(N, P, H, H_kv, d, dt)
        for N, P, (_, H, H_kv), d, dt in itertools.product(
            RING_N, RING_P, RING_HEADS, RING_D, RING_DTYPES
        )
    ]
    idle, work_index, tables = [], [], []
    for N, P, c, lay in itertools.product(RING_N, RING_P, (False, True), RING_LAYOUTS):
        idle.append(_sig(_ring.idle_fraction(_mring.pairs_matrix(N, P, lay, c)), 3))
        shares = work_shares(N, P, c, lay)
        if shares not in tables:
            tables.append(shares)
        work_index.append(tables.index(shares))
    return {
        "N": RING_N,
        "P": RING_P,
        "heads": [h[0] for h in RING_HEADS],
        "d": RING_D,
        "dtype": RING_DTYPES,
        "layout": RING_LAYOUTS,
        "link": RING_LINKS,
        "gpu": RING_GPUS,
        "fields": ROW_FIELDS,
        "memory_fields": MEMORY_FIELDS,
        "link_names": [_mring.LINKS[k].name for k in RING_LINKS],
        "hypothetical": [
            [k.startswith("NVLink") and k != NATIVE_NVLINK[g] for k in RING_LINKS]
            for g in RING_GPUS
        ],
        "rows": rows,
        "memory": memory,
        "idle": idle,
        "work_index": work_index,
        "work": tables,
    }


# ---------------------------------------------------------------------------------
# Vega-Lite specs.
# ---------------------------------------------------------------------------------


#: The settings both faces take (the static grid covers exactly these); ``heads``
#: indexes ``RING_HEADS``.
SETTINGS = {
    "N": Choice(
        RING_N,
        label="sequence length N",
        widget="slider",
        names=[f"{n:,}" for n in RING_N],
    ),
    "P": Choice(RING_P, label="devices P", widget="slider"),
    "heads": Choice(
        range(len(RING_HEADS)), label="heads", names=[h[0] for h in RING_HEADS]
    ),
    "d": Choice(RING_D, label="head dim d"),
    "dtype": Choice(RING_DTYPES, label="dtype"),
    "causal": Choice([False, True], label="causal", widget="checkbox"),
    "layout": Choice(RING_LAYOUTS, label="layout"),
    "link": Choice(RING_LINKS, label="link"),
    "gpu": Choice(RING_GPUS, label="GPU"),
}


def _check(N, P, heads, d, dtype, causal, layout, link, gpu) -> None:
    check(
        SETTINGS,
        N=N,
        P=P,
        heads=heads,
        d=d,
        dtype=dtype,
        causal=causal,
        layout=layout,
        link=link,
        gpu=gpu,
    )


def work_spec(height: int = 220) -> dict:
    """Device x step cells coloured by the share of a full block computed; zero cells
    (idle) white. Data "work": {device, step, share}."""
    from attention.plots.ring import COMPUTE

    return {
        **frame(height),
        "data": {"name": "work"},
        "mark": {"type": "rect", "stroke": "#ffffff", "strokeWidth": 0.5},
        "encoding": {
            "x": {
                "field": "device",
                "type": "ordinal",
                "title": "device r",
                "axis": {"labelAngle": 0, "labelOverlap": "greedy"},
            },
            "y": {
                "field": "step",
                "type": "ordinal",
                "title": "ring step t",
                "axis": {"labelOverlap": "greedy"},
            },
            "color": {
                "field": "share",
                "type": "quantitative",
                "title": "share of a full block",
                "scale": {"domain": [0, 1], "range": ["#ffffff", COMPUTE]},
                "legend": {"orient": "bottom", "gradientLength": 140},
            },
            "tooltip": [
                {"field": "device"},
                {"field": "step"},
                {"field": "share", "type": "quantitative", "format": ".3f"},
            ],
        },
        **FONT,
    }


def times_spec(height: int = 200) -> dict:
    """Horizontal bars of estimated times (ms). Data "times": {what, ms, color}."""
    return {
        **frame(height),
        "data": {"name": "times"},
        "mark": {"type": "bar"},
        "encoding": {
            "y": {
                "field": "what",
                "type": "nominal",
                "sort": None,
                "title": None,
                "axis": {"labelLimit": 200},
            },
            "x": {
                "field": "ms",
                "type": "quantitative",
                "title": "ms, estimated at peak rates",
            },
            "color": {
                "field": "color",
                "type": "nominal",
                "scale": None,
                "legend": None,
            },
            "tooltip": [
                {"field": "what"},
                {"field": "ms", "type": "quantitative", "format": ".4g"},
            ],
        },
        **FONT,
    }


def static_context_parallel_explorer(
    N: int = 262144,
    P: int = 8,
    heads: int = 2,
    d: int = 128,
    dtype: str = "bfloat16",
    causal: bool = True,
    layout: str = "zigzag",
    link: str = "NVLink 4",
    gpu: str = "H100",
) -> Explorer:
    """The static twin: its data from ``ring_grid``; ``heads`` indexes RING_HEADS."""
    _check(N, P, heads, d, dtype, causal, layout, link, gpu)
    from attention.plots.ring import COMPUTE, SEND

    config = {
        "grid": ring_grid(),
        "colors": {
            "compute": COMPUTE,
            "send": SEND,
            "total": "#333333",
            "ulysses": GREEN,
            "allgather": PURPLE,
            "serial": GREY,
        },
        "init": {
            "N": RING_N.index(N),
            "P": RING_P.index(P),
            "heads": heads,
            "d": RING_D.index(d),
            "dtype": RING_DTYPES.index(dtype),
            "causal": causal,
            "layout": RING_LAYOUTS.index(layout),
            "link": RING_LINKS.index(link),
            "gpu": RING_GPUS.index(gpu),
        },
        "specs": {"work": work_spec(), "times": times_spec()},
    }
    return Explorer(
        "ring",
        config,
        "Context-parallel explorer (chapter 6)",
        "explorers.context_parallel_explorer()",
    )


# ---------------------------------------------------------------------------------
# The live version (ipywidgets).
# ---------------------------------------------------------------------------------


def link_label(link: str, gpu: str) -> str:
    """The link's data-sheet name, with " (hypothetical)" where the GPU has another
    NVLink generation (``NATIVE_NVLINK``), as chapter 6's printout labels it."""
    name = _mring.LINKS[link].name
    hypothetical = link.startswith("NVLink") and link != NATIVE_NVLINK[gpu]
    return f"{name} (hypothetical)" if hypothetical else name


def readout(N, P, heads, d, dtype, causal, layout, link, gpu) -> str:
    """The HTML readout of the live version (the static page writes the same text)."""
    from attention.plots import human_bytes

    label, H, H_kv = RING_HEADS[heads]
    r = ring_row(N, P, H, H_kv, d, dtype, causal, layout, gpu, link)
    ring_mem, uly_mem, ag_kv = memory_row(N, P, H, H_kv, d, dtype)
    idle = _ring.idle_fraction(_mring.pairs_matrix(N, P, layout, causal))
    uly = (
        "not possible: P must divide the heads"
        if r["ulysses_ms"] is None
        else f"{r['ulysses_ms']:.4g} ms ({r['ulysses_a2a_ms']:.4g} ms of all-to-all), "
        f"{human_bytes(uly_mem)} per device"
    )
    return (
        f"<p>N = {N:,}, P = {P} ({N // P:,} tokens per device), heads {label}, "
        f"d = {d}, {dtype}, {'causal' if causal else 'not causal'}, {layout}; "
        f"{gpu}, {link_label(link, gpu)}. ESTIMATES at peak rates.</p><ul>"
        f"<li>busiest step: compute {r['compute_ms']:.4g} ms, K/V transfer "
        f"{r['transfer_ms']:.4g} ms: {r['hidden_pct']:.0f}% of the transfer "
        "hidden</li>"
        f"<li>ring total {r['total_ms']:.4g} ms overlapped, "
        f"{r['serial_ms']:.4g} ms without overlap; "
        f"idle {100 * idle:.0f}% of device-steps</li>"
        f"<li>memory per device (one layer's attention tensors): "
        f"{human_bytes(ring_mem)}</li>"
        f"<li>all-gather context parallelism: {r['allgather_total_ms']:.4g} ms "
        f"({r['allgather_ms']:.4g} ms of all-gather, exposed: "
        f"{r['allgather_pct']:.0f}% of the attention it feeds), all of K/V "
        f"{human_bytes(ag_kv)} per device</li>"
        f"<li>DeepSpeed-Ulysses: {uly}</li></ul>"
    )


def work_figure(N: int, P: int, layout: str, causal: bool):
    """The live face's figure: the work per device and step
    (``plots.ring.load_balance_figure``) of one layout; it depends on these four
    settings only, so the others redraw from ``common.cached_png``."""
    from attention.plots.ring import load_balance_figure

    ax = load_balance_figure(
        N, P, layouts=(layout,), causal=causal, legend_inside=True
    )[0]
    ax.figure.set_size_inches(4.2, 4.3)
    ax.figure.subplots_adjust(left=0.16, right=0.96, top=0.93, bottom=0.31)
    return ax.figure


def live_context_parallel_explorer(
    N: int = 262144,
    P: int = 8,
    heads: int = 2,
    d: int = 128,
    dtype: str = "bfloat16",
    causal: bool = True,
    layout: str = "zigzag",
    link: str = "NVLink 4",
    gpu: str = "H100",
):
    """ipywidgets controls over the same grid; each change redraws the work per device
    and step (``plots.ring.load_balance_figure``) and the readout."""
    import ipywidgets as widgets

    _check(N, P, heads, d, dtype, causal, layout, link, gpu)
    values = dict(N=N, P=P, heads=heads, d=d, dtype=dtype, causal=causal)
    c = controls(SETTINGS, {**values, "layout": layout, "link": link, "gpu": gpu})
    text, out = widgets.HTML(), widgets.Output()

    def redraw(_=None):
        s = {k: w.value for k, w in c.items()}
        text.value = readout(**s)
        args = {k: s[k] for k in ("N", "P", "layout", "causal")}
        show_png(out, cached_png(work_figure, **args))

    for w in c.values():
        w.observe(redraw, names="value")
    redraw()
    return widgets.VBox(
        [
            widgets.HBox([c["N"], c["P"]]),
            widgets.HBox([c["heads"], c["d"], c["dtype"]]),
            widgets.HBox([c["causal"], c["layout"]]),
            widgets.HBox([c["link"], c["gpu"]]),
            text,
            out,
        ]
    )


def context_parallel_explorer(
    N: int = 262144,
    P: int = 8,
    heads: int = 2,
    d: int = 128,
    dtype: str = "bfloat16",
    causal: bool = True,
    layout: str = "zigzag",
    link: str = "NVLink 4",
    gpu: str = "H100",
):
    """Chapter 6's explorer, one call: the static twin on the built site
    (``ON_SITE``), the ipywidgets version in Jupyter and Colab. ``heads`` indexes
    ``RING_HEADS``; the other settings are points of the grid (``SETTINGS``)."""
    face = (
        static_context_parallel_explorer
        if site.ON_SITE
        else live_context_parallel_explorer
    )
    return face(
        N=N,
        P=P,
        heads=heads,
        d=d,
        dtype=dtype,
        causal=causal,
        layout=layout,
        link=link,
        gpu=gpu,
    )
