"""Chapter 3's gradient-estimator explorer: REINFORCE, REINFORCE with a baseline and
Gumbel-softmax straight-through at a chosen temperature and number of samples per
estimate -> the histogram of the estimates of one logit's gradient, their mean beside
the true gradient, and each estimator's bias and spread.

The problem is the chapter's small one: a choice z ~ softmax(s) over N positions costs
f(z); the true gradient of E[f(z)] is ``attention.hard.expected_loss_grad``. Every
estimate is drawn here, in Python, from a seed per setting: Gumbel-softmax ST by
``attention.hard`` (``gumbel``, ``straight_through_grad``), REINFORCE's means from how
often each position was drawn (``reinforce_mean``, which the tests check against the
mean of ``hard.reinforce_grad``'s estimates on the same draws), and the page gets the
histograms (the page's script only looks them up). One call, ``estimator_explorer``:
the static twin on the site, ipywidgets in Jupyter and Colab.
"""

from __future__ import annotations

import functools

import numpy as np

from attention import core, hard
from attention.plots import live

from . import site
from .common import BLUE, FONT, GREY, ORANGE, RED, frame, live_png, show_png
from .settings import Choice, Range, check, controls
from .site import Explorer

METHODS = ["REINFORCE", "REINFORCE + baseline", "Gumbel-softmax ST"]
TAUS = [0.1, 0.25, 0.5, 1.0, 2.0, 5.0]
SAMPLES = [1, 4, 16, 64]
#: Estimates per setting (each the mean of n_samples single-draw estimates), and bins.
DRAWS, BINS, SEED = 2000, 30, 0
#: The chapter's example (chapter 3): logits and the loss of each choice.
LOGITS = (0.3, -0.5, 1.2, 0.0)
LOSSES = (1.0, 4.0, 2.5, 3.0)

_COLORS = {
    "REINFORCE": RED,
    "REINFORCE + baseline": ORANGE,
    "Gumbel-softmax ST": BLUE,
}


def settings(n: int) -> dict:
    """The settings both faces take, for ``n`` logits (the static grid covers exactly
    these)."""
    return {
        "method": Choice(METHODS, label="estimator"),
        "tau": Choice(TAUS, label="temperature τ", widget="slider"),
        "n_samples": Choice(SAMPLES, label="samples per estimate", widget="slider"),
        "component": Range(0, n - 1, label="logit j"),
    }


def _check(logits, losses, method, tau, n_samples, component=0):
    s = core.as_real_array("logits", logits, 1).astype(float)
    f = core.as_real_array("losses", losses, 1).astype(float)
    if s.ndim != 1 or f.shape != s.shape:
        raise ValueError(
            f"logits and losses must be (N,) alike, got {s.shape}, {f.shape}"
        )
    check(
        settings(len(s)),
        method=method,
        tau=tau,
        n_samples=n_samples,
        component=component,
    )
    return s, f


def estimates(
    logits,
    losses,
    method: str,
    tau: float = 1.0,
    n_samples: int = 1,
    draws: int = DRAWS,
) -> np.ndarray:
    """``draws`` estimates (draws, N) of d E[f(z)] / d logits, each the mean of
    ``n_samples`` single-draw estimates, from a seed fixed per (method, tau,
    n_samples). The baseline is b = E_p[f]; ST's loss is linear in the one-hot, so
    dL/dy = f."""
    s, f = _check(logits, losses, method, tau, n_samples)
    key = (tuple(s.tolist()), tuple(f.tolist()), method, tau, n_samples, draws)
    return _estimates(*key).copy()


