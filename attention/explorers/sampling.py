"""Chapter 4's sampling-points explorer: on the chapter's photograph, pick a query
position, the offset scale, the offsets (untrained or trained) and a head; see DAT's
reference points, offsets and deformed points, and the query's attention weights on the
sampled keys; for multi-scale deformable attention (MSDA), the query's own sampling
points on each pyramid level with their weights.

Everything is computed here, in Python, by ``attention.deformable`` (``dat_attention``,
``msda_sampling``) from the chapter's feature map and parameters, which the chapter
passes in; the page gets the points and weights of every query of a QUERY_GRID x
QUERY_GRID grid (the script only looks them up) and the image as small PNG data URIs.
One call, ``sampling_points_explorer``: the static twin on the site, ipywidgets in
Jupyter and Colab.
"""

from __future__ import annotations

import base64
import io

import numpy as np

from attention import core
from attention import deformable as dfm
from attention.plots import live

from . import site
from .common import BLUE, FONT, GREEN, ORANGE, PURPLE, RED, live_png, show_png
from .settings import Choice, Range, check, control
from .site import Explorer

#: Query positions: the centres of a QUERY_GRID x QUERY_GRID grid of cells.
QUERY_GRID = 8
#: Offset scales: multiples of the chapter's offset range (0 = the reference points).
SCALES = [0.0, 0.5, 1.0, 2.0]
#: Weights are sent in units of 1e-4 (a reader sees two or three decimals).
UNIT = 1e-4
#: Level colours (MSDA) and the query's.
LEVEL_COLORS = [RED, ORANGE, GREEN, PURPLE]
QUERY_COLOR = BLUE
DAT_KINDS = ["reference points", "deformed points (size: weight)"]
DAT_COLORS = ["#FFFFFF", ORANGE]


