"""What the explorers share: the Vega-Lite frame and font, the traffic bars and lines
(with the book's tensor colours from ``attention.plots``), the per-tensor count rows
their grids send to the page, and the live faces' pictures (``live_png``, kept figures
drawn again; ``show_png``, the swap).
"""

from __future__ import annotations

import functools

from attention.plots import style as _style

# The book's palette (``attention.plots.style``) under the names explorers use it by:
# a colour means the same on the page as in the chapters' figures.
BLUE = _style.TENSOR_COLORS["Q"]
ORANGE = _style.TENSOR_COLORS["K"]
GREEN = _style.TENSOR_COLORS["V"]
RED = _style.TENSOR_COLORS["S"]
PURPLE = _style.TENSOR_COLORS["P"]
GREY = _style.TENSOR_COLORS["l"]
DARK_GREY = _style.TENSOR_COLORS["m"]
LIGHT_GREY = _style.TENSOR_COLORS["D"]
AMBER = _style.MEMORY_COLORS["SRAM"]
NAVY = _style.MEMORY_COLORS["HBM"]
KEEP = _style.MASK_COLORS["keep"]
TEAL = _style.SELECTION_COLORS["topk"]

#: How the explorers name the compulsory count beside the simulated one.
COMPULSORY_LABEL = "compulsory (each tensor once)"  # short: fits a 390 px legend row


def dtypes():
    from attention import plots

    return list(plots.DTYPE_BYTES.items())


def flat(per_tensor: dict, names: list[str]) -> list[int]:
    """[reads, writes] of each tensor in ``names`` (0, 0 where absent), flattened."""
    out = []
    for n in names:
        r, w = per_tensor.get(n, (0, 0))
        out += [int(r), int(w)]
    return out


def tensor_names(results) -> list[str]:
    return list(dict.fromkeys(t for r in results for t in r.per_tensor))


#: The live faces' resolution, and the margin kept around the drawing (savefig's
#: ``pad_inches`` default).
LIVE_DPI = 100
PAD_INCHES = 0.1


def _ink_box(fig, rgba):
    """The box (inches) of what was drawn on ``fig``'s canvas: the pixels that differ
    from its background. None where the drawing may reach past the canvas (ink on its
    edge, or a text or legend placed outside it, which is not drawn at all) or the
    canvas is blank: the caller measures the box then."""
    import numpy as np
    from matplotlib.colors import to_rgba
    from matplotlib.transforms import Bbox

    bg = np.round(np.array(to_rgba(fig.get_facecolor())) * 255).astype(np.uint8)
    # One comparison per pixel (its four bytes read as one 32-bit word), not four.
    pixels = np.ascontiguousarray(rgba).view(np.uint32)[..., 0]
    ink = pixels != bg.view(np.uint32)[0]
    rows, cols = np.flatnonzero(ink.any(1)), np.flatnonzero(ink.any(0))
    if not rows.size:
        return None
    top, bottom, left, right = rows[0], rows[-1] + 1, cols[0], cols[-1] + 1
    h, w = ink.shape
    if top == 0 or left == 0 or bottom == h or right == w:
        return None
    # A text anchored on the canvas has ink from its anchor on (on the edge where it
    # runs past it); legends and the figure's own texts are measured.
    loose = [*fig.texts, *fig.legends]
    for ax in fig.axes:
        loose += [ax.legend_] if ax.legend_ is not None else []
        for text in ax.texts:
            if text.get_visible():
                x, y = text.get_transform().transform(text.get_unitless_position())
                if not (0 <= x <= w and 0 <= y <= h):
                    return None
    renderer = fig.canvas.get_renderer()
    for artist in loose:
        if artist.get_visible() and artist.get_in_layout():
            b = artist.get_window_extent(renderer)
            if b.x0 < 0 or b.y0 < 0 or b.x1 > w or b.y1 > h:
                return None
    dpi = fig.dpi
    return Bbox([[left / dpi, (h - bottom) / dpi], [right / dpi, (h - top) / dpi]])


