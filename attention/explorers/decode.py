"""Chapter 5's decode explorer: batch, context, heads, head dim, dtype, splits, page
size and GPU preset -> KV bytes per token, programs per SM, an estimated step time,
cache memory and paging waste. One call, ``decode_explorer``: the static twin on the
site (data computed here, drawn by ``_static/explorers.js``), ipywidgets in Jupyter.

Every number comes from ``decode_point``, which reads ``attention.memory``'s decode
closed forms and ``attention.decode``'s waste counts; the static grid is
``decode_point`` at every setting a control can reach. The page's script only looks
rows up, and makes one unit conversion (as it turns elements into bytes elsewhere):
step time = bytes / the preset's peak bandwidth, an ESTIMATE, labelled as one.
"""

from __future__ import annotations

import numpy as np

from attention import decode, memory, plots
from attention.plots import live

from . import site
from .common import (
    BLUE,
    FONT,
    GREY,
    LIGHT_GREY,
    NAVY,
    PURPLE,
    RED,
    frame,
    live_png,
    show_png,
)
from .settings import Choice, check, controls
from .site import Explorer

#: The controls' values (the static grid covers exactly these).
BATCH = [1, 8, 64]
CONTEXT = [1024, 4096, 8192, 32768, 131072]
HEADS_Q = [32, 64]
HEADS_KV = [1, 2, 4, 8, 16, 32, 64]
HEAD_DIM = [64, 128, 256]
DTYPES = list(plots.DTYPE_BYTES.items())  # the book's dtypes and element sizes
SPLITS = [1, 2, 4, 8, 16, 32]
PAGES = [16, 32, 128]
GPUS = ["T4", "A100", "L4", "H100", "H200"]
#: The series of the kernel itself (its table has splits and pages; the others not).
KERNEL_LINE = "split-KV, paged (the kernel)"
#: The traffic lines of the explorer, and the algorithms behind them.
LINES = {
    "naive (S, P in HBM)": "decode_naive",
    "FA2 grid (per query head)": "decode_fa2",
    KERNEL_LINE: "decode_paged",
}
#: Requests per batch in the waste count (lengths uniform in 1..context, seeded).
WASTE_SEED = 0


def _combos():
    """(H_q, H_kv) pairs the controls reach: H_kv divides H_q."""
    return [(hq, hkv) for hq in HEADS_Q for hkv in HEADS_KV if hkv <= hq]


def step_bytes(
    algorithm: str,
    B: int,
    N: int,
    H_q: int,
    H_kv: int,
    d: int,
    bytes_per_elem: int,
    n_splits: int = 1,
    page_size: int = 16,
) -> int:
    """HBM bytes of one decode step of one layer (N_q = 1) by ``algorithm``."""
    group = decode.kv_group(H_q, H_kv)
    extra = {
        "decode_paged": {"page_size": page_size, "n_splits": n_splits},
        "decode_split": {"n_splits": n_splits},
    }.get(algorithm, {})
    t = memory.closed_form(algorithm, B, H_kv, N, d, group=group, **extra)
    return memory.decode_bytes(t, bytes_per_elem)


def waste(B: int, N: int, page_size: int) -> dict:
    """Percent of reserved cache slots wasted by B requests with lengths uniform in
    1..N (seeded): pre-allocated to N, and in pages of ``page_size``."""
    lens = decode.request_lengths(np.random.default_rng(WASTE_SEED), B, N)
    c, p = decode.contiguous_waste(lens, N), decode.paged_waste(lens, page_size)
    return {
        "contiguous": 100 * c["wasted"] / c["reserved"],
        "paged": 100 * p["wasted"] / p["reserved"],
    }


