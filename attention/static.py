"""The book's explorers for the static site: data computed here, drawn in the browser.

On the built site no Python runs, so each explorer of ``attention.widgets`` has a twin
here. Its data is computed when the chapter executes, by the same ``attention``
functions the notebook calls (``memory.closed_form`` grids, ``memory.simulate`` traces,
``hard.gumbel_softmax``), and written into the page as JSON beside Vega-Lite specs.
The page's own script (``_static/explorers.js``) only looks rows up in that JSON and
hands them to Vega (vendored from ``vl-convert-python`` into the build by ``setup``):
no number is re-derived in JavaScript, except bytes = elements x bytes per element,
which is exactly ``Traffic.bytes``.

``ON_SITE`` is true while the site is built (``setup`` sets it for the executing
kernels), so a chapter shows ``static.X()`` there and ``widgets.X()`` in Jupyter/Colab.
``tqdm`` is tqdm's auto progress bar in Jupyter and a silent one on the site.
"""

from __future__ import annotations

import functools
import html
import itertools
import json
import os
import uuid

import numpy as np

#: Set (to "1") by ``setup`` in the Sphinx process; kernels it starts inherit it.
SITE_ENV = "ATTENTION_STATIC_SITE"
ON_SITE = os.environ.get(SITE_ENV) == "1"

if ON_SITE:
    from tqdm.std import tqdm as _tqdm

    # No widget, no stderr noise on the page.
    tqdm = functools.partial(_tqdm, disable=True)
else:
    from tqdm.auto import tqdm  # noqa: F401  (a widget in Jupyter, text in a terminal)

#: The Vega bundle's file name in the build's _static folder.
BUNDLE = "vega-bundle.js"

# Grids. Chapter 2 (and the landing page's teaser) cover these exactly.
TILE_N = [2**k for k in range(8, 17)]  # 256 .. 65536
TILE_D = [32, 64, 128, 256]
TILE_B = [16, 32, 64, 128, 256]
FORWARD = ["standard", "flash1", "flash2"]
BACKWARD = ["standard_bwd", "flash2_bwd", "flash2_bwd_split"]
#: On-chip memory per SM a kernel can use (KiB, as NVIDIA's "KB"), and the paper's.
SRAM_KIB = [("T4 (64 KB shared)", 64),
            ("L4 (100 KB shared)", 100),
            ("A100 (164 KB shared)", 164),
            ("A100 L1+shared, the paper's (192 KB)", 192),
            ("H100 (228 KB shared)", 228)]
#: The step view walks the schedule at this (small) N.
TRACE_N = 256
TRACE_D = 64


def _dtypes():
    from attention import plots

    return list(plots.DTYPE_BYTES.items())


def _colors():
    from attention import plots

    return {**plots.TENSOR_COLORS, "SRAM": plots.MEMORY_COLORS["SRAM"]}


def _flat(per_tensor: dict, names: list[str]) -> list[int]:
    """[reads, writes] of each tensor in ``names`` (0, 0 where absent), flattened."""
    out = []
    for n in names:
        r, w = per_tensor.get(n, (0, 0))
        out += [int(r), int(w)]
    return out


def _tensor_names(results) -> list[str]:
    return list(dict.fromkeys(t for r in results for t in r.per_tensor))


# ---------------------------------------------------------------------------------
# Chapter 2: the tile-size explorer.
# ---------------------------------------------------------------------------------


def tile_grid(Ns=TILE_N, ds=TILE_D, Bs=TILE_B,
              algorithms=FORWARD + BACKWARD) -> dict:
    """``memory.closed_form`` of each algorithm at every (N, d, Br, Bc) of the grid.

    ``counts[alg][k]`` is [r_0, w_0, r_1, w_1, ..., sram_peak] over ``tensors[alg]``,
    with k = ((iN * len(ds) + id) * len(Bs) + iBr) * len(Bs) + iBc. Counts are elements;
    they do not depend on the SRAM size or the dtype (which only decide whether the
    tiles fit: ``sram_peak <= M``, the test ``closed_form(..., M=M)`` makes).
    """
    from attention import memory

    tensors, counts = {}, {}
    for alg in algorithms:
        res = [memory.closed_form(alg, N, d, Br=br, Bc=bc)
               for N, d, br, bc in itertools.product(Ns, ds, Bs, Bs)]
        tensors[alg] = _tensor_names(res)
        counts[alg] = [_flat(r.per_tensor, tensors[alg]) + [int(r.sram_peak)]
                       for r in res]
    return {"N": list(Ns), "d": list(ds), "B": list(Bs), "tensors": tensors,
            "counts": counts}


