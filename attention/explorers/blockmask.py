"""Chapter 7's block-mask explorer: mask kind and its parameter (window, document
length, prefix), sequence length, block size or a model preset -> the block mask drawn
(full, partial, empty tiles), the share of tiles the kernel visits, and the forward's
HBM bytes and FLOPs against dense causal. One call, ``block_mask_explorer``: the static
twin on the site (data computed here, drawn by ``_static/explorers.js``), ipywidgets in
Jupyter.

Every number comes from ``mask_point``, which reads ``attention.memory.blocksparse``'s
closed forms (equal to its simulator, tested); the static grid is ``mask_point`` and
``blocksparse.tile_ranges`` at every setting a control can reach. The page's script
only looks rows up and draws each row block's ranges of partial and full tiles. One
head, d = 128, 2-byte elements (bf16).
"""

from __future__ import annotations

from attention.memory import blocksparse as bs
from attention.plots import live
from attention.plots.masks import BLOCK_COLORS, WORK_COLORS

from . import site
from .common import FONT, frame
from .settings import Choice, check, control, controls
from .site import Explorer

KINDS = ["causal", "window", "document", "prefix"]
#: Each kind's parameter and the values its control offers.
VALUES = {
    "causal": [0],
    "window": [128, 512, 1024, 4096],
    "document": [512, 1024, 2048, 4096],
    "prefix": [256, 1024, 4096],
}
PARAM = {"window": "window", "document": "doc_len", "prefix": "prefix"}
CONTEXT = [1024, 2048, 4096, 8192, 16384, 32768]
BLOCKS = [64, 128]
#: The bytes-against-N line: 1k to 128k.
LINE_N = [2**p for p in range(10, 18)]
D, BYTES_PER_ELEM = 128, 2
#: Model presets: (kind, value) of the layers that need more than dense causal.
PRESETS = {
    "custom": None,
    "Llama 3 (dense causal)": ("causal", 0),
    "Mistral 7B (window 4,096)": ("window", 4096),
    "Gemma 2 local layers (window 4,096)": ("window", 4096),
    "Gemma 3 local layers (window 1,024)": ("window", 1024),
    "gpt-oss local layers (window 128)": ("window", 128),
    "packed documents of 2k": ("document", 2048),
    "prefix LM (prefix 1,024)": ("prefix", 1024),
}
#: The block mask's tiles and the work lines in chapter 7's colours: dense causal
#: red, the chosen mask as the window is.
COLORS = BLOCK_COLORS
LINE_COLORS = [WORK_COLORS["causal"], WORK_COLORS["window"]]

#: The settings both faces take (the menus' options; ``preset`` None is "custom").
SETTINGS = {
    "kind": Choice(KINDS, label="mask"),
    "N": Choice(CONTEXT, label="sequence length N"),
    "block_size": Choice(BLOCKS, label="block size"),
    "window": Choice(VALUES["window"], label="window"),
    "doc_len": Choice(VALUES["document"], label="document length"),
    "prefix": Choice(VALUES["prefix"], label="prefix"),
    "preset": Choice([None, *PRESETS], label="model preset"),
}


def _work(kind: str, N: int, block_size: int, value: int) -> bs.Work:
    return bs.closed_work(kind, N, D, value or None, block_size, block_size)


def mask_point(
    kind: str = "window", N: int = 8192, block_size: int = 128, value: int = 1024
) -> dict:
    """Every number the explorer shows at one setting (one head, d = 128, bf16)."""
    w = _work(kind, N, block_size, value)
    c = bs.causal_work(N, D, block_size, block_size)
    return {
        "tiles": w.tiles,
        "visited": w.visited,
        "full": w.full,
        "partial": w.partial,
        "visited_percent": 100 * w.visited / w.tiles,
        "sparsity": w.sparsity(),
        "bytes": w.bytes(BYTES_PER_ELEM),
        "flops": w.flops,
        "mask_evals": w.mask_evals,
        "causal_bytes": c.bytes(BYTES_PER_ELEM),
        "causal_flops": c.flops,
        "causal_visited": c.visited,
    }


def _key(kind, value, *rest) -> str:
    return ",".join(str(x) for x in (kind, value, *rest))


