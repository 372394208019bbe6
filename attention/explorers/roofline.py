"""Chapter 2's roofline explorer: GPU, N, d, dtype, algorithm -> the point of the
simulated and of the compulsory traffic under that GPU's roofs (``attention.memory``),
its specs, static twin and ipywidgets face, one call.
"""

from __future__ import annotations

from attention import memory
from attention.memory import ring as _mring
from attention.plots import live

from . import site
from .common import BLUE, DARK_GREY, FONT, RED, frame, live_png, show_png
from .settings import Choice, check, controls
from .site import Explorer

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


def _r(x, digits: int = 6) -> float:
    return float(f"{x:.{digits}g}")


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
        **frame(280),
        "layer": [
            {
                "data": {"name": "roof"},
                "mark": {"type": "line", "color": DARK_GREY, "strokeWidth": 2},
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
                            "range": [RED, BLUE],
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
        **FONT,
    }


#: The settings both faces take (the static grid covers exactly these).
SETTINGS = {
    "gpu": Choice(ROOF_GPUS, label="GPU"),
    "N": Choice(ROOF_N, label="sequence length N", widget="slider"),
    "d": Choice(ROOF_D, label="head dim d"),
    "dtype": Choice(ROOF_DTYPES, label="dtype"),
    "algorithm": Choice(ROOF_ALGS, label="algorithm"),
}


def _check_roof(gpu, N, d, dtype, algorithm):
    check(SETTINGS, gpu=gpu, N=N, d=d, dtype=dtype, algorithm=algorithm)


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

    p = roofline_point(gpu, N, d, dtype, algorithm)
    fig, ax = live.subplots(figsize=(6.4, 4))
    ax.plot(*zip(*roof_line(gpu, dtype)), color=DARK_GREY)
    for key, label, c, mk in (
        ("sim", "simulated (no L2)", RED, "o"),
        ("comp", "compulsory", BLUE, "D"),
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

    _check_roof(gpu, N, d, dtype, algorithm)
    values = dict(gpu=gpu, N=N, d=d, dtype=dtype, algorithm=algorithm)
    ctl = controls(SETTINGS, values)
    text, out = widgets.HTML(), widgets.Output()

    def redraw(change=None):
        kw = {k: w.value for k, w in ctl.items()}
        text.value = "<p>" + roofline_readout(**kw) + "</p>"
        show_png(out, live_png(roofline_figure, **kw))

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
    face = static_roofline_explorer if site.ON_SITE else live_roofline_explorer
    return face(gpu=gpu, N=N, d=d, dtype=dtype, algorithm=algorithm)


__all__ = ["roof", "roofline_explorer", "roofline_grid", "roofline_point"]
