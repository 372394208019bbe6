"""attention.plots.masks: the work figure draws the closed forms' numbers, the block
mask plot draws the tile kinds, the layer figure one cell per layer; labels 1k to 128k.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from attention import masks as M  # noqa: E402
from attention.memory import blocksparse as bs  # noqa: E402
from attention.plots import masks as pm  # noqa: E402


def test_length_labels():
    assert [pm.length_label(n) for n in (512, 1024, 2048, 131072, 1500)] == [
        "512",
        "1k",
        "2k",
        "128k",
        "1,500",
    ]


def test_work_figure_draws_the_closed_forms():
    fig, axes = plt.subplots(1, 2)
    pm.block_sparse_work_figure(N_max=8192, axes=axes)
    byte_lines, flop_lines = axes[0].get_lines(), axes[1].get_lines()
    assert [ln.get_label() for ln in byte_lines] == [
        "dense causal",
        "window 4,096",
        "documents of 2k",
    ]
    ns = [1024, 2048, 4096, 8192]
    window = [bs.window_work(n, 128, 4096) for n in ns]
    np.testing.assert_allclose(
        byte_lines[1].get_ydata(), [w.bytes(2) / 2**20 for w in window]
    )
    np.testing.assert_allclose(
        flop_lines[1].get_ydata(), [w.flops / 1e9 for w in window]
    )
    assert [t.get_text() for t in axes[0].get_xticklabels()] == ["1k", "2k", "4k", "8k"]
    plt.close(fig)


def test_block_mask_plot_draws_its_grid_as_two_collections():
    """Issue 33: the explorer's largest mask (32k keys in 64-tiles, 513 lines a side)
    draws at once: the tile grid is one collection per direction, not a Line2D per
    line, at every tile edge."""
    from attention.memory import blocksparse as bs

    bm = bs.closed_block_mask("document", 32768, 4096, 64, 64)
    ax = pm.block_mask_plot(bm)
    assert not ax.lines and len(ax.collections) == 2
    xs = sorted(p.vertices[0, 0] for p in ax.collections[0].get_paths())
    assert xs == list(range(0, 32768 + 1, 64))
    plt.close(ax.figure)


def test_block_mask_plot_and_layers():
    bm = M.block_mask(M.sliding_window(20), 64, block_size=16)
    ax = pm.block_mask_plot(bm)
    np.testing.assert_array_equal(ax.get_images()[0].get_array(), bm.kinds)
    assert ax.get_title() == f"block 16: {bm.visited} of 16 tiles visited"
    plt.close(ax.figure)
    ax = pm.layer_pattern_figure({"a": ["local"] * 5 + ["global"], "b": ["global"]})
    assert len(ax.patches) == 7
    plt.close(ax.figure)