#: How the explorer names the compulsory count beside the simulated one.
COMPULSORY_LABEL = "compulsory (each tensor once)"  # short: fits a 390 px legend row


def compulsory_grid(Ns=TILE_N, ds=TILE_D, algorithms=FORWARD + BACKWARD) -> dict:
    """``memory.compulsory`` of each algorithm at every (N, d): ``counts[alg][k]`` is
    [total elements, *per-tensor reads and writes over ``tensors[alg]``], with
    k = iN * len(ds) + id. Each tensor crosses HBM once: the lower bound an L2 that
    holds the re-reads gets near (the tiles do not change it)."""
    from attention import memory

    tensors, counts = {}, {}
    for alg in algorithms:
        res = [memory.compulsory(alg, N, d) for N, d in itertools.product(Ns, ds)]
        tensors[alg] = _tensor_names(res)
        counts[alg] = [[int(r.total)] + _flat(r.per_tensor, tensors[alg]) for r in res]
    return {"N": list(Ns), "d": list(ds), "tensors": tensors, "counts": counts,
            "label": COMPULSORY_LABEL}


def sram_table(Ns=TILE_N, ds=TILE_D, srams=SRAM_KIB) -> dict:
    """M (elements) for each SRAM size and dtype (``M[si][ti]``), and FA1's rule there:
    ``rule["si,ti,di,Ni"]`` = [Br, Bc] of ``memory.fa1_block_sizes(M, d)`` and the SRAM
    its flash1 tiles need at N (``memory.sram_need``)."""
    from attention import memory

    M, rule = [], {}
    for si, (_, kib) in enumerate(srams):
        row = []
        for ti, (_, bpe) in enumerate(_dtypes()):
            m = kib * 1024 // bpe
            row.append(m)
            for di, d in enumerate(ds):
                br, bc = memory.fa1_block_sizes(m, d)
                for ni, N in enumerate(Ns):
                    need = memory.sram_need("flash1", N, d, br, bc)
                    rule[f"{si},{ti},{di},{ni}"] = [br, bc, need]
        M.append(row)
    return {"M": M, "rule": rule}


def _fmt(events, op) -> str:
    names = [f"{t.tensor}[{','.join(map(str, t.block))}]" if t.block else t.tensor
             for t in events if t.op == op]
    return " ".join(dict.fromkeys(names)) or "-"


def schedule_steps(algorithm: str, N: int, d: int, Br: int, Bc: int) -> list[list]:
    """The steps of ``memory.simulate(algorithm, ..., keep_trace=True)``, one row each:
    [i, j, tensor, loads, stores]. (i, j) is the tile of S computed on chip (j = -1: the
    whole query block i, a row pass); ``tensor`` is the N x N_k tensor (S, P, dP or dS)
    whose tile crossed HBM at that step, or "SRAM" if it lived only on chip."""
    from attention import memory, plots

    t = memory.simulate(algorithm, N, d, Br=Br, Bc=Bc, keep_trace=True)
    steps: dict[int, list] = {}
    for ev in t.trace:
        steps.setdefault(ev.step, []).append(ev)
    rows = []
    for s in sorted(steps):
        ev = steps[s]
        comp = [e for e in ev if e.op == "compute"]
        block = comp[0].block if comp else ()
        quad = [e.tensor for e in ev
                if e.tensor in plots.QUADRATIC_TENSORS and e.op != "compute"]
        rows.append([block[0] if block else -1, block[1] if len(block) > 1 else -1,
                     quad[-1] if quad else "SRAM", _fmt(ev, "load"), _fmt(ev, "store")])
    return rows


def schedule_table(N=TRACE_N, d=TRACE_D, Bs=TILE_B,
                   algorithms=FORWARD + BACKWARD) -> dict:
    """``schedule_steps`` of each algorithm at every (Br, Bc), keyed "alg,Br,Bc", with
    the grid's T_r = ceil(N/Br) and T_c = ceil(N/Bc)."""
    from attention import memory

    return {"N": N, "d": d,
            "runs": {f"{a},{br},{bc}": {"tr": memory.cdiv(N, br),
                                        "tc": memory.cdiv(N, bc),
                                        "steps": schedule_steps(a, N, d, br, bc)}
                     for a in algorithms for br in Bs for bc in Bs}}


