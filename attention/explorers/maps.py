"""Chapter 1's picture explorers: the trained models' attention maps (pick a task, an
example, a head and a query row; see that row's weights, the map with the row
outlined and the token the model outputs there) and the masks (causal, padding, both,
none; N_q != N_k aligned bottom-right) over one small grid.

Two calls, ``attention_map_explorer`` and ``mask_explorer``: the static twin on the
site (every number computed here, in Python, by ``attention.core``; the page's script
only looks rows up, ``_static/explorers.js``) and ipywidgets in Jupyter and Colab.
The maps come from the chapter: it trains its models, computes their maps with
``attention.core`` and passes them in (``map_task``), so nothing is trained twice.
"""

from __future__ import annotations

import numpy as np

from attention import core
from attention.plots import live

from . import site
from .common import FONT, KEEP, frame, live_png, one_picture_per_move, show_png
from .settings import Choice, Range, check, control, controls
from .site import Explorer

#: The mask view's controls (the static grid covers exactly these).
MASK_KINDS = ["causal", "padding", "causal and padding", "none"]
MASK_SIZES = list(range(1, 9))
MASK_SETTINGS = {
    "kind": Choice(MASK_KINDS, label="mask"),
    "n_q": Range(1, 8, label="queries N_q"),
    "n_k": Range(1, 8, label="keys N_k"),
    "length": Range(1, 8, label="real keys (padding)"),
}
#: Scores behind the mask view's weights: one fixed draw, cut to (N_q, N_k).
MASK_SEED = 0
#: Decimals of the weights sent to the page (a reader sees 2).
DECIMALS = 3


# ---------------------------------------------------------------------------------
# The trained maps
# ---------------------------------------------------------------------------------


def map_task(maps, queries, keys, outputs, targets=None) -> dict:
    """One task's maps for the explorer, checked: ``maps`` (E, H, m, n) or (E, m, n)
    attention weights of E examples (each row sums to 1 or is all 0); ``queries`` (E,
    m), ``keys`` (E, n), ``outputs`` (E, m) and optional ``targets`` (E, m) token
    labels (anything ``str`` takes)."""
    w = core.as_real_array("maps", maps)
    if w.ndim == 3:
        w = w[:, None]
    if w.ndim != 4 or 0 in w.shape:
        raise ValueError(
            f"maps must be (E, H, m, n) or (E, m, n), got {np.shape(maps)}"
        )
    e, _, m, n = w.shape
    sums = w.sum(-1)
    if not np.all(np.isclose(sums, 1.0, atol=1e-6) | (sums == 0)) or (w < 0).any():
        raise ValueError("maps must hold attention weights: rows >= 0 summing to 1")
    out = {"maps": w}
    for name, labels, width in (
        ("queries", queries, m),
        ("keys", keys, n),
        ("outputs", outputs, m),
        ("targets", targets, m),
    ):
        if labels is None:
            continue
        rows = [[str(t) for t in r] for r in labels]
        if len(rows) != e or any(len(r) != width for r in rows):
            raise ValueError(f"{name} must be {e} lists of {width} labels")
        out[name] = rows
    return out


def _check_tasks(tasks: dict) -> dict:
    if not isinstance(tasks, dict) or not tasks:
        raise TypeError("tasks must be a non-empty dict {name: map_task(...)}")
    for name, t in tasks.items():
        if not isinstance(t, dict) or "maps" not in t:
            raise TypeError(f"tasks[{name!r}] must come from map_task(...)")
    return tasks


def map_settings(tasks: dict, task: str | None) -> dict:
    """The settings both faces take: a task of ``tasks`` (None: the first) and an
    example, head and query row of that task's maps."""
    names = list(tasks)
    e, h, m, _ = tasks[task if task in names else names[0]]["maps"].shape
    return {
        "task": Choice([None, *names], label="task"),
        "example": Range(0, e - 1, label="example"),
        "head": Range(0, h - 1, label="head"),
        "row": Range(0, m - 1, label="query row"),
    }


def _check_map(tasks, task, example, head, row) -> list[str]:
    names = list(_check_tasks(tasks))
    rules = map_settings(tasks, task)
    check(rules, task=task)
    check(rules, example=example, head=head, row=row)
    return names


def maps_grid(tasks: dict) -> dict:
    """The static twin's data: per task its labels and ``w[example][head][row][key]``
    rounded to ``DECIMALS``."""
    out = []
    for name, t in _check_tasks(tasks).items():
        e, h, m, n = t["maps"].shape
        out.append(
            {
                "name": name,
                "E": e,
                "H": h,
                "m": m,
                "n": n,
                "w": np.round(t["maps"], DECIMALS).tolist(),
                **{
                    k: t[k] for k in ("queries", "keys", "outputs", "targets") if k in t
                },
            }
        )
    return {"tasks": out}


