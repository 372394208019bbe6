"""A live face's figure kept between its moves.

A new matplotlib figure per slider move pays, every time, for what does not change:
the figure and its axes, their tick objects, the fonts' layout (a two-panel figure's
``tight_layout`` alone costs a fifth of a second the first time). Figure functions
make their figure with ``subplots``, which outside ``reusing`` is ``plt.subplots``.
Inside ``reusing(store)`` the first call makes the figure (not pyplot's: nothing is
left open or shown twice in a notebook), and each later identical call hands the same
figure back emptied of what was drawn (lines, patches, images, texts, legends,
colorbars), its axes reset to what a new subplot has (linear scales, limits 0 to 1
autoscaled, default ticks and colours, no titles or labels). The figure function then
draws and lays it out as on a new figure: ``tight_layout`` on a kept figure costs a
few hundredths of a second, and gives the layout a new figure would get. A text drawn
again at the same place is drawn from the glyphs it was rasterized with
(``_Renderer``). The tests draw every live face both ways and compare the pixels
(``tests/attention/test_live_reuse.py``).

The rest of a live face's speed lives beside its figures:

* ``explorers.common.figure_png(fig, crop="ink")`` crops the PNG to the drawn pixels
  instead of measuring a tight bounding box;
* two faces draw only what a move changes, blitted over a background drawn once:
  ``explorers.sparse.SparsePicture`` (chapter 8) and
  ``explorers.pretrained.PretrainedPicture`` (chapter 1: a figure per sentence, the
  head's map, outlines, title and spines over it); their tests compare the blitted
  pictures with full drawings, pixel for pixel;
* the multi-panel figures of chapters 1-4 are laid out once, not with a
  ``tight_layout`` per move (``NAIVE_PANELS``, ``SELECTION_PANELS`` and
  ``DEFORM_PANELS`` in ``plots.traffic``, ``LIVE_PANELS`` in ``plots.schedule``,
  ``ONLINE_PANELS`` and ``ESTIMATOR_PANELS`` beside their explorers); their tests draw
  the corners of the settings and check that every panel lies on the canvas and that
  no panel draws over another.

``python tools/live_latency.py [--each]`` moves every control of every live face to
its extremes and through its options and prints, per face, the median and the slowest
move: the figures for the machine it runs on.
"""

from __future__ import annotations

import contextlib

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg

#: The stores ``subplots`` hands figures back from (the innermost last).
_STORES: list[dict] = []

#: The glyphs each text was drawn with, by everything that places them (the text, its
#: font, angle, position to the float, the canvas's height and dpi, antialiasing):
#: ``_Renderer`` draws a text it drew before from them. Bounded: cleared when full.
_GLYPHS: dict = {}
_GLYPHS_MAX = 20_000


class _Renderer(RendererAgg):
    """``RendererAgg`` that keeps the glyphs of each text it rasterizes (a kept
    figure draws most of its labels, titles and legends at the same places move
    after move): a text drawn before is drawn from its glyphs, skipping FreeType's
    layout and rendering (a quarter of a move's drawing); the same calls with the
    same glyph bitmaps, so the same pixels (the tests compare them). Math text is
    drawn as ``RendererAgg`` draws it."""

    def draw_text(self, gc, x, y, s, prop, angle, ismath=False, mtext=None):
        if ismath:
            return super().draw_text(gc, x, y, s, prop, angle, ismath, mtext)
        # (font features and language: matplotlib 3.11's; None before)
        features = getattr(mtext, "get_fontfeatures", lambda: None)()
        language = getattr(mtext, "get_language", lambda: None)()
        key = (s, prop, angle, x, y, self.height, self.dpi, gc.get_antialiased(),
               features, language)  # fmt: skip
        glyphs = _GLYPHS.get(key)
        if glyphs is None:
            real, recorder = self._renderer, _Recorder(self._renderer)
            self._renderer = recorder
            try:
                super().draw_text(gc, x, y, s, prop, angle, ismath, mtext)
            finally:
                self._renderer = real
            if recorder.glyphs is not None:  # drawn glyph by glyph: kept
                if len(_GLYPHS) >= _GLYPHS_MAX:
                    _GLYPHS.clear()
                _GLYPHS[key] = recorder.glyphs
            return None
        for buffer, left, top, rot in glyphs:
            self._renderer.draw_text_image(buffer, left, top, rot, gc)
        return None


class _Recorder:
    """Stands in for the C++ renderer while a text is drawn: keeps each glyph's
    bitmap and place, and passes every call on. A matplotlib that hands the renderer
    the font itself (before 3.11: the whole text in one bitmap the font reuses) is
    not recorded (``glyphs`` None): its texts are drawn as ``RendererAgg`` draws
    them."""

    def __init__(self, real):
        self._real, self.glyphs = real, []

    def draw_text_image(self, buffer, left, top, angle, gc):
        if self.glyphs is not None and isinstance(buffer, np.ndarray):
            self.glyphs.append((buffer.copy(), left, top, angle))
        else:
            self.glyphs = None
        return self._real.draw_text_image(buffer, left, top, angle, gc)

    def __getattr__(self, name):
        return getattr(self._real, name)


