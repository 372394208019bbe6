"""Chapter 1's traffic explorer: it builds, and moving a control redraws the figure."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from attention import plots  # noqa: E402
from attention.explorers import naive_traffic  # noqa: E402
from tests.attention.widget_tools import controls as _controls  # noqa: E402
from tests.attention.widget_tools import output as _output  # noqa: E402
from tests.attention.widget_tools import png as _png  # noqa: E402

pytestmark = pytest.mark.xdist_group("ch1_widgets")


def test_explorer_draws_the_real_figure_and_redraws_it():
    box = naive_traffic.live_naive_traffic_explorer(n=256)
    out = _output(box)
    first = _png(out)
    _controls(box)["keys n"].value = 512
    assert _png(out) != first
    assert not plt.get_fignums(), "figures are closed after they are shown"


def test_the_live_face_draws_from_the_closed_form_alone(monkeypatch):
    """Issue 33: a move answers at once at the largest n, so the live figure never
    runs the tile-by-tile simulator (its counts equal the closed form's: the
    simulated figure checks that at every point it draws)."""
    from attention import memory

    def refuse(*a, **kw):
        raise AssertionError("the live face ran the simulator")

    monkeypatch.setattr(memory, "simulate", refuse)
    box = naive_traffic.live_naive_traffic_explorer(n=8192, d=256)
    c = _controls(box)
    c["self-attention (m = n)"].value = False
    c["queries m"].value = 8192
    c["head dim d"].value = 16
    assert len(_output(box).outputs) == 1


def test_the_simulated_and_the_closed_form_figures_draw_the_same_numbers():
    def data(fig):
        return [list(ln.get_ydata()) for ax in fig.axes for ln in ax.get_lines()] + [
            [p.get_height() for p in ax.patches] for ax in fig.axes
        ]

    sim = plots.naive_traffic_figure(n=320, m=96, d=32)
    form = plots.naive_traffic_figure(n=320, m=96, d=32, simulated=False)
    assert data(sim) == data(form)
    title = form.axes[0].get_legend().get_title().get_text()
    assert title == "lines: closed form, markers: closed form (= simulated)"
    plt.close("all")


def test_every_control_redraws_with_its_new_value(monkeypatch):
    calls = []

    def fake_figure(**kw):  # cheap stand-in that still draws what it was asked for
        calls.append(kw)
        fig, ax = plt.subplots(figsize=(2, 1))
        ax.text(0, 0, repr(sorted(kw.items())))
        return fig

    monkeypatch.setattr(plots, "naive_traffic_figure", fake_figure)
    box = naive_traffic.live_naive_traffic_explorer(n=256)
    out = _output(box)
    live = {"simulated": False}  # the closed form: the same counts at once
    assert calls == [{"n": 256, "m": None, "d": 64, "dtype": "float16", **live}]
    c = _controls(box)
    assert c["queries m"].disabled  # self-attention: m follows n

    seen = {_png(out)}
    c["keys n"].value = 512
    assert calls[-1]["n"] == 512
    # cross-attention: the m slider takes over
    c["self-attention (m = n)"].value = False
    assert not c["queries m"].disabled
    c["queries m"].value = 128
    assert calls[-1]["m"] == 128
    seen.add(_png(out))
    c["head dim d"].value = 128
    c["dtype"].value = "float32"
    assert calls[-1] == {"n": 512, "m": 128, "d": 128, "dtype": "float32", **live}
    seen.add(_png(out))
    assert len(seen) == 3, "the image changes with the values"
    c["self-attention (m = n)"].value = True
    assert c["queries m"].disabled and calls[-1]["m"] is None
    assert len(calls) == 7  # the first draw + one per change


def test_fixed_panels_hold_the_corners_of_the_naive_traffic_settings():
    """``NAIVE_PANELS`` replaces a ``tight_layout`` per move: at the ends of the
    explorer's n, m (self or its ends) and d, with the longest and a short dtype name,
    nothing drawn leaves the canvas or runs into the other panel (drawn into one kept
    figure, as the live face draws: its pictures equal new ones', test_live_reuse)."""
    import itertools

    from attention import plots
    from attention.plots import live
    from tests.attention.widget_tools import assert_fixed_panels_hold

    longest = max(plots.DTYPE_BYTES, key=len)
    with live.reusing({}):
        for n, m, d, dtype in itertools.product(
            (64, 8192), (None, 16, 8192), (16, 256), (longest, "float32")
        ):
            fig = plots.naive_traffic_figure(
                n=n, m=m, d=d, dtype=dtype, simulated=False
            )
            assert_fixed_panels_hold(fig, (n, m, d, dtype))
