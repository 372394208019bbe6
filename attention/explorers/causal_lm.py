"""Chapter 1's explorer of a causal language model: SmolLM2-135M's 270 heads on a few
prompts. Prompt, layer, head and the score the grid shows -> that head's causal map
on the prompt, its scores (induction, previous token, first token) on the prompt and
over the chapter's random repeated sequences, and the 30 x 9 grid of one score over
those sequences with the head outlined. One call, ``causal_lm_explorer``: the static
twin on the site (maps and scores computed here at build time by
``attention.pretrained``; the page's script only looks them up,
``_static/explorers.js``), ipywidgets in Jupyter and Colab.

The probe (``PROBE``): ``n_seq`` sequences of ``length`` token ids drawn uniformly from
ids 17..49151 (every id but the 17 control tokens), each repeated twice, no BOS.
Layers and heads are numbered from 1, as on the chapter's figures.
"""

from __future__ import annotations

import functools

import numpy as np

from attention import pretrained

from . import site
from .settings import Choice, Range, check, controls
from .site import Explorer

#: The prompts the explorer offers, by name; "repeated" is random ids, drawn below.
PROMPTS = {
    "posts": (
        "Self-Attention: Each element in the sequence calculates its attention "
        "weights with respect to all other elements."
    ),
    "capital": "The capital of France is Paris. The capital of Germany is",
    "repeated": None,
}
#: The chapter's probe: random ids (17 .. vocabulary - 1, uniform) repeated twice.
PROBE = {"n_seq": 10, "length": 50, "seed": 0, "low": 17, "high": 49152}
#: The explorer's repeated prompt: a shorter draw of the same kind (its own seed).
SHORT = {"n_seq": 1, "length": 8, "seed": 1, "low": 17, "high": 49152}
#: The scores a grid can show: {name: key of ``pretrained.measure``'s result}.
SCORES = {"induction": "induction", "previous token": "previous", "first token": "sink"}
#: Weights are sent to the page in hundredths.
SCALE = 100


@functools.lru_cache(maxsize=1)
def probe():
    """(seqs (n_seq, 2 length), scores): ``pretrained.repeated_sequences(**PROBE)``
    through ``pretrained.measure``: induction, previous and sink (n_seq, 30, 9), loss
    (n_seq, 2 length - 1). One forward pass per sequence, cached."""
    model = pretrained.load_smollm2()
    seqs = pretrained.repeated_sequences(**PROBE)
    return seqs, pretrained.measure(model, seqs, PROBE["length"])


def prompt_ids(prompt: str) -> list[int]:
    """The token ids of one of ``PROMPTS`` (no BOS)."""
    if prompt == "repeated":
        return [int(i) for i in pretrained.repeated_sequences(**SHORT)[0]]
    return pretrained.load_smollm2().encode(PROMPTS[prompt])


def _label(model, i: int) -> str:
    t = model.tokenizer.id_to_token(int(i))
    return t.replace("Ġ", "␣").replace("Ċ", "↵")


@functools.lru_cache(maxsize=len(PROMPTS))
def prompt_maps(prompt: str):
    """(tokens, maps (30, 9, N, N), scores {previous, sink[, induction]} (30, 9)) of one
    of ``PROMPTS``: one forward pass per prompt, cached (a live move only draws).
    Tokens are the byte-level strings, a space shown as ␣ and a newline as ↵."""
    model = pretrained.load_smollm2()
    ids = prompt_ids(prompt)
    maps = model.attentions(ids)
    scores = {
        "previous": pretrained.previous_token_scores(maps),
        "sink": pretrained.sink_scores(maps),
    }
    if prompt == "repeated":
        scores["induction"] = pretrained.induction_scores(maps, SHORT["length"])
    return [_label(model, i) for i in ids], maps, scores