def query_positions(height: int, width: int) -> list[tuple[int, int]]:
    """(row, col) of the grid's queries, row by row."""
    rows = [(2 * k + 1) * height // (2 * QUERY_GRID) for k in range(QUERY_GRID)]
    cols = [(2 * k + 1) * width // (2 * QUERY_GRID) for k in range(QUERY_GRID)]
    return [(r, c) for r in rows for c in cols]


def to_image_units(points: np.ndarray, height: int, width: int) -> np.ndarray:
    """Normalised (x, y) in [-1, 1] (align_corners=False) -> image units [0, W] x
    [0, H], the pixel edges (pixel (i, j) covers [j, j + 1] x [i, i + 1])."""
    return dfm.to_pixels(points, height, width, align_corners=False) + 0.5


def png_uri(a: np.ndarray, size: int | None = None) -> str:
    """An (h, w) grey or (h, w, 3) RGB array in [0, 1] as a PNG data URI, enlarged by
    repetition (nearest) to ``size`` pixels wide when given."""
    import matplotlib.pyplot as plt

    a = np.clip(np.asarray(a, dtype=float), 0, 1)
    if size is not None and a.shape[1] < size:
        k = size // a.shape[1]
        a = a.repeat(k, 0).repeat(k, 1)
    buf = io.BytesIO()
    plt.imsave(
        buf, a, format="png", cmap="gray" if a.ndim == 2 else None, vmin=0, vmax=1
    )
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def dat_setting(x, params, n_heads, n_groups, stride, offset_range, scale) -> dict:
    """DAT at ``scale`` x the offset range: reference points, deformed points per
    group (image units) and the weights (heads, queries of the grid, N_s)."""
    b, h, w, _ = x.shape
    res = dfm.dat_attention(
        x, params, n_heads, n_groups, stride, offset_range * scale, return_all=True
    )
    idx = [r * w + c for r, c in query_positions(h, w)]
    return {
        "reference": to_image_units(res["reference"], h, w),
        "points": to_image_units(res["points"][0], h, w),  # (G, N_s, 2)
        "weights": res["weights"][0][:, idx],
    }  # (heads, Q, N_s)


def msda_setting(x, msda: dict, scale: float) -> dict:
    """MSDA's per-query sampling: locations (Q, heads, L, P, 2) in image units of the
    finest level and weights (Q, heads, L, P), the offsets scaled by ``scale``."""
    _, h, w, _ = x.shape
    pos = query_positions(h, w)
    z = np.stack([x[0, r, c] for r, c in pos])[None]  # (1, Q, C)
    ref = np.array([[(c + 0.5) / w, (r + 0.5) / h] for r, c in pos])[None]
    p = dict(msda["params"])
    p["w_off"], p["b_off"] = p["w_off"] * scale, p["b_off"] * scale
    loc, wts = dfm.msda_sampling(
        z, ref, p, msda["spatial_shapes"], msda["n_heads"], msda["n_points"]
    )
    return {"locations": loc[0] * np.array([w, h]), "weights": wts[0]}


def _check(image, x, dat_params, n_heads, n_groups):
    image = core.as_real_array("image", image)
    x = core.as_real_array("x", x)
    if x.ndim != 4 or x.shape[0] != 1:
        raise ValueError(f"x must be one feature map (1, H, W, C), got {x.shape}")
    if image.shape[:2] != x.shape[1:3]:
        raise ValueError(f"image must be (H, W[, 3]) like x, got {image.shape}")
    if (
        not isinstance(dat_params, dict)
        or not dat_params
        or not all(isinstance(p, dict) and "offset" in p for p in dat_params.values())
    ):
        raise TypeError("dat_params must be {label: DAT parameters (with 'offset')}")
    if n_heads % n_groups:
        raise ValueError(f"n_heads={n_heads} must divide by n_groups={n_groups}")
    return image, x


def settings(labels, n_heads: int) -> dict:
    """The settings both faces take: a query of the ``QUERY_GRID`` x ``QUERY_GRID``
    grid (``query_positions``), an offset scale of ``SCALES``, a label of
    ``dat_params`` (None: the last) and a DAT head."""
    return {
        "query": Range(0, QUERY_GRID**2 - 1, label="query"),
        "scale": Choice(SCALES, label="offset scale", widget="slider"),
        "label": Choice([None, *labels], label="offsets"),
        "head": Range(0, n_heads - 1, label="head"),
    }


def _check_settings(dat_params, n_heads, query, scale, label, head) -> None:
    check(
        settings(list(dat_params), n_heads),
        query=query,
        scale=scale,
        label=label,
        head=head,
    )


def sampling_grid(
    image,
    x,
    dat_params: dict,
    n_heads: int,
    n_groups: int,
    stride: int,
    offset_range: float,
    msda: dict | None = None,
) -> dict:
    """The static twin's data, in image units rounded to 0.01 pixel.
    ``dat[label][scale]``: points (G, N_s, 2) and weights (heads, Q, N_s) in units of
    ``UNIT``; ``reference`` (N_s, 2); ``msda[scale]``: locations (Q, heads, L, P, 2)
    and weights in ``UNIT``."""
    image, x = _check(image, x, dat_params, n_heads, n_groups)
    _, h, w, _ = x.shape
    out = {
        "H": h,
        "W": w,
        "queries": query_positions(h, w),
        "scales": SCALES,
        "labels": list(dat_params),
        "n_heads": n_heads,
        "n_groups": n_groups,
        "photo": png_uri(image),
        "dat": {},
    }
    for label, params in dat_params.items():
        runs = []
        for sc in SCALES:
            st = dat_setting(x, params, n_heads, n_groups, stride, offset_range, sc)
            out["reference"] = np.round(st["reference"], 2).tolist()
            runs.append(
                {
                    "points": np.round(st["points"], 2).tolist(),
                    "weights": np.rint(st["weights"] / UNIT).astype(int).tolist(),
                }
            )
        out["dat"][label] = runs
    if msda is not None:
        lum = image @ np.array([0.299, 0.587, 0.114]) if image.ndim == 3 else image
        shapes = [tuple(int(v) for v in s) for s in msda["spatial_shapes"]]
        out["levels"] = [
            png_uri(lum.reshape(hl, h // hl, wl, w // wl).mean((1, 3)), size=w)
            for hl, wl in shapes
        ]
        out["level_shapes"] = shapes
        out["msda_heads"] = msda["n_heads"]
        out["msda"] = []
        for sc in SCALES:
            st = msda_setting(x, msda, sc)
            out["msda"].append(
                {
                    "locations": np.round(st["locations"], 2).tolist(),
                    "weights": np.rint(st["weights"] / UNIT).astype(int).tolist(),
                }
            )
    return out


def _image_spec(kinds: list[str], colors: list[str], height: int, width: int) -> dict:
    """Points over an image: data "image" {url, x0, x1, y0, y1}; "links" {x, y, x2,
    y2}; "points" {x, y, kind, w, shape}; "query" {x, y}. Image units, y down."""
    axis = {
        "domain": False,
        "ticks": False,
        "labels": False,
        "grid": False,
        "title": None,
    }
    # the image and a margin of a quarter of it on each side (points beyond: clipped)
    xs = {"domain": [-width / 4, 5 * width / 4], "nice": False, "zero": False}
    ys = {
        "domain": [-height / 4, 5 * height / 4],
        "nice": False,
        "zero": False,
        "reverse": True,
    }
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v6.json",
        "width": 280,
        "height": 280,
        "autosize": {"type": "pad"},
        "layer": [
            {
                "data": {"name": "image"},
                "mark": {"type": "image", "aspect": False},
                "encoding": {
                    "url": {"field": "url", "type": "nominal"},
                    "x": {
                        "field": "x0",
                        "type": "quantitative",
                        "axis": axis,
                        "scale": xs,
                    },
                    "x2": {"field": "x1"},
                    "y": {
                        "field": "y0",
                        "type": "quantitative",
                        "axis": axis,
                        "scale": ys,
                    },
                    "y2": {"field": "y1"},
                },
            },
            {
                "data": {"name": "links"},
                "mark": {
                    "type": "rule",
                    "color": "#FFD43B",
                    "strokeWidth": 1.2,
                    "clip": True,
                },
                "encoding": {
                    "x": {"field": "x", "type": "quantitative"},
                    "y": {"field": "y", "type": "quantitative"},
                    "x2": {"field": "x2"},
                    "y2": {"field": "y2"},
                },
            },
            {
                "data": {"name": "points"},
                "mark": {
                    "type": "point",
                    "filled": True,
                    "stroke": "#333333",
                    "strokeWidth": 0.6,
                    "opacity": 0.95,
                    "clip": True,
                },
                "encoding": {
                    "x": {"field": "x", "type": "quantitative"},
                    "y": {"field": "y", "type": "quantitative"},
                    "size": {
                        "field": "w",
                        "type": "quantitative",
                        "title": "weight",
                        "scale": {"range": [8, 360], "zero": True},
                        "legend": None,
                    },
                    "color": {
                        "field": "kind",
                        "type": "nominal",
                        "title": None,
                        "scale": {"domain": kinds, "range": colors},
                        "legend": {"orient": "bottom", "columns": 2, "labelLimit": 200},
                    },
                    "shape": {
                        "field": "shape",
                        "type": "nominal",
                        "legend": None,
                        "scale": None,
                    },
                    "tooltip": [
                        {"field": "kind"},
                        {
                            "field": "w",
                            "type": "quantitative",
                            "format": ".4f",
                            "title": "weight",
                        },
                    ],
                },
            },
            {
                "data": {"name": "query"},
                "mark": {
                    "type": "point",
                    "shape": "cross",
                    "size": 260,
                    "filled": True,
                    "color": QUERY_COLOR,
                    "stroke": "white",
                    "strokeWidth": 1,
                },
                "encoding": {
                    "x": {"field": "x", "type": "quantitative"},
                    "y": {"field": "y", "type": "quantitative"},
                },
            },
        ],
        **FONT,
    }


def static_sampling_points_explorer(
    image,
    x,
    dat_params,
    n_heads,
    n_groups,
    stride,
    offset_range,
    msda=None,
    query=27,
    scale=1.0,
    label=None,
    head=0,
) -> Explorer:
    """The static site's twin of ``sampling_points_explorer``."""
    _check(image, x, dat_params, n_heads, n_groups)
    _check_settings(dat_params, n_heads, query, scale, label, head)
    grid = sampling_grid(
        image, x, dat_params, n_heads, n_groups, stride, offset_range, msda
    )
    labels = list(dat_params)
    init = {
        "query": query,
        "scale": SCALES.index(scale),
        "label": labels.index(label) if label is not None else len(labels) - 1,
        "head": head,
        "level": 0,
    }
    hw = (grid["H"], grid["W"])
    specs = {"dat": _image_spec(DAT_KINDS, DAT_COLORS, *hw)}
    if msda is not None:
        specs["msda"] = _image_spec(
            [f"level {i} ({a} × {b})" for i, (a, b) in enumerate(grid["level_shapes"])],
            [LEVEL_COLORS[i % 4] for i in range(len(grid["level_shapes"]))],
            *hw,
        )
    return Explorer(
        "sampling",
        {"grid": grid, "init": init, "specs": specs},
        "Sampling points on the photograph (chapter 4)",
        "explorers.sampling_points_explorer(...)",
    )


def sampling_figure(
    image,
    x,
    params,
    n_heads,
    n_groups,
    stride,
    offset_range,
    msda,
    query,
    scale,
    head,
    level,
):
    """The live figure: DAT's points and the query's weights, and MSDA's points."""

    _, h, w, _ = x.shape
    r, c = query_positions(h, w)[query]
    st = dat_setting(x, params, n_heads, n_groups, stride, offset_range, scale)
    g = head * n_groups // n_heads
    ref, pts, wts = st["reference"], st["points"][g], st["weights"][head, query]
    ncol = 2 if msda is not None else 1
    fig, axes = live.subplots(1, ncol, figsize=(4.6 * ncol, 4.4), squeeze=False)
    ax = axes[0, 0]
    ax.imshow(image, extent=(0, w, h, 0))
    for (x0, y0), (x1, y1) in zip(ref, pts):
        ax.plot([x0, x1], [y0, y1], color="#FFD43B", lw=1)
    ax.scatter(*ref.T, s=8, color="white", label="reference points")
    ax.scatter(
        *pts.T,
        s=8 + 3000 * wts,
        color=ORANGE,
        ec="white",
        lw=0.5,
        label="deformed points (size: weight)",
    )
    ax.scatter([c + 0.5], [r + 0.5], marker="P", s=200, color=QUERY_COLOR, ec="white")
    ax.set(
        xlim=(0, w),
        ylim=(h, 0),
        xticks=[],
        yticks=[],
        title=f"DAT, head {head}, offsets × {scale}",
    )
    ax.legend(fontsize=7, loc="lower left")
    if msda is not None:
        ax = axes[0, 1]
        ms = msda_setting(x, msda, scale)
        ax.imshow(image, extent=(0, w, h, 0), alpha=0.5)
        levels = range(len(msda["spatial_shapes"])) if level is None else [level]
        for lv in levels:
            loc = ms["locations"][query][:, lv].reshape(-1, 2)
            ax.scatter(
                *loc.T,
                s=10 + 600 * ms["weights"][query][:, lv].ravel(),
                color=LEVEL_COLORS[lv % 4],
                ec="white",
                lw=0.5,
                label=f"level {lv}",
            )
        ax.scatter(
            [c + 0.5], [r + 0.5], marker="P", s=200, color=QUERY_COLOR, ec="white"
        )
        ax.set(
            xlim=(0, w),
            ylim=(h, 0),
            xticks=[],
            yticks=[],
            title="MSDA: the query's points per level",
        )
        ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    return fig


def live_sampling_points_explorer(
    image,
    x,
    dat_params,
    n_heads,
    n_groups,
    stride,
    offset_range,
    msda=None,
    query=27,
    scale=1.0,
    label=None,
    head=0,
):
    """ipywidgets: each change redraws ``sampling_figure``."""
    import ipywidgets as widgets

    image, x = _check(image, x, dat_params, n_heads, n_groups)
    _check_settings(dat_params, n_heads, query, scale, label, head)
    _, h, w, _ = x.shape
    pos = query_positions(h, w)
    labels = list(dat_params)
    rules = settings(labels, n_heads)
    # The query a menu of grid points by name; the offsets menu shows None (the last
    # label) as that label.
    points = [f"row {r}, col {c}" for r, c in pos]
    queries = Choice(range(len(pos)), label=rules["query"].label, names=points)
    ctl = {
        "query": control(queries, query),
        "scale": control(rules["scale"], scale),
        "label": control(
            Choice(labels, label=rules["label"].label), label or labels[-1]
        ),
        "head": control(rules["head"], head),
    }
    if msda is not None:
        n_lv = len(msda["spatial_shapes"])
        levels = Choice([None, *range(n_lv)], label="MSDA level")
        names = ["all", *(f"level {i}" for i in range(n_lv))]
        ctl["level"] = control(levels, None, names=names)
    out = widgets.Output()

    def redraw(change=None):
        kw = {k: v.value for k, v in ctl.items()}
        show_png(
            out,
            live_png(
                sampling_figure,
                image,
                x,
                dat_params[kw["label"]],
                n_heads,
                n_groups,
                stride,
                offset_range,
                msda,
                kw["query"],
                kw["scale"],
                kw["head"],
                kw.get("level"),
            ),
        )

    for v in ctl.values():
        v.observe(redraw, names="value")
    redraw()
    items = list(ctl.values())
    return widgets.VBox([widgets.HBox(items[:3]), widgets.HBox(items[3:]), out])


def sampling_points_explorer(
    image,
    x,
    dat_params: dict,
    n_heads: int,
    n_groups: int,
    stride: int,
    offset_range: float,
    msda: dict | None = None,
    query: int = 27,
    scale: float = 1.0,
    label: str | None = None,
    head: int = 0,
):
    """Chapter 4: DAT's and MSDA's sampling points on ``image`` for the feature map
    ``x`` (1, H, W, C). ``dat_params``: {label: DAT parameters} (e.g. untrained and
    trained offsets); ``msda``: None or {params, spatial_shapes, n_heads, n_points}
    (the pyramid is pooled from ``x``'s image). ``query`` indexes
    ``query_positions``. The static twin on the built site, ipywidgets elsewhere."""
    face = (
        static_sampling_points_explorer
        if site.ON_SITE
        else live_sampling_points_explorer
    )
    return face(
        image,
        x,
        dat_params,
        n_heads,
        n_groups,
        stride,
        offset_range,
        msda,
        query=query,
        scale=scale,
        label=label,
        head=head,
    )


__all__ = [
    "dat_setting",
    "msda_setting",
    "png_uri",
    "query_positions",
    "sampling_grid",
    "sampling_points_explorer",
    "to_image_units",
]
