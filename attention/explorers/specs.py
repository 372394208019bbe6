"""Vega-Lite specs of the static site's explorers (``explorers.static``): the encodings
and the book's colours; the data (``explorers.data``) goes into their named data
sources in the browser.
"""

from __future__ import annotations

from .data import COMPULSORY_LABEL


def _colors():
    from attention import plots

    return {**plots.TENSOR_COLORS, "SRAM": plots.MEMORY_COLORS["SRAM"]}


_FONT = {
    "config": {
        "font": "system-ui, -apple-system, Segoe UI, sans-serif",
        "view": {"stroke": None},
        "axis": {"labelFontSize": 11, "titleFontSize": 11},
        "legend": {"labelFontSize": 11, "titleFontSize": 11},
    }
}


def _frame(height: int) -> dict:
    """Every spec's first keys: Vega-Lite v6, the column's width, ``height`` px tall."""
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v6.json",
        "width": "container",
        "height": height,
        "autosize": {"type": "fit", "contains": "padding"},
    }


def _color_scale(tensors: list[str]) -> dict:
    colors = _colors()
    return {"domain": tensors, "range": [colors.get(t, "#333333") for t in tensors]}


def bars_spec(
    tensors: list[str], title: str = "HBM traffic (bytes)", height: int = 240
) -> dict:
    """Stacked bars of HBM bytes per group (algorithm), split by tensor; writes lighter.
    Data "bars": rows {group, tensor, kind ("read"/"written"), bytes, order}."""
    return {
        **_frame(height),
        "data": {"name": "bars"},
        "mark": {"type": "bar", "stroke": "#222", "strokeWidth": 0.4},
        "encoding": {
            "x": {
                "field": "group",
                "type": "nominal",
                "sort": None,
                "title": None,
                "axis": {"labelAngle": 0, "labelLimit": 140},
            },
            "y": {
                "field": "bytes",
                "type": "quantitative",
                "stack": "zero",
                "title": title,
                "axis": {"format": "~s"},
            },
            "color": {
                "field": "tensor",
                "type": "nominal",
                "scale": _color_scale(tensors),
                "legend": {
                    "orient": "bottom",
                    "columns": 5,
                    "title": None,
                    "symbolType": "square",
                },
            },
            "opacity": {
                "field": "kind",
                "type": "ordinal",
                "scale": {"domain": ["read", "written"], "range": [1.0, 0.45]},
                "legend": {"orient": "top", "title": None, "columns": 2},
            },
            "order": {"field": "order", "type": "quantitative"},
            "tooltip": [
                {"field": "group"},
                {"field": "tensor"},
                {"field": "kind"},
                {"field": "bytes", "type": "quantitative", "format": ","},
            ],
        },
        **_FONT,
    }


def bars_floor_spec(
    tensors: list[str], label: str = COMPULSORY_LABEL, height: int = 240
) -> dict:
    """``bars_spec`` (the simulated traffic, no L2) with a black tick across each bar at
    its compulsory traffic. Data "bars" as ``bars_spec``; data "compulsory": rows
    {group, what (= ``label``), elements, bytes}."""
    spec = bars_spec(tensors, title="HBM bytes, simulated (no L2)", height=height)
    bars = {k: spec.pop(k) for k in ("data", "mark", "encoding")}
    tick = {
        "data": {"name": "compulsory"},
        "mark": {"type": "tick", "thickness": 3, "color": "#000000"},
        "encoding": {
            "x": {"field": "group", "type": "nominal", "sort": None},
            "y": {
                "field": "bytes",
                "type": "quantitative",
                "title": bars["encoding"]["y"]["title"],
            },
            "color": {
                "field": "what",
                "type": "nominal",
                "scale": {"domain": [label], "range": ["#000000"]},
                "legend": {
                    "orient": "top",
                    "title": None,
                    "symbolType": "stroke",
                    "symbolStrokeWidth": 3,
                    "labelLimit": 320,
                },
            },
            "tooltip": [
                {"field": "group"},
                {"field": "what", "title": "count"},
                {"field": "bytes", "type": "quantitative", "format": ","},
            ],
        },
    }
    spec["layer"] = [bars, tick]
    spec["resolve"] = {
        "scale": {"color": "independent"},
        "legend": {"color": "independent"},
    }
    return spec