def _map_specs() -> dict:
    blue = KEEP
    heat = {
        **frame(260),
        "layer": [
            {
                "data": {"name": "cells"},
                "mark": {"type": "rect"},
                "encoding": {
                    "x": {
                        "field": "key",
                        "type": "ordinal",
                        "title": "key (attended to)",
                        "sort": {"field": "j"},
                        "axis": {"labelAngle": -60},
                    },
                    "y": {
                        "field": "query",
                        "type": "ordinal",
                        "sort": {"field": "i"},
                        "title": "query (attending)",
                    },
                    "color": {
                        "field": "w",
                        "type": "quantitative",
                        "title": "weight",
                        "scale": {"scheme": "blues", "domain": [0, 1]},
                        "legend": {"orient": "right", "gradientLength": 120},
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
                    "strokeWidth": 3,
                },
                "encoding": {
                    "x": {"field": "key", "type": "ordinal", "sort": {"field": "j"}},
                    "y": {"field": "query", "type": "ordinal", "sort": {"field": "i"}},
                },
            },
        ],
        **FONT,
    }
    row = {
        **frame(200),
        "data": {"name": "row"},
        "mark": {"type": "bar", "color": blue, "stroke": "#222", "strokeWidth": 0.4},
        "encoding": {
            "x": {
                "field": "key",
                "type": "ordinal",
                "sort": {"field": "j"},
                "title": "key",
                "axis": {"labelAngle": -60},
            },
            "y": {
                "field": "w",
                "type": "quantitative",
                "title": "weight of the row",
                "scale": {"domain": [0, 1]},
            },
            "tooltip": [
                {"field": "key"},
                {"field": "w", "type": "quantitative", "format": ".3f"},
            ],
        },
        **FONT,
    }
    return {"map": heat, "row": row}


def static_attention_map_explorer(
    tasks: dict, task: str | None = None, example: int = 0, head: int = 0, row: int = 0
) -> Explorer:
    """The static site's twin: ``maps_grid`` and the specs, drawn in the browser."""
    names = _check_map(tasks, task, example, head, row)
    ti = names.index(task) if task is not None else 0
    config = {
        "grid": maps_grid(tasks),
        "init": {"task": ti, "example": example, "head": head, "row": row},
        "specs": _map_specs(),
    }
    return Explorer(
        "maps",
        config,
        "Trained attention maps (chapter 1)",
        "explorers.attention_map_explorer(tasks)",
    )


def map_figure(t: dict, name: str, example: int, head: int, row: int):
    """The live explorer's figure: the map with ``row`` outlined, and that row."""
    import matplotlib.pyplot as plt

    from attention import plots

    w = t["maps"][example, head]
    qs = t.get("queries", [list(range(w.shape[0]))] * (example + 1))[example]
    ks = t.get("keys", [list(range(w.shape[1]))] * (example + 1))[example]
    fig, (a0, a1) = live.subplots(
        1, 2, figsize=(10, 3.9), gridspec_kw={"width_ratios": [1.1, 1]}
    )
    plots.attention_heatmap(
        w,
        q_labels=qs,
        k_labels=ks,
        ax=a0,
        vmax=1.0,
        title=f"{name}, example {example}, head {head}",
    )
    a0.add_patch(
        plt.Rectangle(
            (-0.5, row - 0.5), w.shape[1], 1, fill=False, ec="#E8590C", lw=2.5
        )
    )
    a1.bar(range(w.shape[1]), w[row], color=KEEP, ec="#222", lw=0.4)
    a1.set_xticks(range(w.shape[1]), labels=[str(k) for k in ks], rotation=60)
    a1.set(ylim=(0, 1), ylabel="weight", title=f"row {row}: query {qs[row]}")
    fig.tight_layout()
    return fig


def map_readout(t: dict, example: int, head: int, row: int) -> str:
    """The explorer's text: the query, its largest weight and the model's output."""
    w = t["maps"][example, head, row]
    j = int(np.argmax(w))
    ks = t.get("keys", [[str(i) for i in range(len(w))]] * (example + 1))[example]
    qs = t.get(
        "queries", [[str(i) for i in range(t["maps"].shape[2])]] * (example + 1)
    )[example]
    text = f"query {row} ({qs[row]}) puts {w[j]:.2f} of its weight on key {j} ({ks[j]})"
    if "outputs" in t:
        text += f"; the model outputs {t['outputs'][example][row]}"
    if "targets" in t:
        text += f" (target {t['targets'][example][row]})"
    return text + "."


def live_attention_map_explorer(
    tasks: dict, task: str | None = None, example: int = 0, head: int = 0, row: int = 0
):
    """ipywidgets: task, example, head and row redraw ``map_figure`` and the text."""
    import ipywidgets as widgets

    names = _check_map(tasks, task, example, head, row)
    rules = map_settings(tasks, task)
    # The task menu shows the tasks themselves (None is the first).
    w_task = control(Choice(names, label=rules["task"].label), task or names[0])
    w_ex, w_head, w_row = controls(
        rules, dict(example=example, head=head, row=row)
    ).values()
    text, out = widgets.HTML(), widgets.Output()

    @one_picture_per_move  # sliders clamped by a new task's shape: one picture
    def redraw(change=None):
        t = tasks[w_task.value]
        e, h, m, _ = t["maps"].shape
        w_ex.max, w_head.max, w_row.max = e - 1, h - 1, m - 1
        text.value = (
            "<p>" + map_readout(t, w_ex.value, w_head.value, w_row.value) + "</p>"
        )
        show_png(
            out,
            live_png(
                map_figure, t, w_task.value, w_ex.value, w_head.value, w_row.value
            ),
        )

    for w in (w_task, w_ex, w_head, w_row):
        w.observe(redraw, names="value")
    redraw()
    return widgets.VBox(
        [widgets.HBox([w_task, w_ex]), widgets.HBox([w_head, w_row]), text, out]
    )


def attention_map_explorer(
    tasks: dict, task: str | None = None, example: int = 0, head: int = 0, row: int = 0
):
    """Chapter 1: the trained maps, ``tasks`` = {name: ``map_task(...)``}; the static
    twin on the built site, ipywidgets elsewhere."""
    face = (
        static_attention_map_explorer if site.ON_SITE else live_attention_map_explorer
    )
    return face(tasks, task=task, example=example, head=head, row=row)


# ---------------------------------------------------------------------------------
# The masks
# ---------------------------------------------------------------------------------


def mask_scores() -> np.ndarray:
    """The fixed (8, 8) scores the mask view's weights come from."""
    return np.random.default_rng(MASK_SEED).normal(size=(8, 8))


def mask_of(kind: str, n_q: int, n_k: int, length: int) -> np.ndarray:
    """The (n_q, n_k) keep-mask (True = may attend) of one setting, by attention.core:
    causal aligned bottom-right, padding keeps the first ``length`` keys."""
    if kind not in MASK_KINDS:
        raise ValueError(f"kind must be one of {MASK_KINDS}, got {kind!r}")
    keep = np.ones((n_q, n_k), dtype=bool)
    if "causal" in kind:
        keep &= core.causal_mask(n_q, n_k)
    if "padding" in kind:
        keep &= core.padding_mask([min(length, n_k)], n_k)[0]
    return keep


def mask_point(kind: str, n_q: int, n_k: int, length: int) -> dict:
    """The mask and the softmax of ``mask_scores()[:n_q, :n_k]`` under it (a row that
    sees no key: weights 0)."""
    keep = mask_of(kind, n_q, n_k, length)
    p = core.softmax(mask_scores()[:n_q, :n_k], mask=keep)
    return {"keep": keep, "p": p}


def _mask_key(kind: str, n_q: int, n_k: int, length: int) -> str:
    used = min(length, n_k) if "padding" in kind else 0
    return f"{MASK_KINDS.index(kind)},{n_q},{n_k},{used}"


def mask_grid() -> dict:
    """Every setting the controls reach, keyed "kind,n_q,n_k,length" (length 0 where
    the kind has no padding, else min(length, n_k)): the mask as a string of 0/1 per
    row, and the weights in thousandths."""
    out = {}
    for kind in MASK_KINDS:
        for n_q in MASK_SIZES:
            for n_k in MASK_SIZES:
                for length in MASK_SIZES[:n_k] if "padding" in kind else [0]:
                    pt = mask_point(kind, n_q, n_k, length)
                    out[_mask_key(kind, n_q, n_k, length)] = [
                        ["".join("1" if b else "0" for b in r) for r in pt["keep"]],
                        np.rint(pt["p"] * 1000).astype(int).tolist(),
                    ]
    return {"kinds": MASK_KINDS, "sizes": MASK_SIZES, "masks": out}


def _mask_spec() -> dict:
    return {
        **frame(260),
        "layer": [
            {
                "data": {"name": "cells"},
                "mark": {"type": "rect", "stroke": "white", "strokeWidth": 1.5},
                "encoding": {
                    "x": {
                        "field": "j",
                        "type": "ordinal",
                        "title": "key j",
                        "axis": {"labelAngle": 0},
                    },
                    "y": {"field": "i", "type": "ordinal", "title": "query i"},
                    "color": {
                        "field": "cell",
                        "type": "nominal",
                        "title": None,
                        "scale": {
                            "domain": ["may attend", "masked"],
                            "range": [KEEP, "#D9D9D9"],
                        },
                        "legend": {"orient": "bottom"},
                    },
                    "tooltip": [
                        {"field": "i"},
                        {"field": "j"},
                        {"field": "cell"},
                        {
                            "field": "p",
                            "type": "quantitative",
                            "format": ".3f",
                            "title": "weight",
                        },
                    ],
                },
            },
            {
                "data": {"name": "cells"},
                "mark": {"type": "text", "fontSize": 10},
                "encoding": {
                    "x": {"field": "j", "type": "ordinal"},
                    "y": {"field": "i", "type": "ordinal"},
                    "text": {"field": "label"},
                    "color": {
                        "condition": {
                            "test": "datum.cell === 'may attend'",
                            "value": "white",
                        },
                        "value": "#404040",
                    },
                },
            },
        ],
        **FONT,
    }


def _check_mask(n_q, n_k, kind, length):
    check(MASK_SETTINGS, n_q=n_q, n_k=n_k, kind=kind, length=length)


def static_mask_explorer(n_q=5, n_k=7, kind="causal", length=4) -> Explorer:
    """The static site's twin of ``mask_explorer``."""
    _check_mask(n_q, n_k, kind, length)
    init = {
        "kind": MASK_KINDS.index(kind),
        "n_q": MASK_SIZES.index(n_q),
        "n_k": MASK_SIZES.index(n_k),
        "length": MASK_SIZES.index(length),
    }
    return Explorer(
        "masks",
        {"grid": mask_grid(), "init": init, "specs": {"mask": _mask_spec()}},
        "Masks (chapter 1)",
        "explorers.mask_explorer()",
    )


def mask_readout(kind, n_q, n_k, length) -> str:
    keep = mask_of(kind, n_q, n_k, length)
    empty = int((~keep.any(-1)).sum())
    text = f"{kind}, N_q = {n_q}, N_k = {n_k}"
    if "padding" in kind:
        text += f", {min(length, n_k)} real keys"
    text += f": {int(keep.sum())} of {n_q * n_k} cells may attend"
    if "causal" in kind:
        off = n_k - n_q
        text += f"; query i sees keys j ≤ i {'+' if off >= 0 else '−'} {abs(off)}"
    if empty:
        text += f"; {empty} rows see no key: weights 0, output 0"
    return text + "."


def live_mask_explorer(n_q=5, n_k=7, kind="causal", length=4):
    """ipywidgets: each change redraws the mask with its weights."""
    import ipywidgets as widgets

    _check_mask(n_q, n_k, kind, length)
    ctl = controls(MASK_SETTINGS, dict(kind=kind, n_q=n_q, n_k=n_k, length=length))
    text, out = widgets.HTML(), widgets.Output()

    def redraw(change=None):
        kw = {k: w.value for k, w in ctl.items()}
        text.value = "<p>" + mask_readout(**kw) + "</p>"
        show_png(out, live_png(mask_figure, **kw))

    for w in ctl.values():
        w.observe(redraw, names="value")
    redraw()
    items = list(ctl.values())
    return widgets.VBox([widgets.HBox(items[:2]), widgets.HBox(items[2:]), text, out])


def mask_figure(kind: str, n_q: int, n_k: int, length: int):
    """The live mask face's figure: the weights of fixed scores under the mask."""
    from attention import plots

    pt = mask_point(kind=kind, n_q=n_q, n_k=n_k, length=length)
    fig, ax = live.subplots(figsize=(4.6, 4.2))
    plots.attention_heatmap(
        pt["p"],
        ax=ax,
        vmax=1.0,
        mask=pt["keep"],
        title=f"{kind}: weights under the mask",
    )
    return fig


def mask_explorer(n_q: int = 5, n_k: int = 7, kind: str = "causal", length: int = 4):
    """Chapter 1: causal (bottom-right), padding (the first ``length`` keys), both or
    none on an N_q x N_k grid, with the weights of fixed scores under the mask; static
    twin on the site, ipywidgets elsewhere."""
    face = static_mask_explorer if site.ON_SITE else live_mask_explorer
    return face(n_q=n_q, n_k=n_k, kind=kind, length=length)


__all__ = [
    "attention_map_explorer",
    "map_task",
    "maps_grid",
    "mask_explorer",
    "mask_grid",
    "mask_of",
    "mask_point",
    "mask_scores",
]
