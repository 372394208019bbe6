"""Chapter 3's top-k traffic explorer: HBM traffic of soft, hard and top-k attention
against N, and per tensor at N: its grid (``memory.closed_form``), static twin and
ipywidgets face.
"""

from __future__ import annotations

from . import site
from .common import bars_spec, cached_png, flat, lines_spec, show_png, tensor_names
from .settings import Choice, Range, check, controls, index
from .site import Explorer

TOPK_N = [2**k for k in range(8, 17)]
TOPK_D = [32, 64, 128]
TOPK_K = [2**k for k in range(0, 9)]  # 1 .. 256

#: The settings both faces take (the live sliders' ranges); the static twin shows the
#: points of its grid among them (``TOPK_N``, ``TOPK_K``).
SETTINGS = {
    "k": Range(1, 256, label="top-k k"),
    "N": Range(256, 65536, 256, label="length N"),
    "d": Choice(TOPK_D, label="head dim d"),
}


def topk_grid(ns=TOPK_N, ds=TOPK_D, ks=TOPK_K, Br: int = 64, Bc: int = 64) -> dict:
    """``memory.closed_form`` of soft, hard and top-k (each k) attention, at every
    (N, d): ``counts[name][di][ni]`` (name "soft", "hard" or "topk:k") over the
    names in ``tensors``."""
    # hard registers soft, hard, topk.
    from attention import hard, memory  # noqa: F401

    runs = {"soft": {}, "hard": {}, **{f"topk:{k}": {"k": k} for k in ks}}
    res = {
        name: [
            [
                memory.closed_form(name.split(":")[0], n, d, Br=Br, Bc=Bc, **kw)
                for n in ns
            ]
            for d in ds
        ]
        for name, kw in runs.items()
    }
    tensors = tensor_names(r for rows in res.values() for row in rows for r in row)
    counts = {
        name: [[flat(r.per_tensor, tensors) for r in row] for row in rows]
        for name, rows in res.items()
    }
    return {
        "N": list(ns),
        "d": list(ds),
        "k": list(ks),
        "tensors": tensors,
        "counts": counts,
    }


def static_topk_traffic_explorer(N: int = 4096, d: int = 64, k: int = 8) -> Explorer:
    """Chapter 3's top-k traffic explorer for the static site: soft, hard and
    top-k bytes against N, and per tensor at N (closed forms; float16, 2 bytes
    per element)."""
    from attention import plots

    check(SETTINGS, N=N, d=d, k=k)
    grid = topk_grid()
    c = plots.SELECTION_COLORS
    config = {
        "grid": grid,
        "bpe": 2,
        "init": {
            "N": index("N", N, TOPK_N),
            "d": index("d", d, TOPK_D),
            "k": index("k", k, TOPK_K),
        },
        "specs": {
            "lines": lines_spec(
                ["soft", "hard (argmax)", "top-k"],
                [c["soft"], c["hard"], c["topk"]],
                "sequence length N (N_q = N_k)",
            ),
            "bars": bars_spec(grid["tensors"]),
        },
    }
    return Explorer(
        "topk",
        config,
        "Traffic of soft, hard and top-k attention (chapter 3)",
        "explorers.topk_traffic_explorer()",
    )


def live_topk_traffic_explorer(N: int = 4096, d: int = 64, k: int = 8):
    """Sliders for k (rows of V read per query), N and d; each change redraws
    ``attention.plots.selection_traffic_figure`` (soft, hard and top-k HBM traffic).
    Returns the box."""
    import ipywidgets as widgets

    from attention import plots

    check(SETTINGS, N=N, d=d, k=k)
    c = controls(SETTINGS, dict(k=k, N=N, d=d), continuous_update=False)
    out = widgets.Output()

    def redraw(change=None):
        args = {name: w.value for name, w in c.items()}
        show_png(
            out, cached_png(plots.selection_traffic_figure, simulated=False, **args)
        )

    for w in c.values():
        w.observe(redraw, names="value")
    redraw()
    return widgets.VBox([widgets.HBox(list(c.values())), out])


def topk_traffic_explorer(N: int = 4096, d: int = 64, k: int = 8):
    """Chapter 3: HBM traffic of soft, hard and top-k attention against N, and per
    tensor at N. The static twin on the built site, ipywidgets elsewhere."""
    face = static_topk_traffic_explorer if site.ON_SITE else live_topk_traffic_explorer
    return face(N=N, d=d, k=k)


__all__ = ["topk_grid", "topk_traffic_explorer"]