# ---------------------------------------------------------------------------------
# Vega-Lite specs (the encodings; the data comes from the grids above).
# ---------------------------------------------------------------------------------

_FONT = {"config": {"font": "system-ui, -apple-system, Segoe UI, sans-serif",
                    "view": {"stroke": None},
                    "axis": {"labelFontSize": 11, "titleFontSize": 11},
                    "legend": {"labelFontSize": 11, "titleFontSize": 11}}}


def _color_scale(tensors: list[str]) -> dict:
    colors = _colors()
    return {"domain": tensors, "range": [colors.get(t, "#333333") for t in tensors]}


def bars_spec(tensors: list[str], title: str = "HBM traffic (bytes)",
              height: int = 240) -> dict:
    """Stacked bars of HBM bytes per group (algorithm), split by tensor; writes lighter.
    Data "bars": rows {group, tensor, kind ("read"/"written"), bytes, order}."""
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v6.json",
        "width": "container", "height": height,
        "autosize": {"type": "fit", "contains": "padding"},
        "data": {"name": "bars"},
        "mark": {"type": "bar", "stroke": "#222", "strokeWidth": 0.4},
        "encoding": {
            "x": {"field": "group", "type": "nominal", "sort": None, "title": None,
                  "axis": {"labelAngle": 0, "labelLimit": 140}},
            "y": {"field": "bytes", "type": "quantitative", "stack": "zero",
                  "title": title, "axis": {"format": "~s"}},
            "color": {"field": "tensor", "type": "nominal",
                      "scale": _color_scale(tensors),
                      "legend": {"orient": "bottom", "columns": 5, "title": None,
                                 "symbolType": "square"}},
            "opacity": {"field": "kind", "type": "ordinal",
                        "scale": {"domain": ["read", "written"], "range": [1.0, 0.45]},
                        "legend": {"orient": "top", "title": None, "columns": 2}},
            "order": {"field": "order", "type": "quantitative"},
            "tooltip": [{"field": "group"}, {"field": "tensor"}, {"field": "kind"},
                        {"field": "bytes", "type": "quantitative", "format": ","}],
        },
        **_FONT,
    }


def bars_floor_spec(tensors: list[str], label: str = COMPULSORY_LABEL,
                    height: int = 240) -> dict:
    """``bars_spec`` (the simulated traffic, no L2) with a black tick across each bar at
    its compulsory traffic. Data "bars" as ``bars_spec``; data "compulsory": rows
    {group, what (= ``label``), elements, bytes}."""
    spec = bars_spec(tensors, title="HBM bytes, simulated (no L2)", height=height)
    bars = {k: spec.pop(k) for k in ("data", "mark", "encoding")}
    tick = {
        "data": {"name": "compulsory"},
        "mark": {"type": "tick", "thickness": 3, "color": "#000000"},
        "encoding": {
            "x": {"field": "group", "type": "nominal", "sort": None},
            "y": {"field": "bytes", "type": "quantitative",
                  "title": bars["encoding"]["y"]["title"]},
            "color": {"field": "what", "type": "nominal",
                      "scale": {"domain": [label], "range": ["#000000"]},
                      "legend": {"orient": "top", "title": None, "symbolType": "stroke",
                                 "symbolStrokeWidth": 3, "labelLimit": 320}},
            "tooltip": [{"field": "group"}, {"field": "what", "title": "count"},
                        {"field": "bytes", "type": "quantitative", "format": ","}],
        },
    }
    spec["layer"] = [bars, tick]
    spec["resolve"] = {"scale": {"color": "independent"},
                       "legend": {"color": "independent"}}
    return spec


