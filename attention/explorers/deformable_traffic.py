"""Chapter 4's traffic explorer: per-tensor traffic of dense, DAT and MSDA attention on
a side x side map and the totals against the side: its grid (``memory.closed_form``),
static twin and ipywidgets face.
"""

from __future__ import annotations

from . import site
from .common import bars_spec, cached_png, flat, lines_spec, show_png, tensor_names
from .settings import Choice, Range, check, controls, index
from .site import Explorer

DEFORM_SIDE = list(range(16, 129, 16))
DEFORM_D = [16, 32, 64, 128]
DEFORM_R = list(range(1, 17))
DEFORM_P = list(range(1, 17))
DEFORM_L = [1, 2, 3, 4]
#: The settings both faces take (the static grid covers exactly these).
SETTINGS = {
    "side": Range(16, 128, 16, label="map side"),
    "d": Choice(DEFORM_D, label="head dim d"),
    "r": Range(1, 16, label="DAT factor r"),
    "n_points": Range(1, 16, label="MSDA points P"),
    "n_levels": Range(1, 4, label="MSDA levels L"),
}
DEFORM_ALGS = {
    "dense": "dense-image",
    "DAT fused": "dat",
    "DAT unfused": "dat-unfused",
    "MSDA": "msda",
}


def deformable_grid(
    sides=DEFORM_SIDE, ds=DEFORM_D, rs=DEFORM_R, ps=DEFORM_P, ls=DEFORM_L
) -> dict:
    """``memory.closed_form`` of dense, DAT (fused, unfused) and MSDA over a side x
    side map: dense[di][si], dat[di][si][ri], dat-unfused[di][si][ri],
    msda[di][si][li][pi]."""
    # Importing deformable registers the algorithms.
    from attention import deformable, memory  # noqa: F401

    def cf(alg, **kw):
        return memory.closed_form(alg, **kw)

    res = {
        "dense-image": [
            [cf("dense-image", height=s, width=s, d=d) for s in sides] for d in ds
        ],
        "dat": [
            [[cf("dat", height=s, width=s, d=d, r=r) for r in rs] for s in sides]
            for d in ds
        ],
        "dat-unfused": [
            [
                [cf("dat-unfused", height=s, width=s, d=d, r=r) for r in rs]
                for s in sides
            ]
            for d in ds
        ],
        "msda": [
            [
                [
                    [
                        cf("msda", n_queries=s * s, d=d, n_levels=L, n_points=P)
                        for P in ps
                    ]
                    for L in ls
                ]
                for s in sides
            ]
            for d in ds
        ],
    }

    def leaves(x):
        return [x] if hasattr(x, "per_tensor") else [r for y in x for r in leaves(y)]

    tensors = tensor_names(r for v in res.values() for r in leaves(v))

    def enc(x):
        if hasattr(x, "per_tensor"):
            return flat(x.per_tensor, tensors)
        return [enc(y) for y in x]

    return {
        "side": list(sides),
        "d": list(ds),
        "r": list(rs),
        "P": list(ps),
        "L": list(ls),
        "tensors": tensors,
        "counts": {a: enc(v) for a, v in res.items()},
        "names": DEFORM_ALGS,
    }


def static_deformable_traffic_explorer(
    side: int = 64, d: int = 32, r: int = 4, n_points: int = 4, n_levels: int = 4
) -> Explorer:
    """Chapter 4's traffic explorer for the static site: per-tensor bytes of dense, DAT
    and MSDA at the chosen map, and the totals against the map side (float16)."""
    from attention import plots

    check(SETTINGS, side=side, d=d, r=r, n_points=n_points, n_levels=n_levels)
    grid = deformable_grid()
    styles = plots.traffic.DEFORM_STYLES if hasattr(plots, "traffic") else {}
    colors = [styles.get(n, ("#333333", "-"))[0] for n in DEFORM_ALGS]
    # DAT unfused: the fused colour, lighter (no dashes in the legend).
    colors[2] = "#8FA9D6"
    config = {
        "grid": grid,
        "bpe": 2,
        "init": {
            "side": index("side", side, DEFORM_SIDE),
            "d": index("d", d, DEFORM_D),
            "r": index("r", r, DEFORM_R),
            "P": index("n_points", n_points, DEFORM_P),
            "L": index("n_levels", n_levels, DEFORM_L),
        },
        "specs": {
            "bars": bars_spec(grid["tensors"]),
            "lines": lines_spec(
                list(DEFORM_ALGS), colors, "map side (H = W); queries = H·W"
            ),
        },
    }
    return Explorer(
        "deformable",
        config,
        "Traffic of deformable attention (chapter 4)",
        "explorers.deformable_traffic_explorer()",
    )


def live_deformable_traffic_explorer(
    side: int = 64, d: int = 32, r: int = 4, n_points: int = 4, n_levels: int = 4
):
    """Sliders for DAT's downsampling factor r, MSDA's points per level P and levels L,
    the map side and d; each change redraws
    ``attention.plots.deformable_traffic_figure``. Returns the box."""
    import ipywidgets as widgets

    from attention import plots

    check(SETTINGS, side=side, d=d, r=r, n_points=n_points, n_levels=n_levels)
    values = dict(r=r, n_points=n_points, n_levels=n_levels, side=side, d=d)
    c = controls(SETTINGS, values, continuous_update=False)
    out = widgets.Output()

    def redraw(change=None):
        args = {name: w.value for name, w in c.items()}
        show_png(
            out, cached_png(plots.deformable_traffic_figure, simulated=False, **args)
        )

    for w in c.values():
        w.observe(redraw, names="value")
    redraw()
    items = list(c.values())
    return widgets.VBox([widgets.HBox(items[:3]), widgets.HBox(items[3:]), out])


def deformable_traffic_explorer(
    side: int = 64, d: int = 32, r: int = 4, n_points: int = 4, n_levels: int = 4
):
    """Chapter 4: per-tensor traffic of dense, DAT (factor ``r``) and MSDA
    (``n_points`` per level, ``n_levels`` levels) on a ``side`` x ``side`` map, and the
    totals against the map side. The static twin on the built site, ipywidgets
    elsewhere."""
    face = (
        static_deformable_traffic_explorer
        if site.ON_SITE
        else live_deformable_traffic_explorer
    )
    return face(side=side, d=d, r=r, n_points=n_points, n_levels=n_levels)


__all__ = ["deformable_grid", "deformable_traffic_explorer"]
