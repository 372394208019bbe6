"""Chapter 1's explorer of a real model: all-MiniLM-L6-v2's heads on the chapter's
sentences. Sentence, layer, head and query row -> that head's map with the row
outlined, the mean row entropy of every head on the sentence (the chosen one
outlined), the head's measured type, its mass on [CLS], [SEP] and punctuation, and
where the row's weight goes. One call, ``pretrained_explorer``: the static twin on the
site (every number computed here at build time by ``attention.pretrained``; the page's
script only looks rows up, ``_static/explorers.js``), ipywidgets in Jupyter and Colab.

Layers and heads are numbered from 1, as on the chapter's figures.
"""

from __future__ import annotations

import functools

import numpy as np

from attention import pretrained
from attention.plots import live
from attention.plots.pretrained import TYPE_LETTERS

from . import site
from .common import FONT, frame
from .settings import Choice, Range, check, controls
from .site import Explorer

#: The sentences the explorer offers (the chapter's), by name.
SENTENCES = {
    "coreference": "The trophy did not fit in the suitcase because it was too big.",
    "agreement": "The keys to the old cabinet are on the kitchen table.",
    "list": "We bought apples, pears, plums and cherries at the market.",
}
#: Head types are measured over these and the explorer's sentences together.
MORE_SENTENCES = (
    "The author who wrote these books lives in a small town.",
    "When the dog saw the cat, it ran up the tree.",
    "She said that the results, which surprised everyone, were correct.",
)
#: Weights are sent to the page in thousandths.
SCALE = 1000


@functools.lru_cache(maxsize=1)
def measured_types():
    """(stats, types): ``head_stats`` over the explorer's and the extra sentences and
    the head types they give (``attention.pretrained.head_types``)."""
    model = pretrained.load_minilm()
    stats = pretrained.head_stats(model, [*SENTENCES.values(), *MORE_SENTENCES])
    return stats, pretrained.head_types(stats)


@functools.lru_cache(maxsize=1)
def pretrained_grid() -> dict:
    """The twin's data: per sentence its tokens, ``w[layer][head][row][key]`` in
    thousandths, per-head statistics on that sentence (entropy in bits, mass on [CLS],
    [SEP], punctuation, 2 decimals), and the types measured over all the sentences."""
    model = pretrained.load_minilm()
    stats, types = measured_types()
    out = []
    for name, text in SENTENCES.items():
        toks, maps = model.tokens(text), model.attentions(text)
        s = pretrained.heads.sentence_stats(maps, toks)
        out.append(
            {
                "name": name,
                "text": text,
                "tokens": toks,
                "w": np.rint(maps * SCALE).astype(int).tolist(),
                **{
                    k: np.round(s[k], 2).tolist()
                    for k in ("entropy", "cls", "sep", "punct")
                },
                "uniform": round(float(np.log2(len(toks))), 2),
            }
        )
    return {
        "sentences": out,
        "types": types.tolist(),
        "letters": dict(TYPE_LETTERS),
        "n_measured": len(SENTENCES) + len(MORE_SENTENCES),
        "L": int(stats["entropy"].shape[0]),
        "H": int(stats["entropy"].shape[1]),
    }


def pretrained_point(sentence: str, layer: int, head: int, row: int) -> dict:
    """Everything the explorer says at one setting (``layer``, ``head`` from 1)."""
    _check(sentence, layer, head, row)
    g = pretrained_grid()
    s = g["sentences"][list(SENTENCES).index(sentence)]
    w = np.asarray(s["w"][layer - 1][head - 1][row]) / SCALE
    j = int(np.argmax(w))
    at = (layer - 1, head - 1)
    return {
        "tokens": s["tokens"],
        "type": g["types"][at[0]][at[1]],
        **{k: s[k][at[0]][at[1]] for k in ("entropy", "cls", "sep", "punct")},
        "uniform": s["uniform"],
        "row": w,
        "top": j,
    }