def lines_spec(series: list[str], colors: list[str], x_title: str, height: int = 240,
               y_title: str = "HBM traffic (bytes)") -> dict:
    """Log-log lines of bytes against a size, one per series, and a rule at the chosen
    size. Data "lines": {x, series, bytes}; data "marker": {x}."""
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v6.json",
        "width": "container", "height": height,
        "autosize": {"type": "fit", "contains": "padding"},
        "layer": [
            {"data": {"name": "lines"},
             "mark": {"type": "line", "point": {"size": 18}, "strokeWidth": 2},
             "encoding": {
                 "x": {"field": "x", "type": "quantitative", "title": x_title,
                       "scale": {"type": "log", "base": 2},
                       "axis": {"format": ",d", "labelOverlap": "greedy",
                                "tickCount": 5, "labelSeparation": 6}},
                 "y": {"field": "bytes", "type": "quantitative", "title": y_title,
                       "scale": {"type": "log"}, "axis": {"format": "~s"}},
                 "color": {"field": "series", "type": "nominal", "sort": series,
                           "scale": {"domain": series, "range": colors},
                           "legend": {"orient": "bottom", "columns": 3, "title": None,
                                      "labelLimit": 260}},
                 "tooltip": [{"field": "series"},
                             {"field": "x", "type": "quantitative"},
                             {"field": "bytes", "type": "quantitative",
                              "format": ","}]}},
            {"data": {"name": "marker"},
             "mark": {"type": "rule", "color": "#8C8C8C", "strokeDash": [4, 3]},
             "encoding": {"x": {"field": "x", "type": "quantitative"}}},
        ],
        **_FONT,
    }


def tiles_spec(height: int = 240) -> dict:
    """The grid of (i, j) tiles of S at one step of a schedule. Data "tiles":
    {i, j, fill (a tensor, "SRAM" or "pending"), current (bool)}."""
    colors = _colors()
    fills = ["S", "P", "dP", "dS", "SRAM", "pending"]
    rng = [colors[f] for f in fills[:-1]] + ["#ffffff"]
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v6.json",
        "width": "container", "height": height,
        "autosize": {"type": "fit", "contains": "padding"},
        "data": {"name": "tiles"},
        "mark": {"type": "rect", "stroke": "#cccccc", "strokeWidth": 0.5},
        "encoding": {
            "x": {"field": "j", "type": "ordinal", "title": "key block j",
                  "axis": {"labelAngle": 0}},
            "y": {"field": "i", "type": "ordinal", "title": "query block i"},
            "color": {"field": "fill", "type": "nominal",
                      "scale": {"domain": fills, "range": rng},
                      "legend": {"orient": "bottom", "title": "tile went to",
                                 "columns": 3}},
            "opacity": {"condition": {"test": ("datum.current || "
                                               "datum.fill == 'pending'"),
                                      "value": 1.0},
                        "value": 0.35},
            "strokeWidth": {"condition": {"test": "datum.current", "value": 2.5},
                            "value": 0.5},
            "stroke": {"condition": {"test": "datum.current", "value": "#000000"},
                       "value": "#cccccc"},
            "tooltip": [{"field": "i"}, {"field": "j"}, {"field": "fill"}],
        },
        **_FONT,
    }


# ---------------------------------------------------------------------------------
# The HTML object: a <div> with the data as JSON; _static/explorers.js draws it.
# ---------------------------------------------------------------------------------


class Explorer:
    """A static explorer: ``kind`` names its drawing code in ``_static/explorers.js``,
    ``config`` holds its controls, Vega-Lite specs and precomputed data."""

    def __init__(self, kind: str, config: dict, title: str, live: str):
        self.kind, self.config, self.title, self.live = kind, config, title, live

    def to_json(self) -> str:
        # "</" cannot end the <script> element early; JSON stays valid with "<\/".
        return json.dumps({"kind": self.kind, **self.config},
                          separators=(",", ":")).replace("</", "<\\/")

    def _repr_html_(self) -> str:
        eid = f"explorer-{self.kind}-{uuid.uuid4().hex[:8]}"
        fallback = (f"This explorer draws in the web browser on the book's site. In "
                    f"Jupyter or Colab, run <code>{html.escape(self.live)}</code> "
                    f"instead.")
        return (f'<div class="static-explorer" id="{eid}" data-kind="{self.kind}" '
                f'role="group" aria-label="{html.escape(self.title)}">'
                f'<p class="static-explorer-fallback">{fallback}</p>'
                f'<script type="application/json" class="static-explorer-data">'
                f"{self.to_json()}</script></div>")

    def __repr__(self) -> str:
        return f"<static explorer {self.kind!r}: {self.title}>"