def mask_grid() -> dict:
    """The twin's tables. ``ranges[kind,value,N,B]``: per row block (first visited,
    first full, last full, last visited) key block, flattened; ``work[...]``: [visited,
    full, partial, tiles, bytes, flops, mask_evals]; ``lines[kind,value,B]``: bytes at
    each of ``LINE_N`` (``causal,0,B`` is dense causal); ``presets``: name -> [kind
    index, value index] or null."""
    ranges, work, lines = {}, {}, {}
    for kind in KINDS:
        for value in VALUES[kind]:
            for B in BLOCKS:
                lines[_key(kind, value, B)] = [
                    _work(kind, n, B, value).bytes(BYTES_PER_ELEM) for n in LINE_N
                ]
                for N in CONTEXT:
                    r = bs.tile_ranges(kind, N, value or None, B, B)
                    ranges[_key(kind, value, N, B)] = r.ravel().tolist()
                    p = mask_point(kind, N, B, value)
                    work[_key(kind, value, N, B)] = [
                        p["visited"],
                        p["full"],
                        p["partial"],
                        p["tiles"],
                        p["bytes"],
                        p["flops"],
                        p["mask_evals"],
                    ]
    presets = {
        name: None if pv is None else [KINDS.index(pv[0]), VALUES[pv[0]].index(pv[1])]
        for name, pv in PRESETS.items()
    }
    return {
        "kinds": KINDS,
        "values": VALUES,
        "N": CONTEXT,
        "B": BLOCKS,
        "line_N": LINE_N,
        "d": D,
        "bpe": BYTES_PER_ELEM,
        "presets": presets,
        "ranges": ranges,
        "work": work,
        "lines": lines,
    }


# ---------------------------------------------------------------------------------
# Vega-Lite specs
# ---------------------------------------------------------------------------------


def tiles_spec(height: int = 320) -> dict:
    """The block mask: rects in key-block x query-block units. Data "tiles":
    {x, x2, y, y2, tile} with tile "empty", "partial" or "full"."""
    kinds = list(COLORS)
    return {
        **frame(height),
        "data": {"name": "tiles"},
        "mark": {"type": "rect"},
        "encoding": {
            "x": {
                "field": "x",
                "type": "quantitative",
                "title": "key block",
                "axis": {"tickMinStep": 1, "format": "d"},
            },
            "x2": {"field": "x2"},
            "y": {
                "field": "y",
                "type": "quantitative",
                "title": "query block",
                "scale": {"reverse": True},
                "axis": {"tickMinStep": 1, "format": "d"},
            },
            "y2": {"field": "y2"},
            "color": {
                "field": "tile",
                "type": "nominal",
                "scale": {"domain": kinds, "range": [COLORS[k] for k in kinds]},
                "legend": {"orient": "bottom", "title": None},
            },
        },
        **FONT,
    }


def bytes_spec(height: int = 240) -> dict:
    """Log-log HBM bytes against N, this mask and dense causal, a rule at the chosen
    N. Data "lines": {x, series, mib}; "marker": {x}."""
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
                        "title": "sequence length N",
                        "scale": {"type": "log", "base": 2},
                        "axis": {
                            "values": LINE_N,
                            "labelExpr": "datum.value / 1024 + 'k'",
                        },
                    },
                    "y": {
                        "field": "mib",
                        "type": "quantitative",
                        "title": "HBM traffic (MiB), one head",
                        "scale": {"type": "log"},
                        "axis": {"format": "~s"},
                    },
                    "color": {
                        "field": "series",
                        "type": "nominal",
                        "scale": {"range": LINE_COLORS},
                        "legend": {"orient": "bottom", "title": None},
                    },
                    "tooltip": [
                        {"field": "series"},
                        {"field": "x", "type": "quantitative"},
                        {"field": "mib", "type": "quantitative", "format": ".4~s"},
                    ],
                },
            },
            {
                "data": {"name": "marker"},
                "mark": {"type": "rule", "color": "#8C8C8C", "strokeDash": [4, 3]},
                "encoding": {"x": {"field": "x", "type": "quantitative"}},
            },
        ],
        **FONT,
    }


# ---------------------------------------------------------------------------------
# The two faces and the one call
# ---------------------------------------------------------------------------------


def resolve(kind, window, doc_len, prefix, preset) -> tuple[str, int]:
    """The (kind, value) a setting means: the preset's when one is chosen."""
    if preset is not None and PRESETS[preset] is not None:
        return PRESETS[preset]
    return kind, {"causal": 0, "window": window, "document": doc_len, "prefix": prefix}[
        kind
    ]


def _check(kind, N, block_size, window, doc_len, prefix, preset):
    check(
        SETTINGS,
        kind=kind,
        N=N,
        block_size=block_size,
        window=window,
        doc_len=doc_len,
        prefix=prefix,
        preset=preset,
    )


def static_block_mask_explorer(
    kind="window",
    N=8192,
    block_size=128,
    window=1024,
    doc_len=2048,
    prefix=1024,
    preset=None,
) -> Explorer:
    """The static site's twin: ``mask_grid`` and the specs, drawn in the browser."""
    _check(kind, N, block_size, window, doc_len, prefix, preset)
    init = {
        "preset": list(PRESETS).index("custom" if preset is None else preset),
        "kind": KINDS.index(kind),
        "window": VALUES["window"].index(window),
        "document": VALUES["document"].index(doc_len),
        "prefix": VALUES["prefix"].index(prefix),
        "N": CONTEXT.index(N),
        "B": BLOCKS.index(block_size),
    }
    config = {
        "grid": mask_grid(),
        "init": init,
        "specs": {"tiles": tiles_spec(), "bytes": bytes_spec()},
    }
    return Explorer(
        "blockmask",
        config,
        "Block-mask explorer (chapter 7)",
        "attention.explorers.blockmask.block_mask_explorer()",
    )