class _Canvas(FigureCanvasAgg):
    """The kept figures' canvas: ``FigureCanvasAgg`` drawing with ``_Renderer``."""

    def get_renderer(self):
        w, h = self.get_width_height(physical=True)
        key = w, h, self.figure.dpi
        if self._lastKey != key:
            self.renderer = _Renderer(w, h, self.figure.dpi)
            self._lastKey = key
        return self.renderer


#: Keyword arguments of ``plt.subplots`` that belong to the figure, not the grid.
_FIGURE_KW = ("figsize", "dpi", "facecolor")


@contextlib.contextmanager
def reusing(store: dict):
    """Inside, ``subplots`` keeps its figures in ``store`` (keyed by its arguments)
    and hands them back; ``store["last"]`` is the figure it handed out last."""
    _STORES.append(store)
    try:
        yield store
    finally:
        _STORES.pop()


def subplots(nrows: int = 1, ncols: int = 1, **kw):
    """``plt.subplots(nrows, ncols, **kw)``; inside ``reusing``, the figure made by the
    same call before, emptied (see the module's docstring)."""
    if not _STORES:
        return plt.subplots(nrows, ncols, **kw)
    from matplotlib.figure import Figure

    store = _STORES[-1]
    key = (nrows, ncols, repr(sorted(kw.items())))
    if key in store:
        fig, axes = store[key]
        empty(fig)
        store["last"] = fig
        return fig, axes
    fig = Figure(**{k: kw.pop(k) for k in _FIGURE_KW if k in kw})
    _Canvas(fig)
    axes = fig.subplots(nrows, ncols, **kw)
    fig._live = {
        "axes": list(fig.axes),
        "specs": [ax.get_subplotspec() for ax in fig.axes],
        "colorbars": {},  # a panel -> the axes of its colorbar
    }
    store[key] = (fig, axes)
    store["last"] = fig
    return fig, axes


#: ``colorbar`` arguments that place a new colorbar's axes (not used with ``cax``).
_PLACING = ("fraction", "pad", "shrink", "aspect", "anchor", "panchor", "location")


def colorbar(im, ax, **kw):
    """``ax.figure.colorbar(im, ax=ax, **kw)``; on a kept figure the colorbar's axes
    made for ``ax`` the first time is drawn into again (its ticks made once, the panel
    keeping the share the first colorbar took)."""
    fig = ax.figure
    live = getattr(fig, "_live", None)
    if live is None:
        return fig.colorbar(im, ax=ax, **kw)
    cax = live["colorbars"].get(ax)
    if cax is None:
        bar = fig.colorbar(im, ax=ax, **kw)
        live["colorbars"][ax] = bar.ax
        return bar
    kept = {k: v for k, v in kw.items() if k not in _PLACING}
    return fig.colorbar(im, cax=cax, **kept)


def _reset_axis(axis, rc: str) -> None:
    axis._set_axes_scale("linear")  # default locators and formatters again
    axis.set_label_text("")
    axis.set_tick_params(which="both", reset=False, **_TICKS[rc])
    axis.set_inverted(False)


#: What a new subplot's ticks have (from the book's style): labels on, where they go.
_TICKS = {
    "x": {"labelbottom": True, "labeltop": False},
    "y": {"labelleft": True, "labelright": False},
}


def empty(fig) -> None:
    """Take out what the figure function drew, so it can draw the next move."""
    live = fig._live
    bars = live["colorbars"]
    for ax in list(fig.axes):
        if ax not in live["axes"] and ax not in bars.values():
            ax.remove()  # a colorbar not made by ``colorbar``: the next move makes one
    for text in list(fig.texts):
        text.remove()
    for legend in list(fig.legends):
        legend.remove()
    if fig._suptitle is not None:
        fig._suptitle.remove()
        fig._suptitle = None
    for ax, spec in zip(live["axes"], live["specs"]):
        if ax not in bars:  # (a kept colorbar keeps the share of its panel it took)
            if ax.get_subplotspec() is not spec:  # a colorbar took part of it
                ax.set_subplotspec(spec)
            ax._set_position(spec.get_position(fig))
    for ax in [*live["axes"], *bars.values()]:
        for artist in (
            *ax.lines,
            *ax.patches,
            *ax.collections,
            *ax.texts,
            *ax.images,
            *ax.artists,
            *ax.tables,
        ):
            artist.remove()
        ax.containers.clear()  # bars' containers: a legend finds handles there
        if ax.legend_ is not None:
            ax.legend_.remove()
        for loc in ("center", "left", "right"):
            ax.set_title("", loc=loc)
        _reset_axis(ax.xaxis, "x")
        _reset_axis(ax.yaxis, "y")
        ax.set_prop_cycle(None)  # colours from the start of the cycle again
        ax.set_aspect("auto")
        ax.set_axis_on()
        ax.margins(mpl.rcParams["axes.xmargin"], mpl.rcParams["axes.ymargin"])
        ax.grid(False)
        if mpl.rcParams["axes.grid"]:
            ax.grid(True, which=mpl.rcParams["axes.grid.which"],
                    axis=mpl.rcParams["axes.grid.axis"])  # fmt: skip
        ax.dataLim.set_points(mpl.transforms.Bbox.null().get_points())
        ax.ignore_existing_data_limits = True
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_autoscale_on(True)
