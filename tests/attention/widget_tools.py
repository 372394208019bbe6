"""Helpers shared by the widget tests: find an explorer's controls,
its output and its image."""

from __future__ import annotations

import ipywidgets


def walk(box):
    """Every widget inside ``box`` (depth first), ``box`` included."""
    stack = [box]
    while stack:
        w = stack.pop()
        yield w
        stack.extend(getattr(w, "children", ()))


def controls(box) -> dict:
    """Every value widget inside the explorer, by description."""
    return {
        w.description: w
        for w in walk(box)
        if getattr(w, "description", None) and hasattr(w, "value")
    }


def output(box) -> ipywidgets.Output:
    """The explorer's Output widget (where its figure is drawn)."""
    for w in walk(box):
        if isinstance(w, ipywidgets.Output):
            return w
    raise AssertionError("no Output widget in the explorer")


def png(out: ipywidgets.Output) -> str:
    """The one PNG the output shows (base64)."""
    (item,) = out.outputs
    return item["data"]["image/png"]


def _pieces(ax, renderer) -> list:
    """The boxes of what a panel draws: its frame, titles, axis labels, the labels of
    the ticks it draws and its legend (empty texts left out)."""
    texts = [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label]
    for axis in (ax.xaxis, ax.yaxis):  # the ticks drawn (inside the view limits)
        texts += [t.label1 for t in axis._update_ticks()]
    out = [ax.bbox]
    out += [t.get_window_extent(renderer) for t in texts
            if t.get_visible() and t.get_text()]  # fmt: skip
    if ax.get_legend() is not None:
        out.append(ax.get_legend().get_window_extent(renderer))
    return out


def assert_fixed_panels_hold(fig, at) -> None:
    """A figure laid out once (fixed margins, no ``tight_layout`` per move), drawn at
    the settings ``at``: every panel's drawing, labels, ticks and legends included,
    lies on the canvas, and nothing one panel draws (frame, titles, labels, tick
    labels, legend) overlaps anything another draws: no label is cut or runs into
    its neighbour."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    w, h = fig.bbox.width, fig.bbox.height
    axes = [ax for ax in fig.axes if ax.get_visible()]
    for ax in axes:
        box = ax.get_tightbbox(renderer)
        assert box.x0 >= 0 and box.y0 >= 0, (at, box)
        assert box.x1 <= w and box.y1 <= h, (at, box)
    pieces = [_pieces(ax, renderer) for ax in axes]
    for i in range(len(axes)):
        for j in range(i + 1, len(axes)):
            for a in pieces[i]:
                for b in pieces[j]:
                    apart = a.x1 <= b.x0 or b.x1 <= a.x0 or a.y1 <= b.y0 or b.y1 <= a.y0
                    assert apart, (at, i, j, a, b)
