"""Chapter 3's explorers: they build, and moving a slider redraws with the new value."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from attention import plots  # noqa: E402
from attention.explorers import temperature, topk_traffic  # noqa: E402
from tests.attention.widget_tools import controls as _controls  # noqa: E402
from tests.attention.widget_tools import output as _output  # noqa: E402
from tests.attention.widget_tools import png as _png  # noqa: E402

pytestmark = pytest.mark.xdist_group("hard_widgets")


def test_temperature_explorer_redraws(monkeypatch):
    calls = []
    real = plots.gumbel_softmax_figure

    def recording(s, g, tau, row):
        calls.append((tau, row, s.copy(), g.copy()))
        return real(s, g, tau=tau, row=row)

    monkeypatch.setattr(plots, "gumbel_softmax_figure", recording)
    box = temperature.live_temperature_explorer(tau=1.0)
    out = _output(box)
    first = _png(out)
    assert len(calls) == 1 and calls[0][0] == pytest.approx(1.0)
    _controls(box)["temperature τ"].value = 0.05
    assert len(calls) == 2 and calls[1][0] == pytest.approx(0.05)
    # same noise: only tau moved
    np.testing.assert_array_equal(calls[0][3], calls[1][3])
    assert _png(out) != first
    _controls(box)["query row"].value = 3
    assert calls[-1][1] == 3


def test_topk_traffic_explorer_redraws(monkeypatch):
    calls = []
    real = plots.selection_traffic_figure

    def recording(**kw):
        calls.append(kw)
        return real(**kw, ns=[256, 1024])

    monkeypatch.setattr(plots, "selection_traffic_figure", recording)
    box = topk_traffic.live_topk_traffic_explorer(N=1024, k=8)
    out = _output(box)
    first = _png(out)
    live = {"simulated": False}  # the closed form: the simulator's counts at once
    assert calls == [{"N": 1024, "d": 64, "k": 8, **live}]
    _controls(box)["top-k k"].value = 64
    assert calls[-1] == {"N": 1024, "d": 64, "k": 64, **live}
    assert _png(out) != first


def test_topk_traffic_explorer_never_runs_the_simulator(monkeypatch):
    """Issue 33: each move answers at once, at the largest N, d and k too."""
    from attention import memory

    def refuse(*a, **kw):
        raise AssertionError("the live face ran the simulator")

    monkeypatch.setattr(memory, "simulate", refuse)
    box = topk_traffic.live_topk_traffic_explorer(N=65536, d=128, k=256)
    _controls(box)["head dim d"].value = 32
    assert len(_output(box).outputs) == 1


def test_selection_figure_draws_the_same_numbers_either_way():
    def data(fig):
        return [list(ln.get_ydata()) for ax in fig.axes for ln in ax.get_lines()] + [
            [p.get_height() for p in ax.patches] for ax in fig.axes
        ]

    sim = plots.selection_traffic_figure(N=1024, d=32, k=8, ns=[256, 1024])
    form = plots.selection_traffic_figure(
        N=1024, d=32, k=8, ns=[256, 1024], simulated=False
    )
    assert data(sim) == data(form)
    assert form.axes[0].get_title().endswith("dots closed form (= simulated)")
    plt.close("all")


def test_selection_timing_figure_draws_records():
    """The timing figure draws whatever records it is given
    (made-up numbers, test only)."""
    records = [
        {"op": op, "impl": impl, "ms": ms * n / 1024, "shape": {"N": n, "d": 64}}
        for n in (1024, 2048)
        for op, impl, ms in (
            ("flash", "triton", 1.0),
            ("hard", "triton", 0.5),
            ("hard", "naive", 9.0),
            ("topk16", "triton", 1.2),
            ("topk16", "naive", 10.0),
        )
    ]
    fig = plots.selection_timing_figure(records, d=64, title="test")
    left, right = fig.axes
    assert len(left.lines) == 3 and len(right.lines) == 3
    np.testing.assert_allclose(left.lines[1].get_ydata(), [0.5, 1.0])
    assert len(plots.selection_timing_figure(records, d=128).axes[0].lines) == 0


def test_fixed_panels_hold_the_corners_of_the_topk_settings():
    """``SELECTION_PANELS`` replaces a ``tight_layout`` per move: at the ends of the
    explorer's N, d and k (and an N between powers of two), nothing drawn leaves the
    canvas or runs into the other panel."""
    import itertools

    from tests.attention.widget_tools import assert_fixed_panels_hold

    ex = topk_traffic

    ns = (ex.SETTINGS["N"].lo, 65280, ex.SETTINGS["N"].hi)
    from attention.plots import live

    with live.reusing({}):
        for n, d, k in itertools.product(ns, (ex.TOPK_D[0], ex.TOPK_D[-1]), (1, 256)):
            fig = plots.selection_traffic_figure(N=n, d=d, k=k, simulated=False)
            assert_fixed_panels_hold(fig, (n, d, k))
