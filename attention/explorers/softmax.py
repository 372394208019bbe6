"""Chapter 2's picture explorers: the online softmax step by step (one row of scores
streamed in blocks: the running max m, the sum ℓ, the rescale factor α and the
accumulator after each block, beside the exact softmax they converge to) and the
roofline (GPU, N, d, dtype, algorithm -> the point of the simulated and of the
compulsory traffic under that GPU's roofs).

Two calls, ``online_softmax_explorer`` and ``roofline_explorer``: the static twin on
the site (every number computed here: the online softmax by ``online_steps``, the loop
of ``attention.flash.softmax_1pass_attention`` one block at a time; the roofline by
``attention.memory``; the page's script only looks rows up) and ipywidgets in Jupyter.
"""

from __future__ import annotations

import numpy as np

from attention import core, memory
from attention.memory import ring as _mring

from . import site
from .site import Explorer, check_option
from .specs import _FONT, _frame

#: The online softmax's row: N_ROW scores and values of width D_V, from SEED.
N_ROW, D_V, SEED = 24, 3, 2
#: Block sizes the control offers (the divisors of N_ROW and two that leave a ragged
#: last block).
BLOCKS = [1, 2, 3, 4, 5, 6, 8, 12, 24]

#: The roofline's controls (the static grid covers exactly these).
ROOF_GPUS = ["A100", "H100", "H200"]  # the GPUs with a published TF32 peak too
ROOF_N = [256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536]
ROOF_D = [64, 128, 256]
ROOF_DTYPES = ["float16", "bfloat16", "float32"]
ROOF_ALGS = [
    "standard",
    "flash1",
    "flash2",
    "standard_bwd",
    "flash2_bwd",
    "flash2_bwd_split",
]
#: The tiles of the simulated traffic (the chapter's).
ROOF_TILE = 64


# ---------------------------------------------------------------------------------
# The online softmax
# ---------------------------------------------------------------------------------


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
    colors = ["#4C72B0", "#FFA600", "#D0D0D0"]
    scores = {
        **_frame(200),
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
                    "color": {"value": "#C44E52"},
                },
            },
        ],
        **_FONT,
    }
    weights = {
        **_frame(200),
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
        **_FONT,
    }
    state = {
        **_frame(200),
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
                            "range": ["#C44E52", "#8C8C8C", "#FFA600"],
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
                "mark": {"type": "rule", "color": "#8C8C8C", "strokeDash": [4, 3]},
                "encoding": {"x": {"field": "step", "type": "quantitative"}},
            },
        ],
        **_FONT,
    }
    return {"scores": scores, "weights": weights, "state": state}


def static_online_softmax_explorer(block: int = 4, step: int = 0) -> Explorer:
    """The static site's twin of ``online_softmax_explorer``."""
    if block not in BLOCKS:
        raise ValueError(f"block must be one of {BLOCKS}, got {block!r}")
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