def lines_spec(
    series: list[str],
    colors: list[str],
    x_title: str,
    height: int = 240,
    y_title: str = "HBM traffic (bytes)",
) -> dict:
    """Log-log lines of bytes against a size, one per series, and a rule at the chosen
    size. Data "lines": {x, series, bytes}; data "marker": {x}."""
    return {
        **_frame(height),
        "layer": [
            {
                "data": {"name": "lines"},
                "mark": {"type": "line", "point": {"size": 18}, "strokeWidth": 2},
                "encoding": {
                    "x": {
                        "field": "x",
                        "type": "quantitative",
                        "title": x_title,
                        "scale": {"type": "log", "base": 2},
                        "axis": {
                            "format": ",d",
                            "labelOverlap": "greedy",
                            "tickCount": 5,
                            "labelSeparation": 6,
                        },
                    },
                    "y": {
                        "field": "bytes",
                        "type": "quantitative",
                        "title": y_title,
                        "scale": {"type": "log"},
                        "axis": {"format": "~s"},
                    },
                    "color": {
                        "field": "series",
                        "type": "nominal",
                        "sort": series,
                        "scale": {"domain": series, "range": colors},
                        "legend": {
                            "orient": "bottom",
                            "columns": 3,
                            "title": None,
                            "labelLimit": 260,
                        },
                    },
                    "tooltip": [
                        {"field": "series"},
                        {"field": "x", "type": "quantitative"},
                        {"field": "bytes", "type": "quantitative", "format": ","},
                    ],
                },
            },
            {
                "data": {"name": "marker"},
                "mark": {"type": "rule", "color": "#8C8C8C", "strokeDash": [4, 3]},
                "encoding": {"x": {"field": "x", "type": "quantitative"}},
            },
        ],
        **_FONT,
    }


def tiles_spec(height: int = 240) -> dict:
    """The grid of (i, j) tiles of S at one step of a schedule. Data "tiles":
    {i, j, fill (a tensor, "SRAM" or "pending"), current (bool)}."""
    colors = _colors()
    fills = ["S", "P", "dP", "dS", "SRAM", "pending"]
    rng = [colors[f] for f in fills[:-1]] + ["#ffffff"]
    return {
        **_frame(height),
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
        **_FONT,
    }


def heatmap_spec(hard_color: str) -> dict:
    """Chapter 3's map of Gumbel-softmax weights (query x key), the chosen query row
    outlined in ``hard_color``. Data "map": {query, key, y, selected}."""
    return {
        **_frame(200),
        "data": {"name": "map"},
        "layer": [
            {
                "mark": {"type": "rect"},
                "encoding": {
                    "x": {"field": "key", "type": "ordinal", "title": "key"},
                    "y": {"field": "query", "type": "ordinal", "title": "query"},
                    "color": {
                        "field": "y",
                        "type": "quantitative",
                        "title": "weight",
                        "scale": {"scheme": "blues", "domain": [0, 1]},
                        "legend": {"orient": "right", "gradientLength": 120},
                    },
                    "tooltip": [
                        {"field": "query"},
                        {"field": "key"},
                        {"field": "y", "type": "quantitative", "format": ".4f"},
                    ],
                },
            },
            {
                "mark": {
                    "type": "rect",
                    "fill": None,
                    "stroke": hard_color,
                    "strokeWidth": 2,
                },
                "transform": [{"filter": "datum.selected"}],
                "encoding": {
                    "x": {"field": "key", "type": "ordinal"},
                    "y": {"field": "query", "type": "ordinal"},
                },
            },
        ],
        **_FONT,
    }


def weights_row_spec(soft_color: str, hard_color: str) -> dict:
    """One query's weights (bars), softmax(s) (black ticks) and the Gumbel-max sample
    (a triangle). Data "row": {key, y, p}; data "sample": {key}."""
    return {
        **_frame(200),
        "layer": [
            {
                "data": {"name": "row"},
                "mark": {"type": "bar", "color": soft_color, "opacity": 0.85},
                "encoding": {
                    "x": {"field": "key", "type": "ordinal", "title": "key"},
                    "y": {
                        "field": "y",
                        "type": "quantitative",
                        "title": "weight",
                        "scale": {"domain": [0, 1.08]},
                    },
                    "tooltip": [
                        {"field": "key"},
                        {"field": "y", "format": ".4f"},
                        {"field": "p", "format": ".4f"},
                    ],
                },
            },
            {
                "data": {"name": "row"},
                "mark": {"type": "tick", "color": "black", "thickness": 2},
                "encoding": {
                    "x": {"field": "key", "type": "ordinal"},
                    "y": {"field": "p", "type": "quantitative"},
                },
            },
            {
                "data": {"name": "sample"},
                "mark": {
                    "type": "point",
                    "shape": "triangle-down",
                    "filled": True,
                    "size": 90,
                    "color": hard_color,
                },
                "encoding": {
                    "x": {"field": "key", "type": "ordinal"},
                    "y": {"datum": 1.0, "type": "quantitative"},
                },
            },
        ],
        **_FONT,
    }
