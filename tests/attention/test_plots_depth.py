"""Chapter 2's added figures: the roofline points, one row's online-softmax trace and
the FA3 schedule model (its invariants), each drawn once."""

from __future__ import annotations

import numpy as np
import pytest

from attention import core, memory, plots

pytestmark = pytest.mark.xdist_group("ch2_depth_plots")


def test_roofline_points_divide_flops_by_each_count():
    pts = plots.roofline_points([(1024, 64), (4096, 128)], Br=64, Bc=64)
    assert {(p["algorithm"], p["count"]) for p in pts} == {
        ("standard", "simulated"),
        ("flash2", "simulated"),
        ("flash2", "compulsory"),
    }
    for p in pts:
        t = (
            memory.compulsory(p["algorithm"], p["N"], p["d"])
            if p["count"] == "compulsory"
            else memory.closed_form(p["algorithm"], p["N"], p["d"], Br=64, Bc=64)
        )
        assert p["bytes"] == t.bytes(2)
        assert p["flops"] == memory.matmul_flops(p["algorithm"], p["N"], p["d"])
        assert p["intensity"] == pytest.approx(p["flops"] / p["bytes"])
    by = {(p["N"], p["algorithm"], p["count"]): p["intensity"] for p in pts}
    for n in (1024, 4096):  # the compulsory bytes are a lower bound: higher intensity
        assert by[(n, "flash2", "compulsory")] > by[(n, "flash2", "simulated")]
        assert by[(n, "flash2", "simulated")] > by[(n, "standard", "simulated")]


def test_roofline_figure_draws_each_roof_and_point_on_the_first_roof():
    pts = plots.roofline_points([(1024, 64)])
    ax = plots.roofline_figure(pts, gpus=("A100", "H100"))
    a100 = memory.GPUS["A100"]
    roofs = [ln for ln in ax.get_lines() if len(ln.get_xdata()) > 2]
    assert len(roofs) == 2
    assert roofs[0].get_ydata().max() == pytest.approx(a100.peak_tflops)
    xy = np.vstack([c.get_offsets() for c in ax.collections])
    expect = [min(a100.peak_tflops, p["intensity"] * a100.hbm_tbps) for p in pts]
    np.testing.assert_allclose(xy[:, 1], expect)


def test_online_trace_ends_at_softmax_times_v_and_rescales_only_at_jumps():
    rng = np.random.default_rng(3)
    x, v = rng.standard_normal(15) * 4, rng.standard_normal((15, 3))
    tr = plots.online_softmax_trace(x, v)
    np.testing.assert_allclose(tr["out"][-1], core.softmax(x) @ v, rtol=1e-13)
    np.testing.assert_array_equal(tr["m"], np.maximum.accumulate(x))
    jumps = np.flatnonzero(np.diff(tr["m"]) > 0) + 1
    np.testing.assert_array_equal(np.flatnonzero(tr["alpha"] < 1), jumps)
    for j in range(len(x)):  # l_j = sum_{k <= j} exp(x_k - m_j), by induction
        assert tr["l"][j] == pytest.approx(np.exp(x[: j + 1] - tr["m"][j]).sum())
    axes = plots.online_softmax_figure(x, v)
    assert len(axes) == 3
    with pytest.raises(ValueError, match="finite"):
        plots.online_softmax_trace(np.array([0.0, np.inf]), np.ones((2, 1)))
    with pytest.raises(ValueError, match="rows"):
        plots.online_softmax_trace(np.zeros(3), np.ones((2, 1)))


def _check_schedule(ev, n_blocks, warpgroups, stages):
    gemms = sorted(
        (e for e in ev if e["op"].startswith("GEMM")), key=lambda e: e["start"]
    )
    for a, b in zip(gemms, gemms[1:]):  # the tensor cores run one GEMM at a time
        assert b["start"] >= a["end"] - 1e-12
    loads = sorted((e for e in ev if e["unit"] == "producer"), key=lambda e: e["start"])
    for a, b in zip(loads, loads[1:]):  # one producer: its loads do not overlap
        assert b["start"] >= a["end"] - 1e-12
    end = {(e["unit"], e["op"], e["block"]): e["end"] for e in ev}
    start = {(e["unit"], e["op"], e["block"]): e["start"] for e in ev}
    for w in (f"WG{i + 1}" for i in range(warpgroups)):
        for j in range(n_blocks):
            assert start[(w, "GEMM0", j)] >= end[("producer", "load K", j)]
            assert start[(w, "softmax", j)] >= end[(w, "GEMM0", j)]
            assert start[(w, "GEMM1", j)] >= end[(w, "softmax", j)]
            assert start[(w, "GEMM1", j)] >= end[("producer", "load V", j)]
            if j >= stages:  # a buffer is refilled only after every warpgroup used it
                assert start[("producer", "load K", j)] >= end[(w, "GEMM1", j - stages)]
    assert len(ev) == n_blocks * (2 + 3 * warpgroups)


