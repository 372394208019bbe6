"""Chapter 1's traffic explorer: HBM bytes of standard (materialising) attention against
the key length n, per tensor, and the per-tensor split at (m, n): its grid
(``memory.closed_form``), its static twin and its ipywidgets face, one call.
"""

from __future__ import annotations

from attention import plots

from . import site
from .common import (
    bars_spec,
    book_colors,
    cached_png,
    dtypes,
    flat,
    lines_spec,
    show_png,
)
from .settings import Choice, Range, check, controls, index
from .site import Explorer

# 64 .. 8192
NAIVE_N = sorted({2**k for k in range(6, 14)} | {3 * 2**k for k in range(5, 12)})
NAIVE_M = [2**k for k in range(4, 14)]  # 16 .. 8192 queries
NAIVE_D = [16, 32, 64, 128, 256]
NAIVE_TENSORS = ["Q", "K", "V", "S", "P", "O"]

#: The settings both faces take (the live sliders' ranges); the static twin shows the
#: points of its grid among them (``NAIVE_N``, ``NAIVE_M``).
SETTINGS = {
    "n": Range(64, 8192, 64, label="keys n"),
    "m": Range(16, 8192, 16, label="queries m"),
    "d": Choice(NAIVE_D, label="head dim d"),
    "dtype": Choice(plots.DTYPE_BYTES, label="dtype"),
}


def _check(n, m, d, dtype) -> None:
    check(SETTINGS, n=n, d=d, dtype=dtype, **({} if m is None else {"m": m}))


def naive_grid(ns=NAIVE_N, ms=NAIVE_M, ds=NAIVE_D, Br: int = 64, Bc: int = 64) -> dict:
    """``memory.closed_form("standard", m, d, Br, Bc, N_k=n)`` for m = n (self) and
    every m of the grid: ``counts[mi + 1][di][ni]`` = [r_Q, w_Q, ..., r_O, w_O] over
    ``NAIVE_TENSORS`` (mi = -1 is self-attention)."""
    from attention import memory

    counts = []
    for m in [None, *ms]:
        counts.append(
            [
                [
                    flat(
                        memory.closed_form(
                            "standard", n if m is None else m, d, Br=Br, Bc=Bc, N_k=n
                        ).per_tensor,
                        NAIVE_TENSORS,
                    )
                    for n in ns
                ]
                for d in ds
            ]
        )
    return {
        "n": list(ns),
        "m": list(ms),
        "d": list(ds),
        "tensors": NAIVE_TENSORS,
        "counts": counts,
        "Br": Br,
        "Bc": Bc,
    }


def static_naive_traffic_explorer(
    n: int = 1024, m: int | None = None, d: int = 64, dtype: str = "float16"
) -> Explorer:
    """Chapter 1's explorer for the static site: bytes of standard attention against
    the key length n, per tensor, and the per-tensor split at (m, n)."""
    _check(n, m, d, dtype)
    grid = naive_grid()
    types = dtypes()
    colors = book_colors()
    config = {
        "grid": grid,
        "dtypes": types,
        "init": {
            "n": index("n", n, NAIVE_N),
            "self": m is None,
            "m": index("m", m if m is not None else 1024, NAIVE_M),
            "d": index("d", d, NAIVE_D),
            "dtype": index("dtype", dtype, [k for k, _ in types]),
        },
        "specs": {
            "lines": lines_spec(
                NAIVE_TENSORS + ["total"],
                [colors[t] for t in NAIVE_TENSORS] + ["#000000"],
                "key length n",
            ),
            "bars": bars_spec(NAIVE_TENSORS),
        },
    }
    return Explorer(
        "naive",
        config,
        "Traffic of standard attention (chapter 1)",
        "explorers.naive_traffic_explorer()",
    )


def live_naive_traffic_explorer(
    n: int = 1024, m: int | None = None, d: int = 64, dtype: str = "float16"
):
    """Sliders for n (keys), m (queries; tick "self" for m = n), d and dtype.

    Each change redraws ``attention.plots.naive_traffic_figure`` from the closed form
    (``simulated=False``: the simulator's counts, which the chapter's figure checks,
    at once at any n): bytes against n per tensor and the per-tensor bars at the
    chosen (m, n). Returns the box.
    """
    import ipywidgets as widgets

    from attention import plots

    _check(n, m, d, dtype)
    c = controls(
        SETTINGS, dict(n=n, m=m or n, d=d, dtype=dtype), continuous_update=False
    )
    n_slider, m_slider, d_menu, dtype_menu = c.values()
    m_slider.disabled = m is None
    self_box = widgets.Checkbox(
        value=m is None, description="self-attention (m = n)", indent=False
    )
    out = widgets.Output()

    def redraw(change=None):
        m_slider.disabled = self_box.value
        m = None if self_box.value else m_slider.value
        args = dict(n=n_slider.value, m=m, d=d_menu.value, dtype=dtype_menu.value)
        show_png(out, cached_png(plots.naive_traffic_figure, simulated=False, **args))

    for w in (n_slider, m_slider, self_box, d_menu, dtype_menu):
        w.observe(redraw, names="value")
    redraw()
    panel = widgets.VBox(
        [
            widgets.HBox([n_slider, m_slider, self_box]),
            widgets.HBox([d_menu, dtype_menu]),
        ]
    )
    return widgets.VBox([panel, out])


def naive_traffic_explorer(
    n: int = 1024, m: int | None = None, d: int = 64, dtype: str = "float16"
):
    """Chapter 1: bytes of standard attention against the key length n per tensor,
    and the per-tensor split at (m, n); ``m=None`` is self-attention (m = n). The
    static twin on the built site, ipywidgets elsewhere."""
    face = (
        static_naive_traffic_explorer if site.ON_SITE else live_naive_traffic_explorer
    )
    return face(n=n, m=m, d=d, dtype=dtype)


__all__ = ["naive_grid", "naive_traffic_explorer"]
