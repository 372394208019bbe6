"""The live faces' one-draw PNG (``explorers.common.figure_png``) shows what
``savefig(dpi=100, bbox_inches="tight")`` shows: the same picture, cut the same way,
whether the drawing lies inside the canvas or reaches past its edge."""

import base64
import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from PIL import Image  # noqa: E402

from attention.explorers.common import figure_png  # noqa: E402


def _inside():
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot([1, 2, 3], [3, 1, 2], label="a line")
    ax.set(xlabel="x", ylabel="y", title="inside the canvas")
    ax.legend()
    fig.tight_layout()
    return fig


def _past_the_edge():
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot([1, 2, 3], [3, 1, 2])
    fig.text(0.5, -0.12, "a caption below the canvas", ha="center")
    fig.text(1.02, 0.5, "and one to its right", rotation=90, va="center")
    return fig


def _pixels(png: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(png))).convert("RGB"))


def _savefig(make) -> np.ndarray:
    fig = make()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return np.asarray(Image.open(buf).convert("RGB"))


def _ink_box(img: np.ndarray):
    ink = (img != img[0, 0]).any(-1)
    rows, cols = np.flatnonzero(ink.any(1)), np.flatnonzero(ink.any(0))
    return rows[0], img.shape[0] - rows[-1], cols[0], img.shape[1] - cols[-1]


def test_one_draw_png_matches_savefig_tight():
    for make in (_inside, _past_the_edge):
        ours, theirs = _pixels(figure_png(make())), _savefig(make)
        # The same size to a couple of pixels (ink against measured extents), the
        # same margins of background around the drawing, and the same drawing.
        assert abs(ours.shape[0] - theirs.shape[0]) <= 3, make.__name__
        assert abs(ours.shape[1] - theirs.shape[1]) <= 3, make.__name__
        for a, b in zip(_ink_box(ours), _ink_box(theirs)):
            assert abs(int(a) - int(b)) <= 3, make.__name__
        h = min(ours.shape[0], theirs.shape[0])
        w = min(ours.shape[1], theirs.shape[1])
        ink_ours = (ours[:h, :w] != ours[0, 0]).any(-1).sum()
        ink_theirs = (theirs[:h, :w] != theirs[0, 0]).any(-1).sum()
        assert abs(ink_ours - ink_theirs) <= 0.02 * ink_theirs, make.__name__


def test_ink_crop_keeps_the_drawing_and_the_margin():
    """``crop="ink"`` (the live faces'): the drawing whole, with PAD_INCHES (10 px)
    of background on each side; past the canvas's edge, the measured box as before."""
    from attention.explorers.common import PAD_INCHES

    pad = round(PAD_INCHES * 100)
    ours = _pixels(figure_png(_inside(), crop="ink"))
    assert [abs(int(m) - pad) <= 1 for m in _ink_box(ours)] == [True] * 4
    boxed = _pixels(figure_png(_inside()))
    ink = lambda img: (img != img[0, 0]).any(-1).sum()  # noqa: E731
    assert abs(ink(ours) - ink(boxed)) <= 0.01 * ink(boxed)
    past, theirs = (
        _pixels(figure_png(_past_the_edge(), crop="ink")),
        _savefig(_past_the_edge),
    )
    assert abs(past.shape[0] - theirs.shape[0]) <= 3
    assert abs(past.shape[1] - theirs.shape[1]) <= 3
    with pytest.raises(ValueError, match="crop"):
        figure_png(_inside(), crop="tight")


def test_the_figure_is_closed():
    fig = _inside()
    figure_png(fig)
    assert not plt.fignum_exists(fig.number)


def test_the_latency_tool_moves_every_control():
    """tools/live_latency.py (the README's measure of the live faces) moves each
    control of a face and times every redraw."""
    import sys

    from tests.conftest import ROOT

    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import live_latency
    finally:
        sys.path.remove(str(ROOT / "tools"))
    row = live_latency.measure("mask")
    assert row["moves"] >= 5 and 0 < row["median_s"] <= row["worst_s"] < 10
    assert "=" in row["worst_move"]
    assert set(live_latency.FACES) >= {"naive_traffic", "tile_size", "sparse"}


