"""Chapter 3's temperature explorer: y = softmax((s + g) / tau) over a temperature
slider with the same scores and Gumbel noise at every tau, one query row beside
softmax(s): its grid (``hard.gumbel_softmax``), specs, static twin and ipywidgets face.
"""

from __future__ import annotations

import numpy as np

from . import site
from .common import FONT, frame, live_png, show_png
from .settings import Range, check, controls
from .site import Explorer

#: The temperature slider of ``live.temperature_explorer``: 10^-2 .. 10^1.5 in
#: steps of 0.05.
TAU_EXP = [round(-2 + 0.05 * i, 2) for i in range(71)]


def settings(n_q: int) -> dict:
    """The settings both faces take, for ``n_q`` query rows: tau on the log slider's
    steps (10^e, e in ``TAU_EXP``), a row of the score matrix."""
    return {
        "tau": Range(
            -2,
            1.5,
            0.05,
            integer=False,
            log=True,
            label="temperature τ",
            readout_format=".3g",
        ),
        "row": Range(0, n_q - 1, label="query row"),
    }


def _tau_index(tau) -> int:
    """Where tau = 10^e sits among ``TAU_EXP`` (after ``check``: e is a step)."""
    return TAU_EXP.index(round(float(np.log10(tau)), 2))


def temperature_grid(scores, noise, exps=TAU_EXP) -> dict:
    """``hard.gumbel_softmax(scores, tau, noise=noise)`` at each tau = 10^e (rounded to
    5 decimals), ``core.softmax(scores)`` and, per row, the Gumbel-max sample
    argmax(s + g)."""
    from attention import hard
    from attention.core import softmax

    s, g = np.asarray(scores, float), np.asarray(noise, float)
    ys = [np.round(hard.gumbel_softmax(s, 10.0**e, noise=g), 5).tolist() for e in exps]
    return {
        "tau_exp": list(exps),
        "y": ys,
        "p": np.round(softmax(s, axis=-1), 5).tolist(),
        "sample": np.argmax(s + g, axis=-1).tolist(),
        "shape": list(s.shape),
        # The inputs, so a test can recompute.
        "scores": s.tolist(),
        "noise": g.tolist(),
    }


def temperature_inputs(scores=None, noise=None, seed: int = 0):
    """The temperature explorer's (scores, noise) as float arrays: the given ones, or
    a random (8, 12) score matrix (1.5 x standard normal) and its Gumbel noise, both
    drawn from ``seed`` (scores first)."""
    rng = np.random.default_rng(seed)
    s = (
        1.5 * rng.standard_normal((8, 12))
        if scores is None
        else np.asarray(scores, float)
    )
    g = (
        -np.log(-np.log(rng.random(s.shape)))
        if noise is None
        else np.asarray(noise, float)
    )
    return s, g


def heatmap_spec(hard_color: str) -> dict:
    """Chapter 3's map of Gumbel-softmax weights (query x key), the chosen query row
    outlined in ``hard_color``. Data "map": {query, key, y, selected}."""
    return {
        **frame(200),
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
        **FONT,
    }


def weights_row_spec(soft_color: str, hard_color: str) -> dict:
    """One query's weights (bars), softmax(s) (black ticks) and the Gumbel-max sample
    (a triangle). Data "row": {key, y, p}; data "sample": {key}."""
    return {
        **frame(200),
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
        **FONT,
    }


def static_temperature_explorer(
    scores=None, noise=None, tau: float = 1.0, row: int = 0, seed: int = 0
) -> Explorer:
    """Chapter 3's temperature explorer for the static site, on the chapter's
    scores and Gumbel noise (``data.temperature_inputs``: random ones from ``seed``
    where None): the map of y = softmax((s + g) / tau), and one row beside
    softmax(s)."""
    from attention import plots

    s, g = temperature_inputs(scores, noise, seed)
    check(settings(s.shape[0]), tau=tau, row=row)
    grid = temperature_grid(s, g)
    soft, hard_c = plots.SELECTION_COLORS["soft"], plots.SELECTION_COLORS["hard"]
    n_q, n_k = grid["shape"]
    tau_i = _tau_index(tau)
    config = {
        "grid": grid,
        "init": {"tau": tau_i, "row": int(row)},
        "specs": {"map": heatmap_spec(hard_c), "row": weights_row_spec(soft, hard_c)},
        "shape": [n_q, n_k],
    }
    return Explorer(
        "temperature",
        config,
        "Gumbel-softmax temperature (chapter 3)",
        "explorers.temperature_explorer(scores=S_map, noise=G_map)",
    )


def live_temperature_explorer(
    scores=None, noise=None, tau: float = 1.0, row: int = 0, seed: int = 0
):
    """A log slider for the Gumbel-softmax temperature tau (and one for the query row).

    Each change redraws ``attention.plots.gumbel_softmax_figure`` with the SAME scores
    and Gumbel noise, so only tau moves the weights: uniform for large tau, one-hot (the
    Gumbel-max sample) as tau -> 0. Default scores: a random (8, 12) matrix. Returns
    the box.
    """
    import ipywidgets as widgets

    from attention import plots

    s, g = temperature_inputs(scores, noise, seed)
    check(settings(s.shape[0]), tau=tau, row=row)
    tau_s, row_s = controls(
        settings(s.shape[0]), dict(tau=tau, row=row), continuous_update=False
    ).values()
    out = widgets.Output()

    def redraw(change=None):
        show_png(
            out,
            live_png(
                plots.gumbel_softmax_figure, s, g, tau=tau_s.value, row=row_s.value
            ),
        )

    for w in (tau_s, row_s):
        w.observe(redraw, names="value")
    redraw()
    return widgets.VBox([widgets.HBox([tau_s, row_s]), out])


def temperature_explorer(
    scores=None, noise=None, tau: float = 1.0, row: int = 0, seed: int = 0
):
    """Chapter 3: y = softmax((s + g) / tau) over a temperature slider, with the SAME
    scores and Gumbel noise at every tau (random (8, 12) ones from ``seed`` where
    None), and one query row beside softmax(s). The static twin on the built site,
    ipywidgets elsewhere."""
    face = static_temperature_explorer if site.ON_SITE else live_temperature_explorer
    return face(scores=scores, noise=noise, tau=tau, row=row, seed=seed)


__all__ = ["temperature_explorer", "temperature_grid", "temperature_inputs"]