def tile_size_explorer(N: int = 1024, d: int = 64, sram: int = 192, Br: int = 64,
                       Bc: int = 64, dtype: str = "float16",
                       algorithm: str = "flash2") -> Explorer:
    """Chapter 2's tile-size explorer for the static site: HBM bytes of the forward (or
    backward) algorithms per tensor (simulated, no L2) with each one's compulsory
    traffic beside it (``memory.compulsory``), the chosen algorithm's SRAM need against
    M, FA1's rule, and its schedule over the tiles of S step by step at N =
    ``TRACE_N``."""
    grid = tile_grid()
    fwd_t = _tensor_names_from(grid, FORWARD)
    bwd_t = _tensor_names_from(grid, BACKWARD)
    dtypes = _dtypes()
    sram_i = next(i for i, (_, kib) in enumerate(SRAM_KIB) if kib == sram)
    config = {
        "grid": grid, "sram": sram_table(), "schedule": schedule_table(),
        "compulsory": compulsory_grid(),
        "groups": {"fwd": FORWARD, "bwd": BACKWARD},
        "dtypes": dtypes, "srams": SRAM_KIB,
        "init": {"N": TILE_N.index(N), "d": TILE_D.index(d), "sram": sram_i,
                 "Br": TILE_B.index(Br), "Bc": TILE_B.index(Bc),
                 "dtype": [n for n, _ in dtypes].index(dtype),
                 "algorithm": (FORWARD + BACKWARD).index(algorithm), "step": 0},
        "specs": {"bars_fwd": bars_floor_spec(fwd_t),
                  "bars_bwd": bars_floor_spec(bwd_t), "tiles": tiles_spec()},
    }
    return Explorer("tile", config, "Tile-size explorer (chapter 2)",
                    "widgets.tile_size_explorer()")


def _tensor_names_from(grid: dict, algorithms: list[str]) -> list[str]:
    return list(dict.fromkeys(t for a in algorithms for t in grid["tensors"][a]))


def teaser(d: int = 64, dtype: str = "float16") -> Explorer:
    """The landing page's explorer: standard attention against FlashAttention-2
    (forward), HBM bytes per tensor as N and the tiles change (from
    ``memory.closed_form``)."""
    grid = tile_grid(ds=[d], algorithms=["standard", "flash2"])
    bpe = dict(_dtypes())[dtype]
    tensors = _tensor_names_from(grid, ["standard", "flash2"])
    config = {"grid": grid, "bpe": bpe, "dtype": dtype,
              "init": {"N": TILE_N.index(4096), "Br": TILE_B.index(64),
                       "Bc": TILE_B.index(64)},
              "specs": {"bars": bars_spec(tensors, height=220)}}
    return Explorer("teaser", config, "Standard attention against FlashAttention-2",
                    "widgets.tile_size_explorer()")


# ---------------------------------------------------------------------------------
# Chapter 1: the traffic of standard attention against n, m, d and the dtype.
# ---------------------------------------------------------------------------------

# 64 .. 8192
NAIVE_N = sorted({2**k for k in range(6, 14)} | {3 * 2**k for k in range(5, 12)})
NAIVE_M = [2**k for k in range(4, 14)]  # 16 .. 8192 queries
NAIVE_D = [16, 32, 64, 128, 256]
NAIVE_TENSORS = ["Q", "K", "V", "S", "P", "O"]


def naive_grid(ns=NAIVE_N, ms=NAIVE_M, ds=NAIVE_D, Br: int = 64, Bc: int = 64) -> dict:
    """``memory.closed_form("standard", m, d, Br, Bc, N_k=n)`` for m = n (self) and
    every m of the grid: ``counts[mi + 1][di][ni]`` = [r_Q, w_Q, ..., r_O, w_O] over
    ``NAIVE_TENSORS`` (mi = -1 is self-attention)."""
    from attention import memory

    counts = []
    for m in [None, *ms]:
        counts.append([[_flat(memory.closed_form("standard", n if m is None else m, d,
                                                 Br=Br, Bc=Bc, N_k=n).per_tensor,
                              NAIVE_TENSORS)
                        for n in ns] for d in ds])
    return {"n": list(ns), "m": list(ms), "d": list(ds), "tensors": NAIVE_TENSORS,
            "counts": counts, "Br": Br, "Bc": Bc}