def drawn_box(fig, crop: str = "box"):
    """The box (inches) ``figure_png`` cuts ``fig``'s drawn canvas to, before its
    margin: what was drawn (``crop="ink"``) or the tight bounding box."""
    import numpy as np

    box = _ink_box(fig, np.asarray(fig.canvas.buffer_rgba())) if crop == "ink" else None
    return fig.get_tightbbox(fig.canvas.get_renderer()) if box is None else box


def box_inside(fig, box) -> bool:
    """Whether ``box`` (inches) lies on ``fig``'s canvas, to half a pixel."""
    width, height = fig.get_size_inches()
    eps = 0.5 / LIVE_DPI
    return (
        box.x0 >= -eps
        and box.y0 >= -eps
        and box.x1 <= width + eps
        and box.y1 <= height + eps
    )


def canvas_png(fig, box) -> str:
    """``fig``'s drawn canvas cut to ``box`` (inches, on the canvas) plus
    ``PAD_INCHES``, as a base64 PNG; the canvas is not drawn again."""
    import base64
    import io

    import numpy as np
    from PIL import Image

    rgba = np.asarray(fig.canvas.buffer_rgba())
    rows, cols = rgba.shape[:2]
    height, pad, dpi = fig.get_size_inches()[1], PAD_INCHES, fig.dpi
    # Pixel rows run from the top, inches from the bottom.
    top = max(int(round((height - box.y1 - pad) * dpi)), 0)
    bottom = min(int(round((height - box.y0 + pad) * dpi)), rows)
    left = max(int(round((box.x0 - pad) * dpi)), 0)
    right = min(int(round((box.x1 + pad) * dpi)), cols)
    buf = io.BytesIO()
    Image.fromarray(rgba[top:bottom, left:right]).save(
        buf, format="png", compress_level=1
    )
    if not hasattr(fig, "_live"):
        import matplotlib.pyplot as plt

        plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def blit_order(*panels) -> list:
    """The artists a blitted move draws, in the order a full draw draws them: for each
    ``(axes, artists)`` in ``panels`` (in the figure's order), the artists and the
    axes' visible spines (drawn over the data there) by zorder. The axes draw their
    ticks below the data (``set_axisbelow(True)``), so the background holds them."""
    out = []
    for ax, artists in panels:
        own = [*artists, *(sp for sp in ax.spines.values() if sp.get_visible())]
        out += sorted(own, key=lambda a: a.get_zorder())
    return out


def figure_png(fig, crop: str = "box") -> str:
    """``fig`` as a base64 PNG (then closed, unless a live face keeps it).

    What ``savefig(dpi=100, bbox_inches="tight")`` gives, in one draw instead of two
    (a slider's answer waits on this): the canvas is drawn once, its tight bounding box
    measured, and the drawn canvas cut to that box plus ``PAD_INCHES``, then encoded
    with a fast PNG compression. Where the box reaches past the canvas (text placed
    outside it, which ``bbox_inches="tight"`` grows the picture to hold), the figure is
    drawn once more into the measured box.

    ``crop="ink"`` (the live faces') cuts to the drawn pixels instead of measuring
    the box (a tenth of the answer saved; the margins a few pixels narrower where a
    label's box has blank space), the same ``PAD_INCHES`` around them; a drawing that
    touches the canvas's edge is measured as above.
    """
    if crop not in ("box", "ink"):
        raise ValueError(f"crop must be 'box' or 'ink', not {crop!r}")
    import base64
    import io

    import matplotlib.pyplot as plt

    fig.set_dpi(LIVE_DPI)
    fig.canvas.draw()
    box = drawn_box(fig, crop)
    if box_inside(fig, box):
        return canvas_png(fig, box)
    buf = io.BytesIO()
    fig.savefig(
        buf,
        format="png",
        dpi=LIVE_DPI,
        bbox_inches=box.padded(PAD_INCHES),
        pil_kwargs={"compress_level": 1},
    )
    if not hasattr(fig, "_live"):
        plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


#: The figures the live faces keep between moves, per figure function
#: (``attention.plots.live``).
_KEPT: dict = {}


