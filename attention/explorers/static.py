"""The static twins of the book's explorers: data computed in Python, drawn in the page.

On the built site no Python runs, so each explorer of ``explorers.live`` has a twin
here. Its data is computed when the chapter executes, by the same ``attention``
functions the notebook calls (``memory.closed_form`` grids, ``memory.simulate`` traces,
``hard.gumbel_softmax``: the grids of ``explorers.data``), and written into the page as
JSON beside Vega-Lite specs (``explorers.specs``) by an ``explorers.site.Explorer``.
The page's own script (``_static/explorers.js``) only looks rows up in that JSON and
hands them to Vega (vendored from ``vl-convert-python`` into the build by
``site.setup``): no number is re-derived in JavaScript, except bytes = elements x bytes
per element, which is exactly ``Traffic.bytes``. Chapters call ``explorers.X()``,
which gives these on the site.
"""

from __future__ import annotations

import numpy as np

from .data import (
    BACKWARD,
    DEFORM_ALGS,
    DEFORM_D,
    DEFORM_L,
    DEFORM_P,
    DEFORM_R,
    DEFORM_SIDE,
    FORWARD,
    NAIVE_D,
    NAIVE_M,
    NAIVE_N,
    NAIVE_TENSORS,
    SRAM_KIB,
    TAU_EXP,
    TILE_B,
    TILE_D,
    TILE_N,
    TOPK_D,
    TOPK_K,
    TOPK_N,
    _dtypes,
    compulsory_grid,
    deformable_grid,
    naive_grid,
    schedule_table,
    sram_table,
    temperature_grid,
    temperature_inputs,
    tile_grid,
    topk_grid,
)
from .site import Explorer
from .specs import (
    _colors,
    bars_floor_spec,
    bars_spec,
    heatmap_spec,
    lines_spec,
    tiles_spec,
    weights_row_spec,
)


def _index(name: str, value, options, shown=None) -> int:
    """Where ``value`` sits among a control's ``options``; ValueError naming the
    argument and listing the options (``shown``, when the options are encoded)."""
    try:
        return list(options).index(value)
    except ValueError:
        raise ValueError(
            f"{name} must be one of {list(shown or options)}, got {value!r}"
        ) from None


def tile_size_explorer(
    N: int = 1024,
    d: int = 64,
    sram_kib: int = 192,
    Br: int = 64,
    Bc: int = 64,
    dtype: str = "float16",
    algorithm: str = "flash2",
) -> Explorer:
    """Chapter 2's tile-size explorer for the static site: HBM bytes of the forward (or
    backward) algorithms per tensor (simulated, no L2) with each one's compulsory
    traffic beside it (``memory.compulsory``), the chosen algorithm's SRAM need against
    M (``sram_kib``, one of ``SRAM_KIB``), FA1's rule, and its schedule over the tiles
    of S step by step at N = ``TRACE_N``."""
    grid = tile_grid()
    fwd_t = _tensor_names_from(grid, FORWARD)
    bwd_t = _tensor_names_from(grid, BACKWARD)
    dtypes = _dtypes()
    sram_i = _index("sram_kib", sram_kib, [kib for _, kib in SRAM_KIB])
    config = {
        "grid": grid,
        "sram": sram_table(),
        "schedule": schedule_table(),
        "compulsory": compulsory_grid(),
        "groups": {"fwd": FORWARD, "bwd": BACKWARD},
        "dtypes": dtypes,
        "srams": SRAM_KIB,
        "init": {
            "N": _index("N", N, TILE_N),
            "d": _index("d", d, TILE_D),
            "sram": sram_i,
            "Br": _index("Br", Br, TILE_B),
            "Bc": _index("Bc", Bc, TILE_B),
            "dtype": _index("dtype", dtype, [n for n, _ in dtypes]),
            "algorithm": _index("algorithm", algorithm, FORWARD + BACKWARD),
            "step": 0,
        },
        "specs": {
            "bars_fwd": bars_floor_spec(fwd_t),
            "bars_bwd": bars_floor_spec(bwd_t),
            "tiles": tiles_spec(),
        },
    }
    return Explorer(
        "tile",
        config,
        "Tile-size explorer (chapter 2)",
        "explorers.tile_size_explorer()",
    )


def _tensor_names_from(grid: dict, algorithms: list[str]) -> list[str]:
    return list(dict.fromkeys(t for a in algorithms for t in grid["tensors"][a]))


