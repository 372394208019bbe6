"""attention.plots.sparse: the cost figure's lines are the closed forms; labels."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from attention.memory import sparse as ms  # noqa: E402
from attention.plots import sparse as ps  # noqa: E402


def test_sparse_cost_figure_draws_the_closed_forms():
    axes = ps.sparse_cost_figure(N_max=1 << 13)
    lines = {ln.get_label(): ln for ln in axes[0].get_lines()}
    gate = lines["MoBA's gate"].get_ydata()
    want = [
        ms.gate_cost(n, n, 64, 16, 128, 8)["flops"] for n in (1024, 2048, 4096, 8192)
    ]
    np.testing.assert_array_equal(gate, want)
    assert [t.get_text() for t in axes[0].get_xticklabels()] == ["1k", "2k", "4k", "8k"]
    assert ps.tokens_label(1 << 20) == "1M" and ps.tokens_label(1 << 15) == "32k"
    share = axes[1].get_lines()[1].get_ydata()
    assert ((0 < share) & (share < 1)).all() and (np.diff(share) >= 0).all()
    assert share[-1] > share[0]
    plt.close("all")


def test_mass_kept_figure():
    curves = {"moba": np.array([[0.2, 0.5]]), "oracle": np.array([[0.4, 0.7]])}
    axes = ps.mass_kept_figure(curves, [16], [1, 2])
    assert [ln.get_label() for ln in axes[0].get_lines()] == ["moba", "oracle"]
    plt.close("all")


def test_chosen_blocks_figure_tints_the_chosen_blocks():
    p = np.full((4, 8), 1 / 8)
    idx = np.array([[0, -1], [1, 0], [3, -1], [2, 3]])  # blocks of 2 keys
    axes = ps.chosen_blocks_figure(p, {"moba": idx, "oracle": idx[:, :1]}, 2)
    tint = axes[0].get_images()[1].get_array()
    want = np.array([[1, 1, 0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0, 0, 0],
                     [0, 0, 0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 1, 1, 1, 1]])  # fmt: skip
    np.testing.assert_array_equal(tint[..., 3] > 0, want.astype(bool))
    assert [a.get_title() for a in axes] == ["moba", "oracle"]


def test_budget_accuracy_figure_draws_the_record():
    from attention import sparse_train

    rec = sparse_train.load_record()
    ax = ps.budget_accuracy_figure(rec)
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    ks = sorted(rec["selected"])
    sel = lines["trained with MoBA's selection"]
    assert list(sel.get_xdata()) == ks
    assert list(sel.get_ydata()) == [rec["selected"][k]["accuracy"] for k in ks]
    assert lines["dense attention"].get_ydata()[0] == rec["dense"]["accuracy"]
    assert lines["chance"].get_ydata()[0] == 1 / rec["config"]["n_values"]
    plt.close("all")