def live_png(make, *args, **settings) -> str:
    """``figure_png(make(*args, **settings))``, drawing into the figure ``make`` drew
    its last setting in (kept per ``make``): a live face's move skips making a figure,
    its axes and their ticks. The picture is the one a new figure gives (the tests
    compare them)."""
    from attention.plots import live

    with live.reusing(_KEPT.setdefault(make, {})):
        return figure_png(make(*args, **settings), crop="ink")


@functools.lru_cache(maxsize=512)
def cached_png(make, **settings) -> str:
    """``live_png(make, **settings)``, cached per (``make``, ``settings``): a live
    face whose figure is a function of its settings redraws a setting it showed at
    once (a slider moved back, or a control the figure does not depend on). ``make``
    is a module-level function, the settings hashable."""
    return live_png(make, **settings)


class PngCache:
    """A live face's PNGs by setting, the last ``size`` shown kept (a reader sweeping
    every setting of a face holds a few MB, not one PNG per setting ever shown):
    ``get(key, make)`` returns the kept PNG or ``make()``'s, kept."""

    def __init__(self, size: int = 256):
        import collections

        self._pngs: collections.OrderedDict = collections.OrderedDict()
        self.size = size

    def get(self, key, make) -> str:
        if key in self._pngs:
            self._pngs.move_to_end(key)
        else:
            self._pngs[key] = make()
            if len(self._pngs) > self.size:
                self._pngs.popitem(last=False)
        return self._pngs[key]

    def __len__(self) -> int:
        return len(self._pngs)


def one_picture_per_move(redraw):
    """``redraw`` as a controls' observer that does not run again for a change it makes
    itself (a slider clamped when ``redraw`` lowers its maximum): one picture per
    move, drawn at the settings ``redraw`` leaves."""
    busy = []

    def observer(change=None):
        if busy:
            return
        busy.append(1)
        try:
            redraw(change)
        finally:
            busy.clear()

    return observer


def show_png(out, png: str) -> None:
    """Replace ``out``'s content with the base64 PNG ``png``.

    Setting ``out.outputs`` directly works the same inside and outside a running kernel
    (so tests can check a redraw), and swaps the image in one step (no flicker).
    """
    out.outputs = (
        {
            "output_type": "display_data",
            "metadata": {},
            "data": {"image/png": png, "text/plain": "<Figure>"},
        },
    )


def book_colors():
    from attention import plots

    return {**plots.TENSOR_COLORS, "SRAM": plots.MEMORY_COLORS["SRAM"]}


FONT = {
    "config": {
        "font": "system-ui, -apple-system, Segoe UI, sans-serif",
        "view": {"stroke": None},
        "axis": {"labelFontSize": 11, "titleFontSize": 11},
        "legend": {"labelFontSize": 11, "titleFontSize": 11},
    }
}


def frame(height: int) -> dict:
    """Every spec's first keys: Vega-Lite v6, the column's width, ``height`` px tall."""
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v6.json",
        "width": "container",
        "height": height,
        "autosize": {"type": "fit", "contains": "padding"},
    }


def color_scale(tensors: list[str]) -> dict:
    colors = book_colors()
    return {"domain": tensors, "range": [colors.get(t, "#333333") for t in tensors]}


def bars_spec(
    tensors: list[str], title: str = "HBM traffic (bytes)", height: int = 240
) -> dict:
    """Stacked bars of HBM bytes per group (algorithm), split by tensor; writes lighter.
    Data "bars": rows {group, tensor, kind ("read"/"written"), bytes, order}."""
    return {
        **frame(height),
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
                "scale": color_scale(tensors),
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
                "legend": {"orient": "top", "title": None, "direction": "vertical"},
            },
            "order": {"field": "order", "type": "quantitative"},
            "tooltip": [
                {"field": "group"},
                {"field": "tensor"},
                {"field": "kind"},
                {"field": "bytes", "type": "quantitative", "format": ","},
            ],
        },
        **FONT,
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
                    "symbolStrokeColor": "#000000",
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
        **frame(height),
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
        **FONT,
    }