@functools.lru_cache(maxsize=1)
def causal_lm_grid() -> dict:
    """The twin's data: per prompt its tokens, the causal maps as ``w[layer][head]``
    (the lower triangle row by row, row i's keys 0..i from index i (i + 1) / 2, in
    hundredths) and its scores (2 decimals); the probe's mean scores per layer and
    head (2 decimals)."""
    _, r = probe()
    out = []
    for name in PROMPTS:
        toks, maps, scores = prompt_maps(name)
        w = np.rint(maps * SCALE).astype(int)
        rows, cols = np.tril_indices(len(toks))  # row by row: (0, 0), (1, 0), (1, 1)..
        out.append(
            {
                "name": name,
                "tokens": toks,
                "w": [
                    [w[la, h][rows, cols].tolist() for h in range(w.shape[1])]
                    for la in range(w.shape[0])
                ],  # fmt: skip
                **{k: np.round(v, 2).tolist() for k, v in scores.items()},
            }
        )
    return {
        "prompts": out,
        "probe": {k: np.round(r[k].mean(0), 2).tolist() for k in SCORES.values()},
        "scores": list(SCORES),
        "keys": list(SCORES.values()),
        "n_seq": PROBE["n_seq"],
        "length": PROBE["length"],
        "L": 30,
        "H": 9,
    }


def readout(prompt: str, layer: int, head: int, score: str = "induction") -> str:
    """The explorer's text (the JavaScript twin writes the same sentence)."""
    _check(prompt, layer, head, score)
    g = causal_lm_grid()
    p = g["prompts"][list(PROMPTS).index(prompt)]
    a, b = layer - 1, head - 1
    on = f"previous token {p['previous'][a][b]:.2f}, first token {p['sink'][a][b]:.2f}"
    if "induction" in p:
        on += f", induction {p['induction'][a][b]:.2f}"
    pr = g["probe"]
    return (
        f"Head {layer}-{head} on this prompt: {on}. Over the {g['n_seq']} random "
        f"sequences of {g['length']} ids repeated twice: induction "
        f"<b>{pr['induction'][a][b]:.2f}</b>, previous token "
        f"<b>{pr['previous'][a][b]:.2f}</b>, first token <b>{pr['sink'][a][b]:.2f}</b>."
    )


# ---------------------------------------------------------------------------------
# Vega-Lite specs
# ---------------------------------------------------------------------------------


def map_spec(height: int = 300) -> dict:
    """The head's causal map (data "cells": {i, j, query, key, w})."""
    from .common import FONT, frame

    x = {"field": "key", "type": "ordinal", "sort": {"field": "j"}}
    y = {"field": "query", "type": "ordinal", "sort": {"field": "i"}}
    return {
        **frame(height),
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
                {"field": "w", "type": "quantitative", "format": ".2f"},
            ],
        },
        **FONT,
    }


