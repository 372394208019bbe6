"""Chapter 8's sparse-attention explorer: selection rule, sequence length, block size,
budget and query row -> the blocks the rule picks for that query, drawn over the
attention map and over the row's mass per block, the share of the row's mass they
keep (beside the oracle's), and the prefill's FLOPs and HBM bytes against dense
causal attention. One call, ``sparse_explorer``: the static twin on the site (data
computed here, drawn by ``_static/explorers.js``), ipywidgets in Jupyter.

The map is synthetic and deterministic (``synthetic_qk``): one head whose queries and
keys carry a rotary-like position code (a local band), a sink on the first token and
topics that recur far back (global structure). Every query's selection is computed at
decode time, as the rule runs when that token is the newest: the query at position i
against the keys 0..i (``attention.sparse``: MoBA's ``select_blocks``, NSA's
``nsa_select``, Quest's ``quest_select``; the oracle from the map,
``sparse_mass.oracle_blocks``). MoBA's and NSA's choice is the same as in a causal
prefill (their own block is forced, incomplete blocks are not scored), Quest's own
page is bounded by the keys it holds so far. Costs are ``attention.memory.sparse``'s
closed forms (a causal prefill of N tokens, one head, d = 64, bf16), dense causal by
``dense_causal_flops`` and ``blocksparse.causal_work`` (FlashAttention's forward,
tiles 128 x 128). The static grid is ``row_point`` at every setting the controls
reach; the page's script only looks rows up and draws them.
"""

from __future__ import annotations

import functools

import numpy as np

from attention import sparse, sparse_mass
from attention.memory import blocksparse as bsp
from attention.memory import sparse as ms
from attention.plots.sparse import SPARSE_COLORS

from . import site
from .common import FONT, PngCache, frame, show_png
from .settings import Choice, check, controls
from .site import Explorer

METHODS = list(sparse_mass.METHODS)  # moba, nsa, quest, oracle
CONTEXT = [256, 512, 1024, 2048, 4096]
BLOCKS = [16, 32, 64, 128]
#: The budgets (blocks per query) the controls offer.
TOPKS = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]
TOPK_MAX = TOPKS[-1]
#: Query rows the controls offer: the last row of each eighth of the sequence.
N_QUERIES = 8
#: The map is sent as THUMB x THUMB cells (the mass of each cell's keys, one row each).
THUMB = 64
D, BYTES_PER_ELEM, SEED = 64, 2, 0
#: The dense causal kernel the costs compare with: FlashAttention's tiles.
DENSE_TILE = 128
COLORS = {m: SPARSE_COLORS[m] for m in METHODS}  # chapter 8's, from attention.plots
NAMES = {
    "moba": "MoBA (mean-pooled keys)",
    "nsa": "NSA (compressed branch)",
    "quest": "Quest (min/max bound)",
    "oracle": "oracle (largest blocks)",
}