def readout(sentence: str, layer: int, head: int, row: int) -> str:
    """The explorer's text (the JavaScript twin writes the same sentence)."""
    p = pretrained_point(sentence, layer, head, row)
    t = p["tokens"]
    return (
        f"Head {layer}-{head}: measured type <b>{p['type']}</b> (over "
        f"{pretrained_grid()['n_measured']} sentences). On this sentence its mean row "
        f"entropy is {p['entropy']:.2f} bits (uniform: {p['uniform']:.2f}); a row "
        f"puts {p['cls']:.2f} of its weight on [CLS], {p['sep']:.2f} on [SEP] and "
        f"{p['punct']:.2f} on punctuation. Query {row} (<b>{t[row]}</b>) puts "
        f"<b>{p['row'][p['top']]:.3f}</b> on key {p['top']} (<b>{t[p['top']]}</b>)."
    )


# ---------------------------------------------------------------------------------
# Vega-Lite specs
# ---------------------------------------------------------------------------------


def map_spec(height: int = 300) -> dict:
    """The head's map (data "cells": {i, j, query, key, w}) with the query row
    outlined (data "outline")."""
    x = {"field": "key", "type": "ordinal", "sort": {"field": "j"}}
    y = {"field": "query", "type": "ordinal", "sort": {"field": "i"}}
    return {
        **frame(height),
        "layer": [
            {
                "data": {"name": "cells"},
                "mark": {"type": "rect"},
                "encoding": {
                    "x": {**x, "title": "key", "axis": {"labelAngle": -90}},
                    "y": {**y, "title": "query"},
                    "color": {
                        "field": "w",
                        "type": "quantitative",
                        "title": "weight",
                        "scale": {"scheme": "blues", "domain": [0, 1]},
                        "legend": {"orient": "bottom", "gradientLength": 160},
                    },
                    "tooltip": [
                        {"field": "query"},
                        {"field": "key"},
                        {"field": "w", "type": "quantitative", "format": ".3f"},
                    ],
                },
            },
            {
                "data": {"name": "outline"},
                "mark": {
                    "type": "rect",
                    "fillOpacity": 0,
                    "stroke": "#E8590C",
                    "strokeWidth": 2.5,
                },
                "encoding": {"x": x, "y": y},
            },
        ],
        **FONT,
    }


def heads_spec(height: int = 300) -> dict:
    """Every head's mean row entropy on the sentence: x layer, y head (data "heads":
    {layer, head, entropy, letter, type}), the chosen head outlined (data "chosen")."""
    x = {"field": "layer", "type": "ordinal", "title": "layer"}
    y = {"field": "head", "type": "ordinal", "title": "head"}
    return {
        **frame(height),
        "layer": [
            {
                "data": {"name": "heads"},
                "mark": {"type": "rect"},
                "encoding": {
                    "x": {**x, "axis": {"labelAngle": 0}},
                    "y": y,
                    "color": {
                        "field": "entropy",
                        "type": "quantitative",
                        "title": "row entropy (bits)",
                        "scale": {"scheme": "viridis", "reverse": True, "zero": True},
                        "legend": {"orient": "bottom", "gradientLength": 160},
                    },
                    "tooltip": [
                        {"field": "layer"},
                        {"field": "head"},
                        {"field": "type"},
                        {"field": "entropy", "type": "quantitative", "format": ".2f"},
                    ],
                },
            },
            {
                "data": {"name": "heads"},
                "mark": {"type": "text", "fontSize": 11, "fontWeight": "bold"},
                "encoding": {
                    "x": x,
                    "y": y,
                    "text": {"field": "letter"},
                    "color": {"value": "#E8590C"},
                },
            },
            {
                "data": {"name": "chosen"},
                "mark": {
                    "type": "rect",
                    "fillOpacity": 0,
                    "stroke": "#000000",
                    "strokeWidth": 3,
                },
                "encoding": {"x": x, "y": y},
            },
        ],
        **FONT,
    }


# ---------------------------------------------------------------------------------
# The two faces and the one call
# ---------------------------------------------------------------------------------