def teaser(d: int = 64, dtype: str = "float16") -> Explorer:
    """The landing page's explorer: standard attention against FlashAttention-2
    (forward), HBM bytes per tensor as N and the tiles change (from
    ``memory.closed_form``), each bar with its compulsory traffic as a tick
    (``memory.compulsory``: what HBM sees when L2 holds the re-reads), as chapter 2's
    tile-size explorer, its live twin, draws them."""
    algorithms = ["standard", "flash2"]
    grid = tile_grid(ds=[d], algorithms=algorithms)
    bpe = dict(_dtypes())[dtype]
    tensors = _tensor_names_from(grid, algorithms)
    config = {
        "grid": grid,
        "bpe": bpe,
        "dtype": dtype,
        "compulsory": compulsory_grid(ds=[d], algorithms=algorithms),
        "init": {
            "N": TILE_N.index(4096),
            "Br": TILE_B.index(64),
            "Bc": TILE_B.index(64),
        },
        "specs": {"bars": bars_floor_spec(tensors, height=220)},
    }
    return Explorer(
        "teaser",
        config,
        "Standard attention against FlashAttention-2",
        "explorers.teaser()",
    )


# ---------------------------------------------------------------------------------
# Chapter 1: the traffic of standard attention against n, m, d and the dtype.
# ---------------------------------------------------------------------------------


def naive_traffic_explorer(
    n: int = 1024, m: int | None = None, d: int = 64, dtype: str = "float16"
) -> Explorer:
    """Chapter 1's explorer for the static site: bytes of standard attention against
    the key length n, per tensor, and the per-tensor split at (m, n)."""
    grid = naive_grid()
    dtypes = _dtypes()
    colors = _colors()
    config = {
        "grid": grid,
        "dtypes": dtypes,
        "init": {
            "n": _index("n", n, NAIVE_N),
            "self": m is None,
            "m": _index("m", m if m is not None else 1024, NAIVE_M),
            "d": _index("d", d, NAIVE_D),
            "dtype": _index("dtype", dtype, [k for k, _ in dtypes]),
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


# ---------------------------------------------------------------------------------
# Chapter 3: the Gumbel-softmax temperature, and the traffic of top-k.
# ---------------------------------------------------------------------------------


def temperature_explorer(
    scores=None, noise=None, tau: float = 1.0, row: int = 0, seed: int = 0
) -> Explorer:
    """Chapter 3's temperature explorer for the static site, on the chapter's
    scores and Gumbel noise (``data.temperature_inputs``: random ones from ``seed``
    where None): the map of y = softmax((s + g) / tau), and one row beside
    softmax(s)."""
    from attention import plots

    grid = temperature_grid(*temperature_inputs(scores, noise, seed))
    if (
        isinstance(tau, bool)
        or not isinstance(tau, (int, float, np.floating))
        or not np.isfinite(tau)
        or tau <= 0
    ):
        raise ValueError(f"tau must be a finite number > 0, got {tau!r}")
    e = round(float(np.log10(tau)), 2)
    soft, hard_c = plots.SELECTION_COLORS["soft"], plots.SELECTION_COLORS["hard"]
    n_q, n_k = grid["shape"]
    tau_i = _index("tau", e, TAU_EXP, shown=[round(10.0**x, 4) for x in TAU_EXP])
    if (
        isinstance(row, bool)
        or not isinstance(row, (int, np.integer))
        or not 0 <= row < n_q
    ):
        raise ValueError(f"row must be an int in 0..{n_q - 1}, got {row!r}")
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


def topk_traffic_explorer(N: int = 4096, d: int = 64, k: int = 8) -> Explorer:
    """Chapter 3's top-k traffic explorer for the static site: soft, hard and
    top-k bytes against N, and per tensor at N (closed forms; float16, 2 bytes
    per element)."""
    from attention import plots

    grid = topk_grid()
    c = plots.SELECTION_COLORS
    config = {
        "grid": grid,
        "bpe": 2,
        "init": {
            "N": _index("N", N, TOPK_N),
            "d": _index("d", d, TOPK_D),
            "k": _index("k", k, TOPK_K),
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


# ---------------------------------------------------------------------------------
# Chapter 4: deformable attention's traffic.
# ---------------------------------------------------------------------------------


def deformable_traffic_explorer(
    side: int = 64, d: int = 32, r: int = 4, n_points: int = 4, n_levels: int = 4
) -> Explorer:
    """Chapter 4's traffic explorer for the static site: per-tensor bytes of dense, DAT
    and MSDA at the chosen map, and the totals against the map side (float16)."""
    from attention import plots

    grid = deformable_grid()
    styles = plots.traffic._DEFORM_STYLES if hasattr(plots, "traffic") else {}
    colors = [styles.get(n, ("#333333", "-"))[0] for n in DEFORM_ALGS]
    # DAT unfused: the fused colour, lighter (no dashes in the legend).
    colors[2] = "#8FA9D6"
    config = {
        "grid": grid,
        "bpe": 2,
        "init": {
            "side": _index("side", side, DEFORM_SIDE),
            "d": _index("d", d, DEFORM_D),
            "r": _index("r", r, DEFORM_R),
            "P": _index("n_points", n_points, DEFORM_P),
            "L": _index("n_levels", n_levels, DEFORM_L),
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