@functools.lru_cache(maxsize=64)
def _estimates(s, f, method, tau, n_samples, draws) -> np.ndarray:
    """``estimates`` of one setting (its seed fixed: the same numbers every call),
    kept: a live move of the component or the method draws without recomputing."""
    s, f = np.array(s), np.array(f)
    rng = np.random.default_rng(
        [SEED, METHODS.index(method), TAUS.index(tau), n_samples]
    )
    n = draws * n_samples
    rows = np.broadcast_to(s, (n, len(s)))
    if method == "Gumbel-softmax ST":
        y = core.softmax((rows + hard.gumbel(rows.shape, rng)) / tau, axis=-1)
        g = hard.straight_through_grad(y, np.broadcast_to(f, y.shape), tau)
        return g.reshape(draws, n_samples, len(s)).mean(axis=1)
    p = core.softmax(s)
    b = float(p @ f) if method == "REINFORCE + baseline" else 0.0
    # How often each position is drawn in n_samples draws: all the mean depends on.
    counts = rng.multinomial(n_samples, p, size=draws)  # (draws, N)
    return reinforce_mean(counts, p, f, b)


def reinforce_mean(counts, p, f, b: float = 0.0) -> np.ndarray:
    """The mean of ``hard.reinforce_grad``'s single-draw estimates (f(z) - b)(e_z - p)
    over draws that picked position z ``counts[..., z]`` times: each draw's estimate
    depends on the draw only through z, so the mean is
    sum_z c_z (f_z - b)(e_z - p) / sum_z c_z. One multinomial draw of the counts
    replaces n_samples categorical draws (the same distribution; 64 samples per
    estimate in milliseconds, not a tenth of a second: the live explorer's move)."""
    counts = np.asarray(counts, dtype=float)
    w = counts * (np.asarray(f, dtype=float) - b) / counts.sum(-1, keepdims=True)
    return w - np.asarray(p, dtype=float) * w.sum(-1, keepdims=True)


def summary(g: np.ndarray, true: np.ndarray) -> dict:
    """Mean, bias (mean - true), standard deviation and the standard error of the
    mean, per component."""
    mean = g.mean(0)
    std = g.std(0)
    return {"mean": mean, "bias": mean - true, "std": std, "se": std / np.sqrt(len(g))}


def histogram(x: np.ndarray) -> dict:
    """BINS equal bins over [min, max] of x (a point mass gets a bin of width 1e-9)."""
    lo, hi = float(x.min()), float(x.max())
    if hi - lo < 1e-12:
        lo, hi = lo - 5e-10, hi + 5e-10
    counts, _ = np.histogram(x, bins=BINS, range=(lo, hi))
    return {"lo": lo, "hi": hi, "counts": counts.tolist()}


def _r(x):
    return float(f"{x:.6g}")


def estimator_grid(logits=LOGITS, losses=LOSSES) -> dict:
    """Every setting: ``runs[key]`` with key "method index,tau index,samples index"
    (tau index 0 for REINFORCE, which has no tau) -> per component j a histogram and
    the mean, bias, std and se; ``true``: the exact gradient."""
    s, f = _check(logits, losses, METHODS[0], TAUS[0], SAMPLES[0])
    true = hard.expected_loss_grad(s, f)
    runs = {}
    for mi, method in enumerate(METHODS):
        for ti, tau in enumerate(TAUS if method == "Gumbel-softmax ST" else TAUS[:1]):
            for si, n_samples in enumerate(SAMPLES):
                g = estimates(s, f, method, tau, n_samples)
                st = summary(g, true)
                runs[f"{mi},{ti},{si}"] = [
                    {
                        "hist": {
                            k: (v if k == "counts" else _r(v))
                            for k, v in histogram(g[:, j]).items()
                        },
                        **{k: _r(st[k][j]) for k in ("mean", "bias", "std", "se")},
                    }
                    for j in range(len(s))
                ]
    return {
        "methods": METHODS,
        "taus": TAUS,
        "samples": SAMPLES,
        "draws": DRAWS,
        "logits": s.tolist(),
        "losses": f.tolist(),
        "p": core.softmax(s).tolist(),
        "true": [_r(x) for x in true],
        "runs": runs,
    }