def online_figure(block: int, step: int):
    """The live explorer's figure: the scores with the running max, the weights so
    far against the exact softmax, and m, ℓ, α over the blocks."""
    import matplotlib.pyplot as plt

    s, v = default_row()
    steps = online_steps(s, v, block)
    st = steps[step]
    p = core.softmax(s)
    j = np.arange(len(s))
    color = np.where(
        j < st["a"], "#4C72B0", np.where(j < st["b"], "#FFA600", "#D0D0D0")
    )
    fig, (a0, a1, a2) = plt.subplots(1, 3, figsize=(12, 3.4))
    a0.bar(j, s, color=color, ec="#222", lw=0.4)
    a0.axhline(st["m"], color="#C44E52", lw=2, label="running max m")
    a0.axhline(s.max(), color="#C44E52", ls="--", lw=1, label="final max")
    a0.set(xlabel="key j", ylabel="score", title=f"block {step + 1} of {len(steps)}")
    a0.legend(fontsize=7)
    a1.bar(j, st["w"], color=color, ec="#222", lw=0.4)
    a1.scatter(j, p, marker="_", s=120, color="#111", label="exact softmax")
    a1.set(xlabel="key j", title="exp(s_j − m) / ℓ so far")
    a1.legend(fontsize=7)
    k = np.arange(1, len(steps) + 1)
    for key, name, c in (
        ("m", "m", "#C44E52"),
        ("l", "ℓ", "#8C8C8C"),
        ("alpha", "α", "#FFA600"),
    ):
        a2.plot(k, [x[key] for x in steps], "o-", color=c, label=name)
    a2.axvline(step + 1, color="#8C8C8C", ls="--")
    a2.set(xlabel="block", title="the running state")
    a2.legend(fontsize=7)
    fig.tight_layout()
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

    from .live import _show_figure

    if block not in BLOCKS:
        raise ValueError(f"block must be one of {BLOCKS}, got {block!r}")
    style = {"description_width": "initial"}
    w_block = widgets.Dropdown(
        options=BLOCKS, value=block, description="block size", style=style
    )
    w_step = widgets.IntSlider(
        value=step,
        min=0,
        max=-(-N_ROW // block) - 1,
        description="block step",
        style=style,
    )
    text, out = widgets.HTML(), widgets.Output()

    def redraw(change=None):
        w_step.max = -(-N_ROW // w_block.value) - 1
        text.value = "<p>" + online_readout(w_block.value, w_step.value) + "</p>"
        _show_figure(out, online_figure(w_block.value, w_step.value))

    w_block.observe(redraw, names="value")
    w_step.observe(redraw, names="value")
    redraw()
    return widgets.VBox([widgets.HBox([w_block, w_step]), text, out])


def online_softmax_explorer(block: int = 4, step: int = 0):
    """Chapter 2: one row of scores streamed ``block`` keys at a time; the static twin
    on the built site, ipywidgets elsewhere."""
    if site.ON_SITE:
        return static_online_softmax_explorer(block, step)
    return live_online_softmax_explorer(block, step)


# ---------------------------------------------------------------------------------
# The roofline
# ---------------------------------------------------------------------------------


def roof(gpu: str, dtype: str) -> dict:
    """The GPU's peak FLOP/s for ``dtype`` (TF32 for float32) and HBM bytes/s."""
    return {
        "peak": _mring.peak_flops(gpu, dtype),
        "bw": memory.GPUS[gpu].hbm_tbps * 1e12,
    }


def roofline_point(gpu: str, N: int, d: int, dtype: str, algorithm: str) -> dict:
    """FLOPs, bytes (simulated with 64 x 64 tiles, no L2; and compulsory), arithmetic
    intensity and attainable FLOP/s = min(peak, intensity x bandwidth) of one head,
    and the roofline's time ESTIMATE."""
    bpe = _mring.DTYPE_BYTES[dtype]
    flops = memory.matmul_flops(algorithm, N, d)
    r = roof(gpu, dtype)
    out = {"flops": flops}
    for name, t in (
        ("sim", memory.closed_form(algorithm, N, d, Br=ROOF_TILE, Bc=ROOF_TILE)),
        ("comp", memory.compulsory(algorithm, N, d)),
    ):
        by = t.bytes(bpe)
        ai = memory.arithmetic_intensity(flops, by)
        out[name] = {
            "bytes": by,
            "ai": ai,
            "flops_s": min(r["peak"], ai * r["bw"]),
            "us": max(flops / r["peak"], by / r["bw"]) * 1e6,
        }
    return out


def roofline_grid() -> dict:
    """``roofline_point`` at every setting: ``rows[ig][iN][id][it][ia]`` = [simulated
    intensity, attainable TFLOP/s, µs, compulsory intensity, TFLOP/s, µs] (5
    significant digits), ``roofs[ig][it]`` = ``roof_line``."""
    rows = [
        [
            [
                [
                    [
                        [
                            _r(v, 5)
                            for k in ("sim", "comp")
                            for v in (p[k]["ai"], p[k]["flops_s"] / 1e12, p[k]["us"])
                        ]
                        for p in (roofline_point(g, n, d, t, a) for a in ROOF_ALGS)
                    ]
                    for t in ROOF_DTYPES
                ]
                for d in ROOF_D
            ]
            for n in ROOF_N
        ]
        for g in ROOF_GPUS
    ]
    roofs = [[roof_line(g, t) for t in ROOF_DTYPES] for g in ROOF_GPUS]
    return {
        "gpus": ROOF_GPUS,
        "gpu_names": [memory.GPUS[g].name for g in ROOF_GPUS],
        "N": ROOF_N,
        "d": ROOF_D,
        "dtypes": ROOF_DTYPES,
        "algs": ROOF_ALGS,
        "rows": rows,
        "roofs": roofs,
        "tile": ROOF_TILE,
    }


#: The intensity axis of the roof (FLOPs per byte).
ROOF_X = [1.0, 1e5]


def roof_line(gpu: str, dtype: str) -> list[list[float]]:
    """The roof as [intensity, TFLOP/s] at the axis' ends and at the ridge."""
    r = roof(gpu, dtype)
    return [
        [_r(x, 5), _r(min(r["peak"], x * r["bw"]) / 1e12, 5)]
        for x in (ROOF_X[0], r["peak"] / r["bw"], ROOF_X[1])
    ]


def _roof_spec() -> dict:
    return {
        **_frame(280),
        "layer": [
            {
                "data": {"name": "roof"},
                "mark": {"type": "line", "color": "#595959", "strokeWidth": 2},
                "encoding": {
                    "x": {
                        "field": "ai",
                        "type": "quantitative",
                        "title": "arithmetic intensity (FLOPs per HBM byte)",
                        "scale": {"type": "log", "domain": ROOF_X},
                    },
                    "y": {
                        "field": "tflops",
                        "type": "quantitative",
                        "title": "attainable TFLOP/s (ESTIMATE)",
                        "scale": {"type": "log"},
                    },
                    "order": {"field": "ai", "type": "quantitative"},
                },
            },
            {
                "data": {"name": "points"},
                "mark": {"type": "point", "filled": True, "size": 140, "opacity": 1},
                "encoding": {
                    "x": {"field": "ai", "type": "quantitative"},
                    "y": {"field": "tflops", "type": "quantitative"},
                    "shape": {
                        "field": "traffic",
                        "type": "nominal",
                        "title": None,
                        "scale": {
                            "domain": ["simulated (no L2)", "compulsory"],
                            "range": ["circle", "diamond"],
                        },
                        "legend": {"orient": "bottom"},
                    },
                    "color": {
                        "field": "traffic",
                        "type": "nominal",
                        "title": None,
                        "legend": {"orient": "bottom"},
                        "scale": {
                            "domain": ["simulated (no L2)", "compulsory"],
                            "range": ["#C44E52", "#4C72B0"],
                        },
                    },
                    "tooltip": [
                        {"field": "traffic"},
                        {
                            "field": "ai",
                            "type": "quantitative",
                            "format": ".4~g",
                            "title": "FLOPs/byte",
                        },
                        {
                            "field": "tflops",
                            "type": "quantitative",
                            "format": ".4~g",
                            "title": "TFLOP/s",
                        },
                    ],
                },
            },
        ],
        **_FONT,
    }


def _check_roof(gpu, N, d, dtype, algorithm):
    for name, v, opts in (
        ("gpu", gpu, ROOF_GPUS),
        ("N", N, ROOF_N),
        ("d", d, ROOF_D),
        ("dtype", dtype, ROOF_DTYPES),
        ("algorithm", algorithm, ROOF_ALGS),
    ):
        check_option(name, v, opts)


def static_roofline_explorer(
    gpu="H100", N=4096, d=128, dtype="float16", algorithm="flash2"
) -> Explorer:
    """The static site's twin of ``roofline_explorer``."""
    _check_roof(gpu, N, d, dtype, algorithm)
    init = {
        "gpu": ROOF_GPUS.index(gpu),
        "N": ROOF_N.index(N),
        "d": ROOF_D.index(d),
        "dtype": ROOF_DTYPES.index(dtype),
        "alg": ROOF_ALGS.index(algorithm),
    }
    return Explorer(
        "roofline",
        {
            "grid": roofline_grid(),
            "init": init,
            "roof_x": ROOF_X,
            "specs": {"roof": _roof_spec()},
        },
        "Roofline (chapter 2)",
        "explorers.roofline_explorer()",
    )


def roofline_readout(gpu, N, d, dtype, algorithm) -> str:
    p = roofline_point(gpu, N, d, dtype, algorithm)
    from attention.plots import human_bytes

    return (
        f"{algorithm}, one head, N = {N:,}, d = {d}, {dtype} on {gpu}: "
        f"{p['flops'] / 1e9:.3g} GFLOP; simulated {human_bytes(p['sim']['bytes'])} "
        f"({p['sim']['ai']:.3g} FLOPs/byte, {p['sim']['us']:.3g} µs ESTIMATE), "
        f"compulsory {human_bytes(p['comp']['bytes'])} "
        f"({p['comp']['ai']:.3g} FLOPs/byte, {p['comp']['us']:.3g} µs)."
    )


def roofline_figure(gpu, N, d, dtype, algorithm):
    """The live explorer's figure: the roofs and the two points."""
    import matplotlib.pyplot as plt

    p = roofline_point(gpu, N, d, dtype, algorithm)
    fig, ax = plt.subplots(figsize=(6.4, 4))
    ax.plot(*zip(*roof_line(gpu, dtype)), color="#595959")
    for key, label, c, mk in (
        ("sim", "simulated (no L2)", "#C44E52", "o"),
        ("comp", "compulsory", "#4C72B0", "D"),
    ):
        ax.scatter(
            [p[key]["ai"]],
            [p[key]["flops_s"] / 1e12],
            color=c,
            marker=mk,
            s=70,
            label=label,
            zorder=3,
        )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="FLOPs per HBM byte",
        ylabel="attainable TFLOP/s (ESTIMATE)",
        title=f"{memory.GPUS[gpu].name}, {dtype}",
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def live_roofline_explorer(
    gpu="H100", N=4096, d=128, dtype="float16", algorithm="flash2"
):
    """ipywidgets: each change redraws ``roofline_figure`` and the text."""
    import ipywidgets as widgets

    from .live import _show_figure

    _check_roof(gpu, N, d, dtype, algorithm)
    style = {"description_width": "initial"}
    ctl = {
        "gpu": widgets.Dropdown(
            options=ROOF_GPUS, value=gpu, description="GPU", style=style
        ),
        "N": widgets.SelectionSlider(
            options=ROOF_N, value=N, description="sequence length N", style=style
        ),
        "d": widgets.Dropdown(
            options=ROOF_D, value=d, description="head dim d", style=style
        ),
        "dtype": widgets.Dropdown(
            options=ROOF_DTYPES, value=dtype, description="dtype", style=style
        ),
        "algorithm": widgets.Dropdown(
            options=ROOF_ALGS, value=algorithm, description="algorithm", style=style
        ),
    }
    text, out = widgets.HTML(), widgets.Output()

    def redraw(change=None):
        kw = {k: w.value for k, w in ctl.items()}
        text.value = "<p>" + roofline_readout(**kw) + "</p>"
        _show_figure(out, roofline_figure(**kw))

    for w in ctl.values():
        w.observe(redraw, names="value")
    redraw()
    items = list(ctl.values())
    return widgets.VBox([widgets.HBox(items[:3]), widgets.HBox(items[3:]), text, out])


def roofline_explorer(
    gpu: str = "H100",
    N: int = 4096,
    d: int = 128,
    dtype: str = "float16",
    algorithm: str = "flash2",
):
    """Chapter 2: the roofline point of one algorithm; the static twin on the built
    site, ipywidgets elsewhere."""
    if site.ON_SITE:
        return static_roofline_explorer(gpu, N, d, dtype, algorithm)
    return live_roofline_explorer(gpu, N, d, dtype, algorithm)


__all__ = [
    "default_row",
    "online_grid",
    "online_softmax_explorer",
    "online_steps",
    "roof",
    "roofline_explorer",
    "roofline_grid",
    "roofline_point",
]
