"""A live face's kept figure (``attention.plots.live``) draws what a new figure does.

Every live face is built and each of its controls moved (as ``tools/live_latency.py``
moves them); each picture a face shows from its kept figure is compared, pixel for
pixel, with the picture of a new figure made for the same setting and given the kept
figure's layout. Anything a move left behind (a line, a title, a log scale, a
colorbar's share of its panel, an inverted axis) would show as a difference.
"""

import base64
import importlib
import io
import os
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from attention.explorers import common  # noqa: E402

_TOOLS = str(Path(__file__).resolve().parents[2] / "tools")
sys.path.insert(0, _TOOLS)
try:
    import live_latency  # noqa: E402
finally:
    sys.path.remove(_TOOLS)

#: The faces whose pictures come from ``live_png`` (the others draw in the browser
#: or keep a picture of their own: ``SparsePicture``, ``PretrainedPicture``, tested
#: against new figures in their own tests).
FACES = [
    "naive_traffic",
    "attention_map",
    "mask",
    "tile_size",
    "online_softmax",
    "roofline",
    "temperature",
    "topk_traffic",
    "estimator",
    "deformable_traffic",
    "sampling_points",
    "decode",
    "context_parallel",
    "block_mask",
]

#: How many moves of each control are checked (the first: the end of a slider, the
#: first other option of a menu): a leftover shows at the first move that reuses.
MOVES = 1


def _pixels(png: str) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(base64.b64decode(png))).convert("RGB"))


@pytest.mark.parametrize("name", FACES)
def test_kept_figure_draws_what_a_new_one_does(name, monkeypatch):
    import matplotlib.pyplot as plt

    real = common.live_png
    checked = []

    def checking(make, *args, **settings):
        common._KEPT.get(make, {}).pop("last", None)
        png = real(make, *args, **settings)
        kept = common._KEPT[make].get("last")
        if kept is None:  # a figure not kept (made by plt.figure): nothing to compare
            return png
        fresh = make(*args, **settings)
        pars = kept.subplotpars
        fresh.subplots_adjust(
            **{k: getattr(pars, k) for k in ("left", "right", "bottom", "top")},
            wspace=pars.wspace,
            hspace=pars.hspace,
        )
        new = common.figure_png(fresh, crop="ink")
        a, b = _pixels(png), _pixels(new)
        if os.environ.get("LIVE_REUSE_DEBUG"):
            from PIL import Image

            Image.fromarray(a).save("/tmp/live_reuse_kept.png")
            Image.fromarray(b).save("/tmp/live_reuse_new.png")
        assert a.shape == b.shape, (make.__name__, settings, a.shape, b.shape)
        diff = np.argwhere((a != b).any(-1))
        assert not len(diff), (make.__name__, args[-4:], settings, diff[:5])
        checked.append(make.__name__)
        return png

    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("attention.explorers") and hasattr(
            mod, "live_png"
        ):
            monkeypatch.setattr(mod, "live_png", checking)
    common.cached_png.cache_clear()
    common._KEPT.clear()
    module, call = live_latency.FACES[name]
    face = getattr(importlib.import_module(f"attention.explorers.{module}"), call)
    box = face(**(live_latency.ARGS[name]() if name in live_latency.ARGS else {}))
    for control in live_latency._controls(box):
        for value in live_latency._moves(control)[:MOVES]:
            control.value = value
    plt.close("all")
    common.cached_png.cache_clear()
    assert len(checked) >= 2, checked  # the first picture and at least one move