def naive_traffic_explorer(n: int = 1024, m: int | None = None, d: int = 64,
                           dtype: str = "float16") -> Explorer:
    """Chapter 1's explorer for the static site: bytes of standard attention against
    the key length n, per tensor, and the per-tensor split at (m, n)."""
    grid = naive_grid()
    dtypes = _dtypes()
    colors = _colors()
    config = {"grid": grid, "dtypes": dtypes,
              "init": {"n": NAIVE_N.index(n), "self": m is None,
                       "m": NAIVE_M.index(m if m is not None else 1024),
                       "d": NAIVE_D.index(d),
                       "dtype": [k for k, _ in dtypes].index(dtype)},
              "specs": {"lines": lines_spec(NAIVE_TENSORS + ["total"],
                                            [colors[t] for t in NAIVE_TENSORS]
                                            + ["#000000"],
                                            "key length n"),
                        "bars": bars_spec(NAIVE_TENSORS)}}
    return Explorer("naive", config, "Traffic of standard attention (chapter 1)",
                    "widgets.traffic_explorer_ch1()")


# ---------------------------------------------------------------------------------
# Chapter 3: the Gumbel-softmax temperature, and the traffic of top-k.
# ---------------------------------------------------------------------------------

#: The temperature slider of ``widgets.temperature_explorer``: 10^-2 .. 10^1.5 in
#: steps of 0.05.
TAU_EXP = [round(-2 + 0.05 * i, 2) for i in range(71)]


def temperature_grid(scores, noise, exps=TAU_EXP) -> dict:
    """``hard.gumbel_softmax(scores, tau, noise=noise)`` at each tau = 10^e (rounded to
    5 decimals), ``core.softmax(scores)`` and, per row, the Gumbel-max sample
    argmax(s + g)."""
    from attention import hard
    from attention.core import softmax

    s, g = np.asarray(scores, float), np.asarray(noise, float)
    ys = [np.round(hard.gumbel_softmax(s, 10.0**e, noise=g), 5).tolist() for e in exps]
    return {"tau_exp": list(exps), "y": ys,
            "p": np.round(softmax(s, axis=-1), 5).tolist(),
            "sample": np.argmax(s + g, axis=-1).tolist(), "shape": list(s.shape),
            # The inputs, so a test can recompute.
            "scores": s.tolist(), "noise": g.tolist()}


def temperature_explorer(scores, noise, tau: float = 1.0, row: int = 0) -> Explorer:
    """Chapter 3's temperature explorer for the static site, on the chapter's
    scores and Gumbel noise: the map of y = softmax((s + g) / tau), and one row
    beside softmax(s)."""
    from attention import plots

    grid = temperature_grid(scores, noise)
    e = round(float(np.log10(tau)), 2)
    soft, hard_c = plots.SELECTION_COLORS["soft"], plots.SELECTION_COLORS["hard"]
    n_q, n_k = grid["shape"]
    heat = {
        "$schema": "https://vega.github.io/schema/vega-lite/v6.json",
        "width": "container", "height": 200,
        "autosize": {"type": "fit", "contains": "padding"},
        "data": {"name": "map"},
        "layer": [
            {"mark": {"type": "rect"},
             "encoding": {
                 "x": {"field": "key", "type": "ordinal", "title": "key"},
                 "y": {"field": "query", "type": "ordinal", "title": "query"},
                 "color": {"field": "y", "type": "quantitative", "title": "weight",
                           "scale": {"scheme": "blues", "domain": [0, 1]},
                           "legend": {"orient": "right", "gradientLength": 120}},
                 "tooltip": [{"field": "query"}, {"field": "key"},
                             {"field": "y", "type": "quantitative", "format": ".4f"}]}},
            {"mark": {"type": "rect", "fill": None, "stroke": hard_c,
                      "strokeWidth": 2},
             "transform": [{"filter": "datum.selected"}],
             "encoding": {"x": {"field": "key", "type": "ordinal"},
                          "y": {"field": "query", "type": "ordinal"}}},
        ],
        **_FONT,
    }
    row_spec = {
        "$schema": "https://vega.github.io/schema/vega-lite/v6.json",
        "width": "container", "height": 200,
        "autosize": {"type": "fit", "contains": "padding"},
        "layer": [
            {"data": {"name": "row"},
             "mark": {"type": "bar", "color": soft, "opacity": 0.85},
             "encoding": {"x": {"field": "key", "type": "ordinal", "title": "key"},
                          "y": {"field": "y", "type": "quantitative", "title": "weight",
                                "scale": {"domain": [0, 1.08]}},
                          "tooltip": [{"field": "key"}, {"field": "y", "format": ".4f"},
                                      {"field": "p", "format": ".4f"}]}},
            {"data": {"name": "row"},
             "mark": {"type": "tick", "color": "black", "thickness": 2},
             "encoding": {"x": {"field": "key", "type": "ordinal"},
                          "y": {"field": "p", "type": "quantitative"}}},
            {"data": {"name": "sample"},
             "mark": {"type": "point", "shape": "triangle-down", "filled": True,
                      "size": 90, "color": hard_c},
             "encoding": {"x": {"field": "key", "type": "ordinal"},
                          "y": {"datum": 1.0, "type": "quantitative"}}},
        ],
        **_FONT,
    }
    config = {"grid": grid, "init": {"tau": TAU_EXP.index(e), "row": int(row)},
              "specs": {"map": heat, "row": row_spec}, "shape": [n_q, n_k]}
    return Explorer("temperature", config, "Gumbel-softmax temperature (chapter 3)",
                    "widgets.temperature_explorer(scores=S_map, noise=G_map)")


