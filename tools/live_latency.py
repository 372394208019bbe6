"""How long each live explorer takes to answer a control's move, at its largest setting.

For every ``live_*`` face of ``attention.explorers`` this builds the widget with its
defaults, then moves each control in turn: a slider to its maximum (then its minimum),
a menu or toggle to each of its options, a checkbox both ways, and times the redraw
that the move triggers (the observers run synchronously, so the time from setting the
value to its return is what a reader waits for, less the browser's image swap). Each
move is new to the face (nothing it drew before), so caches do not hide the cost.

    python tools/live_latency.py [--only NAME ...] [--each] [--json FILE]

Prints, per face, the median move and the slowest move with its control, then the range
of the faces' slowest moves and the face with the slowest of all. All faces
run in one process by default (each later face's moves then pay Python's garbage
collections over every earlier face's objects, up to a tenth of a second a pass);
``--each`` runs each face in a new process, as a chapter's kernel holds its own faces.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings


def _controls(widget):
    """Every value control in the widget tree, in order."""
    import ipywidgets as widgets

    out = []
    if isinstance(widget, widgets.Box):
        for child in widget.children:
            out += _controls(child)
    elif isinstance(widget, widgets.ValueWidget) and not isinstance(
        widget, (widgets.Output, widgets.HTML, widgets.Label, widgets.HTMLMath)
    ):
        if not getattr(widget, "disabled", False):
            out.append(widget)
    return out


def _moves(control):
    """The values to move ``control`` to, in order (its current value excluded)."""
    if hasattr(control, "options") and control.options:
        opts = list(control.options)
        values = [o[1] if isinstance(o, tuple) else o for o in opts]
        return [v for v in values if v != control.value]
    if hasattr(control, "max") and hasattr(control, "min"):
        if isinstance(control.value, tuple):  # a range slider
            return [(control.min, control.max)]
        return [v for v in (control.max, control.min) if v != control.value]
    if isinstance(control.value, bool):
        return [not control.value, control.value]
    return []


FACES = {
    "naive_traffic": ("naive_traffic", "live_naive_traffic_explorer"),
    "attention_map": ("maps", "live_attention_map_explorer"),
    "mask": ("maps", "live_mask_explorer"),
    "tile_size": ("tile_size", "live_tile_size_explorer"),
    "teaser": ("landing", "live_teaser"),
    "online_softmax": ("online_softmax", "live_online_softmax_explorer"),
    "roofline": ("roofline", "live_roofline_explorer"),
    "temperature": ("temperature", "live_temperature_explorer"),
    "topk_traffic": ("topk_traffic", "live_topk_traffic_explorer"),
    "estimator": ("estimators", "live_estimator_explorer"),
    "deformable_traffic": ("deformable_traffic", "live_deformable_traffic_explorer"),
    "sampling_points": ("sampling", "live_sampling_points_explorer"),
    "decode": ("decode", "live_decode_explorer"),
    "context_parallel": ("ring", "live_context_parallel_explorer"),
    "block_mask": ("blockmask", "live_block_mask_explorer"),
    "pretrained": ("pretrained", "live_pretrained_explorer"),
    "sparse": ("sparse", "live_sparse_explorer"),
}


def _map_tasks() -> dict:
    """Two tasks of random maps at chapter 1's sizes (8 examples, 4 heads, 12 x 12)."""
    import numpy as np

    from attention.explorers.maps import map_task

    rng = np.random.default_rng(0)
    tasks = {}
    for name in ("reverse", "sort"):
        w = rng.random((8, 4, 12, 12))
        w /= w.sum(-1, keepdims=True)
        tokens = rng.integers(0, 10, (8, 12)).tolist()
        tasks[name] = map_task(w, tokens, tokens, tokens, tokens)
    return {"tasks": tasks}


def _sampling_inputs() -> dict:
    """A random photograph and feature map at chapter 4's size (a 32 x 32 map of 16
    channels), DAT's layer before and after a change of offsets, and an MSDA layer of
    two levels (the chapter passes its trained layers)."""
    import numpy as np

    from attention import deformable as dfm

    rng = np.random.default_rng(0)
    side, c = 32, 16
    x = rng.normal(size=(1, side, side, c))
    img = rng.uniform(size=(side, side, 3))
    params = dfm.init_dat_params(c, 1, kernel_size=5, rng=rng)
    trained = {**params, "offset": dfm.init_offset_params(c, 5, rng, scale=2.0)}
    shapes = np.array([(side, side), (side // 2, side // 2)])
    msda = dict(
        params=dfm.init_msda_params(c, 2, 2, 4, rng),
        spatial_shapes=shapes,
        n_heads=2,
        n_points=4,
    )
    return dict(
        image=img,
        x=x,
        dat_params={"untrained": params, "trained": trained},
        n_heads=2,
        n_groups=1,
        stride=4,
        offset_range=0.5,
        msda=msda,
    )


#: Arguments a face cannot do without (the chapters pass them).
ARGS = {"attention_map": _map_tasks, "sampling_points": _sampling_inputs}


def measure(name: str) -> dict:
    import importlib

    module, call = FACES[name]
    face = getattr(importlib.import_module(f"attention.explorers.{module}"), call)
    kwargs = ARGS[name]() if name in ARGS else {}
    t0 = time.perf_counter()
    box = face(**kwargs)
    build = time.perf_counter() - t0
    times = []
    for control in _controls(box):
        label = control.description or type(control).__name__
        for value in _moves(control):
            t0 = time.perf_counter()
            control.value = value
            times.append((time.perf_counter() - t0, f"{label}={value!r}"))
    worst = max(times) if times else (0.0, "-")
    return {
        "explorer": name,
        "build_s": round(build, 3),
        "moves": len(times),
        "median_s": round(statistics.median(t for t, _ in times), 3) if times else 0,
        "worst_s": round(worst[0], 3),
        "worst_move": worst[1],
    }


def _each(names, path) -> int:
    """``main`` for each face in a new process; the rows gathered into ``path``."""
    import os
    import subprocess
    import tempfile

    rows = []
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "row.json")
            subprocess.run(
                [sys.executable, __file__, "--only", name, "--json", out], check=True
            )
            with open(out) as f:
                rows += json.load(f)
    if path:
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)
    _summary(rows)
    return 0


def _summary(rows) -> None:
    """The range of the faces' slowest moves, and the slowest face."""
    if len(rows) < 2:
        return
    worst = max(rows, key=lambda r: r["worst_s"])
    lo = min(r["worst_s"] for r in rows)
    print(
        f"{len(rows)} faces: slowest moves {lo:.2f}-{worst['worst_s']:.2f} s; "
        f"slowest of all: {worst['explorer']} ({worst['worst_move']}), "
        f"median {worst['median_s']:.2f} s"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=list(FACES))
    ap.add_argument("--json", default=None)
    ap.add_argument("--each", action="store_true", help="each face in a new process")
    args = ap.parse_args(argv)
    if args.each:
        return _each(args.only, args.json)
    import matplotlib

    matplotlib.use("Agg")
    warnings.simplefilter("ignore")
    rows = []
    for name in args.only:
        row = measure(name)
        rows.append(row)
        print(
            f"{name:20s} build {row['build_s']:6.2f} s  {row['moves']:3d} moves  "
            f"median {row['median_s']:5.2f} s  slowest {row['worst_s']:5.2f} s "
            f"({row['worst_move']})",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    _summary(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
