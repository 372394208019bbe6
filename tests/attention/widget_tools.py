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
