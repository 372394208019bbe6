"""Chapter 2's online softmax explorer: one row of scores streamed in blocks (the
running max m, the sum ℓ, the rescale factor α and the accumulator after each block,
beside the exact softmax they converge to). Its data (``online_steps``, the loop of
``attention.flash.softmax_1pass_attention`` one block at a time), specs, static twin
and ipywidgets face, one call.
"""

from __future__ import annotations

import numpy as np

from attention import core
from attention.plots import live

from . import site
from .common import (
    AMBER,
    BLUE,
    FONT,
    GREY,
    RED,
    frame,
    live_png,
    one_picture_per_move,
    show_png,
)
from .settings import Choice, Range, check, controls
from .site import Explorer

#: The online softmax's row: N_ROW scores and values of width D_V, from SEED.
N_ROW, D_V, SEED = 24, 3, 2
#: Block sizes the control offers (the divisors of N_ROW and two that leave a ragged
#: last block).
BLOCKS = [1, 2, 3, 4, 5, 6, 8, 12, 24]


def settings(block) -> dict:
    """The settings both faces take: a block size of ``BLOCKS`` and, for a valid one,
    a step among its ceil(N_ROW / block) blocks."""
    steps = -(-N_ROW // block) if block in BLOCKS else 1
    return {
        "block": Choice(BLOCKS, label="block size"),
        "step": Range(0, steps - 1, label="block step"),
    }


def _check(block, step) -> None:
    check(settings(block), block=block)
    check(settings(block), step=step)


def default_row(seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """Scores (N_ROW,) that climb, so the running max moves several times, and values
    (N_ROW, D_V)."""
    rng = np.random.default_rng(seed)
    s = rng.normal(size=N_ROW) * 1.5 + np.linspace(-1.0, 2.0, N_ROW)
    return s, rng.normal(size=(N_ROW, D_V))


def online_steps(s, v, block: int) -> list[dict]:
    """The state after each block of ``softmax_1pass_attention``'s loop, for one row
    s (N,) with values v (N, d_v): the keys [a, b) of the block, the running max m, the
    rescale factor α = exp(m_old - m) that multiplied ℓ and acc, ℓ, acc and the
    weights exp(s_j - m) / ℓ of the keys seen so far (0 for the others)."""
    s, v = core.as_real_array("s", s, 1), core.as_real_array("v", v, 2)
    if s.ndim != 1 or v.shape[0] != s.shape[0]:
        raise ValueError(f"s must be (N,) and v (N, d_v), got {s.shape}, {v.shape}")
    block = core.check_int("block", block, 1)
    n = len(s)
    m, ell, acc = -np.inf, 0.0, np.zeros(v.shape[1])
    out = []
    for a in range(0, n, block):
        b = min(a + block, n)
        m_new = max(m, float(s[a:b].max()))
        alpha = float(np.exp(m - m_new))  # exp(-inf) = 0 at the first block
        p = np.exp(s[a:b] - m_new)  # (b - a,)
        ell = ell * alpha + float(p.sum())
        acc = acc * alpha + p @ v[a:b]
        m = m_new
        w = np.zeros(n)
        w[:b] = np.exp(s[:b] - m) / ell
        out.append(
            {
                "a": a,
                "b": b,
                "m": m,
                "alpha": alpha,
                "l": ell,
                "acc": acc.copy(),
                "w": w,
            }
        )
    return out


def _r(x, digits: int = 6) -> float:
    return float(f"{x:.{digits}g}")


def online_grid(s=None, v=None) -> dict:
    """The static twin's data: the row, its exact softmax and output (by
    ``core.softmax``), and ``online_steps`` at every block size, 6 significant
    digits."""
    if s is None or v is None:
        s, v = default_row()
    p = core.softmax(np.asarray(s, dtype=float))
    runs = []
    for block in BLOCKS:
        runs.append(
            [
                {
                    "a": st["a"],
                    "b": st["b"],
                    "m": _r(st["m"]),
                    "alpha": _r(st["alpha"]),
                    "l": _r(st["l"]),
                    "acc": [_r(x) for x in st["acc"]],
                    "w": [_r(x) for x in st["w"]],
                }
                for st in online_steps(s, v, block)
            ]
        )
    return {
        "s": [_r(x) for x in s],
        "p": [_r(x) for x in p],
        "o": [_r(x) for x in p @ np.asarray(v)],
        "blocks": BLOCKS,
        "runs": runs,
    }


def _online_specs() -> dict:
    status = ["seen", "this block", "not yet"]
    colors = [BLUE, AMBER, "#D0D0D0"]
    scores = {
        **frame(200),
        "layer": [
            {
                "data": {"name": "keys"},
                "mark": {"type": "bar", "stroke": "#222", "strokeWidth": 0.4},
                "encoding": {
                    "x": {
                        "field": "j",
                        "type": "ordinal",
                        "title": "key j",
                        "axis": {"labelAngle": 0, "labelOverlap": True},
                    },
                    "y": {"field": "s", "type": "quantitative", "title": "score s_j"},
                    "color": {
                        "field": "status",
                        "type": "nominal",
                        "title": None,
                        "scale": {"domain": status, "range": colors},
                        "legend": {"orient": "top"},
                    },
                    "tooltip": [
                        {"field": "j"},
                        {"field": "s", "type": "quantitative", "format": ".3f"},
                    ],
                },
            },
            {
                "data": {"name": "max"},
                "mark": {"type": "rule", "strokeWidth": 2},
                "encoding": {
                    "y": {"field": "y", "type": "quantitative"},
                    "strokeDash": {
                        "field": "what",
                        "type": "nominal",
                        "title": None,
                        "scale": {
                            "domain": ["running max m", "final max"],
                            "range": [[1, 0], [4, 3]],
                        },
                        "legend": {"orient": "bottom"},
                    },
                    "color": {"value": RED},
                },
            },
        ],
        **FONT,
    }
    weights = {
        **frame(200),
        "layer": [
            {
                "data": {"name": "keys"},
                "mark": {"type": "bar", "stroke": "#222", "strokeWidth": 0.4},
                "encoding": {
                    "x": {
                        "field": "j",
                        "type": "ordinal",
                        "title": "key j",
                        "axis": {"labelAngle": 0, "labelOverlap": True},
                    },
                    "y": {
                        "field": "w",
                        "type": "quantitative",
                        "title": "exp(s_j − m) / ℓ so far",
                    },
                    "color": {
                        "field": "status",
                        "type": "nominal",
                        "legend": None,
                        "scale": {"domain": status, "range": colors},
                    },
                    "tooltip": [
                        {"field": "j"},
                        {
                            "field": "w",
                            "type": "quantitative",
                            "format": ".4f",
                            "title": "so far",
                        },
                        {
                            "field": "p",
                            "type": "quantitative",
                            "format": ".4f",
                            "title": "exact softmax",
                        },
                    ],
                },
            },
            {
                "data": {"name": "keys"},
                "mark": {"type": "tick", "color": "#111", "thickness": 2},
                "encoding": {
                    "x": {"field": "j", "type": "ordinal"},
                    "y": {"field": "p", "type": "quantitative"},
                },
            },
        ],
        **FONT,
    }
    state = {
        **frame(200),
        "layer": [
            {
                "data": {"name": "state"},
                "mark": {"type": "line", "point": {"size": 30}, "strokeWidth": 2},
                "encoding": {
                    "x": {
                        "field": "step",
                        "type": "quantitative",
                        "title": "block",
                        "axis": {"tickMinStep": 1, "format": "d"},
                    },
                    "y": {"field": "value", "type": "quantitative", "title": None},
                    "color": {
                        "field": "what",
                        "type": "nominal",
                        "title": None,
                        "scale": {
                            "domain": ["m", "ℓ", "α"],
                            "range": [RED, GREY, AMBER],
                        },
                        "legend": {"orient": "top"},
                    },
                    "tooltip": [
                        {"field": "what"},
                        {"field": "step"},
                        {"field": "value", "type": "quantitative", "format": ".4f"},
                    ],
                },
            },
            {
                "data": {"name": "now"},
                "mark": {"type": "rule", "color": GREY, "strokeDash": [4, 3]},
                "encoding": {"x": {"field": "step", "type": "quantitative"}},
            },
        ],
        **FONT,
    }
    return {"scores": scores, "weights": weights, "state": state}


def static_online_softmax_explorer(block: int = 4, step: int = 0) -> Explorer:
    """The static site's twin of ``online_softmax_explorer``."""
    _check(block, step)
    config = {
        "grid": online_grid(),
        "init": {"block": BLOCKS.index(block), "step": step},
        "specs": _online_specs(),
    }
    return Explorer(
        "online",
        config,
        "The online softmax, block by block (chapter 2)",
        "explorers.online_softmax_explorer()",
    )


#: ``online_figure``'s panels, laid out once: the margins ``tight_layout`` asks for at
#: the widest labels over every block size and step (the tests check them all), so a
#: live move lays nothing out.
ONLINE_PANELS = dict(
    figsize=(12, 3.4),
    gridspec_kw=dict(left=0.054, right=0.976, bottom=0.172, top=0.893, wspace=0.21),
)


def online_figure(block: int, step: int):
    """The live explorer's figure: the scores with the running max, the weights so
    far against the exact softmax, and m, ℓ, α over the blocks."""

    s, v = default_row()
    steps = online_steps(s, v, block)
    st = steps[step]
    p = core.softmax(s)
    j = np.arange(len(s))
    color = np.where(j < st["a"], BLUE, np.where(j < st["b"], AMBER, "#D0D0D0"))
    fig, (a0, a1, a2) = live.subplots(1, 3, **ONLINE_PANELS)
    a0.bar(j, s, color=color, ec="#222", lw=0.4)
    a0.axhline(st["m"], color=RED, lw=2, label="running max m")
    a0.axhline(s.max(), color=RED, ls="--", lw=1, label="final max")
    a0.set(xlabel="key j", ylabel="score", title=f"block {step + 1} of {len(steps)}")
    a0.legend(fontsize=7)
    a1.bar(j, st["w"], color=color, ec="#222", lw=0.4)
    a1.scatter(j, p, marker="_", s=120, color="#111", label="exact softmax")
    a1.set(xlabel="key j", title="exp(s_j − m) / ℓ so far")
    a1.legend(fontsize=7)
    k = np.arange(1, len(steps) + 1)
    for key, name, c in (
        ("m", "m", RED),
        ("l", "ℓ", GREY),
        ("alpha", "α", AMBER),
    ):
        a2.plot(k, [x[key] for x in steps], "o-", color=c, label=name)
    a2.axvline(step + 1, color=GREY, ls="--")
    a2.set(xlabel="block", title="the running state")
    a2.legend(fontsize=7)
    return fig


def online_readout(block: int, step: int) -> str:
    s, v = default_row()
    steps = online_steps(s, v, block)
    st = steps[step]
    o = core.softmax(s) @ v
    acc = ", ".join(f"{x:.3f}" for x in st["acc"])
    out = ", ".join(f"{x:.3f}" for x in st["acc"] / st["l"])
    exact = ", ".join(f"{x:.3f}" for x in o)
    return (
        f"block {step + 1} of {len(steps)} (keys {st['a']} to {st['b'] - 1}): "
        f"m = {st['m']:.3f}, α = {st['alpha']:.3f}, ℓ = {st['l']:.3f}; "
        f"acc = [{acc}], acc / ℓ = [{out}]; exact output [{exact}]."
    )


def live_online_softmax_explorer(block: int = 4, step: int = 0):
    """ipywidgets: block size and step redraw ``online_figure`` and the text."""
    import ipywidgets as widgets

    _check(block, step)
    w_block, w_step = controls(settings(block), dict(block=block, step=step)).values()
    text, out = widgets.HTML(), widgets.Output()

    @one_picture_per_move  # a step clamped by the new block count: one picture
    def redraw(change=None):
        w_step.max = -(-N_ROW // w_block.value) - 1
        text.value = "<p>" + online_readout(w_block.value, w_step.value) + "</p>"
        show_png(out, live_png(online_figure, w_block.value, w_step.value))

    w_block.observe(redraw, names="value")
    w_step.observe(redraw, names="value")
    redraw()
    return widgets.VBox([widgets.HBox([w_block, w_step]), text, out])


def online_softmax_explorer(block: int = 4, step: int = 0):
    """Chapter 2: one row of scores streamed ``block`` keys at a time; the static twin
    on the built site, ipywidgets elsewhere."""
    face = (
        static_online_softmax_explorer if site.ON_SITE else live_online_softmax_explorer
    )
    return face(block=block, step=step)


__all__ = ["default_row", "online_grid", "online_softmax_explorer", "online_steps"]