def settings(sentence: str = "coreference") -> dict:
    """The settings both faces take (the controls' ranges): a sentence of
    ``SENTENCES``, layer 1..6, head 1..12, and a query row of that sentence's tokens
    (``[CLS]`` is row 0)."""
    check({"sentence": Choice(SENTENCES)}, sentence=sentence)
    n = len(pretrained.load_minilm().tokens(SENTENCES[sentence]))
    return {
        "sentence": Choice(SENTENCES, label="sentence"),
        "layer": Range(1, 6, label="layer"),
        "head": Range(1, 12, label="head"),
        "row": Range(0, n - 1, label="query row"),
    }


def _check(sentence, layer, head, row):
    check(settings(sentence), sentence=sentence, layer=layer, head=head, row=row)


def static_pretrained_explorer(
    sentence: str = "coreference", layer: int = 1, head: int = 3, row: int = 0
) -> Explorer:
    """The static site's twin: ``pretrained_grid`` and the specs, drawn in the
    browser."""
    _check(sentence, layer, head, row)
    init = {
        "sentence": list(SENTENCES).index(sentence),
        "layer": layer - 1,
        "head": head - 1,
        "row": row,
    }
    return Explorer(
        "pretrained",
        {
            "grid": pretrained_grid(),
            "init": init,
            "specs": {"map": map_spec(), "heads": heads_spec()},
        },
        "MiniLM's heads (chapter 1)",
        "attention.explorers.pretrained.pretrained_explorer()",
    )


@functools.lru_cache(maxsize=len(SENTENCES))
def sentence_maps(sentence: str):
    """(tokens, maps (6, 12, N, N), ``heads.sentence_stats``) of one of ``SENTENCES``:
    one forward pass per sentence, cached, so a live move only draws."""
    model = pretrained.load_minilm()
    text = SENTENCES[sentence]
    toks, maps = model.tokens(text), model.attentions(text)
    return toks, maps, pretrained.heads.sentence_stats(maps, toks)


def pretrained_figure(sentence: str, layer: int, head: int, row: int):
    """The live explorer's figure: the head's map with the row outlined, and every
    head's entropy on the sentence with the chosen head outlined."""
    import matplotlib.pyplot as plt

    from attention.plots import pretrained as pplots

    toks, maps, stats = sentence_maps(sentence)
    _, types = measured_types()
    fig, (a0, a1) = live.subplots(
        1, 2, figsize=(10, 4.6), gridspec_kw={"width_ratios": [1.3, 1]}
    )
    pplots.head_map_figure(maps, toks, layer, head, ax=a0)
    a0.add_patch(
        plt.Rectangle((-0.5, row - 0.5), len(toks), 1, fill=False, ec="#E8590C", lw=2.5)
    )
    pplots.entropy_figure(stats, types=types, ax=a1)
    for ax in (a0, a1):  # ticks under the outlines (as ``PretrainedPicture`` blits)
        ax.set_axisbelow(True)
    a1.add_patch(
        plt.Rectangle((layer - 1.5, head - 1.5), 1, 1, fill=False, ec="k", lw=2.5)
    )
    fig.tight_layout()
    return fig