def query_rows(N: int) -> list[int]:
    """The query rows the controls offer at ``N``: N/8 - 1, 2N/8 - 1, ..., N - 1."""
    return [N // N_QUERIES * (j + 1) - 1 for j in range(N_QUERIES)]


#: The settings both faces take, but ``query`` (its rows depend on N: ``settings``).
BASE_SETTINGS = {
    "method": Choice(METHODS, label="selection", names=[NAMES[m] for m in METHODS]),
    "N": Choice(
        CONTEXT,
        label="sequence length N",
        widget="slider",
        names=[f"{n:,}" for n in CONTEXT],
    ),
    "block_size": Choice(BLOCKS, label="block size"),
    "topk": Choice(TOPKS, label="budget (blocks)", widget="slider"),
}


def settings(N: int) -> dict:
    """The declaration at sequence length ``N``: ``BASE_SETTINGS``, the query rows."""
    rows = Choice(query_rows(N), label="query row", widget="slider")
    return {**BASE_SETTINGS, "query": rows}


def _check(method, N, block_size, topk, query) -> int:
    """Both faces' check; returns the query row (None: the last)."""
    check(BASE_SETTINGS, method=method, N=N, block_size=block_size, topk=topk)
    query = N - 1 if query is None else query
    check(settings(N), query=query)
    return query


# ---------------------------------------------------------------------------------
# The map and one query's selection
# ---------------------------------------------------------------------------------


def synthetic_qk(N: int, d: int = D, seed: int = SEED):
    """Queries and keys (N, d) of one synthetic head, deterministic in ``seed``.

    16 channels carry a rotary-like position code (q_i . k_j a sum of cosines of
    i - j at wavelengths 4 to 65k: a local band), one channel a sink (every query
    matches the first key), the rest topics: segments of 16 to 128 tokens each draw
    one of 16 topics, and a query matches the keys of earlier segments of its topic
    (noisy), however far back."""
    rng = np.random.default_rng(seed)
    n_pos, n_top = 16, d - 17
    freq = 1.0 / (4.0 * 4.0 ** np.arange(n_pos // 2))
    angle = np.arange(N)[:, None] * freq
    pos = np.concatenate([np.cos(angle), np.sin(angle)], axis=1) / np.sqrt(n_pos // 2)
    topics, i = np.empty(N, dtype=np.int64), 0
    while i < N:
        length = int(rng.integers(16, 129))
        topics[i : i + length] = rng.integers(16)
        i += length
    u = rng.normal(size=(16, n_top)) / np.sqrt(n_top)
    top = u[topics] + 0.3 * rng.normal(size=(N, n_top)) / np.sqrt(n_top)
    sink_q, sink_k = np.ones((N, 1)), np.zeros((N, 1))
    sink_k[0] = 1.0
    r = d**0.25  # q . k * d^-1/2 = the channels' products
    q = np.concatenate([1.5 * pos, 3.5 * top, 3.6 * sink_q], axis=1) * r
    k = np.concatenate([1.5 * pos, 3.5 * top, 3.6 * sink_k], axis=1) * r
    return q, k


@functools.lru_cache(maxsize=len(CONTEXT))
def _qk(N: int):
    return synthetic_qk(N)


def _row_probs(N: int, query: int) -> np.ndarray:
    """Row ``query`` of the causal map: softmax over the keys 0..query."""
    q, k = _qk(N)
    s = k[: query + 1] @ q[query] / np.sqrt(D)
    p = np.exp(s - s.max())
    return p / p.sum()


@functools.lru_cache(maxsize=1024)
def _row(N: int, block_size: int, query: int) -> dict:
    """The row's block masses (thousandths of the row) and the top-``TOPK_MAX``
    ranking of every rule at decode time (query ``query`` against keys 0..query)."""
    q, k = _qk(N)
    p = _row_probs(N, query)[None, None, None]
    qq, kk = q[None, None, query : query + 1], k[None, None, : query + 1]
    pick = {"moba": sparse.select_blocks, "nsa": sparse.nsa_select,
            "quest": sparse.quest_select}  # fmt: skip
    order = {m: f(qq, kk, block_size, TOPK_MAX, True) for m, f in pick.items()}
    order["oracle"] = sparse_mass.oracle_blocks(p, block_size, TOPK_MAX, True)
    mass = sparse_mass.block_mass(p, block_size)[0, 0, 0]
    return {"mass": mass, "order": {m: o[0, 0, 0].tolist() for m, o in order.items()}}


def row_point(method: str, N: int, block_size: int, query: int) -> dict:
    """One rule at one query: ``order`` its top ``TOPK_MAX`` blocks (best first, -1
    padding), ``kept`` the percent of the row's mass inside its first k blocks for
    each k of ``TOPKS`` (one decimal), ``mass`` each visible block's share in
    thousandths (integers)."""
    check(BASE_SETTINGS, method=method, N=N, block_size=block_size)
    check(settings(N), query=query)
    r = _row(N, block_size, query)
    order = r["order"][method]
    pad = np.append(r["mass"], 0.0)
    kept = np.cumsum(pad[np.where(np.array(order) < 0, -1, order)]) / r["mass"].sum()
    return {
        "order": order,
        "kept": np.round(100 * kept[np.array(TOPKS) - 1], 1).tolist(),
        "mass": np.round(1000 * r["mass"]).astype(int).tolist(),
    }


def map_thumbnail(N: int) -> list[list[int]]:
    """The causal map as THUMB x THUMB cells, thousandths: cell (a, b) is the mass
    that query row (a + 1) N / THUMB - 1 puts on the keys of the b-th key bin."""
    check(BASE_SETTINGS, N=N)  # before the cache: 512.0 would hit 512's entry
    return _map_thumbnail(N)


@functools.lru_cache(maxsize=len(CONTEXT))
def _map_thumbnail(N: int) -> list[list[int]]:
    q, k = _qk(N)
    w = N // THUMB
    rows = np.arange(1, THUMB + 1) * w - 1
    s = q[rows] @ k.T / np.sqrt(D)
    s = np.where(np.arange(N) <= rows[:, None], s, -np.inf)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    cells = p.reshape(THUMB, THUMB, w).sum(axis=2)
    return np.round(1000 * cells).astype(int).tolist()


def cost_point(N: int, block_size: int, topk: int) -> dict:
    """A causal prefill of N tokens, one head, d = 64, bf16: the selected attention
    (``selected_work``), its gate (``gate_cost``) and dense causal attention."""
    check(BASE_SETTINGS, N=N, block_size=block_size, topk=topk)
    w = ms.selected_work(N, N, block_size, topk, D)
    g = ms.gate_cost(N, N, block_size, topk, D)
    return {
        "flops": w.flops,
        "bytes": w.traffic.bytes(BYTES_PER_ELEM),
        "gate_flops": g["flops"],
        "gate_bytes": g["traffic"].bytes(BYTES_PER_ELEM),
        "dense_flops": ms.dense_causal_flops(N, D),
        "dense_bytes": _dense_bytes(N),
    }


@functools.lru_cache(maxsize=len(CONTEXT))
def _dense_bytes(N: int) -> int:
    return bsp.causal_work(N, D, DENSE_TILE, DENSE_TILE).bytes(BYTES_PER_ELEM)


COST_FIELDS = ["flops", "bytes", "gate_flops", "gate_bytes", "dense_flops",
               "dense_bytes"]  # fmt: skip


def _key(*parts) -> str:
    return ",".join(str(x) for x in parts)


@functools.lru_cache(maxsize=1)
def sparse_grid() -> dict:
    """The twin's tables: ``thumb[N]`` (``map_thumbnail``); ``rows[method,N,B,query]``
    = ``order`` + ``kept`` (``TOPK_MAX`` + len(``TOPKS``) numbers);
    ``mass[N,B,query]``; ``cost[N,B]``: per k of ``TOPKS`` the ``COST_FIELDS``."""
    rows, mass, cost = {}, {}, {}
    for N in CONTEXT:
        for B in BLOCKS:
            points = [cost_point(N, B, t) for t in TOPKS]
            cost[_key(N, B)] = [[c[f] for f in COST_FIELDS] for c in points]
            for i in query_rows(N):
                for m in METHODS:
                    r = row_point(m, N, B, i)
                    rows[_key(m, N, B, i)] = r["order"] + r["kept"]
                mass[_key(N, B, i)] = r["mass"]
    return {
        "methods": METHODS,
        "names": [NAMES[m] for m in METHODS],
        "colors": [COLORS[m] for m in METHODS],
        "N": CONTEXT,
        "B": BLOCKS,
        "topk": TOPK_MAX,
        "topks": TOPKS,
        "queries": {str(N): query_rows(N) for N in CONTEXT},
        "thumb_size": THUMB,
        "thumb": {str(N): map_thumbnail(N) for N in CONTEXT},
        "d": D,
        "dense_tile": DENSE_TILE,
        "rows": rows,
        "mass": mass,
        "cost": cost,
    }


# ---------------------------------------------------------------------------------
# Vega-Lite specs
# ---------------------------------------------------------------------------------


def _pos(field, title, reverse=False):
    scale = {"zero": False, "nice": False, **({"reverse": True} if reverse else {})}
    return {"field": field, "type": "quantitative", "title": title, "scale": scale}


def map_spec(height: int = 300) -> dict:
    """The map in token units (data "cells": {x, x2, y, y2, mass}), the query's row
    (data "query": {y}) and the chosen blocks on it (data "chosen": {x, x2, y, y2,
    color})."""
    return {
        **frame(height),
        "layer": [
            {
                "data": {"name": "cells"},
                "mark": {"type": "rect"},
                "encoding": {
                    "x": _pos("x", "key position"),
                    "x2": {"field": "x2"},
                    "y": _pos("y", "query position", reverse=True),
                    "y2": {"field": "y2"},
                    "color": {
                        "field": "mass",
                        "type": "quantitative",
                        "title": "mass of the row",
                        "scale": {"scheme": "greys", "type": "sqrt", "domain": [0, 1]},
                        "legend": {"orient": "bottom", "gradientLength": 160},
                    },
                },
            },
            {
                "data": {"name": "query"},
                "mark": {"type": "rule", "color": "#E8590C", "strokeDash": [4, 3]},
                "encoding": {"y": {"field": "y", "type": "quantitative"}},
            },
            {
                "data": {"name": "chosen"},
                "mark": {"type": "rect", "opacity": 0.85},
                "encoding": {
                    "x": {"field": "x", "type": "quantitative"},
                    "x2": {"field": "x2"},
                    "y": {"field": "y", "type": "quantitative"},
                    "y2": {"field": "y2"},
                    "color": {"field": "color", "type": "nominal", "scale": None},
                },
            },
        ],
        **FONT,
    }


def row_spec(height: int = 200) -> dict:
    """The query row's mass per block (data "blocks": {x, x2, mass, chosen})."""
    return {
        **frame(height),
        "data": {"name": "blocks"},
        "mark": {"type": "rect", "stroke": "#FFFFFF", "strokeWidth": 0.3},
        "encoding": {
            "x": _pos("x", "key position (blocks of the query's row)"),
            "x2": {"field": "x2"},
            "y": {"field": "mass", "type": "quantitative", "title": "share of the row"},
            "color": {
                "field": "chosen",
                "type": "nominal",
                "scale": {
                    "domain": ["chosen", "not chosen"],
                    "range": ["#E8590C", "#BDBDBD"],
                },  # fmt: skip
                "legend": {"orient": "bottom", "title": None},
            },
            "tooltip": [
                {"field": "x", "type": "quantitative", "title": "first key"},
                {"field": "mass", "type": "quantitative", "format": ".3f"},
            ],
        },
        **FONT,
    }


# ---------------------------------------------------------------------------------
# The two faces and the one call
# ---------------------------------------------------------------------------------


def static_sparse_explorer(method="moba", N=1024, block_size=64, topk=4, query=None):
    """The static site's twin: ``sparse_grid`` and the specs, drawn in the browser."""
    query = _check(method, N, block_size, topk, query)
    init = {
        "method": METHODS.index(method),
        "N": CONTEXT.index(N),
        "B": BLOCKS.index(block_size),
        "topk": TOPKS.index(topk),
        "query": query_rows(N).index(query),
    }
    config = {
        "grid": sparse_grid(),
        "init": init,
        "specs": {"map": map_spec(), "row": row_spec()},
    }
    return Explorer(
        "sparse",
        config,
        "Sparse-attention explorer (chapter 8)",
        "explorers.sparse_explorer()",
    )


def readout(method: str, N: int, block_size: int, topk: int, query: int) -> str:
    """The explorer's text, from ``row_point`` and ``cost_point``."""
    from attention.plots import human_bytes

    r = row_point(method, N, block_size, query)
    o = row_point("oracle", N, block_size, query)
    c = cost_point(N, block_size, topk)
    chosen = [b for b in r["order"][:topk] if b >= 0]
    keys = sum(min(block_size, query + 1 - b * block_size) for b in chosen)

    def gf(x):  # GFLOPs, three significant digits, no exponent (the page's rule:
        # String(Number(x.toPrecision(3))) in JavaScript prints 0.0000983, not 9.83e-05)
        return np.format_float_positional(float(f"{x / 1e9:.3g}"), trim="-")

    total, a = c["flops"] + c["gate_flops"], TOPKS.index(topk)
    return (
        f"{NAMES[method]}, N = {N:,}, blocks of {block_size}, budget {topk}: query "
        f"{query:,} reads {len(chosen)} of its {len(r['mass'])} visible blocks "
        f"({keys:,} of {query + 1:,} keys) and keeps {r['kept'][a]:.1f}% of "
        f"its attention mass (the oracle's {topk} blocks: "
        f"{o['kept'][a]:.1f}%). A causal prefill of N tokens, one head, "
        f"d = {D}, bf16: {gf(c['flops'])} GFLOPs and {human_bytes(c['bytes'])} of HBM "
        f"traffic, plus the gate's {gf(c['gate_flops'])} GFLOPs and "
        f"{human_bytes(c['gate_bytes'])}; dense causal attention: "
        f"{gf(c['dense_flops'])} GFLOPs and {human_bytes(c['dense_bytes'])}. So "
        f"{total / c['dense_flops']:.2f}x the FLOPs and "
        f"{c['bytes'] / c['dense_bytes']:.2f}x the bytes of dense: each query loads "
        f"its own blocks, where the dense kernel shares each K/V tile among "
        f"{DENSE_TILE} queries."
    )


class SparsePicture:
    """The live face's figure, built once and updated in place: the map with the
    query's row and its chosen blocks, and the row's mass per block (chosen ones in
    orange). ``png`` redraws the axes only when N changed and otherwise blits the
    artists that move over them (a new figure per move costs more than the 0.3 s a
    slider may take)."""

    def __init__(self):
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator

        from attention.plots.masks import length_label

        self.label = length_label
        # not pyplot's: no figure left open, none shown twice in a notebook
        self.fig = Figure(figsize=(8.4, 3.0), dpi=80)
        FigureCanvasAgg(self.fig)
        a0, a1 = self.fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.6]})
        self.fig.subplots_adjust(left=0.09, right=0.98, bottom=0.17, top=0.95,
                                 wspace=0.24)  # fmt: skip
        self.axes = a0, a1
        for ax in self.axes:  # ticks under the data, as the blit draws them
            ax.set_axisbelow(True)
        self.im = a0.imshow(np.zeros((THUMB, THUMB)), cmap="Greys", vmin=0, vmax=1,
                            interpolation="nearest", aspect="auto")  # fmt: skip
        self.line = a0.axhline(0, color="#E8590C", ls="--", lw=1)
        self.picked = a0.broken_barh([], (0, 1), alpha=0.85)
        a0.set(xlabel="key position", ylabel="query position")
        self.all = a1.stairs([0.0], [0.0, 1.0], fill=True, color="#BDBDBD")
        self.sel = a1.stairs([0.0], [0.0, 1.0], fill=True, color="#E8590C")
        a1.set(xlabel="key position (blocks of the query's row)",
               ylabel="mass / the row's largest block")  # fmt: skip
        a1.yaxis.set_major_locator(MaxNLocator(4))
        self._bgs, self._bg_key = {}, None

    def _axes(self, N):
        """What N alone fixes: the map, the ticks, the limits."""
        a0, a1 = self.axes
        self.im.set_data(np.sqrt(np.array(map_thumbnail(N)) / 1000))
        self.im.set_extent((0, N, N, 0))
        ticks = [N // 4 * j for j in range(5)]
        for set_ticks in (a0.set_xticks, a0.set_yticks, a1.set_xticks):
            set_ticks(ticks, [self.label(t) for t in ticks])
        a1.set(xlim=(0, N), ylim=(0, 1.05))

    def _data(self, method, N, block_size, topk, query):
        """The artists every other setting moves: the query's row, its blocks' mass
        (relative to its largest block) and the chosen blocks."""
        r = row_point(method, N, block_size, query)
        chosen = [b for b in r["order"][:topk] if b >= 0]
        self.line.set_ydata([query, query])
        mass = np.array(r["mass"], dtype=float)
        mass /= max(mass.max(), 1.0)
        edges = np.minimum(np.arange(mass.size + 1) * block_size, query + 1)
        h = N / THUMB
        self.picked.set_verts(
            [
                [(x0, query - h), (x0, query + h), (x1, query + h), (x1, query - h)]
                for x0, x1 in ((edges[b], edges[b + 1]) for b in chosen)
            ]
        )
        self.picked.set_color(COLORS[method])
        self.picked.set_alpha(0.85)
        self.all.set_data(mass, edges)
        keep = np.isin(np.arange(mass.size), chosen)
        self.sel.set_data(np.where(keep, mass, 0.0), edges)
        return r

    def update(self, method, N, block_size, topk, query):
        """Set every artist to one setting (titled: a figure of its own)."""
        self._axes(N)
        r = self._data(method, N, block_size, topk, query)
        self.axes[0].set_title(NAMES[method], fontsize=10)
        self.axes[1].set_title(
            f"query {query:,}: kept {r['kept'][TOPKS.index(topk)]:.1f}%", fontsize=10
        )
        self.fig.subplots_adjust(top=0.9)
        self._bgs, self._bg_key = {}, None
        return self.fig

    def png(self, method, N, block_size, topk, query) -> str:
        """The figure at one setting as a base64 PNG: the axes drawn once per N, the
        data artists blitted over them."""
        from .common import blit_order, canvas_png

        canvas, (a0, a1) = self.fig.canvas, self.axes
        moving = blit_order((a0, [self.line, self.picked]), (a1, [self.all, self.sel]))
        if N != self._bg_key:
            self._axes(N)
            self._bg_key = N
        if N not in self._bgs:  # the axes of each N drawn once
            for artist in moving:
                artist.set_visible(False)
            canvas.draw()
            self._bgs[N] = canvas.copy_from_bbox(self.fig.bbox)
            for artist in moving:
                artist.set_visible(True)
        else:
            canvas.restore_region(self._bgs[N])
        self._data(method, N, block_size, topk, query)
        for artist in moving:
            artist.axes.draw_artist(artist)
        return canvas_png(self.fig, self.fig.bbox_inches)  # the whole canvas


def sparse_figure(method="moba", N=1024, block_size=64, topk=4, query=1023):
    """The live explorer's figure at one setting, as a new matplotlib figure."""
    query = _check(method, N, block_size, topk, query)
    return SparsePicture().update(method, N, block_size, topk, query)


def live_sparse_explorer(method="moba", N=1024, block_size=64, topk=4, query=None):
    """ipywidgets: each change updates one ``SparsePicture`` (its PNG cached per
    setting) and the readout; the query keeps its eighth of the sequence as N moves."""
    import ipywidgets as widgets

    query = _check(method, N, block_size, topk, query)
    values = dict(method=method, N=N, block_size=block_size, topk=topk, query=query)
    c = controls(settings(N), values)
    text, out = widgets.HTML(), widgets.Output()
    busy, picture, pngs = [], SparsePicture(), PngCache()  # one figure, its PNGs

    def redraw(_=None):
        if busy:
            return
        s = {k: w.value for k, w in c.items()}
        text.value = "<p>" + readout(**s) + "</p>"
        show_png(out, pngs.get(tuple(s.values()), lambda: picture.png(**s)))

    def new_n(change):
        j = query_rows(change["old"]).index(c["query"].value)
        busy.append(1)  # one redraw for the new N and its query rows
        c["query"].options = query_rows(change["new"])
        c["query"].value = query_rows(change["new"])[j]
        busy.clear()
        redraw()

    c["N"].observe(new_n, names="value")
    for name, w in c.items():
        if name != "N":
            w.observe(redraw, names="value")
    redraw()
    return widgets.VBox(
        [
            widgets.HBox([c["method"], c["block_size"]]),
            widgets.HBox([c["N"], c["topk"]]),
            c["query"],
            text,
            out,
        ]
    )


def sparse_explorer(
    method: str = "moba",
    N: int = 1024,
    block_size: int = 64,
    topk: int = 4,
    query: int | None = None,
):
    """Chapter 8's explorer, one call: the static twin on the built site
    (``ON_SITE``), ipywidgets in Jupyter and Colab. ``method`` one of ``METHODS``,
    ``query`` one of ``query_rows(N)`` (None: the last row)."""
    face = static_sparse_explorer if site.ON_SITE else live_sparse_explorer
    return face(method=method, N=N, block_size=block_size, topk=topk, query=query)


__all__ = [
    "BASE_SETTINGS",
    "METHODS",
    "SparsePicture",
    "cost_point",
    "live_sparse_explorer",
    "map_thumbnail",
    "query_rows",
    "readout",
    "row_point",
    "settings",
    "sparse_explorer",
    "sparse_figure",
    "sparse_grid",
    "static_sparse_explorer",
    "synthetic_qk",
]
