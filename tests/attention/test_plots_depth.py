"""Chapter 2's added figures: the roofline points, one row's online-softmax trace and
the FA3 schedule model (its invariants), each drawn once."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from attention import core, memory, plots  # noqa: E402

pytestmark = pytest.mark.xdist_group("ch2_depth_plots")


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_roofline_points_divide_flops_by_each_count():
    pts = plots.roofline_points([(1024, 64), (4096, 128)], Br=64, Bc=64)
    assert {(p["algorithm"], p["count"]) for p in pts} == {
        ("standard", "simulated"), ("flash2", "simulated"), ("flash2", "compulsory")}
    for p in pts:
        t = (memory.compulsory(p["algorithm"], p["N"], p["d"])
             if p["count"] == "compulsory"
             else memory.closed_form(p["algorithm"], p["N"], p["d"], Br=64, Bc=64))
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
        assert tr["l"][j] == pytest.approx(np.exp(x[:j + 1] - tr["m"][j]).sum())
    axes = plots.online_softmax_figure(x, v)
    assert len(axes) == 3
    with pytest.raises(ValueError, match="finite"):
        plots.online_softmax_trace(np.array([0.0, np.inf]), np.ones((2, 1)))
    with pytest.raises(ValueError, match="rows"):
        plots.online_softmax_trace(np.zeros(3), np.ones((2, 1)))


def _check_schedule(ev, n_blocks, warpgroups, stages):
    gemms = sorted((e for e in ev if e["op"].startswith("GEMM")),
                   key=lambda e: e["start"])
    for a, b in zip(gemms, gemms[1:]):  # the tensor cores run one GEMM at a time
        assert b["start"] >= a["end"] - 1e-12
    loads = sorted((e for e in ev if e["unit"] == "producer"),
                   key=lambda e: e["start"])
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