def readout(p: dict, kind: str, value: int, N: int, block_size: int) -> str:
    """The explorer's text, from ``mask_point``'s numbers."""
    from attention.plots import human_bytes

    what = kind if kind == "causal" else f"{kind} {value:,}"
    return (
        f"{what}, N = {N:,}, tiles {block_size} x {block_size}: the kernel visits "
        f"{p['visited']:,} of {p['tiles']:,} tiles ({p['visited_percent']:.1f}%; "
        f"{p['full']:,} full, {p['partial']:,} partial), sparsity "
        f"{p['sparsity']:.1f}%. One head, d = {D}, bf16: "
        f"{human_bytes(p['bytes'])} of HBM traffic and {p['flops'] / 1e9:.2f} GFLOPs, "
        f"against dense causal's {human_bytes(p['causal_bytes'])} and "
        f"{p['causal_flops'] / 1e9:.2f} GFLOPs "
        f"({p['flops'] / p['causal_flops']:.2f}x the FLOPs)."
    )


def block_mask_explorer_figure(kind="window", N=8192, block_size=128, value=1024):
    """The live explorer's figure: the block mask, and bytes against N beside dense
    causal."""
    from attention.plots import masks as pm

    fig, (a0, a1) = live.subplots(
        1, 2, figsize=(9, 3.8), gridspec_kw={"width_ratios": [1, 1.2]}
    )
    bm = bs.closed_block_mask(kind, N, value or None, block_size, block_size)
    pm.block_mask_plot(bm, a0)
    for name, k, v in (("dense causal", "causal", 0), ("this mask", kind, value)):
        mib = [_work(k, n, block_size, v).bytes(BYTES_PER_ELEM) / 2**20 for n in LINE_N]
        a1.plot(LINE_N, mib, "o-", ms=3, label=name)
    a1.axvline(N, color="#8C8C8C", ls="--")
    a1.set(xscale="log", yscale="log", xlabel="sequence length N", ylabel="MiB")
    a1.set_xticks(LINE_N[::2], [pm.length_label(n) for n in LINE_N[::2]])
    a1.minorticks_off()
    a1.legend(fontsize=8)
    a1.set_title(f"HBM traffic, one head, d = {D}, bf16")
    fig.tight_layout()
    return fig


def live_block_mask_explorer(
    kind="window",
    N=8192,
    block_size=128,
    window=1024,
    doc_len=2048,
    prefix=1024,
    preset=None,
):
    """ipywidgets: each change redraws ``block_mask_explorer_figure`` and the text."""
    import ipywidgets as widgets

    from .common import live_png, show_png

    _check(kind, N, block_size, window, doc_len, prefix, preset)
    # The preset menu shows None as "custom".
    presets = Choice(PRESETS, label=SETTINGS["preset"].label)
    values = dict(kind=kind, window=window, doc_len=doc_len, prefix=prefix)
    ctl = {
        "preset": control(presets, preset or "custom"),
        **controls(SETTINGS, {**values, "N": N, "block_size": block_size}),
    }
    text, out = widgets.HTML(), widgets.Output()

    def redraw(change=None):
        kw = {k: w.value for k, w in ctl.items()}
        pre = None if kw["preset"] == "custom" else kw["preset"]
        k, v = resolve(kw["kind"], kw["window"], kw["doc_len"], kw["prefix"], pre)
        p = mask_point(k, kw["N"], kw["block_size"], v)
        text.value = "<p>" + readout(p, k, v, kw["N"], kw["block_size"]) + "</p>"
        show_png(
            out, live_png(block_mask_explorer_figure, k, kw["N"], kw["block_size"], v)
        )

    for w in ctl.values():
        w.observe(redraw, names="value")
    redraw()
    rows = [widgets.HBox(list(ctl.values())[i : i + 4]) for i in (0, 4)]
    return widgets.VBox([*rows, text, out])


def block_mask_explorer(
    kind: str = "window",
    N: int = 8192,
    block_size: int = 128,
    window: int = 1024,
    doc_len: int = 2048,
    prefix: int = 1024,
    preset: str | None = None,
):
    """Chapter 7's explorer: the static twin on the built site, ipywidgets elsewhere.
    ``preset`` (a key of ``PRESETS``) overrides ``kind`` and its parameter."""
    kw = dict(
        kind=kind,
        N=N,
        block_size=block_size,
        window=window,
        doc_len=doc_len,
        prefix=prefix,
        preset=preset,
    )
    if site.ON_SITE:
        return static_block_mask_explorer(**kw)
    return live_block_mask_explorer(**kw)


__all__ = [
    "PRESETS",
    "SETTINGS",
    "block_mask_explorer",
    "block_mask_explorer_figure",
    "live_block_mask_explorer",
    "mask_grid",
    "mask_point",
    "resolve",
    "static_block_mask_explorer",
]