TOPK_N = [2**k for k in range(8, 17)]
TOPK_D = [32, 64, 128]
TOPK_K = [2**k for k in range(0, 9)]  # 1 .. 256


def topk_grid(ns=TOPK_N, ds=TOPK_D, ks=TOPK_K, Br: int = 64, Bc: int = 64) -> dict:
    """``memory.closed_form`` of soft, hard and top-k (each k) attention, at every
    (N, d): ``counts[name][di][ni]`` (name "soft", "hard" or "topk:k") over the
    names in ``tensors``."""
    # hard registers soft, hard, topk.
    from attention import hard, memory  # noqa: F401

    runs = {"soft": {}, "hard": {}, **{f"topk:{k}": {"k": k} for k in ks}}
    res = {name: [[memory.closed_form(name.split(":")[0], n, d, Br=Br, Bc=Bc, **kw)
                   for n in ns]
                  for d in ds] for name, kw in runs.items()}
    tensors = _tensor_names(r for rows in res.values() for row in rows for r in row)
    counts = {name: [[_flat(r.per_tensor, tensors) for r in row] for row in rows]
              for name, rows in res.items()}
    return {"N": list(ns), "d": list(ds), "k": list(ks), "tensors": tensors,
            "counts": counts}


def topk_traffic_explorer(N: int = 4096, d: int = 64, k: int = 8) -> Explorer:
    """Chapter 3's top-k traffic explorer for the static site: soft, hard and
    top-k bytes against N, and per tensor at N (closed forms; float16, 2 bytes
    per element)."""
    from attention import plots

    grid = topk_grid()
    c = plots.SELECTION_COLORS
    config = {"grid": grid, "bpe": 2,
              "init": {"N": TOPK_N.index(N), "d": TOPK_D.index(d),
                       "k": TOPK_K.index(k)},
              "specs": {"lines": lines_spec(["soft", "hard (argmax)", "top-k"],
                                            [c["soft"], c["hard"], c["topk"]],
                                            "sequence length N (N_q = N_k)"),
                        "bars": bars_spec(grid["tensors"])}}
    return Explorer("topk", config,
                    "Traffic of soft, hard and top-k attention (chapter 3)",
                    "widgets.topk_traffic_explorer()")


# ---------------------------------------------------------------------------------
# Chapter 4: deformable attention's traffic.
# ---------------------------------------------------------------------------------

DEFORM_SIDE = list(range(16, 129, 16))
DEFORM_D = [16, 32, 64, 128]
DEFORM_R = list(range(1, 17))
DEFORM_P = list(range(1, 17))
DEFORM_L = [1, 2, 3, 4]
DEFORM_ALGS = {"dense": "dense-image", "DAT fused": "dat", "DAT unfused": "dat-unfused",
               "MSDA": "msda"}