def decode_point(
    B: int = 8,
    N: int = 8192,
    H_q: int = 32,
    H_kv: int = 8,
    d: int = 128,
    dtype: str = "float16",
    n_splits: int = 4,
    page_size: int = 16,
    gpu: str = "H100",
) -> dict:
    """Every number the explorer shows at one setting (one layer, one new token)."""
    bpe = dict(DTYPES)[dtype]
    spec = memory.GPUS[gpu]
    group = decode.kv_group(H_q, H_kv)
    by = {
        name: step_bytes(alg, B, N, H_q, H_kv, d, bpe, n_splits, page_size)
        for name, alg in LINES.items()
    }
    flops = memory.decode_flops(B, H_kv, N, d, group=group)
    return {
        "kv_bytes_per_token": 2 * H_kv * d * bpe,
        "cache_bytes": B * N * 2 * H_kv * d * bpe,
        "step_bytes": by,
        "bytes_per_token": {k: v // B for k, v in by.items()},
        "intensity": flops / by[KERNEL_LINE],
        "step_us_estimate": {
            k: v / (spec.hbm_tbps * 1e12) * 1e6 for k, v in by.items()
        },
        "programs_per_sm": B * H_kv * n_splits / spec.sms,
        "fa2_programs_per_sm": B * H_q / spec.sms,
        "waste_percent": waste(B, N, page_size),
    }


def decode_grid() -> dict:
    """``decode_point``'s numbers at every setting of the controls, as lookup tables.

    ``bytes[line][iB][iN][ic][id][ib][iS][ip]`` (ic indexes ``combos``; ib the distinct
    bytes per element ``bpe``; naive and FA2 ignore iS, ip but are stored alike);
    ``cache[iB][iN][ic][id][ib]``; ``token[ic][id][ib]``; ``pps[iB][ic][iS][ig]``
    (programs per SM, split kernel) and ``pps_fa2[iB][ic][ig]``; ``waste[iB][iN][ip]``
    = [contiguous %, paged %]; ``bw[ig]`` in bytes/s.
    """
    combos = _combos()
    bpes = sorted({b for _, b in DTYPES}, reverse=True)
    sms = [memory.GPUS[g].sms for g in GPUS]
    out = {
        "B": BATCH,
        "N": CONTEXT,
        "combos": combos,
        "d": HEAD_DIM,
        "bpe": bpes,
        "dtypes": DTYPES,
        "S": SPLITS,
        "page": PAGES,
        "gpus": GPUS,
        "bw": [memory.GPUS[g].hbm_tbps * 1e12 for g in GPUS],
        "gpu_names": [memory.GPUS[g].name for g in GPUS],
        "lines": list(LINES),
        # The page reads the kernel's series by this name, not by its place.
        "kernel_line": KERNEL_LINE,
    }
    table = {}
    for name, alg in LINES.items():

        def at(B, N, hq, hkv, d, b, S, P, alg=alg):
            return step_bytes(alg, B, N, hq, hkv, d, b, S, P)

        if alg == "decode_paged":
            table[name] = [
                [
                    [
                        [
                            [
                                [
                                    [at(B, N, hq, hkv, d, b, S, P) for P in PAGES]
                                    for S in SPLITS
                                ]
                                for b in bpes
                            ]
                            for d in HEAD_DIM
                        ]
                        for hq, hkv in combos
                    ]
                    for N in CONTEXT
                ]
                for B in BATCH
            ]
        else:  # no splits, no pages: one value per (B, N, combo, d, bpe)
            table[name] = [
                [
                    [
                        [
                            [at(B, N, hq, hkv, d, b, 1, 16) for b in bpes]
                            for d in HEAD_DIM
                        ]
                        for hq, hkv in combos
                    ]
                    for N in CONTEXT
                ]
                for B in BATCH
            ]
    out["bytes"] = table
    out["cache"] = [
        [
            [
                [[B * N * 2 * hkv * d * b for b in bpes] for d in HEAD_DIM]
                for _, hkv in combos
            ]
            for N in CONTEXT
        ]
        for B in BATCH
    ]
    out["token"] = [
        [[2 * hkv * d * b for b in bpes] for d in HEAD_DIM] for _, hkv in combos
    ]
    out["pps"] = [
        [
            [[round(B * hkv * S / s, 4) for s in sms] for S in SPLITS]
            for _, hkv in combos
        ]
        for B in BATCH
    ]
    out["pps_fa2"] = [
        [[round(B * hq / s, 4) for s in sms] for hq, _ in combos] for B in BATCH
    ]
    out["waste"] = [
        [
            [[round(v, 2) for v in waste(B, N, P).values()] for P in PAGES]
            for N in CONTEXT
        ]
        for B in BATCH
    ]
    return out


# ---------------------------------------------------------------------------------
# Vega-Lite specs
# ---------------------------------------------------------------------------------

_LINE_COLORS = {
    "naive (S, P in HBM)": RED,
    "FA2 grid (per query head)": PURPLE,
    KERNEL_LINE: BLUE,
}


def time_spec(height: int = 240) -> dict:
    """Log-log estimated step time against the context, one line per algorithm, a rule
    at the chosen context. Data "lines": {x, series, us}; "marker": {x}."""
    series = list(LINES)
    return {
        **frame(height),
        "layer": [
            {
                "data": {"name": "lines"},
                "mark": {"type": "line", "point": {"size": 18}, "strokeWidth": 2},
                "encoding": {
                    "x": {
                        "field": "x",
                        "type": "quantitative",
                        "title": "context N",
                        "scale": {"type": "log", "base": 2},
                        "axis": {
                            "format": "~s",
                            "tickCount": 5,
                            "labelOverlap": "greedy",
                        },
                    },
                    "y": {
                        "field": "us",
                        "type": "quantitative",
                        "title": "µs per step (estimate)",
                        "scale": {"type": "log"},
                        "axis": {"format": "~s"},
                    },
                    "color": {
                        "field": "series",
                        "type": "nominal",
                        "sort": series,
                        "scale": {
                            "domain": series,
                            "range": [_LINE_COLORS[s] for s in series],
                        },
                        "legend": {
                            "orient": "bottom",
                            "columns": 1,
                            "title": None,
                            "labelLimit": 300,
                        },
                    },
                    "tooltip": [
                        {"field": "series"},
                        {"field": "x", "type": "quantitative"},
                        {"field": "us", "type": "quantitative", "format": ".3~s"},
                    ],
                },
            },
            {
                "data": {"name": "marker"},
                "mark": {"type": "rule", "color": GREY, "strokeDash": [4, 3]},
                "encoding": {"x": {"field": "x", "type": "quantitative"}},
            },
        ],
        **FONT,
    }


def waste_spec(height: int = 200) -> dict:
    """Bars of the percent of reserved cache wasted: pre-allocated, then each page
    size. Data "waste": {layout, percent, chosen}."""
    return {
        **frame(height),
        "data": {"name": "waste"},
        "mark": {"type": "bar", "stroke": "#222", "strokeWidth": 0.4},
        "encoding": {
            "x": {
                "field": "layout",
                "type": "nominal",
                "sort": None,
                "title": None,
                "axis": {"labelAngle": 0},
            },
            "y": {
                "field": "percent",
                "type": "quantitative",
                "title": "reserved cache wasted (%)",
            },
            "color": {
                "field": "chosen",
                "type": "nominal",
                "scale": {
                    "domain": ["chosen", "other"],
                    "range": [NAVY, LIGHT_GREY],
                },
                "legend": None,
            },
            "tooltip": [
                {"field": "layout"},
                {"field": "percent", "type": "quantitative", "format": ".1f"},
            ],
        },
        **FONT,
    }


# ---------------------------------------------------------------------------------
# The two faces and the one call
# ---------------------------------------------------------------------------------


#: The settings both faces take (the static grid covers exactly these; H_kv must
#: also divide H_q).
SETTINGS = {
    "B": Choice(BATCH, label="batch B"),
    "N": Choice(CONTEXT, label="context N"),
    "H_q": Choice(HEADS_Q, label="query heads H_q"),
    "H_kv": Choice(HEADS_KV, label="KV heads H_kv"),
    "d": Choice(HEAD_DIM, label="head dim d"),
    "dtype": Choice(dict(DTYPES), label="dtype"),
    "n_splits": Choice(SPLITS, label="splits"),
    "page_size": Choice(PAGES, label="page size"),
    "gpu": Choice(GPUS, label="GPU"),
}


def _check(B, N, H_q, H_kv, d, dtype, n_splits, page_size, gpu):
    check(
        SETTINGS,
        B=B,
        N=N,
        H_q=H_q,
        H_kv=H_kv,
        d=d,
        dtype=dtype,
        n_splits=n_splits,
        page_size=page_size,
        gpu=gpu,
    )
    decode.kv_group(H_q, H_kv)


def static_decode_explorer(
    B=8,
    N=8192,
    H_q=32,
    H_kv=8,
    d=128,
    dtype="float16",
    n_splits=4,
    page_size=16,
    gpu="H100",
) -> Explorer:
    """The static site's twin: ``decode_grid`` and the specs, drawn in the browser."""
    _check(B, N, H_q, H_kv, d, dtype, n_splits, page_size, gpu)
    grid = decode_grid()
    init = {
        "B": BATCH.index(B),
        "N": CONTEXT.index(N),
        "H_q": HEADS_Q.index(H_q),
        "H_kv": HEADS_KV.index(H_kv),
        "d": HEAD_DIM.index(d),
        "dtype": [n for n, _ in DTYPES].index(dtype),
        "S": SPLITS.index(n_splits),
        "page": PAGES.index(page_size),
        "gpu": GPUS.index(gpu),
    }
    config = {
        "grid": grid,
        "init": init,
        "specs": {"time": time_spec(), "waste": waste_spec()},
    }
    return Explorer(
        "decode",
        config,
        "Decode explorer (chapter 5)",
        "explorers.decode_explorer()",
    )


def readout(p: dict, B, N, H_q, H_kv, d, dtype, n_splits, page_size, gpu) -> str:
    """The explorer's text, from ``decode_point``'s numbers."""
    from attention.plots import human_bytes

    kern = "split-KV, paged (the kernel)"
    return (
        f"B = {B}, N = {N:,}, H_q = {H_q}, H_kv = {H_kv}, d = {d}, {dtype}, "
        f"{n_splits} splits, pages of {page_size}, {gpu}. "
        f"KV cache per token and layer: {human_bytes(p['kv_bytes_per_token'])}; "
        f"cache of the batch: {human_bytes(p['cache_bytes'])}. "
        f"Programs per SM: {p['programs_per_sm']:.2f} "
        f"(FA2 grid: {p['fa2_programs_per_sm']:.2f}). "
        f"Step time at peak bandwidth (ESTIMATE): "
        f"{p['step_us_estimate'][kern]:.3g} µs. "
        f"Cache wasted: {p['waste_percent']['contiguous']:.1f}% pre-allocated, "
        f"{p['waste_percent']['paged']:.1f}% paged."
    )


def decode_explorer_figure(
    B=8,
    N=8192,
    H_q=32,
    H_kv=8,
    d=128,
    dtype="float16",
    n_splits=4,
    page_size=16,
    gpu="H100",
):
    """The live explorer's figure: estimated step time against the context (naive, FA2
    grid, split-KV paged) and the cache wasted against the page size."""
    bpe = dict(DTYPES)[dtype]
    bw = memory.GPUS[gpu].hbm_tbps * 1e12
    fig, (a0, a1) = live.subplots(
        1, 2, figsize=(9, 3.6), gridspec_kw={"width_ratios": [1.4, 1]}
    )
    for name, alg in LINES.items():
        us = [
            step_bytes(alg, B, n, H_q, H_kv, d, bpe, n_splits, page_size) / bw * 1e6
            for n in CONTEXT
        ]
        a0.plot(CONTEXT, us, "o-", label=name, color=_LINE_COLORS[name])
    a0.axvline(N, color=GREY, ls="--")
    a0.set(
        xscale="log",
        yscale="log",
        xlabel="context N",
        ylabel="step µs (ESTIMATE at peak)",
        title=f"{gpu}, B = {B}, one layer",
    )
    a0.legend(fontsize=7)
    lens = decode.request_lengths(np.random.default_rng(WASTE_SEED), B, N)
    plots.paging_waste_figure(lens, N, page_sizes=PAGES, ax=a1)
    a1.set_title(f"B = {B} requests, lengths 1..{N:,}")
    fig.tight_layout()
    return fig


def live_decode_explorer(
    B=8,
    N=8192,
    H_q=32,
    H_kv=8,
    d=128,
    dtype="float16",
    n_splits=4,
    page_size=16,
    gpu="H100",
):
    """ipywidgets: each change redraws ``decode_explorer_figure`` and the text."""
    import ipywidgets as widgets

    _check(B, N, H_q, H_kv, d, dtype, n_splits, page_size, gpu)
    values = dict(B=B, N=N, H_q=H_q, H_kv=H_kv, d=d, dtype=dtype)
    ctl = controls(
        SETTINGS, {**values, "n_splits": n_splits, "page_size": page_size, "gpu": gpu}
    )
    text, out = widgets.HTML(), widgets.Output()

    def redraw(change=None):
        kw = {k: w.value for k, w in ctl.items()}
        if kw["H_kv"] > kw["H_q"]:
            text.value = "<p>H_kv must divide H_q: choose fewer KV heads.</p>"
            return
        text.value = "<p>" + readout(decode_point(**kw), **kw) + "</p>"
        show_png(out, live_png(decode_explorer_figure, **kw))

    for w in ctl.values():
        w.observe(redraw, names="value")
    redraw()
    rows = [widgets.HBox(list(ctl.values())[i : i + 3]) for i in range(0, 9, 3)]
    return widgets.VBox([*rows, text, out])


def decode_explorer(
    B: int = 8,
    N: int = 8192,
    H_q: int = 32,
    H_kv: int = 8,
    d: int = 128,
    dtype: str = "float16",
    n_splits: int = 4,
    page_size: int = 16,
    gpu: str = "H100",
):
    """Chapter 5's explorer: one decode step of B sequences of N cached tokens (H_q
    query heads over H_kv KV heads of width d in ``dtype``), split-KV into
    ``n_splits``, paged in ``page_size``-token pages, on ``gpu``. The static twin on
    the built site, ipywidgets elsewhere."""
    face = static_decode_explorer if site.ON_SITE else live_decode_explorer
    return face(
        B=B,
        N=N,
        H_q=H_q,
        H_kv=H_kv,
        d=d,
        dtype=dtype,
        n_splits=n_splits,
        page_size=page_size,
        gpu=gpu,
    )


__all__ = [
    "decode_explorer",
    "decode_grid",
    "decode_point",
    "live_decode_explorer",
    "static_decode_explorer",
    "step_bytes",
    "waste",
]