def _specs() -> dict:
    hist = {
        **frame(230),
        "layer": [
            {
                "data": {"name": "hist"},
                "mark": {
                    "type": "rect",
                    "color": GREY,
                    "stroke": "#222",
                    "strokeWidth": 0.3,
                },
                "encoding": {
                    "x": {
                        "field": "x0",
                        "type": "quantitative",
                        "title": "estimate of ∂E[f]/∂s_j",
                        "axis": {"format": ".3~g"},
                    },
                    "x2": {"field": "x1"},
                    "y": {
                        "field": "count",
                        "type": "quantitative",
                        "title": "estimates",
                    },
                    "y2": {"datum": 0},
                    "tooltip": [
                        {
                            "field": "x0",
                            "type": "quantitative",
                            "format": ".3f",
                            "title": "from",
                        },
                        {
                            "field": "x1",
                            "type": "quantitative",
                            "format": ".3f",
                            "title": "to",
                        },
                        {"field": "count"},
                    ],
                },
            },
            {
                "data": {"name": "lines"},
                "mark": {"type": "rule", "strokeWidth": 2.5},
                "encoding": {
                    "x": {"field": "x", "type": "quantitative"},
                    "color": {
                        "field": "what",
                        "type": "nominal",
                        "title": None,
                        "scale": {
                            "domain": ["mean of the estimates", "true gradient"],
                            "range": [RED, "#111111"],
                        },
                        "legend": {"orient": "top"},
                    },
                    "strokeDash": {
                        "field": "what",
                        "type": "nominal",
                        "legend": None,
                        "scale": {
                            "domain": ["mean of the estimates", "true gradient"],
                            "range": [[1, 0], [5, 3]],
                        },
                    },
                },
            },
        ],
        **FONT,
    }
    bars = {
        **frame(230),
        "data": {"name": "bars"},
        "mark": {"type": "bar", "stroke": "#222", "strokeWidth": 0.4},
        "encoding": {
            "x": {
                "field": "method",
                "type": "nominal",
                "sort": METHODS,
                "title": None,
                "axis": {
                    "labelAngle": 0,
                    "labelLimit": 120,
                    # two lines each: the three names fit at 390 px
                    "labelExpr": "split(replace(datum.label, ' + ', ' +'), ' ')",
                },
            },
            "xOffset": {"field": "stat", "type": "nominal", "sort": ["|bias|", "std"]},
            "y": {
                "field": "value",
                "type": "quantitative",
                "title": "for this component",
            },
            "color": {
                "field": "method",
                "type": "nominal",
                "legend": None,
                "scale": {"domain": METHODS, "range": [_COLORS[m] for m in METHODS]},
            },
            "opacity": {
                "field": "stat",
                "type": "nominal",
                "title": None,
                "scale": {"domain": ["|bias|", "std"], "range": [1.0, 0.4]},
                "legend": {"orient": "top"},
            },
            "tooltip": [
                {"field": "method"},
                {"field": "stat"},
                {"field": "value", "type": "quantitative", "format": ".4f"},
            ],
        },
        **FONT,
    }
    return {"hist": hist, "bars": bars}


def static_estimator_explorer(
    logits=LOGITS,
    losses=LOSSES,
    method="Gumbel-softmax ST",
    tau=1.0,
    n_samples=1,
    component=2,
) -> Explorer:
    """The static site's twin of ``estimator_explorer``."""
    _check(logits, losses, method, tau, n_samples, component)
    init = {
        "method": METHODS.index(method),
        "tau": TAUS.index(tau),
        "samples": SAMPLES.index(n_samples),
        "j": component,
    }
    return Explorer(
        "estimators",
        {"grid": estimator_grid(logits, losses), "init": init, "specs": _specs()},
        "Gradient estimators (chapter 3)",
        "explorers.estimator_explorer()",
    )


#: ``estimator_figure``'s panels, laid out once: the margins ``tight_layout`` asks for
#: at the widest labels over the settings (a method, tau, samples, component grid;
#: the tests check the corners), so a live move lays nothing out.
ESTIMATOR_PANELS = dict(
    figsize=(11, 3.6),
    gridspec_kw=dict(left=0.073, right=0.986, bottom=0.163, top=0.899, wspace=0.16),
)