def grid_spec(height: int = 420) -> dict:
    """One score per layer and head (data "heads": {layer, head, value}), layers down,
    heads across, the chosen head outlined (data "chosen")."""
    from .common import FONT, frame

    x = {"field": "head", "type": "ordinal", "title": "head"}
    y = {"field": "layer", "type": "ordinal", "title": "layer"}
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
                        "field": "value",
                        "type": "quantitative",
                        "title": "score",
                        "scale": {"scheme": "magma", "reverse": True, "domain": [0, 1]},
                        "legend": {"orient": "bottom", "gradientLength": 160},
                    },  # fmt: skip
                    "tooltip": [
                        {"field": "layer"},
                        {"field": "head"},
                        {"field": "value", "type": "quantitative", "format": ".2f"},
                    ],
                },
            },
            {
                "data": {"name": "chosen"},
                "mark": {
                    "type": "rect",
                    "fillOpacity": 0,
                    "stroke": "#E8590C",
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


def settings() -> dict:
    """The settings both faces take: a prompt of ``PROMPTS``, layer 1..30, head 1..9,
    and the score the grid shows (one of ``SCORES``)."""
    return {
        "prompt": Choice(PROMPTS, label="prompt"),
        "layer": Range(1, 30, label="layer"),
        "head": Range(1, 9, label="head"),
        "score": Choice(SCORES, label="grid shows"),
    }


def _check(prompt, layer, head, score):
    check(settings(), prompt=prompt, layer=layer, head=head, score=score)


def static_causal_lm_explorer(
    prompt: str = "repeated", layer: int = 19, head: int = 7, score: str = "induction"
) -> Explorer:
    """The static site's twin: ``causal_lm_grid`` and the specs, drawn in the
    browser."""
    _check(prompt, layer, head, score)
    init = {
        "prompt": list(PROMPTS).index(prompt),
        "layer": layer - 1,
        "head": head - 1,
        "score": list(SCORES).index(score),
    }
    return Explorer(
        "causal_lm",
        {
            "grid": causal_lm_grid(),
            "init": init,
            "specs": {"map": map_spec(), "grid": grid_spec()},
        },
        "SmolLM2's heads (chapter 1)",
        "attention.explorers.causal_lm.causal_lm_explorer()",
    )


def causal_lm_figure(prompt: str, layer: int, head: int, score: str = "induction"):
    """The live explorer's figure: the head's map on the prompt, and the probe's grid
    of ``score`` with the head outlined."""
    from attention.plots import causal_lm as cplots
    from attention.plots import live

    toks, maps, _ = prompt_maps(prompt)
    _, r = probe()
    fig, (a0, a1) = live.subplots(
        1, 2, figsize=(10, 5.6), gridspec_kw={"width_ratios": [1.6, 1]}
    )
    if prompt == "repeated":
        cplots.induction_map_figure(
            maps[layer - 1, head - 1],
            SHORT["length"],
            f"head {layer}-{head}",
            ax=a0,
            labels=toks,
        )
    else:
        a0.imshow(maps[layer - 1, head - 1], cmap="Blues", vmin=0, vmax=1)
        a0.set_xticks(range(len(toks)), labels=toks, rotation=90, fontsize=9)
        a0.set_yticks(range(len(toks)), labels=toks, fontsize=9)
        a0.set_title(f"head {layer}-{head}", fontsize=13)
    cplots.score_grid(r[SCORES[score]].mean(0), f"{score}, {PROBE['n_seq']} seqs",
                      ax=a1, mark=(layer, head))  # fmt: skip
    fig.tight_layout()
    return fig


def live_causal_lm_explorer(
    prompt: str = "repeated", layer: int = 19, head: int = 7, score: str = "induction"
):
    """ipywidgets: each change redraws ``causal_lm_figure`` and the text."""
    import ipywidgets as widgets

    from .common import PngCache, figure_png, one_picture_per_move, show_png

    _check(prompt, layer, head, score)
    values = dict(prompt=prompt, layer=layer, head=head, score=score)
    ctl = controls(settings(), values)
    text, out = widgets.HTML(), widgets.Output()
    pngs = PngCache()

    @one_picture_per_move
    def redraw(change=None):
        kw = {k: w.value for k, w in ctl.items()}
        text.value = "<p>" + readout(**kw) + "</p>"
        show_png(
            out,
            pngs.get(tuple(kw.values()),
                     lambda: figure_png(causal_lm_figure(**kw), crop="ink")),
        )  # fmt: skip

    for w in ctl.values():
        w.observe(redraw, names="value")
    redraw()
    items = list(ctl.values())
    return widgets.VBox([widgets.HBox(items[:2]), widgets.HBox(items[2:]), text, out])


def causal_lm_explorer(
    prompt: str = "repeated", layer: int = 19, head: int = 7, score: str = "induction"
):
    """Chapter 1: SmolLM2's heads on a few prompts (``prompt`` one of ``PROMPTS``;
    ``layer`` 1..30, ``head`` 1..9, ``score`` one of ``SCORES``, the grid's); the
    static twin on the built site, ipywidgets elsewhere."""
    if site.ON_SITE:
        return static_causal_lm_explorer(prompt, layer, head, score)
    return live_causal_lm_explorer(prompt, layer, head, score)


__all__ = [
    "PROBE",
    "PROMPTS",
    "SCORES",
    "SHORT",
    "causal_lm_explorer",
    "causal_lm_figure",
    "causal_lm_grid",
    "grid_spec",
    "live_causal_lm_explorer",
    "map_spec",
    "probe",
    "prompt_ids",
    "prompt_maps",
    "readout",
    "settings",
    "static_causal_lm_explorer",
]
