"""Chapter 4's traffic explorer: it builds, and moving r or the number of points redraws
the figure with the new value."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

# registers the deformable traffic algorithms
import attention.deformable  # noqa: E402,F401
from attention import plots  # noqa: E402
from attention.explorers import deformable_traffic  # noqa: E402
from tests.attention.widget_tools import controls as _controls  # noqa: E402
from tests.attention.widget_tools import output as _output  # noqa: E402
from tests.attention.widget_tools import png as _png  # noqa: E402

pytestmark = pytest.mark.xdist_group("deformable")


def test_explorer_draws_and_redraws_the_real_figure():
    box = deformable_traffic.live_deformable_traffic_explorer(
        side=32, d=16, r=4, n_points=4, n_levels=2
    )
    out = _output(box)
    first = _png(out)
    _controls(box)["DAT factor r"].value = 8
    second = _png(out)
    assert second != first
    _controls(box)["MSDA points P"].value = 1
    assert _png(out) != second
    assert not plt.get_fignums(), "figures are closed after they are shown"


def test_sliders_pass_their_values_to_the_figure(monkeypatch):
    calls = []

    def fake_figure(**kw):
        calls.append(kw)
        fig, ax = plt.subplots(figsize=(2, 1))
        ax.text(0, 0, repr(sorted(kw.items())))
        return fig

    monkeypatch.setattr(plots, "deformable_traffic_figure", fake_figure)
    box = deformable_traffic.live_deformable_traffic_explorer(
        side=64, d=32, r=4, n_points=4, n_levels=4
    )
    live = {"simulated": False}  # the closed forms: the simulator's counts at once
    assert calls[-1] == dict(side=64, d=32, r=4, n_points=4, n_levels=4, **live)
    controls = _controls(box)
    for name, key, value in [
        ("DAT factor r", "r", 2),
        ("MSDA points P", "n_points", 8),
        ("MSDA levels L", "n_levels", 1),
        ("map side", "side", 32),
        ("head dim d", "d", 64),
    ]:
        n = len(calls)
        controls[name].value = value
        assert len(calls) == n + 1 and calls[-1][key] == value


def test_the_live_face_never_runs_the_simulator(monkeypatch):
    """Issue 33: each move answers at once, at the largest map, r, P and L too."""
    from attention import memory

    def refuse(*a, **kw):
        raise AssertionError("the live face ran the simulator")

    monkeypatch.setattr(memory, "simulate", refuse)
    box = deformable_traffic.live_deformable_traffic_explorer(
        side=128, d=128, r=16, n_points=16, n_levels=4
    )
    _controls(box)["head dim d"].value = 16
    assert len(_output(box).outputs) == 1


def test_the_closed_form_figure_draws_the_simulated_numbers():
    def data(fig):
        return [
            [t.get_text() for t in ax.texts] + [p.get_height() for p in ax.patches]
            for ax in fig.axes
        ] + [list(c.get_offsets().ravel()) for ax in fig.axes for c in ax.collections]

    kw = dict(side=32, d=16, r=4, n_points=2, n_levels=2)
    sim = plots.deformable_traffic_figure(**kw)
    form = plots.deformable_traffic_figure(**kw, simulated=False)
    assert data(sim) == data(form)
    assert "= simulated" in form.axes[1].get_title()
    plt.close("all")


def test_figure_matches_the_simulator():
    from attention import memory

    fig = plots.deformable_traffic_figure(side=32, d=16, r=4, n_points=2, n_levels=2)
    ax = fig.axes[0]
    # the numbers above the bars (the bars also carry their tensors' names)
    totals = sorted(
        float(t.get_text())
        for t in ax.texts
        if t.get_text().replace(".", "", 1).isdigit()
    )
    kw = dict(height=32, width=32, d=16)
    expected = [
        memory.simulate("dense-image", **kw),
        memory.simulate("dat", r=4, **kw),
        memory.simulate("dat-unfused", r=4, **kw),
        memory.simulate("msda", n_queries=32 * 32, d=16, n_levels=2, n_points=2),
    ]
    unit = {"MiB": 2**20, "KiB": 2**10, "GiB": 2**30, "B": 1}[
        ax.get_ylabel().split("(")[1].rstrip(")")
    ]
    exp = sorted(t.total * 2 / unit for t in expected)
    assert totals == pytest.approx(exp, rel=1e-2)
    plt.close(fig)


def test_timing_figure_draws_every_record_and_the_speedup():
    """The recorded-results figure (a layout check with made-up numbers; the chapter
    only ever draws files recorded on a GPU)."""
    recs = []
    for op, shapes, impls in (
        ("msda", [{"L_q": 300}, {"L_q": 10000}], ["triton", "naive"]),
        (
            "dat",
            [{"name": "detection-50x84"}],
            ["triton", "grid_sample+flash", "naive"],
        ),
    ):
        for shape in shapes:
            for mode in ("fwd", "fwd+bwd"):
                for impl in impls:
                    ms = 1.0 if impl == "triton" else 4.0
                    recs.append(
                        {
                            "op": op,
                            "impl": impl,
                            "mode": mode,
                            "dtype": "float16",
                            "shape": shape,
                            "ms": ms,
                            "error": None,
                        }
                    )
    recs.append(
        {
            "op": "msda",
            "impl": "naive",
            "mode": "fwd",
            "dtype": "float32",  # other dtype: not drawn
            "shape": {"L_q": 300},
            "ms": 9.0,
            "error": None,
        }
    )
    fig = plots.deformable_timing_figure("GPU · torch · triton · CUDA · date", recs)
    msda_ax, dat_ax = fig.axes
    assert len(msda_ax.patches) == 8 and len(dat_ax.patches) == 6
    assert [t.get_text() for t in msda_ax.texts] == ["4.0x"] * 4
    assert [t.get_text() for t in dat_ax.texts] == ["4.0x"] * 2
    assert fig._suptitle.get_text().startswith("GPU")
    plt.close(fig)


def test_fixed_panels_hold_every_corner_of_the_settings():
    """``DEFORM_PANELS`` replaces a ``tight_layout`` per move: at every corner of the
    explorer's settings (side, d, r, P, L at their ends) everything drawn, labels and
    legends included, lies on the canvas, and nothing one panel draws overlaps the
    other's: no label is cut or runs into the other panel."""
    import itertools

    from attention.explorers import deformable_traffic as ex

    ends = [(v[0], v[-1]) for v in (ex.DEFORM_SIDE, ex.DEFORM_D, ex.DEFORM_R,
                                    ex.DEFORM_P, ex.DEFORM_L)]  # fmt: skip
    from attention.plots import live
    from tests.attention.widget_tools import assert_fixed_panels_hold

    with live.reusing({}):
        for side, d, r, p, levels in itertools.product(*ends):
            fig = plots.deformable_traffic_figure(
                side=side, d=d, r=r, n_points=p, n_levels=levels, simulated=False
            )
            assert_fixed_panels_hold(fig, (side, d, r, p, levels))
