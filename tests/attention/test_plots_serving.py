"""attention.plots.serving draws what its data says: one query box per head and one KV
box per KV head, one pool box per page coloured by its owner, one bar segment per
tensor with its bytes."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from attention import decode  # noqa: E402
from attention.plots import serving  # noqa: E402


def _rects(ax):
    return [p for p in ax.patches if isinstance(p, Rectangle)]


def test_gqa_figure_draws_one_box_per_head():
    fig, ax = plt.subplots()
    serving.gqa_figure(H_q=8, layouts=(("MHA", 8), ("GQA", 2), ("MQA", 1)), ax=ax)
    assert len(_rects(ax)) == 3 * 8 + (8 + 2 + 1)
    plt.close(fig)


def test_paging_diagram_pool_and_table():
    cache = decode.PagedKVCache(num_pages=8, page_size=4, n_heads_kv=1, d=1)
    for length in (6, 3):
        s = cache.add_sequence()
        cache.append(s, np.zeros((length, 1, 1)), np.zeros((length, 1, 1)))
    fig, ax = plt.subplots()
    serving.paging_diagram(cache.tables, 4, cache.lengths, 8, ax=ax)
    texts = [t.get_text() for t in ax.texts]
    assert texts.count("-1") == 1  # sequence 1 holds one page of the two-wide table
    assert len(_rects(ax)) == 2 * 2 + 8  # logical pages + pool
    plt.close(fig)


def test_traffic_bars_stack_each_tensor():
    fig, ax = plt.subplots()
    serving.traffic_bars({"a": {"K": 10.0, "V": 30.0}, "b": {"K": 5.0}}, ax=ax)
    widths = sorted(p.get_width() for p in ax.patches if p.get_width() > 0)
    assert widths == [5.0, 10.0, 30.0]
    assert sorted(t.get_text() for t in ax.get_legend().get_texts()) == ["K", "V"]
    plt.close(fig)