def test_kept_figure_draws_repeated_texts_from_their_glyphs(monkeypatch):
    """``plots.live``'s renderer draws a text it drew before (same text, font, angle,
    place) from the glyphs it kept, without FreeType, to the same pixels as a plain
    Agg canvas; a moved or new text, and math text, are rendered as usual."""
    from matplotlib.backends.backend_agg import RendererAgg

    from attention.plots import live

    def draw(fig):
        fig.canvas.draw()
        return np.asarray(fig.canvas.buffer_rgba()).copy()

    def make(store, title):
        with live.reusing(store):
            fig, ax = live.subplots(figsize=(4, 3))
        ax.plot([0, 1, 2], [2, 0, 1], label="a line")
        ax.set(xlabel="x", ylabel=r"$\alpha$ (math)", title=title)
        ax.legend()
        return fig

    rendered = []
    real = RendererAgg._draw_text_glyphs_and_boxes

    def counted(self, *args):
        rendered.append(1)
        return real(self, *args)

    monkeypatch.setattr(RendererAgg, "_draw_text_glyphs_and_boxes", counted)
    live._GLYPHS.clear()
    store = {}
    first = draw(make(store, "a title"))
    n_first = len(rendered)
    again = draw(make(store, "a title"))  # the kept figure, the same texts
    n_math = len(rendered) - n_first  # only the math label is rendered again
    moved = draw(make(store, "another title"))
    n_moved = len(rendered) - n_first - n_math
    plain = make({}, "another title")
    plain.canvas = type(plt.figure().canvas)(plain)  # a plain Agg canvas
    want = draw(plain)
    plt.close("all")
    assert n_first > 5 and n_math == 1, (n_first, n_math)
    assert np.array_equal(first, again)
    assert n_moved == 2  # the new title and the math label
    assert np.array_equal(moved, want)


def test_png_cache_keeps_the_last_shown():
    from attention.explorers.common import PngCache

    made = []
    cache = PngCache(size=2)

    def make(k):
        return lambda: made.append(k) or f"png {k}"

    assert [cache.get(k, make(k)) for k in (1, 2, 1, 3)] == [
        "png 1", "png 2", "png 1", "png 3"
    ]  # fmt: skip
    assert made == [1, 2, 3] and len(cache) == 2  # 2 was the least recent: dropped
    assert cache.get(1, make(1)) == "png 1" and made == [1, 2, 3]
    cache.get(2, make(2))
    assert made == [1, 2, 3, 2]


def test_a_matplotlib_that_passes_the_font_draws_every_text_uncached(monkeypatch):
    """Before matplotlib 3.11 (Colab's may be older than the pin), ``RendererAgg``
    hands the C++ renderer the font object, whose one bitmap it reuses: nothing is
    kept, and each draw goes the old way."""
    from matplotlib.backends.backend_agg import RendererAgg
    from matplotlib.font_manager import FontProperties

    from attention.plots import live

    font, calls = object(), []

    class Fake:
        def draw_text_image(self, *args):
            calls.append(args)

    def old_draw_text(self, gc, x, y, s, prop, angle, ismath=False, mtext=None):
        self._renderer.draw_text_image(font, x, y + 1, angle, gc)

    monkeypatch.setattr(RendererAgg, "draw_text", old_draw_text)
    live._GLYPHS.clear()
    r = live._Renderer(20, 20, 72)
    r._renderer = Fake()
    prop, gc = FontProperties(size=10), r.new_gc()
    r.draw_text(gc, 3.0, 4.0, "a", prop, 0.0)
    r.draw_text(gc, 3.0, 4.0, "a", prop, 0.0)
    assert [c[0] for c in calls] == [font, font] and not live._GLYPHS