@pytest.mark.parametrize("n_blocks,stages", [(1, 1), (4, 2), (6, 3)])
def test_fa3_schedule_model_keeps_its_rules(n_blocks, stages):
    for wgs in (1, 2, 3):
        ev = plots.fa3_timeline(n_blocks=n_blocks, warpgroups=wgs, stages=stages)
        _check_schedule(ev, n_blocks, wgs, stages)


def test_ping_pong_fills_the_softmax_holes():
    one = plots.fa3_timeline(n_blocks=8, warpgroups=1, t_softmax=1.0)
    two = plots.fa3_timeline(n_blocks=8, warpgroups=2, t_softmax=1.0)
    # one warpgroup: each block's softmax leaves the tensor cores idle
    assert plots.tensor_core_busy(one) < 2 / 3 + 1e-9
    assert plots.tensor_core_busy(two) > 0.9
    axes = plots.fa3_timeline_figure({"one": one, "two": two})
    assert len(axes) == 2
    with pytest.raises(ValueError, match="t_softmax"):
        plots.fa3_timeline(t_softmax=0)
    with pytest.raises(ValueError, match="warpgroups"):
        plots.fa3_timeline(warpgroups=0)


# ------------------------------------------- chapters 1, 3 and 4: explanatory figures


def test_soft_lookup_returns_the_dictionary_and_the_attention_outputs():
    keys = np.array([[1.0, 0.2], [0.2, 1.0], [-0.9, 0.4]])
    q, vals = np.array([1.5, 0.9]), np.array([10.0, 20.0, 30.0])
    _, (hard_out, soft_out) = plots.soft_lookup_figure(q, keys, vals, scale=2.0)
    assert hard_out == 10.0  # the best-matching key's value
    assert soft_out == pytest.approx(core.softmax(2.0 * keys @ q) @ vals, rel=1e-14)
    with pytest.raises(ValueError, match="query"):
        plots.soft_lookup_figure(np.ones(3), keys, vals)


def test_positions_figure_draws_the_table_and_one_offset_curve():
    axes = plots.positions_figure(n_positions=16, d=16, rope_d=4, max_offset=12)
    from attention import positions

    np.testing.assert_array_equal(
        axes[0].get_images()[0].get_array(), positions.sinusoidal_table(16, 16)
    )
    line, dots = axes[2].get_lines()[:2]  # query at 0 and at 100: one curve
    xs = line.get_xdata()
    np.testing.assert_allclose(
        dots.get_ydata(), np.interp(dots.get_xdata(), xs, line.get_ydata()), rtol=1e-9
    )


def test_straight_through_figure_draws_the_estimators_pieces():
    from attention import hard

    s, g = np.array([0.3, -0.5, 1.2, 0.0]), np.array([0.1, 2.0, -0.3, 0.4])
    f = np.array([1.0, 4.0, 2.5, 3.0])
    axes = plots.straight_through_figure(s, g, f, tau=0.7)
    heights = [np.array([p.get_height() for p in ax.patches]) for ax in axes]
    y = core.softmax((s + g) / 0.7)
    np.testing.assert_array_equal(heights[0], np.eye(4)[np.argmax(s + g)])
    np.testing.assert_allclose(heights[1], y, rtol=1e-14)
    np.testing.assert_allclose(heights[2], hard.straight_through_grad(y, f, 0.7))
    assert heights[2].sum() == pytest.approx(0, abs=1e-12)  # a softmax's gradient


@pytest.mark.parametrize(
    "query_ij,point_px", [((4, 1), (3.3, 1.6)), ((0, 5), (2.0, 3.0))]
)
def test_rpb_lookup_reads_the_table_at_the_displacement(query_ij, point_px):
    H = W = 6
    tab = np.random.default_rng(1).normal(0, 1, (2 * H - 1, 2 * W - 1))
    _, bias = plots.rpb_lookup_figure(tab, query_ij, point_px)
    # by hand: bilinear read at (row, col) = (H - 1 + dy, W - 1 + dx)
    r = H - 1 + query_ij[0] - point_px[1]
    c = W - 1 + query_ij[1] - point_px[0]
    r0, c0 = int(np.floor(r)), int(np.floor(c))
    fr, fc = r - r0, c - c0
    at = lambda i, j: tab[i, j] if 0 <= i < 2 * H - 1 and 0 <= j < 2 * W - 1 else 0.0
    expect = (
        (1 - fr) * (1 - fc) * at(r0, c0)
        + (1 - fr) * fc * at(r0, c0 + 1)
        + fr * (1 - fc) * at(r0 + 1, c0)
        + fr * fc * at(r0 + 1, c0 + 1)
    )
    assert bias == pytest.approx(expect, rel=1e-12, abs=1e-12)