def estimator_figure(logits, losses, method, tau, n_samples, component):
    """The live figure: the histogram with its mean and the true gradient, and the
    |bias| and std of each method for this component."""
    s, f = _check(logits, losses, method, tau, n_samples, component)
    true = hard.expected_loss_grad(s, f)
    j = component
    fig, (a0, a1) = live.subplots(1, 2, **ESTIMATOR_PANELS)
    g = estimates(s, f, method, tau, n_samples)
    a0.hist(g[:, j], bins=BINS, color=GREY, ec="#222", lw=0.3)
    a0.axvline(g[:, j].mean(), color=RED, lw=2.5, label="mean of the estimates")
    a0.axvline(true[j], color="#111", ls="--", lw=2, label="true gradient")
    a0.set(
        xlabel=f"estimate of ∂E[f]/∂s_{j}",
        ylabel="estimates",
        title=f"{method}"
        + (f", τ = {tau}" if "Gumbel" in method else "")
        + f", {n_samples} per estimate",
    )
    a0.legend(fontsize=7)
    x = np.arange(len(METHODS))
    st = [summary(estimates(s, f, m, tau, n_samples), true) for m in METHODS]
    a1.bar(
        x - 0.2,
        [abs(t["bias"][j]) for t in st],
        0.4,
        color=[_COLORS[m] for m in METHODS],
        label="|bias|",
    )
    a1.bar(
        x + 0.2,
        [t["std"][j] for t in st],
        0.4,
        alpha=0.4,
        color=[_COLORS[m] for m in METHODS],
        label="std",
    )
    a1.set_xticks(x, labels=METHODS, fontsize=8)
    a1.set(title=f"component {j}: |bias| (solid) and std (light)")
    return fig


def estimator_readout(logits, losses, method, tau, n_samples, component) -> str:
    s, f = _check(logits, losses, method, tau, n_samples, component)
    true = hard.expected_loss_grad(s, f)
    st = summary(estimates(s, f, method, tau, n_samples), true)
    j = component
    return (
        f"{method}"
        + (f" at τ = {tau}" if "Gumbel" in method else "")
        + f", {n_samples} samples per estimate, {DRAWS} estimates: mean "
        f"{st['mean'][j]:.4f} against the true {true[j]:.4f}, bias "
        f"{st['bias'][j]:+.4f} (standard error {st['se'][j]:.4f}), "
        f"std {st['std'][j]:.4f}."
    )


def live_estimator_explorer(
    logits=LOGITS,
    losses=LOSSES,
    method="Gumbel-softmax ST",
    tau=1.0,
    n_samples=1,
    component=2,
):
    """ipywidgets: each change redraws ``estimator_figure`` and the text."""
    import ipywidgets as widgets

    s, _ = _check(logits, losses, method, tau, n_samples, component)
    values = dict(method=method, tau=tau, n_samples=n_samples, component=component)
    ctl = controls(settings(len(s)), values)
    text, out = widgets.HTML(), widgets.Output()

    def redraw(change=None):
        kw = {k: w.value for k, w in ctl.items()}
        ctl["tau"].disabled = "Gumbel" not in kw["method"]
        text.value = "<p>" + estimator_readout(logits, losses, **kw) + "</p>"
        show_png(out, live_png(estimator_figure, logits, losses, **kw))

    for w in ctl.values():
        w.observe(redraw, names="value")
    redraw()
    items = list(ctl.values())
    return widgets.VBox([widgets.HBox(items[:2]), widgets.HBox(items[2:]), text, out])


def estimator_explorer(
    logits=LOGITS,
    losses=LOSSES,
    method: str = "Gumbel-softmax ST",
    tau: float = 1.0,
    n_samples: int = 1,
    component: int = 2,
):
    """Chapter 3: gradient estimates of E_{z ~ softmax(logits)}[losses[z]]; the static
    twin on the built site, ipywidgets elsewhere."""
    face = static_estimator_explorer if site.ON_SITE else live_estimator_explorer
    return face(
        logits,
        losses,
        method=method,
        tau=tau,
        n_samples=n_samples,
        component=component,
    )


__all__ = ["estimates", "estimator_explorer", "estimator_grid", "histogram", "summary"]
