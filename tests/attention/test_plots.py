"""attention/plots.py: the palette, the heatmaps, and chapter 1's masks, fits and
traffic figure."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from attention import core, memory, plots  # noqa: E402

pytestmark = pytest.mark.xdist_group("ch1_plots")


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_palette_has_every_tensor_and_level():
    for t in ("Q", "K", "V", "S", "P", "O"):
        assert plots.tensor_color(t) == plots.TENSOR_COLORS[t]
    assert len({plots.TENSOR_COLORS[t] for t in ("Q", "K", "V", "S", "P", "O")}) == 6
    assert {"HBM", "SRAM"} <= set(plots.MEMORY_COLORS)
    assert plots.MASK_COLORS["keep"] != plots.MASK_COLORS["masked"]


def test_attention_heatmap_draws_the_weights():
    w = core.softmax(np.random.default_rng(0).normal(size=(3, 5)))
    ax = plots.attention_heatmap(w, q_labels="abc", k_labels="vwxyz", title="t")
    img = ax.get_images()[0]
    np.testing.assert_array_equal(img.get_array(), w)
    assert [t.get_text() for t in ax.get_xticklabels()] == list("vwxyz")
    with pytest.raises(ValueError, match="2-D"):
        plots.attention_heatmap(np.ones(3))


def test_attention_heatmap_hatches_masked_cells():
    mask = core.causal_mask(4, 6)  # bottom-right: row 0 sees keys 0..2
    w = np.where(mask, 0.1, 0.0)
    ax = plots.attention_heatmap(w, mask=mask)
    # One grey, hatched rectangle per run of masked cells in a row: rows 0, 1, 2.
    rects = [p for p in ax.patches if p.get_hatch()]
    assert [(r.get_y() + 0.5, r.get_x() + 0.5, r.get_width()) for r in rects] == [
        (0, 3, 3),
        (1, 4, 2),
        (2, 5, 1),
    ]
    assert all(
        matplotlib.colors.to_hex(r.get_facecolor())
        == plots.MASK_COLORS["masked"].lower()
        for r in rects
    )
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["masked"]
    assert not [p for p in plots.attention_heatmap(w).patches if p.get_hatch()]
    with pytest.raises(ValueError, match="mask"):
        plots.attention_heatmap(w, mask=mask[:2])


@pytest.mark.parametrize("n_q,n_k", [(6, 6), (4, 7), (7, 4)])
def test_mask_heatmap_draws_the_mask_and_diagonal(n_q, n_k):
    mask = core.causal_mask(n_q, n_k)
    ax = plots.mask_heatmap(mask, diagonal=True, legend=True, title="causal")
    np.testing.assert_array_equal(ax.get_images()[0].get_array(), mask.astype(int))
    (line,) = ax.get_lines()
    x, y = line.get_data()
    # The dashed line is j = i + n_k - n_q: it passes through the last visible key of
    # each row.
    np.testing.assert_allclose(np.asarray(x) - np.asarray(y), n_k - n_q)
    for i in range(n_q):
        j_last = i + n_k - n_q
        if 0 <= j_last < n_k:
            assert mask[i, j_last] and (j_last + 1 == n_k or not mask[i, j_last + 1])
    assert ax.get_legend() is not None


def test_mask_heatmap_rejects_non_boolean():
    with pytest.raises(ValueError, match="boolean"):
        plots.mask_heatmap(np.ones((3, 3)))


def test_power_law_fit_recovers_exponent():
    x = np.array([128, 256, 512, 1024, 2048])
    slope, c = plots.power_law_fit(x, 3e-9 * x**2.0)
    assert slope == pytest.approx(2.0, abs=1e-9) and c == pytest.approx(3e-9, rel=1e-6)
    slope, _ = plots.power_law_fit(x, 5 * x**1.0)
    assert slope == pytest.approx(1.0, abs=1e-9)
    with pytest.raises(ValueError, match="positive"):
        plots.power_law_fit([1, 2], [0, 1])
    with pytest.raises(ValueError, match="same length"):
        plots.power_law_fit([1, 2, 3], [1, 2])


def test_scaling_plot_reports_the_fitted_slope():
    x = np.array([100, 200, 400, 800])
    ax, slope = plots.scaling_plot(
        x, 1e-6 * x**1.5, expected=2, expected_label="O(n^2)"
    )
    assert slope == pytest.approx(1.5, abs=1e-9)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("1.50" in s for s in labels) and "O(n^2)" in labels
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"


def test_scaling_plot_labels_lengths_as_a_reader_reads_them():
    x = np.array([512, 1024, 2048, 4096])
    ax, _ = plots.scaling_plot(x, 1e-9 * x**2.0)
    ax.figure.canvas.draw()
    lo, hi = ax.get_xlim()
    shown = [
        t.get_text() for t in ax.get_xticklabels() if lo <= t.get_position()[0] <= hi
    ]
    assert shown == ["512", "1k", "2k", "4k"], shown


@pytest.mark.parametrize("m", [None, 96])
def test_naive_traffic_vs_length_draws_simulation_and_closed_form(m):
    ns = [32, 100, 256]
    bpe = 2
    ax = plots.naive_traffic_vs_length(ns, d=32, bytes_per_elem=bpe, m=m, Br=64, Bc=64)
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    s_line = next(ln for lbl, ln in lines.items() if lbl.startswith("S:"))
    x, y = s_line.get_data()
    np.testing.assert_array_equal(x, ns)
    n_q = np.array(ns) if m is None else m
    # S written once, read once.
    np.testing.assert_array_equal(y, 2 * n_q * np.array(ns) * bpe)
    total = lines["total"].get_data()[1]
    want = [
        memory.simulate("standard", int(n if m is None else m), 32, N_k=n).bytes(bpe)
        for n in ns
    ]
    np.testing.assert_array_equal(total, want)


def test_naive_traffic_figure_title_and_bars():
    fig = plots.naive_traffic_figure(n=512, m=None, d=64, dtype="float32")
    ax_lines, ax_bars = fig.axes[:2]
    t = memory.closed_form("standard", 512, 64, N_k=512)
    heights = [p.get_height() for p in ax_bars.patches]
    # Reads then writes per tensor, in MiB at 4 bytes per element.
    reads = [t.per_tensor[k][0] * 4 / 2**20 for k in ("Q", "K", "V", "S", "P", "O")]
    np.testing.assert_allclose(heights[:6], reads)
    assert plots.human_bytes(t.bytes(4)) in ax_bars.get_title()
    assert any(
        abs(ln.get_xdata()[0] - 512) < 1e-9
        for ln in ax_lines.get_lines()
        if len(ln.get_xdata()) == 2
    )  # the vertical marker at n
    with pytest.raises(ValueError, match="dtype"):
        plots.naive_traffic_figure(dtype="int4")
    with pytest.raises(ValueError, match="^n must be >= 1"):
        plots.naive_traffic_figure(n=0)


def test_traffic_bars_and_human_bytes():
    ax = plots.traffic_bars({"Q": (10, 0), "S": (5, 5)})
    assert [p.get_height() for p in ax.patches] == [10, 5, 0, 5]
    assert plots.human_bytes(1536) == "1.5 KiB"
    assert plots.human_bytes(12) == "12 B"


def test_tile_explorer_without_text_panel_prints_its_numbers_instead():
    fig = plots.tile_explorer_figure(N=256, d=64, text_panel=False)
    assert not any(
        t.get_fontfamily() == ["monospace"] for ax in fig.axes for t in ax.texts
    )
    summary = plots.tile_explorer_summary(N=256, d=64)
    assert "flash2" in summary and "FLOP/byte" in summary and "FA1 rule" in summary
    plt.close(fig)


@pytest.mark.parametrize("alg", ["flash1", "flash2_bwd"])
def test_tile_explorer_draws_compulsory_traffic_and_simulates_one_algorithm(
    alg, monkeypatch
):
    from matplotlib.collections import LineCollection

    real, simulated = memory.simulate, []

    def spy(a, *args, **kw):
        simulated.append(a)
        return real(a, *args, **kw)

    monkeypatch.setattr(memory, "simulate", spy)
    N, d = 512, 64
    fig = plots.tile_explorer_figure(N=N, d=d, Br=64, Bc=32, algorithm=alg, step=3)
    assert simulated == [alg]  # the schedule drawn; the rest come from the closed forms
    ax_traffic, _, ax_roof = fig.axes[:3]
    group = (
        [a for a in memory.algorithms() if a.startswith(("standard_", "flash2_"))]
        if alg.endswith("bwd")
        else ["standard", "flash1", "flash2"]
    )
    group = [
        a
        for a in (
            "standard_bwd",
            "flash2_bwd",
            "flash2_bwd_split",
            "standard",
            "flash1",
            "flash2",
        )
        if a in group
    ]
    unit = ax_traffic.get_ylabel().split("(")[1].rstrip(")")
    div = {"GiB": 2**30, "MiB": 2**20, "KiB": 2**10, "B": 1}[unit]
    (ticks,) = [c for c in ax_traffic.collections if isinstance(c, LineCollection)]
    got = [seg[0][1] * div for seg in ticks.get_segments()]
    want = [memory.compulsory(a, N, d).bytes(2) for a in group]
    np.testing.assert_allclose(got, want)
    labels = [t.get_text() for t in ax_traffic.get_legend().get_texts()]
    assert any("compulsory" in t for t in labels) and any("no L2" in t for t in labels)
    # The roofline panel: a tick per (GPU, algorithm), estimated from compulsory bytes.
    lows = [
        seg[0][1]
        for c in ax_roof.collections
        if isinstance(c, LineCollection)
        for seg in c.get_segments()
    ]
    want = [
        memory.roofline_ms(
            memory.matmul_flops(a, N, d), memory.compulsory(a, N, d).bytes(2), spec
        )
        * 1e3
        for a in group
        for spec in memory.GPUS.values()
    ]
    np.testing.assert_allclose(lows, want)
    assert any("compulsory" in t.get_text() for t in ax_roof.get_legend().get_texts())


def test_tile_explorer_summary_gives_both_counts():
    text = plots.tile_explorer_summary(N=1024, d=64)
    assert "simulated (no L2)" in text and "compulsory" in text
    row = next(line for line in text.splitlines() if line.startswith("flash2 "))
    fl = memory.matmul_flops("flash2", 1024, 64)
    once = memory.compulsory("flash2", 1024, 64).bytes(2)
    sim = memory.closed_form("flash2", 1024, 64, Br=64, Bc=64).bytes(2)
    assert row.split()[-1] == f"{fl / once:.0f}" and f"{fl / sim:.0f}" in row.split()


def test_backward_traffic_legend_is_grouped():
    res = {
        a: memory.simulate(a, 512, 64, Br=128, Bc=64, keep_trace=False)
        for a in ("standard_bwd", "flash2_bwd")
    }
    ax = plots.traffic_by_algorithm(res)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert {"inputs", "N × N", "gradients", "HBM"} <= set(labels)
    assert labels.count("dQ") == 1 and "written" in labels
    plt.close(ax.figure)


def test_msda_points_legend_names_queries_and_heads():
    rng = np.random.default_rng(0)
    levels = [rng.random((s, s)) for s in (16, 8)]
    fig = plots.msda_points_figure(
        levels,
        rng.random((2, 2, 2, 3, 2)),
        rng.random((2, 2, 2, 3)),
        rng.random((2, 2)),
        query_labels=["face", "flag"],
    )
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "points of face" in labels and "head 1" in labels
    plt.close(fig)