class PretrainedPicture:
    """The live face's figure: ``pretrained_figure`` made once per sentence (its
    tokens and every head's entropy fix the axes, the labels and the layout) and
    updated in place per move. What a move changes (the head's map, the outlined row
    and head, the map's title, and the spines drawn over them) is blitted over the
    rest, drawn once per sentence: a move draws a few artists, not the 72 annotated
    cells and the token labels again. ``png`` gives the picture
    ``figure_png(pretrained_figure(...), crop="ink")`` gives with the same layout (the
    tests compare the pixels). ``sentences`` are made at once (a new sentence then
    draws as fast as a new head); the others when first shown."""

    def __init__(self, sentences=()):
        self._figures: dict = {}  # sentence -> its figure and what moves on it
        for sentence in sentences:
            self._build(sentence)

    def _build(self, sentence: str) -> dict:
        from .common import LIVE_DPI, blit_order, box_inside, drawn_box

        with live.reusing({}):  # a figure of its own (not pyplot's)
            fig = pretrained_figure(sentence, 1, 1, 0)
        fig.set_dpi(LIVE_DPI)
        a0, a1 = fig.axes[:2]
        f = {"fig": fig, "maps": sentence_maps(sentence)[1], "im": a0.images[0],
             "row": a0.patches[-1], "head": a1.patches[-1]}  # fmt: skip
        # in the order a full draw draws them, so the pixels are a new figure's
        moving = blit_order((a0, [f["im"], f["row"], a0.title]), (a1, [f["head"]]))
        for artist in moving:
            artist.set_visible(False)
        fig.canvas.draw()
        f["background"] = fig.canvas.copy_from_bbox(fig.bbox)
        for artist in moving:
            artist.set_visible(True)
        f["moving"] = moving
        self._blit(f, 1, 1, 0)  # the canvas as a full draw leaves it: measure it
        f["box"] = drawn_box(fig, "ink")
        f["inside"] = box_inside(fig, f["box"])
        self._figures[sentence] = f
        return f

    @staticmethod
    def _blit(f: dict, layer: int, head: int, row: int) -> None:
        f["im"].set_data(f["maps"][layer - 1, head - 1])
        f["row"].set_y(row - 0.5)
        f["head"].set_xy((layer - 1.5, head - 1.5))
        f["im"].axes.set_title(f"head {layer}-{head}")
        canvas = f["fig"].canvas
        canvas.restore_region(f["background"])
        for artist in f["moving"]:
            artist.axes.draw_artist(artist)

    def png(self, sentence: str, layer: int, head: int, row: int) -> str:
        """The figure at one setting as a base64 PNG."""
        from .common import canvas_png, figure_png

        _check(sentence, layer, head, row)
        f = self._figures.get(sentence) or self._build(sentence)
        self._blit(f, layer, head, row)
        if not f["inside"]:  # drawn past the canvas: measured and drawn whole
            return figure_png(f["fig"], crop="ink")
        return canvas_png(f["fig"], f["box"])


def live_pretrained_explorer(
    sentence: str = "coreference", layer: int = 1, head: int = 3, row: int = 0
):
    """ipywidgets: each change redraws ``pretrained_figure`` and the text."""
    import ipywidgets as widgets

    from .common import PngCache, one_picture_per_move, show_png

    _check(sentence, layer, head, row)
    model = pretrained.load_minilm()
    values = dict(sentence=sentence, layer=layer, head=head, row=row)
    ctl = controls(settings(sentence), values)
    text, out = widgets.HTML(), widgets.Output()
    # a figure per sentence, made now (a move then draws only what it changes), and
    # the PNGs cached per setting
    picture, pngs = PretrainedPicture(SENTENCES), PngCache()

    @one_picture_per_move  # a row clamped by a shorter sentence: one picture
    def redraw(change=None):
        n = len(model.tokens(SENTENCES[ctl["sentence"].value]))
        ctl["row"].max = n - 1
        kw = {k: w.value for k, w in ctl.items()}
        text.value = "<p>" + readout(**kw) + "</p>"
        show_png(out, pngs.get(tuple(kw.values()), lambda: picture.png(**kw)))

    for w in ctl.values():
        w.observe(redraw, names="value")
    redraw()
    items = list(ctl.values())
    return widgets.VBox([widgets.HBox(items[:2]), widgets.HBox(items[2:]), text, out])


def pretrained_explorer(
    sentence: str = "coreference", layer: int = 1, head: int = 3, row: int = 0
):
    """Chapter 1: MiniLM's heads on the chapter's sentences (``sentence`` one of
    ``SENTENCES``; ``layer`` 1..6, ``head`` 1..12, ``row`` a token index); the static
    twin on the built site, ipywidgets elsewhere."""
    if site.ON_SITE:
        return static_pretrained_explorer(sentence, layer, head, row)
    return live_pretrained_explorer(sentence, layer, head, row)


__all__ = [
    "MORE_SENTENCES",
    "PretrainedPicture",
    "SENTENCES",
    "heads_spec",
    "live_pretrained_explorer",
    "map_spec",
    "measured_types",
    "pretrained_explorer",
    "pretrained_figure",
    "pretrained_grid",
    "pretrained_point",
    "readout",
    "sentence_maps",
    "settings",
    "static_pretrained_explorer",
]