def deformable_grid(sides=DEFORM_SIDE, ds=DEFORM_D, rs=DEFORM_R, ps=DEFORM_P,
                    ls=DEFORM_L) -> dict:
    """``memory.closed_form`` of dense, DAT (fused, unfused) and MSDA over a side x
    side map: dense[di][si], dat[di][si][ri], dat-unfused[di][si][ri],
    msda[di][si][li][pi]."""
    # Importing deformable registers the algorithms.
    from attention import deformable, memory  # noqa: F401

    def cf(alg, **kw):
        return memory.closed_form(alg, **kw)

    res = {
        "dense-image": [[cf("dense-image", height=s, width=s, d=d) for s in sides]
                        for d in ds],
        "dat": [[[cf("dat", height=s, width=s, d=d, r=r) for r in rs] for s in sides]
                for d in ds],
        "dat-unfused": [[[cf("dat-unfused", height=s, width=s, d=d, r=r) for r in rs]
                         for s in sides] for d in ds],
        "msda": [[[[cf("msda", n_queries=s * s, d=d, n_levels=L, n_points=P)
                    for P in ps]
                   for L in ls] for s in sides] for d in ds],
    }

    def leaves(x):
        return [x] if hasattr(x, "per_tensor") else [r for y in x for r in leaves(y)]

    tensors = _tensor_names(r for v in res.values() for r in leaves(v))

    def enc(x):
        if hasattr(x, "per_tensor"):
            return _flat(x.per_tensor, tensors)
        return [enc(y) for y in x]

    return {"side": list(sides), "d": list(ds), "r": list(rs), "P": list(ps),
            "L": list(ls), "tensors": tensors,
            "counts": {a: enc(v) for a, v in res.items()},
            "names": DEFORM_ALGS}


def deformable_traffic_explorer(side: int = 64, d: int = 32, r: int = 4,
                                n_points: int = 4, n_levels: int = 4) -> Explorer:
    """Chapter 4's traffic explorer for the static site: per-tensor bytes of dense, DAT
    and MSDA at the chosen map, and the totals against the map side (float16)."""
    from attention import plots

    grid = deformable_grid()
    styles = plots.traffic._DEFORM_STYLES if hasattr(plots, "traffic") else {}
    colors = [styles.get(n, ("#333333", "-"))[0] for n in DEFORM_ALGS]
    # DAT unfused: the fused colour, lighter (no dashes in the legend).
    colors[2] = "#8FA9D6"
    config = {"grid": grid, "bpe": 2,
              "init": {"side": DEFORM_SIDE.index(side), "d": DEFORM_D.index(d),
                       "r": DEFORM_R.index(r), "P": DEFORM_P.index(n_points),
                       "L": DEFORM_L.index(n_levels)},
              "specs": {"bars": bars_spec(grid["tensors"]),
                        "lines": lines_spec(list(DEFORM_ALGS), colors,
                                            "map side (H = W); queries = H·W")}}
    return Explorer("deformable", config,
                    "Traffic of deformable attention (chapter 4)",
                    "widgets.deformable_traffic_explorer()")


# ---------------------------------------------------------------------------------
# The Sphinx hook: vendor Vega into the build, mark the kernels as building the site.
# ---------------------------------------------------------------------------------


def _write_bundle(app, exc) -> None:
    if exc is not None or app.builder.format != "html":
        return
    import pathlib

    import vl_convert

    out = pathlib.Path(app.outdir) / "_static" / BUNDLE
    out.parent.mkdir(parents=True, exist_ok=True)
    # One function scope: the bundle's top-level names (``_``, ``n``, ...) would
    # otherwise collide with other scripts' globals; it sets window.vegaEmbed, vega,
    # vegaLite itself.
    bundle = vl_convert.javascript_bundle()
    head = ("/* vega, vega-lite, vega-embed from vl-convert-python "
            f"{vl_convert.__version__} */")
    out.write_text(f"{head}\n(function () {{\n{bundle}\n}})();\n", encoding="utf-8")


def setup(app):
    """Sphinx extension (``_config.yml``: ``sphinx.extra_extensions``): executed
    chapters see ``ON_SITE``; every page loads the Vega bundle, written from
    ``vl-convert-python`` into the build's ``_static`` (no CDN, so the site works
    offline from files)."""
    os.environ[SITE_ENV] = "1"
    app.add_js_file(BUNDLE, priority=400)
    app.connect("build-finished", _write_bundle)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
